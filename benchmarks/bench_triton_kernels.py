"""Generated Triton kernels against eager PyTorch and Inductor, per kernel family,
forward (no grad) and forward + backward (issue 27).

Families: an elementwise chain, softmax, log_softmax, layer_norm, a hand-written
RMSNorm, bias + GELU, SwiGLU's SiLU product, cross-entropy over 32k and 128k
vocabularies. Each is timed for eager, ``torch.compile`` (Inductor) and
``thunderlite.jit(fn, executors=["triton", "torch"])`` in the same process,
interleaved, best of several rounds (CUDA events). The first call of each runner
is outside the timing: it compiles, and for the triton executor autotunes
(triton/autotune.py; its choices are cached on disk, so a second run starts warm).
Ratios are runner time over Inductor's (the target: <= 1.05).

CUDA only: on a CPU the kernels run under Triton's interpreter, a correctness
tool, so this prints why it times nothing and exits 0.

    python benchmarks/bench_triton_kernels.py [--quick] [--dtype bfloat16] [--only softmax,layer_norm] [--json F]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import thunderlite
from thunderlite.extend import get_all_executors


def _rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _chain(a, b):
    return (((a * b + 1.0).sin() * 2.0 - a).exp() * 0.5).tanh() + b


FAMILIES = {
    # name: (fn, shapes of the float inputs; "target:<classes>" for class indices)
    "chain": (_chain, [(1 << 24,), (1 << 24,)]),
    "softmax": (lambda x: torch.softmax(x, -1), [(8192, 2048)]),
    "log_softmax": (lambda x: F.log_softmax(x, -1), [(8192, 2048)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (1024,), w, b), [(16384, 1024), (1024,), (1024,)]),
    "rms_norm": (_rms_norm, [(16384, 1024), (1024,)]),
    "bias_gelu": (lambda x, b: F.gelu(x + b), [(8192, 4096), (4096,)]),
    "silu_mul": (lambda a, b: F.silu(a) * b, [(8192, 4096), (8192, 4096)]),
    "cross_entropy_32k": (lambda x, t: F.cross_entropy(x, t), [(4096, 32000), "target:32000"]),
    "cross_entropy_128k": (lambda x, t: F.cross_entropy(x, t), [(1024, 128256), "target:128256"]),
}


def _inputs(shapes, dtype, grad: bool) -> list:
    out = []
    for s in shapes:
        if isinstance(s, str):
            out.append(torch.randint(0, int(s.split(":")[1]), (shapes[0][0],), device="cuda"))
        else:
            out.append(torch.randn(*s, device="cuda", dtype=dtype).requires_grad_(grad))
    return out


def _step(fn, grad: bool):
    """One timed call: the forward, or the forward and its backward."""
    def run(*args):
        if not grad:
            with torch.no_grad():
                return fn(*args)
        out = fn(*args)
        out.backward(torch.ones_like(out))
        return out
    return run


def best_ms(runners: dict, args, iters: int, repeat: int) -> dict:
    """name -> best (over ``repeat`` interleaved rounds) mean ms of ``iters`` calls."""
    best = {name: float("inf") for name in runners}
    for fn in runners.values():          # compile, autotune, warm up
        for _ in range(2):
            fn(*args)
    order = list(runners)
    for r in range(repeat):
        random.Random(r).shuffle(order)
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(iters):
                runners[name](*args)
            end.record()
            torch.cuda.synchronize()
            best[name] = min(best[name], start.elapsed_time(end) / iters)
    return best


def _kernels(jfn) -> int:
    return thunderlite.kernel_source(jfn).count("\ndef fusion_")


def family_rows(name: str, dtype, iters: int, repeat: int) -> list[dict]:
    fn, shapes = FAMILIES[name]
    rows = []
    for grad in (False, True):
        args = _inputs(shapes, dtype, grad)
        jfn = thunderlite.jit(fn, executors=["triton", "torch"])
        runners = {"eager": _step(fn, grad), "inductor": _step(torch.compile(fn), grad),
                   "thunderlite[triton]": _step(jfn, grad)}
        ms = best_ms(runners, args, iters, repeat)
        rows.append({"family": name, "pass": "fwd+bwd" if grad else "fwd", "eager_ms": ms["eager"],
                     "inductor_ms": ms["inductor"], "triton_ms": ms["thunderlite[triton]"],
                     "vs_inductor": ms["thunderlite[triton]"] / ms["inductor"],
                     "vs_eager": ms["thunderlite[triton]"] / ms["eager"], "kernels": _kernels(jfn)})
        r = rows[-1]
        print(f"{name:<20} {r['pass']:<8} {r['eager_ms']:9.3f} {r['inductor_ms']:9.3f} {r['triton_ms']:9.3f} "
              f"{r['vs_inductor']:9.2f} {r['vs_eager']:8.2f} {r['kernels']:8d}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer iterations (noisier)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--only", help="comma-separated families (default: all)")
    p.add_argument("--json", help="also write the rows to this file")
    opts = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: no CUDA device; the Triton executor's kernels run under the interpreter on a CPU, "
              "a correctness tool (thunderlite/tests/test_triton_kernels.py), not a speed one")
        return 0
    ok, why = next(ex for ex in get_all_executors() if ex.name == "triton").is_available()
    if not ok:
        print(f"skipped: the triton executor is unavailable: {why}")
        return 0
    iters, repeat = (5, 3) if opts.quick else (20, 7)
    dtype = getattr(torch, opts.dtype)
    names = opts.only.split(",") if opts.only else list(FAMILIES)
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, dtype {opts.dtype}")
    print(f"{'family':<20} {'pass':<8} {'eager ms':>9} {'ind. ms':>9} {'triton ms':>9} {'x induct':>9} "
          f"{'x eager':>8} {'kernels':>8}")
    rows = []
    for name in names:
        try:
            rows += family_rows(name, dtype, iters, repeat)
        except Exception as e:      # noqa: BLE001 - report the family and go on with the others
            print(f"{name:<20} FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            rows.append({"family": name, "error": f"{type(e).__name__}: {e}"})
        torch.cuda.empty_cache()
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
