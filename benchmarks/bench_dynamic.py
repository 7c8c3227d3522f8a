"""Dynamic shapes: how many compiles, and how long in all, to run a program over
many input sizes, for thunderlite (default automatic dynamic, and
``cache="symbolic values"``), ``dynamic=False`` thunderlite, and
``torch.compile`` (``dynamic=None``, its default automatic dynamic), with eager
as the reference, all in one run.

    python benchmarks/bench_dynamic.py [--quick] [--threads N]

Cases:
  gpt block   one transformer block of the demo GPT, sequence lengths 8..27
              (20 lengths), no_grad
  llama       a tiny HF LlamaForCausalLM forward (no_grad), prompt lengths 3..12
              (10 lengths)

Each variant runs every length once in a fresh process state (first calls
included: that is what a server sees); the table shows compiles (misses for
thunderlite, dynamo frame compiles for torch.compile), total wall time over
the lengths, and that total as a ratio to eager's. Results are checked against
eager at every length.

Measured on the 2-core CPU machine while two other jobs ran on it (so the
totals carry noise; torch.compile's include Inductor's cold compiles), 1 thread:

    case       variant                    compiles   total s   vs eager
    gpt block  eager                      -            0.026     1.0x
    gpt block  thunderlite                2            0.242     9.2x
    gpt block  thunderlite symbolic       1            0.099     3.8x
    gpt block  thunderlite dynamic=False  20           1.887    71.7x
    gpt block  torch.compile              2           16.024   608.6x
    llama      eager                      -            0.064     1.0x
    llama      thunderlite                2            0.754    11.8x
    llama      thunderlite symbolic       1            0.349     5.5x
    llama      thunderlite dynamic=False  10           4.147    64.9x
    llama      torch.compile              2           13.469   210.8x
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch._dynamo
import torch._dynamo.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import thunderlite
from thunderlite.demo import Block, GPTConfig


def _gpt_case(quick: bool):
    torch.manual_seed(0)
    block = Block(GPTConfig(block_size=64, n_layer=1, n_head=4, n_embd=64)).eval()
    lengths = list(range(8, 12 if quick else 28))
    return "gpt block", block, [(torch.randn(2, T, 64),) for T in lengths]


def _llama_case(quick: bool):
    try:
        import transformers
    except ImportError:
        return None
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    lengths = list(range(3, 6 if quick else 13))

    def forward(ids):
        return model(ids, use_cache=False).logits
    forward.model = model
    return "llama", forward, [(torch.randint(0, 64, (2, T)),) for T in lengths]


def _variants():
    return {
        "eager": lambda f: (f, None),
        "thunderlite": lambda f: _jit(f),
        "thunderlite symbolic": lambda f: _jit(f, cache="symbolic values"),
        "thunderlite dynamic=False": lambda f: _jit(f, dynamic=False),
        "torch.compile": lambda f: _compiled(f),
    }


def _jit(f, **options):
    j = thunderlite.jit(f, tiering=False, **options)     # recompiles, not the hot tier, are measured here
    return j, lambda: thunderlite.cache_info(j)["misses"]


def _compiled(f):
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    c = torch.compile(f, backend=counter, dynamic=None)
    return c, lambda: counter.frame_count


def run_case(name: str, fn, inputs: list) -> None:
    expected = [fn(*args) for args in inputs]
    eager_total = None
    for variant, make in _variants().items():
        f, compiles = make(fn)
        start = time.perf_counter()
        with torch.no_grad():
            outs = [f(*args) for args in inputs]
        total = time.perf_counter() - start
        for got, exp in zip(outs, expected, strict=True):
            torch.testing.assert_close(got, exp, atol=1e-4, rtol=1e-4)
        if variant == "eager":
            eager_total = total
        n = "-" if compiles is None else str(compiles())
        print(f"{name:10} {variant:26} {n:10} {total:9.3f} {total / eager_total:9.1f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few lengths only (a smoke run)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'case':10} {'variant':26} {'compiles':10} {'total s':>9} {'vs eager':>10}")
    with torch.no_grad():
        for make in (_gpt_case, _llama_case):
            c = make(args.quick)
            if c is not None:
                run_case(*c)


if __name__ == "__main__":
    main()
