"""Cache bookkeeping: key functions per signature, compiled entries, statistics.

``KeyCache`` owns the generated key functions (cache_key.py), one per call
signature. ``CacheInfo`` counts hits and misses and explains misses: it
compares the missed key with the last key of the same signature and names the
argument (or the guarded value) that changed; a value that keeps causing
misses is warned about once.
"""
from __future__ import annotations

import inspect
import sys
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core import codegen
from thunderlite.frontend.caching.keys import (
    _MISSING,
    ALL_DIMS,
    KeyGen,
    alias_pattern,
    count_tensors,
    describe,
    dynamic_shape,
    has_symbolic_numbers,
    make_key_fn,
    walk_signature,
    with_symbolic_numbers,
)
from thunderlite.frontend.source_map import library_kind
from thunderlite.transforms.aliasing.update_aliases import writes_memory

try:        # torch's C++ guards (dynamo's): every torch this package supports has them
    from torch._C._dynamo.guards import GlobalStateGuard as _GlobalStateGuard
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
    TORCH_GUARDS: tuple | None = (_TensorGuards, _GlobalStateGuard)
except ImportError:
    TORCH_GUARDS = None

REPEATED_MISSES_TO_WARN = 3
# key functions of a signature kept after it changed (dims made symbolic, floats made inputs): their entries stay found
MAX_OLDER_KEY_FNS = 4


class CompiledEntry:
    """One compiled program: its entry function and the traces that made it."""
    __slots__ = ("fn", "traces", "backward_traces", "prologue_traces", "stage_ms", "total_ms", "guards",
                 "roots", "opaque", "alias_guard", "inputs", "sym_guards", "input_names", "gradients",
                 "calls", "key", "lowering", "tier", "path_shapes", "learned", "raises", "predication",
                 "__weakref__")

    def __init__(self, fn: Callable, traces: list, backward_traces: list, prologue_traces: list,
                 stage_ms: dict, total_ms: float, guards: list):
        self.fn = fn
        self.traces = traces
        self.backward_traces = backward_traces
        self.prologue_traces = prologue_traces
        self.stage_ms = stage_ms
        self.total_ms = total_ms
        self.guards = guards
        self.alias_guard = None     # alias_guard.AliasGuard: storage sharing / write verdict checks
        self.inputs: list = []      # the provenance of each trace input (None: a constant)
        self.sym_guards: list = []  # core.symint.SymGuard: what the trace assumed of symbolic sizes
        self.input_names: list = []  # the trace name of each of ``inputs``
        self.gradients: dict = {}    # a whole step's gradients: value name -> its leaf (api.last_gradients)
        self.calls = 1               # calls served, the one that compiled it included
        self.key: tuple | None = None   # its key in the function's cache (None: not stored)
        self.lowering = None         # compile.Lowering: how its computation was made from the trace
        self.tier = None             # tiers.Tier: which tier it runs, and since when (None: tiering off)
        self.path_shapes: list = []  # (path, shape) of each tensor read through a path (caching/automatic.py)
        self.learned: str | None = None  # what tracing it made symbolic (a growing state), for the miss reason
        self.raises: BaseException | None = None  # the program's own exception, raised after its writes ran
        self.predication: list[str] = []  # blocks traced predicated, and those reading their flag (why)

    def run_first(self, args: tuple, kwargs: dict):
        """Run the call this entry was compiled for (a split program's ran while
        it was compiled: frontend/splits/tree.py)."""
        return self.fn(args, kwargs)


class KeyCache:
    """signature -> generated key function. ``symbolic_sizes``: every size of a
    tensor argument is symbolic; otherwise ``mark_dynamic`` makes the dims that
    changed between two compiles symbolic (automatic dynamic shapes)."""

    def __init__(self, symbolic_numbers: bool = False, names: list[str] | None = None,
                 symbolic_sizes: bool = False):
        self.symbolic_numbers = symbolic_numbers
        self.symbolic_sizes = symbolic_sizes
        self.names = names
        self._by_sig: dict[tuple, Callable] = {}
        self._sig_id: dict[tuple, int] = {}
        self._sig_of: dict[int, tuple] = {}
        self._fn_by_sig_id: list[Callable] = []
        self._dynamic: dict[tuple, dict] = {}     # signature -> {tensor leaf index: dims}
        self._static: set[tuple] = set()          # signatures symbolic sizes failed for
        self._numbers: dict[tuple, frozenset] = {}  # signature -> float leaves kept symbolic (automatic)
        self._static_numbers: set[tuple] = set()  # signatures symbolic floats failed for
        self._older: dict[tuple, list] = {}       # signature -> the key functions it had before, newest first

    @staticmethod
    def no_key(args, kwargs):
        return None

    def key_fn_for(self, args: tuple, kwargs: dict) -> Callable:
        sig = describe(args, kwargs, self.symbolic_numbers)
        fn = self._by_sig.get(sig)
        return fn if fn is not None else self._make(sig)

    def _make(self, sig: tuple) -> Callable:
        sig_id = self._sig_id.setdefault(sig, len(self._sig_id))
        fn = make_key_fn(self.traced_signature(sig), sig_id, self.names, self.dynamic_of(sig))
        old = self._by_sig.get(sig)
        if old is not None:
            self._older[sig] = [old, *self._older.get(sig, ())][:MAX_OLDER_KEY_FNS]
        self._by_sig[sig] = fn
        if sig_id == len(self._fn_by_sig_id):
            self._fn_by_sig_id.append(fn)
        else:
            self._fn_by_sig_id[sig_id] = fn
        self._sig_of[id(fn)] = sig
        return fn

    def dynamic_of(self, sig: tuple) -> dict:
        """Tensor leaf index -> its symbolic dims, for this signature."""
        if self.symbolic_sizes and sig not in self._static:
            return {i: ALL_DIMS for i in range(count_tensors(sig))}
        return self._dynamic.get(sig, {})

    def traced_signature(self, sig: tuple) -> tuple:
        """``sig`` as traced: the floats that kept changing are symbolic (kind S)."""
        numbers = self._numbers.get(sig)
        return with_symbolic_numbers(sig, numbers) if numbers else sig

    def changed_numbers(self, key_fn: Callable, prev: tuple, key: tuple) -> frozenset[int]:
        """The float leaves whose value differs between two keys of one signature."""
        if self._sig_of[id(key_fn)] in self._static_numbers or len(prev) != len(key):
            return frozenset()
        return frozenset(leaf for part, leaf in key_fn.number_parts.items()
                         if type(prev[part + 1]) is float and type(key[part + 1]) is float
                         and prev[part + 1] != key[part + 1])

    def describe_numbers(self, key_fn: Callable, leaves: frozenset[int]) -> list[str]:
        return [key_fn.labels[part] for part, leaf in key_fn.number_parts.items() if leaf in leaves]

    def mark_numbers(self, key_fn: Callable, leaves: frozenset[int]) -> Callable:
        """Keep the float leaves ``leaves`` symbolic; returns the new key function."""
        sig = self._sig_of[id(key_fn)]
        self._numbers[sig] = self._numbers.get(sig, frozenset()) | leaves
        return self._make(sig)

    def make_numbers_static(self, key_fn: Callable) -> Callable:
        """Symbolic floats failed for this signature: key on their values again."""
        sig = self._sig_of[id(key_fn)]
        self._numbers.pop(sig, None)
        self._static_numbers.add(sig)
        return self._make(sig)

    def changed_dims(self, key_fn: Callable, prev: tuple, key: tuple) -> dict:
        """Tensor leaf index -> dims whose size differs between two keys of one
        signature (same rank only)."""
        out: dict = {}
        if self._sig_of[id(key_fn)] in self._static or len(prev) != len(key):
            return out
        for part, leaf in key_fn.shape_parts.items():
            a, b = prev[part + 1], key[part + 1]
            if a != b and len(a) == len(b):
                out[leaf] = {i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y}
        return out

    def make_static(self, key_fn: Callable) -> Callable:
        """Symbolic sizes failed for this signature: key on every size again."""
        sig = self._sig_of[id(key_fn)]
        self._dynamic[sig] = {}
        self._static.add(sig)
        return self._make(sig)

    def describe_dims(self, key_fn: Callable, dims: dict) -> str:
        """``x.shape[1] is`` / ``x.shape[0] and y.shape[1] are``: for messages."""
        label = {leaf: key_fn.labels[part] for part, leaf in key_fn.shape_parts.items()}
        names = [f"{label[leaf]}[{d}]" for leaf, ds in sorted(dims.items()) for d in sorted(ds)]
        return f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'}"

    def mark_dynamic(self, key_fn: Callable, dims: dict) -> Callable:
        """Make ``dims`` (leaf index -> dims) symbolic; returns the new key function."""
        sig = self._sig_of[id(key_fn)]
        spec = self._dynamic.setdefault(sig, {})
        for leaf, ds in dims.items():
            spec[leaf] = frozenset(spec.get(leaf, frozenset()) | ds)
        return self._make(sig)

    def older_key_fns(self, key_fn: Callable) -> list[Callable]:
        """The key functions ``key_fn``'s signature had before (newest first):
        the entries stored under their keys hold for exactly those keys (an
        entry compiled for static sizes before a dim became symbolic: the
        first prompt's prefill, found again by the next request)."""
        return self._older.get(self._sig_of[id(key_fn)], [])

    def signature_of(self, key_fn: Callable) -> tuple:
        return self._sig_of[id(key_fn)]

    def labels_of(self, key: tuple) -> list[str]:
        return self._fn_by_sig_id[key[0]].labels

    def fast_guard(self, key_fn: Callable) -> FastGuard | None:
        """The ``FastGuard`` of ``key_fn``'s signature (made on first use)."""
        guard = getattr(key_fn, "fast_guard", _MISSING)
        if guard is _MISSING:
            sig = self._sig_of[id(key_fn)]
            guard = key_fn.fast_guard = make_fast_guard(self.traced_signature(sig), self.dynamic_of(sig))
        return guard


class FastGuard:
    """One signature's fast guard; ``arm(args, kwargs, entry, sharing)`` returns
    ``fast(args, kwargs)``: the entry's own code behind checks that the call is
    exactly like this one, returning ``MISS`` otherwise, without building a key.

    Tensors are checked by torch's own ``TensorGuards`` (type, dtype, device,
    requires_grad, sizes, dispatch keys; in C++; one tensor passed twice is
    refused), the global state by its ``GlobalStateGuard`` (grad mode,
    autocast, default dtype and more), values and objects as the key checks
    them. Stricter than the key: a stricter check only sends a call to the key
    path. Which tensor arguments share storage is checked only with
    ``sharing``: a program that writes no memory computes the same whatever
    its inputs share (``reads_only``). The entry's body is inlined (one Python
    call less), run with the entry's globals plus the guard's values."""

    def __init__(self, setup: Callable, checks: list[str], consts: dict):
        self.setup = setup
        self.checks = checks
        self.consts = consts
        # entry -> the code of its fast function: calls alternating between two entries (a decode
        # loop's prefill and step) re-arm at each switch, and a model's entry is too long a source for
        # codegen's cache (compiling it again cost milliseconds per switch)
        self._codes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def arm(self, args: tuple, kwargs: dict, entry: Callable, sharing: bool) -> Callable:
        globs = {**entry.__globals__, **self.consts, **self.setup(args, kwargs), "_sharing": sharing}
        tensor_guard = getattr(entry, "__thunderlite_tensor_guard__", None)
        if tensor_guard is not None:        # the tensors read through paths, checked in one C++ call
            globs["_tensor_meta"] = tensor_guard[2]
        code = self._codes.get(entry)
        if code is not None:
            return types.FunctionType(code, globs, "fast")
        head, _, body = entry.__thunderlite_source__.partition("\n")
        if tensor_guard is not None:
            lines, check_line, _ = tensor_guard
            body = _with_lines_replaced(body, set(lines), check_line)
        src = "\n".join(["def fast(args, kwargs):", *self.checks, body])
        fast = codegen.compile_source(src, "fast", globs)
        self._codes[entry] = fast.__code__
        return fast


def _with_lines_replaced(body: str, lines: set[str], line: str) -> str:
    """``body`` without ``lines``, and ``line`` where the last of them was
    (``body`` itself unless every one of them is there)."""
    out = []
    left = set(lines)
    for text in body.split("\n"):
        if text in left:
            left.discard(text)
            if not left:
                out.append(line)
            continue
        out.append(text)
    return body if left else "\n".join(out)


def make_fast_guard(sig: tuple, dynamic: dict | None = None) -> FastGuard | None:
    """The ``FastGuard`` of a signature, or None where the key cannot be
    checked this way: numbers kept symbolic, a DTensor, or a torch without
    these guards. ``dynamic``: the signature's symbolic dims (tensor leaf ->
    dims), checked as the key has them (0, 1 or "2 or more")."""
    if TORCH_GUARDS is None or has_symbolic_numbers(sig):
        return None
    g = walk_signature(sig, None, KeyGen(dynamic=dynamic, fail="_MISS"))
    if any(kind == "DT" for _, kind in g.values):
        return None             # a DTensor's key is its spec, not its identity
    tensors = [v for v, _ in g.tensors]
    made = []
    checks = []
    for v, kind in g.values:
        made.append(f"'_c{v}': {v if kind == 'V' else f'id({v})'}")
        checks.append(f"{v} != _c{v}" if kind == "V" else f"id({v}) != _c{v}")
    symbolic = {i: dims for i, dims in (dynamic or {}).items() if dims}
    for i, dims in symbolic.items():      # sizes 0, 1 or "2 or more", as the key has them
        v, d = tensors[i], f"_dims{i}"
        g.consts[d] = dims
        made.append(f"'_s{v}': _dynamic_shape({v}.shape, {d})")
        checks.append(f"_dynamic_shape({v}.shape, {d}) != _s{v}")
    if tensors:
        sizes = ", ".join(f"_free({t}.shape, _dims{i})" if i in symbolic else f"[*{t}.shape]"
                          for i, t in enumerate(tensors))
        strides = ", ".join(f"[None] * {t}.dim()" for t in tensors)
        made.append(f"'_tensors': _TensorGuards({', '.join(tensors)}, dynamic_dims_sizes=[{sizes}], "
                    f"dynamic_dims_strides=[{strides}]).check")
        checks.append(f"not _tensors({', '.join(tensors)})")
    if len(tensors) > 1:
        share = g.parts[-1]
        made.append(f"'_share': {share}")
        checks.append(f"(_sharing and ({share}) != _share)")
    made.append("'_state': _GlobalStateGuard().check")
    checks.append("not _state()")
    setup_src = "\n".join(["def setup(args, kwargs):", *(f"  {r}" for r in g.reads),
                           f"  return {{{', '.join(made)}}}"]) + "\n"
    consts = dict(g.consts, _MISSING=_MISSING, _alias_pattern=alias_pattern, _dynamic_shape=dynamic_shape,
                  _free=_free_sizes)
    setup = codegen.compile_source(setup_src, "setup", dict(consts, _TensorGuards=TORCH_GUARDS[0],
                                                           _GlobalStateGuard=TORCH_GUARDS[1],
                                                           __builtins__=__builtins__))
    # TensorGuards checks a tensor's exact type itself; an empty kwargs is falsy
    lines = [line.replace("len(kwargs) != 0", "kwargs") for line in g.lines if line not in g.tensor_type_checks]
    return FastGuard(setup, [*lines, f"  if {' or '.join(checks)}: return _MISS"], consts)


def _free_sizes(shape: tuple, dims) -> list:
    """``shape`` for ``TensorGuards``: None (any size) where a symbolic dim is 2
    or more (a separate check keeps it so)."""
    return [None if n >= 2 and (dims is ALL_DIMS or i in dims) else n for i, n in enumerate(shape)]


def reads_only(entry: CompiledEntry) -> bool:
    """Whether ``entry``'s program writes no tensor memory: no write in the
    traced program (decompositions included: batch_norm's running statistics),
    no backward, no written inputs (``alias_guard``)."""
    return not (entry.backward_traces or entry.alias_guard is not None or writes_memory(entry.traces[0]))


def parameter_names(fn: Callable) -> list[str] | None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


class CacheInfo:
    """What ``thunderlite.cache_info`` reports."""

    def __init__(self):
        self.hits = 0
        self.misses = 0
        self.entries = 0
        self.eager_calls = 0        # misses past ``max_entries``, run eagerly
        self.last_miss_reason = ""
        self._last_key_by_sig: dict[int, tuple] = {}
        self._miss_counts: dict[str, int] = {}
        self._causes: dict[str, tuple[str, str]] = {}   # what -> (the last reason, its hint)
        self._warned: set[str] = set()
        self._full_warned = False

    def as_dict(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "entries": self.entries,
                "eager_calls": self.eager_calls, "last_miss_reason": self.last_miss_reason}

    def cache_full(self, max_entries: int) -> None:
        """A miss past ``max_entries``: it runs eagerly. Warned once, naming what
        caused most recompiles and how to keep it from recompiling."""
        self.eager_calls += 1
        self.last_miss_reason += f"; ran eagerly: the cache holds its max_entries={max_entries} entries"
        if self._full_warned:
            return
        self._full_warned = True
        what = max(self._miss_counts, key=self._miss_counts.get, default=None)
        reason, hint = self._causes.get(what, ("", ""))
        cause = (f" Most recompiles ({self._miss_counts[what]}) were because {reason}; {hint}."
                 if what is not None else "")
        warnings.warn(f"thunderlite: this jitted callable has compiled its max_entries={max_entries} entries; "
                      f"calls that match none of them now run eagerly (eager's answer, not compiled).{cause} "
                      "Or raise jit(..., max_entries=).", stacklevel=user_stacklevel())

    def last_key(self, key: tuple) -> tuple | None:
        """The key of the last miss of ``key``'s signature."""
        return self._last_key_by_sig.get(key[0])

    def note_key(self, key: tuple) -> None:
        """The key function of a signature changed: ``key`` is its last key now."""
        self._last_key_by_sig[key[0]] = key

    def forget_keys(self) -> None:
        """Key functions were regenerated: old keys are not comparable any more."""
        self._last_key_by_sig.clear()

    def record_miss(self, keys: KeyCache, key: tuple, stale_entry, args: tuple, kwargs: dict) -> None:
        self.misses += 1
        if self.misses == 1:
            self.last_miss_reason = "first call"
            self._last_key_by_sig[key[0]] = key
            return
        prev = self._last_key_by_sig.get(key[0])
        self._last_key_by_sig[key[0]] = key
        if stale_entry is not None:
            what, reason = _failed_guard(stale_entry, args, kwargs)
            hint = _hint(what, None, None) if what.endswith(".shape") or what == IDENTITY_USED else (
                "if it changes on every call, pass it to the function as an argument (a tensor for numbers)")
        elif prev is None or len(prev) != len(key):
            what, reason = "signature", "new argument structure or types (a new signature)"
            hint = ("every argument structure (container lengths, dict keys) and argument type compiles "
                    "its own entry: call it with the same structure and types each time")
        else:
            what, reason, old, new = _key_difference(keys.labels_of(key), prev, key)
            hint = _hint(what, old, new)
        self.last_miss_reason = reason
        self._causes[what] = (reason, hint)
        n = self._miss_counts[what] = self._miss_counts.get(what, 0) + 1
        if n >= REPEATED_MISSES_TO_WARN and what not in self._warned:
            self._warned.add(what)
            warnings.warn(f"thunderlite recompiled {n} times because {reason}; {hint}",
                          stacklevel=user_stacklevel())


IDENTITY_USED = "the identity of an object"


def _hint(what: str, old: Any, new: Any) -> str:
    """What fixes a miss of this kind (the key element ``what`` went from ``old`` to ``new``)."""
    if what == IDENTITY_USED:
        return ("an object the program only reads (its attributes and items) is keyed by its type, but one "
                "whose identity the program uses (`is` against another object of its type, `id()`, hashing, a "
                "dict keyed by it, a native function handed it) compiles an entry per object: pass the same "
                "object on every call, or compare a field of it instead of the object itself")
    if what.startswith("the object passed as"):      # keyed by identity: its id is an int, but no number
        return ("modules, functions and objects of classes not written in Python are keyed by identity, so each "
                "new one compiles its own entries: pass the same object on every call")
    if what.endswith((".shape", ".dtype", ".device", ".requires_grad")):
        return ("tensor shapes, dtypes and devices are part of the key: with jit(..., dynamic=False) each "
                "new shape compiles its own entry; leave dynamic=None (the default) to make sizes that "
                "change symbolic, or pad or bucket inputs to a few shapes")
    if type(old) is float or type(new) is float:
        return ("if this number changes on every call, pass it as a tensor, or leave jit(..., dynamic=None) "
                "(the default) so that a float that keeps changing becomes a trace input, or use "
                "jit(..., cache='symbolic values') so that floats are trace inputs from the first call")
    if type(old) in (int, bool, complex) and type(new) in (int, bool, complex):
        return ("if this number changes on every call, pass it as a tensor, or use "
                "jit(..., cache='symbolic values') so that ints become symbols of the trace")
    return "each value of it compiles its own entry"


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the user's call of the
    jitted function: past thunderlite's and torch's own frames (``nn.Module.__call__``)."""
    level, f = 1, sys._getframe(1)
    while f is not None and library_kind(f.f_code.co_filename) is not None:
        f = f.f_back
        level += 1
    return level


def _key_difference(labels: list[str] | None, prev: tuple, key: tuple) -> tuple[str, str, Any, Any]:
    diffs = [i for i, (a, b) in enumerate(zip(prev[1:], key[1:], strict=True)) if a != b or type(a) is not type(b)]
    if not diffs:
        return "unknown", "the cache key changed", None, None
    i = diffs[0]
    label = labels[i] if labels is not None and i < len(labels) else f"key element {i}"
    old, new = prev[i + 1], key[i + 1]
    if label.startswith("the object passed as"):     # its id: a number, but not one the program computes with
        return label, f"{label} is another object (keyed by identity)", old, new
    return label, f"{label} changed from {old!r} to {new!r}", old, new


def _failed_guard(entry: CompiledEntry, args: tuple, kwargs: dict) -> tuple[str, str]:
    """Which of the entry's guards rejected the call (evaluated one by one; slow path only)."""
    for g in entry.guards:
        try:
            if g.kind == "distinct":
                objs = [read_path(p, args, kwargs) for p in g.value]
                if len({id(o) for o in objs}) != len(objs):
                    names = ", ".join(p.describe() for p in g.value)
                    return g.prov.describe(), (f"two of {names} are one object now (they were distinct when "
                                               "compiled, and the program writes one of them)")
                continue
            if g.kind == "absent":
                if hasattr(read_path(g.prov.parent, args, kwargs), g.prov.key):
                    return g.prov.describe(), f"{g.prov.describe()} did not exist when compiled and does now"
                continue
            now = read_path(g.prov, args, kwargs)
        except Exception:  # noqa: BLE001 - the path itself no longer exists: that is the reason
            return g.prov.describe(), f"{g.prov.describe()} can no longer be read"
        if g.kind == "same":
            if now is not read_path(g.value, args, kwargs):
                return g.prov.describe(), (f"{g.prov.describe()} and {g.value.describe()} were the same object "
                                           "when compiled and are not now")
            continue
        same = now is g.value if g.kind == "is" else _same_value(g, now)
        if not same and g.kind == "is" and g.why is not None:
            return IDENTITY_USED, (f"{g.prov.describe()} is another {type(g.value).__name__} object than when "
                                   f"compiled, and the program uses its identity: it was {g.why}")
        if not same and g.kind == "type":
            return g.prov.describe(), (f"{g.prov.describe()} changed type from {g.value.__qualname__} to "
                                       f"{type(now).__qualname__}")
        if not same:
            shown = "a different object" if g.kind == "is" else _short(
                now if g.kind == "eq" else tuple(now) if g.kind == "keys" else
                type(now).__name__ if g.kind == "type_len" else len(now))
            return g.prov.describe(), f"{g.prov.describe()} changed from {_short(g.value)} to {shown}"
    if entry.sym_guards:
        why = _failed_size_guard(entry, args, kwargs)
        if why is not None:
            return "symbolic size", why
    if entry.alias_guard is not None:
        try:
            values = [read_path(p, args, kwargs) if p is not None else c for p, c in entry.inputs]
            why = entry.alias_guard.explain(values)
        except Exception:  # noqa: BLE001 - a path that no longer reads: the metadata guard said so
            why = None
        if why is not None:
            return "storage sharing", why
    for prov, shape, dims in entry.path_shapes:
        try:
            now = read_path(prov, args, kwargs)
        except Exception:  # noqa: BLE001 - a path that no longer reads
            return prov.describe(), f"{prov.describe()} can no longer be read"
        if isinstance(now, torch.Tensor) and (now.dim() != len(shape) or
                                              dynamic_shape(now.shape, dims or ()) != dynamic_shape(shape, dims or ())):
            return f"{prov.describe()}.shape", f"{prov.describe()}.shape changed from {shape} to {tuple(now.shape)}"
    return "tensor metadata", "the metadata of a tensor read from a module, global or closure changed"


def _failed_size_guard(entry: CompiledEntry, args: tuple, kwargs: dict) -> str | None:
    """The first size guard (core/symint.py) the call breaks, with the sizes it read."""
    paths = {name: p for (p, _), name in zip(entry.inputs, entry.input_names, strict=True) if p is not None}
    for g in entry.sym_guards:
        names = sorted(g.atoms())
        try:
            values = {n: read_path(paths[n], args, kwargs) for n in names}
        except Exception:  # noqa: BLE001 - a path that no longer reads: the key said so
            return None
        if not g.holds(values):
            seen = ", ".join(f"{n} = {paths[n].describe()} = {values[n]}" for n in names)
            return f"the size guard {g.python()} does not hold ({seen})"
    return None


def _same_value(g, now: Any) -> bool:
    if g.kind == "type":
        return type(now) is g.value
    if g.kind == "len":
        return len(now) == g.value
    if g.kind == "type_len":
        return type(now) is g.value[0] and len(now) == g.value[1]
    if g.kind == "keys":
        return tuple(now) == g.value
    return type(now) is type(g.value) and now == g.value


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) < 60 else r[:57] + "..."


def read_path(prov, args: tuple, kwargs: dict) -> Any:
    """The value ``prov`` reads for this call (slow path only: the entry reads its paths in generated code)."""
    k = prov.kind
    if k == "arg":
        return args[prov.key]
    if k == "kwarg":
        return kwargs[prov.key]
    if k == "global":
        return prov.root[prov.key]
    if k == "cell":
        return prov.root.cell_contents
    if k == "object":
        return prov.root
    base = read_path(prov.parent, args, kwargs)
    if k == "attr":
        return getattr(base, prov.module_slot)[prov.key] if prov.module_slot else getattr(base, prov.key)
    return base[prov.key]
