"""The fused-kernel symbols of transforms/autodiff/kernels.py: each one's
decomposition (what a fusion executor runs) computes what its ATen kernel (what
the torch executor runs) returns, in float64; and a training step's backward
uses the kernels, one symbol each."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_grad_prims import _finalize, trace_of

import thunderlite
from thunderlite.executors.base import OperatorExecutor
from thunderlite.executors.torchex import torch_executor
from thunderlite.transforms.autodiff import kernels as K

F64 = torch.float64
aten = torch.ops.aten


def _t(*shape, seed=0, dtype=F64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _decomposed(sym, *args, **kwargs):
    """Run ``sym``'s decomposition (not its kernel) through the torch executor."""
    keys = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    n = len(args)

    def fn(*a):
        return sym.decomposition(*a[:n], **{**kwargs, **dict(zip(keys, a[n:], strict=True))})
    every = (*args, *(kwargs[k] for k in keys))
    trc = trace_of(fn, every)
    return _finalize(trc).python_callable()(*[a for a in every if isinstance(a, torch.Tensor)])


def _same(sym, *args, **kwargs):
    want = sym.torch_fn(*args, **kwargs)
    got = _decomposed(sym, *args, **kwargs)
    want, got = (want if isinstance(want, tuple) else (want,)), (got if isinstance(got, tuple) else (got,))
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        if w is None:
            assert g is None
        else:
            torch.testing.assert_close(g, w)


def _causal_sdpa_inputs(L=5, S=5, E=4):
    return _t(2, 3, L, E), _t(2, 3, S, E, seed=1), _t(2, 3, S, E, seed=2)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward(approximate):
    _same(K.gelu_backward, _t(3, 7), _t(3, 7, seed=1), approximate=approximate)


@pytest.mark.parametrize("sym", [K.silu_backward, K.tanh_backward, K.sigmoid_backward])
def test_activation_backward(sym):
    _same(sym, _t(3, 7), _t(3, 7, seed=1).tanh())


@pytest.mark.parametrize("threshold", [0.0, 0.3])
def test_threshold_backward(threshold):
    x = _t(3, 7, seed=1)
    x[0, :2] = threshold            # at the threshold: no gradient, as eager
    _same(K.threshold_backward, _t(3, 7), x, threshold)


def test_relu_keeps_one_forward_call_and_eagers_backward_kernel():
    """relu stays one call (not le + where) and its backward is
    threshold_backward on the saved output; gradients are eager's."""
    lin = torch.nn.Linear(6, 5, dtype=F64)
    x = _t(4, 6, seed=2).requires_grad_()
    jfn = thunderlite.jit(lambda x: F.relu(lin(x)).sum() + F.threshold(x, 0.1, 2.0).sum())
    jfn(x).backward()
    fwd = [b.sym.name for b in thunderlite.last_traces(jfn)[-1].bound_symbols]
    bwd = [b.sym.name for b in thunderlite.last_backward_traces(jfn)[-1].bound_symbols]
    assert "relu" in fwd and "le" not in fwd and "where" not in fwd, fwd
    assert bwd.count("threshold_backward") == 2, bwd
    got = [x.grad, lin.weight.grad, lin.bias.grad]
    x.grad = lin.weight.grad = lin.bias.grad = None
    (F.relu(lin(x)).sum() + F.threshold(x, 0.1, 2.0).sum()).backward()
    for g, w in zip(got, [x.grad, lin.weight.grad, lin.bias.grad], strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("sym,fn", [(K.softmax_backward_data, torch.softmax),
                                    (K.log_softmax_backward_data, torch.log_softmax)])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_softmax_backward(sym, fn, dim):
    _same(sym, _t(2, 3, 4), fn(_t(2, 3, 4, seed=1), dim), dim, F64)


@pytest.mark.parametrize("weighted", [True, False])
def test_layer_norm_forward_and_backward(weighted):
    x, w, b = _t(2, 3, 8), _t(3, 8, seed=1) if weighted else None, _t(3, 8, seed=2) if weighted else None
    _same(K.native_layer_norm, x, (3, 8), w, b, 1e-5)
    _, mean, rstd = aten.native_layer_norm(x, (3, 8), w, b, 1e-5)
    for mask in ([True, True, True], [True, False, False], [False, True, True]):
        mask = [mask[0], mask[1] and weighted, mask[2] and weighted]      # aten: no grad for an absent weight
        _same(K.native_layer_norm_backward, _t(2, 3, 8, seed=3), x, (3, 8), mean, rstd, w, b, mask)


@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm_forward_and_backward(eps):
    x, w = _t(2, 3, 8), _t(8, seed=1)
    _same(K.fused_rms_norm, x, (8,), w, eps)
    _, rstd = aten._fused_rms_norm(x, (8,), w, eps)
    torch.testing.assert_close(aten._fused_rms_norm(x, (8,), w, eps)[0], F.rms_norm(x, (8,), w, eps))
    for mask in ([True, True], [True, False]):
        _same(K.fused_rms_norm_backward, _t(2, 3, 8, seed=3), x, (8,), rstd, w, mask)


@pytest.mark.parametrize("padding_idx,freq", [(-1, False), (2, False), (1, True)])
def test_embedding_dense_backward(padding_idx, freq):
    idx = torch.tensor([[0, 2, 2], [5, 1, 0]])
    _same(K.embedding_dense_backward, _t(2, 3, 4), idx, 6, padding_idx, freq)


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"scale": 0.3}, {"mask": True},
                                {"mask": True, "is_causal": True}])
@pytest.mark.parametrize("L,S", [(5, 5), (3, 6)])
def test_flash_attention_forward_and_backward(kw, L, S):
    q, k, v = _causal_sdpa_inputs(L, S)
    mask = _t(1, 3, L, S, seed=4) if kw.get("mask") else None
    causal, scale = kw.get("is_causal", False), kw.get("scale")
    _same(K.sdpa_flash_cpu, q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    _same(K.sdpa_flash_cpu_backward, _t(2, 3, L, 4, seed=5), q, k, v, out, lse, 0.0, causal,
          attn_mask=mask, scale=scale)


HALVES = [torch.bfloat16, torch.float16]


def _close_in(dtype, want, got) -> None:
    """``got`` as ``want`` in dtype and shape, values within ``dtype``'s rounding."""
    want, got = (want if isinstance(want, tuple) else (want,)), (got if isinstance(got, tuple) else (got,))
    for w, g in zip(want, got, strict=True):
        if w is None:
            assert g is None
            continue
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (g.dtype, g.shape, w.dtype, w.shape)
        if w.device.type != "meta":
            torch.testing.assert_close(g.float(), w.float(), atol=2e-2, rtol=2e-2)


def _half_cases(dtype, device="cpu"):
    """(symbol, args, kwargs) of every fused kernel on half-precision tensors."""
    def t(*shape, seed=0):
        return _t(*shape, seed=seed, dtype=torch.float32).to(device, dtype)
    x, w, b, g = t(2, 3, 8), t(8, seed=1), t(8, seed=2), t(2, 3, 8, seed=3)
    _, mean, rstd = aten.native_layer_norm(x, (8,), w, b, 1e-5)
    _, rms_rstd = aten._fused_rms_norm(x, (8,), w, None)
    logits, target = t(6, 5), torch.tensor([1, 0, 4, -100, 2, 2], device=device)
    _, log_probs, total = K.cross_entropy_forward.torch_fn(logits, target, 1, -100)
    cases = [(K.gelu_backward, (g, x), {"approximate": "tanh"}), (K.gelu_backward, (g, x), {}),
             (K.silu_backward, (g, x), {}), (K.tanh_backward, (g, x.tanh()), {}),
             (K.sigmoid_backward, (g, x.sigmoid()), {}),
             (K.softmax_backward_data, (g, x.softmax(1), 1, dtype), {}),
             (K.log_softmax_backward_data, (g, x.log_softmax(2), 2, dtype), {}),
             (K.native_layer_norm, (x, (8,), w, b, 1e-5), {}),
             (K.native_layer_norm_backward, (g, x, (8,), mean, rstd, w, b, [True, True, True]), {}),
             (K.fused_rms_norm, (x, (8,), w, None), {}),
             (K.cross_entropy_forward, (logits, target, 1, -100), {}),
             (K.cross_entropy_backward, (t(seed=4), log_probs, target, 1, -100, total), {})]
    if device == "cpu":      # the CPU kernels; CUDA's rms_norm backward and attention kernels are others
        q, k, v = t(2, 3, 5, 8), t(2, 3, 6, 8, seed=1), t(2, 3, 6, 8, seed=2)
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False)
        cases += [(K.fused_rms_norm_backward, (g, x, (8,), rms_rstd, w, [True, True]), {}),
                  (K.sdpa_flash_cpu, (q, k, v, 0.0, False), {}),
                  (K.sdpa_flash_cpu_backward, (t(2, 3, 5, 8, seed=5), q, k, v, out, lse, 0.0, False), {})]
    return cases


@pytest.mark.parametrize("dtype", HALVES)
def test_half_precision_decompositions_compute_what_the_kernels_return(dtype):
    """In float16/bfloat16 each decomposition returns the kernel's dtypes (the
    CPU layer norm's statistics in the input's dtype, rms_norm's rstd and the
    attention logsumexp in float32) and its values, computed in float32 and
    rounded once, as the kernel computes them."""
    for sym, args, kwargs in _half_cases(dtype):
        _close_in(dtype, sym.torch_fn(*args, **kwargs), _decomposed(sym, *args, **kwargs))


@pytest.mark.parametrize("dtype", HALVES)
def test_half_precision_decompositions_have_the_cuda_kernels_dtypes(dtype):
    """On a device other than the CPU (meta tensors, whose functions describe
    the CUDA kernels) the layer norm's statistics are float32."""
    for sym, args, kwargs in _half_cases(dtype, "meta"):
        got = _decomposed(sym, *args, **kwargs)
        _close_in(dtype, sym.torch_fn(*args, **kwargs), got)
        if sym is K.native_layer_norm:
            assert got[1].dtype == got[2].dtype == torch.float32


def test_rms_norm_default_eps_is_the_compute_dtypes():
    """``eps=None`` in bfloat16 is float32's epsilon, as ATen takes it (not
    bfloat16's, 0.0078, which would swamp a small mean square)."""
    x = torch.full((2, 64), 1e-2, dtype=torch.bfloat16)
    want = F.rms_norm(x, (64,))
    torch.testing.assert_close(_decomposed(K.fused_rms_norm, x, (64,), None, None)[0], want)
    from thunderlite.torch.ops import nn as lnn  # the decomposition of F.rms_norm itself, too
    torch.testing.assert_close(_decomposed(lnn.rms_norm, x, (64,)), want)


def _lse_rows(L: int) -> int:
    return -(-L // 32) * 32


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"scale": 0.3}, {"mask": True}])
@pytest.mark.parametrize("L,S", [(5, 5), (3, 6), (40, 7)])
def test_efficient_attention_decompositions(kw, L, S):
    """CUDA memory-efficient attention's decompositions (what runs without a
    GPU kernel) compute what CPU flash attention computes, in the CUDA
    kernel's layout: float32 logsumexp padded to 32 rows, empty philox state."""
    q, k, v = (_t(*x.shape, seed=i, dtype=torch.float32) for i, x in enumerate(_causal_sdpa_inputs(L, S)))
    bias = _t(2, 3, L, S, seed=4, dtype=torch.float32) if kw.get("mask") else None
    causal, scale = kw.get("is_causal", False), kw.get("scale")
    out, lse, seed, offset = _decomposed(K.sdpa_efficient, q, k, v, bias, True, 0.0, causal, scale=scale)
    want_out, want_lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=bias,
                                                                          scale=scale)
    torch.testing.assert_close(out, want_out)
    assert lse.shape == (2, 3, _lse_rows(L)) and lse.dtype == torch.float32
    torch.testing.assert_close(lse[..., :L], want_lse)
    assert seed.shape == offset.shape == () and seed.dtype == offset.dtype == torch.int64
    g = _t(2, 3, L, 4, seed=5, dtype=torch.float32)
    grads = _decomposed(K.sdpa_efficient_backward, g, q, k, v, bias, out, lse, seed, offset, 0.0,
                        [True, True, True, False], causal, scale=scale)
    want = aten._scaled_dot_product_flash_attention_for_cpu_backward(g, q, k, v, want_out, want_lse, 0.0, causal,
                                                                     attn_mask=bias, scale=scale)
    for gw, gg in zip(want, grads[:3], strict=True):
        torch.testing.assert_close(gg, gw)
    assert grads[3] is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("masked", [False, True])
def test_efficient_attention_symbols_have_the_kernels_shapes(dtype, masked):
    """The symbols' outputs (traced from their decompositions) have the shapes
    and dtypes of ATen's kernels (their meta functions), argument for argument."""
    L, S, E = 37, 32, 8
    meta = [torch.empty(2, 3, n, E, device="meta", dtype=dtype) for n in (L, S, S)]
    mbias = torch.empty(2, 3, L, S, device="meta", dtype=dtype) if masked else None
    want = aten._scaled_dot_product_efficient_attention(*meta, mbias, True, 0.0, True)
    want_b = aten._scaled_dot_product_efficient_attention_backward(want[0], *meta, mbias, *want, 0.0,
                                                                   [True, True, True, False], True)
    cpu = [torch.zeros(t.shape, dtype=dtype) for t in meta]
    bias = torch.zeros(2, 3, L, S, dtype=dtype) if masked else None
    fwd = trace_of(lambda q, k, v, b: K.sdpa_efficient(q, k, v, b, True, 0.0, True), (*cpu, bias))
    outs = fwd.bound_symbols[-2].output
    grads = trace_of(lambda g, q, k, v, b, o, lse, s, f: K.sdpa_efficient_backward(
        g, q, k, v, b, o, lse, s, f, 0.0, [True, True, True, False], True),
        (cpu[0], *cpu, bias, cpu[0], torch.zeros(want[1].shape), torch.zeros((), dtype=torch.int64),
         torch.zeros((), dtype=torch.int64))).bound_symbols[-2].output
    for w, got in zip((*want, *want_b), (*outs, *grads), strict=True):
        assert (w is None) == (got is None)
        if w is not None:
            assert (tuple(w.shape), w.dtype) == (got.shape, got.dtype)


def test_cuda_attention_takes_the_efficient_kernels():
    """On CUDA proxies (no GPU needed to split) the forward records the
    memory-efficient kernel saving its logsumexp, the backward its backward."""
    from thunderlite.core.proxies import TensorProxy
    from thunderlite.core.trace import Trace
    from thunderlite.core.tracectx import tracectx
    from thunderlite.torch.ops import nn as lnn
    from thunderlite.torch.ops import reductions as red
    from thunderlite.transforms.autodiff.split import split_forward_backward
    trc = Trace()
    with tracectx(trc):
        q, k, v = (TensorProxy((2, 3, 32, 8), torch.float16, "cuda", requires_grad=True, name=n) for n in "qkv")
        mask = TensorProxy((32, 32), torch.bool, "cuda", name="m")
        trc.args = [q, k, v, mask]
        trc.set_return(red.sum(lnn.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
    split = split_forward_backward(trc, [True, True, True, False])
    fwd = [b.sym.name for b in split.forward.bound_symbols]
    bwd = [b.sym.name for b in split.backward.bound_symbols]
    assert "sdpa_efficient" in fwd and "sdpa_flash_cpu" not in fwd, fwd
    assert bwd.count("sdpa_efficient_backward") == 1 and "matmul" not in bwd, bwd


@pytest.mark.parametrize("dtype", [torch.float32, F64, torch.bfloat16])
@pytest.mark.parametrize("kw,L,S", [({}, 5, 5), ({}, 3, 6), ({}, 40, 7), ({"scale": 0.3}, 3, 6),
                                    ({"is_causal": True}, 5, 5), ({"is_causal": True}, 40, 40)])
def test_flash_cuda_attention_decompositions(dtype, kw, L, S):
    """CUDA flash attention's decompositions (what runs without a GPU kernel)
    compute the math: the output and gradients of eager's math attention (in
    float64), the logsumexp of the scaled scores in float32, the kernel's
    philox state and empty debug mask."""
    causal, scale = kw.get("is_causal", False), kw.get("scale")     # eager's flash: is_causal only with L == S
    q, k, v = (_t(*x.shape, seed=i, dtype=dtype) for i, x in enumerate(_causal_sdpa_inputs(L, S)))
    out, lse, cq, ck, max_q, max_k, seed, offset, debug = _decomposed(K.sdpa_flash_cuda, q, k, v, 0.0, causal, False,
                                                                      scale=scale)
    q64, k64, v64 = (x.to(F64).requires_grad_() for x in (q, k, v))
    want = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, scale=scale)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype != torch.bfloat16 else {"atol": 2e-2, "rtol": 2e-2}
    assert out.dtype == dtype
    torch.testing.assert_close(out.to(F64), want, **tol)
    s = (q64 @ k64.transpose(-2, -1)) * (scale if scale is not None else 4 ** -0.5)
    if causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), -torch.inf)
    assert lse.dtype == torch.float32 and lse.shape == (2, 3, L)
    torch.testing.assert_close(lse.to(F64), s.logsumexp(-1).detach(), atol=1e-5, rtol=1e-5)
    assert (cq, ck, max_q, max_k) == (None, None, L, S)
    assert (seed.shape, seed.dtype, offset.shape, offset.dtype) == ((2,), torch.uint64, (), torch.uint64)
    assert (debug.shape, debug.dtype) == ((0,), dtype)
    g = _t(2, 3, L, 4, seed=5, dtype=dtype)
    grads = _decomposed(K.sdpa_flash_cuda_backward, g, q, k, v, out, lse, None, None, L, S, 0.0, causal, seed, offset,
                        scale=scale)
    wants = torch.autograd.grad(want, (q64, k64, v64), g.to(F64))
    for gw, gg in zip(wants, grads, strict=True):
        assert gg.dtype == dtype
        torch.testing.assert_close(gg.to(F64), gw, **tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_cuda_attention_symbols_have_the_kernels_shapes(dtype, causal):
    """The symbols' outputs (traced from their decompositions) are what ATen's
    kernels' meta functions return, output for output: shapes, dtypes, the
    Nones and the ints."""
    L, S, E = (37, 32, 64) if not causal else (32, 32, 64)
    meta = [torch.empty(2, 3, n, E, device="meta", dtype=dtype) for n in (L, S, S)]
    want = aten._scaled_dot_product_flash_attention(*meta, 0.0, causal, False)
    want_b = aten._scaled_dot_product_flash_attention_backward(want[0], *meta, *want[:6], 0.0, causal, *want[6:8])
    cpu = [torch.zeros(t.shape, dtype=dtype) for t in meta]
    outs = trace_of(lambda q, k, v: K.sdpa_flash_cuda(q, k, v, 0.0, causal, False), cpu).bound_symbols[-2].output
    seed, offset = torch.zeros(2, dtype=torch.uint64), torch.zeros((), dtype=torch.uint64)
    grads = trace_of(lambda g, q, k, v, o, lse, s, f: K.sdpa_flash_cuda_backward(
        g, q, k, v, o, lse, None, None, L, S, 0.0, causal, s, f),
        (cpu[0], *cpu, cpu[0], torch.zeros(want[1].shape), seed, offset)).bound_symbols[-2].output
    for w, got in zip((*want, *want_b), (*outs, *grads), strict=True):
        if isinstance(w, torch.Tensor):
            assert (tuple(w.shape), w.dtype) == (got.shape, got.dtype)
        else:
            assert w == got


def test_flash_cuda_attention_rule_matches_eager(monkeypatch):
    """The VJP rule wires the forward's saved outputs into the backward kernel
    (run here as both symbols' decompositions): eager's gradients."""
    import test_grad_prims
    from test_grad_prims import check_grad

    from thunderlite.transforms.claim import claim_executors

    monkeypatch.setattr(test_grad_prims, "_finalize", lambda t: claim_executors(t, [_NoKernels("nokernels")]))
    q, k, v = (_t(2, 3, 6, 8, seed=i, dtype=torch.float32).requires_grad_() for i in range(3))
    prog = check_grad(lambda q, k, v: K.sdpa_flash_cuda(q, k, v, 0.0, True, False, scale=0.4)[0], q, k, v,
                      ref_fn=lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.4))
    assert "aten.sdpa_flash_cuda_backward" in {b.sym.id for b in prog.split.backward.bound_symbols}


def _cuda_sdpa_split(dtype, *, L=32, S=32, E=64, mask=False, is_causal=False):
    from thunderlite.core.proxies import TensorProxy
    from thunderlite.core.trace import Trace
    from thunderlite.core.tracectx import tracectx
    from thunderlite.torch.ops import nn as lnn
    from thunderlite.torch.ops import reductions as red
    from thunderlite.transforms.autodiff.split import split_forward_backward
    trc = Trace()
    with tracectx(trc):
        q, k, v = (TensorProxy((2, 3, n, E), dtype, "cuda", requires_grad=True, name=c)
                   for c, n in zip("qkv", (L, S, S), strict=True))
        m = TensorProxy((L, S), torch.bool, "cuda", name="m") if mask else None
        trc.args = [q, k, v] + ([m] if mask else [])
        trc.set_return(red.sum(lnn.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=is_causal)))
    split = split_forward_backward(trc, [True, True, True] + ([False] if mask else []))
    return [b.sym.name for b in split.forward.bound_symbols], [b.sym.name for b in split.backward.bound_symbols]


_H100 = (9, 0)


@pytest.mark.parametrize("case,capability,want", [
    ({"dtype": torch.bfloat16}, _H100, "flash"),
    ({"dtype": torch.float16, "is_causal": True}, _H100, "flash"),
    ({"dtype": torch.bfloat16, "E": 256}, (8, 0), "flash"),
    ({"dtype": torch.float32}, _H100, "efficient"),                   # flash takes half precision only
    ({"dtype": torch.bfloat16, "mask": True}, _H100, "efficient"),    # flash takes no mask
    ({"dtype": torch.float16, "is_causal": True, "L": 16}, _H100, "efficient"),   # causal needs L == S
    ({"dtype": torch.float16}, (7, 5), "efficient"),                  # flash needs sm80+
    ({"dtype": torch.bfloat16, "E": 200}, (8, 6), "efficient"),       # no flash backward there on sm86-89
    ({"dtype": torch.bfloat16, "E": 200}, _H100, "flash"),
    ({"dtype": torch.float16}, None, "efficient"),                    # no GPU answers: the old choice
    ({"dtype": torch.float16, "E": 12}, _H100, None),                 # eager pads it into flash; not modelled
    ({"dtype": torch.bfloat16}, (7, 5), None),                        # no bfloat16 kernel below sm80: math
])
def test_cuda_attention_takes_the_kernel_eager_picks(monkeypatch, case, capability, want):
    """On CUDA proxies (no GPU needed to split) the forward records the kernel
    eager's dispatcher picks: flash attention for half precision on sm80+
    without a mask, else memory-efficient attention, else the math (the
    device's capability mocked)."""
    def capability_of(device=None):
        if capability is None:
            raise AssertionError("Torch not compiled with CUDA enabled")
        return capability
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability_of)
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: False)    # cuDNN: test_attention_kernels.py
    fwd, bwd = _cuda_sdpa_split(**case)
    kernels = {"flash": ("sdpa_flash_cuda", "sdpa_flash_cuda_backward"),
               "efficient": ("sdpa_efficient", "sdpa_efficient_backward"), None: (None, None)}
    for name, names in zip(kernels[want], (fwd, bwd), strict=True):
        if name is not None:
            assert names.count(name) == 1, names
    others = {n for k, pair in kernels.items() if k != want and k is not None for n in pair}
    assert not others & set(fwd + bwd), (fwd, bwd)
    if want is not None:
        assert "matmul" not in bwd, bwd


@pytest.mark.parametrize("enabled,want", [(("EFFICIENT_ATTENTION", "MATH"), "sdpa_efficient"),
                                          (("FLASH_ATTENTION", "MATH"), "sdpa_flash_cuda"),
                                          (("MATH",), None)])
def test_cuda_attention_follows_eagers_toggles(monkeypatch, enabled, want):
    """A backend the user turned off (``torch.nn.attention.sdpa_kernel``) is
    skipped, as eager's dispatcher skips it; with flash and memory-efficient
    attention both off, eager's math path (the decomposition's rule)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: _H100)
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    with sdpa_kernel([getattr(SDPBackend, name) for name in enabled]):
        fwd, _ = _cuda_sdpa_split(torch.bfloat16)
    fused = {"sdpa_flash_cuda", "sdpa_efficient"} & set(fwd)
    assert fused == ({want} if want else set()), fwd


def _cuda_step_matches_eager(dtype, executors=None) -> list[str]:
    """A nanoGPT-like step's loss and gradients under thunderlite equal eager's;
    returns the names in the backward trace."""
    return [b.sym.name for b in thunderlite.last_backward_traces(_cuda_step(dtype, executors))[-1].bound_symbols]


def _cuda_step(dtype, executors=None):
    torch.manual_seed(0)
    model = _GPT().to("cuda", dtype)
    idx, targets = torch.randint(0, 32, (2, 16), device="cuda"), torch.randint(0, 32, (2, 16), device="cuda")
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    return _jit_step_matches_eager(model, idx, targets, executors, **tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA memory-efficient attention needs a CUDA GPU")
def test_cuda_attention_step_matches_eager():
    """float32, which flash attention does not take: the memory-efficient kernels."""
    names = _cuda_step_matches_eager(torch.float32)
    assert names.count("sdpa_efficient_backward") == len(_GPT().blocks), names


def _eager_picks_flash() -> bool:
    return (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)
            and torch.backends.cuda.is_flash_attention_available())


@pytest.mark.skipif(not _eager_picks_flash(),
                    reason="CUDA flash attention needs an sm80+ GPU and a PyTorch built with flash attention")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_flash_attention_step_matches_eager(dtype):
    """Half precision on sm80+: flash attention (cuDNN attention where eager
    prefers it: sm90/sm100 with cuDNN > 9.15), one backward kernel per layer."""
    names = _cuda_step_matches_eager(dtype)
    kernel = "sdpa_cudnn_backward" if "sdpa_cudnn_backward" in names else "sdpa_flash_cuda_backward"
    assert names.count(kernel) == len(_GPT().blocks), names
    assert "sdpa_efficient_backward" not in names and not {"softmax", "exp", "amax"} & set(names), names


@pytest.mark.skipif(not _eager_picks_flash(),
                    reason="CUDA flash attention needs an sm80+ GPU and a PyTorch built with flash attention")
def test_cuda_flash_attention_step_under_torchcompile_matches_eager():
    """With executors=["torchcompile", "torch"] flash attention is compiled
    inside its layer's region (its None and int outputs are constants), and
    the step still equals eager's."""
    jm = _cuda_step(torch.bfloat16, ["torchcompile", "torch"])
    outside = [b.sym.name for b in thunderlite.last_traces(jm)[-1].bound_symbols if "sdpa" in b.sym.name]
    assert not outside, outside


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compares with eager's dispatcher on a CUDA GPU")
def test_flash_cuda_rule_agrees_with_eagers_dispatcher():
    """Where thunderlite models flash attention (head dims a multiple of 8),
    its rule says yes exactly where eager's ``can_use_flash_attention`` does,
    on this GPU, over dtypes, head dims, causal square and not, training or not."""
    import itertools

    from thunderlite.core.proxies import TensorProxy
    from thunderlite.core.trace import Trace
    from thunderlite.core.tracectx import tracectx
    from thunderlite.transforms.autodiff.attention import _Call, _flash_cuda_when
    grid = itertools.product((torch.float16, torch.bfloat16, torch.float32), (8, 64, 200, 256, 264),
                             ((16, 16, True), (8, 16, True), (8, 16, False)), (True, False))
    differ = []
    for dtype, E, (L, S, causal), training in grid:
        real = [torch.zeros(2, 3, n, E, device="cuda", dtype=dtype, requires_grad=training) for n in (L, S, S)]
        with torch.enable_grad():
            want = torch.backends.cuda.can_use_flash_attention(
                torch.backends.cuda.SDPAParams(*real, None, 0.0, causal, False))
        with tracectx(Trace()):
            proxies = [TensorProxy(tuple(t.shape), dtype, "cuda", requires_grad=training, name=f"x{i}")
                       for i, t in enumerate(real)]
            got = _flash_cuda_when(_Call(*proxies, None, 0.0, causal, None, False))
        if got != want:
            differ.append((dtype, E, L, S, causal, training, got, want))
    assert not differ, differ


def _strided_attention_matches_eager(device: str, dtype: torch.dtype, **tol) -> list[str]:
    """q, k and v with a non-dense last dim (eager runs the math path there):
    the kernels get dense copies, the output and gradients are eager's.
    Returns the names in the forward trace."""
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1),
                                              is_causal=True)
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, device=device, dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
    refs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    jfn = thunderlite.jit(fn)
    got, want = jfn(q, k, v), fn(*refs)
    torch.testing.assert_close(got, want, **tol)
    g = torch.randn(want.shape, device=device, dtype=want.dtype, generator=gen)
    got.backward(g)
    want.backward(g)
    for t, r in zip((q, k, v), refs, strict=True):
        torch.testing.assert_close(t.grad, r.grad, **tol)
    return [b.sym.name for b in thunderlite.last_traces(jfn)[-1].bound_symbols]


def test_flash_attention_takes_strided_last_dims():
    """CPU flash attention returned wrong numbers for such inputs."""
    assert "sdpa_flash_cpu" in _strided_attention_matches_eager("cpu", F64)


@pytest.mark.skipif(not _eager_picks_flash(),
                    reason="CUDA flash attention needs an sm80+ GPU and a PyTorch built with flash attention")
def test_cuda_flash_attention_takes_strided_last_dims():
    """The CUDA flash kernels raise on such inputs."""
    names = _strided_attention_matches_eager("cuda", torch.bfloat16, atol=2e-2, rtol=2e-2)
    assert {"sdpa_flash_cuda", "sdpa_cudnn"} & set(names), names


# --- a training step's backward is made of the kernels ----------------------------------------

class _Block(torch.nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln = torch.nn.LayerNorm(d)
        self.qkv, self.fc = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        return x + F.gelu(self.fc(y))


class _GPT(torch.nn.Module):
    def __init__(self, vocab=32, d=16, layers=2):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(_Block(d) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx, targets):
        x = self.tok(idx)
        for blk in self.blocks:
            x = blk(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def _step_grads(model, fn, idx, targets):
    model.zero_grad(set_to_none=True)
    loss = fn(idx, targets)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _jit_step_matches_eager(model, idx, targets, executors=None, **tol):
    """The jitted model's loss and parameter gradients equal eager's; returns it."""
    want_loss, want = _step_grads(model, model, idx, targets)
    jm = thunderlite.jit(model, executors=executors)
    got_loss, got = _step_grads(model, jm, idx, targets)
    torch.testing.assert_close(got_loss, want_loss, **tol)
    for name in want:
        assert got[name].dtype == want[name].dtype
        torch.testing.assert_close(got[name], want[name], msg=name, **tol)
    return jm


def test_gpt_backward_uses_fused_kernels():
    torch.manual_seed(0)
    model = _GPT().to(F64)
    jm = _jit_step_matches_eager(model, torch.randint(0, 32, (2, 6)), torch.randint(0, 32, (2, 6)))
    fwd, bwd = thunderlite.last_traces(jm)[-1], thunderlite.last_backward_traces(jm)[-1]
    names = [b.sym.name for b in bwd.bound_symbols]
    layers = len(model.blocks)
    # attention's backward is one symbol per layer, not the dozens of ops of its formula
    assert names.count("sdpa_flash_cpu_backward") == layers
    assert names.count("native_layer_norm_backward") == layers
    assert names.count("gelu_backward") == layers
    assert names.count("embedding_dense_backward") == 1
    assert ([b.sym.id for b in bwd.bound_symbols if b.sym.name == "cross_entropy_backward"]
            == ["torchex.cross_entropy_backward"])
    assert not {"softmax", "exp", "amax", "where", "pad"} & set(names), names
    fwd_names = [b.sym.name for b in fwd.bound_symbols]
    assert fwd_names.count("sdpa_flash_cpu") == fwd_names.count("native_layer_norm") == layers
    # the backward keeps each kernel's decomposition for fusion executors
    sdpa_bwd = next(b for b in bwd.bound_symbols if b.sym.name == "sdpa_flash_cpu_backward")
    assert sdpa_bwd.subsymbols


@pytest.mark.parametrize("dtype", HALVES)
def test_half_precision_gpt_backward_uses_fused_kernels(dtype):
    """Mixed-precision training gets the same fused backward kernels as float32
    (the kernels compute in float32), with eager's gradients."""
    torch.manual_seed(0)
    model = _GPT().to(dtype)
    jm = _jit_step_matches_eager(model, torch.randint(0, 32, (2, 16)), torch.randint(0, 32, (2, 16)),
                                 atol=2e-2, rtol=2e-2)
    names = [b.sym.name for b in thunderlite.last_backward_traces(jm)[-1].bound_symbols]
    for kernel in ("sdpa_flash_cpu_backward", "native_layer_norm_backward", "gelu_backward"):
        assert names.count(kernel) == len(model.blocks), names
    assert names.count("cross_entropy_backward") == names.count("embedding_dense_backward") == 1
    assert not {"softmax", "exp", "amax", "where", "pad"} & set(names), names


class _NoKernels(OperatorExecutor):
    """Refuses the fused kernels, so they run as their decompositions (as under
    a fusion executor); everything else goes to the torch executor."""

    def claim(self, bsym):
        return None if bsym.sym.module == "aten" else torch_executor.claim(bsym)


def _block(x, w, b, wqkv, idx, emb, targets):
    """Embedding, layer_norm, attention, gelu, rms_norm, tanh, log_softmax and
    cross_entropy (on proxies, torch functions record the torch language)."""
    d = x.shape[-1]
    h = x + F.embedding(idx, emb)
    q, k, v = F.linear(F.layer_norm(h, (d,), w, b), wqkv).split(d, dim=-1)
    q, k, v = (z.reshape(2, 5, 2, d // 2).transpose(1, 2) for z in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 5, d)
    y = F.rms_norm(F.gelu(y) + F.silu(y).tanh(), (d,), w)
    return F.cross_entropy(y.reshape(10, d), targets) + F.log_softmax(y, -1).sum()


def test_decomposed_kernels_match_eager(monkeypatch):
    """With every kernel symbol decomposed, the gradients are still eager's."""
    import test_grad_prims
    from test_grad_prims import check_grad

    from thunderlite.transforms.claim import claim_executors

    monkeypatch.setattr(test_grad_prims, "_finalize", lambda t: claim_executors(t, [_NoKernels("nokernels")]))
    args = (_t(2, 5, 8), _t(8, seed=1), _t(8, seed=2), _t(24, 8, seed=3), torch.randint(0, 6, (2, 5)),
            _t(6, 8, seed=4), torch.randint(0, 8, (10,)))
    args = tuple(a.requires_grad_() if a.is_floating_point() else a for a in args)
    prog = check_grad(_block, *args, ref_fn=_block)
    fwd, bwd = prog.forward_traces[-1], prog.backward_traces[-1]
    assert "aten.sdpa_flash_cpu" in {b.sym.id for b in prog.split.forward.bound_symbols}
    assert not any(b.sym.module == "aten" for b in fwd.bound_symbols + bwd.bound_symbols)


# --- what the forward saves for the backward -----------------------------------------------------

def _saved(prog) -> set[str]:
    return {p.name for p in prog.split.saved_tensors + prog.split.saved_other}


def _producer(prog, name: str) -> str:
    return next(b.sym.name for b in prog.split.forward.bound_symbols if name in {o.name for o in b.proxy_outs()})


def test_softmax_saves_its_output_not_its_input():
    from test_grad_prims import check_grad
    prog = check_grad(lambda x, w: torch.softmax(x @ w, -1) @ w,
                      _t(4, 5).requires_grad_(), _t(5, 5, seed=1).requires_grad_())
    assert {_producer(prog, n) for n in _saved(prog) if not n.startswith("a")} == {"softmax"}


def test_residual_sum_is_saved_and_gelu_saved_on_the_cpu():
    """A residual sum feeding layer_norm is saved (recomputing it would add a
    kernel and keep its two summands instead); gelu's output, which the next
    matmul's backward reads, is saved as eager saves it: on the CPU gelu's pass
    is bound by arithmetic (rematerialize._COMPUTE_BOUND_ON_CPU). A product,
    bound by memory, is recomputed from its saved input."""
    from test_grad_prims import check_grad

    def fn(x, w1, w2):
        h = x + x @ w1
        a = F.layer_norm(h, (5,)) @ w1
        return F.gelu(a) @ w2 + (a * a) @ w2
    prog = check_grad(fn, _t(4, 5).requires_grad_(), _t(5, 5, seed=1).requires_grad_(),
                      _t(5, 3, seed=2).requires_grad_())
    producers = {_producer(prog, n) for n in _saved(prog) if not n.startswith("a")}
    assert "add" in producers and "gelu" in producers and "mul" not in producers, producers
    bwd = [b.sym.name for b in prog.backward_traces[-1].bound_symbols]
    assert "gelu" not in bwd and bwd.count("mul") >= 1


class _Fusing:
    """Stands for a fusion executor in the list (``fuses_elementwise``)."""
    fuses_elementwise = True

    def differentiation(self, bsym):
        return None


def test_gelu_is_recomputed_under_a_fusion_executor():
    """Under a fusion executor gelu's output is recomputed from its input (one
    more step of a fused backward kernel), on the CPU too."""
    from test_grad_prims import trace_of

    from thunderlite.transforms.autodiff.split import split_forward_backward

    def fn(x, w1, w2):
        return F.gelu(x @ w1) @ w2
    args = tuple(t.requires_grad_() for t in (_t(4, 5), _t(5, 5, seed=1), _t(5, 3, seed=2)))
    for executors, recomputed in ((None, False), ([_Fusing()], True)):
        split = split_forward_backward(trace_of(fn, args), [True, True, True], executors=executors)
        bwd = [b.sym.name for b in split.backward.bound_symbols]
        assert ("gelu" in bwd) == recomputed, (executors, bwd)


def test_values_only_a_dead_gradient_reads_are_not_saved():
    """``t * c`` where ``c`` needs no gradient: the rule's gradient for ``c``
    (``g * t``) is dead, so ``t`` must not be kept for the backward (rotary
    embedding's ``q * cos``: the rotated q was saved for nothing)."""
    from test_grad_prims import check_grad
    prog = check_grad(lambda q, c: ((q * 2.0).exp() * c).sum(), _t(4, 5).requires_grad_(), _t(4, 5, seed=1))
    assert {_producer(prog, n) for n in _saved(prog) if not n.startswith("a")} == {"exp"}


def test_a_broadcast_is_recomputed_from_its_smaller_input():
    """A saved broadcast of a smaller value (cos/sin spread over batch and
    heads) is recomputed in the backward from its input, which is saved
    instead: a fusion executor would otherwise write the broadcast in full."""
    from test_grad_prims import check_grad

    def fn(q, cos):
        return (q * cos.unsqueeze(0).expand(8, 4, 5)).sum()
    prog = check_grad(fn, _t(8, 4, 5).requires_grad_(), _t(4, 5, seed=1))
    saved = [p for p in prog.split.saved_tensors + prog.split.saved_other if hasattr(p, "shape")]
    assert saved and all(p.numel() <= 20 for p in saved), [(p.name, p.shape) for p in saved]
    assert any(b.sym.name == "broadcast_in_dim" for b in prog.backward_traces[-1].bound_symbols)


def test_a_widening_is_recomputed_from_its_half_input_under_a_fusion_executor():
    """``h = x.float()`` of a bfloat16 intermediate ``x`` that the backward
    reads: the torch executor saves ``h`` (recomputing it would add a kernel);
    under a fusion executor ``x`` is saved, half the bytes, and ``h`` is
    recomputed inside the fused backward (as torch.compile's partitioner does)."""
    from test_grad_half import _saved

    from thunderlite.extend import get_executor
    ok, reason = get_executor("torchcompile").is_available()
    if not ok:
        pytest.skip(f"torch.compile executor unavailable: {reason}")

    def fn(a):
        h = (a * 2).float()
        return (h * h).sum()
    a = torch.randn(8, 16, dtype=torch.bfloat16)
    for executors, widened in ((None, True), (["torchcompile", "torch"], False)):
        x, ref = a.clone().requires_grad_(), a.clone().requires_grad_()
        jfn = thunderlite.jit(fn, executors=executors)
        out = jfn(x)
        out.backward()
        expected = fn(ref)
        expected.backward()
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(x.grad, ref.grad)
        saved = _saved(jfn)
        assert saved and all(p.dtype == (torch.float32 if widened else torch.bfloat16) for p in saved), saved


def test_a_broadcast_to_a_symbolic_shape_is_recomputed_with_its_sizes():
    """Under ``dynamic=True`` the recomputed broadcast's shape names symbolic
    sizes: they are saved with its input (the backward read an unsaved size:
    grad fuzz seed 559)."""
    def fn(w, b):
        return torch.where(w > 0, w, b) * 2
    jfn = thunderlite.jit(fn, dynamic=True)
    for n in (3, 5):
        w, b = _t(1, 4).requires_grad_(), _t(n, 4, seed=n).requires_grad_()
        w2, b2 = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        jfn(w, b).sum().backward()
        fn(w2, b2).sum().backward()
        torch.testing.assert_close((w.grad, b.grad), (w2.grad, b2.grad))
    bwd = thunderlite.last_backward_traces(jfn)[-1]
    assert any(b.sym.name == "broadcast_in_dim" for b in bwd.bound_symbols), str(bwd)


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_cross_entropy_forward_and_backward(reduction):
    x, target = _t(6, 5), torch.tensor([1, 0, 4, -100, 2, 2])
    _same(K.cross_entropy_forward, x, target, reduction, -100)
    _, log_probs, total = K.cross_entropy_forward.torch_fn(x, target, reduction, -100)
    grad = _t(6, seed=2) if reduction == 0 else _t(seed=2)
    _same(K.cross_entropy_backward, grad, log_probs, target, reduction, -100, total)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_nll_loss_forward_and_backward(reduction, weighted):
    x, target = _t(6, 5).log_softmax(1), torch.tensor([1, 0, 4, -100, 2, 2])
    weight = _t(5, seed=3).abs() if weighted else None
    _same(K.nll_loss_forward, x, target, weight, reduction, -100)
    _, total = K.nll_loss_forward.torch_fn(x, target, weight, reduction, -100)
    grad = _t(6, seed=2) if reduction == 0 else _t(seed=2)
    _same(K.nll_loss_backward, grad, x, target, weight, reduction, -100, total)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_runs_eagers_kernels_and_matches_eager(reduction):
    """log_softmax then nll_loss, as older training loops write it: nll_loss's
    forward saves the total weight and its backward is nll_loss_backward."""
    lin = torch.nn.Linear(6, 5, dtype=F64)
    x, target, weight = _t(7, 6, seed=1), torch.tensor([1, 0, 4, -100, 2, 2, 3]), _t(5, seed=3).abs()

    def fn(x):
        return F.nll_loss(F.log_softmax(lin(x), 1), target, weight, reduction=reduction).sum()
    jfn = thunderlite.jit(fn)
    jfn(x).backward()
    got = [p.grad for p in lin.parameters()]
    lin.zero_grad(set_to_none=True)
    fn(x).backward()
    for g, p in zip(got, lin.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)
    fwd = [b.sym.name for b in thunderlite.last_traces(jfn)[-1].bound_symbols]
    bwd = [b.sym.name for b in thunderlite.last_backward_traces(jfn)[-1].bound_symbols]
    assert "nll_loss_forward" in fwd and "nll_loss_backward" in bwd and "log_softmax_backward_data" in bwd, bwd


@pytest.mark.parametrize("dtype", [torch.float32, F64, torch.bfloat16])
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_cross_entropy_backward_kernel_is_eagers(reduction, dtype):
    """The torch executor's cross-entropy backward (one buffer on the CPU in
    float32/float64) returns what eager's nll_loss_backward and
    _log_softmax_backward_data return, ignored targets included."""
    x, target = _t(9, 7, dtype=dtype), torch.tensor([1, 0, 6, -100, 2, 2, -100, 5, 3])
    log_probs = torch.log_softmax(x, 1)
    _, total = aten.nll_loss_forward(log_probs, target, None, reduction, -100)
    grad = (_t(9, seed=2) if reduction == 0 else _t(seed=2)).to(dtype)
    want = aten._log_softmax_backward_data(
        aten.nll_loss_backward(grad, log_probs, target, None, reduction, -100, total), log_probs, 1, dtype)
    got = K.cross_entropy_backward.torch_fn(grad, log_probs, target, reduction, -100, total)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got, want)


def test_linear_backward_reads_the_saved_input_before_the_input_gradient_is_made():
    """Linear's VJP computes the weight's gradient first: it is the last read of
    the saved activation (here gelu's output), which then dies before
    the input's gradient, as large, is allocated (the step's peak memory)."""
    fc, out = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)

    def fn(x):
        return out(F.gelu(fc(x))).sum()

    x = _t(4, 8, dtype=torch.float32).requires_grad_()
    jf = thunderlite.jit(fn)
    jf(x).backward()
    grads = [x.grad, *(p.grad for p in (*fc.parameters(), *out.parameters()))]
    for p in (x, *fc.parameters(), *out.parameters()):
        p.grad = None
    fn(x).backward()
    for got, p in zip(grads, (x, *fc.parameters(), *out.parameters()), strict=True):
        torch.testing.assert_close(got, p.grad)
    bwd = thunderlite.last_backward_traces(jf)[-1]
    names = [b.sym.name for b in bwd.bound_symbols]
    act = next(b.output.name for b in thunderlite.last_traces(jf)[-1].bound_symbols if b.sym.name == "gelu")
    dies = next(i for i, b in enumerate(bwd.bound_symbols) if b.sym.name == "del" and
                any(getattr(a, "name", None) == act for a in b.args))
    assert "gelu_backward" not in names[:dies], str(bwd)


def test_dropout_saves_its_mask_and_draws_what_eager_draws():
    def fn(x, w):
        return F.dropout(x @ w, 0.3).sum(), F.dropout(x, 0.5, training=True) * 2
    x, w = _t(6, 5).requires_grad_(), _t(5, 4, seed=1).requires_grad_()
    xr, wr = (t.detach().clone().requires_grad_() for t in (x, w))
    jfn = thunderlite.jit(fn)
    for _ in range(2):
        torch.manual_seed(7)
        got = jfn(x, w)
        torch.manual_seed(7)
        want = fn(xr, wr)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        (got[0] + got[1].sum()).backward()
        (want[0] + want[1].sum()).backward()
        torch.testing.assert_close(x.grad, xr.grad)
        torch.testing.assert_close(w.grad, wr.grad)
    fwd, bwd = thunderlite.last_traces(jfn)[-1], thunderlite.last_backward_traces(jfn)[-1]
    assert sum(b.sym.name == "native_dropout" for b in fwd.bound_symbols) == 2
    assert sum(b.sym.name == "native_dropout_backward" for b in bwd.bound_symbols) == 2
    _same(K.native_dropout_backward, _t(3, 4), torch.rand(3, 4) > 0.5, 2.0)
