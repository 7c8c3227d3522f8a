"""Training-step time and peak memory: eager vs thunderlite.jit vs torch.compile
(Inductor), in the same run, on a nanoGPT-style model.

    python benchmarks/bench_training.py [--steps 10] [--layers 4] [--dim 256] [--seq 128] [--batch 8]

A step is forward + backward + SGD step. Time: median wall time of ``--steps``
steps after warm-up (compilation excluded), and the median CPU time of the
process over a step (all threads; steadier than wall time on a shared machine).

Peak memory on CPU: each variant runs in its own subprocess; after warm-up the
kernel's high-water mark of resident memory is reset (``/proc/self/clear_refs``)
and one step runs; the number is the high-water mark (VmHWM) minus the resident
size at the reset, i.e. the peak of activations, saved tensors, gradients and
temporaries above the parameters. glibc's mmap threshold is pinned
(``MALLOC_MMAP_THRESHOLD_``) so large tensors are mapped and unmapped one by
one and resident size follows live tensor bytes (PyTorch has no CPU allocator
statistics, and torch.profiler's memory events miss frees inside ops). On CUDA
the number is ``torch.cuda.max_memory_allocated`` above the allocation at the
start of the step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import thunderlite


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, ctx: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def _step(fn, model, opt, batch):
    opt.zero_grad(set_to_none=True)
    loss = fn(*batch)
    loss.backward()
    opt.step()
    return loss


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} is not in /proc/self/status")


def peak_step_bytes(fn, model, opt, batch) -> int:
    """Peak memory of one step above its start (see module docstring)."""
    if batch[0].is_cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        _step(fn, model, opt, batch)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _proc_status("VmRSS")
    _step(fn, model, opt, batch)
    return _proc_status("VmHWM") - base


def measure(name: str, fn, model, batch, steps: int) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(2):                          # warm-up: tracing / compilation happens here
        _step(fn, model, opt, batch)
    times, cpu = [], []
    for _ in range(steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        _step(fn, model, opt, batch)
        if batch[0].is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    peak = min(peak_step_bytes(fn, model, opt, batch) for _ in range(3))
    return {"name": name, "ms": statistics.median(times) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3,
            "peak_mb": peak / 2**20}


def run_variant(name: str, opts) -> dict:
    if opts.threads:
        torch.set_num_threads(opts.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = NanoGPT(opts.vocab, opts.dim, opts.heads, opts.layers, opts.seq).to(device)
    g = torch.Generator().manual_seed(1)
    batch = tuple(torch.randint(0, opts.vocab, (opts.batch, opts.seq), generator=g).to(device) for _ in range(2))
    fn = {"eager": lambda m: m, "thunderlite": thunderlite.jit, "torch.compile": torch.compile}[name](model)
    return measure(name, fn, model, batch, opts.steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.variant:
        print(json.dumps(run_variant(opts.variant, opts)))
        return
    names = ["eager", "thunderlite"] + ([] if opts.no_inductor else ["torch.compile"])
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    rows = []
    for name in names:
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", name], env=env,
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"nanoGPT layers={opts.layers} dim={opts.dim} seq={opts.seq} batch={opts.batch} on {device}, "
          f"torch {torch.__version__}, threads {opts.threads or torch.get_num_threads()}; "
          "step = forward + backward + SGD")
    print(f"{'':<14}{'step ms':>10}{'cpu ms':>10}{'peak MB':>10}{'time/eager':>12}{'cpu/eager':>11}{'mem/eager':>11}")
    for r in rows:
        print(f"{r['name']:<14}{r['ms']:>10.2f}{r['cpu_ms']:>10.2f}{r['peak_mb']:>10.1f}"
              f"{r['ms'] / rows[0]['ms']:>12.2f}{r['cpu_ms'] / rows[0]['cpu_ms']:>11.2f}"
              f"{r['peak_mb'] / rows[0]['peak_mb']:>11.2f}")


if __name__ == "__main__":
    main()
