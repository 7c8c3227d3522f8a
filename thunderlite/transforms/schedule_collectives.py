"""Collectives issued early and waited as late as possible, with all-gathers
prefetched a bounded distance ahead (docs/architecture.md §15), so
communication overlaps computation without every gathered parameter being
alive at once.

A list schedule over the trace's dependencies (``fusion.dependencies``: data
dependencies, write-after-read edges, grad-mode barriers) in which:

- all-gathers are grouped by *unit* where the caller names one for every
  trace input a gather reads (``units``: FSDP's sharded modules, from
  ``Transform.prefetch_units``), otherwise by *use*: the first symbol that
  reads the gathered value (or a view or cast of it) together with anything
  else, so the gathers of a linear layer's weight and bias, read by its
  ``linear``, form one group. Groups are numbered in trace order of their
  first use (a unit gathered again, a whole step's re-gathers in its backward,
  forms a group per time), and group ``k`` is issued only once the gathers group ``k - 1``
  needs first have been waited for: while a group is computed with, only the
  next one is in flight, as FSDP2 prefetches one layer ahead. This bounds
  the forward's memory and the backward's re-gathers
  (``fsdp.regather_in_backward``) alike;
- all-gathers are issued in group order (ties: trace order), the other issues
  (all-reduces and reduce-scatters of gradients...) in trace order, each as
  soon as it is ready: the order of issues is a function of the trace alone,
  the same on every rank, so collectives still match across ranks; other
  effects (random draws, prints) keep their order;
- a ready issue runs first, then any ready symbol other than a wait; a wait
  runs only when nothing else is ready, so everything that does not need the
  collective's result runs while it is in flight;
- the return stays last.

Should the prefetch edges ever contradict the trace's dependencies (a gather
whose input is computed from a later group), the pass falls back to
issuing every collective in trace order as soon as it is ready. The pass
changes nothing in a trace without collectives.
"""
from __future__ import annotations

import heapq
from itertools import pairwise

from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.torch.ops import distributed as d
from thunderlite.transforms.fusion import dependencies, effect_chain

_ISSUES = frozenset(s.id for s in d.ISSUES)
_GATHER = d.all_gather.id
_WAIT = d.wait.id


def _chain(bsym: BoundSymbol) -> str | None:
    sid = bsym.sym.id
    if sid == _GATHER or sid == _WAIT:
        return None                       # gathers: ordered by prefetch group below
    if sid in _ISSUES:
        return "collectives"
    return effect_chain(bsym)


def _rank(bsym: BoundSymbol) -> int:
    sid = bsym.sym.id
    return 0 if sid in _ISSUES else (2 if sid == _WAIT else 1)


def has_collectives(trace: Trace) -> bool:
    return any(b.sym.id in _ISSUES for b in trace.bound_symbols)


def gather_uses(body: list[BoundSymbol], succs: list[list[int]]) -> dict[int, int]:
    """For each all-gather (by index), the index of its use: the first symbol
    reading its result, or a value computed from that result alone (the wait,
    views, casts), together with anything else; ``len(body)`` when only the
    return reads it."""
    uses = {}
    for g, b in enumerate(body):
        if b.sym.id != _GATHER:
            continue
        names = {p.name for p in b.proxy_outs()}
        heap = list(succs[g])
        heapq.heapify(heap)
        seen = set(heap)
        uses[g] = len(body)
        while heap:                       # dependents in trace order: the first outside the closure is the use
            j = heapq.heappop(heap)
            args = {p.name for p in body[j].proxy_args()}
            if not args & names:
                continue                  # an ordering edge, not a read
            if body[j].sym.id in _ISSUES or not args <= names:
                uses[g] = j
                break
            names.update(p.name for p in body[j].proxy_outs())
            for s in succs[j]:
                if s not in seen:
                    seen.add(s)
                    heapq.heappush(heap, s)
    return uses


def _unit(body: list[BoundSymbol], g: int, producer: dict[str, int],
          units: dict[str, str]) -> tuple[str, frozenset[str]] | None:
    """The unit of the trace inputs gather ``g`` is computed from, when they
    all belong to one (and no other collective lies on the way), with those inputs."""
    found: set[str] = set()
    roots: set[str] = set()
    stack, seen = [p.name for p in body[g].proxy_args()], set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        k = producer.get(name)
        if name in units:                 # an input, or unpacked from the saved values in a backward
            found.add(units[name])
            roots.add(name)
        elif k is None:
            return None
        elif body[k].sym.id in _ISSUES or body[k].sym.id == _WAIT:
            return None
        else:
            stack.extend(p.name for p in body[k].proxy_args())
    return (found.pop(), frozenset(roots)) if len(found) == 1 else None


def prefetch_groups(body: list[BoundSymbol], uses: dict[int, int],
                    units: dict[str, str] | None = None) -> list[list[int]]:
    """The all-gathers (indices; ``uses``: from ``gather_uses``) grouped by use,
    or by unit where ``units`` names the unit of every input a gather reads, in
    the order of their groups' first uses (ties: trace order). A unit gathered
    again (a whole training step: the forward's gathers, then the backward's
    re-gathers of what was resharded) forms a group per time: the ``n``-th
    gather of the same inputs joins the unit's ``n``-th group."""
    producer = {p.name: k for k, b in enumerate(body) for p in b.proxy_outs()} if units else {}
    by_key: dict[tuple, list[int]] = {}
    times: dict[tuple, int] = {}          # (unit, inputs) -> gathers of them so far
    for g in sorted(uses):
        found = _unit(body, g, producer, units) if units else None
        if found is not None:
            n = times[found] = times.get(found, -1) + 1
            key: tuple = ("unit", found[0], n)
        else:
            key = ("use", uses[g])
        by_key.setdefault(key, []).append(g)
    return sorted(by_key.values(), key=lambda group: (min(uses[g] for g in group), group[0]))


def _list_schedule(body: list[BoundSymbol], preds: list[set[int]]) -> list[int]:
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
    return order


def _with_edges(preds: list[set[int]], edges: list[tuple[int, int]]) -> list[set[int]]:
    out = [set(p) for p in preds]
    for before, after in edges:
        out[after].add(before)
    return out


def _prefetch_edges(body: list[BoundSymbol], preds: list[set[int]],
                    units: dict[str, str] | None) -> list[tuple[int, int]]:
    """Gathers in group order, and group ``k`` after the waits of the gathers
    group ``k - 1`` needs first."""
    succs: list[list[int]] = [[] for _ in body]
    for i, ps in enumerate(preds):
        for j in ps:
            succs[j].append(i)
    uses = gather_uses(body, succs)
    groups = prefetch_groups(body, uses, units)
    flat = [g for group in groups for g in group]
    edges = list(pairwise(flat))
    for prev, group in pairwise(groups):
        first = min(uses[g] for g in prev)
        outs = {p.name for g in prev if uses[g] == first for p in body[g].proxy_outs()}
        waits = [j for g in prev for j in succs[g]
                 if body[j].sym.id == _WAIT and {p.name for p in body[j].proxy_args()} & outs]
        edges.extend((w, g) for w in waits for g in group)
    return edges


@trace_pass("schedule_collectives")
def schedule_collectives(trace: Trace, input_alias_groups=None, units: dict[str, str] | None = None) -> Trace:
    """``units``: trace inputs (by name) whose gathers form one prefetch group,
    name -> unit (``Transform.prefetch_units``: FSDP's sharded modules)."""
    if not has_collectives(trace):
        return trace
    bsyms = trace.bound_symbols
    ret = trace.return_bsym
    body = bsyms[:-1] if ret is not None else list(bsyms)
    preds = dependencies(trace.with_bound_symbols(trace.stage, body), input_alias_groups, chain=_chain)
    order = _list_schedule(body, _with_edges(preds, _prefetch_edges(body, preds, units)))
    if len(order) < len(body):            # a prefetch edge against the data: every issue in trace order
        issues = [i for i, b in enumerate(body) if b.sym.id in _ISSUES]
        order = _list_schedule(body, _with_edges(preds, list(pairwise(issues))))
    if order == list(range(len(body))):
        return trace
    return trace.with_bound_symbols("schedule_collectives",
                                    [body[i] for i in order] + ([ret] if ret is not None else []))
