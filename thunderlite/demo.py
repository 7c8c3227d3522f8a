"""The main demo: a small GPT-style model jitted on CPU.

Run ``python -m thunderlite.demo``: it checks the jitted model against eager,
prints the final trace (the program that actually runs), and times the cached
forward against eager PyTorch.
"""
from __future__ import annotations

import argparse
import math
import time
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


def _time_ms(fn, *args, iters: int = 50) -> float:
    fn(*args)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(iters):
            fn(*args)
        best = min(best, (time.perf_counter() - start) / iters)
    return best * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--no-trace", action="store_true", help="do not print the final trace")
    parser.add_argument("--iters", type=int, default=50, help="timed calls per repetition")
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
        if not opts.no_trace:
            print(thunderlite.last_traces(jmodel)[-1])
        eager_ms = _time_ms(model, idx, iters=opts.iters)
        jit_ms = _time_ms(jmodel, idx, iters=opts.iters)
    print(f"GPT ({opts.layers} layers) forward on CPU, output matches eager: {tuple(out.shape)}")
    print(f"  first call (trace + compile): {first_ms:8.2f} ms")
    print(f"  eager forward:                {eager_ms:8.3f} ms")
    print(f"  thunderlite forward (cached): {jit_ms:8.3f} ms  ({jit_ms / eager_ms:.2f}x eager)")
    print(f"  cache: {thunderlite.cache_info(jmodel)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
