"""HF transformers on jitted models (issue 33, part 2): a jitted module carries
the model's forward signature (what HF ``Trainer`` reads to keep dataset
columns), ``Trainer`` trains it as eager does, and ``generate()`` gives eager's
tokens both ways, ``m.forward = thunderlite.jit(m.forward)`` and
``thunderlite.jit(m).generate(...)`` (which runs the compiled forward): greedy
and sampling, dynamic and static caches, a batch with left padding.

A tiny random Llama built from a config: no download."""
from __future__ import annotations

import inspect

import pytest
import torch

import thunderlite

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")

VOCAB = 128


def _llama(seed: int = 0):
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB, pad_token_id=0)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def _padded_batch():
    """Two prompts, the first left-padded by three positions, with their mask."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return ids.masked_fill(mask == 0, 0), mask


def test_jitted_module_carries_the_forward_signature():
    model = _llama()
    jm = thunderlite.jit(model)
    sig = inspect.signature(model.forward)
    assert "input_ids" in sig.parameters and "labels" in sig.parameters
    assert inspect.signature(jm.forward) == sig
    assert inspect.signature(jm) == sig
    assert jm.forward.__func__ is not type(jm).forward      # a method of this jitted module
    lin = torch.nn.Linear(3, 2)
    jl = thunderlite.jit(lin)
    assert inspect.signature(jl.forward) == inspect.signature(lin.forward)
    x = torch.randn(4, 3)
    torch.testing.assert_close(jl.forward(x), lin(x))
    torch.testing.assert_close(jl(x), lin(x))


def test_trainer_keeps_the_dataset_columns_and_trains_as_eager():
    pytest.importorskip("accelerate", reason="HF Trainer needs accelerate (pip install -e '.[test]')")
    g = torch.Generator().manual_seed(1)
    rows = [{"input_ids": torch.randint(0, VOCAB, (8,), generator=g),
             "labels": torch.randint(0, VOCAB, (8,), generator=g),
             "source": 7} for _ in range(8)]      # a column forward does not take: dropped

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return dict(rows[i])

    def train(model, out_dir):
        args = transformers.TrainingArguments(
            output_dir=str(out_dir), per_device_train_batch_size=4, max_steps=3, learning_rate=1e-3,
            report_to=[], logging_steps=1, save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Rows())
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    def tmp(name):
        import tempfile
        return tempfile.mkdtemp(prefix=f"tl_trainer_{name}_")

    eager, jitted = _llama(), _llama()
    jm = thunderlite.jit(jitted)
    eager_losses = train(eager, tmp("eager"))
    jit_losses = train(jm, tmp("jit"))
    assert len(jit_losses) == len(eager_losses) == 3
    torch.testing.assert_close(torch.tensor(jit_losses), torch.tensor(eager_losses))
    for p, q in zip(jitted.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    assert thunderlite.cache_info(jm)["misses"] >= 1


CASES = {
    "greedy": dict(do_sample=False),
    "sampling": dict(do_sample=True, top_k=0),
    "static greedy": dict(do_sample=False, cache_implementation="static"),
    "static sampling": dict(do_sample=True, cache_implementation="static"),
}


@pytest.mark.parametrize("way", ["jit(m.forward)", "jit(m).generate"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_gives_eager_tokens(way, cache):
    ref, model = _llama().eval(), _llama().eval()
    if way == "jit(m.forward)":
        model.forward = thunderlite.jit(model.forward)
        jitted, gen = model.forward, model.generate
    else:
        jitted = thunderlite.jit(model)
        gen = jitted.generate
    ids, mask = _padded_batch()
    steps = 4
    names = [name for name in CASES if ("static" in name) == (cache == "static")]
    for name in [names[0], *names]:     # greedy twice: a second generate gives the same tokens
        kw = CASES[name]
        torch.manual_seed(11)
        expected = ref.generate(ids, attention_mask=mask, max_new_tokens=steps, **kw)
        torch.manual_seed(11)
        before = thunderlite.cache_info(jitted)
        got = gen(ids, attention_mask=mask, max_new_tokens=steps, **kw)
        after = thunderlite.cache_info(jitted)
        assert torch.equal(got, expected), name
        # every forward of the generate ran the compiled program
        assert (after["hits"] + after["misses"]) - (before["hits"] + before["misses"]) == steps, name
    assert model._compiled_call_impl is None       # jm.generate's route to the compiled call is gone


def test_generate_one_prompt_without_mask():
    ref, model = _llama().eval(), _llama().eval()
    jm = thunderlite.jit(model)
    ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(jm.generate(ids, max_new_tokens=6, do_sample=False),
                               ref.generate(ids, max_new_tokens=6, do_sample=False))
    info = thunderlite.cache_info(jm)
    assert info["hits"] + info["misses"] == 6


def test_a_method_that_raises_removes_the_route():
    model = _llama().eval()
    jm = thunderlite.jit(model)
    with pytest.raises((ValueError, TypeError)):
        jm.generate(torch.randint(1, VOCAB, (1, 4)), max_new_tokens=2, no_such_option=True)
    assert model._compiled_call_impl is None
    ids = torch.randint(1, VOCAB, (1, 4))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, jm(ids).logits)


def test_generate_with_one_reused_static_cache_stops_compiling():
    # each generate() makes its cache anew unless given one, and an object argument is keyed by its
    # identity: a server reuses one cache (reset between requests) so later generates compile nothing
    ref, model = _llama().eval(), _llama().eval()
    jm = thunderlite.jit(model)
    cache = transformers.StaticCache(config=model.config, max_cache_len=24)
    misses = []
    for seed in range(3):
        ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(seed))
        cache.reset()
        got = jm.generate(ids, max_new_tokens=4, do_sample=False, cache=cache)
        assert torch.equal(got, ref.generate(ids, max_new_tokens=4, do_sample=False))
        misses.append(thunderlite.cache_info(jm)["misses"])
    assert misses[2] == misses[1]       # the third request compiled nothing



def test_jm_generate_under_hfs_own_torch_compile_of_the_call():
    # generate() compiles the model's __call__ with torch.compile for static caches on GPUs (forced here on
    # the CPU, with dynamo's eager backend): the route to the jitted call is a graph break, not traced by dynamo
    ref, model = _llama().eval(), _llama().eval()
    jm = thunderlite.jit(model)
    config = transformers.CompileConfig(backend="eager", mode=None)
    config._compile_all_devices = True
    ids = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(2))
    got = jm.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static", compile_config=config)
    assert torch.equal(got, ref.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static"))
    info = thunderlite.cache_info(jm)
    assert info["hits"] + info["misses"] == 4


class _OwnCall(torch.nn.Linear):
    def __call__(self, x):
        return super().__call__(x) + 1     # a root module's own __call__ runs under jit as in eager


def test_a_module_with_its_own_call_runs_it():
    m = _OwnCall(3, 2)
    jm = thunderlite.jit(m)
    x = torch.randn(4, 3)
    torch.testing.assert_close(jm(x), m(x))
