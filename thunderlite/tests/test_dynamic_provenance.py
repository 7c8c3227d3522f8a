"""Automatic dynamic sizes and numbers wherever a value comes from (issue 33,
parts 1 and 4): tensors read through an argument's attributes and containers,
module buffers, globals and closure cells get symbolic sizes after the first
recompile their size caused (at once when the program grows them), floats that
keep changing become trace inputs, and a callable's entries are bounded.
Every result and every written-back state is checked against eager."""
from __future__ import annotations

import copy
import gc
import warnings

import pytest
import torch

import thunderlite


def _info(jf) -> dict:
    return thunderlite.cache_info(jf)


class _State:
    """A plain object holding tensors (an HF cache object in miniature)."""


# --- tensors read through paths --------------------------------------------------------------

def _grow(x, st):
    st.buf = torch.cat([st.buf, x[None]])
    return st.buf.sum(0) * 2


def test_attribute_tensor_grown_by_the_program_compiles_once():
    st, ref = _State(), _State()
    st.buf = torch.randn(2, 4)
    ref.buf = st.buf.clone()
    jf = thunderlite.jit(_grow)
    for _ in range(12):
        x = torch.randn(4)
        torch.testing.assert_close(jf(x, st), _grow(x, ref))
        torch.testing.assert_close(st.buf, ref.buf)
    assert st.buf.shape == (14, 4)
    assert _info(jf)["misses"] == 1
    assert "grows on every call" in _info(jf)["last_miss_reason"]


def _read_attr(x, st):
    return x + st.bias.sum(0)


def test_attribute_tensor_changed_outside_becomes_symbolic_after_one_recompile():
    st = _State()
    jf = thunderlite.jit(_read_attr)
    x = torch.randn(3)
    for n in range(2, 12):
        st.bias = torch.randn(n, 3)
        torch.testing.assert_close(jf(x, st), _read_attr(x, st))
    info = _info(jf)
    assert info["misses"] == 2 and info["entries"] == 2
    assert "argument 1.bias.shape" in info["last_miss_reason"] and "symbolic from now on" in info["last_miss_reason"]


def test_dynamic_true_makes_path_sizes_symbolic_from_the_first_call():
    st = _State()
    jf = thunderlite.jit(_read_attr, dynamic=True)
    x = torch.randn(3)
    for n in range(2, 9):
        st.bias = torch.randn(n, 3)
        torch.testing.assert_close(jf(x, st), _read_attr(x, st))
    assert _info(jf)["misses"] == 1


def test_dynamic_false_keeps_path_sizes_static():
    st = _State()
    jf = thunderlite.jit(_read_attr, dynamic=False, max_entries=None)
    x = torch.randn(3)
    for n in range(2, 6):
        st.bias = torch.randn(n, 3)
        torch.testing.assert_close(jf(x, st), _read_attr(x, st))
    assert _info(jf)["misses"] == 4


def _items(x, st):
    st.seq[0] = torch.cat([st.seq[0], x[None]])
    st.named["k"] = torch.cat([st.named["k"], 2 * x[None]])
    return st.seq[0].sum(0) + st.named["k"].mean(0) + st.seq[1]


def test_list_and_dict_items_of_an_attribute_grow_with_one_compile():
    st, ref = _State(), _State()
    st.seq, st.named = [torch.randn(2, 3), torch.randn(3)], {"k": torch.randn(3, 3)}
    ref.seq, ref.named = [t.clone() for t in st.seq], {"k": st.named["k"].clone()}
    jf = thunderlite.jit(_items)
    for _ in range(8):
        x = torch.randn(3)
        torch.testing.assert_close(jf(x, st), _items(x, ref))
        torch.testing.assert_close(st.seq, ref.seq)
        torch.testing.assert_close(st.named, ref.named)
    assert _info(jf)["misses"] == 1


class _History(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("hist", torch.zeros(2, 3))

    def forward(self, x):
        self.hist = torch.cat([self.hist, self.lin(x)[None]])
        return self.hist.mean(0)


def test_module_buffer_grown_in_forward_compiles_once():
    torch.manual_seed(0)
    m = _History()
    ref = copy.deepcopy(m)
    jm = thunderlite.jit(m)
    with torch.no_grad():
        for _ in range(10):
            x = torch.randn(3)
            torch.testing.assert_close(jm(x), ref(x))
            torch.testing.assert_close(m.hist, ref.hist)
    assert m.hist.shape == (12, 3) and "hist" in dict(m.named_buffers())
    assert _info(jm)["misses"] == 1


class _Window(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.ones(2))

    def forward(self, x):
        return x[: self.mask.shape[0]] * self.mask


def test_module_buffer_resized_outside_becomes_symbolic():
    m = _Window()
    jm = thunderlite.jit(m)
    x = torch.randn(20)
    for n in range(2, 10):
        m.mask = torch.rand(n)
        torch.testing.assert_close(jm(x), m(x))
    assert _info(jm)["misses"] == 2


HISTORY = torch.zeros(2, 3)


def _global_grow(x):
    global HISTORY
    HISTORY = torch.cat([HISTORY, x[None]])
    return HISTORY.sum(0)


def test_global_tensor_grown_by_the_program_compiles_once():
    global HISTORY
    HISTORY = torch.zeros(2, 3)
    xs = [torch.randn(3) for _ in range(8)]
    expected = [_global_grow(x) for x in xs]
    final = HISTORY
    HISTORY = torch.zeros(2, 3)
    jf = thunderlite.jit(_global_grow)
    for x, e in zip(xs, expected, strict=True):
        torch.testing.assert_close(jf(x), e)
    torch.testing.assert_close(HISTORY, final)
    assert _info(jf)["misses"] == 1


def _closure_grower():
    state = torch.zeros(2, 3)

    def step(x):
        nonlocal state
        state = torch.cat([state, x[None]])
        return state.sum(0) / state.shape[0]
    return step


def test_closure_cell_tensor_grown_by_the_program_compiles_once():
    eager, jf = _closure_grower(), thunderlite.jit(_closure_grower())
    for _ in range(8):
        x = torch.randn(3)
        torch.testing.assert_close(jf(x), eager(x))
    assert _info(jf)["misses"] == 1


def _decides(x, st):
    if st.buf.shape[0] > 5:          # a decision on a symbolic size: guarded
        return x * 2 + st.buf.sum(0)
    return x * 3 + st.buf.sum(0)


def test_decision_on_a_path_size_is_guarded():
    st = _State()
    jf = thunderlite.jit(_decides)
    x = torch.randn(3)
    for n in [2, 3, 4, 5, 6, 7, 8, 4, 9, 3]:
        st.buf = torch.randn(n, 3)
        torch.testing.assert_close(jf(x, st), _decides(x, st))
    assert _info(jf)["entries"] <= 4


def _specializes(x, st):
    return x.view(st.buf.shape[0], -1) + st.buf.sum(1, keepdim=True)


def test_path_size_used_as_a_view_size_stays_correct():
    st = _State()
    jf = thunderlite.jit(_specializes)
    for n in [2, 4, 6, 8]:
        st.buf = torch.randn(n, 3)
        x = torch.randn(n * 5)
        torch.testing.assert_close(jf(x, st), _specializes(x, st))


def test_parameters_stay_static():
    lin = torch.nn.Linear(4, 4)

    def f(x):
        return lin(x)
    jf = thunderlite.jit(f)
    x = torch.randn(2, 4)
    jf(x)
    lin.weight = torch.nn.Parameter(torch.randn(5, 4))
    lin.bias = torch.nn.Parameter(torch.randn(5))
    torch.testing.assert_close(jf(x), f(x))
    lin.weight = torch.nn.Parameter(torch.randn(6, 4))
    lin.bias = torch.nn.Parameter(torch.randn(6))
    torch.testing.assert_close(jf(x), f(x))
    trace = str(thunderlite.last_traces(jf)[0])
    assert "f32[6, 4]" in trace                 # the weight's sizes are constants of the trace


def _new_object(x, st):
    if not st.layers:
        layer = _State()
        layer.k = x * 2
        st.layers.append(layer)
    else:
        st.layers[0].k = torch.cat([st.layers[0].k, x])
    return st.layers[0].k.sum()


def test_object_made_in_the_call_and_stored_outside_holds_real_tensors():
    st, ref = _State(), _State()
    st.layers, ref.layers = [], []
    jf = thunderlite.jit(_new_object)
    for _ in range(5):
        x = torch.randn(3)
        torch.testing.assert_close(jf(x, st), _new_object(x, ref))
        assert type(st.layers[0].k) is torch.Tensor
        torch.testing.assert_close(st.layers[0].k, ref.layers[0].k)
    assert _info(jf)["misses"] <= 3


# --- HF caches -------------------------------------------------------------------------------

def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    torch.manual_seed(0)
    return transformers, cfg, transformers.LlamaForCausalLM(cfg).eval()


def _decode(fn, cache, tokens: int) -> list[torch.Tensor]:
    prompt = torch.tensor([[1, 5, 7, 9, 11]])
    out = fn(input_ids=prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(5))
    logits = [out.logits]
    for i in range(tokens):
        tok = out.logits[:, -1:].argmax(-1)
        out = fn(input_ids=tok, past_key_values=cache, use_cache=True, cache_position=torch.tensor([5 + i]))
        logits.append(out.logits)
    return logits


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_hf_decode_loop_compiles_twice(kind):
    transformers, cfg, m = _tiny_llama()

    def cache():
        if kind == "dynamic":
            return transformers.DynamicCache()
        return transformers.StaticCache(config=cfg, max_cache_len=40)
    jm = thunderlite.jit(m)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)      # HF's past_key_values -> cache rename
        expected = _decode(m, cache(), 24)
        got = _decode(jm, cache(), 24)
        for e, g in zip(expected, got, strict=True):
            torch.testing.assert_close(g, e)
        info = _info(jm)
        assert info["misses"] == 2 and info["hits"] == 23        # the prompt, then every token
        # another conversation: a new cache object is a new key (objects are keyed by identity)
        got = _decode(jm, cache(), 24)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e)
    assert _info(jm)["misses"] == 4 and _info(jm)["eager_calls"] == 0


# --- floats ----------------------------------------------------------------------------------

def _scaled(x, scale):
    return x * scale + 1.0


def test_changing_float_argument_becomes_a_trace_input():
    jf = thunderlite.jit(_scaled)
    x = torch.randn(4)
    for i in range(300):
        s = 0.5 + i / 7
        torch.testing.assert_close(jf(x, s), _scaled(x, s))
    info = _info(jf)
    assert info["misses"] == 2 and info["entries"] == 2
    assert "scale is a trace input from now on" in info["last_miss_reason"]


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 1.0

    def forward(self, x):
        return x * self.scale


def test_changing_float_attribute_becomes_a_trace_input():
    m = _Scaled()
    jm = thunderlite.jit(m)
    x = torch.randn(4)
    for i in range(50):
        m.scale = 0.25 * i
        torch.testing.assert_close(jm(x), m(x))
    assert _info(jm)["misses"] == 2


def test_float_attribute_that_turns_int_is_not_read_as_the_float_input():
    m = _Scaled()
    jm = thunderlite.jit(m)
    x = torch.randn(4)
    for v in [0.5, 1.5, 2.5, 3, 4.5, 2, True, 0.75]:
        m.scale = v
        out = jm(x)
        torch.testing.assert_close(out, m(x))
        assert out.dtype == torch.float32
    prologue = str(thunderlite.last_prologue_traces(jm)[-1])
    assert "check_type(scale, 'float')" in prologue        # the float input's type is checked per call


TEMPERATURE = 1.0


def _tempered(x):
    return x / TEMPERATURE


def test_changing_float_global_becomes_a_trace_input():
    global TEMPERATURE
    jf = thunderlite.jit(_tempered)
    x = torch.randn(4)
    for i in range(20):
        TEMPERATURE = 0.5 + i
        torch.testing.assert_close(jf(x), _tempered(x))
    assert _info(jf)["misses"] == 2


class _Decay(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rate = 1.0

    def forward(self, x):
        self.rate = self.rate * 0.5         # a float the program itself updates
        return x * self.rate


def test_float_updated_by_the_program_is_written_back():
    m, ref = _Decay(), _Decay()
    jm = thunderlite.jit(m)
    x = torch.randn(3)
    for _ in range(10):
        torch.testing.assert_close(jm(x), ref(x))
        assert m.rate == ref.rate and type(m.rate) is float
    assert _info(jm)["misses"] == 2


def _branches(x, t):
    if t > 0.5:                 # a decision on the float: it cannot stay symbolic
        return x * t
    return x - t


def test_float_that_cannot_stay_symbolic_is_keyed_by_value():
    jf = thunderlite.jit(_branches)
    x = torch.randn(3)
    reasons = []
    for t in [0.1, 0.9, 0.2, 0.7, 0.9, 0.1]:
        torch.testing.assert_close(jf(x, t), _branches(x, t))
        reasons.append(_info(jf)["last_miss_reason"])
    assert "t is a trace input" in reasons[1] and "symbolic ones failed" in reasons[1]
    assert "symbolic" not in reasons[3]          # keyed by value from then on
    assert _info(jf)["misses"] == 4 and _info(jf)["hits"] == 2


# --- bounded caches --------------------------------------------------------------------------

def _add_step(x, step):
    return x + step


def test_entries_are_bounded_with_one_warning_and_eager_answers():
    jf = thunderlite.jit(_add_step, max_entries=3)
    x = torch.randn(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(10):
            torch.testing.assert_close(jf(x, step), _add_step(x, step))
    full = [w for w in caught if "max_entries" in str(w.message)]
    assert len(full) == 1
    msg = str(full[0].message)
    assert "step" in msg and "run eagerly" in msg and "pass it as a tensor" in msg
    assert full[0].filename == __file__
    info = _info(jf)
    assert info["entries"] == 3 and info["eager_calls"] == 7
    assert "max_entries=3" in info["last_miss_reason"]
    torch.testing.assert_close(jf(x, 1), x + 1)         # a compiled entry still serves its calls
    assert _info(jf)["eager_calls"] == 7


def test_default_bound_is_eight_and_none_is_unbounded():
    jf = thunderlite.jit(_add_step)
    x = torch.randn(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(12):
            jf(x, step)
    assert _info(jf)["entries"] == 8 and _info(jf)["eager_calls"] == 4
    jf = thunderlite.jit(_add_step, max_entries=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(12):
            jf(x, step)
    assert _info(jf)["entries"] == 12
    with pytest.raises(ValueError, match="max_entries"):
        thunderlite.jit(_add_step, max_entries=0)


def test_bounded_module_runs_eagerly_with_its_writes():
    m, ref = _History(), None
    ref = copy.deepcopy(m)
    jm = thunderlite.jit(m, max_entries=1, dynamic=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(4):
            x = torch.randn(3)
            torch.testing.assert_close(jm(x), ref(x))
            torch.testing.assert_close(m.hist, ref.hist)
    assert _info(jm)["entries"] == 1 and _info(jm)["eager_calls"] == 3


def _gc_objects() -> int:
    gc.collect()
    return len(gc.get_objects())


@pytest.mark.parametrize("change", ["shapes", "floats", "ints", "path sizes"])
def test_memory_stays_flat_over_ten_thousand_calls(change):
    st = _State()
    jf = thunderlite.jit(_read_attr if change == "path sizes" else _scaled)

    def call(i):
        if change == "shapes":
            return jf(torch.ones(2 + i % 50), 0.5)
        if change == "floats":
            return jf(torch.ones(3), 0.5 + i)
        if change == "ints":
            return jf(torch.ones(3), i)
        st.bias = torch.ones(2 + i % 50, 3)
        return jf(torch.ones(3), st)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(1000):
            call(i)
        before = _gc_objects()
        for i in range(1000, 10_000):
            call(i)
        after = _gc_objects()
    info = _info(jf)
    assert info["entries"] <= 8
    assert info["entries"] <= (8 if change == "ints" else 2)
    assert after - before < 200, f"{after - before} objects more after 9000 calls"


# --- soundness around symbolic path sizes ----------------------------------------------------

def _records_length(x, st):
    st.n = st.buf.shape[0]          # a symbolic size written back: its value on each call
    st.buf.mul_(2)                  # written in place
    return x * st.buf.sum()


def test_symbolic_path_size_written_back_and_in_place_write():
    st, ref = _State(), _State()
    jf = thunderlite.jit(_records_length)
    x = torch.randn(3)
    for n in [2, 3, 4, 5, 3]:
        st.buf, ref.buf = torch.randn(n), None
        ref.buf = st.buf.clone()
        torch.testing.assert_close(jf(x, st), _records_length(x, ref))
        assert st.n == ref.n == n and type(st.n) is int
        torch.testing.assert_close(st.buf, ref.buf)
    assert _info(jf)["misses"] == 2


def _uses_weight(x, st):
    return (x @ st.w).sum()


def test_symbolic_path_tensor_requiring_grad_gets_eagers_gradient():
    st = _State()
    jf = thunderlite.jit(_uses_weight)
    for n in [2, 3, 4, 6]:
        w = torch.randn(3, n, requires_grad=True)
        x = torch.randn(2, 3)
        st.w = w
        jf(x, st).backward()
        ref = w.detach().clone().requires_grad_(True)
        st.w = ref
        _uses_weight(x, st).backward()
        torch.testing.assert_close(w.grad, ref.grad)
    assert _info(jf)["misses"] == 2


def _two_paths(x, st):
    return x + st.a.sum(0) + st.b.sum(0)


def test_one_tensor_on_two_paths_with_symbolic_sizes():
    st = _State()
    jf = thunderlite.jit(_two_paths)
    x = torch.randn(3)
    for n, same in [(2, True), (3, True), (4, False), (5, True), (6, False)]:
        st.a = torch.randn(n, 3)
        st.b = st.a if same else torch.randn(n, 3)
        torch.testing.assert_close(jf(x, st), _two_paths(x, st))


def _any_rank(x, st):
    return x + st.buf.sum()


def test_path_tensor_changing_rank_or_kind():
    st = _State()
    jf = thunderlite.jit(_any_rank)
    x = torch.randn(3)
    for buf in [torch.randn(2), torch.randn(3), torch.randn(2, 2), torch.randn(4), torch.randn(3, 3, 3),
                torch.randn(5).double(), torch.randn(6)]:
        st.buf = buf
        torch.testing.assert_close(jf(x, st), _any_rank(x, st))
    st.buf = [1.0, 2.0]        # not a tensor any more: eager's error
    with pytest.raises(AttributeError):
        _any_rank(x, st)
    with pytest.raises(AttributeError):
        jf(x, st)
