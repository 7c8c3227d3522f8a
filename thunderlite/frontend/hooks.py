"""The interpreter hooks that turn a Python program into a trace.

``TracingHooks`` plugs into ``thunderlite.interpreter.interpret``:

- ``lookaside``: torch callables become torch-language symbols (or opaque
  symbols), builtins that must understand proxies (``isinstance``, ``type``,
  ``torch.is_tensor``) get proxy-aware versions, thunderlite's own callables
  (symbols, proxy methods) run natively; everything else is interpreted.
- ``load_*``: values entering the program from globals, attributes, closure
  cells and containers get provenance (``TraceState.enter``): tensors become
  trace inputs, Python values become guards.
- ``store_*``: writes to objects that exist outside the call (attributes,
  items, globals, closure cells of functions defined outside) are kept in an
  overlay (later reads see it) and applied by the epilogue after the run.
"""
from __future__ import annotations

import collections
import functools
import operator
import random
import sys
import time
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core.proxies import DataDependentError, TensorProxy, _BoundMethod
from thunderlite.core.symbol import SourceLine, Symbol
from thunderlite.core.symint import active_env
from thunderlite.distributed import dtensor, fsdp2, in_step
from thunderlite.distributed.stand_in import stand_in
from thunderlite.distributed.views import ViewModule
from thunderlite.frontend import autocast
from thunderlite.frontend.lookasides import REPLACEMENTS, is_creation_fn, proxy_aware_builtins
from thunderlite.frontend.provenance import Prov, is_atom
from thunderlite.frontend.source_map import defined_by_user, is_stdlib, source_line, user_file
from thunderlite.frontend.splits import NOT_SPLIT, index_request, native_request, request, size_request
from thunderlite.frontend.state import DELETED, MIRROR_MAX_ITEMS, TraceState
from thunderlite.frontend.training import predicated
from thunderlite.frontend.training.traced_autograd import TracedAutograd
from thunderlite.interpreter import (
    MISSING,
    InterpreterHooks,
    call_past_lookaside,
    interpreted_functions,
    source_locations,
)
from thunderlite.interpreter.tracebacks import interpreted_frames
from thunderlite.torch import opaque_symbol_for, symbol_for
from thunderlite.torch.opaque import OpaqueDataDependentError
from thunderlite.torch.ops import grad_mode
from thunderlite.torch.ops.inplace import assign_data
from thunderlite.transforms.autodiff.function import function_symbol

_MODULE_SLOTS = ("_parameters", "_buffers", "_modules")
_CONTAINERS = (list, dict, collections.OrderedDict, collections.defaultdict, collections.deque, set)
# the in-place methods of _CONTAINERS
_CONTAINER_WRITES = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "add", "discard", "update",
    "difference_update", "intersection_update", "symmetric_difference_update", "appendleft", "extendleft",
    "popleft", "rotate", "popitem", "setdefault", "move_to_end", "__iadd__", "__imul__", "__ior__", "__iand__",
    "__isub__", "__ixor__", "__setitem__", "__delitem__"})


class NotTracedError(RuntimeError):
    """The program uses something thunderlite does not trace (numpy arrays)."""


class UnknownOriginError(NotTracedError):
    """A real tensor reached the program by a way the prologue could not take
    again on the next call: baked in, it would be stale there."""


def _default_argument(t: torch.Tensor) -> Prov | None:
    """The path of ``t`` when it is a default argument of an interpreted function:
    every call of that function gets the very same object."""
    for fn in interpreted_functions():
        if fn is None:
            continue
        for i, d in enumerate(getattr(fn, "__defaults__", None) or ()):
            if d is t:
                return Prov.object(fn).attr("__defaults__").item(i)
        for k, d in (getattr(fn, "__kwdefaults__", None) or {}).items():
            if d is t:
                return Prov.object(fn).attr("__kwdefaults__").item(k)
    return None


_DYNAMO_DISABLE_CODE = torch._disable_dynamo(len).__code__
# item/tolist give symbolic numbers (torch/ops/data_dependent.py)
_DATA_DEPENDENT_METHODS = frozenset({"__bool__", "numpy"})

_DATA_DEPENDENT_HINT = (". Compute both branches and pick with torch.where, or use the ThunderFX backend "
                        "(torch.compile(fn, backend=\"thunderlite\")), which splits the graph there.")
# code that runs DTensor's dispatcher or FSDP's parameter swapping: refused while tracing
_DTENSOR_MODULES = ("torch.distributed.tensor", "torch.distributed.fsdp")


class TracingHooks(InterpreterHooks):
    """Hooks for one traced call (see module docstring)."""

    def __init__(self, state: TraceState):
        self.state = state
        self.trace = state.trace
        self.grad_enabled = torch.is_grad_enabled()
        self.last_location: tuple | None = None
        self._lookasides = proxy_aware_builtins(self)
        self.autograd = TracedAutograd(self)      # backward() and .grad inside the program
        self.splitter = None    # splits.Splitter: where Python needs a traced value (None: refused)
        self.predicating: list = []               # blocks of `if` being traced predicated (innermost last)

    # --- source lines ----------------------------------------------------------------------
    _located_frames: tuple | None = None        # the interpreted frames last_location was made from

    def locate(self) -> SourceLine | None:
        """The user's line the symbol being recorded comes from, with the frames
        that called it (``source_map.source_line``: thunderlite's and torch's own
        frames are never the user's)."""
        frames = tuple(source_locations())
        if not frames:
            return self.last_location
        if frames == self._located_frames:
            return self.last_location
        self._located_frames = frames
        self.last_location = source_line(frames)
        return self.last_location

    def located(self, e: DataDependentError) -> DataDependentError:
        """``e`` with the user's line appended (once), and the ways out."""
        msg = str(e)
        if " (at " not in msg:
            loc = self.user_location()
            msg = f"{msg} (at {loc[0]}:{loc[1]}: {loc[2]})" if loc else msg
        if "ThunderFX" not in msg and not isinstance(e, OpaqueDataDependentError):
            msg += _DATA_DEPENDENT_HINT
            if self.splitter is None:
                msg += " Or leave jit's splits option on (the default): the program is then split there."
        return e if msg == str(e) else type(e)(msg)

    def user_location(self, exc: BaseException | None = None) -> tuple | None:
        """The user's line (as ``locate``): where the user called the torch function
        that failed (``torch.unique`` -> ``torch._unique2``). Once the frames are
        gone, the ones ``exc`` recorded while it propagated."""
        frames = source_locations() or (interpreted_frames(exc) if exc is not None else [])
        return (source_line(frames) if frames else None) or self.locate()

    # --- calls --------------------------------------------------------------------------------
    def lookaside(self, fn: Callable) -> Callable | None:
        special = REPLACEMENTS.get(_key(fn))
        if special is not None:
            return functools.partial(special, self._lookasides)
        if isinstance(fn, (Symbol, _BoundMethod)):
            return self.recording(fn)
        if isinstance(fn, torch.nn.Module) and not isinstance(fn, ViewModule):
            view = stand_in(fn)
            if view is not None:
                return self._calling_stand_in(view)
        if fsdp2.is_set_gradient_sync(fn):
            owner = getattr(fn, "__self__", None)
            return self._set_gradient_sync if owner is None else functools.partial(self._set_gradient_sync, owner)
        if not isinstance(fn, type) and (getattr(fn, "__module__", None) or "").startswith(_DTENSOR_MODULES):
            if fn is dtensor.dtensor_type().from_local:
                return self.recording(self._dtensor_from_local)
            raise self.dtensor_refused(fn)
        if in_step.is_data_parallel(fn) and self.grad_enabled \
                and not any(t in self.state.transforms for t in getattr(fn, "_thunderlite_transforms", ())):
            return self._calling_data_parallel(fn)
        if type(fn) in _SLOT_WRAPPERS and fn.__name__ in _WRITE_SLOTS:
            writer = self._slot_write(fn)
            if writer is not None:
                return writer
        if type(fn) in _SLOT_WRAPPERS and fn.__name__ in _READ_SLOTS and self.state.attr_writes:
            reader = self._slot_read(fn)
            if reader is not None:
                return reader
        sym = symbol_for(fn)
        if sym is not None:
            return self.recording(sym, torch_fn=fn)
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, type) and issubclass(owner, torch.autograd.Function) and fn.__name__ == "apply":
            return self.recording(function_symbol(owner))   # traced forward; the user's backward is its VJP
        if _is_thunderlite_internal(fn):
            return self.recording(fn)     # proxy operators and methods record symbols
        if type(fn) is types.BuiltinMethodType and isinstance(fn.__self__, random.Random):
            raise NotTracedError(
                f"thunderlite does not trace Python's random module: random.{fn.__name__} at {self._caller_where()} "
                "would draw once, while tracing, and every call would reuse that number. Draw with torch "
                "(torch.rand, torch.randint, torch.bernoulli), which the trace replays per call.")
        if type(fn) is types.BuiltinFunctionType and fn in _CLOCKS:
            frames = source_locations()
            if frames and user_file(frames[-1][0]):     # logging's timestamps (stdlib) stay trace-time values
                raise NotTracedError(
                    f"thunderlite does not trace Python's clocks: time.{fn.__name__}() at {self._where()} would "
                    "be read once, while tracing, and every call would reuse that time. Read the clock outside "
                    "the jitted function and pass the value in, or time the call from outside.")
        if type(fn) is types.BuiltinMethodType and fn.__name__ in _CONTAINER_WRITES:
            owner = fn.__self__
            if self.predicating:
                self.predicating[-1].writes_object(owner)
            if isinstance(owner, _CONTAINERS) and id(owner) in self.state.prov_of:
                raise self.container_write_refused(owner, fn.__name__)
        if _is_torch_builtin(fn):
            return self._torch_builtin(fn)
        if _is_numpy(fn):
            return self._numpy_call(fn)
        if getattr(fn, "__code__", None) is _DYNAMO_DISABLE_CODE:
            # torch wraps some functions (torch.manual_seed once torch._dynamo is imported)
            # in a dynamo-disable wrapper: look through it to the op it wraps
            return self.lookaside(fn.__wrapped__)
        if self.splitter is not None and (any(fn is f for f in _PURE_FUNCTIONS)
                                          or type(fn) is types.BuiltinFunctionType
                                          and getattr(fn, "__module__", None) in _PURE_MODULES):
            return self._on_values(fn)
        return None

    def _slot_write(self, fn: Callable) -> Callable | None:
        """A native ``__setattr__``/``__delattr__``/``__setitem__``/``__delitem__``
        called on an object from outside the call (``super().__setattr__(k, v)``
        in a class's own ``__setattr__``, ``dict.__setitem__(d, k, v)``): it goes
        to the overlay as the program's write, as the statement would; run
        natively it would leave a traced value in the caller's object (and the
        next trace reading it would run another trace's value)."""
        bound = getattr(fn, "__self__", None)
        if isinstance(bound, type):
            bound = None
        prov_of = self.state.prov_of
        if bound is not None and id(bound) not in prov_of:
            return None
        name = fn.__name__

        def write(*args):
            obj, rest = (bound, args) if bound is not None else (args[0], args[1:])
            if id(obj) in prov_of:
                if name == "__setattr__" and self.store_attr(obj, *rest):
                    return None
                if name == "__delattr__" and self.delete_attr(obj, *rest):
                    return None
                if name == "__setitem__" and self.store_subscr(obj, *rest):
                    return None
                if name == "__delitem__" and self.delete_subscr(obj, *rest):
                    return None
                if name in ("__setitem__", "__delitem__"):
                    raise self.container_write_refused(obj, name)
            return fn(*args)
        return write

    def _slot_read(self, fn: Callable) -> Callable | None:
        """A native ``__getattribute__``/``__getitem__`` called on an object from
        outside the call (``super().__getattribute__(k)`` in a class's own
        ``__getattribute__``, as HF's configs do): what this call wrote there
        (``_slot_write``: the overlay) is what it reads back, as the statement
        would; the native read would see the value from before the call."""
        bound = getattr(fn, "__self__", None)
        if isinstance(bound, type):
            bound = None
        st = self.state
        if bound is not None and id(bound) not in st.prov_of:
            return None
        item = fn.__name__ == "__getitem__"

        def read(*args):
            obj, rest = (bound, args) if bound is not None else (args[0], args[1:])
            if len(rest) == 1 and id(obj) in st.prov_of:
                key = ("item", rest[0]) if item and _is_path_key(rest[0]) else None if item else rest[0]
                w = st.attr_writes.get((id(obj), key)) if key is not None else None
                if w is not None:
                    if w[1] is DELETED:
                        raise KeyError(rest[0]) if item else AttributeError(rest[0])
                    return w[1]
            return fn(*args)
        return read

    def _on_values(self, fn: Callable) -> Callable:
        """A pure native function that needs a traced value (``math.isclose(n,
        2.0)``, ``range(n)``) runs on the run-time values, the program split there."""
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except DataDependentError as e:
                wanted = self.split_value(native_request(fn, args, kwargs))
                if wanted is NOT_SPLIT:
                    raise self.located(e) from None
                return wanted
        return call

    def recording(self, fn: Callable, torch_fn: Callable | None = None) -> Callable:
        """Call ``fn`` natively, stamping the user's line on the symbols it records.
        ``torch_fn``: the torch callable ``fn`` stands for, which a call on
        ``DTensor`` proxies runs on meta ``DTensor`` s to ask torch's sharding
        propagation (distributed/dtensor.py)."""
        def call(*args, **kwargs):
            if isinstance(fn, _BoundMethod) and getattr(fn.fn, "name", None) in _DATA_DEPENDENT_METHODS:
                raise self.data_dependent(f".{fn.fn.name}()")
            trc = self.trace
            trc.source = self.locate()
            n = len(trc.bound_symbols)
            if self.state.objects:      # an object handed to an op is held by the trace as it is
                self.native_use(fn, (*args, *kwargs.values()) if kwargs else args)
            if _has_tensor(args) or (kwargs and _has_tensor(kwargs.values())):
                args, kwargs = self._capture_constants(args, kwargs)
            try:
                if torch_fn is not None and dtensor.has_dtensor(args, kwargs):
                    out = dtensor.dispatch(torch_fn, fn, args, kwargs, getattr(torch_fn, "__qualname__", str(fn)))
                elif torch._C._is_any_autocast_enabled():
                    f, args, kwargs = autocast.cast_inputs(fn, args, kwargs)
                    out = f(*args, **kwargs)
                else:
                    out = fn(*args, **kwargs)
            except DataDependentError as e:
                wanted = self.split_value(request(fn, args, kwargs))
                if wanted is not NOT_SPLIT:
                    return wanted
                if self.pinned(e):
                    return call(*args, **kwargs)        # the op again, its sizes now known
                raise self.located(e) from None
            except dtensor.DTensorRefused as e:
                if str(e).startswith("thunderlite cannot trace"):
                    raise
                raise dtensor.DTensorRefused(f"thunderlite cannot trace {e} (at {self._where()})") from None
            if not self.grad_enabled:
                self._drop_requires_grad(n)
            if kwargs.get("requires_grad") is True and type(out) is TensorProxy:
                grad_mode.requires_grad_(out)     # a factory's new leaf (``zeros_like(x, requires_grad=True)``)
            return out
        return call

    def split_value(self, req) -> Any:
        """The Python value the program needs (a ``splits.sites`` request), the
        program split there (frontend/splits/); ``NOT_SPLIT`` where it cannot
        split: the strict option, inside a composite or a torch.func function."""
        if req is None or self.splitter is None or not self.splitter.allowed(req[0]):
            return NOT_SPLIT
        if self.predicating:        # a block traced predicated reads a value: it reads its flag instead
            raise self.predicating[-1].refuse(f"it needs a traced value ({req[2]})")
        return self.splitter.value(*req)

    def pinned(self, e: DataDependentError) -> bool:
        """An op decided on sizes known only when the program runs: the program
        splits to read them, and is specialized to their values from then on."""
        env = active_env()
        req = size_request(e)
        if req is None or env is None or all(p.name in env.replacements for p in req[0]):
            return False            # pinned already: the op needs something else
        values = self.split_value(req)
        if values is NOT_SPLIT:
            return False
        for p, v in zip(req[0], values, strict=True):
            env.pin(p.name, v)
        return True

    def unannounced(self, t: torch.Tensor, how: str, located: bool = True) -> TensorProxy:
        """The proxy of a real tensor met where no path leads (``how``): one the
        trace already has, a module's tensor (registered with its path), or a
        default argument; anything else is an error naming the user's line,
        never a constant baked into the trace."""
        st = self.state
        if id(t) in st.proxy_of or id(t) in st.prov_of:
            return st.enter(None, t)
        prov = _default_argument(t)
        if prov is not None:
            return st.enter(prov, t)
        loc = self.user_location() if located else None
        where = f" at {loc[0]}:{loc[1]}: {loc[2]}" if loc else ""
        kind = "Parameter" if isinstance(t, torch.nn.Parameter) else "tensor"
        raise UnknownOriginError(
            f"thunderlite cannot tell where a {kind} ({tuple(t.shape)}, {t.dtype}){where} comes from: it was {how} "
            "after code thunderlite ran natively handed it over, so the next call could not find it again (a "
            "constant baked into the compiled program would go stale). Pass it as an argument, or read it from a "
            "module attribute, a global or a closure variable.")

    def settled(self, x: Any, how: str) -> Any:
        """``x`` (a returned value, a value written back) with each real tensor in
        its plain containers made a proxy (``unannounced``): a tensor natively run
        code computed from real ones (``sum`` over a container the program holds
        no copy of) would otherwise leave the call as a trace-time constant.
        A container that came from outside the call uncopied (too big to mirror:
        LBFGS's history lists) stays as it is: its item writes are its own."""
        t = type(x)
        if isinstance(x, torch.Tensor) and t is not TensorProxy:
            return self.unannounced(x, how, located=False)      # the program's lines have all run
        if (t is list or t is dict) and id(x) in self.state.prov_of and id(x) not in self.state.mirrors_by_copy:
            return x
        if t is tuple or t is list or (isinstance(x, tuple) and hasattr(t, "_make")):
            items = [self.settled(y, how) for y in x]
            if all(a is b for a, b in zip(items, x, strict=True)):
                return x
            return t(items) if t is list or t is tuple else t._make(items)
        if t is dict:
            items = {k: self.settled(v, how) for k, v in x.items()}
            return x if all(items[k] is v for k, v in x.items()) else items
        return x

    def _capture_constants(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Concrete tensors reaching an op: module tensors and default arguments
        join the trace with their paths; others have no path (``unannounced``)."""

        def conv(v):
            if isinstance(v, torch.Tensor):
                return self.unannounced(v, "passed to a torch function")
            if type(v) in (list, tuple) and _has_tensor(v):
                return type(v)(conv(y) for y in v)
            if type(v) is dict and _has_tensor(v.values()):
                return {k: conv(y) for k, y in v.items()}
            return v
        return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}

    def _torch_builtin(self, fn: Callable) -> Callable:
        """A torch C function with no symbol: opaque when it touches proxies or
        creates tensors, otherwise run as it is (``torch.is_grad_enabled()``...)."""
        def call(*args, **kwargs):
            if dtensor.has_dtensor(args, kwargs):      # DTensor's answer (metadata: ``torch.is_complex``), or
                return dtensor.dispatch(fn, call, args, kwargs, getattr(fn, "__name__", str(fn)))  # local calls
            if getattr(fn, "__name__", "") == "numpy" and (_has_proxy(args) or _has_proxy((fn.__self__,))):
                raise self.not_traced("Tensor.numpy()")
            self.native_use(fn, (*args, *kwargs.values()) if kwargs else args)
            # a real tensor among the arguments joins the trace (``_capture_constants``):
            # run here it would be computed, and written, once at trace time (not a
            # generator's state, which fork_rng saves and restores while tracing)
            generator = isinstance(getattr(fn, "__self__", None), torch.Generator)
            if (is_creation_fn(fn) or _has_proxy(args) or _has_proxy(kwargs.values())
                    or not generator and (_has_tensor(args) or _has_tensor(kwargs.values()))):
                return self.recording(opaque_symbol_for(fn))(*args, **kwargs)
            out = fn(*args, **kwargs)
            if _has_tensor((out,)) and not isinstance(getattr(fn, "__self__", None), torch.Generator):
                # it made a tensor (torch.range, torch.kaiser_window...): that must happen on
                # every call, not once at trace time with the result baked into the program
                # (a generator's state, read by fork_rng to restore it, stays a trace-time value)
                return self.recording(opaque_symbol_for(fn))(*args, **kwargs)
            return out
        return call

    def _numpy_call(self, fn: Callable) -> Callable:
        """numpy is not traced: a numpy call on a traced tensor, or one that makes an
        array (which would be frozen into the trace as a constant), is refused."""
        def call(*args, **kwargs):
            name = _numpy_name(fn)
            if _has_proxy(args) or _has_proxy(kwargs.values()):
                raise self.not_traced(f"{name}(...) on a tensor")
            self.native_use(fn, (*args, *kwargs.values()) if kwargs else args)
            out = fn(*args, **kwargs)
            if type(out).__name__ == "ndarray":
                raise self.not_traced(f"{name}(...)")
            return out
        return call

    def container_write_refused(self, owner: Any, method: str) -> NotTracedError:
        """The program changes in place a container from outside the call that it
        holds no copy of (``state.py``: more than ``MIRROR_MAX_ITEMS`` items, or
        keyed by objects): done now it would happen once, at trace time."""
        kind = type(owner).__name__
        return NotTracedError(
            f"thunderlite does not trace changes to a {kind} of {len(owner)} items read from outside the call "
            f"(it copies containers of up to {MIRROR_MAX_ITEMS} items with int/str keys): {kind}.{method} at "
            f"{self._where()}. Keep such state in tensors, or in a smaller container.")

    def _where(self) -> str:
        loc = self.locate()
        return f"{loc[0]}:{loc[1]}: {loc[2]}" if loc else "an unknown line"

    def _caller_where(self) -> str:
        """``_where`` past the standard library's frames (``random.uniform`` calls
        ``self.random()``: the user's line is the call of ``uniform``)."""
        frames = [f for f in source_locations() if not is_stdlib(f[0])]
        loc = source_line(frames) if frames else None
        return f"{loc[0]}:{loc[1]}: {loc[2]}" if loc else self._where()

    def not_traced(self, what: str) -> NotTracedError:
        where = self._where()
        return NotTracedError(
            f"numpy arrays are not traced: {what} at {where}. Write it with torch operations "
            "(most numpy functions have a torch namesake), or do the numpy work outside the "
            "jitted function and pass tensors in.")

    def _dtensor_from_local(self, local: Any, device_mesh: Any = None, *args, **kwargs):
        """``DTensor.from_local`` while tracing: the mesh is guarded by identity
        where the program read it from (an argument, a global)."""
        prov = self.state.prov_of.get(id(device_mesh))
        if prov is not None:
            self.state.add_guard(prov, "is", device_mesh)
        return dtensor.from_local(local, device_mesh, *args, **kwargs)

    def _calling_stand_in(self, view: ViewModule) -> Callable:
        """A call of a model FSDP2 or tensor parallelism sharded, inside a jitted
        function: its view runs instead (``distributed/stand_in.py``), its tensors
        read through the view (a root of their paths), its transforms joining
        this compile's."""
        if id(view) not in self.state.prov_of:
            self.state.register_module_tree(view, Prov.object(view))
        for tr in view._thunderlite_transforms:
            if tr not in self.state.transforms and tr not in self.state.module_transforms:
                self.state.module_transforms.append(tr)
        return lambda *args, **kwargs: call_past_lookaside(view, args, kwargs)

    def _set_gradient_sync(self, module: torch.nn.Module, requires_gradient_sync: bool, *,
                           recurse: bool = True) -> None:
        """FSDP2's ``set_requires_gradient_sync`` inside a jitted function: its
        groups' flags are written as the program's (read by its backward,
        training/traced_autograd.py; written back after the call)."""
        flag = bool(requires_gradient_sync)
        for pg in fsdp2.sync_groups(module, recurse):
            for name in ("reduce_grads", "all_reduce_grads"):
                self.read_attr(pg, name)
                self.store_attr(pg, name, flag)

    def read_attr(self, obj: Any, name: str) -> Any:
        """``obj.name`` as the program sees it (written earlier in the call, or
        read and guarded), ``obj`` an object from outside the call reached
        through code thunderlite runs itself (found by identity if it has no path)."""
        if id(obj) not in self.state.prov_of:
            self.state.note(obj, Prov.object(obj))
        return self.load_attr(obj, name, getattr(obj, name))

    def dtensor_refused(self, fn: Callable) -> NotImplementedError:
        """DTensor code runs its sharding propagation and collectives inside torch's
        dispatcher, FSDP's hooks swap parameters: a trace of proxies would do
        neither, so they are refused by name."""
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        return NotImplementedError(
            f"thunderlite does not trace DTensor or FSDP internals: {name}(...) at {self._where()}. Models "
            "whose layers fully_shard (FSDP2) or ColwiseParallel/RowwiseParallel sharded are compiled when given to "
            "thunderlite.jit or called by a jitted function; otherwise run the DTensor code eagerly and jit the "
            "functions of its local tensors.")

    def _calling_data_parallel(self, model: torch.nn.Module) -> Callable:
        """A data-parallel model (torch's DDP, ``ddp(m)``) called inside a jitted
        function with grad enabled: the wrapped module runs, and the call is
        noted with DDP's ``require_backward_grad_sync`` as read now (guarded;
        ``no_sync()`` inside the program writes it), so that the program's own
        backward averages the gradients as DDP's reducer does
        (``distributed/in_step.py``), or, for a backward after the call, the
        compiled backward does (``DDPTransform``)."""
        try:
            dp = in_step.data_parallel(model)
        except NotImplementedError as e:
            raise NotImplementedError(f"{e} (at {self._where()})") from None
        synced = bool(self.load_attr(model, "require_backward_grad_sync", model.require_backward_grad_sync))
        self.autograd.note_data_parallel(dp, synced)
        inner = dp.module

        def call(*args, **kwargs):
            if dp.buffers and self.read_attr(model, "require_forward_param_sync"):
                broadcast = self.lookaside(torch.distributed.broadcast)    # DDP's _pre_forward buffer sync
                for b in dp.buffers:
                    broadcast(self.state.enter(self.state.prov_of.get(id(b)), b), 0, group=model.process_group)
            special = self.lookaside(inner)
            out = special(*args, **kwargs) if special is not None else call_past_lookaside(inner, args, kwargs)
            if dp.buffers:
                self.store_attr(model, "require_forward_param_sync", synced)      # as DDP's _post_forward
            return out
        return call

    def _drop_requires_grad(self, start: int) -> None:
        for bsym in self.trace.bound_symbols[start:]:
            for p in bsym.tensor_outs():
                p.requires_grad = False

    def set_grad_enabled(self, mode: bool) -> None:
        """Switch grad mode while tracing and record the switch (the eager-mode
        replay of autodiff runs it; see torch/ops/grad_mode.py)."""
        if mode != self.grad_enabled:
            self.trace.source = self.locate()
            grad_mode.set_grad_enabled(mode)
        torch._C._set_grad_enabled(mode)
        self.grad_enabled = mode

    def data_dependent(self, what: str) -> DataDependentError:
        where = self._where()
        return DataDependentError(
            f"{what} reads a tensor's values, which are not known while tracing (at {where}). "
            "thunderlite cannot follow data-dependent control flow: compute the branch with "
            "torch.where, or move the data-dependent part out of the jitted function.")

    # --- loads ------------------------------------------------------------------------------------
    def load_global(self, globals_dict: dict, name: str, value: Any) -> Any:
        w = self.state.global_writes.get((id(globals_dict), name))
        if w is not None:
            return w[1]
        if value is MISSING or name not in globals_dict:
            return value                 # a builtin: not guarded
        if (is_stateful_iterator(value) or type(value) in _CONTAINERS and len(value) > MIRROR_MAX_ITEMS) \
                and not defined_by_user(sys.modules.get(globals_dict.get("__name__"))):
            # a library's own bookkeeping (torch's ``AUTOGRAD_FUNCTION_COUNTER``, advanced
            # when an ``autograd.Function`` class is made; dynamo's ``cached_backends``,
            # which ``zero_grad`` adds to and every ``torch.compile`` grows): not the
            # program's state, so neither refused nor guarded, as other library code run
            return value
        return self.entered(Prov.global_(globals_dict, name), value)

    def load_attr(self, obj: Any, name: str, value: Any) -> Any:
        st = self.state
        w = st.attr_writes.get((id(obj), name))
        if w is not None:
            return MISSING if w[1] is DELETED else w[1]
        if type(obj) is TensorProxy:
            if name in _DATA_DEPENDENT_METHODS:
                raise self.data_dependent(f".{name}()")
            return value
        if type(obj) is types.ModuleType and defined_by_user(obj):
            # ``config.SCALE``: a global of that module, read and written as one
            return self.load_global(obj.__dict__, name, value)
        if value is MISSING:
            # an attribute that is absent now (``getattr(m, "extra", None)``,
            # ``hasattr``) must still be absent on the next call: the branch taken
            # on its absence is baked into the trace
            parent = st.prov_of.get(id(obj))
            if parent is not None:
                st.add_guard(parent.attr(name), "absent", None)
            return value
        if isinstance(obj, torch.Tensor):
            # a real tensor the program reached through code run natively
            # (``operator.attrgetter("weight")(m)``): it joins the trace as an input
            # captured by reference, as a real tensor argument of an op does
            # (``_capture_constants``); run natively, its in-place methods would write
            # once at trace time and be recorded as a constant call DCE drops
            proxy = self.unannounced(obj, f"whose .{name} was read")
            return self.input_grad(proxy) if name == "grad" else getattr(proxy, name)
        parent = st.prov_of.get(id(obj))
        if parent is None:
            return self.unannounced(value, f"read as .{name} of a {type(obj).__name__}") \
                if isinstance(value, torch.Tensor) else value
        value = self.entered(parent.attr(name, _module_slot(obj, name)), value)
        if name in _MODULE_SLOTS and isinstance(obj, torch.nn.Module) and type(value) in (dict, OrderedDict):
            self._apply_attr_writes(obj, value)
        return value

    def entered(self, prov: Prov, value: Any) -> Any:
        """``TraceState.enter``, refusing an iterator kept from outside the call (a
        generator, ``iter(self.layers)``, ``itertools.count()``): the program would
        advance it once, while tracing, and every later call would replay that one
        step's items."""
        if is_stateful_iterator(value):
            t = type(value)
            raise NotTracedError(
                f"thunderlite does not trace an iterator kept from outside the call ({t.__name__} read from "
                f"{prov.describe()}) at {self._where()}: advanced while tracing, the compiled program would not "
                "advance it again. Keep an index (an int attribute, or a tensor) instead, or create the iterator "
                "inside the call.")
        return self.state.enter(prov, value)

    def _apply_attr_writes(self, module: torch.nn.Module, slot_copy: dict) -> None:
        """The program's copy of a module's slot dict, made after the program
        assigned some of its names (``self.b = t``; the overlay): it shows them."""
        for name in list(slot_copy):
            w = self.state.attr_writes.get((id(module), name))
            if w is None:
                continue
            if w[1] is DELETED:
                del slot_copy[name]
            else:
                slot_copy[name] = w[1]

    def slot_copy_holding(self, module: torch.nn.Module, name: str) -> dict | None:
        """The program's copy of the module slot dict (``_parameters``, ``_buffers``,
        ``_modules``) that holds ``name``, if the program made one. A slot dict
        the call replaced (``functional_call``'s overlay) comes first."""
        d = module.__dict__
        for slot in _MODULE_SLOTS:
            w = self.state.attr_writes.get((id(module), slot))
            if w is not None and type(w[1]) in (dict, OrderedDict):
                if name in w[1]:
                    return w[1]
                continue
            m = self.state.mirror_of.get(id(d.get(slot)))
            if m is not None and name in m.copy:
                return m.copy
        return None

    def load_subscr(self, container: Any, key: Any, value: Any) -> Any:
        st = self.state
        w = st.attr_writes.get((id(container), ("item", key))) if _is_path_key(key) else None
        if w is not None:
            if w[1] is DELETED:
                raise KeyError(key)
            return w[1]
        if value is MISSING:        # absent, and not stored by this call: the native lookup decides
            return value
        parent = st.prov_of.get(id(container))
        if parent is None or not _is_path_key(key):
            return self.unannounced(value, f"read as an item of a {type(container).__name__}") \
                if isinstance(value, torch.Tensor) else value
        return self.entered(parent.item(key), value)

    def input_grad(self, proxy: TensorProxy) -> Any:
        """``p.grad``: for an input tensor the real ``.grad`` read through the
        input's path on every call, or the value the program gave it (a backward
        inside the program, ``p.grad = t``; training/traced_autograd.py)."""
        return self.autograd.grad_of(proxy)

    def native_use(self, what: Any, values: tuple) -> None:
        """Objects the program reads by path (``TraceState.objects``, keyed by type)
        handed to native code that may read their identity (``what``: the native
        callable, or ``is``/``in``/``hash``): the entry then holds for those very
        objects (an identity guard naming the line). A builtin method's
        ``__self__`` counts; containers are looked into one level."""
        objects = self.state.objects
        if not objects or what is callable or what is print:
            return
        if type(what) is str and what == "in":
            self._membership(*values)
            return
        owner = getattr(what, "__self__", None) if type(what) is not str else None
        objclass = getattr(what, "__objclass__", None)
        if owner is None and (objclass in _BUILTIN_CONTAINERS or objclass is object) and values:
            owner, values = values[0], values[1:]       # unbound: ``dict.__setitem__(d, k, v)``
        if owner is not None and id(owner) in objects:
            self._identity_used(owner, what)
        if objclass is object and getattr(what, "__name__", None) == "__setattr__":
            return      # ``super().__setattr__(name, value)`` stores the value
        kind = (what if type(what) is type else owner if type(owner) is type else
                next((c for c in type(owner).__mro__ if c in _BUILTIN_CONTAINERS), None))
        if kind in _BUILTIN_CONTAINERS:
            values = _compared_by_container(what, kind, values)
        for v in values:
            if id(v) in objects:
                self._identity_used(v, what)
            elif type(v) in (list, tuple, set, frozenset):
                for y in v:
                    if id(y) in objects:
                        self._identity_used(y, what)
            elif type(v) is dict:
                for y in (*v, *v.values()):
                    if id(y) in objects:
                        self._identity_used(y, what)

    def _membership(self, item: Any, container: Any) -> None:
        """``item in container`` run natively: the item is hashed or compared; an
        element (a dict's key) is compared only with an item of its type, or by
        an ``__eq__`` of its own (run natively)."""
        objects = self.state.objects
        if id(item) in objects:
            self._identity_used(item, "in")
        if not isinstance(container, (*_CONTAINERS, tuple, frozenset)):
            return
        for y in container:
            if id(y) in objects and (type(y) is type(item) or type(y).__eq__ is not object.__eq__):
                self._identity_used(y, "in")

    def _identity_used(self, obj: Any, what: Any) -> None:
        if id(obj) in self.state.fixed:
            return
        if type(what) is str:
            how = {"is": "compared with `is`", "in": "compared with `in`",
                   "hash": "hashed (a dict key or set item)"}.get(what, f"used as {what}")
        else:
            how = f"passed to {getattr(what, '__qualname__', None) or repr(what)}"
        self.state.identity_used(obj, f"{how} at {self._where()}")

    def subscr_key(self, container: Any, key: Any) -> Any:
        """A tensor proxy used as a key into a real dict (``optimizer.state[p]``)
        looks up the tensor it stands for; the entry then holds only for that
        very tensor (an identity guard on the proxy's path). A traced value
        indexing a list, tuple or string splits the program there. An object
        keyed by type used as a key is hashed: its identity is guarded."""
        if id(key) in self.state.objects:
            self._identity_used(key, f"a subscript of a {type(container).__name__}")
        if isinstance(container, (list, tuple, str, range)):
            wanted = self.split_value(index_request(key))
            return key if wanted is NOT_SPLIT else wanted
        if type(key) is dtensor.DTensorProxy and isinstance(container, dict) and key.source is not None:
            prov, value = key.source         # the DTensor itself (its path guarded by identity when entered)
            self.state.add_guard(prov, "is", value)
            return value
        if type(key) is not TensorProxy or not isinstance(container, dict):
            return key
        inp = self.state.input_by_name(key.name)
        if inp is None:
            return key
        if inp.prov is not None:
            self.state.add_guard(inp.prov, "is", inp.value)
        return inp.value

    def load_deref(self, cell, value: Any) -> Any:
        w = self.state.cell_writes.get(id(cell))
        if w is not None:
            if w[1] is DELETED:
                raise NameError("cannot access free variable: it was deleted earlier in this call")
            return w[1]
        if value is MISSING:
            return value
        if id(cell) not in self.state.external_cells:
            return self.unannounced(value, "read from a closure variable") if isinstance(value, torch.Tensor) \
                else value
        return self.entered(Prov.cell(cell), value)

    # --- stores ------------------------------------------------------------------------------------
    def store_global(self, globals_dict: dict, name: str, value: Any) -> bool:
        self.state.global_writes[(id(globals_dict), name)] = (globals_dict, value)
        return True

    def store_deref(self, cell, value: Any) -> bool:
        """``nonlocal x; x = v`` on a cell that outlives the call goes to the overlay
        (the epilogue replays it); the call's own cells are written natively."""
        if id(cell) not in self.state.external_cells:
            return False
        self.state.cell_writes[id(cell)] = (cell, value)
        return True

    def delete_deref(self, cell) -> bool:
        return self.store_deref(cell, DELETED)

    def predicate(self, value: Any):
        """``if value:`` on a traced tensor: its blocks predicated when they only
        write tensors (training/predicated.py), else None (its truth is read)."""
        return predicated.branch(self, value) if self.may_predicate() else None

    def may_predicate(self) -> bool:
        """Predication is tried only before a program's first split: a refused
        block restarts the compile, which must not run a piece twice; a replay
        (frontend/splits/) makes the same choices as the interpretation it replays."""
        return self.splitter is None or not self.splitter.cuts

    def store_attr(self, obj: Any, name: str, value: Any) -> bool:
        if self.predicating:
            self.predicating[-1].writes_object(obj)
        if name == "data" and isinstance(obj, TensorProxy):
            assign_data(obj, value)
            return True
        if name == "grad" and type(obj) is dtensor.DTensorProxy:
            self.autograd.set_grad(obj, value)
            return True
        if name == "grad" and (type(obj) is TensorProxy or isinstance(obj, torch.Tensor)):
            self.autograd.set_grad(obj if type(obj) is TensorProxy else self.unannounced(obj, "whose .grad was set"),
                                   value)
            return True
        if type(obj) is TensorProxy and not hasattr(TensorProxy, name):
            what = f"del t.{name}" if value is DELETED else f"t.{name} = ..."
            raise NotTracedError(
                f"thunderlite does not trace Python attributes set on a tensor ({what}) at {self._where()}: the "
                "program's tensors are traced stand-ins, and the attribute would not reach the tensors of a "
                "call. Keep the value in a variable or a dict, or set it outside the jitted function.")
        if type(obj) is types.ModuleType and defined_by_user(obj):
            return self.store_global(obj.__dict__, name, value)
        if id(obj) not in self.state.prov_of:
            return False
        self.state.attr_writes[(id(obj), name)] = (obj, value)
        return True

    def delete_attr(self, obj: Any, name: str) -> bool:
        return self.store_attr(obj, name, DELETED)

    def delete_subscr(self, container: Any, key: Any) -> bool:
        return self.store_subscr(container, key, DELETED)

    def store_subscr(self, container: Any, key: Any, value: Any) -> bool:
        """An item stored into an outside container (one with a path) waits for the
        epilogue; a tensor key is the very object (``optimizer.state[p]`` made by the
        defaultdict's factory for a parameter added since the last call)."""
        if self.predicating:
            self.predicating[-1].writes_object(container)
        if id(container) not in self.state.prov_of or not _is_path_key(key):
            return False
        self.state.attr_writes[(id(container), ("item", key))] = (container, value)
        return True


# methods of builtin containers (and their constructors) that only store values or hand them back: of
# their arguments, only those they hash (a dict's keys) or compare read an object's identity
_STORING = frozenset({"append", "extend", "insert", "appendleft", "extendleft", "copy", "items", "keys", "values",
                      "__setitem__", "get", "pop", "setdefault", "update", "__init__", "__new__"})


def _compared_by_container(what: Any, kind: type, values: tuple) -> tuple:
    """Of the arguments of a method (or constructor) of the builtin container
    type ``kind``, those whose identity it may read: a list stores what
    ``append``/``extend``/``insert`` take; a dict hashes only keys (the first
    argument of ``get``/``pop``/``setdefault``/``__setitem__``, a mapping's
    keys); anything else (``index``, ``remove``, ``count``, a set's methods)
    compares them all. ``__new__`` ignores or stores them, but a frozenset's."""
    name = "__init__" if what is kind else getattr(what, "__name__", None)
    if name not in _STORING or kind is frozenset and name == "__new__":
        return values
    if name == "__new__":
        return ()
    if issubclass(kind, set):
        return values
    if not issubclass(kind, dict):
        return ()
    if name in ("get", "pop", "setdefault", "__setitem__"):
        return values[:1]
    keys: list = []
    for v in values:        # a mapping's keys, or the first item of each pair
        if isinstance(v, dict):
            keys += v.keys()
        elif type(v) in (list, tuple):
            keys += [p[0] if type(p) in (list, tuple) and p else p for p in v]
        else:
            keys.append(v)
    return tuple(keys)


_BUILTIN_CONTAINERS = (list, tuple, dict, collections.OrderedDict, collections.defaultdict, collections.deque, set,
                       frozenset)


# native attribute and item writes reached as callables (``super().__setattr__``, ``dict.__setitem__``)
_SLOT_WRAPPERS = (type(object().__setattr__), type(object.__setattr__))
_WRITE_SLOTS = frozenset({"__setattr__", "__delattr__", "__setitem__", "__delitem__"})
_READ_SLOTS = frozenset({"__getattribute__", "__getitem__"})

# native functions without side effects, run on a split's values when they need them
_PURE_MODULES = frozenset({"math", "cmath"})
# compared by identity (a callable may be unhashable)
_PURE_FUNCTIONS = (range, operator.index, operator.truth, operator.not_)


def is_stateful_iterator(value: Any) -> bool:
    """A generator or built-in iterator: advancing it is a side effect on it."""
    t = type(value)
    return (t is types.GeneratorType or t.__module__ in ("itertools", "builtins", "_collections")) \
        and hasattr(t, "__next__")


def _key(fn):
    try:
        hash(fn)
        return fn
    except TypeError:
        return None


def _is_path_key(key) -> bool:
    """A key a provenance path can hold: an atom (bytes: ``os.environ``'s), a
    tuple of atoms, or a tensor (by identity)."""
    return (is_atom(key) or isinstance(key, torch.Tensor)
            or type(key) is tuple and all(is_atom(k) for k in key))


def _module_slot(obj: Any, name: str) -> str | None:
    if isinstance(obj, torch.nn.Module):
        d = obj.__dict__
        for slot in _MODULE_SLOTS:
            if name in d.get(slot, ()):
                return slot
    return None


def _has_tensor(values) -> bool:
    for v in values:
        if isinstance(v, torch.Tensor):
            return True
        if type(v) in (list, tuple) and _has_tensor(v):
            return True
        if type(v) is dict and _has_tensor(v.values()):
            return True
    return False


def _is_numpy(fn) -> bool:
    mod = getattr(fn, "__module__", None) or type(fn).__module__ or ""
    if mod == "numpy" or mod.startswith("numpy."):
        return True
    owner = getattr(fn, "__self__", None)       # np.random.rand: a RandomState method
    return owner is not None and (type(owner).__module__ or "").startswith("numpy.")


def _numpy_name(fn) -> str:
    return f"numpy.{getattr(fn, '__name__', type(fn).__name__)}"


def _has_proxy(values) -> bool:
    for v in values:
        if type(v) is TensorProxy:
            return True
        if type(v) in (list, tuple) and _has_proxy(v):
            return True
    return False


# Python's clocks: read while tracing, the trace would replay one stale time
_CLOCKS = frozenset(getattr(time, n) for n in (
    "time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
    "process_time_ns", "thread_time", "thread_time_ns") if hasattr(time, n))


_INTERNAL = ("thunderlite.core.", "thunderlite.torch.", "thunderlite.frontend.", "thunderlite.executors.",
             "thunderlite.transforms.", "thunderlite.interpreter.", "thunderlite.distributed.dtensor.")


def _is_thunderlite_internal(fn) -> bool:
    """thunderlite's own machinery runs natively (user code in thunderlite.demo or
    the tests is interpreted like any other)."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    mod = getattr(fn, "__module__", None) or ""
    return (mod + ".").startswith(_INTERNAL)


def _is_torch_builtin(fn) -> bool:
    """A C-implemented torch callable (``torch.sin``, ``torch._C._nn.linear``,
    a ``torch.Tensor`` method): these cannot be interpreted."""
    if isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        self_ = getattr(fn, "__self__", None)
        if isinstance(self_, (torch.Tensor, TensorProxy)):
            return True
        mod = getattr(fn, "__module__", None) or getattr(type(self_), "__module__", "") or ""
        return mod.startswith("torch")
    objclass = getattr(fn, "__objclass__", None)
    return objclass is not None and issubclass(objclass, torch._C.TensorBase)
