"""Collectives issued as early as possible and waited as late as possible
(docs/architecture.md §15), so communication overlaps computation.

A list schedule over the trace's dependencies (``fusion.dependencies``: data
dependencies, write-after-read edges, grad-mode barriers) in which:

- issues (``dist.all_reduce``...) keep their relative order, the same on every
  rank, so collectives still match across ranks; other effects (random draws,
  prints) keep theirs;
- a ready issue runs first, then any ready symbol other than a wait; a wait
  runs only when nothing else is ready, so everything that does not need the
  collective's result runs while it is in flight;
- the return stays last.

The pass changes nothing in a trace without collectives.
"""
from __future__ import annotations

import heapq

from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.torch.ops import distributed as d
from thunderlite.transforms.fusion import dependencies, effect_chain

_ISSUES = frozenset(s.id for s in d.ISSUES)
_WAIT = d.wait.id


def _chain(bsym: BoundSymbol) -> str | None:
    sid = bsym.sym.id
    if sid in _ISSUES:
        return "collectives"
    if sid == _WAIT:
        return None
    return effect_chain(bsym)


def _rank(bsym: BoundSymbol) -> int:
    sid = bsym.sym.id
    return 0 if sid in _ISSUES else (2 if sid == _WAIT else 1)


def has_collectives(trace: Trace) -> bool:
    return any(b.sym.id in _ISSUES for b in trace.bound_symbols)


@trace_pass("schedule_collectives")
def schedule_collectives(trace: Trace, input_alias_groups=None) -> Trace:
    if not has_collectives(trace):
        return trace
    bsyms = trace.bound_symbols
    ret = trace.return_bsym
    body = bsyms[:-1] if ret is not None else list(bsyms)
    preds = dependencies(trace.with_bound_symbols(trace.stage, body), input_alias_groups, chain=_chain)
    succs: list[list[int]] = [[] for _ in body]
    missing = [len(p) for p in preds]
    for i, ps in enumerate(preds):
        for j in ps:
            succs[j].append(i)
    ready: list[tuple[int, int]] = [(_rank(body[i]), i) for i in range(len(body)) if missing[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for s in succs[i]:
            missing[s] -= 1
            if missing[s] == 0:
                heapq.heappush(ready, (_rank(body[s]), s))
    if order == list(range(len(body))):
        return trace
    return trace.with_bound_symbols("schedule_collectives",
                                    [body[i] for i in order] + ([ret] if ret is not None else []))
