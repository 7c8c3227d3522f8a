"""Which parts of a final trace become CUDA graphs, and why the rest does not
(docs/architecture.md §6, "CUDA graphs").

A graph replays the kernels it recorded and nothing else: no Python runs, no
host value is read, addresses are fixed. So a symbol is captured only when
all of that holds for it (``leave_out`` says why not otherwise):

- every tensor it reads or makes lives on a graphable device (CUDA);
- it hands no number back to the host (``.item()``, a size known only at run
  time: nonzero, masked indexing) and touches no Python object (unpacking the
  saved values, boxes);
- it has no effect beyond its outputs (collectives, prints, hooks: replay
  would skip the host side), changes no host state (grad-mode switches) and,
  where it draws random numbers, draws them from the device's default
  generator (graph-safe: the graph advances its offset at each replay; a
  ``generator=`` of the user's is not registered with the graph).

Maximal consecutive runs of such symbols (``fusion_regions``; nothing is
reordered) are then cut where one writes memory made outside the run (a graph
reads and writes static copies of its inputs, so such a write would be lost);
outputs that are only views of the run's inputs are made again after it by
their view calls (a graph's view would point into its static buffers). A run
with fewer than ``min_kernels`` symbols that compute (views do not) is not
worth its input copies and stays as it is.

``plan_graphs(trace)`` returns the plan; ``apply_plan`` replaces each region
by one graph symbol whose callable the caller makes (``runtime.py`` on CUDA; a
CPU stand-in in tests), and puts the reason above each symbol left out.
"""
from __future__ import annotations

from collections.abc import Callable

from thunderlite.core.aliasing import output_aliases_input, views, writes
from thunderlite.core.proxies import NumberProxy, Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol, Symbol, walk
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.executors.torchcompile import _input_aliases, _views_outside
from thunderlite.transforms.fusion import Region, fusion_regions, region_of

SYNC = "syncs the CPU: reads a value known only at run time (.item(), nonzero, data-dependent sizes)"
HOST_VALUE = "handles Python objects, not tensors (saved values, boxes, numbers it returns)"
NOT_CAPTURED = "not in a CUDA graph"
EFFECT = "has an effect beyond its outputs (collective, print, hook): replay runs no Python"
HOST_STATE = "changes host state (grad mode): replay runs no Python"
GENERATOR = "draws random numbers from a generator= of the user's (not registered with the graph)"
WRITES_OUTSIDE = "writes a tensor made before its region (graphs write static copies of their inputs)"


def _device_reason(bsym: BoundSymbol, devices: tuple[str, ...]) -> str | None:
    for p in (*bsym.tensor_args(), *bsym.tensor_outs()):
        if p.device.type not in devices:
            return f"{p.device.type} tensor {p.name}: only {'/'.join(devices)} work is captured"
    return None


def leave_out(bsym: BoundSymbol, devices: tuple[str, ...] = ("cuda",)) -> str | None:
    """Why ``bsym`` cannot be part of a CUDA graph, or None when it can."""
    tags = bsym.deep_tags()
    if Tag.UNBACKED in tags:
        return SYNC
    if not all(isinstance(p, TensorProxy) for p in bsym.proxy_outs()) or \
            not all(isinstance(p, (TensorProxy, NumberProxy)) for p in bsym.proxy_args()):
        return HOST_VALUE
    if Tag.ORDER_BARRIER in tags:
        return HOST_STATE
    if Tag.RANDOM in tags:
        if any(leaf.kwargs.get("generator") is not None for leaf in walk(bsym)):
            return GENERATOR
    elif Tag.DONT_DCE in tags:
        return EFFECT
    return _device_reason(bsym, devices)


class GraphPlan:
    """``regions``: what becomes a graph, each with ``tails`` (view calls made
    again after it) and ``escaping`` (per output: whether it outlives the
    trace's call, so a replay must hand back a copy, not its static buffer);
    ``left_out``: (bound symbol, reason) for every symbol not captured."""

    def __init__(self):
        self.regions: list[Region] = []
        self.tails: list[list[BoundSymbol]] = []
        self.escaping: list[tuple[bool, ...]] = []
        self.left_out: list[tuple[BoundSymbol, str]] = []


def _kernels(bsym: BoundSymbol) -> int:
    """Roughly how many kernels ``bsym`` launches: none for a view, the symbols
    a fusion region holds for that region (it may be one kernel or many)."""
    if bsym.tensor_outs() and not writes(bsym) and \
            all(o.name in {v.name for v, _ in views(bsym)} for o in bsym.tensor_outs()):
        return 0
    return max(1, len(bsym.subsymbols)) if Tag.FUSION in bsym.sym.tags else 1


def _cut_external_writes(region: Region, plan: GraphPlan) -> list[list[BoundSymbol]]:
    """The runs of ``region`` left after taking out each symbol that writes
    memory made outside its run (an input, or a view of one)."""
    runs, todo = [], list(region.bsyms)
    while todo:
        rooted = _input_aliases(region_of(todo), every=True)
        cut = next((i for i, b in enumerate(todo)
                    if any(dst.name in rooted for leaf in walk(b) for dst, _ in writes(leaf))), None)
        if cut is None:
            runs.append(todo)
            break
        plan.left_out.append((todo[cut], WRITES_OUTSIDE))
        if cut:
            runs.append(todo[:cut])
        todo = todo[cut + 1:]
    return runs


def _escaping(outputs: list[Proxy], after: list[BoundSymbol]) -> tuple[bool, ...]:
    """An output escapes the trace's call when the return reads it or a later
    symbol may keep an alias of it (a view, a write's new name, an opaque call):
    the graph's static buffer is overwritten at its next replay."""
    held: set[str] = set()
    for b in after:
        if Tag.RETURN in b.sym.tags or Tag.OPAQUE in b.sym.tags or output_aliases_input(b) or \
                any(type(p) is not TensorProxy for p in b.proxy_outs()):
            held.update(p.name for p in b.proxy_args())
    return tuple(o.name in held for o in outputs)


def plan_graphs(trace: Trace, *, devices: tuple[str, ...] = ("cuda",), min_kernels: int = 2) -> GraphPlan:
    """The regions of ``trace`` (a final, claimed trace) to capture, and the
    symbols left out with their reasons (see the module docstring)."""
    plan = GraphPlan()
    bsyms = trace.bound_symbols
    why = {id(b): leave_out(b, devices) for b in bsyms if Tag.RETURN not in b.sym.tags}
    plan.left_out += [(b, why[id(b)]) for b in bsyms if why.get(id(b))]
    position = {id(b): i for i, b in enumerate(bsyms)}
    for run in fusion_regions(trace, lambda b: why[id(b)] is None):
        for piece in _cut_external_writes(run, plan):
            end = position[id(piece[-1])] + 1
            later = {p.name for b in bsyms[end:] for p in b.proxy_args()}
            region, tail = _views_outside(region_of(piece, later))
            if _input_aliases(region) or sum(map(_kernels, region.bsyms)) < min_kernels:
                continue        # returns a view of its inputs and writes; or too small to pay
            plan.regions.append(region)
            plan.tails.append(tail)
            plan.escaping.append(_escaping(region.outputs, tail + bsyms[end:]))
    plan.left_out.sort(key=lambda pair: position[id(pair[0])])
    return plan


MakeRunner = Callable[[Trace, Region, tuple], Callable]


@trace_pass("cudagraphs")
def apply_plan(trace: Trace, plan: GraphPlan, make_runner: MakeRunner) -> Trace:
    """``trace`` with each planned region replaced by ``cudagraph<N>(inputs)``
    (its callable ``make_runner(sub_trace, region, escaping)``), its view tail
    after it, and the reason above each symbol left out."""
    if not plan.regions and not plan.left_out:
        return trace
    starts = {id(r.bsyms[0]): k for k, r in enumerate(plan.regions)}
    inside = {id(b) for r in plan.regions for b in r.bsyms}
    reasons = {id(b): why for b, why in plan.left_out}
    out: list[BoundSymbol] = []
    for b in trace.bound_symbols:
        k = starts.get(id(b))
        if k is not None:
            region = plan.regions[k]
            sub = Trace(f"cudagraph{k}", stage="cudagraphs region", names=trace.names)
            sub.args = list(region.inputs)
            sub.bound_symbols[:] = region.bsyms
            sub.set_return(tuple(region.outputs))
            runner = make_runner(sub, region, plan.escaping[k])
            sym = Symbol(f"{trace.name}_graph{k}", impl=runner, module="cudagraphs", tags={Tag.FUSION})
            out.append(sym.bind(*region.inputs, output=tuple(region.outputs), subsymbols=tuple(region.bsyms),
                                source=region.bsyms[0].source))
            out.extend(plan.tails[k])
        elif id(b) not in inside:
            why = reasons.get(id(b))
            out.append(b.replace(header=f"{NOT_CAPTURED}: {why}") if why else b)
    new = trace.with_bound_symbols("cudagraphs", out)
    new.header_comments.append(f"cudagraphs: {len(plan.regions)} regions, {len(plan.left_out)} symbols left out")
    return new
