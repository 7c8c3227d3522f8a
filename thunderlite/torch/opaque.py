"""The opaque fallback: a torch op with no decomposition runs as one torch call.

``opaque_symbol_for(fn)`` gives a callable that records ``fn`` into the trace.
Output metadata comes from running ``fn`` on meta tensors built from the
proxies (so a model never fails just because one op lacks a decomposition).
The symbols are tagged ``Tag.OPAQUE``: fusion executors skip them and
``examine`` lists them.

Aliasing is never guessed. Which tensor outputs may share storage with which
tensor arguments is read per call: the meta run's own storage sharing (the C++
code that decides it runs on meta tensors too, so ``detach``, ``.data``,
``as_strided``, ``view_as_real`` and ops whose schema under-states it, like
``unsafe_split``, are seen) joined with the alias annotations of the ATen op
the callable binds (``Tensor(a)``: ``contiguous``/``reshape`` alias or not
depending on strides the meta run cannot know). Each pattern gets its own leaf
symbol with a view rule (core/aliasing.py), so passes read it like any fact.

Mutation is never silent. The meta run reveals which tensor arguments ``fn``
writes (their version counters move, which covers ``add_``, ``out=``,
``inplace=True`` and custom ops alike), joined with those the ATen schema
marks written (a meta kernel may bump none: ``_fused_adamw_``); such a call is recorded functionally
(a leaf that runs ``fn`` on clones of the written arguments and returns them)
followed by ``prims.copy_`` into each written argument, under a composite
tagged ``Tag.INPLACE``.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from thunderlite.core import prims, pytree
from thunderlite.core.aliasing import aten_name, callable_aliases, register_view_rule, torch_overloads
from thunderlite.core.prims import check
from thunderlite.core.proxies import DataDependentError, TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.core.tracectx import made_once, tables_lock
from thunderlite.torch.names import public_name

_cache: dict = {}                       # fn -> OpaqueOp
_names: set[str] = set()
_RANDOM_NAMES = ("rand", "randn", "randint", "randperm", "bernoulli", "multinomial", "normal", "uniform",
                 "dropout", "poisson", "exponential", "geometric", "cauchy", "log_normal", "random_",
                 "rrelu", "feature_alpha_dropout", "alpha_dropout")


class OpaqueDataDependentError(DataDependentError):
    """The op's output shape or value depends on tensor data."""


def _unique_name(fn) -> str:
    base = getattr(fn, "__name__", None) or type(fn).__name__
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in base).strip("_") or "op"
    with tables_lock:
        name, i = base, 1
        while name in _names:
            name = f"{base}_{i}"
            i += 1
        _names.add(name)
    return name


def _is_random(fn) -> bool:
    name = getattr(fn, "__name__", "") or ""
    return any(r in name for r in _RANDOM_NAMES)


def _may_write_unseen(fn) -> bool:
    """Whether a call of ``fn`` could write memory although its meta run wrote
    nothing: its ATen op has a mutable argument (``Tensor(a!)``) it can be
    given positionally, or ``fn`` binds no ATen op whose schema says (nothing
    then rules a write out). ``out=`` alone does not count: a call given it
    writes it in the meta run too. Such a call is never dead code."""
    name = aten_name(fn)
    overloads = torch_overloads(name) if name else None
    if overloads is None:
        return True
    return any(a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only
               for o in overloads for a in o._schema.arguments)


def _to_meta(x):
    if type(x) is TensorProxy:
        return torch.empty(x.shape, dtype=x.dtype, device="meta")
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x


def _meta_args(args, kwargs):
    margs = pytree.tree_map(_to_meta, args)
    mkwargs = pytree.tree_map(_to_meta, kwargs)
    if "device" in mkwargs and mkwargs["device"] is not None:
        mkwargs["device"] = "meta"
    return margs, mkwargs


def _run_meta(fn, args, kwargs):
    """Run ``fn`` on meta tensors: (output, [(arg proxy, meta tensor)] pairs)."""
    margs, mkwargs = _meta_args(args, kwargs)
    pairs = [(p, m) for p, m in zip(pytree.leaves((args, kwargs)), pytree.leaves((margs, mkwargs)), strict=True)
             if type(p) is TensorProxy]
    versions = [m._version for _, m in pairs]
    try:
        with torch.no_grad():
            out = fn(*margs, **mkwargs)
    except (NotImplementedError, RuntimeError) as e:
        msg = str(e)
        if "meta" in msg.lower() or "data-dependent" in msg.lower() or "item()" in msg:
            # torch's own message talks about meta kernels and internal config flags,
            # nothing a user of thunderlite can act on: it is not chained
            raise OpaqueDataDependentError(
                f"{_fn_name(fn)} cannot be traced: thunderlite has no decomposition for it and its "
                "output shape cannot be computed without the tensor's values (it depends on tensor "
                "data). Call it outside the jitted function and pass its result in, or use an "
                "alternative with a fixed output shape.") from None
        raise
    written = {i for i, ((_, m), v) in enumerate(zip(pairs, versions, strict=True)) if m._version != v}
    return out, pairs, sorted(written | _declared_writes(fn, args, kwargs, pairs))


def _declared_writes(fn, args, kwargs, pairs) -> set[int]:
    """Indices (into ``pairs``) of the tensors the ATen schema says a call
    writes (``Tensor(a!)``, ``Tensor(a!)[]``): some meta kernels write nothing
    (``_fused_adamw_`` leaves its lists' version counters alone), and a write
    the trace does not know of is reordered past the reads it must follow."""
    name = aten_name(fn)
    overloads = torch_overloads(name) if name else None
    if not overloads:
        return set()
    index = {id(p): i for i, (p, _) in enumerate(pairs)}
    found: set[int] = set()
    for o in overloads:
        for pos, a in enumerate(o._schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            if a.name in kwargs or (a.name == "self" and "input" in kwargs):
                value = kwargs.get(a.name, kwargs.get("input"))
            else:
                value = args[pos] if not a.kwarg_only and pos < len(args) else None
            found.update(index[id(t)] for t in pytree.leaves(value) if id(t) in index)
    return found


Pattern = tuple   # per tensor output: the sorted indices of the tensor arguments it may alias


def _alias_pattern(fn, args, kwargs, out, pairs) -> Pattern:
    """Which tensor arguments each tensor output may share storage with: the
    meta run's storage sharing joined with the ATen schema's annotations."""
    storages = [_storage(m) for _, m in pairs]
    facts = callable_aliases(fn)
    declared: set[int] = set()
    if facts is not None and not facts.fresh:
        names = {p.name for p in facts.bases_of(args, kwargs)}
        declared = {j for j, (p, _) in enumerate(pairs) if p.name in names}
    pattern = []
    for o in pytree.leaves(out):
        if isinstance(o, torch.Tensor):
            s = _storage(o)
            shared = {j for j, t in enumerate(storages) if s is not None and t == s}
            pattern.append(tuple(sorted(shared | declared)))
    return tuple(pattern) if any(pattern) else ()     # () : every output is fresh


def _hides_views(out, pattern: Pattern) -> bool:
    """Outputs share storage with arguments, but none is a view autograd knows
    of (``unsafe_split``): eager's checks for writes into a leaf's view skip them."""
    tensors = [o for o in pytree.leaves(out) if isinstance(o, torch.Tensor)]
    return any(pattern) and len(tensors) == len(pattern) and not any(
        o._is_view() for o, js in zip(tensors, pattern, strict=True) if js)


def _storage(t: torch.Tensor):
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):   # sparse and other storage-less layouts
        return None


def _pattern_rule(pattern: Pattern, skip_outs: int = 0):
    """The view rule of a symbol whose tensor outputs alias per ``pattern``
    (``skip_outs``: trailing tensor outputs not covered, fresh)."""
    def rule(bsym) -> list:
        if not any(pattern):
            return []
        outs, ins = bsym.tensor_outs(), bsym.tensor_args()
        if skip_outs:
            outs = outs[:len(outs) - skip_outs]
        if len(outs) != len(pattern):          # unexpected structure: may alias everything
            return [(o, i) for o in outs for i in ins]
        return [(o, ins[j]) for o, js in zip(outs, pattern, strict=True) for j in js]
    return rule


def _fn_name(fn) -> str:
    return public_name(fn)


def _out_device(args, kwargs) -> torch.device:
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev)
    for x in pytree.leaves((args, kwargs)):
        if type(x) is TensorProxy:
            return x.device
    return torch.device("cpu")


def _grad_flags(fn, args, kwargs) -> list[bool] | None:
    """Which tensor outputs of ``fn`` require grad, asked of PyTorch: a meta run
    with autograd on whose inputs require grad as their proxies do (non-leaf
    clones, so in-place ops are allowed). None when nothing requires grad or
    the op cannot run that way (the caller then falls back to "inexact outputs
    of an op reading a tensor that requires grad")."""
    if not any(type(x) is TensorProxy and x.requires_grad for x in pytree.leaves((args, kwargs))):
        return None

    def conv(x):
        if type(x) is TensorProxy and x.requires_grad and (x.dtype.is_floating_point or x.dtype.is_complex):
            return torch.empty(x.shape, dtype=x.dtype, device="meta", requires_grad=True).clone()
        return _to_meta(x)
    try:
        with torch.enable_grad():
            margs, mkwargs = pytree.tree_map(conv, args), pytree.tree_map(conv, kwargs)
            if "device" in mkwargs and mkwargs["device"] is not None:
                mkwargs["device"] = "meta"
            out = fn(*margs, **mkwargs)
    except Exception:  # noqa: BLE001 - no autograd on meta for this op: use the heuristic
        return None
    return [o.requires_grad for o in pytree.leaves(out) if isinstance(o, torch.Tensor)]


def _to_proxies(out, device, requires_grad: bool, flags: list[bool] | None = None):
    """Proxies for a meta run's output; ``flags``: each tensor output's
    requires_grad (``_grad_flags``), else the ``requires_grad`` heuristic."""
    flags_it = iter(flags) if flags is not None and \
        len(flags) == sum(isinstance(o, torch.Tensor) for o in pytree.leaves(out)) else None

    def conv(x):
        if isinstance(x, torch.Tensor):
            inexact = x.dtype.is_floating_point or x.dtype.is_complex
            rg = next(flags_it) if flags_it is not None else requires_grad
            return TensorProxy(shape=tuple(x.shape), dtype=x.dtype, device=device, requires_grad=rg and inexact)
        if isinstance(x, (torch.dtype, torch.device, torch.Size, str, type(None), bool, int, float, complex)):
            return x
        raise OpaqueDataDependentError(f"an op with no thunderlite decomposition returned a "
                                       f"{type(x).__name__}, which a trace cannot represent")
    if isinstance(out, tuple) and type(out) is not tuple:   # torch.return_types structseqs stay named
        return type(out)(pytree.tree_map(conv, tuple(out)))
    return pytree.tree_map(conv, out)


class OpaqueOp:
    """Records calls of one torch callable. A plain call records the leaf
    symbol; a call that writes into its arguments records the functional leaf
    (per set of written argument positions) and ``copy_`` back."""

    def __init__(self, fn: Callable):
        self.fn = fn
        name = _unique_name(fn)
        tags = {Tag.OPAQUE} | ({Tag.RANDOM, Tag.DONT_DCE} if _is_random(fn) else set())
        if _may_write_unseen(fn):
            tags.add(Tag.DONT_DCE)
        self._name = name
        self._tags = tags
        self._plain: dict[tuple, Symbol] = {}
        self._functional: dict[tuple, Symbol] = {}
        self._inplace: dict[tuple, Symbol] = {}

    def __repr__(self):
        return f"<opaque op {self.symbol.id} for {_fn_name(self.fn)}>"

    @property
    def symbol(self) -> Symbol:
        """The leaf of the first call pattern recorded (fresh outputs if none yet)."""
        with tables_lock:
            return next(iter(self._plain.values())) if self._plain else self._plain_symbol(())

    def _plain_symbol(self, pattern: Pattern, hidden: bool = False) -> Symbol:
        """The leaf recording a call whose outputs alias the arguments per
        ``pattern`` (one symbol per pattern, each with its own meta function so
        executors' symbols for it share its rule)."""
        return made_once(self._plain, (pattern, hidden), lambda: self._new_plain_symbol(pattern, hidden))

    def _new_plain_symbol(self, pattern: Pattern, hidden: bool) -> Symbol:
        fn = self.fn

        def meta(*args, **kwargs):
            out, _, _ = _run_meta(fn, args, kwargs)
            rg = any(type(x) is TensorProxy and x.requires_grad for x in pytree.leaves((args, kwargs)))
            return _to_proxies(out, _out_device(args, kwargs), rg, _grad_flags(fn, args, kwargs))
        name = self._name
        if self._plain:
            name = f"{self._name}_view" if any(pattern) else f"{self._name}_fresh"
            name = _unique_name(_Named(name))
        tags = self._tags | ({Tag.HIDDEN_VIEW} if hidden else set())
        sym = Symbol(name, meta=meta, module="opaque", tags=tags, torch_fn=fn)
        register_view_rule(sym, _pattern_rule(pattern))
        return sym

    def __call__(self, *args, **kwargs):
        out, pairs, written = _run_meta(self.fn, args, kwargs)
        pattern = _alias_pattern(self.fn, args, kwargs, out, pairs)
        if not written:
            return self._plain_symbol(pattern, _hides_views(out, pattern))(*args, **kwargs)
        key = (tuple(written), pattern)
        sym = made_once(self._inplace, key, lambda: self._make_inplace(key, pairs, out))
        return sym(*args, **kwargs)

    def _make_inplace(self, key: tuple, pairs, meta_out) -> Symbol:
        """Composite: functional leaf (clones written args) then copy_ into each."""
        written, _ = key
        functional = self._make_functional(key)
        # Which output (if any) is a written argument itself (add_ returns self).
        returns_arg = None
        if isinstance(meta_out, torch.Tensor):
            for i in written:
                if pairs[i][1] is meta_out:
                    returns_arg = i

        def decomposition(*args, **kwargs):
            targets = [x for x in pytree.leaves((args, kwargs)) if type(x) is TensorProxy]
            result, new_values = functional(*args, **kwargs)
            updated = [prims.copy_(v, targets[i]) for v, i in zip(new_values, written, strict=True)]
            if not torch.is_grad_enabled():     # a write under no_grad (an optimizer's step) records no history
                for u in updated:
                    u.requires_grad = False
            if returns_arg is not None:
                return updated[written.index(returns_arg)]
            return result
        name = _unique_name(_Named(f"{self._name}_mutating_{'_'.join(map(str, written))}"))
        return Symbol(name, decomposition=decomposition, module="opaque", tags={Tag.OPAQUE, Tag.INPLACE})

    def _make_functional(self, key: tuple) -> Symbol:
        """The leaf running ``fn`` on clones of the written arguments. Its
        results may alias the other arguments as the call's did; the written
        arguments' new values (the clones) are fresh."""
        return made_once(self._functional, key, lambda: self._new_functional(key))

    def _new_functional(self, key: tuple) -> Symbol:
        written, pattern = key
        fn = self.fn

        def run_on_clones(*args, **kwargs):
            leaves = [x for x in pytree.leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
            clones = {id(leaves[i]): leaves[i].clone() for i in written}
            swap = lambda x: clones.get(id(x), x) if isinstance(x, torch.Tensor) else x  # noqa: E731
            out = fn(*pytree.tree_map(swap, args), **pytree.tree_map(swap, kwargs))
            return out, tuple(clones[id(leaves[i])] for i in written)

        def meta(*args, **kwargs):
            out, pairs, _ = _run_meta(fn, args, kwargs)
            rg = any(type(x) is TensorProxy and x.requires_grad for x in pytree.leaves((args, kwargs)))
            result = _to_proxies(out, _out_device(args, kwargs), rg, _grad_flags(fn, args, kwargs))
            return result, tuple(pairs[i][0].replace() for i in written)
        name = _unique_name(_Named(f"{self._name}_functional_{'_'.join(map(str, written))}"))
        sym = Symbol(name, meta=meta, module="opaque", tags=_functional_tags(fn, self._tags), torch_fn=run_on_clones)
        kept = tuple(tuple(j for j in js if j not in written) for js in pattern)
        register_view_rule(sym, _pattern_rule(kept, skip_outs=len(written)))
        return sym


def _functional_tags(fn: Callable, tags: set) -> set:
    """The functional leaf's tags: it writes only clones of the arguments the
    call writes, and where ``fn``'s ATen schema names every argument it may
    write (``_declared_writes`` joined them to the written ones) no write is
    unseen: it is no ``DONT_DCE`` leaf (``index_copy_`` into a static cache
    may then be rehearsed and fused like any pure op). Random ones keep it."""
    if Tag.DONT_DCE not in tags or Tag.RANDOM in tags:
        return tags
    name = aten_name(fn)
    return tags - {Tag.DONT_DCE} if name and torch_overloads(name) is not None else tags


def opaque_symbol_for(fn: Callable) -> OpaqueOp:
    """The (cached) opaque op recording calls of ``fn``; calling it records."""
    try:
        hash(fn)
    except TypeError:       # unhashable: a fresh op each time (never cached)
        check(callable(fn), lambda: f"opaque_symbol_for needs a callable, got {fn!r}", TypeError)
        return OpaqueOp(fn)
    check(callable(fn), lambda: f"opaque_symbol_for needs a callable, got {fn!r}", TypeError)
    return made_once(_cache, fn, lambda: OpaqueOp(fn))


def opaque_symbols() -> list[Symbol]:
    """Every opaque leaf symbol made so far (for examine/reporting)."""
    with tables_lock:
        return [sym for op in _cache.values() for sym in op._plain.values()]


class _Named:
    """A stand-in carrying a name for ``_unique_name``."""
    def __init__(self, name: str):
        self.__name__ = name
