"""A zoo of HF transformers architectures with small random configs (built
from their config classes: no download), forward + ``loss.backward()``, on the
CPU with 1 thread: step time and first-call time of eager, torch.compile
(Inductor) and thunderlite, in one run, each variant checked against eager
first (loss, logits and every gradient).

    python benchmarks/bench_models.py [--models llama,bert] [--sizes tiny,medium] [--steps 12] [--clock cpu]

Models: decoders (Llama with grouped-query attention, Mistral with a sliding
window shorter than the sequence, Gemma, OPT, GPT-2, Qwen2, Phi), a mixture of
experts (Mixtral), encoders (BERT, RoBERTa, masked-LM loss), encoder-decoders
(T5, BART, with labels) and a vision transformer (ViT, classification).
Dropout is 0 (every variant's loss must equal eager's). Sizes: ``tiny``
(hidden 32, 2 layers, batch 2 x 16 tokens) and ``medium`` (hidden 256, 4
layers, 4 x 128 tokens; ViT: 4 images of 12 x 12 patches).

Variants:
- ``eager``;
- ``inductor``: ``torch.compile(model)``;
- ``thunderlite fast``: ``thunderlite.jit(model, tiering=False)``, the
  executors that compile in milliseconds;
- ``thunderlite``: ``thunderlite.jit(model)`` as a user gets it: the fast tier
  first; after ``TierPolicy.after_calls`` calls its regions compile on the
  tier worker (Inductor) and are swapped in. It is timed once the hot tier is
  in (``thunderlite.wait_for_tiers``).

Reported per model and size: eager's step in ms, each variant's step as a
ratio to eager's (median of the interleaved rounds' paired ratios: load that
drifts on a shared machine moves every variant of a round alike), the first
call in seconds (thunderlite's: tracing and compiling the fast tier; its time
to the hot tier beside it, from the first call until the swap, with the steps
run meanwhile), then the medians over models. ``--clock cpu`` times steps in
the CPU time of the calling thread (with one intra-op thread the step's work:
on the CPU the backward runs on that thread too), which a loaded machine
disturbs far less than wall time. Inductor compiles in a fresh
cache directory (``--warm-cache`` keeps the user's): a first call as a new
user meets it; the hot tier compiles in the same directory.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

SIZES = {
    "tiny": {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "batch": 2, "seq": 16, "vocab": 128},
    "medium": {"hidden": 256, "layers": 4, "heads": 8, "kv_heads": 2, "batch": 4, "seq": 128, "vocab": 1024},
}


def _decoder(cls_name: str, config_name: str, **extra) -> Callable:
    def build(s: dict):
        import transformers
        cfg = getattr(transformers, config_name)(
            hidden_size=s["hidden"], intermediate_size=4 * s["hidden"], num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"], vocab_size=s["vocab"], max_position_embeddings=2 * s["seq"],
            **{k: (v(s) if callable(v) else v) for k, v in extra.items()})
        return getattr(transformers, cls_name)(cfg), _causal_batch(s)
    return build


def _causal_batch(s: dict) -> Callable:
    def batch(torch):
        ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]))
        return {"input_ids": ids, "labels": ids, "use_cache": False}
    return batch


def _opt(s: dict):
    import transformers
    cfg = transformers.OPTConfig(hidden_size=s["hidden"], ffn_dim=4 * s["hidden"], num_hidden_layers=s["layers"],
                                 num_attention_heads=s["heads"], vocab_size=s["vocab"],
                                 max_position_embeddings=2 * s["seq"], word_embed_proj_dim=s["hidden"],
                                 dropout=0.0, attention_dropout=0.0)
    return transformers.OPTForCausalLM(cfg), _causal_batch(s)


def _gpt2(s: dict):
    import transformers
    cfg = transformers.GPT2Config(n_embd=s["hidden"], n_layer=s["layers"], n_head=s["heads"], vocab_size=s["vocab"],
                                  n_positions=2 * s["seq"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg), _causal_batch(s)


def _encoder(cls_name: str, config_name: str) -> Callable:
    def build(s: dict):
        import transformers
        cfg = getattr(transformers, config_name)(
            hidden_size=s["hidden"], intermediate_size=4 * s["hidden"], num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"], vocab_size=s["vocab"], max_position_embeddings=2 * s["seq"] + 2,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

        def batch(torch):
            ids = torch.randint(3, s["vocab"], (s["batch"], s["seq"]))
            labels = torch.where(torch.rand(ids.shape) < 0.15, ids, torch.full_like(ids, -100))
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
        return getattr(transformers, cls_name)(cfg), batch
    return build


def _t5(s: dict):
    import transformers
    cfg = transformers.T5Config(d_model=s["hidden"], d_ff=4 * s["hidden"], num_layers=s["layers"],
                                num_heads=s["heads"], d_kv=s["hidden"] // s["heads"], vocab_size=s["vocab"],
                                dropout_rate=0.0, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg), _seq2seq_batch(s)


def _bart(s: dict):
    import transformers
    cfg = transformers.BartConfig(d_model=s["hidden"], encoder_layers=s["layers"], decoder_layers=s["layers"],
                                  encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"],
                                  encoder_ffn_dim=4 * s["hidden"], decoder_ffn_dim=4 * s["hidden"],
                                  vocab_size=s["vocab"], max_position_embeddings=2 * s["seq"], dropout=0.0,
                                  attention_dropout=0.0, activation_dropout=0.0)
    return transformers.BartForConditionalGeneration(cfg), _seq2seq_batch(s)


def _seq2seq_batch(s: dict) -> Callable:
    def batch(torch):
        ids = torch.randint(3, s["vocab"], (s["batch"], s["seq"]))
        labels = torch.randint(3, s["vocab"], (s["batch"], s["seq"] // 2))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels, "use_cache": False}
    return batch


def _vit(s: dict):
    import transformers
    patch, side = 8, 4 if s["seq"] <= 16 else 12        # 16 or 144 patches
    cfg = transformers.ViTConfig(hidden_size=s["hidden"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                                 intermediate_size=4 * s["hidden"], image_size=patch * side, patch_size=patch,
                                 num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

    def batch(torch):
        return {"pixel_values": torch.randn(s["batch"], 3, patch * side, patch * side),
                "labels": torch.randint(0, 10, (s["batch"],))}
    return transformers.ViTForImageClassification(cfg), batch


MODELS: dict[str, Callable] = {
    "llama": _decoder("LlamaForCausalLM", "LlamaConfig", num_key_value_heads=lambda s: s["kv_heads"]),
    "mistral": _decoder("MistralForCausalLM", "MistralConfig", num_key_value_heads=lambda s: s["kv_heads"],
                        sliding_window=lambda s: s["seq"] // 2),
    "gemma": _decoder("GemmaForCausalLM", "GemmaConfig", num_key_value_heads=lambda s: s["kv_heads"],
                      head_dim=lambda s: s["hidden"] // s["heads"]),
    "opt": _opt,
    "gpt2": _gpt2,
    "qwen2": _decoder("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=lambda s: s["kv_heads"]),
    "phi": _decoder("PhiForCausalLM", "PhiConfig", resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
    "mixtral": _decoder("MixtralForCausalLM", "MixtralConfig", num_key_value_heads=lambda s: s["kv_heads"],
                        num_local_experts=4, num_experts_per_tok=2),
    "bert": _encoder("BertForMaskedLM", "BertConfig"),
    "roberta": _encoder("RobertaForMaskedLM", "RobertaConfig"),
    "t5": _t5,
    "bart": _bart,
    "vit": _vit,
}

VARIANTS = ("eager", "inductor", "thunderlite fast", "thunderlite")


def _loss(out):
    return out.loss


def _step(model, batch: dict):
    """Forward + backward; the gradients are set to None before (a training loop's ``zero_grad``)."""
    for p in model.parameters():
        p.grad = None
    out = model(**batch)
    _loss(out).backward()
    return out


def _results(model, out) -> dict:
    res = {"loss": out.loss.detach().clone(), "logits": out.logits.detach().clone()}
    res.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    return res


def _check(name: str, got: dict, want: dict, atol: float, rtol: float) -> str:
    """'' when every value is within tolerance of eager's, else what differs."""
    import torch
    if set(got) != set(want):
        return f"{name}: gradients of {sorted(set(got) ^ set(want))[:3]} differ in presence"
    worst = max(((k, (got[k] - want[k]).abs().max().item()) for k in want), key=lambda kv: kv[1])
    bad = [k for k in want if not torch.allclose(got[k], want[k], atol=atol, rtol=rtol)]
    return f"{name}: {bad[:3]} differ (max |diff| {worst[1]:.2e} at {worst[0]})" if bad else ""


def _make(variant: str, model, tiering_calls: int):
    import torch

    import thunderlite
    if variant == "eager":
        return model
    if variant == "inductor":
        # a fresh dynamo: a model class met before (the other size) would recompile with dynamic
        # shapes, or past dynamo's recompile limit run eagerly, instead of compiling as a new user's would
        torch._dynamo.reset()
        return torch.compile(model)
    if variant == "thunderlite fast":
        return thunderlite.jit(model, tiering=False)
    return thunderlite.jit(model, tiering=tiering_calls)


def run_model(name: str, size: str, steps: int, tiering_calls: int, atol: float, rtol: float,
              clock: str = "wall") -> dict:
    """One model at one size: every variant built from the same initial weights,
    its first call timed, checked against eager, then timed in interleaved rounds."""
    import torch

    import thunderlite
    from thunderlite.frontend.caching.tiers import TRIAL_CALLS, TRIAL_WARMUP
    torch.manual_seed(0)
    base, make_batch = MODELS[name](SIZES[size])
    base.train()
    batch = make_batch(torch)
    row: dict = {"model": name, "size": size, "first_s": {}, "errors": []}
    runners, models = {}, {}
    want = None
    for variant in VARIANTS:
        model = copy.deepcopy(base)
        runner = _make(variant, model, tiering_calls)
        start = time.perf_counter()
        try:
            out = _step(runner, batch)
        except Exception as e:  # noqa: BLE001 - a variant that fails is reported, the others still run
            row["errors"].append(f"{variant}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        row["first_s"][variant] = time.perf_counter() - start
        got = _results(model, out)
        if variant == "eager":
            want = got
        else:
            bad = _check(variant, got, want, atol, rtol)
            if bad:
                row["errors"].append(bad)
                continue
        runners[variant], models[variant] = runner, model
    if "thunderlite" in runners:        # reach the hot tier: calls, then the worker's compile
        jm, model = runners["thunderlite"], models["thunderlite"]
        start = time.perf_counter() - row["first_s"]["thunderlite"]
        for _ in range(tiering_calls - 1):
            _step(jm, batch)
        thunderlite.wait_for_tiers(jm)
        for _ in range(1 + TRIAL_WARMUP + 5 * TRIAL_CALLS):     # the hot tier's trial against the fast one
            _step(jm, batch)
            if all(t["tier"] != "trial" for t in thunderlite.cache_info(jm)["tiers"]):
                break
        row["hot_s"] = time.perf_counter() - start
        row["tiers"] = thunderlite.cache_info(jm)["tiers"]
        bad = _check("thunderlite (hot tier)", _results(model, _step(jm, batch)), want, atol, rtol)
        if bad:
            row["errors"].append(bad)
            del runners["thunderlite"]
    row["ms"], row["ratio"] = _timed(runners, batch, steps, clock)
    return row


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def _timed(runners: dict, batch: dict, steps: int, clock: str = "wall") -> tuple[dict, dict]:
    """Median step (ms) per variant, and the median of its per-round ratios to
    eager's; the order of the variants rotates each round. ``clock``: wall
    time, or the CPU time of this thread (on the CPU the backward runs on it
    too: with one intra-op thread that is the step's work, whatever else the
    machine runs)."""
    now = CLOCKS[clock]
    names = list(runners)
    for n in names:
        _step(runners[n], batch)
    times: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    for r in range(steps):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            start = now()
            _step(runners[n], batch)
            times[n].append(now() - start)
    ms = {n: statistics.median(t) * 1e3 for n, t in times.items()}
    ratio = {}
    if "eager" in times:
        ratio = {n: statistics.median(a / b for a, b in zip(t, times["eager"], strict=True)) for n, t in times.items()}
    return ms, ratio


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _tier_note(row: dict) -> str:
    """The hot tier's fate in a few words: kept, or why not (the trial's CPU ms per call)."""
    tier = row["tiers"][-1] if row.get("tiers") else {}
    name = tier.get("tier", "-")
    fast, hot = tier.get("fast_ms_per_call"), tier.get("hot_ms_per_call")
    if name == "fast (final)" and fast is not None and hot is not None:
        return f"fast kept: hot {hot:.1f} ms vs fast {fast:.1f} ms CPU a call"
    if name == "fast (final)":
        return f"fast kept: {tier.get('reason', '')[:80]}"
    return name


def table(rows: list[dict]) -> str:
    head = ("| model | size | eager step ms | inductor / eager | thunderlite fast / eager | thunderlite / eager "
            "| first call: eager s | inductor s | thunderlite s | thunderlite to hot tier s | hot tier |")
    lines = [head, "|" + " --- |" * 11]
    for r in rows:
        state = _tier_note(r)
        lines.append(
            f"| {r['model']} | {r['size']} | {_fmt(r['ms'].get('eager'), '.1f')} "
            f"| {_fmt(r['ratio'].get('inductor'), '.2f')} | {_fmt(r['ratio'].get('thunderlite fast'), '.2f')} "
            f"| {_fmt(r['ratio'].get('thunderlite'), '.2f')} | {_fmt(r['first_s'].get('eager'), '.2f')} "
            f"| {_fmt(r['first_s'].get('inductor'), '.1f')} "
            f"| {_fmt(r['first_s'].get('thunderlite'), '.2f')} | {_fmt(r.get('hot_s'), '.1f')} | {state} |")
    for size in dict.fromkeys(r["size"] for r in rows):
        sel = [r for r in rows if r["size"] == size]

        def med(values):
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else None
        lines.append(
            f"| **median** | {size} | {_fmt(med(r['ms'].get('eager') for r in sel), '.1f')} "
            f"| {_fmt(med(r['ratio'].get('inductor') for r in sel), '.2f')} "
            f"| {_fmt(med(r['ratio'].get('thunderlite fast') for r in sel), '.2f')} "
            f"| {_fmt(med(r['ratio'].get('thunderlite') for r in sel), '.2f')} "
            f"| {_fmt(med(r['first_s'].get('eager') for r in sel), '.2f')} "
            f"| {_fmt(med(r['first_s'].get('inductor') for r in sel), '.1f')} "
            f"| {_fmt(med(r['first_s'].get('thunderlite') for r in sel), '.2f')} "
            f"| {_fmt(med(r.get('hot_s') for r in sel), '.1f')} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {','.join(MODELS)}")
    p.add_argument("--sizes", default="tiny,medium", help="comma-separated, of tiny,medium")
    p.add_argument("--steps", type=int, default=12, help="interleaved timing rounds")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tier-after", type=int, default=None,
                   help="calls before the hot tier (default: the library's, TierPolicy.after_calls)")
    p.add_argument("--atol", type=float, default=1e-4)
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--warm-cache", action="store_true", help="keep Inductor's cache directory (default: a fresh one)")
    p.add_argument("--json", default=None, help="also write every row (times, ratios, tiers, errors) to this file")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="step times in wall time (default) or in this thread's CPU time (steadier on a loaded machine)")
    opts = p.parse_args(argv)
    if not opts.warm_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench_models_inductor_")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from thunderlite.frontend.caching.tiers import DEFAULT_AFTER_CALLS
    torch.set_num_threads(opts.threads)
    warnings.filterwarnings("ignore")
    after = opts.tier_after or DEFAULT_AFTER_CALLS
    models, sizes = opts.models.split(","), opts.sizes.split(",")
    unknown = [m for m in models if m not in MODELS] + [s for s in sizes if s not in SIZES]
    if unknown:
        p.error(f"unknown models or sizes: {unknown}")
    rows = []
    for size in sizes:
        for name in models:
            with contextlib.redirect_stdout(sys.stderr):
                row = run_model(name, size, opts.steps, after, opts.atol, opts.rtol, opts.clock)
            rows.append(row)
            print(f"{name} {size}: " + ", ".join(f"{k} {v:.2f}" for k, v in row["ratio"].items())
                  + (f"; ERRORS: {row['errors']}" if row["errors"] else ""), file=sys.stderr, flush=True)
    print(f"\nCPU, {opts.threads} thread(s), torch {torch.__version__}; step = forward + loss.backward(), "
          f"{opts.clock} time; ratios: median of {opts.steps} interleaved rounds' paired ratios; hot tier after "
          f"{after} calls; first calls in wall time\n")
    print(table(rows))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump([{k: v for k, v in r.items()} for r in rows], f, indent=1, default=str)
    errors = [e for r in rows for e in r["errors"]]
    if errors:
        print("\nwrong or failed variants:\n" + "\n".join(f"- {r['model']} {r['size']}: {e}" for r in rows
                                                         for e in r["errors"]))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
