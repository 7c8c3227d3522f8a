"""Predication: a span of a trace whose writes take effect only where a tensor
flag says so, without the host reading the flag.

Eager code often reads a tensor's value only to decide whether to run a block
that writes tensors (GradScaler skipping the optimizer step on an inf or nan
gradient, ``if torch.isfinite(loss): opt.step()``). Reading it would cost a host
sync and, in a trace, a split. When the block's only effects are tensor writes,
the block can run unconditionally with each write made conditional:

    t1 = ltorch.add_(p, u)            # p.add_(u)

becomes its decomposition with the write's source picked by the flag:

    t0 = ltorch.add(p, u)
    w = prims.where(keep, t0, p)       # the new value where keep, p's own elsewhere
    t1 = prims.copy_(w, p)

Reads inside the span see the unconditional values; only writes escape it, and
each is predicated, so when ``keep`` is false every tensor the span wrote holds
what it held before. A write into a tensor the span made itself (not a view) is
left as it is: nothing outside sees it. What cannot be predicated this way
raises ``NotPredicable`` with the reason (an opaque op writing several tensors,
a random draw, which would advance the generator either way); the caller then
reads the flag instead.
"""
from __future__ import annotations

from collections.abc import Sequence

from thunderlite.core import prims
from thunderlite.core.aliasing import may_view, writes
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx


class NotPredicable(Exception):
    """The span does something a flag cannot select without the host reading it."""


def predicate(bsyms: Sequence[BoundSymbol], keep: TensorProxy, trace: Trace) -> list[BoundSymbol]:
    """``bsyms`` (a span recorded into ``trace``) with every write into memory
    the span did not make itself taking effect only where ``keep`` (a bool
    tensor of one element) is true. New names come from ``trace``."""
    scratch = Trace("predication", names=trace.names)
    fresh: set[str] = set()
    out: list[BoundSymbol] = []
    for b in bsyms:
        tags = b.deep_tags()
        if Tag.RANDOM in tags:
            raise NotPredicable(f"{b.sym.name} draws random numbers, which the skipped branch would not draw")
        if Tag.DONT_DCE in tags and Tag.ORDER_BARRIER not in b.sym.tags:    # grad-mode switches are fine
            raise NotPredicable(f"{b.sym.name} has an effect outside the trace (a collective, a custom op)")
        out += _rewrite(b, keep, fresh, scratch)
        if not may_view(b) and not any(writes(x) for x in walk(b)):
            fresh.update(o.name for o in b.tensor_outs())
    return out


def _rewrite(b: BoundSymbol, keep: TensorProxy, fresh: set[str], scratch: Trace) -> list[BoundSymbol]:
    if not any(writes(x) for x in walk(b)):
        return [b]
    if b.subsymbols:      # a composite that writes: its decomposition, each write predicated
        return [r for sub in b.subsymbols for r in _rewrite(sub, keep, fresh, scratch)]
    if b.sym is not prims.copy_:
        raise NotPredicable(f"{b.sym.name} writes {', '.join(d.name for d, _ in writes(b))} in one opaque call")
    src, dst = (b.args[0], b.args[1]) if len(b.args) > 1 else (b.args[0], b.kwargs["dst"])
    if dst.name in fresh:
        return [b]
    with tracectx(scratch):
        if isinstance(src, TensorProxy):
            if src.dtype != dst.dtype:
                src = prims.convert_element_type(src, dst.dtype)
            src = _expand(src, dst)
        cond = keep if tuple(keep.shape) == tuple(dst.shape) else \
            prims.broadcast_in_dim(keep, tuple(dst.shape), ())
        picked = prims.where(cond, src, dst)
        if picked.dtype != dst.dtype:      # a Python number promoting an integer tensor
            picked = prims.convert_element_type(picked, dst.dtype)
    made = list(scratch.bound_symbols)
    scratch.bound_symbols.clear()
    return made + [b.replace(args=(picked, dst), kwargs={})]


def _expand(src: TensorProxy, dst: TensorProxy) -> TensorProxy:
    if tuple(src.shape) == tuple(dst.shape):
        return src
    lead = len(dst.shape) - len(src.shape)
    return prims.broadcast_in_dim(src, tuple(dst.shape), tuple(range(lead, len(dst.shape))))
