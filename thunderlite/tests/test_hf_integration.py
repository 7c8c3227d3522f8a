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


def _jitted_generate(model, way: str):
    """(the jitted callable, the generate to call) for one of the two ways of jitting a model."""
    if way == "jit(m.forward)":
        model.forward = thunderlite.jit(model.forward)
        return model.forward, model.generate
    jitted = thunderlite.jit(model)
    return jitted, jitted.generate


@pytest.mark.parametrize("way", ["jit(m.forward)", "jit(m).generate"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_gives_eager_tokens(way, cache):
    ref, model = _llama().eval(), _llama().eval()
    jitted, gen = _jitted_generate(model, way)
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


# --- a fresh cache per generate (issue 33): caches are keyed by type, not identity ---------------------

@pytest.mark.parametrize("way", ["jit(m.forward)", "jit(m).generate"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_ten_generates_with_fresh_caches_compile_prefill_and_decode_once(way, cache):
    # generate() makes a new DynamicCache/StaticCache per call; the program only reads it through its
    # attributes, so it is keyed by its type: later generates run the entries the first one compiled
    ref, model = _llama().eval(), _llama().eval()
    jitted, gen = _jitted_generate(model, way)
    kw = dict(do_sample=False, max_new_tokens=6)
    if cache == "static":
        kw["cache_implementation"] = "static"
    g = torch.Generator().manual_seed(7)
    for i in range(10):
        ids = torch.randint(1, VOCAB, (1, 5), generator=g)
        assert torch.equal(gen(ids, **kw), ref.generate(ids, **kw)), i
    info = thunderlite.cache_info(jitted)
    assert info["misses"] == 2 and info["eager_calls"] == 0, info      # the prompt, then every token
    assert info["hits"] == 10 * 6 - 2


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_fresh_caches_sampling_a_padded_batch(cache):
    ref, model = _llama().eval(), _llama().eval()
    jm = thunderlite.jit(model)
    ids, mask = _padded_batch()
    kw = dict(do_sample=True, max_new_tokens=5, attention_mask=mask)
    if cache == "static":
        kw["cache_implementation"] = "static"
    for seed in range(4):
        torch.manual_seed(seed)
        expected = ref.generate(ids, **kw)
        torch.manual_seed(seed)
        assert torch.equal(jm.generate(ids, **kw), expected), seed
    info = thunderlite.cache_info(jm)
    assert info["misses"] <= 3 and info["eager_calls"] == 0, info


def test_generate_with_the_callers_cache_leaves_eagers_state_in_it():
    # the cache the caller passes (a new object per request) ends holding eager's keys and values, and the
    # output returned with return_dict_in_generate is that very object
    ref, model = _llama().eval(), _llama().eval()
    jm = thunderlite.jit(model)
    for seed in range(3):
        ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(seed))
        mine, theirs = transformers.DynamicCache(), transformers.DynamicCache()
        got = jm.generate(ids, max_new_tokens=4, do_sample=False, cache=mine,
                          return_dict_in_generate=True, output_logits=True)
        expected = ref.generate(ids, max_new_tokens=4, do_sample=False, cache=theirs,
                                return_dict_in_generate=True, output_logits=True)
        assert torch.equal(got.sequences, expected.sequences)
        for a, b in zip(got.logits, expected.logits, strict=True):
            torch.testing.assert_close(a, b)
        assert got.past_key_values is mine
        for lm, lt in zip(mine.layers, theirs.layers, strict=True):
            torch.testing.assert_close(lm.keys, lt.keys)
            torch.testing.assert_close(lm.values, lt.values)
    assert thunderlite.cache_info(jm)["misses"] == 2


def test_forward_returns_the_calls_own_cache():
    ref, model = _llama().eval(), _llama().eval()
    jm = thunderlite.jit(model)
    ids = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for _ in range(3):
            mine, theirs = transformers.DynamicCache(), transformers.DynamicCache()
            out = jm(input_ids=ids, cache=mine, use_cache=True)
            expected = ref(input_ids=ids, cache=theirs, use_cache=True)
            assert out.past_key_values is mine
            torch.testing.assert_close(out.logits, expected.logits)
            torch.testing.assert_close(mine.layers[1].keys, theirs.layers[1].keys)
    assert thunderlite.cache_info(jm)["misses"] == 1


def test_generates_from_many_threads_with_fresh_caches():
    # a server: several threads generate at once through one jitted model, each with its own new cache;
    # every result is eager's, and the entries compiled serve them all (objects keyed by type)
    import threading
    import traceback
    ref, model = _llama().eval(), _llama().eval()
    jm = thunderlite.jit(model)
    kw = dict(do_sample=False, max_new_tokens=5)
    prompts = [torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(i)) for i in range(8)]
    expected = [ref.generate(p, **kw) for p in prompts]
    errors: list[str] = []
    start = threading.Barrier(4)

    def work(i):
        try:
            start.wait()
            for j in (i, i + 4):
                assert torch.equal(jm.generate(prompts[j], **kw), expected[j]), j
        except BaseException:   # noqa: BLE001 - every failure of every thread is reported
            errors.append(traceback.format_exc())
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    info = thunderlite.cache_info(jm)
    assert info["eager_calls"] == 0 and info["misses"] <= 3, info
