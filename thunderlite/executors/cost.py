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
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.symint import has_symbolic

# nominal throughputs (orders of magnitude; a region's size only needs to be right within a few x)
_FLOPS = {"cpu": 50e9, "cuda": 100e12}                # per second: one CPU thread; a datacenter GPU, half precision
_FLOPS_FLOAT32_CUDA = 25e12                           # float32 matmuls without TF32
_BYTES = {"cpu": 10e9, "cuda": 2e12}                  # per second

REGION_SECONDS = 0.05
"""Layers are grouped into a region until it computes for about this long:
beyond it, a cut's price is a small part of the region's time, and keeping
layers apart lets one compilation serve many of them."""

MAX_LAYERS_PER_REGION = 8
"""Layers merged into one region at most: compile time grows with a region's
size, and eight layers' work dwarfs a region call's price."""


def estimated_seconds(bsyms: Iterable[BoundSymbol]) -> float | None:
    """How long ``bsyms`` take to compute, roughly; None when a size is not
    known while tracing (dynamic shapes) or the device is not one modelled."""
    total = 0.0
    for top in bsyms:
        for b in walk(top):
            if b.subsymbols:
                continue
            for out in b.tensor_outs():
                if has_symbolic(out.shape):
                    return None
                kind = out.device.type
                if kind not in _FLOPS:
                    return None
                rate = _FLOPS_FLOAT32_CUDA if kind == "cuda" and out.dtype == torch.float32 else _FLOPS[kind]
                total += (_flops(b, out) / rate + out.nbytes / _BYTES[kind]) / _threads(kind)
    return total


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


def _flops(b: BoundSymbol, out: TensorProxy) -> int:
    name = b.sym.name
    if name == "matmul":
        a = b.args[0]
        return 2 * out.numel() * (a.shape[-1] if isinstance(a, TensorProxy) and a.ndim else 1)
    if name == "convolution":
        a, w = b.args[0], b.args[1]
        transposed = b.args[6] if len(b.args) > 6 else b.kwargs.get("transposed", False)
        per = w.numel() // max(w.shape[0], 1)
        return 2 * (a.numel() if transposed else out.numel()) * per
    return 0


def _threads(kind: str) -> int:
    return torch.get_num_threads() if kind == "cpu" else 1
