"""Custom ops (``torch.library``) without extra registration (docs/architecture.md §5).

``torch.library.custom_op`` objects (``CustomOpDef``) and ops defined with
``torch.library.Library.define`` (reached as ``torch.ops.<ns>.<op>[.<overload>]``)
run as one leaf symbol per overload, made on first use (``symbol_for`` in
torch/registry.py asks ``custom_op_callable``; ``custom_op_callable`` also takes
``torch.ops.aten`` overloads for tests and tools):

- shapes come from the op's fake (``register_fake``) or Meta kernel, run under
  ``FakeTensorMode``;
- the schema is the truth about memory. ``Tensor(a!) x`` is written: the
  symbol is tagged ``Tag.INPLACE`` and ``Tag.DONT_DCE`` (an op may have effects
  besides the write, so it is never dropped) and its trace output carries a new
  proxy naming ``x`` after the call, which ``update_aliases`` treats like a
  ``copy_`` result. A return annotated ``Tensor(a!)`` is that new proxy itself
  (the op mutates and returns an alias: torch.compile refuses these). A return
  annotated ``Tensor(a)`` (no ``!``) is a view of the first argument (``Tag.VIEW``).
  A return without annotation is fresh memory.

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

from typing import Any, Callable

import torch
from torch._library.custom_ops import CustomOpDef
from torch._ops import OpOverload, OpOverloadPacket
from torch._subclasses.fake_tensor import FakeTensorMode, UnsupportedOperatorException

from thunderlite.core import pytree
from thunderlite.core.aliasing import SchemaAliases, register_view_rule, register_write_rule
from thunderlite.core.prims import check
from thunderlite.core.proxies import NumberProxy, TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag

_CUSTOM_TYPES = (OpOverload, OpOverloadPacket, CustomOpDef)
_callables: dict[OpOverload, Callable] = {}


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


def custom_op_callable(fn: Any) -> Callable | None:
    """The callable that records ``fn`` into the current trace, or None if ``fn``
    is not a ``torch.library`` op, or is a packet whose overload only the call's
    arguments decide (the opaque fallback resolves those). Cached per overload."""
    if not isinstance(fn, _CUSTOM_TYPES):
        return None
    if isinstance(fn, OpOverloadPacket) and len(fn.overloads()) != 1:
        return None
    overload = _overload_of(fn)
    wrapper = _callables.get(overload)
    if wrapper is None:
        wrapper = _callables[overload] = _make(overload)
    return wrapper


def _overload_of(fn) -> OpOverload:
    if isinstance(fn, CustomOpDef):
        return fn._opoverload
    if isinstance(fn, OpOverloadPacket):
        return getattr(fn, fn.overloads()[0])
    return fn


class _Schema:
    """What the trace needs from an op's schema: argument names, which are
    written, and for each return the argument it aliases (or None)."""
    __slots__ = ("names", "kwarg_only", "defaults", "written", "return_alias", "is_view", "n_returns")

    def __init__(self, overload: OpOverload):
        schema = overload._schema
        self.names = [a.name for a in schema.arguments]
        self.kwarg_only = {a.name for a in schema.arguments if a.kwarg_only}
        self.defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
        sets: dict[str, int] = {}
        self.written: list[int] = []
        for i, a in enumerate(schema.arguments):
            info = a.alias_info
            if info is None:
                continue
            check(str(a.type) == "Tensor", lambda: f"{overload}: aliasing annotations on {a.type} "
                                                   f"arguments are not supported", NotImplementedError)
            for s in info.before_set:
                sets[s] = i
            if info.is_write:
                self.written.append(i)
        self.return_alias: list[int | None] = []      # written argument a return names
        self.is_view = False                          # some return is a view of the first argument
        for r in schema.returns:
            info = r.alias_info
            src = None if info is None else sets[next(iter(info.before_set))]
            if info is not None and not info.is_write:
                check(src == 0, lambda: f"{overload}: a return that views an argument other than the "
                                        f"first is not supported", NotImplementedError)
                self.is_view, src = True, None
            self.return_alias.append(src)
        self.n_returns = len(schema.returns)

    def bind(self, args: tuple, kwargs: dict) -> list:
        """All arguments in schema order (defaults filled in)."""
        vals = list(args)
        for name in self.names[len(args):]:
            vals.append(kwargs[name] if name in kwargs else self.defaults[name])
        return vals


def _make(overload: OpOverload) -> Callable:
    schema = _Schema(overload)
    hidden = [i for i in schema.written if i not in schema.return_alias]

    def call_op(*vals):
        pos = [v for n, v in zip(schema.names, vals, strict=True) if n not in schema.kwarg_only]
        kw = {n: v for n, v in zip(schema.names, vals, strict=True) if n in schema.kwarg_only}
        return overload(*pos, **kw)

    def impl(*vals):
        return tuple(vals[i] for i in hidden), call_op(*vals)

    def meta(*vals):
        results = _fake_run(overload, call_op, vals)
        outs = tuple(results) if schema.n_returns > 1 else ((results,) if schema.n_returns == 1 else ())
        new = []
        for out, alias in zip(outs, schema.return_alias, strict=True):
            new.append(vals[alias].replace() if alias is not None else _proxy_like(out))
        ret = tuple(new) if schema.n_returns > 1 else (new[0] if new else None)
        return tuple(vals[i].replace() for i in hidden), ret

    name = str(overload).replace("::", "_").replace(".", "_")
    tags = {Tag.INPLACE, Tag.DONT_DCE} if schema.written else {Tag.OPAQUE}
    if schema.is_view:
        tags.add(Tag.VIEW)
    if schema.n_returns == 0:
        tags.add(Tag.DONT_DCE)           # returns nothing: called for an effect
    sym = Symbol(name, meta=meta, impl=impl, module="custom", tags=tags)
    if schema.written:
        register_write_rule(sym, lambda bsym: _writes(bsym, schema, hidden))
    facts = SchemaAliases([overload._schema])
    register_view_rule(sym, lambda bsym: [(o, b) for o in pytree.leaves(bsym.output[1]) if type(o) is TensorProxy
                                          for b in facts.bases_of(bsym.args, {})])

    def record(*args, **kwargs):
        return sym(*schema.bind(args, kwargs))[1]
    record.__name__ = name
    record.symbol = sym
    return record


def _writes(bsym, schema: _Schema, hidden: list[int]) -> list:
    hidden_new, ret = bsym.output
    rets = ret if schema.n_returns > 1 else (ret,)
    pairs = [(bsym.args[i], n) for i, n in zip(hidden, hidden_new, strict=True)]
    for r, alias in zip(rets, schema.return_alias):
        if alias is not None:
            pairs.append((bsym.args[alias], r))
    return pairs


def _fake_run(overload: OpOverload, call_op: Callable, vals: tuple):
    try:
        with FakeTensorMode():
            return call_op(*pytree.tree_map(_fake, vals))
    except (UnsupportedOperatorException, NotImplementedError) as err:
        raise NotImplementedError(
            f"thunderlite needs the shapes of {overload}'s outputs: give it a fake kernel "
            f"(@op.register_fake, or torch.library.register_fake) or a Meta kernel ({err})") from err


def _fake(v):
    if type(v) is TensorProxy:
        return torch.empty(v.shape, dtype=v.dtype, device=v.device)
    return v.value if isinstance(v, NumberProxy) else v


def _proxy_like(t) -> TensorProxy:
    check(isinstance(t, torch.Tensor), lambda: f"custom op returned {type(t).__name__}; only tensor "
                                              f"returns are supported", NotImplementedError)
    return TensorProxy(shape=tuple(t.shape), dtype=t.dtype, device=t.device)
