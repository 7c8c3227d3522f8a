"""Dead-code elimination, aware of writes (docs/architecture.md §5).

A bound symbol is dropped when nothing reads its outputs and it has no effect
anyone can observe. Effects that keep a symbol alive:

- ``Tag.DONT_DCE`` or ``Tag.RETURN`` (prints, collectives, custom ops, the return);
- ``Tag.RANDOM`` anywhere in it: the torch executor draws from the global
  generator, so dropping an unused draw would shift every later random number
  away from what eager PyTorch produces;
- a write (``Tag.INPLACE``, looking through decompositions) into an alias group
  that the caller can see (a trace argument, anything returned, or anything
  aliasing those) or that a kept symbol reads afterwards.

A write into an intermediate that nobody reads again is dead and goes, unlike in
Lightning Thunder, which keeps every in-place op.

Example::

    t0 = ltorch.exp(a)
    t1 = prims.copy_(b, t0)        # t0 is never read again: both lines go
    return a
"""
from __future__ import annotations

from thunderlite.core import pytree
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.transforms.aliasing.update_aliases import AliasGroups, writes_memory, written

_ALWAYS_KEEP = frozenset({Tag.DONT_DCE, Tag.RETURN, Tag.RANDOM})


def _visible_roots(trace: Trace, groups: AliasGroups) -> set[str]:
    """Alias groups the caller sees: arguments and returned values."""
    roots = set()
    for a in pytree.leaves(trace.args):
        if type(a) is TensorProxy:
            roots.add(groups.find(a.name))
    for o in pytree.leaves(trace.output):
        if type(o) is TensorProxy:
            roots.add(groups.find(o.name))
    return roots


def _keep(bsym: BoundSymbol, live: set[str], groups: AliasGroups | None, observed: set[str],
          keep_writes: bool = False) -> bool:
    """``observed``: alias groups the caller sees or a kept later symbol reads
    (``groups`` is None for a trace that writes nothing)."""
    if not _ALWAYS_KEEP.isdisjoint(bsym.deep_tags()):
        return True
    for p in bsym.proxy_outs():
        if p.name in live:
            return True
    if groups is None:
        return False
    if keep_writes and written(bsym):
        return True
    return any(groups.find(dst.name) in observed for dst in written(bsym))


@trace_pass("dce")
def dce(trace: Trace, input_alias_groups: list[list[str]] | None = None, *, keep_writes: bool = False) -> Trace:
    """Drop dead symbols; returns ``trace`` itself when nothing is dead.
    ``keep_writes``: every write stays (a trace reading values it does not
    define, such as a backward reading forward values, whose memory the caller
    may see though they are not its arguments)."""
    # without writes, liveness alone decides and no alias groups are needed
    groups = AliasGroups.of_trace(trace, input_alias_groups) if writes_memory(trace) else None
    observed = _visible_roots(trace, groups) if groups is not None else set()
    live: set[str] = set()
    kept: list[BoundSymbol] = []
    for bsym in reversed(trace.bound_symbols):
        if _keep(bsym, live, groups, observed, keep_writes):
            kept.append(bsym)
            for p in bsym.proxy_args():
                live.add(p.name)
                if groups is not None and type(p) is TensorProxy:
                    observed.add(groups.find(p.name))
    if len(kept) == len(trace.bound_symbols):
        return trace
    kept.reverse()
    return trace.with_bound_symbols("dce", kept)
