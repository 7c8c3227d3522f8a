"""ThunderFX: thunderlite as a torch.compile backend, against the Inductor
backend and eager, measured in one run and printed as ratios to eager.

    python benchmarks/bench_thunderfx.py [--quick] [--threads N]

Cases (all cached calls, no_grad unless noted):
  tiny        ``(a*b+1).sin().sum()`` on 8 elements: the per-call overhead of
              each backend (dynamo's guards + the backend's own call path)
  gpt block   one transformer block of the demo GPT on a (4, 32, 64) input
  gpt train   forward + backward of the same block (grad on)
Compile: the first call of each (dynamo trace + backend compile).
Variants are interleaved round by round and the median of the rounds kept.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._dynamo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from thunderlite.demo import Block, GPTConfig
from thunderlite.dynamo import ThunderCompiler


def tiny(a, b):
    return (a * b + 1).sin().sum()


def _time(fn, args, number: int) -> float:
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(number):
            fn(*args)
        return (time.perf_counter() - start) / number
    finally:
        gc.enable()


def _variants(fn):
    return {
        "eager": lambda: fn,
        "inductor": lambda: torch.compile(fn, backend="inductor"),
        "thunderlite": lambda: torch.compile(fn, backend=ThunderCompiler()),
        "thunderlite+torchcompile": lambda: torch.compile(fn, backend=ThunderCompiler(
            executors=["torchcompile", "torch"])),
    }


def case(name: str, fn, args, number: int, rounds: int, grad: bool = False) -> None:
    """One row: every variant's median time per call and its first-call time."""
    def step(f):
        if grad:
            f(*args).sum().backward()
            return
        with torch.no_grad():
            f(*args)

    runners, first_ms = {}, {}
    for label, make in _variants(fn).items():
        torch._dynamo.reset()
        try:
            f = make()
            start = time.perf_counter()
            step(f)
            first_ms[label] = (time.perf_counter() - start) * 1e3
        except Exception as e:  # noqa: BLE001 - a missing C++ toolchain, say: the other columns still mean something
            print(f"  {name}: {label} unavailable ({type(e).__name__}: {str(e)[:80]})")
            continue
        runners[label] = lambda f=f: step(f)
    for r in runners.values():
        for _ in range(3):
            r()
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(rounds):
        for k, r in runners.items():
            samples[k].append(_time(r, (), number))
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    base = med["eager"]
    print(f"{name:10s} " + " | ".join(f"{k} {v:9.1f} us ({v / base:5.2f}x)" for k, v in med.items()))
    print(f"{'':10s} first call: " + " | ".join(f"{k} {v:8.1f} ms" for k, v in first_ms.items()
                                               if k != "eager"), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer iterations")
    p.add_argument("--threads", type=int, default=1)
    opts = p.parse_args(argv)
    torch.set_num_threads(opts.threads)
    rounds = 5 if opts.quick else 11
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); ratios are to eager, "
          f"medians of {rounds} interleaved rounds")
    case("tiny", tiny, (torch.randn(8), torch.randn(8)), 500 if opts.quick else 3000, rounds)
    cfg = GPTConfig()
    block = Block(cfg)
    x = torch.randn(4, cfg.block_size, cfg.n_embd)
    case("gpt block", block, (x,), 10 if opts.quick else 40, rounds)
    case("gpt train", block, (x.clone().requires_grad_(),), 5 if opts.quick else 20, rounds, grad=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
