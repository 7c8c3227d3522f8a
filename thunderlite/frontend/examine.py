"""``thunderlite.examine``: what thunderlite did with a function, in words.

Reports the torch calls recorded as opaque (no symbol: they run as one torch
call and block fusion), which executor claimed how many symbols, executors that
were skipped and why, registered implementations the call did not use and
why (frontend/unused_impls.py), how the calls with a fused ATen path
(attention, norms, losses, softmax, embedding...) were differentiated and why
(``autodiff.rules.fused_path``) and who ran the fused kernels, the cache
state, which tier the entry runs (frontend/caching/tiers.py), and the error if
compiling failed.
"""
from __future__ import annotations

from collections import Counter

import torch

from thunderlite.core.symbol import Symbol, walk
from thunderlite.core.tags import Tag
from thunderlite.executors.autograd_function import EAGER_MODE_STAGE
from thunderlite.executors.cost import keep_kernel
from thunderlite.executors.cudagraphs.plan import NOT_CAPTURED
from thunderlite.executors.registry import resolve_executors, skipped_executors
from thunderlite.frontend.training.predicated import NOT_PREDICATED
from thunderlite.frontend.unused_impls import unused_implementations
from thunderlite.transforms.aliasing.functionalize import FUNCTIONALIZE_STAGE
from thunderlite.transforms.autodiff import kernels
from thunderlite.transforms.autodiff.rules import fused_path
from thunderlite.transforms.claim import STAGE as CLAIM_STAGE


class Examination:
    """The report; ``str()`` prints it, the attributes hold the data."""

    def __init__(self, opaque: list[str], claimed: dict[str, int], skipped: dict[str, str],
                 error: BaseException | None, first_call_ms: float, n_symbols: int,
                 unused: list[tuple[str, str, str]] | None = None):
        self.unused = unused or []      # (executor, symbol id, reason): implementations the call did not use
        self.autodiff = ""              # how the program was differentiated, when notable (eager-mode fallback)
        self.cudagraphs: list[str] = []  # with CUDAGraphs: regions captured, symbols left out and why
        self.splits: list[str] = []     # where the program split (frontend/splits/): line, why, value seen
        self.tier = ""                  # which tier the entry runs (frontend/caching/tiers.py)
        self.kernels: list[str] = []     # calls with a fused ATen path: how they were taken and why; who ran them
        self.predication: list[str] = []  # blocks run predicated on a tensor flag, and those that could not be
        self.opaque = opaque
        self.claimed = claimed
        self.skipped = skipped
        self.error = error
        self.first_call_ms = first_call_ms
        self.n_symbols = n_symbols

    @property
    def ok(self) -> bool:
        return self.error is None

    def __str__(self):
        lines = [f"thunderlite.examine: {'compiled and ran' if self.ok else 'FAILED'} "
                 f"(first call {self.first_call_ms:.1f} ms, {self.n_symbols} symbols recorded)"]
        if self.error is not None:
            lines.append(f"  error: {type(self.error).__name__}: {self.error}")
        if self.opaque:
            lines.append("  opaque torch calls (run as-is, not decomposed or fused):")
            lines += [f"    {name} x{n}" for name, n in Counter(self.opaque).most_common()]
        else:
            lines.append("  every torch call has a thunderlite symbol")
        for ex, n in self.claimed.items():
            lines.append(f"  executor {ex!r} claimed {n} symbols")
        for ex, why in self.skipped.items():
            lines.append(f"  executor {ex!r} skipped: {why}")
        for ex, sym, why in self.unused:
            lines.append(f"  executor {ex!r}: implementation of {sym} not used: {why}")
        if self.autodiff:
            lines.append(f"  autodiff: {self.autodiff}")
        if self.kernels:
            lines.append("  fused kernels:")
            lines += [f"    {line}" for line in self.kernels]
        lines += [f"  cudagraphs: {line}" for line in self.cudagraphs]
        lines += [f"  {line}" for line in self.predication]
        if self.splits:
            lines.append(f"  split into {len(self.splits) + 1} pieces where Python needs a traced value:")
            lines += [f"    {line}" for line in self.splits]
        if self.tier:
            lines.append(f"  tier: {self.tier}")
        return "\n".join(lines)

    __repr__ = __str__


def examine_call(jfn, error: BaseException | None, elapsed_ms: float, executors) -> Examination:
    entry = jfn.last
    opaque: list[str] = []
    claimed: dict[str, int] = {}
    n = 0
    pieces = entry.pieces() if hasattr(entry, "pieces") else [entry] if entry is not None else []
    for piece in pieces:
        first, final = piece.traces[0], piece.traces[-1]
        n += len(first.bound_symbols)
        for bsym in first.bound_symbols:
            if Tag.OPAQUE in bsym.sym.tags:
                opaque.append(bsym.sym.name)
        for bsym in final.bound_symbols:
            ex = bsym.sym.executor
            if ex is not None:
                name = getattr(ex, "name", str(ex))
                claimed[name] = claimed.get(name, 0) + 1
    unused = unused_implementations(entry, resolve_executors(executors)) if entry is not None else []
    report = Examination(opaque, claimed, skipped_executors(executors), error, elapsed_ms, n, unused)
    report.autodiff = _autodiff_note(entry.traces) if entry is not None else ""
    if entry is not None:
        report.cudagraphs = _cudagraph_notes([f for p in pieces for f in (p.traces[-1], *p.backward_traces[-1:])])
        tier = getattr(entry, "tier", None)
        report.tier = tier.describe(jfn._tiers.hot_after) if tier is not None else "fast (tiering off)"
        fusing = any(ex.fuses_elementwise for ex in resolve_executors(executors))
        report.kernels = [line for p in pieces for line in _kernel_notes(p, fusing)]
        report.predication = list(dict.fromkeys(n for p in pieces for n in p.predication))
    if error is not None:
        report.predication += [n for n in getattr(error, "__notes__", ()) if n.startswith(NOT_PREDICATED)]
    if hasattr(entry, "splits"):
        report.splits = [f"at {site.file}:{site.line} ({site.code.strip()}): {site.what}; the value was {value!r}"
                         for site, value in entry.splits()]
    return report


_KERNELS = frozenset(v for v in vars(kernels).values() if isinstance(v, Symbol))
_KERNEL_OF_FN = {id(k.torch_fn): k for k in _KERNELS}


def _kernel_notes(entry, fusing: bool) -> list[str]:
    """Per torch-level symbol with a fused path, how autodiff took its calls
    and why (grouped); then each fused kernel of the final traces and the
    executor that ran it: itself, inside a fusion region, or replaced by its
    decomposition for a fusion executor to fuse. With a fusion executor in
    the list (``fusing``), the cost model's verdict on the kernel
    (``cost.keep_kernel``) follows."""
    traces = list(entry.traces)
    if any(t.stage == EAGER_MODE_STAGE for t in traces):
        return []
    notes: list[str] = []
    paths = Counter()
    whole = Counter(id(b.sym.torch_fn) for b in traces[-1].bound_symbols if b.sym.executor is not None)
    for b in traces[0].bound_symbols:
        path = fused_path(b)
        if path is None:
            continue
        if not entry.backward_traces:     # no gradient: the symbol runs as its torch call, or decomposed
            path = (("one torch call", f"no gradient: {_callable_name(b.sym.torch_fn)}, whose dispatcher picks "
                     "the kernel") if whole[id(b.sym.torch_fn)] else ("decomposition", "its parts were claimed"))
        paths[(b.sym.name, *path)] += 1
    notes += [f"{name} x{n}: {how}: {why}" if why else f"{name} x{n}: {how}"
              for (name, how, why), n in paths.items()]
    ran, offered = Counter(), {}
    for t in (traces, list(entry.backward_traces)):
        counts, firsts = _kernels_run(t)
        ran.update(counts)
        offered.update(firsts)
    for (name, where), n in ran.items():
        verdict = f"; {keep_kernel(offered[name])[1]}" if fusing and name in offered else ""
        notes.append(f"{name} x{n} {where}{verdict}")
    return notes


def _kernels_run(traces) -> tuple[Counter, dict]:
    """``(kernel name, where it ran) -> count`` for the final trace of one
    direction, with the kernels offered to the executors and gone after
    claiming; and the first call of each kernel offered. An executor's symbol
    for a kernel keeps the kernel's ``torch_fn``."""
    if not traces:
        return Counter(), {}
    ran = Counter()
    for top in traces[-1].bound_symbols:
        ex = getattr(top.sym.executor, "name", None)
        kernel = _KERNEL_OF_FN.get(id(top.sym.torch_fn)) if ex is not None else None
        if kernel is not None:
            ran[(kernel.name, f"run by {ex!r} ({_callable_name(kernel.torch_fn)})")] += 1
        elif top.subsymbols and ex is not None:
            for b in walk(top):
                if b is not top and b.sym in _KERNELS:
                    ran[(b.sym.name, f"inside {ex!r} fusion regions")] += 1
    before = next((traces[i - 1] for i, t in enumerate(traces) if t.stage == CLAIM_STAGE and i > 0), None)
    firsts: dict = {}
    if before is not None:
        offered = Counter()
        for b in before.bound_symbols:
            if b.sym in _KERNELS:
                offered[b.sym.name] += 1
                firsts.setdefault(b.sym.name, b)
        kept = Counter()
        for (name, _), n in ran.items():
            kept[name] += n
        for name, n in offered.items():
            if n > kept[name]:
                ran[(name, "replaced by its decomposition (its parts fused or run one by one)")] += n - kept[name]
    return ran, firsts


def _callable_name(fn) -> str:
    name = getattr(fn, "__name__", repr(fn)).removesuffix("_dense")
    module = getattr(fn, "__module__", None)
    if isinstance(fn, torch._ops.OpOverloadPacket) or (not (module or "").startswith("torch")
                                                       and hasattr(torch.ops.aten, name)):
        return f"aten.{name}"
    return f"{module}.{name}" if module and module.startswith("torch") else name
def _cudagraph_notes(finals) -> list[str]:
    """Per final trace: its graphs, and each symbol left out with the reason
    the CUDAGraphs transform wrote above it; runtime fallbacks of its graphs."""
    notes: list[str] = []
    for t in finals:
        graphs = [b for b in t.bound_symbols if b.sym.module == "cudagraphs"]
        left = [b for b in t.bound_symbols if (b.header or "").startswith(NOT_CAPTURED)]
        if not graphs and not left:
            continue
        notes.append(f"{t.name}: {len(graphs)} graph regions, {len(left)} symbols left out")
        notes += [f"  {b.sym.name} ({', '.join(p.name for p in b.proxy_outs()) or '-'}) "
                  f"{b.header[len(NOT_CAPTURED):].lstrip(': ')}" for b in left]
        notes += [f"  {b.sym.name}: {why}" for b in graphs for why in getattr(b.sym.impl, "fallbacks", ())]
    return notes


def _autodiff_note(traces) -> str:
    """How the program was differentiated, when that is worth a line: the
    eager-mode fallback (and why), or writes into views made functional."""
    for t in traces:
        if t.stage == EAGER_MODE_STAGE:
            return ("eager-mode fallback: PyTorch autograd records this program's graph as it runs (no "
                    "thunderlite backward trace) because of " + _reason(t))
        if t.stage == FUNCTIONALIZE_STAGE:
            return ("writes into views and inputs were functionalized; thunderlite differentiates the program "
                    "(written inputs are copied into after its forward)")
    return ""


def _reason(trace) -> str:
    for c in trace.header_comments:
        if "because of " in c:
            return c.split("because of ", 1)[1]
    return "(no reason recorded)"
