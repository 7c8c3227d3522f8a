"""How a training step splits under executors=["torchcompile", "torch"]: per
direction, the compiled regions and the calls left between them (what
bench_training.py's thunderlite+tc pays per step beyond the kernels).

    python scripts/tc_regions.py [--model gpt|llama] [--dtype bfloat16] [--layers 4]

Runs on CUDA when present (the attention kernels differ there), else on CPU.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

import thunderlite
from thunderlite.core.tags import Tag

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_training import MODELS, _step

_GLUE = {"del", "box", "unpack_saved", "return", "python_return", "unpack_trivial"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama", choices=sorted(MODELS))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    opts = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = MODELS[opts.model](1024, opts.dim, 8, opts.layers, 128).to(device, getattr(torch, opts.dtype))
    batch = tuple(torch.randint(0, 1024, (2, 128), device=device) for _ in range(2))
    fn = thunderlite.jit(model, executors=["torchcompile", "torch"])
    _step(fn, torch.optim.SGD(model.parameters(), lr=1e-3), batch)
    print(f"{opts.model} {opts.dtype} {opts.layers} layers on {device}")
    for direction, trace in (("forward", thunderlite.last_traces(fn)[-1]),
                             ("backward", thunderlite.last_backward_traces(fn)[-1])):
        regions = [b for b in trace.bound_symbols if Tag.FUSION in b.sym.tags]
        between = collections.Counter(b.sym.name for b in trace.bound_symbols
                                      if Tag.FUSION not in b.sym.tags and b.sym.name not in _GLUE)
        print(f"  {direction}: {len(regions)} regions ({sum(len(b.subsymbols) for b in regions)} symbols inside), "
              f"{sum(between.values())} calls between them: {dict(between.most_common())}")


if __name__ == "__main__":
    main()
