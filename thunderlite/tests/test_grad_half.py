"""Half-precision (float16/bfloat16) training: gradients as eager computes them,
from the half-precision tensors eager saves (transforms/autodiff/torch_rules.py,
"float16/bfloat16 arithmetic"), not from float32 widenings of them."""
from __future__ import annotations

import pytest
import torch

import thunderlite
from thunderlite.core.proxies import TensorProxy

HALVES = [torch.bfloat16, torch.float16]


def _saved(jfn) -> list[TensorProxy]:
    """The tensors the forward trace returns for the backward (``(outputs,
    saved arguments, saved values)``: the last two)."""
    ret = thunderlite.last_traces(jfn)[-1].bound_symbols[-1]
    seen, out = set(), []

    def walk(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)
        elif isinstance(x, TensorProxy) and x.name not in seen:
            seen.add(x.name)
            out.append(x)
    walk(ret.args[0][1:])
    return out


def _grads_match_eager(fn, *args, **tol):
    want_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    got_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    want = fn(*want_args)
    jfn = thunderlite.jit(fn)
    got = jfn(*got_args)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(3)).to(want.dtype)
    want.backward(g)
    got.backward(g)
    for w, h in zip(want_args, got_args, strict=True):
        if w.requires_grad:
            assert h.grad.dtype == w.grad.dtype
            torch.testing.assert_close(h.grad, w.grad, **tol)
    return jfn


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "add_alpha", "sub_alpha", "neg", "scalar_mul",
                                "rdiv", "scalar_first", "exp", "log", "sin", "rsqrt", "reciprocal", "erf"])
def test_half_arithmetic_gradients_are_eagers_and_save_half_tensors(dtype, op):
    fns = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "div": lambda a, b: a / (b.abs() + 1), "add_alpha": lambda a, b: torch.add(a, b, alpha=0.5),
           "sub_alpha": lambda a, b: torch.sub(a, b, alpha=3), "neg": lambda a, b: -a * b,
           "scalar_mul": lambda a, b: (a * 1.7) * b, "rdiv": lambda a, b: 2.0 / (a.abs() + 1) + b,
           "scalar_first": lambda a, b: (3 - a) * b, "exp": lambda a, b: a.exp() * b,
           "log": lambda a, b: (a.abs() + 1).log() + b, "sin": lambda a, b: a.sin() * b,
           "rsqrt": lambda a, b: (a.abs() + 1).rsqrt() - b, "reciprocal": lambda a, b: (a.abs() + 1).reciprocal() * b,
           "erf": lambda a, b: torch.erf(a) + b}
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 6, generator=gen).to(dtype).requires_grad_()
    b = torch.randn(6, generator=gen).to(dtype).requires_grad_()        # broadcast: its gradient is reduced
    # eager's roundings op for op, up to a rounding where a formula differs (rsqrt's is out**3 * -0.5,
    # eager's -0.5 * out.pow(3))
    jfn = _grads_match_eager(fns[op], a, b, atol=1e-2, rtol=1e-2)
    widened = [p for p in _saved(jfn) if p.dtype == torch.float32]
    assert not widened, widened


@pytest.mark.parametrize("dtype", HALVES)
def test_half_arithmetic_mixed_with_float32_keeps_the_decomposition(dtype):
    """A float32 operand beside a half one (a 0-d tensor keeps the half dtype)
    is differentiated through the decomposition, which reduces the 0-d
    operand's gradient in float32 (eager: in the half dtype, then widened)."""
    a = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)).to(dtype).requires_grad_()
    s = torch.tensor(1.5, requires_grad=True)
    _grads_match_eager(lambda a, s: a * s + a, a, s, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", HALVES)
def test_half_llama_step_saves_no_more_than_eager(dtype):
    """A tiny HF Llama step in half precision: eager's gradients, and the saved
    tensors take no more bytes than eager's (they took twice as many when the
    arithmetic was differentiated through float32 widenings)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                   attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(dtype)
    idx = torch.randint(0, 64, (2, 16))

    def step(fn):
        model.zero_grad(set_to_none=True)
        loss = fn(input_ids=idx, labels=idx, use_cache=False).loss
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(x):
        if x.untyped_storage().data_ptr() not in params:
            storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        want_loss, want = step(model)
    eager_bytes = sum(storages.values())
    jm = thunderlite.jit(model)
    got_loss, got = step(jm)
    torch.testing.assert_close(got_loss, want_loss, atol=2e-2, rtol=2e-2)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name, atol=3e-2, rtol=3e-2)
    saved = [p for p in _saved(jm) if p.ndim > 1 and "weight" not in p.name]       # activations, not parameters
    saved_bytes = sum(p.nbytes for p in saved)
    assert saved_bytes <= eager_bytes, (saved_bytes, eager_bytes, [(p.name, p.dtype, p.shape) for p in saved])
