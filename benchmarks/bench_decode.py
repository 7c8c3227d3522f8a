"""Decoding through HF's own caches: per-token time, tokens per second and
compiles of a hand-written greedy decode loop, for eager, torch.compile
(Inductor) and thunderlite, in one run.

    python benchmarks/bench_decode.py [--quick] [--threads N] [--tokens N] [--rounds N]

The loop is what a server runs: one prefill call with the prompt, then one
call per token, ``model(input_ids=next_token, cache=cache, use_cache=True)``,
with HF's ``DynamicCache`` (keys and values grow by one position per token)
or ``StaticCache`` (preallocated, written in place). Models are random
Llama-shaped ``LlamaForCausalLM``s built from a config (no download):

  tiny    hidden 64, 2 layers, 4 heads, 2 KV heads (grouped-query attention), vocab 128
  larger  hidden 512, 6 layers, 8 heads, 2 KV heads, vocab 2048

Variants (each its own copy of the model):

  eager                          the model as it is
  inductor                       ``torch.compile(model)`` (default mode)
  inductor reduce-overhead       ``torch.compile(model, mode="reduce-overhead")`` (CUDA only)
  thunderlite                    ``thunderlite.jit(model)`` (default executors)
  thunderlite torchcompile       ``thunderlite.jit(model, executors=["torchcompile", "torch"])``
  thunderlite cudagraphs         ``thunderlite.jit(model, cudagraphs=True)`` (CUDA only)

Each variant first runs the loop once with a fresh cache: its tokens must
equal eager's and its last logits be close to eager's (checked before any
timing), and the compiles of that run are counted (thunderlite: cache misses;
torch.compile: graphs dynamo compiled). The timed runs reuse each variant's
cache after ``cache.reset()`` (a new cache object is a new key for
thunderlite: see docs/architecture.md §3); a reset cache is not in a fresh
one's state (a static cache stays initialized), so one untimed run after a
reset comes first, its compiles shown as ``+N after reset``. Then
``--rounds`` timed rounds, the variants interleaved within each round; a
round times the decode steps only (not the prefill). thunderlite's hot tiers
(docs/architecture.md §8) compile in the background after 20 calls of an
entry: each untimed run of a thunderlite variant waits for them, so the timed
rounds see the tier each entry settled in (``tiers``: the decode entry's,
with the reason where it stays fast). The table shows the
median per-token time over rounds, tokens per second, the median per-round
ratio to eager (load that drifts moves all variants of a round alike), and
the compiles (``+N timed``: any during the timed rounds).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch._dynamo
import torch._dynamo.utils

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import thunderlite

MODELS = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128),
    "larger": dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=6, num_attention_heads=8,
                   num_key_value_heads=2, vocab_size=2048),
}
PROMPT = 8


def make_model(transformers, name: str, device: torch.device):
    cfg = transformers.LlamaConfig(max_position_embeddings=512, **MODELS[name])
    torch.manual_seed(0)
    return cfg, transformers.LlamaForCausalLM(cfg).eval().to(device)


def make_cache(transformers, kind: str, cfg, length: int):
    if kind == "dynamic":
        return transformers.DynamicCache(config=cfg)
    return transformers.StaticCache(config=cfg, max_cache_len=length)


class Variant:
    """One way of running the model: its callable and how to count its compiles."""

    def __init__(self, name: str, model: torch.nn.Module, call: Callable, compiles: Callable[[], int]):
        self.name = name
        self.model = model
        self.call = call
        self.compiles = compiles
        self.cache = None
        self.first_compiles = 0
        self.reset_compiles = 0
        self.timed_compiles = 0
        self.per_token: list[float] = []
        self.ratios: list[float] = []

    def wait(self) -> None:
        """Let thunderlite's hot tiers compiling in the background finish
        (decode steps past the 20th call tier up, docs/architecture.md §8):
        the timed rounds measure the steady state, and no compile runs on the
        tier worker while another variant runs."""
        if self.name.startswith("thunderlite"):
            thunderlite.wait_for_tiers(self.call)

    def tiers(self) -> str:
        """The tier its decode entry (the one called most) settled in, and why
        where it stays fast (thunderlite)."""
        tiers = thunderlite.cache_info(self.call)["tiers"] if self.name.startswith("thunderlite") else []
        if not tiers:
            return "-"
        decode = max(tiers, key=lambda t: t["calls"])
        reason = decode.get("reason", "")
        return decode["tier"] + (f": {reason[:60]}{'...' if len(reason) > 60 else ''}" if reason else "")


def _dynamo_graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def variants(base: torch.nn.Module, cuda: bool) -> list[Variant]:
    def copy():
        m = type(base)(base.config).eval().to(next(base.parameters()).device)
        m.load_state_dict(base.state_dict())
        return m
    out = [Variant("eager", base, base, lambda: 0)]
    modes = [("inductor", {})] + ([("inductor reduce-overhead", {"mode": "reduce-overhead"})] if cuda else [])
    for name, opts in modes:
        m = copy()
        out.append(Variant(name, m, torch.compile(m, **opts), _dynamo_graphs))
    jits = [("thunderlite", {}), ("thunderlite torchcompile", {"executors": ["torchcompile", "torch"]})]
    if cuda:
        jits.append(("thunderlite cudagraphs", {"cudagraphs": True}))
    for name, opts in jits:
        m = copy()
        jm = thunderlite.jit(m, **opts)
        out.append(Variant(name, m, jm, lambda jm=jm: thunderlite.cache_info(jm)["misses"]))
    return out


def decode(call: Callable, cache, prompt: torch.Tensor, tokens: int, sync: Callable):
    """Greedy decoding: (tokens, last logits, seconds of the decode steps)."""
    out = call(input_ids=prompt, cache=cache, use_cache=True)
    nxt = out.logits[:, -1:].argmax(-1)
    got = [nxt]
    sync()
    start = time.perf_counter()
    for _ in range(tokens - 1):
        out = call(input_ids=nxt, cache=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        got.append(nxt)
    sync()
    return torch.cat(got, -1), out.logits, time.perf_counter() - start


def run_case(transformers, model_name: str, kind: str, tokens: int, rounds: int, device: torch.device) -> list[dict]:
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg, base = make_model(transformers, model_name, device)
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)
    length = PROMPT + tokens
    vs = variants(base, cuda)
    expected = None
    with torch.no_grad():
        for v in vs:            # first run: compiles counted, tokens and logits checked against eager's
            before = v.compiles()
            v.cache = make_cache(transformers, kind, cfg, length)
            toks, logits, _ = decode(v.call, v.cache, prompt, tokens, sync)
            v.first_compiles = v.compiles() - before
            if expected is None:
                expected = (toks, logits)
                continue
            if not torch.equal(toks, expected[0]):
                raise AssertionError(f"{model_name}/{kind}/{v.name}: tokens differ from eager's")
            torch.testing.assert_close(logits, expected[1], atol=2e-3, rtol=2e-3,
                                       msg=lambda m, v=v: f"{model_name}/{kind}/{v.name}: logits: {m}")
            v.wait()
        for v in vs:            # the same cache after reset(): its state may differ from a fresh one's
            before = v.compiles()
            v.cache.reset()
            decode(v.call, v.cache, prompt, tokens, sync)
            v.reset_compiles = v.compiles() - before
            v.wait()
        for _ in range(rounds):
            times = {}
            for v in vs:
                v.cache.reset()
                before = v.compiles()
                _, _, secs = decode(v.call, v.cache, prompt, tokens, sync)
                v.timed_compiles += v.compiles() - before
                times[v.name] = secs / (tokens - 1)
            for v in vs:
                v.per_token.append(times[v.name])
                v.ratios.append(times[v.name] / times["eager"])
    rows = []
    for v in vs:
        per_token = statistics.median(v.per_token)
        compiles = "-" if v.name == "eager" else str(v.first_compiles) + (
            f" +{v.reset_compiles} after reset" if v.reset_compiles else "") + (
            f" +{v.timed_compiles} timed" if v.timed_compiles else "")
        rows.append(dict(model=model_name, cache=kind, variant=v.name, ms=per_token * 1e3,
                         tok_s=1.0 / per_token, ratio=statistics.median(v.ratios), compiles=compiles,
                         tiers=v.tiers()))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model | cache | variant | ms / token | tokens / s | vs eager | compiles | tiers |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['cache']} | {r['variant']} | {r['ms']:.3f} | {r['tok_s']:.0f} | "
                     f"{r['ratio']:.2f}x | {r['compiles']} | {r['tiers']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the tiny model, few tokens and rounds (a smoke run)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (1 keeps timings stable)")
    p.add_argument("--tokens", type=int, default=None, help="tokens decoded per run (default 32; quick 8)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5; quick 2)")
    opts = p.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("bench_decode needs transformers (pip install -e '.[test]')")
        return 1
    torch.set_num_threads(opts.threads)
    torch._dynamo.config.cache_size_limit = 64       # every variant, model and cache shares the model's code
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokens = opts.tokens or (8 if opts.quick else 32)
    rounds = opts.rounds or (2 if opts.quick else 5)
    models = ["tiny"] if opts.quick else list(MODELS)
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {where}; prompt {PROMPT}, "
          f"{tokens} tokens, median of {rounds} interleaved rounds", flush=True)
    rows = []
    for name in models:
        for kind in ("dynamic", "static"):
            rows += run_case(transformers, name, kind, tokens, rounds, device)
            print(table(rows[-len([r for r in rows if r["model"] == name and r["cache"] == kind]):]), flush=True)
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
