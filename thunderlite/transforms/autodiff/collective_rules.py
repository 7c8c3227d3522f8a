"""VJP rules of the collectives (torch/ops/distributed.py), registered into the
one table of autodiff/rules.py. The backward of a collective is its adjoint
collective: all_reduce(sum) is self-adjoint, all_gather and reduce_scatter(sum)
are each other's adjoints (which is what makes FSDP's backward a
reduce-scatter of the gradients). ``wait`` passes its gradient through."""
from __future__ import annotations

from thunderlite.torch.ops import distributed as d
from thunderlite.transforms.autodiff.rules import backward_error, register_vjp


@register_vjp(d.wait)
def _wait(g, out, a):
    return (g,)


@register_vjp(d.all_reduce)
def _all_reduce(g, out, a, op, group, consume=False):
    if op not in ("sum", "avg"):
        return (backward_error(a, f"all_reduce with op {op!r} has no gradient in thunderlite (only sum and avg)"),)
    return (d.wait(d.all_reduce(g, op, group)),)


@register_vjp(d.all_gather)
def _all_gather(g, out, a, world, group):
    return (d.wait(d.reduce_scatter(g, "sum", world, group)),)


@register_vjp(d.reduce_scatter)
def _reduce_scatter(g, out, a, op, world, group):
    if op != "sum":
        return (backward_error(a, f"reduce_scatter with op {op!r} has no gradient in thunderlite (only sum)"),)
    return (d.wait(d.all_gather(g, world, group)),)


@register_vjp(d.broadcast)
def _broadcast(g, out, a, src, group):
    return (backward_error(a, "broadcast has no gradient in thunderlite"),)
