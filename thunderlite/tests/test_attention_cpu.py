"""Attention on the CPU takes the kernel eager's dispatcher takes
(autodiff/attention.py ``sdpa_kernel``): the choice agrees with
``torch._fused_sdp_choice`` over masks, grouped-query attention, dropout,
dtypes and toggles; a training step with the flash kernel is one forward and
one backward symbol and matches eager (outputs and gradients, float32,
float64, bfloat16); the math path (dropout, masks needing grad, 3-d inputs)
matches eager too, fully masked rows included; examine says which and why;
and a program that writes memory elsewhere keeps attention whole."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunderlite
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.transforms.autodiff import attention

F64 = torch.float64
_FLASH = 1          # torch.nn.attention.SDPBackend.FLASH_ATTENTION


def _rand(*shape, seed=0, dtype=torch.float32, grad=False):
    t = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return t.requires_grad_() if grad else t


def _proxy(t, name):
    return None if t is None else TensorProxy(tuple(t.shape), t.dtype, "cpu", requires_grad=t.requires_grad,
                                              name=name)


def _choice(q, k, v, mask=None, dropout_p=0.0, is_causal=False, scale=None, gqa=False):
    with tracectx(Trace()):
        call = attention._Call(_proxy(q, "q"), _proxy(k, "k"), _proxy(v, "v"), _proxy(mask, "m"), dropout_p,
                               is_causal, scale, gqa)
        return attention.sdpa_kernel(call)


_Q = (2, 4, 8, 16)
_CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "gqa": dict(kv=(2, 2, 8, 16), gqa=True),
    "gqa, same heads": dict(gqa=True),
    "gqa heads not dividing": dict(kv=(2, 3, 8, 16), gqa=True),
    "fewer kv heads without enable_gqa": dict(kv=(2, 2, 8, 16)),
    "dropout": dict(dropout_p=0.1),
    "bool mask 2-d": dict(mask=(8, 8), mask_dtype=torch.bool),
    "additive mask 4-d": dict(mask=(2, 1, 8, 8)),
    "mask broadcast over queries": dict(mask=(1, 1, 1, 8)),
    "mask with heads": dict(mask=(2, 4, 8, 8)),
    "3-d mask": dict(mask=(2, 8, 8)),
    "mask needing grad": dict(mask=(8, 8), mask_grad=True),
    "mask of the wrong head count": dict(mask=(2, 2, 8, 8)),
    "causal and mask": dict(mask=(8, 8), is_causal=True),
    "float64": dict(dtype=F64),
    "bfloat16": dict(dtype=torch.bfloat16),
    "float16": dict(dtype=torch.float16),
    "bfloat16, float32 mask": dict(dtype=torch.bfloat16, mask=(8, 8)),
    "3-d q, k, v": dict(q=(4, 8, 16), kv=(4, 8, 16)),
    "head dims differ": dict(v_dim=8),
    "more keys than queries": dict(kv=(2, 4, 12, 16), is_causal=True),
    "no queries": dict(q=(2, 4, 0, 16)),
    "batch broadcast": dict(kv=(1, 4, 8, 16)),
    "scale": dict(scale=0.3),
}


def _case_tensors(case):
    dtype = case.get("dtype", torch.float32)
    q = _rand(*case.get("q", _Q), dtype=dtype)
    kv = case.get("kv", (*q.shape[:-2], 8, q.shape[-1]) if q.shape[-2] == 0 else q.shape)
    k = _rand(*kv, seed=1, dtype=dtype)
    v = _rand(*kv[:-1], case.get("v_dim", kv[-1]), seed=2, dtype=dtype)
    mask = None
    if "mask" in case:
        mdtype = case.get("mask_dtype", torch.float32 if dtype == torch.bfloat16 else dtype)
        mask = torch.ones(case["mask"], dtype=mdtype) if mdtype is torch.bool else _rand(*case["mask"], seed=3,
                                                                                         dtype=mdtype)
        mask.requires_grad_(case.get("mask_grad", False))
    return q, k, v, mask


@pytest.mark.parametrize("name", list(_CASES))
def test_cpu_kernel_choice_agrees_with_eagers_dispatcher(name):
    case = _CASES[name]
    q, k, v, mask = _case_tensors(case)
    kw = dict(dropout_p=case.get("dropout_p", 0.0), is_causal=case.get("is_causal", False),
              scale=case.get("scale"), gqa=case.get("gqa", False))
    eager = torch._fused_sdp_choice(q, k, v, mask, kw["dropout_p"], kw["is_causal"], scale=kw["scale"],
                                    enable_gqa=kw["gqa"]) == _FLASH
    kernel, why = _choice(q, k, v, mask, **kw)
    assert (kernel == "flash_cpu") == eager, (name, why)
    assert why.startswith("eager's CPU dispatcher takes " + ("flash attention" if eager else "the math path"))


def test_cpu_kernel_choice_follows_the_flash_toggle():
    q, k, v, _ = _case_tensors({})
    assert _choice(q, k, v)[0] == "flash_cpu"
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        kernel, why = _choice(q, k, v)
        assert kernel is None and "disabled" in why
        assert torch._fused_sdp_choice(q, k, v) != _FLASH


def _step(fn, *inputs, seed=None):
    """Output and gradients of every input requiring grad, of ``fn``'s sum weighted by a fixed tensor."""
    if seed is not None:
        torch.manual_seed(seed)
    out = fn(*inputs)
    weight = _rand(*out.shape, seed=9, dtype=out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), [t for t in inputs if t is not None and t.requires_grad])
    return out, grads


def _matches_eager(fn, inputs, *, seed=None, **tol):
    jfn = thunderlite.jit(fn)
    want = _step(fn, *inputs, seed=seed)
    got = _step(jfn, *inputs, seed=seed)
    torch.testing.assert_close(got[0], want[0], **tol)
    for g, w in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(g, w, **tol)
    return jfn


def _names(jfn):
    fwd = [b.sym.name for b in thunderlite.last_traces(jfn)[-1].bound_symbols]
    bwd = [b.sym.name for b in thunderlite.last_backward_traces(jfn)[-1].bound_symbols]
    return fwd, bwd


_TRAINING = {
    "causal": (dict(), dict(is_causal=True)),
    "gqa, causal (HF Llama without a mask)": (dict(kv_heads=2), dict(is_causal=True, enable_gqa=True)),
    "gqa, more keys": (dict(kv_heads=1, S=11), dict(enable_gqa=True)),
    "bool mask": (dict(mask=torch.bool), dict()),
    "additive 4-d mask": (dict(mask="4d"), dict()),
    "causal and additive mask": (dict(mask="2d"), dict(is_causal=True)),
    "gqa and bool mask": (dict(kv_heads=2, mask=torch.bool), dict(enable_gqa=True)),
    "scale": (dict(), dict(scale=0.2)),
}


def _training_inputs(dtype, kv_heads=4, S=7, mask=None):
    q = _rand(2, 4, 7, 8, dtype=dtype, grad=True)
    k, v = (_rand(2, kv_heads, S, 8, seed=s, dtype=dtype, grad=True) for s in (1, 2))
    if mask is torch.bool:
        m = _rand(7, S, seed=3) > -0.5
        m[:, 0] = True          # every row keeps a key
    elif mask == "4d":
        m = _rand(2, 1, 7, S, seed=3, dtype=dtype)
    elif mask == "2d":
        m = _rand(7, S, seed=3, dtype=dtype)
    else:
        m = None
    return q, k, v, m


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("name", list(_TRAINING))
def test_training_step_runs_the_flash_kernels_and_matches_eager(name, dtype):
    make, kw = _TRAINING[name]
    q, k, v, m = _training_inputs(dtype, **make)

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
    jfn = _matches_eager(fn, (q, k, v, m))
    fwd, bwd = _names(jfn)
    assert fwd.count("sdpa_flash_cpu") == 1 and "matmul" not in fwd, fwd
    assert bwd.count("sdpa_flash_cpu_backward") == 1 and "matmul" not in bwd, bwd


def test_bfloat16_runs_eagers_kernels():
    """bfloat16 on the CPU: the same kernels as eager, so the same numbers."""
    q, k, v, _ = _training_inputs(torch.bfloat16, kv_heads=2)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    jfn = _matches_eager(fn, (q, k, v), atol=0, rtol=0)
    assert "sdpa_flash_cpu" in _names(jfn)[0]
    with torch.no_grad():
        torch.testing.assert_close(jfn(q, k, v), fn(q, k, v), atol=0, rtol=0)


def test_repeat_kv_copies_are_plain_attention():
    """HF's repeat_kv (expand and reshape to q's head count) with a mask: plain flash attention."""
    q, k, v, m = _training_inputs(torch.float32, kv_heads=2, mask="4d")

    def repeat_kv(x, n):
        b, h, s, d = x.shape
        return x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=m)
    jfn = _matches_eager(fn, (q, k, v, m))
    fwd, bwd = _names(jfn)
    assert "sdpa_flash_cpu" in fwd and "sdpa_flash_cpu_backward" in bwd


@pytest.mark.parametrize("kind", ["dropout", "mask needing grad", "3-d"])
def test_math_path_matches_eager(kind):
    """Where eager takes the math path, so does thunderlite: dropout draws the
    same mask from the same seed; a mask needing grad gets eager's gradient."""
    q, k, v, m = _training_inputs(F64, kv_heads=2 if kind == "dropout" else 4, mask="2d")
    kw = dict(enable_gqa=True, dropout_p=0.3) if kind == "dropout" else {}
    if kind == "mask needing grad":
        m.requires_grad_()
    if kind == "3-d":
        q, k, v = (t.detach()[0].requires_grad_() for t in (q, k, v))

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=kind == "dropout", **kw) \
            if kind == "dropout" else F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
    inputs = (q, k, v, None if kind == "dropout" else m)
    jfn = _matches_eager(fn, inputs, seed=5)
    fwd, bwd = _names(jfn)
    assert "sdpa_flash_cpu" not in fwd and "sdpa_flash_cpu_backward" not in bwd


@pytest.mark.parametrize("dropout_p", [0.0, 0.5])
@pytest.mark.parametrize("dims", [3, 4])
def test_fully_masked_rows_are_zeros_with_zero_gradient(dropout_p, dims):
    """A query row with every key masked: eager gives zeros (flash and math
    path alike) and no gradient; so does every thunderlite path."""
    q = _rand(2, 3, 4, 8, dtype=F64, grad=True) if dims == 4 else _rand(3, 4, 8, dtype=F64, grad=True)
    m = torch.ones(4, 4, dtype=torch.bool)
    m[1] = False

    def fn(q, m):
        return F.scaled_dot_product_attention(q, q, q, attn_mask=m, dropout_p=dropout_p)
    _matches_eager(fn, (q, m), seed=1)


def test_fully_masked_rows_in_the_kernels_decomposition():
    """The flash kernel's decomposition (what a fusion executor runs) gives a
    fully masked row zeros and a logsumexp of 0, as the kernel does."""
    from test_grad_kernels import _decomposed

    from thunderlite.transforms.autodiff import kernels as K
    q = _rand(1, 2, 4, 8, dtype=F64)
    m = torch.zeros(4, 4, dtype=F64)
    m[1] = -torch.inf
    want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.0, False, attn_mask=m)
    got = _decomposed(K.sdpa_flash_cpu, q, q, q, 0.0, False, attn_mask=m)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_examine_says_which_kernel_and_why():
    q, k, v, _ = _training_inputs(torch.float32, kv_heads=2)

    def flash(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum()

    def with_dropout(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, enable_gqa=True).sum()
    report = str(thunderlite.examine(flash, q, k, v))
    assert "scaled_dot_product_attention x1: fused kernels: eager's CPU dispatcher takes flash attention" in report
    assert "sdpa_flash_cpu x1 run by 'torch' (aten._scaled_dot_product_flash_attention_for_cpu)" in report
    assert "sdpa_flash_cpu_backward x1 run by 'torch'" in report
    report = str(thunderlite.examine(with_dropout, q, k, v))
    assert "scaled_dot_product_attention x1: decomposition: eager's CPU dispatcher takes the math path: " \
           "dropout_p > 0" in report
    with torch.no_grad():
        report = str(thunderlite.examine(flash, q, k, v))
    assert "scaled_dot_product_attention x1: one torch call: no gradient" in report, report


def test_attention_stays_whole_in_a_program_that_writes():
    """A write elsewhere in the program (functionalized) leaves attention, the
    softmax and the split of q, k, v one symbol each: they only read, or
    return views of memory no write reaches."""
    x = _rand(2, 7, 24, grad=True)

    def fn(x):
        q, k, v = (t.reshape(2, 7, 2, 4).transpose(1, 2) for t in x.split(8, dim=-1))
        counts = torch.zeros(7)
        counts[torch.tensor([1, 3])] = 1.0          # a write into a fresh tensor
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (y.sum(-1) * counts).sum() + F.softmax(x, -1).sum()
    jfn = _matches_eager(fn, (x,))
    fwd, bwd = _names(jfn)
    assert fwd.count("sdpa_flash_cpu") == 1 and fwd.count("softmax") == 1 and fwd.count("split") == 1, fwd
    assert "sdpa_flash_cpu_backward" in bwd and "cat" in bwd, bwd


def test_a_split_of_written_memory_is_taken_apart():
    """A split whose base a write reaches: its pieces are replayed on the
    written value (they see the write), so the split is taken apart."""
    x = _rand(4, 6, grad=True)

    def fn(x):
        c = x * 2
        a, b = c.split(3, dim=-1)
        with torch.no_grad():
            c.mul_(3)
        return a * b
    jfn = thunderlite.jit(fn)
    torch.testing.assert_close(jfn(x), (x * 6)[:, :3] * (x * 6)[:, 3:])
    names = [b.sym.name for b in thunderlite.last_traces(jfn)[-1].bound_symbols]
    assert "split" not in names and names.count("slice_prim") == 2, names


def _kernel_calls():
    """A traced attention kernel at a real size, a tiny one, and a layer norm's backward."""
    from thunderlite.transforms.autodiff import kernels as K
    t = Trace()
    with tracectx(t):
        def p(name, *shape):
            return TensorProxy(shape, torch.float32, "cpu", name=name)
        q, k = p("q", 4, 8, 128, 32), p("k", 4, 4, 128, 32)
        K.sdpa_flash_cpu(q, k, k, 0.0, True)
        q2 = p("q2", 1, 1, 4, 64)
        K.sdpa_flash_cpu(q2, q2, q2, 0.0, False)
        x, w, mean = p("x", 512, 256), p("w", 256), p("mean", 512, 1)
        K.native_layer_norm_backward(x, x, (256,), mean, mean, w, w, [True, True, True])
    return t.bound_symbols


def test_cost_model_keeps_attention_whole_and_fuses_a_norms_backward():
    """Attention's decomposition writes its [B, H, L, S] scores and
    probabilities around its matmuls (2 MiB each here): the kernel runs. A
    norm's backward has no matmul: its decomposition is fused. At a tiny size
    the scores cost nothing: fusing the decomposition is within the margin."""
    from thunderlite.executors.cost import keep_kernel
    attn, tiny, norm_bwd = _kernel_calls()
    keep, why = keep_kernel(attn)
    assert keep and "8.0 MiB of intermediates" in why and why.endswith("the kernel runs"), why
    assert not keep_kernel(tiny)[0]
    keep, why = keep_kernel(norm_bwd)
    assert not keep and "writes nothing around matmuls" in why, why


def test_examine_with_a_fusion_executor_gives_the_cost_models_verdict():
    from thunderlite.executors.triton.executor import triton_executor
    ok, why = triton_executor.is_available()
    if not ok:
        pytest.skip(f"Triton executor unavailable: {why}")
    x, w = _rand(2, 8, 32, grad=True), _rand(32, seed=1, grad=True)
    wq = _rand(96, 32, seed=2, grad=True)

    def fn(x, w, wq):
        q, k, v = (t.reshape(2, 8, 4, 8).transpose(1, 2) for t in F.linear(F.layer_norm(x, (32,), w), wq).split(32, -1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()
    report = str(thunderlite.examine(fn, x, w, wq, executors=["triton", "torch"]))
    assert "sdpa_flash_cpu x1 run by 'torch' (aten._scaled_dot_product_flash_attention_for_cpu); cost model: " \
           "as one kernel" in report, report
    assert "native_layer_norm_backward x1 replaced by its decomposition" in report, report
