"""Custom ops (``torch.library``) without extra registration (docs/architecture.md §5).

``torch.library.custom_op`` objects (``CustomOpDef``) and ops defined with
``torch.library.Library.define`` (reached as ``torch.ops.<ns>.<op>[.<overload>]``)
run as one leaf symbol per overload, made on first use (``symbol_for`` in
torch/registry.py asks ``custom_op_callable``; ``custom_op_callable`` also takes
``torch.ops.aten`` overloads for tests and tools):

- shapes come from the op's fake (``register_fake``) or Meta kernel, run under
  ``FakeTensorMode``;
- the schema is the truth about memory. ``Tensor(a!) x`` is written (also
  ``Tensor(a!)? x``, written when given, and ``Tensor(a!)[] xs``, every tensor
  of the list): the symbol is tagged ``Tag.INPLACE`` and ``Tag.DONT_DCE`` (an
  op may have effects besides the write, so it is never dropped) and its trace
  output carries a new proxy naming ``x`` after the call (a tuple of them for a
  list), which ``update_aliases`` treats like a ``copy_`` result. A return
  annotated ``Tensor(a!)`` (or ``Tensor(a!)[]``) is that new proxy itself (the
  op mutates and returns an alias: torch.compile refuses these). A return
  annotated ``Tensor(a)`` (no ``!``) may view the argument annotated
  ``Tensor(a)``, whichever position it has (``_views``, the symbol's view rule).
  A return without annotation is fresh memory;
- gradients: every custom op is ``Tag.OPAQUE`` with ``torch_fn``, so on a
  gradient path autodiff runs it under PyTorch's autograd (transforms/autodiff/split.py,
  ``opaque_with_graph``): the op's ``register_autograd`` formula (setup_context
  and backward, arbitrary user code) runs exactly as in eager, and an op without
  one raises eager's "no autograd formula was registered" at backward. Outputs
  require grad as the fake run with grad-requiring inputs says. Writes: a
  ``custom_op`` runs below autograd, so a written tensor keeps its history (its
  gradient passes through the write unchanged); a ``Library.define`` op's Python
  kernel runs with autograd on, so its writes are recorded and a written tensor
  may start requiring grad (``_writes_seen_by_autograd``). A write into memory
  other tensors share (a view, its base, an input) is made functional by
  transforms/aliasing/functionalize.py: the op runs on a clone, whose new value is
  written back (``overload_of_symbol`` finds the schema there).

In the trace a call prints as ``((x1,), t5) = custom.mylib_op_default(x, y)``:
the first element names the written arguments that the op does not return,
the second is what the op returns. The program being traced gets only the
second, as it would from the op itself. Names nobody reads (``x1``) are freed
right after the call by ``del_last_used``, so the result never keeps the
written inputs alive (PyTorch #163227).

Example::

    @torch.library.custom_op("mylib::scale_", mutates_args={"x"})
    def scale_(x: torch.Tensor, s: float) -> None: x.mul_(s)

    thunderlite.jit(lambda x: scale_(x, 2.0) or x.sin())(a)   # no registration needed
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._library.custom_ops import OPDEFS, CustomOpDef
from torch._ops import OpOverload, OpOverloadPacket
from torch._subclasses.fake_tensor import FakeTensorMode, UnsupportedOperatorException

from thunderlite.core import pytree
from thunderlite.core.aliasing import register_view_rule, register_write_rule
from thunderlite.core.prims import check
from thunderlite.core.proxies import NumberProxy, TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.core.tracectx import made_once
from thunderlite.torch.custom_op_equivalents import with_equivalent

_CUSTOM_TYPES = (OpOverload, OpOverloadPacket, CustomOpDef)
_callables: dict[OpOverload, Callable] = {}
_symbol_overloads: dict[Symbol, OpOverload] = {}
_fake_fallbacks: dict[str, Callable] = {}


def overload_of_symbol(sym: Symbol) -> OpOverload | None:
    """The ``torch.library`` overload a custom-op symbol records, or None."""
    return _symbol_overloads.get(sym)


def schema_argument_names(sym: Symbol) -> list[str] | None:
    """A custom-op symbol's argument names in schema order (its bound args), or None."""
    overload = _symbol_overloads.get(sym)
    return None if overload is None else [a.name for a in overload._schema.arguments]


def register_fake_fallback(qualname: str, fn: Callable) -> None:
    """Output shapes for an op whose fake/Meta kernel this torch build lacks
    (``symm_mem::two_shot_all_reduce_`` on a CPU build): ``fn`` is called with
    fake tensors, as a fake kernel would be, only when torch's own fails."""
    _fake_fallbacks[qualname] = fn


_BUILTIN_NAMESPACES = frozenset({"aten", "prims", "prim"})


def is_custom_op(fn: Any) -> bool:
    """A ``torch.library`` op outside PyTorch's own namespaces (``torch.ops.aten.*``
    goes through the torch language and its opaque fallback instead)."""
    if isinstance(fn, CustomOpDef):
        return True
    if isinstance(fn, OpOverload):
        return fn.namespace not in _BUILTIN_NAMESPACES
    if isinstance(fn, OpOverloadPacket):
        return fn._qualified_op_name.partition("::")[0] not in _BUILTIN_NAMESPACES
    return False


def custom_op_callable(fn: Any, symbol_for: Callable | None = None) -> Callable | None:
    """The callable that records ``fn`` into the current trace, or None if ``fn``
    is not a ``torch.library`` op, or is a packet whose overload only the call's
    arguments decide (the opaque fallback resolves those). Cached per overload.
    ``symbol_for`` (torch callable -> symbol; the registry's): a custom op known
    to equal a torch function records that function's symbol where it accepts
    the call (torch/custom_op_equivalents.py)."""
    if not isinstance(fn, _CUSTOM_TYPES):
        return None
    if isinstance(fn, OpOverloadPacket) and len(fn.overloads()) != 1:
        return None
    overload = _overload_of(fn)
    if symbol_for is None:
        return made_once(_callables, overload, lambda: _make(overload))
    return made_once(_with_equivalents, overload, lambda: _equivalent_of(overload, symbol_for))


_with_equivalents: dict[OpOverload, Callable] = {}


def _equivalent_of(overload: OpOverload, symbol_for: Callable) -> Callable:
    record = made_once(_callables, overload, lambda: _make(overload))
    schema = _Schema(overload)
    return with_equivalent(overload.name(), schema.names, schema.defaults, record, symbol_for)


def _overload_of(fn) -> OpOverload:
    if isinstance(fn, CustomOpDef):
        return fn._opoverload
    if isinstance(fn, OpOverloadPacket):
        return getattr(fn, fn.overloads()[0])
    return fn


_TENSOR, _LIST, _OPTIONAL, _OPTIONAL_LIST = "Tensor", "List[Tensor]", "Optional[Tensor]", "List[Optional[Tensor]]"
_ALIASABLE = frozenset({_TENSOR, _LIST, _OPTIONAL, _OPTIONAL_LIST})


class _Schema:
    """What the trace needs from an op's schema: argument names, which are
    written (a ``Tensor(a!)``, ``Tensor(a!)?`` or ``Tensor(a!)[]`` argument), and
    for each return the written argument it names or the argument it views."""
    __slots__ = ("names", "kwarg_only", "defaults", "written", "return_alias", "views", "n_returns")

    def __init__(self, overload: OpOverload):
        schema = overload._schema
        self.names = [a.name for a in schema.arguments]
        self.kwarg_only = {a.name for a in schema.arguments if a.kwarg_only}
        self.defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
        sets: dict[str, int] = {}
        types = [str(a.type) for a in schema.arguments]
        self.written: list[int] = []
        for i, a in enumerate(schema.arguments):
            info = a.alias_info
            if info is None:
                continue
            check(types[i] in _ALIASABLE, lambda: f"{overload}: aliasing annotations on {a.type} "
                                                  f"arguments are not supported", NotImplementedError)
            for s in info.before_set:
                sets[s] = i
            if info.is_write:
                self.written.append(i)
        self.return_alias: list[int | None] = []      # written argument a return names
        self.views: list[int | None] = []             # argument a return views (Tensor(a), no write)
        for r in schema.returns:
            info = r.alias_info
            src = None
            if info is not None:
                # a list's annotation sits on its elements: the set is empty, match the written list by type
                src = (sets[next(iter(info.before_set))] if info.before_set else
                       next(i for i in self.written if types[i] == str(r.type)))
            view = None
            if info is not None and not info.is_write:
                view, src = src, None
            self.return_alias.append(src)
            self.views.append(view)
        self.n_returns = len(schema.returns)

    def bind(self, args: tuple, kwargs: dict) -> list:
        """All arguments in schema order (defaults filled in)."""
        vals = list(args)
        for name in self.names[len(args):]:
            vals.append(kwargs[name] if name in kwargs else self.defaults[name])
        return vals


def _renamed(v, requires_grad: bool = False):
    """New proxies naming a written argument after the call (a tensor, a list of
    them, or None for an optional tensor not given); ``requires_grad``: the
    write may make it require grad."""
    if v is None:
        return None
    if isinstance(v, (list, tuple)):
        return tuple(_renamed(x, requires_grad) for x in v)
    return v.replace(requires_grad=v.requires_grad or requires_grad)


def _writes_seen_by_autograd(overload: OpOverload) -> bool:
    """``torch.library.custom_op`` runs its function below autograd: its writes
    are invisible to autograd (a written tensor keeps its history). A
    ``Library.define`` op's Python kernel runs with autograd on, so the ops
    inside it record their writes as eager in-place ops do."""
    return overload._schema.name not in OPDEFS


def _pairs(before, after) -> list:
    """``(dst, new)`` for every tensor of a written argument and its new name."""
    if before is None:
        return []
    if isinstance(before, (list, tuple)):
        return [p for b, a in zip(before, after, strict=True) for p in _pairs(b, a)]
    return [(before, after)]


def _make(overload: OpOverload) -> Callable:
    schema = _Schema(overload)
    hidden = [i for i in schema.written if i not in schema.return_alias]
    recorded = bool(schema.written) and _writes_seen_by_autograd(overload)

    def call_op(*vals):
        pos = [v for n, v in zip(schema.names, vals, strict=True) if n not in schema.kwarg_only]
        kw = {n: v for n, v in zip(schema.names, vals, strict=True) if n in schema.kwarg_only}
        return overload(*pos, **kw)

    def impl(*vals):
        return tuple(vals[i] for i in hidden), call_op(*vals)

    def meta(*vals):
        results = _fake_run(overload, call_op, vals)
        outs = tuple(results) if schema.n_returns > 1 else ((results,) if schema.n_returns == 1 else ())
        grad = recorded and torch.is_grad_enabled() and any(
            type(p) is TensorProxy and p.requires_grad for p in pytree.leaves(vals))
        new = []
        for out, alias in zip(outs, schema.return_alias, strict=True):
            new.append(_renamed(vals[alias], grad) if alias is not None else _proxy_like(out))
        ret = tuple(new) if schema.n_returns > 1 else (new[0] if new else None)
        return tuple(_renamed(vals[i], grad) for i in hidden), ret

    name = str(overload).replace("::", "_").replace(".", "_")
    # one torch call the jit cannot see into: autodiff runs it under PyTorch's
    # autograd (the op's registered formula, or eager's error when it has none)
    tags = {Tag.OPAQUE}
    if schema.written:
        tags |= {Tag.INPLACE, Tag.DONT_DCE} | (set() if recorded else {Tag.WRITES_BELOW_AUTOGRAD})
    if schema.n_returns == 0:
        tags.add(Tag.DONT_DCE)           # returns nothing: called for an effect
    sym = Symbol(name, meta=meta, impl=impl, module="custom", tags=tags, torch_fn=impl)
    if schema.written:
        register_write_rule(sym, lambda bsym: _writes(bsym, schema, hidden))
    register_view_rule(sym, lambda bsym: _views(bsym, schema))

    def record(*args, **kwargs):
        return sym(*schema.bind(args, kwargs))[1]
    record.__name__ = name
    record.symbol = sym
    _symbol_overloads[sym] = overload
    return record


def _writes(bsym, schema: _Schema, hidden: list[int]) -> list:
    hidden_new, ret = bsym.output
    rets = ret if schema.n_returns > 1 else ((ret,) if schema.n_returns == 1 else ())
    pairs = [p for i, n in zip(hidden, hidden_new, strict=True) for p in _pairs(bsym.args[i], n)]
    for r, alias in zip(rets, schema.return_alias, strict=True):
        if alias is not None:
            pairs.extend(_pairs(bsym.args[alias], r))
    return pairs


def _views(bsym, schema: _Schema) -> list:
    """``(out, base)`` pairs of the op's returns: a written argument it returns
    names that argument's tensors one for one (so a ``Tensor(a!)[]`` list does not
    merge the alias groups of its elements); a ``Tensor(a)`` return may view
    every tensor of the argument annotated ``Tensor(a)``."""
    _, ret = bsym.output
    rets = ret if schema.n_returns > 1 else ((ret,) if schema.n_returns == 1 else ())
    pairs = []
    for r, alias, view in zip(rets, schema.return_alias, schema.views, strict=True):
        if alias is not None:
            pairs.extend((new, dst) for dst, new in _pairs(bsym.args[alias], r))
        elif view is not None:
            bases = [b for b in pytree.leaves(bsym.args[view]) if type(b) is TensorProxy]
            pairs.extend((o, b) for o in pytree.leaves(r) if type(o) is TensorProxy for b in bases)
    return pairs


def _fake_run(overload: OpOverload, call_op: Callable, vals: tuple):
    """The op on fake tensors that require grad as the proxies do, so its
    outputs' ``requires_grad`` is PyTorch's answer (a formula registered or not)."""
    try:
        with FakeTensorMode():
            return call_op(*pytree.tree_map(_fake, vals))
    except (UnsupportedOperatorException, NotImplementedError) as err:
        fallback = _fake_fallbacks.get(overload.name())
        if fallback is not None:
            with FakeTensorMode():
                return fallback(*pytree.tree_map(_fake, vals))
        raise NotImplementedError(
            f"thunderlite needs the shapes of {overload}'s outputs: give it a fake kernel "
            f"(@op.register_fake, or torch.library.register_fake) or a Meta kernel ({err})") from err


def _fake(v):
    if type(v) is TensorProxy:
        return torch.empty(v.shape, dtype=v.dtype, device=v.device, requires_grad=v.requires_grad)
    return v.value if isinstance(v, NumberProxy) else v


def _proxy_like(t):
    if isinstance(t, (list, tuple)):
        return tuple(_proxy_like(x) for x in t)
    if t is None:
        return None
    check(isinstance(t, torch.Tensor), lambda: f"custom op returned {type(t).__name__}; only tensor "
                                              f"returns are supported", NotImplementedError)
    return TensorProxy(shape=tuple(t.shape), dtype=t.dtype, device=t.device, requires_grad=t.requires_grad)
