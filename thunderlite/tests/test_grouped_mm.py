"""``F.grouped_mm``/``torch._grouped_mm`` (mixture-of-experts grouped GEMM) as
one symbol running ATen's kernel, forward and backward, in every layout; and
transformers' ``grouped_mm_fallback`` custom op recorded as that symbol where
eager's branch calls the kernel (torch/custom_op_equivalents.py)."""
from __future__ import annotations

import copy

import pytest
import torch

import thunderlite

F = torch.nn.functional
pytestmark = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")


def _offs(gen, total: int, groups: int) -> torch.Tensor:
    """Random cumulative group ends covering ``total``, some groups empty."""
    cuts = torch.randint(0, total + 1, (groups - 1,), generator=gen).sort().values
    cuts[0] = cuts[1] if groups > 2 else cuts[0]            # at least one empty group
    return torch.cat([cuts, torch.tensor([total])]).to(torch.int32)


def _operands(layout: str, gen, dtype=torch.float32):
    G, M, K, N = 4, 24, 16, 8
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype).requires_grad_()  # noqa: E731
    if layout == "2d3d":
        return r(M, K), r(G, N, K).transpose(-2, -1), _offs(gen, M, G)
    if layout == "3d3d":
        return r(G, M, K), r(G, K, N), None
    if layout == "2d2d":
        return r(K, M).t(), r(K, N), _offs(gen, K, G)                # the contraction dim per group
    return r(G, M, K), r(N * G, K).t(), _offs(gen, N * G, G)         # 3d2d: mat_b's columns per group


def _eager_grads(out, leaves, g):
    return torch.autograd.grad(out, leaves, g)


@pytest.mark.parametrize("layout", ["2d3d", "3d3d", "2d2d", "3d2d"])
@pytest.mark.parametrize("spelling", ["F", "torch"])
def test_grouped_mm_forward_backward_equal_eager(layout, spelling):
    gen = torch.Generator().manual_seed(hash(layout) % 1000)
    a, b, offs = _operands(layout, gen)
    fn = ((lambda x, y, o: F.grouped_mm(x, y, offs=o)) if spelling == "F"
          else (lambda x, y, o: torch._grouped_mm(x, y, o)))
    jfn = thunderlite.jit(fn)
    want = fn(a, b, offs)
    got = jfn(a, b, offs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    g = torch.randn(want.shape, generator=gen)
    for gw, gg in zip(_eager_grads(want, (a, b), g), _eager_grads(got, (a, b), g), strict=True):
        torch.testing.assert_close(gg, gw, rtol=0, atol=0)
    fwd, bwd = str(thunderlite.last_traces(jfn)[-1]), str(thunderlite.last_backward_traces(jfn)[-1])
    assert "torchex.grouped_mm(" in fwd and "torchex.grouped_mm_backward(" in bwd
    assert "opaque" not in fwd + bwd


def test_grouped_mm_gradient_of_any_layout():
    """``out.sum()``'s gradient is an expanded scalar, which eager's backward
    refuses ("Invalid strides"); the jit's backward lays it out for the kernel.
    Checked against the per-group matmuls, with a group left empty."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10, 8, generator=gen, requires_grad=True)
    w = torch.randn(3, 8, 12, generator=gen, requires_grad=True)
    offs = torch.tensor([4, 4, 10], dtype=torch.int32)
    jfn = thunderlite.jit(lambda x, w, o: (F.grouped_mm(x, w, offs=o) * 2).sum() + F.grouped_mm(x, w, offs=o).t().sum())
    gx, gw = torch.autograd.grad(jfn(x, w, offs), (x, w))
    xd, wd = x.detach().requires_grad_(), w.detach().requires_grad_()
    ref = sum((xd[s:e] @ wd[i]).sum() * 3 for i, (s, e) in enumerate([(0, 4), (4, 4), (4, 10)]))
    rx, rw = torch.autograd.grad(ref, (xd, wd))
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)
    assert torch.count_nonzero(gw[1]) == 0


def test_grouped_mm_only_one_operand_wants_grad():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(12, 8, generator=gen)
    w = torch.randn(2, 8, 4, generator=gen, requires_grad=True)
    offs = torch.tensor([5, 12], dtype=torch.int32)
    fn = lambda x, w, o: F.grouped_mm(x, w, offs=o)  # noqa: E731
    jfn = thunderlite.jit(fn)
    g = torch.randn(12, 4, generator=gen)
    (got,) = torch.autograd.grad(jfn(x, w, offs), (w,), g)
    (want,) = torch.autograd.grad(fn(x, w, offs), (w,), g)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert "= torchex.grouped_mm_backward(g0, x, w, o, (False, True))" in str(thunderlite.last_backward_traces(jfn)[-1])


def test_grouped_mm_bfloat16():
    gen = torch.Generator().manual_seed(2)
    a, b, offs = _operands("2d3d", gen, torch.bfloat16)
    fn = lambda x, y, o: F.grouped_mm(x, y, offs=o)  # noqa: E731
    want, got = fn(a, b, offs), thunderlite.jit(fn)(a, b, offs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    g = torch.randn(want.shape, generator=gen, dtype=torch.bfloat16)
    for gw, gg in zip(_eager_grads(want, (a, b), g), _eager_grads(got, (a, b), g), strict=True):
        torch.testing.assert_close(gg, gw, rtol=0, atol=0)


@pytest.mark.parametrize("case, message", [
    (lambda x, w, o: F.grouped_mm(x.double(), w.double(), offs=o), "Float32, BFloat16 or Float16"),
    (lambda x, w, o: F.grouped_mm(x, w, offs=o.long()), "int32"),
    (lambda x, w, o: F.grouped_mm(x, w), "offsets"),
    (lambda x, w, o: F.grouped_mm(x, w[:, :4], offs=o), "contraction dimension"),
    (lambda x, w, o: F.grouped_mm(x, w, offs=o, bias=torch.zeros(3, 12)), "(?i)bias"),
])
def test_grouped_mm_refusals_are_clear(case, message):
    x, w, offs = torch.randn(10, 8), torch.randn(3, 8, 12), torch.tensor([4, 4, 10], dtype=torch.int32)
    with pytest.raises((RuntimeError, NotImplementedError, ValueError), match=message):
        case(x, w, offs)
    with pytest.raises((RuntimeError, NotImplementedError, ValueError), match=message):
        thunderlite.jit(case)(x, w, offs)


def test_grouped_mm_dynamic_token_count():
    fn = lambda x, w, o: F.grouped_mm(x, w, offs=o).relu()  # noqa: E731
    jfn = thunderlite.jit(fn, dynamic=True)
    w = torch.randn(3, 8, 4, requires_grad=True)
    for n in (12, 20):
        x = torch.randn(n, 8, requires_grad=True)
        offs = torch.tensor([n // 4, n // 2, n], dtype=torch.int32)
        got, want = jfn(x, w, offs), fn(x, w, offs)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        g = torch.randn(n, 4)
        for a, b in zip(_eager_grads(got, (x, w), g), _eager_grads(want, (x, w), g), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["2d3d", "3d2d"])
def test_grouped_mm_double_backward(layout):
    gen = torch.Generator().manual_seed(6)
    a, b, offs = _operands(layout, gen)
    fn = lambda x, y, o: F.grouped_mm(x, y, offs=o).pow(2).sum()  # noqa: E731
    results = []
    for f in (fn, thunderlite.jit(fn)):
        ga, gb = torch.autograd.grad(f(a, b, offs), (a, b), create_graph=True)
        results.append(torch.autograd.grad(ga.pow(2).sum() + gb.sin().sum(), (a, b)))
    for want, got in zip(*results, strict=True):
        torch.testing.assert_close(got, want)


def test_grouped_mm_between_inductor_regions():
    """With torch.compile first in the list, the grouped GEMM stays the torch
    executor's call between regions (Inductor's fake kernel takes bfloat16 only)."""
    pytest.importorskip("torch._inductor")
    fn = lambda x, w, o: F.grouped_mm((x * 2).sin(), w, offs=o).cos() * 3  # noqa: E731
    jfn = thunderlite.jit(fn, executors=["torchcompile", "torch"])
    x = torch.randn(12, 8, requires_grad=True)
    w = torch.randn(3, 8, 4, requires_grad=True)
    offs = torch.tensor([5, 5, 12], dtype=torch.int32)
    got, want = jfn(x, w, offs), fn(x, w, offs)
    torch.testing.assert_close(got, want)
    g = torch.randn(12, 4)
    for a, b in zip(_eager_grads(got, (x, w), g), _eager_grads(want, (x, w), g), strict=True):
        torch.testing.assert_close(a, b)
    assert "torchex.grouped_mm(" in str(thunderlite.last_traces(jfn)[-1])
    assert "torchex.grouped_mm_backward(" in str(thunderlite.last_backward_traces(jfn)[-1])


def test_grouped_mm_hot_tier():
    """The hot tier's rehearsal runs the program on fake tensors: grouped_mm
    gives its output's layout there itself (torch's fake kernel takes bfloat16
    only, and the hot tier failed on it)."""
    pytest.importorskip("torch._inductor")
    fn = lambda x, w, o: (F.grouped_mm((x * 2).sin(), w, offs=o).cos() * 3).sum()  # noqa: E731
    jfn = thunderlite.jit(fn, tiering=thunderlite.TierPolicy(after_calls=2, trial_calls=0))
    x = torch.randn(12, 8, requires_grad=True)
    w = torch.randn(3, 8, 4, requires_grad=True)
    offs = torch.tensor([5, 5, 12], dtype=torch.int32)
    want = torch.autograd.grad(fn(x, w, offs), (x, w))
    for _ in range(2):
        jfn(x, w, offs)
    assert thunderlite.wait_for_tiers(jfn)
    (tier,) = thunderlite.cache_info(jfn)["tiers"]
    assert tier["tier"] == "hot", tier
    for got, ref in zip(torch.autograd.grad(jfn(x, w, offs), (x, w)), want, strict=True):
        torch.testing.assert_close(got, ref)


# --- transformers' fallback custom op --------------------------------------------------------------------

moe = pytest.importorskip("transformers.integrations.moe")


def _fallback(x, w, o):
    return torch.ops.transformers.grouped_mm_fallback(x, w, offs=o) * 2


def test_fallback_custom_op_records_grouped_mm():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(12, 16, generator=gen, requires_grad=True)
    w = torch.randn(4, 16, 8, generator=gen, requires_grad=True)
    offs = torch.tensor([3, 3, 9, 12], dtype=torch.int32)
    jfn = thunderlite.jit(_fallback)
    got, want = jfn(x, w, offs), _fallback(x, w, offs)
    torch.testing.assert_close(got, want)
    g = torch.randn(12, 8, generator=gen)
    for a, b in zip(_eager_grads(got, (x, w), g), _eager_grads(want, (x, w), g), strict=True):
        torch.testing.assert_close(a, b)
    fwd = str(thunderlite.last_traces(jfn)[-1])
    assert "torchex.grouped_mm(" in fwd and "custom." not in fwd
    assert "torchex.grouped_mm_backward(" in str(thunderlite.last_backward_traces(jfn)[-1])


@pytest.mark.parametrize("dtype, n", [(torch.float64, 8), (torch.float32, 5)])
def test_fallback_custom_op_kept_where_the_kernel_refuses(dtype, n):
    """float64 (no kernel) and rows of 5 floats (not 16-byte multiples): the
    custom op runs, as the call would in eager where the kernel refuses."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(12, 16, generator=gen, dtype=dtype, requires_grad=True)
    w = torch.randn(4, 16, n, generator=gen, dtype=dtype, requires_grad=True)
    offs = torch.tensor([3, 3, 9, 12], dtype=torch.int32)
    jfn = thunderlite.jit(_fallback)
    got, want = jfn(x, w, offs), _fallback(x, w, offs)
    torch.testing.assert_close(got, want)
    g = torch.randn(12, n, generator=gen, dtype=dtype)
    for a, b in zip(_eager_grads(got, (x, w), g), _eager_grads(want, (x, w), g), strict=True):
        torch.testing.assert_close(a, b)
    fwd = str(thunderlite.last_traces(jfn)[-1])
    assert "grouped_mm_fallback" in fwd and "torchex.grouped_mm(" not in fwd


def test_mixtral_runs_the_grouped_kernel():
    """The HF Mixtral (grouped_mm experts) of the zoo: loss and every gradient
    equal eager's, and the trace calls ``grouped_mm``, never the fallback loop."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_models.py"
    spec = importlib.util.spec_from_file_location("bench_models_gmm", path)
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    torch.manual_seed(0)
    base, make_batch = zoo.MODELS["mixtral"](zoo.SIZES["tiny"])
    base.train()
    batch = make_batch(torch)
    ref, model = copy.deepcopy(base), copy.deepcopy(base)
    jm = thunderlite.jit(model)
    want = zoo._results(ref, zoo._step(ref, batch))
    got = zoo._results(model, zoo._step(jm, batch))
    assert zoo._check("mixtral", got, want, atol=1e-5, rtol=1e-5) == ""
    fwd, bwd = str(thunderlite.last_traces(jm)[-1]), str(thunderlite.last_backward_traces(jm)[-1])
    calls = [ln for ln in fwd.splitlines() if not ln.lstrip().startswith("#")]
    assert sum("torchex.grouped_mm(" in ln for ln in calls) == 2 * zoo.SIZES["tiny"]["layers"]
    assert not any("grouped_mm_fallback" in ln for ln in calls)
    assert bwd.count("torchex.grouped_mm_backward(") == 2 * zoo.SIZES["tiny"]["layers"]
