"""Fusion executors against Inductor, one run, ratios (issue 10).

Workloads, each timed in the same run for eager PyTorch, ``torch.compile``
(Inductor) and thunderlite with a fusion executor ahead of torch:

- ``chain``: a 1M-element elementwise chain (8 ops);
- ``gpt_block``: one GPT block forward (LayerNorm, attention, MLP), no grad;
- ``first_call``: a GPT's first call (trace + compile) with 2 and 8 layers,
  each in a fresh process with an empty Inductor cache, for thunderlite with
  torchcompile (best of two interleaved rounds); regions of the same structure
  share one compiled artifact, so 8 layers should cost well under 2x of 2 layers.

The target is thunderlite/torchcompile <= 1.05x Inductor's time. Other fusion
executors are measured when registered and available: add their names to
``FUSION_EXECUTORS``. The triton executor is timed on a GPU only: on CPU its
kernels run under Triton's interpreter, a correctness tool, not a speed one, so
there its row only checks one call against eager and says so. Workloads run
on CUDA when a GPU is present.

    python benchmarks/bench_fusion.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import thunderlite
from thunderlite.demo import Block, GPTConfig
from thunderlite.extend import get_all_executors

FUSION_EXECUTORS = ["torchcompile", "triton"]      # measured when registered and available


def chain(a, b):
    return (((a * b + 1.0).sin() * 2.0 - a).exp() * 0.5).tanh() + b


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def best_ms(runners: dict, args, iters: int, repeat: int) -> dict:
    """name -> best (over ``repeat`` rounds) mean time per call of ``iters``
    calls, in ms. Rounds interleave the runners in a shuffled order, so load
    from other processes and cache effects hit them alike."""
    best = {name: float("inf") for name in runners}
    with torch.no_grad():
        for fn in runners.values():
            for _ in range(3):
                fn(*args)
        order = list(runners)
        for r in range(repeat):
            random.Random(r).shuffle(order)          # no runner always follows the same one
            for name in order:
                fn = runners[name]
                _sync()
                start = time.perf_counter()
                for _ in range(iters):
                    fn(*args)
                _sync()
                best[name] = min(best[name], (time.perf_counter() - start) / iters * 1e3)
    return best


def _available(name: str) -> tuple[bool, str]:
    found = [ex for ex in get_all_executors() if ex.name == name]
    if not found:
        return False, "not registered"
    return found[0].is_available()


def _interpreter_check(fn, args) -> str:
    """On CPU the triton executor is not timed: one call under the interpreter, checked against eager."""
    jfn = thunderlite.jit(fn, executors=["triton", "torch"])
    with torch.no_grad():
        got, want = jfn(*args), fn(*args)
    try:
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        verdict = "equal to eager"
    except AssertionError as e:
        verdict = f"DIFFERS from eager: {str(e).splitlines()[0]}"
    kernels = thunderlite.kernel_source(jfn).count("\ndef fusion_")
    return (f"not timed: on CPU the Triton interpreter is a correctness tool, not a speed one "
            f"(one interpreted call, {kernels} generated kernels: {verdict}; timed on a GPU)")


def workload_rows(name: str, fn, args, iters: int, repeat: int) -> list[dict]:
    runners = {"eager": fn, "inductor": torch.compile(fn)}
    skipped = {}
    for ex in FUSION_EXECUTORS:
        ok, reason = _available(ex)
        if ok and ex == "triton" and DEVICE == "cpu":
            skipped[f"thunderlite[{ex}]"] = _interpreter_check(fn, args)
        elif ok:
            runners[f"thunderlite[{ex}]"] = thunderlite.jit(fn, executors=[ex, "torch"])
        else:
            skipped[f"thunderlite[{ex}]"] = reason
    ms = best_ms(runners, args, iters, repeat)
    eager, inductor = ms["eager"], ms["inductor"]
    rows = [{"workload": name, "runner": "eager", "ms": eager},
            {"workload": name, "runner": "inductor", "ms": inductor}]
    for runner in runners:
        if runner.startswith("thunderlite["):
            rows.append({"workload": name, "runner": runner, "ms": ms[runner], "vs_inductor": ms[runner] / inductor,
                         "vs_eager": ms[runner] / eager})
    rows += [{"workload": name, "runner": r, "skipped": why} for r, why in skipped.items()]
    return rows


def first_call_seconds(n_layer: int) -> float:
    """A GPT's first call (trace + compile) with torchcompile, in a fresh
    process with an empty Inductor cache."""
    code = (
        "import time, torch, thunderlite\n"
        "from thunderlite.demo import GPT, GPTConfig\n"
        "torch.manual_seed(0)\n"
        f"m = GPT(GPTConfig(n_layer={n_layer}, n_embd=128, block_size=64)).eval()\n"
        "idx = torch.randint(0, 128, (4, 64))\n"
        "j = thunderlite.jit(m, executors=['torchcompile', 'torch'])\n"
        "t = time.perf_counter()\n"
        "with torch.no_grad():\n"
        "    out = j(idx)\n"
        "dt = time.perf_counter() - t\n"
        "with torch.no_grad():\n"
        "    torch.testing.assert_close(out, m(idx))\n"
        "print(dt)\n")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return float(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer iterations (noisier)")
    p.add_argument("--json", help="also write the rows to this file")
    opts = p.parse_args(argv)
    iters, repeat = (5, 3) if opts.quick else (20, 9)
    torch.manual_seed(0)
    a, b = torch.randn(1_000_000, device=DEVICE), torch.randn(1_000_000, device=DEVICE)
    cfg = GPTConfig(n_embd=256, n_head=8, block_size=128)
    block = Block(cfg).eval().to(DEVICE)
    x = torch.randn(8, 128, 256, device=DEVICE)
    rows = workload_rows("chain 1M", chain, (a, b), iters, repeat)
    rows += workload_rows("gpt block fwd", block, (x,), iters, repeat)
    print(f"device: {DEVICE}, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}")
    print(f"{'workload':<16} {'runner':<28} {'ms':>9} {'x inductor':>11} {'x eager':>8}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['workload']:<16} {r['runner']:<28} skipped: {r['skipped']}")
            continue
        vi = f"{r['vs_inductor']:.3f}" if "vs_inductor" in r else ""
        ve = f"{r['vs_eager']:.3f}" if "vs_eager" in r else ""
        print(f"{r['workload']:<16} {r['runner']:<28} {r['ms']:9.3f} {vi:>11} {ve:>8}")
    ok, reason = _available("torchcompile")
    if ok:
        rounds = 1 if opts.quick else 2          # interleaved, best of: the machine's load varies
        t2 = t8 = float("inf")
        for _ in range(rounds):
            t2, t8 = min(t2, first_call_seconds(2)), min(t8, first_call_seconds(8))
        rows.append({"workload": "gpt first call", "runner": "thunderlite[torchcompile]", "layers2_s": t2,
                     "layers8_s": t8, "ratio": t8 / t2})
        print(f"gpt first call   thunderlite[torchcompile]: 2 layers {t2:.2f}s, 8 layers {t8:.2f}s, "
              f"ratio {t8 / t2:.2f}x (target < 2x)")
    else:
        print(f"gpt first call skipped: torchcompile unavailable ({reason})")
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
