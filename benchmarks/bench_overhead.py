"""Call overhead and compile time: thunderlite against eager and torch.compile
(Inductor), measured in one run and printed as ratios to eager.

    python benchmarks/bench_overhead.py [--quick] [--no-inductor]

Cases:
  tiny      ``(a*b+1).sin().sum()`` on 8 elements, cached call
  mlp       a 3-layer MLP on a (4, 64) batch under no_grad, cached call
  gpt       the demo's 2-layer GPT forward under no_grad, cached call
  first     the first call (trace + compile) of the tiny function
Targets (issue 4): tiny <= 1.5x eager, first call <= 15 ms.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import thunderlite  # noqa: E402
from thunderlite.demo import GPT, GPTConfig  # noqa: E402


def tiny(a, b):
    return (a * b + 1).sin().sum()


def per_call_us(fn, args, number: int, repeat: int) -> float:
    """Best-of-``repeat`` mean time per call, in microseconds."""
    for _ in range(3):
        fn(*args)
    best = float("inf")
    gc.disable()
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                fn(*args)
            best = min(best, (time.perf_counter() - start) / number)
    finally:
        gc.enable()
    return best * 1e6


def first_call_ms(make_args, samples: int) -> float:
    """Median first-call time of freshly jitted copies of ``tiny``."""
    times = []
    for i in range(samples):
        def fresh(a, b):
            return (a * b + 1).sin().sum()
        jf = thunderlite.jit(fresh)
        args = make_args()
        start = time.perf_counter()
        jf(*args)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def inductor(fn):
    try:
        return torch.compile(fn, backend="inductor")
    except Exception as e:  # reported, not fatal: the other columns still mean something
        print(f"  torch.compile unavailable: {e}")
        return None


def row(name: str, eager_fn, args, number: int, repeat: int, use_inductor: bool) -> None:
    jitted = thunderlite.jit(eager_fn)
    eager_us = per_call_us(eager_fn, args, number, repeat)
    jit_us = per_call_us(jitted, args, number, repeat)
    line = f"{name:6s} eager {eager_us:9.2f} us | thunderlite {jit_us:9.2f} us ({jit_us / eager_us:5.2f}x)"
    if use_inductor:
        compiled = inductor(eager_fn)
        if compiled is not None:
            try:
                ind_us = per_call_us(compiled, args, number, repeat)
                line += f" | inductor {ind_us:9.2f} us ({ind_us / eager_us:5.2f}x)"
            except Exception as e:  # a C++ toolchain may be missing on the machine
                line += f" | inductor failed: {type(e).__name__}"
    print(line, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer iterations")
    p.add_argument("--no-inductor", action="store_true")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads (1 keeps timings stable on a shared machine)")
    opts = p.parse_args(argv)
    torch.set_num_threads(opts.threads)
    number, repeat = (2000, 5) if opts.quick else (20000, 7)
    use_ind = not opts.no_inductor
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    a, b = torch.randn(8), torch.randn(8)
    row("tiny", tiny, (a, b), number, repeat, use_ind)
    mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    with torch.no_grad():
        row("mlp", mlp, (torch.randn(4, 64),), number // 4, repeat, use_ind)
        gpt = GPT(GPTConfig()).eval()
        idx = torch.randint(0, 128, (2, 32))
        row("gpt", gpt, (idx,), max(number // 40, 20), repeat, use_ind)
    ms = first_call_ms(lambda: (torch.randn(8), torch.randn(8)), samples=5 if opts.quick else 15)
    print(f"first  thunderlite first call (trace + compile) of tiny: {ms:.2f} ms (target <= 15 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
