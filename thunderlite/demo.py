"""The main demo: a small GPT-style model jitted on CPU.

Run ``python -m thunderlite.demo``: it checks the jitted model against eager,
prints the first lines of the final trace (the program that actually runs;
``--full`` prints all of it), then a summary: the cached forward timed against
eager PyTorch and ``torch.compile`` (every variant warmed, then timed in
interleaved rounds, ratios paired per round, as the benchmarks do), and which
executor ran how many symbols.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import thunderlite


@dataclass
class GPTConfig:
    vocab_size: int = 128
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, cfg.block_size, cfg.block_size))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def time_interleaved(fns: dict[str, Callable], *args, rounds: int, iters: int,
                     warmup: int = 3) -> dict[str, list[float]]:
    """ms per call of each of ``fns`` in each round, timed as benchmarks/bench_training.py
    times: every function is warmed first, then each round times ``iters`` calls of
    each with the order rotating from round to round, so that load from other
    processes on a busy machine hits all of them alike (timing one variant to the
    end, then the next, charged whichever ran during a burst of load with all of it)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn(*args)
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            fn = fns[n]
            start = time.perf_counter()
            for _ in range(iters):
                fn(*args)
            times[n].append((time.perf_counter() - start) / iters * 1e3)
    return times


def paired_ratio(ms: list[float], ref: list[float]) -> float:
    """The median over rounds of ``ms / ref`` within each round: load that drifts
    from round to round slows both sides of a ratio alike and cancels out."""
    return statistics.median(a / b for a, b in zip(ms, ref, strict=True))


EXCERPT_LINES = 16


def trace_excerpt(trace, full: bool = False) -> str:
    """The trace's header, signature and first statements (or all of it), saying
    how much was left out; the return line is always shown."""
    lines = str(trace).splitlines()
    if full:
        return "\n".join(lines)
    start = next(i for i, line in enumerate(lines) if line.startswith("def "))
    body = start + 1
    while body < len(lines) and lines[body].startswith("  # ") and '"' in lines[body]:
        body += 1                       # the inputs' metadata comments
    signature = lines[start] if len(lines[start]) <= 100 else lines[start][:96] + " ...):"
    shown = lines[body:body + EXCERPT_LINES]
    left = len(lines) - 1 - body - len(shown)
    tail = [f"  # ... {left} more lines (python -m thunderlite.demo --full prints them all)"] if left > 0 else []
    return "\n".join(lines[:start] + [signature] + shown + tail + lines[-1:])


def where_it_ran(trace) -> dict[str, int]:
    """Symbols of the final trace per executor (fusion regions count as one)."""
    counts: dict[str, int] = {}
    for bsym in trace.bound_symbols:
        ex = bsym.sym.executor
        if ex is not None:
            name = getattr(ex, "name", str(ex))
            counts[name] = counts.get(name, 0) + 1
    return counts


def _torch_compile(model, idx):
    """(compiled model, first call ms) of ``torch.compile(model)``, or the reason it cannot run here."""
    try:
        compiled = torch.compile(model)
        start = time.perf_counter()
        compiled(idx)
        return compiled, (time.perf_counter() - start) * 1e3
    except Exception as e:  # noqa: BLE001 - e.g. no C++ compiler for Inductor: reported, not fatal
        return f"unavailable here ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"


_LABELS = {"eager": "eager forward:", "thunderlite": "thunderlite forward (cached):",
           "torch.compile": "torch.compile forward:"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--full", action="store_true", help="print the whole final trace, not an excerpt")
    parser.add_argument("--no-trace", action="store_true", help="do not print the final trace")
    parser.add_argument("--no-torch-compile", action="store_true", help="do not time torch.compile")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per variant and round")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds")
    opts = parser.parse_args(argv)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=opts.layers)).eval()
    idx = torch.randint(0, model.cfg.vocab_size, (2, model.cfg.block_size))
    jmodel = thunderlite.jit(model)
    with torch.no_grad():
        start = time.perf_counter()
        out = jmodel(idx)
        first_ms = (time.perf_counter() - start) * 1e3
        expected = model(idx)
        torch.testing.assert_close(out, expected)
        final = thunderlite.last_traces(jmodel)[-1]
        if not opts.no_trace:
            print(trace_excerpt(final, opts.full))
            print()
        fns = {"eager": model, "thunderlite": jmodel}
        compiled = None if opts.no_torch_compile else _torch_compile(model, idx)
        if isinstance(compiled, tuple):
            fns["torch.compile"] = compiled[0]
        ms = time_interleaved(fns, idx, rounds=opts.rounds, iters=opts.iters)
    print(f"GPT ({opts.layers} layers) forward on CPU, no_grad, output {tuple(out.shape)} matches eager")
    print(f"  per call, median of {opts.rounds} interleaved rounds after warm-up (x eager: median per-round ratio)")
    first = {"thunderlite": f"first call (trace + compile) {first_ms:.0f} ms"}
    if isinstance(compiled, tuple):
        first["torch.compile"] = f"first call (compile) {compiled[1]:.0f} ms"
    for name, label in _LABELS.items():
        if name in ms:
            ratio = "" if name == "eager" else f"  ({paired_ratio(ms[name], ms['eager']):.2f}x eager)   {first[name]}"
            print(f"  {label:<30}{statistics.median(ms[name]):8.3f} ms{ratio}")
    if isinstance(compiled, str):
        print(f"  torch.compile: {compiled}")
    ran = where_it_ran(final)
    frees = sum(b.sym.name == "del" for b in final.bound_symbols)
    opaque = thunderlite.examine(model, idx).opaque
    print(f"  what ran where: {', '.join(f'{n} symbols by the {name} executor' for name, n in ran.items())}"
          f" ({frees} del statements free buffers early; {len(opaque)} opaque torch calls)")
    print(f"  cache: {thunderlite.cache_info(jmodel)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
