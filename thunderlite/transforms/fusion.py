"""The dataflow region former shared by every fusion executor (docs/architecture.md §6).

A fusion executor passes a predicate ``can_fuse(bsym) -> bool``; this module
reorders the trace so that fusible symbols form long consecutive runs, and
hands back those runs as regions. A consecutive run of a topological order
never forms a cycle with the rest of the program (a path leaving the run and
coming back would need a symbol placed between its members), so every region
can be replaced by one fused symbol.

What constrains the order:

- data dependencies (after ``update_aliases`` these carry every
  write-then-read order);
- write-after-read edges (``update_aliases.ordering_edges``): a read of the
  value a write overwrites stays before the write; a collective reads its
  input until its wait, so such a write also follows that wait;
- symbols with effects outside the trace (``Tag.RANDOM``, ``Tag.DONT_DCE``)
  keep their relative order, so random numbers match eager PyTorch;
- nothing moves across a ``Tag.ORDER_BARRIER`` (a grad-mode switch: what runs
  after ``torch.no_grad()`` must run with grad mode off);
- the return stays the last symbol (Lightning Thunder #2776).

Forward and backward are separate traces, so no region can cross that
boundary. Example::

    regions = fusion_regions(trace, lambda b: b.sym.name in {"add", "mul", "sin"})
    trace2 = fuse(trace, can_fuse, make_fusion)   # one symbol per region
"""
from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import pairwise

from thunderlite.core.proxies import Proxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.torch.ops import distributed as d
from thunderlite.transforms.aliasing.update_aliases import has_tag_deep, ordering_edges

CanFuse = Callable[[BoundSymbol], bool]


def effect_chain(bsym: BoundSymbol) -> str | None:
    """Symbols with effects outside the trace keep their relative order (one chain)."""
    return "effect" if has_tag_deep(bsym, Tag.RANDOM) or Tag.DONT_DCE in bsym.sym.tags else None


def dependencies(trace: Trace, input_alias_groups=None,
                 chain: Callable[[BoundSymbol], str | None] = effect_chain) -> list[set[int]]:
    """For each symbol, the indices of the symbols that must run before it.
    ``chain(bsym)`` names the chain of effects a symbol keeps its order in (None: none)."""
    bsyms = trace.bound_symbols
    producer: dict[str, int] = {}
    preds: list[set[int]] = [set() for _ in bsyms]
    last_in_chain: dict[str, int] = {}
    last_barrier = -1
    for i, bsym in enumerate(bsyms):
        if Tag.ORDER_BARRIER in bsym.sym.tags:
            preds[i].update(range(last_barrier + 1, i))
            last_barrier = i
        elif last_barrier >= 0:
            preds[i].add(last_barrier)
        for p in bsym.proxy_args():
            j = producer.get(p.name)
            if j is not None:
                preds[i].add(j)
        for p in bsym.proxy_outs():
            producer[p.name] = i
        key = chain(bsym)
        if key is not None:
            if key in last_in_chain:
                preds[i].add(last_in_chain[key])
            last_in_chain[key] = i
    waits = _waits_of_issues(bsyms)
    for reader, writer in ordering_edges(trace, input_alias_groups):
        preds[writer].add(reader)
        preds[writer].update(w for w in waits.get(reader, ()) if w != writer)
    return preds


def _waits_of_issues(bsyms: list[BoundSymbol]) -> dict[int, list[int]]:
    """A collective issue (``dist.all_gather``...) reads its input until its wait
    completes (c10d's work reads it on its own thread): issue index -> the
    indices of its waits, so a write into what it reads comes after them."""
    issues = {d.ISSUES[k].id for k in range(len(d.ISSUES))}
    issued: dict[str, int] = {}
    out: dict[int, list[int]] = {}
    for i, b in enumerate(bsyms):
        if b.sym.id in issues:
            issued.update((p.name, i) for p in b.proxy_outs())
        elif b.sym.id == d.wait.id and b.args and isinstance(b.args[0], Proxy) and b.args[0].name in issued:
            out.setdefault(issued[b.args[0].name], []).append(i)
    return out


def _schedule(bsyms: list[BoundSymbol], preds: list[set[int]], can_fuse: CanFuse) -> list[int]:
    """Topological order that keeps fusible symbols together: while a fusible run
    is open it is extended with any ready fusible symbol; otherwise ready
    non-fusible symbols go first, so fusible ones pile up into one later run.
    Ties keep the original order."""
    n = len(bsyms)
    fusible = [can_fuse(b) for b in bsyms]
    succs: list[list[int]] = [[] for _ in range(n)]
    missing = [len(p) for p in preds]
    for i, ps in enumerate(preds):
        for j in ps:
            succs[j].append(i)
    ready = {True: [], False: []}
    for i in range(n):
        if missing[i] == 0:
            heapq.heappush(ready[fusible[i]], i)
    order: list[int] = []
    in_run = False
    while len(order) < n:
        kind = True if (in_run and ready[True]) else (False if ready[False] else True)
        i = heapq.heappop(ready[kind])
        order.append(i)
        in_run = kind
        for s in succs[i]:
            missing[s] -= 1
            if missing[s] == 0:
                heapq.heappush(ready[fusible[s]], s)
    return order


@trace_pass("fusion reorder")
def reorder(trace: Trace, can_fuse: CanFuse, input_alias_groups=None) -> Trace:
    """The trace in an order that groups fusible symbols; the return stays last."""
    bsyms = trace.bound_symbols
    ret = trace.return_bsym
    body = bsyms[:-1] if ret is not None else list(bsyms)
    body_trace = trace.with_bound_symbols(trace.stage, body)
    preds = dependencies(body_trace, input_alias_groups)
    order = _schedule(body, preds, lambda b: Tag.RETURN not in b.sym.tags and can_fuse(b))
    if order == list(range(len(body))):
        return trace
    new = [body[i] for i in order] + ([ret] if ret is not None else [])
    return trace.with_bound_symbols("fusion reorder", new)


class Region:
    """A run of fusible bound symbols: ``inputs`` are the proxies it reads from
    outside, ``outputs`` the proxies it defines that are read after it."""
    __slots__ = ("bsyms", "inputs", "outputs")

    def __init__(self, bsyms: list[BoundSymbol], inputs: list[Proxy], outputs: list[Proxy]):
        self.bsyms = bsyms
        self.inputs = inputs
        self.outputs = outputs

    def __repr__(self):
        ins, outs = [p.name for p in self.inputs], [p.name for p in self.outputs]
        return f"<Region {len(self.bsyms)} symbols, in={ins}, out={outs}>"


def fusion_regions(trace: Trace, can_fuse: CanFuse, min_size: int = 1) -> list[Region]:
    """Maximal consecutive runs of fusible symbols of ``trace`` (call ``reorder``
    first to make them long), with their inputs and outputs."""
    bsyms = trace.bound_symbols
    reads_after = _reads_after(bsyms)
    regions, run = [], []
    for i, bsym in enumerate(bsyms + [None]):
        if bsym is not None and Tag.RETURN not in bsym.sym.tags and can_fuse(bsym):
            run.append(i)
            continue
        if len(run) >= min_size and run:
            regions.append(_region(bsyms, run, reads_after))
        run = []
    return regions


def _reads_after(bsyms: list[BoundSymbol]) -> list[set[str]]:
    """For each index i, the names read by symbols after i."""
    out: list[set[str]] = [set() for _ in bsyms]
    acc: set[str] = set()
    for i in range(len(bsyms) - 1, -1, -1):
        out[i] = set(acc)
        acc.update(p.name for p in bsyms[i].proxy_args())
    return out


def region_of(bsyms: list[BoundSymbol], later: set[str] | None = None) -> Region:
    """The region running ``bsyms`` in order: its inputs are the names read
    before any of them defines them, its outputs the names it defines that
    ``later`` (the code after it) reads; every one with ``later`` None."""
    defined: set[str] = set()
    inputs: dict[str, Proxy] = {}
    outputs: list[Proxy] = []
    for b in bsyms:
        for p in b.proxy_args():
            if p.name not in defined and p.name not in inputs:
                inputs[p.name] = p
        for p in b.proxy_outs():
            defined.add(p.name)
            if later is None or p.name in later:
                outputs.append(p)
    return Region(list(bsyms), list(inputs.values()), outputs)


def _region(bsyms, run: list[int], reads_after) -> Region:
    return region_of([bsyms[i] for i in run], reads_after[run[-1]])


def split_region(region: Region, bounds: list[int]) -> list[Region]:
    """``region`` cut into consecutive sub-regions at ``bounds`` (indices into
    ``region.bsyms``, first 0, last ``len``). Each piece's outputs are what later
    pieces or the code after the region read; a consecutive piece of a region
    is again a consecutive run of a topological order, so it never forms a cycle."""
    later = {p.name for p in region.outputs}
    pieces: list[Region] = []
    for lo, hi in reversed(list(pairwise(bounds))):
        piece = region_of(region.bsyms[lo:hi], later)
        pieces.append(piece)
        later.update(p.name for p in piece.inputs)
    return pieces[::-1]


_PERIODS_TRIED = 16
"""How many of the most frequent distances between repeated symbols are tried
as the period: in a backward, a layer's own repeats (the same reshape for q, k
and v; a linear's two matmuls) are more frequent than the layer period."""


def repeat_span(region: Region, min_period: int = 2) -> tuple[int, int, int] | None:
    """The longest stretch of ``region`` that repeats (N identical layers: the
    same symbols from the same source lines) as ``(start, period, repeats)``:
    ``region.bsyms[start + k * period:start + (k + 1) * period]`` is the k-th
    layer. None when nothing repeats at least twice."""
    sigs = [(b.sym, b.source) for b in region.bsyms]
    n = len(sigs)
    last: dict = {}
    gaps: dict[int, int] = {}
    for i, sig in enumerate(sigs):
        if sig in last:
            d = i - last[sig]
            gaps[d] = gaps.get(d, 0) + 1
        last[sig] = i
    best = None
    for p in sorted(gaps, key=gaps.get, reverse=True)[:_PERIODS_TRIED]:
        if p < min_period:
            continue
        run_start, run_len, start, length = 0, 0, 0, 0
        for i in range(n - p):
            if sigs[i] == sigs[i + p]:
                if run_len == 0:
                    run_start = i
                run_len += 1
                if run_len > length:
                    start, length = run_start, run_len
            else:
                run_len = 0
        reps = (length + p) // p          # a run of matches of length L spans L + p symbols
        if reps >= 2 and (best is None or reps * p > best[2] * best[1]):
            best = (start, p, reps)
    return best


def span_bounds(n: int, span: tuple[int, int, int] | None, group: int = 1) -> list[int]:
    """Cut points of ``n`` symbols whose repeated stretch is ``span``
    (``repeat_span``), every ``group`` repetitions in a piece of their own (the
    last piece may hold fewer), so identical pieces can share one compiled
    artifact. ``[0, n]`` when nothing repeats, or when one group holds every
    repetition: then nothing is shared, so nothing is cut."""
    if span is None or group >= span[2]:
        return [0, n]
    start, p, reps = span
    cuts = [start + k * p for k in range(0, reps, group)] + [start + reps * p]
    return sorted({0, n, *cuts})


MakeFusion = Callable[[Region], "BoundSymbol | list[BoundSymbol]"]


@trace_pass("fusion")
def fuse(trace: Trace, can_fuse: CanFuse, make_fusion: MakeFusion, *, min_size: int = 1,
         input_alias_groups=None) -> Trace:
    """Reorder, then replace each region by ``make_fusion(region)``: a bound
    symbol reading ``region.inputs`` and producing ``tuple(region.outputs)``
    (or a list of them, e.g. one per piece of ``split_region``). The region's
    symbols become its subsymbols (unless ``make_fusion`` set them), so later
    passes still see the writes and random draws inside."""
    ordered = reorder(trace, can_fuse, input_alias_groups)
    regions = {id(r.bsyms[0]): r for r in fusion_regions(ordered, can_fuse, min_size)}
    out: list[BoundSymbol] = []
    skip: set[int] = set()
    for bsym in ordered.bound_symbols:
        if id(bsym) in skip:
            continue
        region = regions.get(id(bsym))
        if region is None:
            out.append(bsym)
            continue
        skip.update(id(b) for b in region.bsyms)
        fused = make_fusion(region)
        if isinstance(fused, list):
            out.extend(fused)
            continue
        if not fused.subsymbols:
            fused = fused.replace(subsymbols=tuple(region.bsyms))
        out.append(fused)
    if not regions:
        return trace
    return trace.with_bound_symbols("fusion", out)

