"""What a leaf bound symbol does to memory (docs/architecture.md §5): which tensors it
writes, and which proxies name them afterwards.

One table keyed by symbol (CONTRIBUTING.md, style 2). Symbols not in the table follow the
default rules:

- ``prims.copy_(src, dst)`` writes ``dst``; its output names ``dst`` afterwards
  (a registered rule, below);
- any other leaf tagged ``Tag.INPLACE`` writes its first tensor argument; its
  first tensor output (if any) names it afterwards (the rule of torch's
  ``x.add_(y)``-style methods).

A symbol whose writes follow another pattern (a custom op with several
``Tensor(a!)`` arguments, a collective) registers a rule::

    register_write_rule(my_op, lambda bsym: [(bsym.args[0], bsym.output[0])])

Views need no rule: every tensor output of a ``Tag.VIEW`` symbol, or of a prim
the torch executor runs with a view-returning torch function (``reshape``,
``permute``, ``broadcast_in_dim``, ``slice_prim``, ``squeeze``, ``real``,
``imag``: see prims.py), may alias the first tensor argument. The barrier symbol ``update_aliases`` inserted by
``transforms/update_aliases.py`` lives here because every layer that runs or
analyses traces must know it."""
from __future__ import annotations

from typing import Any, Callable

from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.tags import Tag

WriteRule = Callable[[BoundSymbol], list]
# Keyed by symbol, and by its meta function: an executor's symbol for a prim
# (executors/base.py ``executor_symbol``) shares the prim's meta, so it shares
# the prim's rules without the executor registering anything.
_write_rules: dict[Any, WriteRule] = {}


def register_write_rule(sym: Symbol, rule: WriteRule) -> None:
    """``rule(bsym)`` lists ``(dst, new)`` pairs: the proxy written and the output
    proxy naming it after the write (or None)."""
    if sym in _write_rules:
        raise ValueError(f"a write rule for {sym.id} is already registered")
    if Tag.INPLACE not in sym.tags:
        raise ValueError(f"{sym.id} has a write rule but is not tagged Tag.INPLACE")
    _write_rules[sym] = rule
    if sym.meta is not None:
        _write_rules.setdefault(sym.meta, rule)


def writes(bsym: BoundSymbol) -> list[tuple[TensorProxy, TensorProxy | None]]:
    """The ``(dst, new)`` pairs a leaf in-place bound symbol writes; [] otherwise."""
    sym = bsym.sym
    if Tag.INPLACE not in sym.tags or not sym.is_leaf:
        return []
    rule = _write_rules.get(sym) or _write_rules.get(sym.meta)
    if rule is not None:
        return rule(bsym)
    tensors = bsym.tensor_args()
    if not tensors:
        return []
    outs = bsym.tensor_outs()
    return [(tensors[0], outs[0] if outs else None)]


def _copy_writes(bsym: BoundSymbol) -> list:
    dst = bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs["dst"]
    return [(dst, bsym.output)]


register_write_rule(prims.copy_, _copy_writes)

_VIEW_METAS = frozenset(getattr(prims, n).meta for n in
                        ("reshape", "permute", "broadcast_in_dim", "slice_prim", "squeeze", "real", "imag"))


def may_view(bsym: BoundSymbol) -> bool:
    """Whether ``bsym``'s tensor outputs may share storage with its first tensor argument."""
    sym = bsym.sym
    return Tag.VIEW in sym.tags or (sym.is_leaf and sym.meta in _VIEW_METAS)


def _barrier_meta(members, after):
    return tuple(m.replace() for m in members)


def _barrier_impl(members, after):
    return members


BARRIER = Symbol("update_aliases", meta=_barrier_meta, impl=_barrier_impl, module="prims",
                 tags={Tag.ALIAS_BARRIER})
"""``(a1, v1) = prims.update_aliases((a, v), (t2,))``: after a write into the
alias group of ``a`` and ``v`` (whose result is ``t2``), ``a1`` and ``v1`` name the
same tensors as ``a`` and ``v``. At run time the identity on ``members``; in the
trace, the data dependency that orders later reads after the write."""
