"""A tiny HF transformers LlamaForCausalLM (random weights, built from a
LlamaConfig, no download) through thunderlite.jit matches eager, with and
without use_cache (issue 4)."""
from __future__ import annotations

import pytest
import torch

import thunderlite

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")


def _tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _cache_tensors(cache):
    out = []
    for layer in getattr(cache, "layers", []):
        out += [layer.keys, layer.values]
    return out


@pytest.mark.parametrize("use_cache", [False, True])
def test_llama_matches_eager(use_cache):
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 8))
    jm = thunderlite.jit(model)
    with torch.no_grad():
        expected = model(ids, use_cache=use_cache)
        got = jm(ids, use_cache=use_cache)
        torch.testing.assert_close(got.logits, expected.logits)
        if use_cache:
            exp_t, got_t = _cache_tensors(expected.past_key_values), _cache_tensors(got.past_key_values)
            assert len(exp_t) == len(got_t) > 0
            for e, g in zip(exp_t, got_t, strict=True):
                torch.testing.assert_close(g, e)
        else:
            assert got.past_key_values is None
        again = jm(ids, use_cache=use_cache)
        torch.testing.assert_close(again.logits, expected.logits)
    assert thunderlite.cache_info(jm)["hits"] >= 1


def test_llama_decode_step_with_cache_passed_in():
    model = _tiny_llama()
    jm = thunderlite.jit(model)
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        e1, j1 = model(ids, use_cache=True), jm(ids, use_cache=True)
        nxt = e1.logits[:, -1:].argmax(-1)
        e2 = model(nxt, past_key_values=e1.past_key_values, use_cache=True)
        j2 = jm(nxt, past_key_values=j1.past_key_values, use_cache=True)
    torch.testing.assert_close(j2.logits, e2.logits)
    # the cache passed in is updated as eager updates it (epilogue write-back)
    for e, g in zip(_cache_tensors(e1.past_key_values), _cache_tensors(j1.past_key_values), strict=True):
        assert g.shape[-2] == 7
        torch.testing.assert_close(g, e)


def test_llama_trace_names_modeling_llama_lines():
    # transformers is an installed package, yet its model code is the user's: q_proj's linear is shown
    # under modeling_llama.py's line, not thunderlite's api.py nor torch's nn.Linear.forward
    model = _tiny_llama()
    jm = thunderlite.jit(model)
    with torch.no_grad():
        jm(torch.randint(0, 64, (2, 8)))
    final = thunderlite.last_traces(jm)[-1]
    text = str(final).splitlines()
    q_proj = [b for b in final.bound_symbols if b.sym.name == "linear" and "q_proj" in b.args[1].name]
    assert len(q_proj) == 2                                     # one per layer
    for b in q_proj:
        at = text.index(next(line for line in text if line.startswith(f"  {b.output.name} = ")))
        comment = next(line for line in reversed(text[:at]) if line.startswith("  # ") and ".py:" in line)
        fname, lineno, code = comment[len("  # "):].split(":", 2)
        assert fname == transformers.models.llama.modeling_llama.__file__, comment
        assert code.strip().startswith("query_states = self.q_proj(hidden_states)"), comment
        assert (fname, int(lineno)) == tuple(b.source[:2]) and b.source.via[-1][0].endswith("linear.py")
