"""Kernels and training steps on the GPU: eager, Inductor and thunderlite,
each thunderlite variant with and without CUDA graphs.

    python benchmarks/bench_gpu.py [--dtype bfloat16] [--only kernels|models] [--budget 300]
    python benchmarks/bench_gpu.py --device cpu --smoke      # tiny sizes: checks it runs, times nothing useful

Kernels (forward, and forward + backward): softmax, layer_norm, rms_norm,
bias + GELU, cross-entropy over a 32k vocabulary, causal attention. Training
steps (forward, backward, SGD step): the nanoGPT and HF Llama of
bench_training.py (GPT: 6 layers, d=768; Llama: 8 layers, d=1024, 16 query
and 4 key/value heads; batch 8 x 512). Variants: ``eager``, ``inductor``
(torch.compile), ``inductor-ro`` (``mode="reduce-overhead"``: Inductor with
its CUDA graphs), ``tl`` (thunderlite's default executors), ``tl-triton``
(generated Triton kernels first), ``tl-tc`` (torchcompile regions first), and
each ``tl`` variant with ``+cg`` (``cudagraphs=True``).

Every variant is checked against eager (outputs and gradients; a step's loss
and gradients from the same parameters) before it is timed; a mismatch or an
error is printed and the variant is not timed. Times are medians over
``--iters`` calls after warm-up (CUDA synchronised), one run; ratios are
eager's time over the variant's (above 1: faster than eager). ``--budget``
bounds each section's seconds: variants past it are reported as skipped.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # this checkout's thunderlite
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import LlamaLoss, NanoGPT

import thunderlite

VARIANTS = ("eager", "inductor", "inductor-ro", "tl", "tl+cg", "tl-triton", "tl-triton+cg", "tl-tc", "tl-tc+cg")
_EXECUTORS = {"tl": None, "tl-triton": ["triton", "torch"], "tl-tc": ["torchcompile", "torch"]}


def make_variant(name: str, fn: Callable) -> Callable:
    if name == "eager":
        return fn
    if name == "inductor":
        return torch.compile(fn)
    if name == "inductor-ro":
        return torch.compile(fn, mode="reduce-overhead")
    base, _, cg = name.partition("+")
    return thunderlite.jit(fn, executors=_EXECUTORS[base], cudagraphs=bool(cg))


# --- kernels -----------------------------------------------------------------------------------------------

def kernel_cases(device: str, dtype: torch.dtype, smoke: bool) -> dict[str, tuple[Callable, list]]:
    """name -> (function, inputs); inputs that require grad get gradients."""
    rows, d, vocab = (64, 32, 128) if smoke else (8192, 4096, 32000)
    b, h, t, e = (2, 2, 16, 16) if smoke else (8, 16, 512, 64)
    ce_rows = 64 if smoke else 4096

    def t_(*shape, grad=True, scale=1.0):
        return (torch.randn(shape, device=device, dtype=dtype) * scale).requires_grad_(grad)
    w, bias = t_(d), t_(d)
    return {
        "softmax": (lambda x: torch.softmax(x, -1), [t_(rows, d)]),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b), [t_(rows, d), w, bias]),
        "rms_norm": (lambda x, w: F.rms_norm(x, (x.shape[-1],), w), [t_(rows, d), w]),
        "bias_gelu": (lambda x, b: F.gelu(x + b, approximate="tanh"), [t_(rows, d), bias]),
        "cross_entropy": (lambda x, y: F.cross_entropy(x.float(), y),
                          [t_(ce_rows, vocab), torch.randint(0, vocab, (ce_rows,), device=device)]),
        "attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                      [t_(b, h, t, e), t_(b, h, t, e), t_(b, h, t, e)]),
    }


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(call: Callable, device: str, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        call()
    _sync(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        call()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _close(got, want, what: str, dtype: torch.dtype) -> str | None:
    """None when ``got`` matches ``want`` within tolerance relative to the
    reference's largest magnitude (5% in half precision, where kernels that
    accumulate differently part by a few roundings), else what differs."""
    tol = 5e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4
    got, want = got.detach().double(), want.detach().double()
    if got.shape != want.shape:
        return f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item()
    scale = max(want.abs().max().item(), 1e-6)
    return None if err <= tol * scale else f"{what}: max abs error {err:.3g} (scale {scale:.3g})"


def _grads(fn, inputs, seed_grad):
    out = fn(*inputs)
    leaves = [x for x in inputs if x.requires_grad]
    return out, torch.autograd.grad(out, leaves, seed_grad)


def bench_kernels(opts, dtype) -> None:
    print(f"\n== kernels ({opts.device}, {dtype}): median ms, ratio = eager / variant ==", flush=True)
    print(f"{'kernel':<14}{'variant':<14}{'fwd ms':>9}{'fwd+bwd ms':>12}{'fwd x':>8}{'f+b x':>8}  note")
    deadline = time.perf_counter() + opts.budget
    for name, (fn, inputs) in kernel_cases(opts.device, dtype, opts.smoke).items():
        g = torch.randn_like(fn(*inputs))
        want_out, want_grads = _grads(fn, inputs, g)
        base = None
        for variant in opts.variants:
            if time.perf_counter() > deadline:
                print(f"{name:<14}{variant:<14}  skipped: section budget of {opts.budget} s spent", flush=True)
                continue
            try:
                vfn = make_variant(variant, fn)
                out, grads = _grads(vfn, inputs, g)
                bad = _close(out, want_out, "output", dtype) or next(
                    (m for i, (a, b) in enumerate(zip(grads, want_grads, strict=True))
                     if (m := _close(a, b, f"grad {i}", dtype))), None)
                if bad:
                    print(f"{name:<14}{variant:<14}  MISMATCH against eager, not timed: {bad}", flush=True)
                    continue
                with torch.no_grad():
                    fwd = time_ms(lambda: vfn(*inputs), opts.device, opts.iters)
                both = time_ms(lambda: _grads(vfn, inputs, g), opts.device, opts.iters)
            except Exception as e:      # noqa: BLE001 -- a failing variant is reported, the others still run
                print(f"{name:<14}{variant:<14}  ERROR: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            base = base or (fwd, both)
            print(f"{name:<14}{variant:<14}{fwd:9.3f}{both:12.3f}{base[0] / fwd:8.2f}{base[1] / both:8.2f}",
                  flush=True)


# --- training steps ----------------------------------------------------------------------------------------

def model_cases(opts) -> dict[str, Callable[[], torch.nn.Module]]:
    if opts.smoke:
        return {"gpt": lambda: NanoGPT(128, 32, 4, 2, 16), "llama": lambda: LlamaLoss(128, 64, 4, 2, 16, kv_heads=2)}
    return {"gpt": lambda: NanoGPT(32000, 768, 12, 6, 512),
            "llama": lambda: LlamaLoss(32000, 1024, 16, 8, 512, kv_heads=4)}


def _step(fn, model, opt, batch):
    opt.zero_grad(set_to_none=True)
    loss = fn(*batch)
    loss.backward()
    opt.step()
    return loss


def _step_check(fn, model, ref, batch, dtype) -> str | None:
    """One forward and backward from the same parameters as eager's ``ref``:
    loss and every gradient, relative to the gradient's magnitude."""
    loss = fn(*batch)
    loss.backward()
    want = ref(*batch)
    want.backward()
    bad = _close(loss, want, "loss", dtype)
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        bad = bad or _close(p.grad, q.grad, f"grad {n}", dtype)
    model.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    return bad


def bench_models(opts, dtype) -> None:
    print(f"\n== training steps ({opts.device}, {dtype}): median ms per step, ratio = eager / variant ==", flush=True)
    print(f"{'model':<8}{'variant':<14}{'first s':>9}{'ms':>10}{'x':>8}  note")
    batch_shape = (2, 16) if opts.smoke else (8, 512)
    for kind, make in model_cases(opts).items():
        deadline = time.perf_counter() + opts.budget
        torch.manual_seed(0)
        base_model = make().to(opts.device, dtype)
        vocab = 128 if opts.smoke else 32000
        batch = tuple(torch.randint(0, vocab, batch_shape, device=opts.device) for _ in range(2))
        base = None
        for variant in opts.variants:
            if time.perf_counter() > deadline:
                print(f"{kind:<8}{variant:<14}  skipped: section budget of {opts.budget} s spent", flush=True)
                continue
            model = copy.deepcopy(base_model)
            try:
                fn = make_variant(variant, model)
                start = time.perf_counter()
                bad = _step_check(fn, model, copy.deepcopy(base_model), batch, dtype)
                first = time.perf_counter() - start
                if bad:
                    print(f"{kind:<8}{variant:<14}  MISMATCH against eager, not timed: {bad}", flush=True)
                    continue
                opt = torch.optim.SGD(model.parameters(), lr=1e-4)
                ms = time_ms(lambda: _step(fn, model, opt, batch), opts.device, opts.steps)
            except Exception as e:      # noqa: BLE001 -- a failing variant is reported, the others still run
                print(f"{kind:<8}{variant:<14}  ERROR: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            base = base or ms
            print(f"{kind:<8}{variant:<14}{first:9.1f}{ms:10.2f}{base / ms:8.2f}", flush=True)
        del base_model
        if opts.device == "cuda":
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--only", choices=["kernels", "models"], default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--iters", type=int, default=20, help="timed calls per kernel")
    ap.add_argument("--steps", type=int, default=10, help="timed training steps per model")
    ap.add_argument("--budget", type=float, default=240, help="seconds per section (kernels; each model)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and few iterations: checks that it runs")
    opts = ap.parse_args()
    opts.variants = opts.variants.split(",")
    unknown = set(opts.variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    if opts.smoke:
        opts.iters, opts.steps = min(opts.iters, 2), min(opts.steps, 2)
    dtype = getattr(torch, opts.dtype or ("bfloat16" if opts.device == "cuda" else "float32"))
    env = f"torch {torch.__version__}"
    if opts.device == "cuda":
        env += f", {torch.cuda.get_device_name()}, cuDNN {torch.backends.cudnn.version()}"
    print(f"bench_gpu: {env}; variants {', '.join(opts.variants)}", flush=True)
    if opts.only in (None, "models"):
        bench_models(opts, dtype)
    if opts.only in (None, "kernels"):
        bench_kernels(opts, dtype)


if __name__ == "__main__":
    main()
