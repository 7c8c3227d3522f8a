"""Training-step time, peak memory and compile time: eager vs thunderlite.jit
(default executors, and executors=["torchcompile", "torch"]) vs torch.compile
(Inductor), measured in one process with the variants interleaved, on a
nanoGPT-style model and a tiny HF transformers Llama (built from a LlamaConfig,
no download).

    python benchmarks/bench_training.py [--steps 10] [--layers 2] [--models gpt,llama]
    python benchmarks/bench_training.py --scaling 1,2,4,8     # compile time vs layers

A step is forward + backward + SGD step. Every variant trains its own copy of
the same initial model on the same batch; the steps of the variants alternate
(the order rotates each round) so that load from other processes on a shared
machine hits all of them alike. Reported: the median wall time and process CPU
time of a step, each as a ratio to eager's (also "paired": the median of the
per-round ratios, each taken between steps run back to back, which cancels
load that drifts from round to round); the first call (trace + autodiff +
passes + compilation) in seconds; and that every variant's parameters after
all steps equal eager's (max abs difference).

Peak memory on CPU is measured in a second run of the script (``--pinned``,
started by the first) with glibc's mmap threshold pinned
(``MALLOC_MMAP_THRESHOLD_=65536``), so that large tensors are mapped and
unmapped one by one and resident size follows live tensor bytes: before a step
the kernel's high-water mark of resident memory is reset
(``/proc/self/clear_refs``); the number is the high-water mark (VmHWM) minus
the resident size at the reset (activations, saved tensors, gradients and
temporaries above the parameters), min over 3 steps. That run's step times are
reported too ("pinned"): there every allocation of a large tensor faults in
fresh pages, so they charge each allocated byte, which glibc's default
allocator (reusing freed memory, as the main run and real programs do) and
CUDA's caching allocator do not. On CUDA one run gives both, peak memory being
``torch.cuda.max_memory_allocated`` above the allocation at the start of the step.

Measured on the shared 2-core CPU machine while other engineers' jobs ran (load
average 4-8, so wall times are about twice the CPU times; ``--threads 1``, 16
interleaved steps, two runs; noise about +-5%). Ratios: main run wall / CPU
time, pinned run wall time, peak memory vs eager:

- nanoGPT, thunderlite / eager: 0.97-0.98 / 0.99, pinned 1.02-1.07, memory 0.79-0.80
- nanoGPT, thunderlite+torchcompile / torch.compile: 1.02 / 1.01-1.02, pinned
  1.05-1.08, memory 0.74 (one run since torchcompile cuts the backward per
  layer; 0.87 before; torch.compile 0.81-0.83)
- tiny Llama, thunderlite / eager: 1.01-1.05 / 0.98-1.00, pinned 0.90-0.97, memory 0.66
- tiny Llama, thunderlite+torchcompile / torch.compile: 0.99 / 1.02, pinned
  1.09-1.10, memory 0.84-0.85 (torch.compile 0.70)

With torchcompile regions called boxed (they free dying inputs inside, see
transforms/box_inputs.py), two runs at load average 4-5 (the second beside a
test run): nanoGPT thunderlite+torchcompile / torch.compile 1.00-1.02 /
1.00-1.01, pinned 1.06-1.07, memory 0.68 (was 0.74); tiny Llama 1.00-1.03 /
1.01, pinned 1.09-1.15, memory 0.75 (was 0.84-0.85; torch.compile 0.68-0.70).
First call of that Llama step (d=64, 2 layers, batch 4x64), the commit before
boxing against boxing, each in its own Inductor cache directory, same loaded
machine: cold cache 83 s wall / 9.4 s CPU before, 27 s / 8.2 s after (wall
time is Inductor's compile workers under load); warm cache 4.4 s / 3.3 s
before, 9.1 s / 7.9 s after: boxed regions gain less from Inductor's caches.

Latest run (2026-11-25, the machine otherwise idle but for a paused job, one
run of 16 interleaved steps, 1 thread; wall / CPU time, pinned time, memory):
nanoGPT thunderlite / eager 1.01 / 1.01, pinned 1.02, memory 0.79;
thunderlite+torchcompile / torch.compile 1.01 / 1.01, pinned 1.06, memory 0.67
(torch.compile 0.81); tiny Llama thunderlite / eager 0.99 / 0.99, pinned 0.95,
memory 0.66; thunderlite+torchcompile / torch.compile 1.01 / 1.01, pinned 1.10,
memory 0.76 (torch.compile 0.69). First calls with a warm Inductor cache (boxed
regions now hit Inductor's FX graph cache): thunderlite+torchcompile 4.3 s /
4.5 s, torch.compile 0.7 s / 1.4 s, thunderlite 0.2 s / 0.3 s.

On an H100 (2026-11-26, torch 2.11 + CUDA 13, ``--dim 512 --layers 4 --seq 256
--batch 8``, 12 steps; step time / peak memory vs eager). float32: nanoGPT
thunderlite 1.01 / 0.76, thunderlite+torchcompile 0.99 / 0.83, torch.compile
0.94 / 0.97; Llama thunderlite 0.81 / 0.49, thunderlite+torchcompile 0.60 /
0.79, torch.compile 0.50 / 0.61. bfloat16 (``--dtype bfloat16``, after the
half-precision rules of autodiff/torch_rules.py; before them Llama took 1.17x
eager's time and 1.85x its memory): nanoGPT thunderlite 0.89 / 0.79,
thunderlite+torchcompile 1.02 / 0.65, torch.compile 0.90 / 0.85; Llama
thunderlite 0.98 / 0.74, thunderlite+torchcompile 0.67 / 1.00, torch.compile
0.44 / 0.63. Steps this small are bound by the CPU launching kernels (CPU time
equals wall time), where Inductor's one graph per direction beats
thunderlite+torchcompile's regions with torch calls between them
(thunderlite+torchcompile / torch.compile 1.05-1.21 in float32, 1.14-1.51 in
bfloat16). bfloat16 on the 2-core CPU (default sizes, 6 steps, under load):
nanoGPT thunderlite 0.96 / 0.78, Llama 0.96 / 0.67 (1.15 / 1.47 before).

The same host-bound regime on the 2-core CPU (2026-11-26, idle machine, ``--dim
32 --layers 4 --seq 32 --batch 2``, 40 steps, 1 thread): thunderlite+torchcompile
/ torch.compile was 1.11 (nanoGPT) and 1.07 (Llama) with one region per layer;
with layers grouped by executors/cost.py (one region per direction at this
size), cheaper per-call layout checks in the regions and cheaper entry guards it
is 1.03 and 0.96. At the default sizes (about 20 ms a layer's forward) the
two layers now share a region too (fusion and memory planning across layers:
forward + backward alone, 30 interleaved rounds, one region per layer against
one for both: nanoGPT 159.1 against 152.6 ms, torch.compile 157.4; Llama 148.2
against 144.4, torch.compile 145.7); the benchmark's step ratios went from
1.00-1.01 and 1.00 to 0.99-1.00 and 0.99 (thunderlite / eager 1.00 and 0.99,
memory 0.68 and 0.58; thunderlite+torchcompile memory 0.67 and 0.67). bfloat16
(8 steps): Llama thunderlite+torchcompile memory 0.77 -> 0.70 of eager once a
fusion executor's backward recomputes the float32 widenings around the norms
from their bfloat16 inputs (transforms/autodiff/rematerialize.py; torch.compile 0.53),
time 0.98-1.00 of torch.compile.

``--whole-step`` times the whole training step with AdamW (forward, backward,
``opt.step()``, ``opt.zero_grad(set_to_none=True)``): eager; ``jit(forward)``
(the jitted model, PyTorch's backward and optimizer); ``jit(step)`` (the step
jitted: backward and optimizer in the trace, each update right after its
gradient, transforms/whole_step.py); ``torch.compile(step)`` (the backward by
compiled autograd). On this shared 2-core CPU (2026-11-27, load 5-10, 1 thread,
nanoGPT 2 layers d=256, batch 8x128; time / CPU time / peak memory vs eager):
jit(forward) 0.96-0.98 / 0.98-1.01 / 0.71-0.74, jit(step) 0.99-1.05 /
0.99-1.03 / 0.71-0.75, torch.compile(step) 0.95 / 0.96 / 0.82 (first call 6 s
with a warm Inductor cache, 187 s cold; jit(step) 0.5-0.9 s). jit(step) /
jit(forward): time 1.03-1.07 (paired 0.94-1.04), memory 1.00-1.03: at this size
the peak is the activations at the loss (logits and log-probabilities), before
any gradient exists, so updating early does not lower it; the traced AdamW adds
a few scalar kernels per parameter (its compiling path keeps the step count a
tensor). Where the parameters dominate (``--batch 1 --seq 64``): jit(step)
peak memory 0.21 of eager's and 0.22 of jit(forward)'s (the gradients die as
they are made), time 1.00 / CPU 0.97. Parameters equal eager's within 2e-5
(jit(forward) likewise) after AdamW steps.

Since then (2026-11-27) the whole step's backward recomputes each norm's output
from its saved input instead of keeping it (autodiff/rematerialize.py,
``norms``), cross entropy writes its log-probabilities into the dying logits
and AdamW's ``sqrt(v) / bias_correction`` into the dying ``sqrt``
(reuse_buffers.py), and AdamW's nine 0-d kernels per parameter (its compiling
path keeps the step count a tensor) run once on the stacked step counts
(whole_step.batch_scalar_chains). At the loss the step now holds the
activations the backward cannot do without (per layer the residual inputs of
the two norms, qkv, attention's output, fc's output; about 21 MB) and one
logits-sized buffer; its peak (about 25 MB, at the head's gradient matmul)
was 31 MB. ``python benchmarks/bench_training.py --whole-step --models gpt
--threads 1 --steps 16`` (load average 2.5-3; time / CPU time / peak memory
vs eager): jit(forward) 0.90 / 0.92 / 0.69, jit(step) 0.91 / 0.91 / 0.58,
torch.compile(step) 0.90 / 0.92 / 0.80; jit(step) / jit(forward) time 1.01,
paired 1.00, CPU 0.99, memory 0.84. Direct A/B runs of the two (30-40
interleaved steps, 1 thread, CPU time): jit(step) 0.99-1.03 of jit(forward).
Before the scalar batching (same command, load 4-7): jit(step) / jit(forward)
time 1.08, CPU 1.06, memory 0.78 (jit(step) 0.57 of eager).

Parameters after all steps equal eager's within 3e-8. First call vs layers
(dim 64, CPU time, one process after a 1-layer warm-up): 0.20, 0.47, 1.07,
1.96 s for 2, 4, 8, 16 layers (about 0.12 s a layer; wall time under this load
scattered 2-5x around it).

Host time per symbol (2026-11-27, the shared 2-core CPU at load 4-8, 1
thread): tiny models (2 layers, d=16, 2 heads, batch 2x8, vocab 64, so
kernels cost little) run forward + backward cached; ``python_calls_per_step``
before / after printing hot prims and torch wrappers as their direct torch
calls (executors/torchex.py, ``direct_source``) and trimming the autograd
bridge: nanoGPT 117 / 75, HF Llama 193 / 68 Python function calls per step.
Per-step CPU time as the median of 40 interleaved rounds' jit / eager ratios
(two runs each, before then after, alternating): nanoGPT 1.19, 1.13 -> 1.13,
1.07; Llama 0.91, 0.91 -> 0.80, 0.79. The no_grad cached calls of
``bench_overhead.py`` (tiny, MLP) are unchanged (within 1%).

``--distributed`` runs 2 gloo ranks on this machine (spawned; ``--threads``
per rank, 1 by default): the whole step with AdamW of nanoGPT under torch's
DDP and under FSDP2 (``fully_shard`` per block and on the root), each rank on
its half of the global batch: eager, ``jit(step)`` (forward, backward with the
bucketed all-reduces or the gathers and reduce-scatters, and the optimizer in
one trace) and ``torch.compile(step)`` (Dynamo breaks the graph at the
backward and the optimizer), the steps interleaved and each started from a
barrier. Reported per wrapper: the slowest rank's median step time and CPU
time (process time: gloo's threads included), the paired ratio, first call,
parameters after all steps against eager's, and peak memory per rank (a
second spawn with glibc's mmap threshold pinned, as above). Measured on the
shared 2-core CPU (2026-12-07, load average 10-13 from other sessions, so a
step's wall time was 8-10x its CPU time and wall ratios are mostly the
machine's; ``--steps 12 --dim 256 --layers 2 --seq 128 --batch 8``; time /
paired / CPU time / peak memory vs eager): DDP jit(step) 1.09 / 1.01 / 1.01 /
0.76, torch.compile(step) 1.04 / 1.08 / 0.96 / 0.87; FSDP2 jit(step) 0.69 /
0.71 / 0.99 / 0.84 (the wall-time gain is not explained here: under this
load it may be scheduling; the CPU time is eager's), torch.compile(step) 1.02 /
1.05 / 0.95 / 1.12. First call: jit(step) 7 s (DDP) and 10 s (FSDP2) under
that load, torch.compile(step) 200-260 s. Parameters equal eager's within
2e-5 after the 14 AdamW steps (torch.compile(step) likewise: both keep the
step counts as tensors, their bias corrections in float32). A second run
(load 6-9; eager and jit(step) only, 16 steps): DDP 1.08 / 1.04 / 1.02 /
0.73, FSDP2 0.42 / 0.47 / 1.04 / 0.93. Then each gradient bucket was
all-reduced in place (the functional all-reduce had copied its input): DDP
1.00 / 1.03 / 0.99 / 0.63 (load 6-9, 16 steps).

``--scaling`` times the first call of the thunderlite step (a fresh process per
size) for each number of layers, and counts the Python function calls of a
cached step (forward + backward) to show that they do not grow with the number
of parameters.
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # this checkout's thunderlite
import thunderlite
from thunderlite.tests.test_grad_jit import NanoGPT  # the model the training tests check against eager


class LlamaLoss(nn.Module):
    """HF LlamaForCausalLM returning its language-model loss."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, ctx: int, kv_heads: int | None = None):
        super().__init__()
        import transformers
        cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=(8 * d // 3 + 63) // 64 * 64,
                                       num_hidden_layers=layers, num_attention_heads=heads,
                                       num_key_value_heads=kv_heads or max(heads // 2, 1), max_position_embeddings=ctx,
                                       attn_implementation="sdpa")
        self.model = transformers.LlamaForCausalLM(cfg)

    def forward(self, idx, targets):
        return self.model(input_ids=idx, labels=targets, use_cache=False).loss


MODELS = {"gpt": NanoGPT, "llama": LlamaLoss}


# the variants needing a C++ compiler on CPU
_INDUCTOR = ("thunderlite+tc", "thunderlite+tc1", "torch.compile", "torch.compile(step)")


def _variant_fn(name: str, model: nn.Module):
    if name == "eager":
        return model
    if name == "thunderlite":       # the fast tier (its hot tier: bench_models.py)
        return thunderlite.jit(model, tiering=False)
    if name == "thunderlite+tc":
        return thunderlite.jit(model, executors=["torchcompile", "torch"])
    if name == "thunderlite+tc1":     # one region per layer (the default groups cheap layers, executors/cost.py)
        from thunderlite.executors.torchcompile import TorchCompileExecutor
        return thunderlite.jit(model, executors=[TorchCompileExecutor("torchcompile_per_layer", layers_per_region=1),
                                                 "torch"])
    if name == "torch.compile":
        return torch.compile(model)
    raise ValueError(name)


def _step(fn, opt, batch):
    opt.zero_grad(set_to_none=True)
    loss = fn(*batch)
    loss.backward()
    opt.step()
    if batch[0].is_cuda:
        torch.cuda.synchronize()
    return loss


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} is not in /proc/self/status")


def peak_step_bytes(run, batch) -> int:
    """Peak memory of one step (``run(batch)``) above its start (see module docstring)."""
    if batch[0].is_cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run(batch)
        return torch.cuda.max_memory_allocated() - base
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _proc_status("VmRSS")
    run(batch)
    return _proc_status("VmHWM") - base


def whole_step(model, opt, idx, targets):
    """The whole-step variants' training step, as people write it."""
    loss = model(idx, targets)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if idx.is_cuda:
        torch.cuda.synchronize()
    return loss.detach()


WHOLE_STEP_VARIANTS = ("eager", "jit(forward)", "jit(step)", "torch.compile(step)")


def _whole_step_run(name: str, model: nn.Module, opt):
    """``run(batch)`` of a whole-step variant (``--whole-step``): AdamW, forward +
    backward + step + zero_grad(set_to_none=True)."""
    if name == "eager":
        return lambda b: whole_step(model, opt, *b)
    if name == "jit(forward)":            # thunderlite's forward, PyTorch's autograd and optimizer
        jm = thunderlite.jit(model, tiering=False)
        return lambda b: whole_step(jm, opt, *b)
    if name == "jit(step)":               # backward and optimizer in the trace
        js = thunderlite.jit(whole_step, tiering=False)
        return lambda b: js(model, opt, *b)
    if name == "torch.compile(step)":     # Dynamo's graph of the step, the backward by compiled autograd
        cs = torch.compile(whole_step)

        def run(b):
            with torch._dynamo.config.patch(compiled_autograd=True):
                return cs(model, opt, *b)
        return run
    raise ValueError(name)


DIST_VARIANTS = ("eager", "jit(step)", "torch.compile(step)")
DIST_WRAPPERS = ("ddp", "fsdp2")


def _wrapped(kind: str, model: nn.Module) -> nn.Module:
    """``model`` under torch's DDP, or sharded by FSDP2 per block and at the root."""
    if kind == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard
    for blk in model.blocks:
        fully_shard(blk)
    return fully_shard(model)


def _first_called(name: str, model, run, batch) -> dict:
    """A variant's row: its first call timed (tracing / compilation), then one more call to warm it."""
    start = time.perf_counter()
    run(batch)
    first = time.perf_counter() - start
    run(batch)
    return {"name": name, "model": model, "run": run, "first_s": first, "ms": [], "cpu": []}


def _dist_run(name: str, model: nn.Module, opt):
    """``run(batch)`` of a distributed variant: the whole step, AdamW."""
    if name == "eager":
        return lambda b: whole_step(model, opt, *b)
    if name == "jit(step)":
        js = thunderlite.jit(whole_step)
        return lambda b: js(model, opt, *b)
    if name == "torch.compile(step)":     # Dynamo breaks the graph at the backward and the optimizer
        cs = torch.compile(whole_step)
        return lambda b: cs(model, opt, *b)
    raise ValueError(name)


def _dist_worker(rank: int, world: int, store: str, opts, names: list[str], out: str, peak: bool) -> None:
    """One gloo rank of ``--distributed``: every variant over each wrapper, the
    steps interleaved (the same order on every rank: the collectives pair up),
    each timed from a barrier; rank 0 writes every rank's numbers to ``out``."""
    import torch.distributed as dist
    torch.set_num_threads(opts.threads or 1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    if any(n in _INDUCTOR for n in names):
        warm_inductor("cpu")
    results = {}
    for kind in opts.wrappers.split(","):
        torch.manual_seed(0)
        base = NanoGPT(opts.vocab, opts.dim, opts.heads, opts.layers, opts.seq)
        g = torch.Generator().manual_seed(1)
        batch = tuple(torch.randint(0, opts.vocab, (opts.batch, opts.seq), generator=g).chunk(world)[rank]
                      for _ in range(2))
        rows = []
        for name in names:
            model = _wrapped(kind, copy.deepcopy(base))
            run = _dist_run(name, model, torch.optim.AdamW(model.parameters(), lr=1e-3))
            rows.append(_first_called(name, model, run, batch))
        for i in range(opts.steps):
            k = i % len(rows)
            for r in rows[k:] + rows[:k]:
                dist.barrier()
                start, cpu_start = time.perf_counter(), time.process_time()
                r["run"](batch)
                r["ms"].append((time.perf_counter() - start) * 1e3)
                r["cpu"].append((time.process_time() - cpu_start) * 1e3)
        for r in rows:
            r["peak_mb"] = min(peak_step_bytes(r["run"], batch) for _ in range(3)) / 2**20 if peak else 0.0
            full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in r["model"].parameters()]
            r["params"] = [p.detach() for p in full]
        ref = rows[0]["params"]
        results[kind] = [{"name": r["name"], "first_s": r["first_s"], "ms": r["ms"], "cpu": r["cpu"],
                          "peak_mb": r["peak_mb"],
                          "param_diff": max((a - b).abs().max().item()
                                            for a, b in zip(r["params"], ref, strict=True))}
                         for r in rows]
    every = [None] * world
    dist.all_gather_object(every, results)
    if rank == 0:
        Path(out).write_text(json.dumps(every))
    dist.barrier()
    dist.destroy_process_group()


def _spawn_ranks(opts, names: list[str], peak: bool) -> list[dict]:
    """Run ``_dist_worker`` on 2 gloo ranks (``peak``: glibc's mmap threshold pinned,
    for the peak memory; see the module docstring) and return each rank's results."""
    import tempfile

    import torch.multiprocessing as mp
    old = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    if peak:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"      # read by the ranks' allocator at their start
    try:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out.json")
            mp.start_processes(_dist_worker, args=(2, os.path.join(d, "store"), opts, names, out, peak), nprocs=2,
                               start_method="spawn")
            return json.loads(Path(out).read_text())
    finally:
        if peak:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_") if old is None else os.environ.update(
                MALLOC_MMAP_THRESHOLD_=old)


def run_distributed(opts, names: list[str]) -> None:
    """``--distributed``: see the module docstring. A step's time on the slowest
    rank (its median over the interleaved steps), CPU time likewise, the paired
    ratio per rank (the larger); peak memory per rank (the larger)."""
    ranks = _spawn_ranks(opts, names, peak=False)
    pinned = _spawn_ranks(opts, names, peak=True)
    for kind in opts.wrappers.split(","):
        rows = [[rk[kind][i] for rk in ranks] for i in range(len(names))]
        peaks = [max(rk[kind][i]["peak_mb"] for rk in pinned) for i in range(len(names))]
        print(f"\nnanoGPT under {'torch DDP' if kind == 'ddp' else 'FSDP2 (fully_shard per block and the root)'}: "
              f"2 gloo ranks, layers={opts.layers} dim={opts.dim} seq={opts.seq} global batch={opts.batch}, AdamW, "
              f"torch {torch.__version__}, threads {opts.threads or 1} per rank, {opts.steps} interleaved steps")
        print(f"{'':<22}{'step ms':>9}{'cpu ms':>9}{'time/eager':>12}{'paired':>8}{'cpu/eager':>11}{'first s':>9}"
              f"{'param diff':>12}{'peak MB':>9}{'mem/eager':>11}")
        e_ms = max(statistics.median(r["ms"]) for r in rows[0])
        e_cpu = max(statistics.median(r["cpu"]) for r in rows[0])
        for i, per_rank in enumerate(rows):
            ms = max(statistics.median(r["ms"]) for r in per_rank)
            cpu = max(statistics.median(r["cpu"]) for r in per_rank)
            pair = max(paired(r, e) for r, e in zip(per_rank, rows[0], strict=True))
            first = max(r["first_s"] for r in per_rank)
            diff = max(r["param_diff"] for r in per_rank)
            print(f"{names[i]:<22}{ms:>9.1f}{cpu:>9.1f}{ms / e_ms:>12.2f}{pair:>8.2f}{cpu / e_cpu:>11.2f}"
                  f"{first:>9.1f}{diff:>12.1e}{peaks[i]:>9.1f}{peaks[i] / max(peaks[0], 1e-9):>11.2f}")


def warm_inductor(device: str) -> None:
    """Compile a tiny function once, so that neither Inductor variant's first
    call pays the process's one-time Inductor imports and toolchain checks
    (otherwise whichever runs first is charged ~2-4 s the other is not)."""
    torch.compile(lambda x: (x.sin() + 1).sum())(torch.randn(8, device=device))


def run_model(kind: str, names: list[str], opts, device: str, peak: bool) -> list[dict]:
    torch.manual_seed(0)
    base = MODELS[kind](opts.vocab, opts.dim, opts.heads, opts.layers, opts.seq).to(device, getattr(torch, opts.dtype))
    g = torch.Generator().manual_seed(1)
    batch = tuple(torch.randint(0, opts.vocab, (opts.batch, opts.seq), generator=g).to(device) for _ in range(2))
    rows = []
    for name in names:
        model = copy.deepcopy(base)
        if opts.whole_step:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            run = _whole_step_run(name, model, opt)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            run = functools.partial(_step, _variant_fn(name, model), opt)
        rows.append(_first_called(name, model, run, batch))
    for i in range(opts.steps):
        k = i % len(rows)
        for r in rows[k:] + rows[:k]:
            start, cpu_start = time.perf_counter(), time.process_time()
            r["run"](batch)
            r["ms"].append((time.perf_counter() - start) * 1e3)
            r["cpu"].append((time.process_time() - cpu_start) * 1e3)
    for r in rows:
        r["peak_mb"] = min(peak_step_bytes(r["run"], batch) for _ in range(3)) / 2**20 if peak else None
    ref = dict(rows[0]["model"].named_parameters())
    for r in rows:
        r["param_diff"] = max((p.detach() - ref[n].detach()).abs().max().item()
                              for n, p in r["model"].named_parameters())
    return rows


def print_rows(kind: str, rows: list[dict], pinned: dict, opts, device: str) -> None:
    """``pinned``: per variant, the median step ms and the peak MB measured in
    the pinned-allocator process (see the module docstring)."""
    print(f"\n{kind}: layers={opts.layers} dim={opts.dim} seq={opts.seq} batch={opts.batch} {opts.dtype} on {device}, "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}, {opts.steps} interleaved steps")
    print(f"{'':<16}{'step ms':>9}{'cpu ms':>9}{'time/eager':>12}{'paired':>8}{'cpu/eager':>11}{'first s':>9}"
          f"{'param diff':>12}{'| pinned:':>10}{'time/eager':>12}{'peak MB':>9}{'mem/eager':>11}")
    e = rows[0]
    e_ms, e_cpu = statistics.median(e["ms"]), statistics.median(e["cpu"])
    pe = pinned[e["name"]]
    for r in rows:
        ms, cpu = statistics.median(r["ms"]), statistics.median(r["cpu"])
        p = pinned[r["name"]]
        print(f"{r['name']:<16}{ms:>9.1f}{cpu:>9.1f}{ms / e_ms:>12.2f}{paired(r, e):>8.2f}{cpu / e_cpu:>11.2f}"
              f"{r['first_s']:>9.1f}"
              f"{r['param_diff']:>12.1e}{'':>10}{p['ms'] / pe['ms']:>12.2f}{p['peak_mb']:>9.1f}"
              + (f"{p['peak_mb'] / pe['peak_mb']:>11.2f}" if pe["peak_mb"] > 0 else f"{'-':>11}"))
    by = {r["name"]: r for r in rows}
    if "jit(step)" in by and "jit(forward)" in by:
        st, fw = by["jit(step)"], by["jit(forward)"]
        print(f"{'jit(step) / jit(forward)':<32} time {statistics.median(st['ms']) / statistics.median(fw['ms']):.2f}"
              f"  paired {paired(st, fw):.2f}  cpu {statistics.median(st['cpu']) / statistics.median(fw['cpu']):.2f}"
              f"  peak memory {pinned['jit(step)']['peak_mb'] / max(pinned['jit(forward)']['peak_mb'], 1e-9):.2f}")
    if "thunderlite+tc" in by and "torch.compile" in by:
        tc, tl = by["torch.compile"], by["thunderlite+tc"]
        print(f"{'thunderlite+tc / torch.compile':<32} "
              f"time {statistics.median(tl['ms']) / statistics.median(tc['ms']):.2f}"
              f"  paired {paired(tl, tc):.2f}  cpu {statistics.median(tl['cpu']) / statistics.median(tc['cpu']):.2f}"
              f"  paired cpu {paired(tl, tc, 'cpu'):.2f}"
              f"  pinned time {pinned['thunderlite+tc']['ms'] / pinned['torch.compile']['ms']:.2f}")


def paired(r: dict, ref: dict, key: str = "ms") -> float:
    """The median over rounds of the ratio of ``r``'s step to ``ref``'s in the
    same round: load that drifts between rounds cancels out of each ratio."""
    return statistics.median(a / b for a, b in zip(r[key], ref[key], strict=True))


def pinned_summary(rows: list[dict]) -> dict:
    return {r["name"]: {"ms": statistics.median(r["ms"]), "peak_mb": r["peak_mb"]} for r in rows}


def measure_pinned(opts) -> dict:
    """Run this script again with glibc's mmap threshold pinned (``--pinned``)
    and read back, per model and variant, its step time and peak memory."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--pinned"], env=env, check=True,
                          stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def python_calls_per_step(fn, batch) -> int:
    """Python function calls (not C calls) in one cached forward + backward."""
    count = 0

    def prof(frame, event, arg):
        nonlocal count
        if event == "call":
            count += 1
    loss = fn(*batch)
    loss.backward()
    sys.setprofile(prof)
    try:
        loss = fn(*batch)
        loss.backward()
    finally:
        sys.setprofile(None)
    return count


def scaling_point(opts) -> None:
    """One row of ``--scaling``. The process first traces a 1-layer model once:
    the first trace in a process pays one-time imports (torch's sympy-based
    shape machinery, ~5 s here), which are not per-model compile time."""
    torch.manual_seed(0)
    batch = tuple(torch.randint(0, opts.vocab, (opts.batch, opts.seq)) for _ in range(2))
    start = time.perf_counter()
    thunderlite.jit(NanoGPT(opts.vocab, opts.dim, opts.heads, 1, opts.seq))(*batch).backward()
    cold = time.perf_counter() - start
    model = NanoGPT(opts.vocab, opts.dim, opts.heads, opts.layers, opts.seq)
    jm = thunderlite.jit(model, tiering=False)
    start = time.perf_counter()
    jm(*batch).backward()
    first = time.perf_counter() - start
    calls = python_calls_per_step(jm, batch)
    fwd, bwd = thunderlite.last_traces(jm)[-1], thunderlite.last_backward_traces(jm)[-1]
    nparams = len(list(model.parameters()))
    print(f"{opts.layers:>7}{nparams:>8}{cold:>9.2f}{first:>10.2f}{first / opts.layers:>12.2f}{calls:>14}"
          f"{len(fwd.bound_symbols):>11}{len(bwd.bound_symbols):>11}")


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` without the given options and their values (``--x v`` or ``--x=v``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in options)):
            out.append(a)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--models", default="gpt,llama")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="the models' parameter dtype (bfloat16: half-precision training)")
    ap.add_argument("--variants", default="",
                    help="comma-separated (default: eager,thunderlite,thunderlite+tc,torch.compile); also "
                         "thunderlite+tc1 (torchcompile with one region per layer); with --whole-step, among "
                         + ",".join(WHOLE_STEP_VARIANTS))
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--whole-step", action="store_true",
                    help="the whole training step with AdamW: eager, jit(forward) with PyTorch's backward and "
                         "optimizer, jit(step) (backward and optimizer in the trace), torch.compile(step) with "
                         "compiled autograd")
    ap.add_argument("--scaling", default="", help="comma-separated layer counts: compile-time scaling only")
    ap.add_argument("--scaling-point", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pinned", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--distributed", action="store_true",
                    help="2 gloo ranks on this machine: the whole step (AdamW) of nanoGPT under torch's DDP and "
                         "FSDP2, eager vs jit(step) vs torch.compile(step); --variants picks among "
                         + ",".join(DIST_VARIANTS))
    ap.add_argument("--wrappers", default=",".join(DIST_WRAPPERS), help="with --distributed: ddp,fsdp2")
    opts = ap.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    if opts.scaling_point:
        scaling_point(opts)
        return
    if opts.scaling:
        print(f"thunderlite first call (trace + autodiff + passes) of the nanoGPT training step, dim={opts.dim}; "
              "cold: a 1-layer model's first call in a fresh process (one-time imports included); "
              "python calls: Python function calls of one cached forward + backward")
        print(f"{'layers':>7}{'params':>8}{'cold s':>9}{'first s':>10}{'s / layer':>12}{'python calls':>14}"
              f"{'fwd syms':>11}{'bwd syms':>11}", flush=True)
        args = _without(sys.argv[1:], ("--scaling", "--layers"))
        for n in opts.scaling.split(","):
            subprocess.run([sys.executable, __file__, *args, "--layers", n, "--scaling-point"], check=True)
        return
    if opts.distributed:
        names = opts.variants.split(",") if opts.variants else list(DIST_VARIANTS)
        if not any(os.access(os.path.join(p, "g++"), os.X_OK) for p in os.environ.get("PATH", "").split(os.pathsep)):
            names = [n for n in names if n not in _INDUCTOR]
        run_distributed(opts, names)
        return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if opts.whole_step:           # its own variants; --variants picks among them
        names = opts.variants.split(",") if opts.variants else list(WHOLE_STEP_VARIANTS)
    else:
        names = (opts.variants or "eager,thunderlite,thunderlite+tc,torch.compile").split(",")
    if device == "cpu" and not any(os.access(os.path.join(p, "g++"), os.X_OK)
                                   for p in os.environ.get("PATH", "").split(os.pathsep)):
        names = [n for n in names if n not in _INDUCTOR]
        if not opts.pinned:
            print("no C++ compiler: the Inductor variants are skipped")
    kinds = opts.models.split(",")
    if any(n in _INDUCTOR for n in names):
        warm_inductor(device)
    if opts.pinned:
        print(json.dumps({k: pinned_summary(run_model(k, names, opts, device, peak=True)) for k in kinds}))
        return
    results = {k: run_model(k, names, opts, device, peak=device == "cuda") for k in kinds}
    pinned = {k: pinned_summary(rows) for k, rows in results.items()} if device == "cuda" else measure_pinned(opts)
    for k, rows in results.items():
        print_rows(k, rows, pinned[k], opts, device)


if __name__ == "__main__":
    main()
