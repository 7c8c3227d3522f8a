"""One call's life (docs/architecture.md §3): key -> cache entry, or interpret -> passes -> entry.

``jit(fn)`` returns a ``ThunderliteFunction``; ``jit(module)`` a
``ThunderliteModule`` that behaves like the module (parameters, buffers,
``state_dict``, ``train()``/``eval()``, hooks). A call computes one key with
the generated key function of the arguments' signature, looks it up in a dict,
and runs the entry found (prologue guards, computation, epilogue write-backs,
all one generated function). A miss traces the function through the
interpreter and runs the pipeline: update_aliases, DCE, autodiff when an input
requires grad, executor claiming, del_last_used.

Example::

    jfn = thunderlite.jit(lambda a, b: (a * b + 1).sin().sum())
    jfn(a, b)
    print(thunderlite.last_traces(jfn)[-1])     # the trace that ran
    thunderlite.cache_info(jfn)                 # hits, misses, last miss reason
"""
from __future__ import annotations

import functools
import inspect
import reprlib
import threading
import time
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core.proxies import DataDependentError
from thunderlite.core.trace import Trace
from thunderlite.distributed.ddp import from_data_parallel, from_torch_ddp
from thunderlite.distributed.fsdp2 import from_torch_fsdp2, is_fully_shard, refuse_fsdp1, uses_fsdp2
from thunderlite.distributed.tp import from_torch_tp, uses_tensor_parallel
from thunderlite.executors.cudagraphs.runtime import CUDAGraphs
from thunderlite.executors.triton.executor import kernel_sources
from thunderlite.frontend.caching.automatic import PathDynamic
from thunderlite.frontend.caching.entries import (
    CacheInfo,
    CompiledEntry,
    KeyCache,
    parameter_names,
    reads_only,
    user_stacklevel,
)
from thunderlite.frontend.caching.keys import has_symbolic_numbers
from thunderlite.frontend.caching.tiers import Tiers, policy_of
from thunderlite.frontend.compile import compile_call, gc_paused, run_until_raise
from thunderlite.frontend.entry import MISS
from thunderlite.frontend.examine import examine_call
from thunderlite.frontend.module_surface import CompiledCalls, forward_signature, is_method_of, signed_forward
from thunderlite.frontend.splits import MAX_PATHS, SplitBudget, after_split
from thunderlite.transforms.user import check_transforms

CACHE_MODES = ("constant values", "symbolic values", "no caching")
# entries kept per key that differ only in prologue guards (a module flag, a global):
# the most recent ones, so a value that changes on every call cannot grow the cache
MAX_ALTERNATES = 8
# compiled entries a jitted callable keeps by default (``jit(..., max_entries=)``): past it, misses run eagerly
MAX_ENTRIES = 8
# fast guards made in a row for one entry (a change of global state the key does
# not hold, such as the thread count, re-arms it; calls its guard always refuses do not)
MAX_ARMINGS = 2


class ThunderliteFunction:
    """A jitted callable. Attribute access is kept minimal on the hit path."""

    def __init__(self, fn: Callable, *, executors=None, cache: str = "constant values", transforms=None,
                 progress: bool | None = None, dynamic: bool | None = None, max_entries: int | None = MAX_ENTRIES,
                 splits: bool | int = True, tiering=None):
        if cache not in CACHE_MODES:
            raise ValueError(f"cache={cache!r} is not one of {CACHE_MODES}")
        if dynamic not in (None, True, False):
            raise ValueError(f"dynamic={dynamic!r} must be None (automatic), True or False")
        if max_entries is not None and (type(max_entries) is not int or max_entries < 1):
            raise ValueError(f"max_entries={max_entries!r} must be a positive int, or None for no bound")
        if type(splits) is not bool and (type(splits) is not int or splits < 1):
            raise ValueError(f"splits={splits!r} must be True, False or a number of paths (at least 1)")
        self.fn = fn
        self.progress = progress
        self.executors = executors
        self.transforms = check_transforms(transforms)
        self.cache_mode = cache
        self.dynamic = dynamic
        self.max_entries = max_entries
        # where Python needs a traced value the program splits (frontend/splits/); False: DataDependentError
        self.splits = None if splits is False else SplitBudget(MAX_PATHS if splits is True else splits)
        self._keys = self._key_cache(parameter_names(fn))
        self._auto = self._path_dynamic()
        self._key_fn = self._keys.no_key
        self._entries: dict = {}
        self._fast: Callable = _no_fast_guard
        self._candidate: CompiledEntry | None = None
        self._armings = 0
        self.info = CacheInfo()
        # misses (lookup, compile, store) run one at a time: threads racing a first call wait and
        # find the entry the first one made; hits take no lock (docs/architecture.md §3, threads)
        self._lock = threading.RLock()
        # a hot tier's swap (frontend/caching/tiers.py) against the arming of fast guards and the
        # stores into alternates lists: held for a few steps, never across a compile
        self._swap_lock = threading.Lock()
        self._tiers = Tiers(policy_of(tiering))
        self._tier_at = self._tiers.after_calls      # calls of one entry that start its tier-up (0: never)
        self.last: CompiledEntry | None = None
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args, **kwargs):
        out = self._fast(args, kwargs)
        if out is not MISS:
            self.info.hits += 1
            entry = self._candidate      # the fast guard's entry
            if entry is not None:
                entry.calls += 1
                if entry.calls == self._tier_at:
                    self._tiers.due(self, entry, args, kwargs)
            return out
        key_fn = self._key_fn       # read once: another thread's miss may replace it meanwhile
        entry = self._entries.get(key_fn(args, kwargs))
        if entry is not None:
            out = entry.fn(args, kwargs)
            if out is not MISS:
                self.info.hits += 1
                self.last = entry
                entry.calls += 1
                if entry.calls == self._tier_at:
                    self._tiers.due(self, entry, args, kwargs)
                self._arm(entry, key_fn, args, kwargs)
                return out
        return self._slow_call(args, kwargs)

    def _arm(self, entry: CompiledEntry, key_fn: Callable, args: tuple, kwargs: dict) -> None:
        """An entry the key path served twice in a row gets a fast guard
        (``cache.FastGuard``): the next calls like this one skip the key.
        A call served by another entry disarms it, so calls alternating between
        entries pay no re-arming, and ``last`` is always the fast guard's entry.
        An entry is armed at most ``MAX_ARMINGS`` times in a row: calls its guard
        keeps refusing (one tensor passed twice) stay on the key path instead of
        re-arming on every call."""
        if entry is not self._candidate:
            self._candidate = entry
            self._fast = _no_fast_guard
            self._armings = 0
            return
        if self._armings >= MAX_ARMINGS or getattr(entry.fn, "__thunderlite_source__", None) is None:
            return      # a split program's entry runs its pieces' own entries: no fast guard
        self._armings += 1
        # an entry being measured (frontend/caching/tiers.py) has no code of its own to inline
        guard = self._keys.fast_guard(key_fn) if hasattr(entry.fn, "__thunderlite_source__") else None
        fast = _no_fast_guard if guard is None else guard.arm(args, kwargs, entry.fn, not reads_only(entry))
        with self._swap_lock:        # not an entry a hot tier replaced meanwhile (``_replace``)
            if entry is self._candidate:
                self._fast = fast

    def _replace(self, old: CompiledEntry, new: CompiledEntry) -> bool:
        """Put ``new`` where the cache holds ``old`` (a hot tier, frontend/caching/tiers.py),
        from any thread: each call runs one of them whole (the dict and list
        stores are single steps), and no fast guard keeps serving ``old``.
        False when ``old`` is no longer in the cache."""
        with self._swap_lock:
            alts = self._entries.get(("alternates", old.key)) if old.key is not None else None
            at = next((i for i, e in enumerate(alts or ()) if e is old), None)
            if at is None:
                return False
            new.calls = old.calls
            self._fast = _no_fast_guard
            alts[at] = new
            if self._entries.get(old.key) is old:
                self._entries[old.key] = new
            if self._candidate is old:
                self._candidate, self._armings = new, 0
            if self.last is old:
                self.last = new
            return True

    def __get__(self, obj, objtype=None):
        """``@thunderlite.jit`` on a method: bind like a function (self is an argument)."""
        return self if obj is None else types.MethodType(self, obj)

    def _slow_call(self, args: tuple, kwargs: dict) -> Any:
        with self._lock, gc_paused():     # a miss makes thousands of short-lived objects (compile.gc_paused)
            out = self._miss(args, kwargs)
        if out is _RUN_EAGERLY:     # the cache is full (max_entries): eager's answer, nothing kept
            return self.fn(*args, **kwargs)
        return out

    def _miss(self, args: tuple, kwargs: dict) -> Any:
        self._fast = _no_fast_guard
        key_fn = self._keys.key_fn_for(args, kwargs)
        self._key_fn = key_fn
        key = key_fn(args, kwargs)
        if self.cache_mode != "no caching":
            for entry in self._entries.get(("alternates", key), ()):
                out = entry.fn(args, kwargs)
                if out is not MISS:
                    self._entries[key] = entry
                    self.info.hits += 1
                    self.last = self._candidate = entry
                    self._armings = 0
                    entry.calls += 1
                    if entry.calls == self._tier_at:
                        self._tiers.due(self, entry, args, kwargs)
                    return out
            # an entry compiled before some of this signature's dims became symbolic holds for its exact key
            for older in self._keys.older_key_fns(key_fn):
                old_key = older(args, kwargs)
                entry = self._entries.get(old_key) if old_key is not None else None
                out = entry.fn(args, kwargs) if entry is not None else MISS
                if out is not MISS:
                    # another entry served: the next call of the fast guard's entry re-arms it
                    # (a decode loop's prefill, between the steps' runs, kept it disarmed for good)
                    self.info.hits += 1
                    self.last = self._candidate = entry
                    self._armings = 0
                    return out
        prev = self.info.last_key(key)
        stale = self._entries.get(key)
        self.info.record_miss(self._keys, key, stale, args, kwargs)
        if self.max_entries is not None and self.info.entries >= self.max_entries:
            self.info.cache_full(self.max_entries)
            return _RUN_EAGERLY
        if stale is not None and self._auto is not None:
            learned = self._auto.learn_from_miss(stale, args, kwargs)
            if learned is not None:
                self.info.last_miss_reason += f"; {learned} symbolic from now on"
        if prev is not None and self.dynamic is not False and self.cache_mode == "constant values":
            key_fn, key = self._automatic_dynamic(key_fn, prev, key, args, kwargs)
        symbolic = self.cache_mode == "symbolic values"
        try:
            entry = self._compile(key_fn, args, kwargs, symbolic)
        except (TypeError, DataDependentError) as e:
            if not symbolic or after_split(e):
                raise
            warnings.warn(f"thunderlite: a number argument cannot stay symbolic here ({e}); "
                          "specializing on number values from now on", stacklevel=user_stacklevel())
            self._reset("constant values")
            return self._miss(args, kwargs)
        if entry.raises is not None:      # the program raised its own exception: nothing to cache
            self.last = entry
            run_until_raise(entry, args, kwargs)
        if entry.sym_guards is None:      # symbolic sizes failed: compiled for these sizes
            key = self._key_fn(args, kwargs)
            self.info.note_key(key)
            entry.sym_guards = []
        self._store(key, entry)
        self._candidate, self._armings = entry, 0
        out = entry.run_first(args, kwargs)
        if out is MISS:
            raise RuntimeError("thunderlite: a freshly compiled entry rejected the call it was compiled "
                               "for (a guard reads a value that changes on every read)")
        return out

    def _key_cache(self, names) -> KeyCache:
        return KeyCache(symbolic_numbers=self.cache_mode == "symbolic values", names=names,
                        symbolic_sizes=self.dynamic is True or self.cache_mode == "symbolic values")

    def _path_dynamic(self) -> PathDynamic | None:
        """Automatic dynamic sizes and floats of values read through paths (None: ``dynamic=False``)."""
        all_sizes = self.dynamic is True or self.cache_mode == "symbolic values"
        return PathDynamic(all_sizes) if self.dynamic is not False or all_sizes else None

    def _automatic_dynamic(self, key_fn, prev: tuple, key: tuple, args: tuple, kwargs: dict):
        """A recompile caused by new sizes makes those dims symbolic (as
        torch.compile does), and one caused by a new float value makes that
        float a trace input, so the next sizes and values reuse one trace."""
        changed = self._keys.changed_dims(key_fn, prev, key) if self.dynamic is None else {}
        numbers = self._keys.changed_numbers(key_fn, prev, key)
        if not changed and not numbers:
            return key_fn, key
        if changed:
            self.info.last_miss_reason += f"; {self._keys.describe_dims(key_fn, changed)} symbolic from now on"
            key_fn = self._keys.mark_dynamic(key_fn, changed)
        if numbers:
            names = self._keys.describe_numbers(key_fn, numbers)
            verb = "is a trace input" if len(names) == 1 else "are trace inputs"
            self.info.last_miss_reason += f"; {' and '.join(names)} {verb} from now on"
            key_fn = self._keys.mark_numbers(key_fn, numbers)
        self._key_fn = key_fn
        key = key_fn(args, kwargs)
        self.info.note_key(key)
        return key_fn, key

    def _compile(self, key_fn, args: tuple, kwargs: dict, symbolic: bool) -> CompiledEntry:
        raw = self._keys.signature_of(key_fn)
        sig = self._keys.traced_signature(raw)
        dynamic = self._keys.dynamic_of(raw)
        numbers = not symbolic and has_symbolic_numbers(sig)     # floats made trace inputs automatically
        options = dict(executors=self.executors, symbolic_numbers=symbolic or numbers, transforms=self.transforms,
                       progress=self.progress, name=self.__name__, auto=self._auto, splits=self.splits)
        try:
            entry = compile_call(self.fn, args, kwargs, sig, dynamic=dynamic, **options)
        except Exception as e:
            if after_split(e):
                raise       # a piece of the call ran: compiling it again would run that piece twice
            paths = self._auto.make_static() if self._auto is not None else set()
            if not (dynamic or numbers or paths):
                raise
            why = f"{type(e).__name__}: {e}".split("\n")[0]   # symbolic values must never break a program
        else:
            if entry.learned is not None:
                self.info.last_miss_reason += f"; {entry.learned}: symbolic from now on"
            return entry
        # what failed with symbolic sizes or numbers compiles for these values; they stay static
        if dynamic:
            key_fn = self._key_fn = self._keys.make_static(key_fn)
        if numbers:
            key_fn = self._key_fn = self._keys.make_numbers_static(key_fn)
        entry = compile_call(self.fn, args, kwargs, self._keys.traced_signature(raw), **options)
        entry.sym_guards = None
        self.info.last_miss_reason += f"; compiled for these sizes and values (symbolic ones failed: {why})"
        if self.dynamic is True and dynamic and not numbers:    # floats made inputs automatically fall back silently
            warnings.warn(f"thunderlite: symbolic sizes failed for this program ({why}); compiling for the "
                          "sizes of each call", stacklevel=user_stacklevel())
        return entry

    def _store(self, key: tuple, entry: CompiledEntry) -> None:
        self._tiers.start(entry)
        if self.cache_mode != "no caching":
            entry.key = key
            with self._swap_lock:        # the list a hot tier's swap (``_replace``) indexes into
                alts = self._entries.setdefault(("alternates", key), [])
                alts.append(entry)
                dropped = max(0, len(alts) - MAX_ALTERNATES)
                del alts[:dropped]
                self._entries[key] = entry
            self.info.entries += 1 - dropped
        self.last = entry

    def _reset(self, cache: str) -> None:
        self._fast, self._candidate, self._armings = _no_fast_guard, None, 0
        self.cache_mode = cache
        self._keys = self._key_cache(self._keys.names)
        self._auto = self._path_dynamic()
        self._key_fn = self._keys.no_key
        self._entries.clear()
        self.info.entries = 0
        self.info.forget_keys()


def _no_fast_guard(args: tuple, kwargs: dict) -> object:
    return MISS


_RUN_EAGERLY = object()


def _call_module(module: torch.nn.Module, *args, **kwargs):
    # below nn.Module.__call__'s _compiled_call_impl, where module_surface routes the model's calls here
    return module._call_impl(*args, **kwargs)


def _call_own_call(module: torch.nn.Module, *args, **kwargs):
    return module(*args, **kwargs)      # a class with a __call__ of its own: that runs (and no route is set)


class ThunderliteModule(torch.nn.Module):
    """A jitted ``nn.Module``: same parameters, buffers, ``state_dict`` keys and
    modes as the original (which it holds as ``_model``); ``forward`` runs the
    compiled program, which calls the module's ``__call__`` (so hooks run).
    ``forward`` and the module carry the model's forward signature, and the
    model's own methods reached through it (``generate``) call the compiled
    program (``frontend/module_surface.py``)."""

    def __init__(self, model: torch.nn.Module, **jit_options):
        super().__init__()
        self._model = model
        # plain references (not registered submodules) keep forward's lookups cheap
        plain = type(model).__call__ is torch.nn.Module.__call__
        jitted = self.__dict__["_jitted"] = ThunderliteFunction(_call_module if plain else _call_own_call,
                                                                **jit_options)
        jitted.__name__ = type(model).__name__      # named so in progress and reports
        self.__dict__["_model_ref"] = model
        call = functools.partial(jitted, model)
        self.__dict__["forward"] = signed_forward(self, model, call)
        self.__dict__["_routes"] = CompiledCalls(model, call) if plain else None
        sig = forward_signature(model)
        if sig is not None:
            self.__dict__["__signature__"] = sig

    def forward(self, *args, **kwargs):
        return self._jitted(self._model_ref, *args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            value = getattr(self.__dict__["_modules"]["_model"], name)
        routes = self.__dict__["_routes"]
        if routes is not None and is_method_of(value, self.__dict__["_model_ref"]):
            return routes.method(value)
        return value

    def __getitem__(self, idx):
        return self._model[idx]

    def __len__(self):
        return len(self._model)

    def state_dict(self, *args, **kwargs):
        return self._model.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._model.load_state_dict(*args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        return self._model.named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return self._model.named_buffers(*args, **kwargs)

    def named_modules(self, *args, **kwargs):
        # the model's names, as named_parameters gives them: torch code joining the two
        # (DistributedDataParallel's ignored parameters) must not see this wrapper's "_model."
        return self._model.named_modules(*args, **kwargs)

    def __repr__(self):
        return f"ThunderliteModule({self._model!r})"


def jit(fn: Callable | torch.nn.Module, *, executors=None, cache: str = "constant values", transforms=None,
        progress: bool | None = None, dynamic: bool | None = None, cudagraphs: bool = False,
        max_entries: int | None = MAX_ENTRIES, splits: bool | int = True, tiering=None):
    """Compile ``fn`` (a function or an ``nn.Module``) on its first call.

    ``executors``: names or Executor objects in priority order (default list
    when None; torch always last). ``cache``: 'constant values' (specialize on
    Python scalars, the default), 'symbolic values' (floats become trace inputs
    instead of key values), or 'no caching' (retrace every call).
    ``transforms``: ``thunderlite.extend.Transform`` objects whose hooks run at
    named points of the pipeline (after tracing, after autodiff, after claiming).
    ``progress``: a compile that takes more than ~2 s shows its stage and symbol
    count on stderr; None (default) when stderr is a terminal, False never, True always.
    ``dynamic``: None (default) makes a tensor dim symbolic after a recompile
    caused by its size changing, wherever the tensor comes from (an argument,
    an attribute or item of one such as a KV cache's keys, a module buffer, a
    global, a closure cell; parameters stay static), and a float (an argument
    or read through such a path) a trace input after a recompile caused by its
    value changing; True makes every size of those tensors symbolic from the
    first call (as ``cache='symbolic values'`` does); False compiles for each
    new size and value.
    ``max_entries``: how many compiled entries the callable keeps (default 8;
    None: no bound). Past it, a call no entry accepts runs eagerly (eager's
    answer, counted in ``cache_info``'s ``eager_calls``), with one warning
    naming what kept recompiling and how to stop it.
    ``cudagraphs``: run the static parts of the final traces (forward and
    backward) as CUDA graphs (``thunderlite.extend.CUDAGraphs``, appended to
    ``transforms``); what stays outside, and why, is in ``examine``.
    ``splits``: where Python needs a tensor's value (``if loss > 0``,
    ``float(t)`` decided on, ``.item()`` formatted or compared), the program
    is compiled as pieces split there, each path of values seen compiled once
    (True: at most ``MAX_PATHS`` paths, then the callable runs eagerly, with
    a warning; a number: that bound); False raises ``DataDependentError``
    instead, for one trace or nothing.

    ``tiering``: None (default: ``TierPolicy()``, an entry called 20 times gets
    its regions compiled by ``torchcompile`` off the calling thread, swapped in
    and kept if a trial finds it no slower), False (off), a number of calls, or
    a ``thunderlite.TierPolicy``; ``wait_for_tiers`` blocks until the hot
    tiers under way are compiled, and ``cache_info``'s ``tiers`` says which
    tier each entry runs."""
    # torch's data-parallel wrappers: their communication happens in hooks and C++ a
    # trace would not run, so the jit compiles what they stand for (or refuses, naming why)
    if isinstance(fn, torch.nn.parallel.DistributedDataParallel):
        fn = from_torch_ddp(fn)
    elif isinstance(fn, torch.nn.DataParallel):
        fn = from_data_parallel(fn)
    elif isinstance(fn, torch.nn.Module):
        # FSDP2 and tensor parallelism: DTensor parameters, compiled as views on the local shards
        refuse_fsdp1(fn)
        if is_fully_shard(fn):
            fn = from_torch_fsdp2(fn)
        elif uses_fsdp2(fn):
            pass    # its fully_shard submodules are roots of their own, as in eager FSDP2: each call runs its view
        elif uses_tensor_parallel(fn):
            fn = from_torch_tp(fn)
    # a module may carry its own transforms (thunderlite.distributed.ddp): they run first
    own = getattr(fn, "_thunderlite_transforms", None)
    if own:
        transforms = [*own, *(transforms or ())]
    if cudagraphs:
        transforms = [*(transforms or ()), CUDAGraphs()]
    tiering = policy_of(tiering) or False       # a bad value is refused here, not on the first call
    if isinstance(fn, torch.nn.Module):
        return ThunderliteModule(fn, executors=executors, cache=cache, transforms=transforms, progress=progress,
                                 dynamic=dynamic, max_entries=max_entries, splits=splits,
                                 tiering=tiering)
    _check_jittable(fn)
    return ThunderliteFunction(fn, executors=executors, cache=cache, transforms=transforms, progress=progress,
                               dynamic=dynamic, max_entries=max_entries, splits=splits,
                               tiering=tiering)


def _check_jittable(fn: Any) -> None:
    """Refuse, at jit() time, what can never be compiled, with the reason."""
    if not callable(fn):
        raise TypeError(f"thunderlite.jit expects a function or an nn.Module, got {type(fn).__name__} "
                        f"({reprlib.repr(fn)})")
    kind = ("a generator function" if inspect.isgeneratorfunction(fn) else
            "an async generator function" if inspect.isasyncgenfunction(fn) else
            "a coroutine function" if inspect.iscoroutinefunction(fn) else None)
    if kind is not None:
        name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
        raise TypeError(f"thunderlite.jit cannot compile {name!r}: it is {kind}, whose body runs only "
                        "when the caller iterates or awaits it, after the call has returned, so there "
                        "is no single call to trace. Jit the function that consumes it, or the "
                        "computation done for each item.")


def _jitted(jfn) -> ThunderliteFunction:
    if isinstance(jfn, ThunderliteModule):
        return jfn._jitted
    if isinstance(jfn, ThunderliteFunction):
        return jfn
    raise TypeError(f"expected a function or module returned by thunderlite.jit, got {type(jfn).__name__}")


def _last(jfn) -> CompiledEntry:
    entry = _jitted(jfn).last
    if entry is None:
        raise RuntimeError("the jitted function has not been called yet")
    return entry


def last_traces(jfn) -> list[Trace]:
    """Every stage's computation trace of the last call; the last one is what ran."""
    return list(_last(jfn).traces)


def last_backward_traces(jfn) -> list[Trace]:
    """The backward traces of the last call ([] when it was not differentiable)."""
    return list(_last(jfn).backward_traces)


def last_gradients(jfn) -> dict[str, str]:
    """The gradients the last call's own backward made (a whole training step
    with ``loss.backward()`` inside): value name in the traces -> the leaf it
    is the gradient of. Empty when the program ran no backward."""
    return dict(getattr(_last(jfn), "gradients", None) or {})


def last_prologue_traces(jfn) -> list[Trace]:
    """The prologue of the last call: the guards checked and inputs unpacked."""
    return list(_last(jfn).prologue_traces)


def cache_info(jfn) -> dict:
    """hits, misses, entries, eager_calls (misses run eagerly past ``max_entries``),
    the reason of the last miss, the cache mode, and ``tiers``: per entry its
    tier ("fast", "measuring", "compiling", "trial", "hot", or "fast (final)"
    with the reason), its calls, and the seconds it took to reach it
    (frontend/caching/tiers.py; [] with tiering off)."""
    j = _jitted(jfn)
    splits = j.splits.as_dict() if j.splits is not None else None
    return {**j.info.as_dict(), "cache_mode": j.cache_mode, "splits": splits,
            "tiers": [e.tier.as_dict(e.calls) for e in _current_entries(j) if e.tier is not None]}


def _current_entries(j: ThunderliteFunction) -> list[CompiledEntry]:
    """The entries the cache holds now (the last one compiled, when nothing is cached)."""
    out = [e for v in list(j._entries.values()) if type(v) is list for e in v]
    return out if out or j.last is None else [j.last]


def last_tier(jfn) -> str:
    """Which tier the last call's entry runs, in words (the trace report's header)."""
    entry = _last(jfn)
    return entry.tier.describe(_jitted(jfn)._tiers.hot_after) if entry.tier is not None else "fast (tiering off)"


def wait_for_tiers(jfn, timeout: float | None = None) -> bool:
    """Block until every hot tier of ``jfn`` under way is compiled and swapped
    in (on trial for its next calls, when its policy has one) or has stayed
    fast, with the reason in ``cache_info``; False when ``timeout`` seconds
    passed first. For benchmarks and tests: calls never wait."""
    return _jitted(jfn)._tiers.wait(timeout)


def compile_stats(jfn) -> dict:
    """Compile time per stage of the last compiled entry (ms), and cache counts."""
    entry = _last(jfn)
    return {"stage_ms": dict(entry.stage_ms), "total_ms": entry.total_ms, **cache_info(jfn)}


def kernel_source(jfn) -> str:
    """The generated Triton source of every kernel the last call of ``jfn`` ran
    (forward, then backward if there was one), each under a comment naming its
    fusion symbol. Empty if the Triton executor claimed nothing."""
    entry = _last(jfn)
    return kernel_sources({"forward": entry.traces[-1],
                           "backward": entry.backward_traces[-1] if entry.backward_traces else None})


def examine(fn: Callable | torch.nn.Module, *args, executors=None, cudagraphs: bool = False, **kwargs):
    """Trace and run ``fn`` once and report what thunderlite did with it: ops
    recorded as opaque torch calls, which executor claimed what, executors
    skipped and why, what stays out of CUDA graphs and why (``cudagraphs=True``,
    as ``jit`` takes it), which tier the entry runs, and the error if it could
    not be compiled. ``fn`` may be a function or module ``jit`` returned: it is
    called once more, and the report is about the entry that call ran (its
    tier included)."""
    jitted = isinstance(fn, (ThunderliteFunction, ThunderliteModule))
    jfn = fn if jitted else jit(fn, executors=executors, cudagraphs=cudagraphs)
    start = time.perf_counter()
    try:
        jfn(*args, **kwargs)
        error = None
    except Exception as e:  # noqa: BLE001 - examine reports failures instead of raising them
        error = e
    j = _jitted(jfn)
    return examine_call(j, error, (time.perf_counter() - start) * 1e3, j.executors if jitted else executors)
