"""A jitted function's backward made differentiable: double backward through
the autograd bridge (docs/architecture.md §9, "Double backward").

The bridge (executors/autograd_function.py) runs a compiled backward that
autograd cannot see into; with ``create_graph=True`` the gradients it returns
must themselves carry a graph. ``vjp_trace(trace, mask, grad_positions)`` is
that backward as a program of its own, ``vjp(args..., cotangents...) ->
gradients``: the forward recomputed from the arguments and the backward
recorded by ``inline_backward(create_graph=True)`` (composites on the gradient
path differentiated through their decompositions, so the gradient is built
of symbols whose own rules are exact). The bridge differentiates that program
like any other, so gradients of gradients, and further orders, are autodiff of
a trace. The forward runs again, so a program whose forward writes memory
(it would write twice) or draws random numbers (other draws) is refused with
the reason (``NotDifferentiableAgain``).
"""
from __future__ import annotations

from thunderlite.core import pytree
from thunderlite.core.aliasing import writes
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import walk
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.core.tracectx import tracectx
from thunderlite.transforms.aliasing.update_aliases import AliasGroups
from thunderlite.transforms.autodiff.inline import NotInlinable, inline_backward
from thunderlite.transforms.autodiff.split import _where
from thunderlite.transforms.dce import dce


class NotDifferentiableAgain(NotImplementedError):
    """The program's backward cannot be made differentiable (the message says why)."""


def _refusal(trace: Trace, bsyms) -> str | None:
    """Why the forward cannot run a second time, or None: a random draw, a
    write into memory the program did not make (an input, a view of one)."""
    groups = AliasGroups.of_trace(trace)
    inputs = {groups.find(a.name) for a in trace.args if type(a) is TensorProxy}
    for bsym in bsyms:
        for b in walk(bsym):
            if Tag.RANDOM in b.sym.tags:
                return f"it draws random numbers ({b.sym.name} at {_where(bsym)}), which a recomputation would redraw"
            if not b.subsymbols and any(groups.find(dst.name) in inputs for dst, _ in writes(b)):
                return (f"it writes an input ({b.sym.name} at {_where(bsym)}), which a recomputation would write "
                        "again")
    return None


@trace_pass("vjp (a differentiable backward, for double backward)")
def vjp_trace(trace: Trace, mask, grad_positions) -> Trace:
    """``vjp(*trace.args, *cotangents)``: one gradient (or None) per argument of
    ``trace`` (those ``mask`` selects), given one cotangent per output tensor
    leaf at ``grad_positions``; the symbols of the gradient require grad
    where their inputs do, so differentiating the program again is exact."""
    bsyms = [b for b in trace.bound_symbols if Tag.RETURN not in b.sym.tags]
    reason = _refusal(trace, bsyms)
    if reason is not None:
        raise NotDifferentiableAgain(reason)
    leaves = [o for o in pytree.leaves(trace.output) if type(o) is TensorProxy]
    outs = [leaves[pos] for pos in grad_positions]
    cots = [o.replace(name=trace.fresh_name("cotangent"), requires_grad=True) for o in outs]
    try:
        inl = inline_backward(bsyms, list(trace.args), list(mask), outs, cots, names=trace.names,
                              create_graph=True)
    except NotInlinable as e:
        raise NotDifferentiableAgain(str(e)) from None
    vjp = Trace("vjp", names=trace.names)
    vjp.args = [*trace.args, *cots]
    vjp.bound_symbols = [*inl.forward, *inl.backward]
    vjp._scopes = [vjp.bound_symbols]
    with tracectx(vjp):
        vjp.set_return(tuple(inl.grads))
    return dce(vjp)
