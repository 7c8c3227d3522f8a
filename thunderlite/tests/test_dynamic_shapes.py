"""Symbolic sizes (issue 14): one trace for many sizes, guards on what the
program used, automatic dynamic after a size-only recompile, and eager's
results for every size (docs/architecture.md §8)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunderlite
from thunderlite.core.proxies import NumberProxy
from thunderlite.core.symint import ShapeEnv


def _env_with(*hints):
    env = ShapeEnv()
    syms = [env.size_symbol(NumberProxy(h, int, name=f"s{i}"), h, f"x.shape[{i}]") for i, h in enumerate(hints)]
    return env, syms


# --- the expressions -------------------------------------------------------------------------

def test_arithmetic_normalizes_and_prints():
    env, (s0, s1) = _env_with(128, 4)
    assert str(s0 * 4 // 2) == "2*s0"
    assert str((s1 * s0 * 32) // (s1 * 32)) == "s0"
    assert str(s0 + 3 - 3) == "s0" and (s0 - s0) == 0 and type(s0 - s0) is int
    assert str((s0 * 6) // 4) == "((3*s0) // 2)"
    assert str(s0 % 3) == "(s0 % 3)" and (s0 * 3) % 3 == 0
    assert env.guards == []


def test_facts_decide_without_guards_hints_decide_with_one():
    env, (s0, s1) = _env_with(128, 4)
    assert (s0 == 1) is False and (s0 >= 2) is True and (s0 + 1 > s0) is True
    assert env.guards == []                         # a dynamic size is at least 2: no guard needed
    assert (s1 < s0) is True
    assert [g.python() for g in env.guards] == ["s0 > s1"]
    assert (s0 == 128) is True
    assert [g.python() for g in env.guards] == ["s0 > s1", "s0 == 128"]
    assert str(s0 * 2) == "256"                     # specialized: s0 is replaced by its value


def test_a_guarded_equality_replaces_the_newer_symbol():
    env, (s0, s1) = _env_with(16, 16)
    assert s1 == s0
    assert str(s1 * 2) == "2*s0"
    assert (s1 - s0) == 0
    assert len(env.guards) == 1


def test_concretizing_specializes_with_a_guard():
    env, (s0,) = _env_with(7)
    assert list(range(s0)) == list(range(7))        # C code asks __index__
    assert [g.python() for g in env.guards] == ["s0 == 7"]
    assert env.specialized


def test_unbacked_symbols_refuse_to_be_decided():
    env = ShapeEnv()
    u0 = env.unbacked_symbol(NumberProxy(None, int, name="u0"), "the length of torch.nonzero(x)")
    assert (u0 >= 0) is True                        # a size is never negative
    with pytest.raises(thunderlite.DataDependentError, match="nonzero"):
        bool(u0 == 5)


# --- through the jit --------------------------------------------------------------------------

def _attention(x, wq, wk, wv):
    B, T, C = x.shape
    H = 4
    q = (x @ wq).view(B, T, H, C // H).transpose(1, 2)
    k = (x @ wk).view(B, T, H, -1).transpose(1, 2)
    v = (x @ wv).reshape(B, T, H, C // H).transpose(1, 2)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = (q @ k.transpose(-2, -1)) * 0.125
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
    y = torch.cat([y, x[:, -1:, :]], dim=1)
    return y[:, :T].sum() + y[:, 1:].mean() + torch.arange(T).sum()


def _weights():
    torch.manual_seed(0)
    return [torch.randn(32, 32, requires_grad=True) for _ in range(3)]


def test_twenty_lengths_compile_twice_by_default_with_eager_results_and_grads():
    ws = _weights()
    jf = thunderlite.jit(_attention)
    for T in range(3, 23):
        x = torch.randn(2, T, 32, requires_grad=True)
        out, ref = jf(x, *ws), _attention(x, *ws)
        torch.testing.assert_close(out, ref)
        for g, r in zip(torch.autograd.grad(out, [x, *ws]), torch.autograd.grad(ref, [x, *ws]), strict=True):
            torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)
    info = thunderlite.cache_info(jf)
    assert info["misses"] == 2, info
    assert "; x.shape[1] is symbolic from now on" in info["last_miss_reason"]
    fwd = str(thunderlite.last_traces(jf)[-1])
    assert 'x: "cpu f32[2, s0, 32]"' in fwd
    assert "s0" in str(thunderlite.last_backward_traces(jf)[-1])


def test_twenty_lengths_compile_once_with_symbolic_values():
    ws = [w.detach() for w in _weights()]
    jf = thunderlite.jit(_attention, cache="symbolic values")
    for T in range(3, 23):
        x = torch.randn(2, T, 32)
        torch.testing.assert_close(jf(x, *ws), _attention(x, *ws))
    assert thunderlite.cache_info(jf)["misses"] == 1


def test_dynamic_false_compiles_per_size():
    jf = thunderlite.jit(lambda x: x.sum(-1), dynamic=False)
    for T in (3, 4, 5):
        jf(torch.randn(2, T))
    assert thunderlite.cache_info(jf)["misses"] == 3


def test_guards_only_on_what_the_program_used_and_the_reason_of_a_failed_one():
    def f(x):
        if x.shape[1] == 8:
            return x * 2
        return x.view(x.shape[0], 2, -1).sum(-1)
    jf = thunderlite.jit(f, dynamic=True)
    for T in (8, 8, 6, 10, 8):
        x = torch.randn(3, T)
        torch.testing.assert_close(jf(x), f(x))
    info = thunderlite.cache_info(jf)
    assert info["misses"] == 2
    assert "the size guard s1 == 8 does not hold (s1 = argument 0.shape[1] = 6)" in info["last_miss_reason"]
    pro = str(thunderlite.last_prologue_traces(jf)[-1])
    assert "s1 = prologue.unpack('argument 0.shape[1]')" in pro
    # the view needs an even size: the guard that says so, and the odd size recompiles
    with pytest.raises(RuntimeError, match="invalid for input of size 21"):
        jf(torch.randn(3, 7))


def test_sizes_0_and_1_specialize():
    jf = thunderlite.jit(lambda x: x + x.shape[0], dynamic=True)
    for n in (1, 0, 5, 6, 1):
        x = torch.randn(n, 3)
        torch.testing.assert_close(jf(x), x + n)
    assert thunderlite.cache_info(jf)["misses"] == 3      # 1, 0, and one symbolic entry for 5 and 6


def test_shape_arithmetic_stays_symbolic():
    def f(x, y):
        B, T = x.shape
        z = torch.zeros(B, T * 2)
        z[:, :T] = x
        z[:, T:] = y.expand(B, T)
        return z.view(B, -1, 2).sum(-1), x.shape[1] * 3, x.new_ones(T + 1)
    jf = thunderlite.jit(f, dynamic=True)
    for T in (4, 7, 9):
        x, y = torch.randn(3, T), torch.randn(1, T)
        got, exp = jf(x, y), f(x, y)
        torch.testing.assert_close(got[0], exp[0])
        assert got[1] == exp[1] and type(got[1]) is int
        torch.testing.assert_close(got[2], exp[2])
    assert thunderlite.cache_info(jf)["misses"] == 1


def test_module_and_inplace_with_symbolic_sizes():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU())
    jm = thunderlite.jit(m, dynamic=True)

    def g(x, buf):
        buf[:, : x.shape[1]].add_(x.sum(0))
        return buf.clone()
    jg = thunderlite.jit(g, dynamic=True)
    for n in (5, 9, 12):
        x = torch.randn(2, n, 8)
        torch.testing.assert_close(jm(x), m(x))
        a, b = torch.randn(n, 8), torch.zeros(3, 20)
        b2 = b.clone()
        torch.testing.assert_close(jg(a, b), g(a, b2))
        torch.testing.assert_close(b, b2)
    assert thunderlite.cache_info(jm)["misses"] == 1
    assert thunderlite.cache_info(jg)["misses"] == 1


@pytest.mark.parametrize("executors", [["torchcompile", "torch"], None])
def test_symbolic_sizes_with_each_executor_list(executors):
    def f(x):
        return (x.softmax(-1) * x.shape[-1]).sum(-1) + x[:, :1].squeeze(1)
    jf = thunderlite.jit(f, dynamic=True, executors=executors)
    for n in (4, 6, 11):
        x = torch.randn(3, n)
        torch.testing.assert_close(jf(x), f(x))
    assert thunderlite.cache_info(jf)["misses"] == 1


def test_a_program_symbolic_sizes_cannot_handle_compiles_per_size():
    def f(x):
        return x.reshape(-1).tolist() if False else x.new_zeros(int(x.shape[0] ** 0.5))
    jf = thunderlite.jit(f)
    for n in (4, 9, 16):
        torch.testing.assert_close(jf(torch.randn(n)), f(torch.randn(n)))
    assert thunderlite.cache_info(jf)["misses"] == 3      # each size specializes (a guard per size)


def test_triton_compiles_per_concrete_size_inside_its_own_cache():
    pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")
    from thunderlite import kernel_source
    from thunderlite.executors.triton import runtime
    from thunderlite.executors.triton.executor import SizedTritonKernel
    device = runtime.DEVICE_TYPE          # the interpreter's CPU tensors, or native CUDA ones

    def f(x, w):
        y = (x * 2 + 1).softmax(-1)
        return F.layer_norm(y, (y.shape[-1],), w) + y.reshape(x.shape[0], -1, 2).sum(-1).repeat_interleave(2, -1)
    jf = thunderlite.jit(f, executors=["triton", "torch"], dynamic=True)
    w = torch.randn(8, device=device)
    for n in (3, 5, 7, 5):
        x = torch.randn(n, 8, device=device)
        torch.testing.assert_close(jf(x, w), f(x, w))
    assert thunderlite.cache_info(jf)["misses"] == 1            # one trace for every size
    sized = [b.sym.impl for b in thunderlite.last_traces(jf)[-1].bound_symbols
             if isinstance(b.sym.impl, SizedTritonKernel)]
    assert sized and all(len(k.kernels) == 3 for k in sized)      # a kernel per concrete size, reused for 5
    assert "# sizes {'s0': 7" in kernel_source(jf)


@pytest.mark.parametrize("options, compiles", [({}, 2), ({"cache": "symbolic values"}, 1)])
def test_tiny_llama_over_ten_prompt_lengths(options, compiles):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    jm = thunderlite.jit(model, **options)
    with torch.no_grad():
        for T in range(3, 13):
            ids = torch.randint(0, 64, (2, T))
            torch.testing.assert_close(jm(ids, use_cache=False).logits, model(ids, use_cache=False).logits)
    assert thunderlite.cache_info(jm)["misses"] == compiles
    guards = [line.strip() for line in str(thunderlite.last_prologue_traces(jm)[-1]).splitlines()
              if "check_size" in line]
    # nothing about the sizes is guarded, also with every size symbolic (batch too): expand_to
    # compares shapes of different ranks by their lengths (a tuple == compared 32 with s0 first)
    assert guards == []


def test_nvfuser_defines_a_fusion_per_concrete_size():
    from thunderlite.executors.nvfuser.executor import NvFuserFusion
    from thunderlite.executors.registry import get_executor
    ok, reason = get_executor("nvfuser").is_available()
    if not ok:
        pytest.skip(f"nvFuser executor unavailable: {reason}")

    def f(x):
        return ((x * 2 + 1).sin() * x.shape[-1]).sum(-1).reshape(x.shape[0], -1)
    jf = thunderlite.jit(f, executors=["nvfuser", "torch"], dynamic=True)
    for n in (16, 24, 40, 24):
        x = torch.randn(4, n, device="cuda")
        torch.testing.assert_close(jf(x), f(x))
    assert thunderlite.cache_info(jf)["misses"] == 1
    fusions = [b.sym.impl for b in thunderlite.last_traces(jf)[-1].bound_symbols
               if isinstance(b.sym.impl, NvFuserFusion)]
    assert fusions and all(f.symbolic and len(f.cache) == 3 for f in fusions)

