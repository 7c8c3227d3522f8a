"""A rough cost model of trace regions, for fusion executors choosing how large
their regions are.

A cut between two layers costs time: each compiled region pays a price per
call on the host (the trace's glue, the compiled wrapper's input checks,
AOTAutograd's and Inductor's Python around the kernels: tens of
microseconds, which bound the step of a small model or of a GPU fast enough
that the host launching work is the bottleneck), and Inductor neither fuses
nor plans memory across the cut (measured: a 2-layer GPT step at 20 ms a layer
on one CPU thread ran 2-4% faster as one region than as a region per layer).
Fewer cuts cost compile time instead: identical pieces share one compilation,
so a region of k layers compiles k layers' worth. So layers are grouped until a
region computes for about ``REGION_SECONDS``. The estimate only has to tell
microseconds from milliseconds from seconds: matmul and convolution FLOPs at a
nominal throughput of the device, every other symbol's output bytes at a
nominal bandwidth.

The same estimate decides whether a fusion executor takes a fused ATen
kernel's decomposition (autodiff/kernels.py: attention, a norm's backward, a
loss) or leaves the kernel whole to the torch executor (``keep_kernel``): the
kernel reads its inputs and writes its outputs once; the decomposition, fused
around its matmuls, also writes and reads back every matmul's operands and
results it makes inside (attention's ``[B, H, L, S]`` scores and
probabilities), which the kernel keeps in registers. A decomposition with no
matmul fuses into kernels moving about the kernel's bytes, and with its
neighbours (a residual add, a cast) saves their round trips: it is fused.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.symint import has_symbolic, hint_of

# nominal throughputs (orders of magnitude; a region's size only needs to be right within a few x)
_FLOPS = {"cpu": 50e9, "cuda": 100e12}                # per second: one CPU thread; a datacenter GPU, half precision
_FLOPS_FLOAT32_CUDA = 25e12                           # float32 matmuls without TF32
_BYTES = {"cpu": 10e9, "cuda": 2e12}                  # per second

REGION_SECONDS = 0.25
"""Layers are grouped into a region until it computes for about this long:
beyond it, a cut's price is a small part of the region's time, and keeping
layers apart lets one compilation serve many of them. Measured on one CPU
thread, a 4-layer Llama training step (hidden 256, 4x128 tokens, layers of
about 20 ms) ran 1.5% faster as one region than as a region per layer
(Inductor's fusion and memory planning across the cuts): at 0.05 s it was
cut per layer."""

MAX_LAYERS_PER_REGION = 8
"""Layers merged into one region at most: compile time grows with a region's
size, and eight layers' work dwarfs a region call's price."""


def estimated_seconds(bsyms: Iterable[BoundSymbol]) -> float | None:
    """How long ``bsyms`` take to compute, roughly; None when a size has no
    value (a data-dependent size) or the device is not one modelled. A
    symbolic size counts at the value it had when traced (its hint): a decode
    step's layers, traced at one cache length, are estimated at that length."""
    total = 0.0
    for top in bsyms:
        for b in walk(top):
            if b.subsymbols:
                continue
            for out in b.tensor_outs():
                numel = _numel_at_hint(out)
                kind = out.device.type
                if numel is None or kind not in _FLOPS:
                    return None
                flops = _flops(b, out, numel)
                if flops is None:
                    return None
                rate = _FLOPS_FLOAT32_CUDA if kind == "cuda" and out.dtype == torch.float32 else _FLOPS[kind]
                total += (flops / rate + numel * out.dtype.itemsize / _BYTES[kind]) / _threads(kind)
    return total


def _numel_at_hint(t: TensorProxy) -> int | None:
    """Elements of ``t`` with its symbolic sizes at their hints (None: one has none)."""
    n = 1
    for s in t.shape:
        s = hint_of(s)
        if type(s) is not int:
            return None
        n *= s
    return n


def layers_per_region(layer: Iterable[BoundSymbol], repeats: int) -> int:
    """How many consecutive identical layers (``layer``: one of them) to compile
    as one region: enough that the region computes for ``REGION_SECONDS``, at
    most ``MAX_LAYERS_PER_REGION`` and ``repeats`` (``group_size``); one
    layer when the work cannot be estimated."""
    seconds = estimated_seconds(layer)
    if seconds is None:
        return 1
    return group_size(REGION_SECONDS / max(seconds, 1e-12), repeats)


def group_size(want: float, repeats: int) -> int:
    """Layers per region for ``want`` layers wanted and ``repeats`` layers:
    a divisor of ``repeats`` down to half of ``want`` (8 layers wanting 3 get
    2 a region: one compilation of 2 layers, not one of 3 and one of 2), else
    as even as equal pieces go (10 wanting 8 get 5)."""
    k = max(1, min(repeats, MAX_LAYERS_PER_REGION, math.ceil(want)))
    for d in range(k, (k + 1) // 2 - 1, -1):
        if repeats % d == 0:
            return d
    return math.ceil(repeats / math.ceil(repeats / k))


def _flops(b: BoundSymbol, out: TensorProxy, numel: int | None = None) -> int | None:
    """Multiply-adds times two of a matmul or convolution making ``out``
    (``numel``: its elements, where known), 0 for other symbols; sizes at
    their hints (None: one has none)."""
    name = b.sym.name
    if name not in ("matmul", "convolution"):
        return 0
    numel = _numel_at_hint(out) if numel is None else numel
    if name == "matmul":
        a = b.args[0]
        inner = hint_of(a.shape[-1]) if isinstance(a, TensorProxy) and a.ndim else 1
        return None if numel is None or type(inner) is not int else 2 * numel * inner
    a, w = b.args[0], b.args[1]
    transposed = b.args[6] if len(b.args) > 6 else b.kwargs.get("transposed", False)
    per, outs, ins = _numel_at_hint(w), hint_of(w.shape[0]), _numel_at_hint(a)
    if None in (numel, per, ins) or type(outs) is not int:
        return None
    return 2 * (ins if transposed else numel) * (per // max(outs, 1))


def _threads(kind: str) -> int:
    return torch.get_num_threads() if kind == "cpu" else 1


_KEEP_MARGIN = 1.25
"""The decomposition is fused only if its estimate is within this factor of
the kernel's: a fusion executor saves its neighbours' round trips, which the
estimate does not see."""


def keep_kernel(bsym: BoundSymbol) -> tuple[bool, str]:
    """``(keep, why)``: whether a fused ATen kernel (a symbol with a
    ``torch_fn`` and a decomposition) should run whole rather than as its
    decomposition fused by a fusion executor, with the estimates in words."""
    if not bsym.subsymbols:
        return True, "no decomposition to fuse"
    io = sum(t.nbytes for t in (*bsym.tensor_args(), *bsym.tensor_outs()) if not has_symbolic(t.shape))
    ends = {p.name for p in (*bsym.proxy_args(), *bsym.proxy_outs())}
    leaves = [b for b in walk(bsym) if not b.subsymbols]
    made = {p.name: b for b in leaves for p in b.proxy_outs()}
    flops = spilled = 0
    kinds = set()
    for b in leaves:
        if b.sym.name not in ("matmul", "convolution"):
            continue
        for out in b.tensor_outs():
            if has_symbolic(out.shape):
                return True, "sizes known only at run time: the kernel runs"
            kinds.add(out.device.type)
            made_flops = _flops(b, out)
            if made_flops is None:      # a data-dependent contraction size
                return True, "sizes known only at run time: the kernel runs"
            flops += made_flops
            spilled += sum(2 * t.nbytes for t in (*b.tensor_args(), out)
                           if t.name not in ends and _computed_inside(t.name, made, ends))
    if not spilled:
        return False, ("cost model: its decomposition writes nothing around matmuls: fused, it moves about the "
                       "kernel's bytes")
    kind = kinds.pop() if len(kinds) == 1 and next(iter(kinds)) in _FLOPS else "cpu"
    compute = flops / _FLOPS[kind]
    kernel = compute + io / _BYTES[kind]
    parts = kernel + spilled / _BYTES[kind]
    keep = parts > _KEEP_MARGIN * kernel
    verdict = "the kernel runs" if keep else "its decomposition is fused"
    return keep, (f"cost model: as one kernel ~{kernel * 1e6:.0f} us, as its decomposition fused around its "
                  f"matmuls ~{parts * 1e6:.0f} us ({_size(spilled)} of intermediates written and read back): "
                  f"{verdict}")


def _computed_inside(name: str, made: dict, ends: set) -> bool:
    """Whether the value ``name`` is computed inside the decomposition (not a
    view, through views, of one of its inputs), so that fusing around a matmul
    writes it to memory."""
    b = made.get(name)
    while b is not None and name not in ends:
        if b.sym.name not in _VIEWS:
            return True
        args = b.tensor_args()
        name = args[0].name if args else ""
        b = made.get(name)
    return False


_VIEWS = frozenset({"reshape", "permute", "transpose", "broadcast_in_dim", "slice_prim", "squeeze", "unsqueeze",
                    "expand", "view"})


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"
