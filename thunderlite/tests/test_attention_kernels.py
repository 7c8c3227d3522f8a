"""Attention takes eager's kernel (autodiff/attention.py ``sdpa_kernel``):
cuDNN attention where eager's dispatcher prefers it, flash and cuDNN with
grouped-query attention (``enable_gqa``). On CPU: the choice with the GPU's
capability, cuDNN version and priority order faked, and the numerics of the
new symbols' decompositions against eager's math; on CUDA (skipped without
one): the choice against eager's own dispatcher and a GQA training step."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from test_grad_kernels import _decomposed, _jit_step_matches_eager, _NoKernels, _t
from test_grad_prims import trace_of

from thunderlite.core.proxies import TensorProxy
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.torch.ops import nn as lnn
from thunderlite.torch.ops import reductions as red
from thunderlite.transforms.autodiff import attention
from thunderlite.transforms.autodiff import kernels as K
from thunderlite.transforms.autodiff.split import split_forward_backward

F64 = torch.float64
aten = torch.ops.aten
_H100 = (9, 0)
_KERNELS = {"cudnn": ("sdpa_cudnn", "sdpa_cudnn_backward"), "flash": ("sdpa_flash_cuda", "sdpa_flash_cuda_backward"),
            "efficient": ("sdpa_efficient", "sdpa_efficient_backward")}


def _split(dtype=torch.bfloat16, *, H=4, Hkv=4, L=32, S=32, E=64, gqa=False, is_causal=True):
    trc = Trace()
    with tracectx(trc):
        q = TensorProxy((2, H, L, E), dtype, "cuda", requires_grad=True, name="q")
        k, v = (TensorProxy((2, Hkv, S, E), dtype, "cuda", requires_grad=True, name=c) for c in "kv")
        trc.args = [q, k, v]
        trc.set_return(red.sum(lnn.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=gqa)))
    split = split_forward_backward(trc, [True, True, True])
    return [b.sym.name for b in split.forward.bound_symbols], [b.sym.name for b in split.backward.bound_symbols]


def _fake_gpu(monkeypatch, capability=_H100, cudnn=91900, cuda="12.8"):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: cudnn is not None)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: cudnn)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.delenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", raising=False)


@pytest.mark.parametrize("case,gpu,want", [
    ({}, {}, "cudnn"),                                            # H100, cuDNN 9.19: eager puts cuDNN first
    ({"Hkv": 2, "gqa": True}, {}, "cudnn"),                       # HF Llama's enable_gqa: cuDNN takes it
    ({"Hkv": 2, "gqa": True}, {"capability": (8, 0)}, "flash"),   # A100: default order, flash takes GQA
    ({}, {"cudnn": 91500}, "flash"),                              # cuDNN 9.15.0: not preferred
    ({}, {"capability": (9, 0), "cudnn": None}, "flash"),         # no cuDNN: flash
    ({}, {"capability": (10, 1), "cuda": "12.8"}, "flash"),       # sm101 with CUDA 12: not preferred
    ({}, {"capability": (10, 1), "cuda": "13.0"}, "cudnn"),
    ({}, {"capability": (8, 9)}, "flash"),                        # sm89: not preferred
    ({"E": 256}, {}, "flash"),                                    # cuDNN above 128: not modelled, flash next
    ({"dtype": torch.float32}, {}, "efficient"),                  # cuDNN and flash: half precision only
    ({"S": 1, "L": 1}, {}, "flash"),                              # cuDNN takes no single key
    ({"Hkv": 2, "gqa": True, "dtype": torch.float32}, {}, None),  # efficient refuses GQA here: math
])
def test_cuda_attention_kernel_choice(monkeypatch, case, gpu, want):
    _fake_gpu(monkeypatch, **gpu)
    fwd, bwd = _split(**case)
    names = set(fwd + bwd)
    for kernel, pair in _KERNELS.items():
        assert (set(pair) <= names) == (kernel == want), (want, fwd, bwd)
    if want is not None:
        assert "matmul" not in bwd, bwd


def test_cudnn_deprioritized_by_env_toggle_and_determinism(monkeypatch):
    _fake_gpu(monkeypatch)
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    assert "sdpa_flash_cuda" in _split()[0]
    monkeypatch.delenv("TORCH_CUDNN_SDPA_DEPRIORITIZED")
    monkeypatch.setattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: False)
    assert "sdpa_flash_cuda" in _split()[0]
    monkeypatch.undo()
    _fake_gpu(monkeypatch)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    monkeypatch.setattr(torch, "is_deterministic_algorithms_warn_only_enabled", lambda: False)
    assert "sdpa_flash_cuda" in _split()[0]


def test_a_users_priority_order_is_followed(monkeypatch):
    """An order the user set (not torch's default) is eager's order: no cuDNN-first rewrite."""
    _fake_gpu(monkeypatch)
    monkeypatch.setattr(torch._C, "_get_sdp_priority_order", lambda: [2, 1, 0, 3, 4])
    assert "sdpa_efficient" in _split()[0]


def test_expanded_kv_like_repeat_kv_is_plain_attention(monkeypatch):
    """HF's ``repeat_kv`` (expand, then reshape: a copy) hands eager k and v
    with q's head count: no GQA, the kernel eager picks for that (cuDNN here)."""
    _fake_gpu(monkeypatch)
    trc = Trace()
    with tracectx(trc):
        q = TensorProxy((2, 4, 32, 64), torch.bfloat16, "cuda", requires_grad=True, name="q")
        k, v = (TensorProxy((2, 2, 32, 64), torch.bfloat16, "cuda", requires_grad=True, name=c) for c in "kv")
        k4, v4 = (t[:, :, None].expand(2, 2, 2, 32, 64).reshape(2, 4, 32, 64) for t in (k, v))
        trc.args = [q, k, v]
        trc.set_return(red.sum(lnn.scaled_dot_product_attention(q, k4, v4, is_causal=True)))
    split = split_forward_backward(trc, [True, True, True])
    assert "sdpa_cudnn" in [b.sym.name for b in split.forward.bound_symbols]


# --- numerics of the decompositions (what runs without the GPU kernel) ---------------------------------

def _gqa_inputs(dtype, H=4, Hkv=2, L=6, S=6, E=8):
    return _t(2, H, L, E, dtype=dtype), _t(2, Hkv, S, E, seed=1, dtype=dtype), _t(2, Hkv, S, E, seed=2, dtype=dtype)


def _eager(q, k, v, causal, scale, gqa=True):
    q64, k64, v64 = (x.to(F64).requires_grad_() for x in (q, k, v))
    return (q64, k64, v64), F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, scale=scale,
                                                           enable_gqa=gqa)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal,scale,Hkv", [(True, None, 2), (False, 0.3, 1), (True, None, 4)])
def test_cudnn_attention_decompositions(dtype, causal, scale, Hkv):
    """cuDNN attention's symbols (grouped-query k/v included) compute eager's
    math attention and its gradients; the logsumexp is float32 ``[B, H, L, 1]``."""
    q, k, v = _gqa_inputs(dtype, Hkv=Hkv)
    outs = _decomposed(K.sdpa_cudnn, q, k, v, None, True, 0.0, causal, False, scale=scale)
    out, lse, cq, ck, max_q, max_k, seed, offset, debug = outs
    leaves, want = _eager(q, k, v, causal, scale)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype != torch.bfloat16 else {"atol": 2e-2, "rtol": 2e-2}
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (2, 4, 6, 1)
    torch.testing.assert_close(out.to(F64), want, **tol)
    assert (cq, ck, max_q, max_k, debug) == (None, None, 6, 6, None)
    g = _t(2, 4, 6, 8, seed=5, dtype=dtype)
    grads = _decomposed(K.sdpa_cudnn_backward, g, q, k, v, out, lse, seed, offset, None, None, None, 6, 6, 0.0,
                        causal, scale=scale)
    for gw, gg, x in zip(torch.autograd.grad(want, leaves, g.to(F64)), grads, (q, k, v), strict=True):
        assert gg.dtype == dtype and gg.shape == x.shape
        torch.testing.assert_close(gg.to(F64), gw, **tol)


def test_flash_attention_decompositions_take_grouped_query_attention():
    q, k, v = _gqa_inputs(F64)
    out, lse, *_ = _decomposed(K.sdpa_flash_cuda, q, k, v, 0.0, True, False)
    leaves, want = _eager(q, k, v, True, None)
    tol = {"atol": 1e-5, "rtol": 1e-5}     # the kernel (and its decomposition) computes in float32
    torch.testing.assert_close(out, want.detach(), **tol)
    seed, offset = torch.zeros(2, dtype=torch.uint64), torch.zeros((), dtype=torch.uint64)
    g = _t(2, 4, 6, 8, seed=5, dtype=F64)
    grads = _decomposed(K.sdpa_flash_cuda_backward, g, q, k, v, out, lse, None, None, 6, 6, 0.0, True, seed, offset)
    for gw, gg in zip(torch.autograd.grad(want, leaves, g), grads, strict=True):
        torch.testing.assert_close(gg, gw, **tol)


@pytest.mark.parametrize("Hkv", [4, 2])
def test_cudnn_attention_symbols_have_the_kernels_shapes(Hkv):
    """Output for output what ATen's meta functions return (GQA included)."""
    meta = [torch.empty(2, h, 32, 64, device="meta", dtype=torch.bfloat16) for h in (4, Hkv, Hkv)]
    want = aten._scaled_dot_product_cudnn_attention(*meta, None, True, 0.0, True, False)
    want_b = aten._scaled_dot_product_cudnn_attention_backward(want[0], *meta, want[0], want[1], want[6], want[7],
                                                               None, None, None, 32, 32, 0.0, True)
    cpu = [torch.zeros(t.shape, dtype=t.dtype) for t in meta]
    outs = trace_of(lambda q, k, v: K.sdpa_cudnn(q, k, v, None, True, 0.0, True, False), cpu).bound_symbols[-2].output
    seed = torch.zeros((), dtype=torch.int64)
    grads = trace_of(lambda g, q, k, v, o, lse, s, f: K.sdpa_cudnn_backward(
        g, q, k, v, o, lse, s, f, None, None, None, 32, 32, 0.0, True),
        (cpu[0], *cpu, cpu[0], torch.zeros(want[1].shape), seed, seed)).bound_symbols[-2].output
    for w, got in zip((*want, *want_b), (*outs, *grads), strict=True):
        if isinstance(w, torch.Tensor):
            assert (tuple(w.shape), w.dtype) == (got.shape, got.dtype)
        else:
            assert w == got


def test_cudnn_attention_rule_matches_eager(monkeypatch):
    """The VJP rule wires the forward's saved outputs (logsumexp, philox state,
    lengths) into the backward kernel, run here as both decompositions."""
    import test_grad_prims
    from test_grad_prims import check_grad

    from thunderlite.transforms.claim import claim_executors

    monkeypatch.setattr(test_grad_prims, "_finalize", lambda t: claim_executors(t, [_NoKernels("nokernels")]))
    q, k, v = (x.requires_grad_() for x in _gqa_inputs(torch.float32))
    prog = check_grad(lambda q, k, v: K.sdpa_cudnn(q, k, v, None, True, 0.0, True, False, scale=0.4)[0], q, k, v,
                      ref_fn=lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.4,
                                                                            enable_gqa=True))
    assert "aten.sdpa_cudnn_backward" in {b.sym.id for b in prog.split.backward.bound_symbols}


# --- on a GPU ----------------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="compares with eager's dispatcher on a CUDA GPU")
_BACKEND_NAMES = {1: "flash", 2: "efficient", 3: "cudnn", 0: None}


@needs_cuda
def test_on_gpu_kernel_choice_agrees_with_eagers_dispatcher():
    """Where thunderlite models the kernels, its choice is eager's
    (``torch._fused_sdp_choice``) on this GPU, GQA included."""
    x = torch.zeros(1, 1, 8, 8, device="cuda", dtype=torch.bfloat16)
    F.scaled_dot_product_attention(x, x, x)     # eager's first call settles its priority order
    grid = itertools.product((torch.float16, torch.bfloat16, torch.float32), (64, 128), ((4, 4, False), (4, 2, True)),
                             (True, False))
    differ = []
    for dtype, E, (H, Hkv, gqa), causal in grid:
        real = [torch.zeros(2, h, 32, E, device="cuda", dtype=dtype, requires_grad=True) for h in (H, Hkv, Hkv)]
        with torch.enable_grad():
            want = _BACKEND_NAMES.get(torch.ops.aten._fused_sdp_choice(*real, None, 0.0, causal, enable_gqa=gqa))
        with tracectx(Trace()):
            proxies = [TensorProxy(tuple(t.shape), dtype, "cuda", requires_grad=True, name=f"x{i}")
                       for i, t in enumerate(real)]
            got = attention._cuda_sdpa_kernel(attention._Call(*proxies, None, 0.0, causal, None, gqa))
        if gqa and want == "efficient":
            continue        # efficient attention's GQA is not modelled: the math rule stands in
        if got != want:
            differ.append((dtype, E, H, Hkv, causal, got, want))
    assert not differ, differ


class _GQABlock(torch.nn.Module):
    def __init__(self, d=64, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kv, self.e = heads, kv_heads, d // heads
        self.q, self.kv_proj, self.o = (torch.nn.Linear(d, d), torch.nn.Linear(d, 2 * kv_heads * self.e),
                                        torch.nn.Linear(d, d))

    def forward(self, x, targets):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.h, self.e).transpose(1, 2)
        k, v = (z.view(b, t, self.kv, self.e).transpose(1, 2) for z in self.kv_proj(x).chunk(2, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.mse_loss(self.o(y.transpose(1, 2).reshape(b, t, d)), targets)


@needs_cuda
def test_on_gpu_gqa_training_step_matches_eager_with_eagers_kernel():
    torch.manual_seed(0)
    model = _GQABlock().to("cuda", torch.bfloat16)
    x, y = (torch.randn(2, 32, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    jm = _jit_step_matches_eager(model, x, y, atol=2e-2, rtol=2e-2)
    import thunderlite
    names = [b.sym.name for b in thunderlite.last_backward_traces(jm)[-1].bound_symbols]
    q = torch.zeros(2, 4, 32, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kv = torch.zeros(2, 2, 32, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    want = _BACKEND_NAMES.get(torch.ops.aten._fused_sdp_choice(q, kv, kv, None, 0.0, True, enable_gqa=True))
    if want in ("cudnn", "flash"):
        assert names.count(_KERNELS[want][1]) == 1, names
