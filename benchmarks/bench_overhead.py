"""Call overhead and compile time: thunderlite against eager and torch.compile
(Inductor), measured in one run and printed as ratios to eager.

    python benchmarks/bench_overhead.py [--quick] [--no-inductor]

Cases:
  tiny      ``(a*b+1).sin().sum()`` on 8 elements, cached call
  mlp       a 3-layer MLP on a (4, 64) batch under no_grad, cached call
  gpt       the demo's 2-layer GPT forward under no_grad, cached call
  first     the first call (trace + compile) of the tiny function, against
            eager's first call and torch.compile's

Cached calls are timed in interleaved rounds (eager, thunderlite, Inductor,
each ``number`` calls, in turn) after warming each, and reported as the median
of the per-round times and of the per-round ratios to eager: load that drifts
on a shared machine moves all three within a round and cancels in the ratio.
Targets: tiny cached call <= 1.10x eager, first call <= 1.0 ms.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import thunderlite
from thunderlite.demo import GPT, GPTConfig


def tiny(a, b):
    return (a * b + 1).sin().sum()


def _loop_seconds(fn: Callable, args: tuple, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn(*args)
    return time.perf_counter() - start


def paired_us(variants: dict[str, Callable], args: tuple, number: int, rounds: int) -> dict[str, tuple[float, float]]:
    """name -> (median µs per call, median per-round ratio to the first variant)."""
    for fn in variants.values():
        for _ in range(max(3, number // 10)):
            fn(*args)
    times: dict[str, list[float]] = {name: [] for name in variants}
    gc.disable()
    try:
        for _ in range(rounds):
            for name, fn in variants.items():
                times[name].append(_loop_seconds(fn, args, number) / number * 1e6)
    finally:
        gc.enable()
    base = next(iter(times.values()))
    return {name: (statistics.median(t), statistics.median(x / b for x, b in zip(t, base, strict=True)))
            for name, t in times.items()}


def inductor(fn: Callable) -> Callable | None:
    try:
        return torch.compile(fn, backend="inductor")
    except Exception as e:  # noqa: BLE001 - reported, not fatal: the other columns still mean something
        print(f"  torch.compile unavailable: {e}")
        return None


def row(name: str, eager_fn: Callable, args: tuple, number: int, rounds: int, use_inductor: bool) -> dict:
    # the fast tier's overhead: a hot tier (compiled after 20 calls) would swap in mid-measurement
    variants = {"eager": eager_fn, "thunderlite": thunderlite.jit(eager_fn, tiering=False)}
    if use_inductor:
        compiled = inductor(eager_fn)
        if compiled is not None:
            try:
                compiled(*args)
                variants["inductor"] = compiled
            except Exception as e:  # noqa: BLE001 - a C++ toolchain may be missing on the machine
                print(f"  inductor failed on {name}: {type(e).__name__}")
    res = paired_us(variants, args, number, rounds)
    line = f"{name:6s} eager {res['eager'][0]:9.2f} us"
    for v in ("thunderlite", "inductor"):
        if v in res:
            line += f" | {v} {res[v][0]:9.2f} us ({res[v][1]:5.2f}x)"
    print(line, flush=True)
    return res


def _fresh_tiny(i: int = 0) -> Callable:
    """A new function with a code object of its own (as a new program has):
    caches keyed by code object (the interpreter's decoding, dynamo's) start empty."""
    ns: dict = {}
    exec(compile("def fresh(a, b):\n    return (a * b + 1).sin().sum()\n", f"<tiny {i}>", "exec"), ns)
    return ns["fresh"]


def first_calls_ms(samples: int, use_inductor: bool) -> dict[str, float]:
    """Median first-call time (ms) of fresh copies of ``tiny``: eager, thunderlite,
    and torch.compile (three samples: each compiles for a while, and last, so
    its compile workers do not share the CPU with the others' samples)."""
    variants = [("eager", lambda f: f, samples), ("thunderlite", thunderlite.jit, samples)]
    if use_inductor:
        variants.append(("inductor", lambda f: torch.compile(f, backend="inductor"), min(samples, 3)))
    out: dict[str, float] = {}
    for name, wrap, n in variants:
        times = []
        for i in range(n):
            fn = wrap(_fresh_tiny(i))
            args = (torch.randn(8), torch.randn(8))
            start = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - start) * 1e3)
        out[name] = statistics.median(times)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    p.add_argument("--no-inductor", action="store_true")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads (1 keeps timings stable on a shared machine)")
    opts = p.parse_args(argv)
    torch.set_num_threads(opts.threads)
    number, rounds = (500, 20) if opts.quick else (2000, 40)
    use_ind = not opts.no_inductor
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; cached calls: median of "
          f"{rounds} interleaved rounds")
    # warm the imports and caches a first call pays once per process (not per function)
    thunderlite.jit(_fresh_tiny())(torch.randn(8), torch.randn(8))
    first = first_calls_ms(5 if opts.quick else 15, use_ind)
    a, b = torch.randn(8), torch.randn(8)
    row("tiny", tiny, (a, b), number, rounds, use_ind)
    mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    with torch.no_grad():
        row("mlp", mlp, (torch.randn(4, 64),), number // 4, rounds, use_ind)
        gpt = GPT(GPTConfig()).eval()
        idx = torch.randint(0, 128, (2, 32))
        row("gpt", gpt, (idx,), max(number // 40, 10), rounds, use_ind)
    line = (f"first  eager {first['eager'] * 1e3:9.2f} us | thunderlite {first['thunderlite']:6.2f} ms "
            "(trace + compile)")
    if "inductor" in first:
        line += f" | inductor {first['inductor']:8.1f} ms"
    print(line + "   (targets: tiny <= 1.10x eager, first call <= 1.0 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
