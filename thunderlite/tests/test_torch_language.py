"""The torch language against eager PyTorch: promotion, broadcasting, 0-dim,
empty and non-contiguous inputs, Python scalars, indexing, in-place variants
(functional op + copy_), the opaque fallback and registry validation."""
from __future__ import annotations

import itertools

import pytest
import torch

import thunderlite
import thunderlite.torch as ltorch
from thunderlite.core import dtypes
from thunderlite.core.aliasing import callable_aliases
from thunderlite.core.tags import Tag
from thunderlite.executors import compile_trace
from thunderlite.tests.opinfo_harness import flatten_to_prims, record


def run_both(fn, *args, **kwargs):
    """(trace, direct result, prim-level result) of ``fn`` on clones of args."""
    trc = record(fn, args, kwargs)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    direct = compile_trace(trc)[1](*[t.clone() for t in tensors])
    prim_level = compile_trace(flatten_to_prims(trc))[1](*[t.clone() for t in tensors])
    return trc, direct, prim_level


def assert_matches(fn, *args, **kwargs):
    expected = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
    trc, direct, prim_level = run_both(fn, *args, **kwargs)
    torch.testing.assert_close(direct, expected, equal_nan=True)
    torch.testing.assert_close(prim_level, expected, equal_nan=True)
    return trc


_VALUES = [torch.ones(2, 3, dtype=torch.int64), torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 3),
           torch.ones(2, 3, dtype=torch.float64), torch.ones((), dtype=torch.float64),
           torch.ones((), dtype=torch.int32), torch.ones(2, 3, dtype=torch.bfloat16),
           torch.ones(2, 3, dtype=torch.complex64), 2, 2.5, True, 1j]


@pytest.mark.parametrize("a,b", [(a, b) for a, b in itertools.product(_VALUES, _VALUES)
                                 if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)])
def test_result_type_matches_torch(a, b):
    assert dtypes.result_type(a, b) == torch.result_type(a, b)


_OPERANDS = [torch.arange(6, dtype=torch.int64).reshape(2, 3) - 2, torch.tensor([True, False, True]),
             torch.randn(2, 3), torch.randn(3, dtype=torch.float64), torch.tensor(1.5, dtype=torch.float64),
             torch.randn(3, 2).t(), torch.randn(2, 3, dtype=torch.complex64), 3, -2.5, True]


@pytest.mark.parametrize("op", [torch.add, torch.sub, torch.mul, torch.div, torch.eq, torch.lt, torch.maximum,
                                torch.where])
@pytest.mark.parametrize("a,b", [(a, b) for a, b in itertools.combinations(_OPERANDS, 2)
                                 if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)])
def test_binary_promotion_and_broadcasting(op, a, b):
    if not isinstance(a, torch.Tensor):
        a, b = b, a
    args = (a, b) if op is not torch.where else (torch.tensor([True, False, True]), a, b)
    try:
        expected = op(*args)
    except (RuntimeError, TypeError):
        with pytest.raises(Exception):  # noqa: B017  any error: ours need not have eager's type
            run_both(op, *args)
        return
    trc, direct, prim_level = run_both(op, *args)
    torch.testing.assert_close(direct, expected, equal_nan=True)
    torch.testing.assert_close(prim_level, expected, equal_nan=True)


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3), ()])
def test_empty_and_zero_dim(shape):
    x = torch.randn(shape)
    assert_matches(lambda a: (a * 2 + 1).sum(-1) if a.ndim else a * 2 + 1, x)
    assert_matches(lambda a: torch.softmax(a, -1) if a.ndim else a.exp(), x)


def test_non_contiguous_inputs():
    x = torch.randn(4, 6)[:, ::2]
    y = torch.randn(3, 4).t()
    assert_matches(lambda a, b: (a * b).cumsum(0) + a.transpose(0, 1).reshape(3, 4).t(), x, y)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.float64, None])
def test_scan_dtype_in_trace(dtype):
    """A scan's ``dtype=`` is the recorded proxy's dtype too (an int32 cumsum was
    traced as int64, so what read it, HF's grouped_mm offsets, saw the wrong dtype)."""
    x = torch.tensor([1.0, 2.0, 3.0])
    for fn in (lambda a: torch.cumsum(a, 0, dtype=dtype), lambda a: a.int().cumprod(0, dtype=dtype),
               lambda a: a.sum().cumsum(0, dtype=dtype)):
        jfn = thunderlite.jit(fn)
        got, want = jfn(x), fn(x)
        assert got.dtype == want.dtype and torch.equal(got, want)
        assert thunderlite.last_traces(jfn)[-1].output.dtype == want.dtype


@pytest.mark.parametrize("key", [
    0, -1, slice(1, None), (slice(None), 1), (Ellipsis, 0), (None, 0), (slice(None, None, 2), None, -1),
    (1, Ellipsis, None), (slice(5, 1),)])
def test_basic_getitem(key):
    x = torch.randn(4, 5, 3)
    trc = assert_matches(lambda a: a[key], x)
    assert all(Tag.OPAQUE not in b.sym.tags for b in flatten_to_prims(trc).bound_symbols)


@pytest.mark.parametrize("make_key", [
    lambda: torch.tensor([0, 2, -1]),
    lambda: (torch.tensor([[0, 1]]), torch.tensor([2, 0])),
    lambda: (slice(None), torch.tensor([1, 0])),
    lambda: (torch.tensor([1, 0]), slice(None), torch.tensor([2, 2])),
])
def test_advanced_getitem(make_key):
    x = torch.randn(4, 5, 3)
    key = make_key()
    tensors = [k for k in (key if isinstance(key, tuple) else (key,)) if isinstance(k, torch.Tensor)]

    def fn(a, *idx):
        it = iter(idx)
        k = tuple(next(it) if isinstance(k, torch.Tensor) else k for k in (key if isinstance(key, tuple) else (key,)))
        return a[k]
    expected = fn(x, *tensors)
    trc, direct, prim_level = run_both(fn, x, *tensors)
    torch.testing.assert_close(direct, expected)
    torch.testing.assert_close(prim_level, expected)


def _mutating(fn):
    """(returned value, the mutated input) for eager and for both trace runs."""
    def outer(a, *rest):
        out = fn(a, *rest)
        return out, a
    return outer


@pytest.mark.parametrize("fn", [
    lambda a, b: a.add_(b, alpha=2), lambda a, b: a.mul_(b), lambda a, b: a.clamp_(-0.5, 0.5),
    lambda a, b: a.fill_(3), lambda a, b: a.zero_(), lambda a, b: a.copy_(b), lambda a, b: a.sigmoid_(),
    lambda a, b: a.__setitem__((slice(None), 1), b[:, 0]), lambda a, b: a.__setitem__(0, 7.0),
    lambda a, b: a.__setitem__((slice(None, None, 2), slice(1, 3)), 5.0),
    lambda a, b: a.__setitem__((b[0, :2] * 0).long(), 2.0),
])
def test_inplace_is_functional_op_then_copy(fn):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    wrapped = _mutating(fn)
    ea = a.clone()
    expected = wrapped(ea, b.clone())
    trc = record(wrapped, (a, b), {})
    flat = flatten_to_prims(trc)
    assert any(x.sym.name == "copy_" for x in flat.bound_symbols), str(trc)
    for t in (trc, flat):
        got_a, got_b = a.clone(), b.clone()
        got = compile_trace(t)[1](got_a, got_b)
        torch.testing.assert_close(got_a, ea)
        if expected[0] is not None:
            torch.testing.assert_close(got[0], expected[0])


def test_inplace_symbols_are_tagged():
    add_ = ltorch.symbol_for(torch.Tensor.add_)
    assert Tag.INPLACE in add_.tags and add_.inplace_of is ltorch.symbol_for(torch.add)
    # views are not tagged by hand: their facts are their ATen schemas' (core/aliasing.py)
    assert callable_aliases(ltorch.symbol_for(torch.Tensor.view).torch_fn).positions == {0}
    assert callable_aliases(ltorch.symbol_for(torch.transpose).torch_fn).positions == {0}


def test_inplace_refuses_a_lossy_cast():
    a, b = torch.ones(3, dtype=torch.int64), torch.randn(3)
    with pytest.raises(RuntimeError, match="can't be cast"):
        record(lambda x, y: x.add_(y), (a, b), {})


def test_opaque_fallback_records_one_tagged_call():
    x = torch.randn(4, 5)
    fn = lambda a: torch.special.bessel_j0(a).cummax(1)  # noqa: E731
    trc = record(fn, (x,), {})
    opaque = [b for b in trc.bound_symbols if Tag.OPAQUE in b.sym.tags]
    assert {b.sym.module for b in opaque} == {"opaque"} and len(opaque) == 2
    values, indices = compile_trace(trc)[1](x)
    ev, ei = fn(x)
    torch.testing.assert_close(values, ev)
    assert torch.equal(indices, ei)


def test_opaque_mutation_is_recorded_functionally():
    x, idx = torch.randn(4, 5), torch.tensor([0, 2])
    fn = lambda a, i: a.index_fill_(1, i, -1.0)  # noqa: E731
    trc = record(fn, (x, idx), {})
    flat = flatten_to_prims(trc)
    names = [b.sym.name for b in flat.bound_symbols]
    assert "copy_" in names and any(Tag.INPLACE in b.sym.tags for b in trc.bound_symbols), names
    got_x = x.clone()
    compile_trace(trc)[1](got_x, idx)
    ex = x.clone()
    fn(ex, idx)
    torch.testing.assert_close(got_x, ex)


def test_opaque_data_dependent_op_raises_clearly():
    with pytest.raises(ltorch.OpaqueDataDependentError, match="depends on tensor data"):
        record(torch.geqrf, (torch.ones(3, 2),), {})    # nonzero, bincount & co. have sized leaves


@pytest.mark.parametrize("fn", [
    lambda a: torch.nn.functional.relu(a, inplace=True),
    lambda a: torch.nn.functional.relu(a, True),
    lambda a: torch.nn.functional.hardtanh(a, -0.5, 0.5, True),
    lambda a: torch.nn.functional.leaky_relu(a, 0.2, inplace=True),
    lambda a: torch.nn.functional.silu(a, inplace=True),
    lambda a: torch.nn.functional.hardswish(a, inplace=True),
    lambda a: torch.nn.functional.threshold(a, 0.1, 20.0, inplace=True),
    lambda a: torch.nn.functional.dropout(a, 0.3, training=False, inplace=True),
])
def test_inplace_flag_records_the_inplace_symbol(fn):
    """``F.relu(x, inplace=True)``: a top-level in-place symbol (INPLACE tag,
    functional op + copy_, no opaque call), and the input is written."""
    x = torch.randn(5)
    trc = record(fn, (x,), {})
    top = [b for b in trc.bound_symbols if b.sym.name != "return"]
    assert len(top) == 1 and Tag.INPLACE in top[0].sym.tags and top[0].sym.inplace_of is not None
    flat = flatten_to_prims(trc).bound_symbols
    assert flat[-2].sym.name == "copy_" and not any(Tag.OPAQUE in b.sym.tags for b in flat)
    got, want = x.clone(), x.clone()
    compile_trace(trc)[1](got)
    fn(want)
    torch.testing.assert_close(got, want)


def test_inplace_flag_false_is_functional():
    trc = record(lambda a: torch.nn.functional.relu(a, inplace=False), (torch.randn(3),), {})
    assert [b.sym.name for b in trc.bound_symbols] == ["relu", "return"]


def test_reflected_operators():
    x = torch.randn(2, 3).abs() + 0.5
    i = torch.arange(6).reshape(2, 3) + 1
    assert_matches(lambda a: (2 - a, 3 * a, 1 / a, 2 ** a, 7 // a, 5 % a, 1.5 + a), x)
    assert_matches(lambda a: (True & (a > 2), 6 | a, 3 ^ a, 1 << a, 64 >> a), i)
    assert_matches(lambda a: [[1.0, 2.0], [3.0, 4.0]] and torch.ones(3, 2).__rmatmul__(a), x)


def test_structseq_results_keep_their_names():
    """``x.max(0).values``, ``torch.linalg.qr(x).Q``: decompositions and the
    opaque fallback give torch.return_types results, also after a round trip."""
    x = torch.randn(4, 4)
    fn = lambda a: (a.max(0).values, a.sort(1).indices, torch.linalg.qr(a).Q, a.cummax(0).values)  # noqa: E731
    trc = assert_matches(fn, x)
    out = compile_trace(record(lambda a: a.max(1), (x,), {}))[1](x)
    assert type(out) is torch.return_types.max
    assert len(trc.bound_symbols) == 5


def test_symbol_for_non_torch_callables_is_none():
    assert ltorch.symbol_for(print) is None
    assert ltorch.symbol_for(lambda: 0) is None
    assert ltorch.symbol_for(torch.add) is not None
    assert ltorch.symbol_for(torch.nn.functional.scaled_dot_product_attention) is not None


def test_registration_refuses_duplicates():
    with pytest.raises(ValueError, match="already mapped"):
        ltorch.torchsymbol(torch.add, name="another_add")(lambda a, b: a)
    with pytest.raises(ValueError, match="defined twice"):
        ltorch.torchsymbol(name="add")(lambda a, b: a)


def test_model_like_block_is_native():
    """A transformer-ish block: every op decomposes to prims."""
    x, w, b = torch.randn(2, 4, 8), torch.randn(8, 8), torch.randn(8)
    ln_w, ln_b = torch.randn(8), torch.randn(8)
    F = torch.nn.functional

    def block(x, w, b, ln_w, ln_b):
        h = F.layer_norm(x, (8,), ln_w, ln_b)
        q = F.linear(h, w, b).view(2, 4, 2, 4).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        y = att.transpose(1, 2).reshape(2, 4, 8)
        return F.gelu(y) + F.silu(x) + F.rms_norm(x, (8,))
    trc = assert_matches(block, x, w, b, ln_w, ln_b)
    assert all(b.sym.is_prim for b in flatten_to_prims(trc).bound_symbols[:-1])


def test_losses_and_conv_native():
    F = torch.nn.functional
    logits, target = torch.randn(6, 5), torch.tensor([0, 4, 2, 1, -100, 3])
    assert_matches(lambda a, t: F.cross_entropy(a, t, label_smoothing=0.1), logits, target)
    assert_matches(lambda a, t: F.nll_loss(F.log_softmax(a, 1), t), logits, target)
    img, k = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    assert_matches(lambda a, w: F.conv2d(a, w, padding="same").relu().mean((2, 3)), img, k)
    assert_matches(lambda i, a: F.embedding(i, a), torch.tensor([[1, 2], [0, 4]]), torch.randn(5, 3))


def assert_native(fn, *args, exact: bool = False):
    """``fn`` records no opaque call, and its prim-level program matches eager."""
    trc, direct, prim_level = run_both(fn, *args)
    expected = fn(*[a.clone() for a in args])
    assert not [b for b in flatten_to_prims(trc).bound_symbols if Tag.OPAQUE in b.sym.tags]
    for got in (direct, prim_level):
        if exact:
            assert torch.equal(got, expected)
        else:
            torch.testing.assert_close(got, expected, equal_nan=True)


_POOL_ARGS = [(k, s, p, d, c)
              for k, s, p, d, c in itertools.product([1, 2, 3], [None, 2], [0, 1], [1, 2], [False, True])
              if 2 * p <= k]


@pytest.mark.parametrize("k,s,p,d,ceil", _POOL_ARGS)
def test_pooling_is_native(k, s, p, d, ceil):
    F = torch.nn.functional
    x2, x1 = torch.randn(2, 3, 9, 10), torch.randn(2, 3, 11)
    assert_native(lambda a: F.max_pool2d(a, k, s, p, d, ceil), x2)
    assert_native(lambda a: F.max_pool1d(a, k, s, p, d, ceil), x1)
    for include_pad in (True, False):
        assert_native(lambda a: F.avg_pool2d(a, k, s, p, ceil, include_pad), x2)
        assert_native(lambda a: F.avg_pool1d(a, k, s, p, ceil, include_pad), x1)


def test_pooling_variants():
    F = torch.nn.functional
    x2, x3 = torch.randn(2, 3, 9, 10), torch.randn(1, 2, 5, 6, 7)
    assert_native(lambda a: F.avg_pool2d(a, 3, 2, 1, True, True, 5), x2)
    assert_native(lambda a: F.max_pool3d(a, 2, 1, 1), x3)
    assert_native(lambda a: F.avg_pool3d(a, 3, 2, 1, True, False), x3)
    assert_native(lambda a: F.max_pool2d(a, (2, 3), (1, 2), (1, 0)), x2)
    assert_native(lambda a: F.max_pool2d(a, 3, 2), x2[0])
    assert_native(lambda a: F.max_pool2d(a, 3, 2, 1), (x2 * 10).to(torch.int64), exact=True)
    assert_native(lambda a: F.avg_pool2d(a, 3, 2, 1), x2.to(torch.bfloat16))
    for size in [1, 3, 5, 7, (3, None), (None, 4)]:
        assert_native(lambda a: F.adaptive_avg_pool2d(a, size), x2)
    assert_native(lambda a: F.adaptive_avg_pool1d(a, 4), torch.randn(2, 3, 11))
    for size in [1, 3, (3, None)]:
        assert_native(lambda a: F.adaptive_max_pool2d(a, size), x2)
    assert_native(lambda a: (F.adaptive_max_pool1d(a, 4), F.adaptive_avg_pool1d(a, 3)), torch.randn(2, 3, 11))
    assert_native(lambda a: F.adaptive_avg_pool2d(a, 3), x2.to(torch.bfloat16))
    trc = record(lambda a: F.max_pool2d(a, 2, return_indices=True), (x2,), {})
    assert [b.sym.name for b in flatten_to_prims(trc).bound_symbols if Tag.OPAQUE in b.sym.tags]


@pytest.mark.parametrize("nsp", [1, 2, 3])
@pytest.mark.parametrize("kw", [dict(size=4), dict(size=13), dict(scale_factor=2), dict(scale_factor=1.7),
                                dict(scale_factor=0.6), dict(scale_factor=1.7, recompute_scale_factor=True)],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_interpolate_is_native(nsp, kw):
    """Nearest modes pick exactly eager's source indices; linear modes match."""
    F = torch.nn.functional
    x = torch.randn(*(2, 3, 7, 5, 6)[:nsp + 2])
    for mode in ("nearest", "nearest-exact"):
        assert_native(lambda a: F.interpolate(a, mode=mode, **kw), x, exact=True)
    linear = {1: "linear", 2: "bilinear", 3: "trilinear"}[nsp]
    for align_corners in (None, False, True):
        assert_native(lambda a: F.interpolate(a, mode=linear, align_corners=align_corners, **kw), x)


def test_interpolate_dtypes_and_fallback():
    F = torch.nn.functional
    x = torch.randn(2, 3, 5, 6)
    assert_native(lambda a: F.interpolate(a, size=(3, 9), mode="bilinear"), x)
    assert_native(lambda a: F.interpolate(a, scale_factor=2, mode="bilinear"), x.to(torch.bfloat16))
    assert_native(lambda a: F.interpolate(a, scale_factor=2, mode="bilinear"), x.double())
    assert_native(lambda a: F.upsample_nearest(a, scale_factor=2), x, exact=True)
    trc = record(lambda a: F.interpolate(a, scale_factor=2, mode="bicubic"), (x,), {})
    assert [b.sym.name for b in flatten_to_prims(trc).bound_symbols if Tag.OPAQUE in b.sym.tags] == ["interpolate"]


def test_composites_are_native():
    F = torch.nn.functional
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    assert_native(lambda a: (torch.Tensor.__rsub__(a, 2), torch.Tensor.__rpow__(a, 2)), x)
    assert_native(lambda a: (torch.permute_copy(a, (1, 0)), torch.unbind_copy(a), torch.alias_copy(a),
                             torch.split_with_sizes(a, [1, 3]), torch.unsafe_chunk(a, 3, 1)), x)
    assert_native(lambda a: (torch.atleast_3d(a), torch.atleast_2d(a[0]), torch.hsplit(a, 2), torch.vsplit(a, [1])),
                  x)
    assert_native(lambda a, b: (torch.diff(a, 2, 0), torch.diff(a, dim=1, prepend=b[:, :2]), torch.trace(a),
                                torch.kron(a, b[:2, :3])), x, y)
    assert_native(lambda a, b: (torch.linalg.cross(a[:, :3], b[:, :3]), torch.dist(a, b), F.pairwise_distance(a, b),
                                F.cosine_similarity(a, b), torch.logcumsumexp(a, 1), torch.msort(a)), x, y)
    z = torch.randn(2, 8, 3, 4)
    assert_native(lambda a: (F.pixel_shuffle(a, 2), F.pixel_unshuffle(a, 1), F.channel_shuffle(a, 4)), z)
    assert_native(lambda a: (a.repeat_interleave(2), a.repeat_interleave(3, 1), torch.diag(a, 1), torch.diag(a[0], -2),
                             torch.linalg.norm(a), torch.linalg.norm(a, 3, 1), torch.fill(a, a[0, 0])), x)


def test_more_composites_are_native():
    F = torch.nn.functional
    x, y, v, w = torch.randn(4, 6), torch.randn(4, 6), torch.randn(5), torch.randn(3)
    t = torch.randint(0, 2, (4, 6)) * 2 - 1.0
    assert_native(lambda a, b: torch.meshgrid(a, b, indexing="xy"), v, w)
    assert_native(lambda a, b: (torch.tensordot(a, b.t(), 1), torch.cdist(a, b[:3]), torch.vdot(a[0], b[0]),
                                torch.linalg.multi_dot([a, b.t(), a]), torch.trapezoid(a, b)), x, y)
    assert_native(lambda a, s: (torch.bucketize(a, s), torch.searchsorted(s, a, side="right")),
                  x, torch.tensor([-1.0, 0.0, 0.5, 2.0]))
    assert_native(lambda a, i, j: (torch.take(a, i), a.index_fill(1, j, 2.5), torch.isin(i, j)),
                  x, torch.tensor([[0, 5], [-1, 23]]), torch.tensor([0, 2, -1]))
    assert_native(lambda a, b: (torch.select_scatter(a, b[0], 0, 2), torch.slice_scatter(a, b[:, :2], 1, 2, 4),
                                torch.diagflat(a[0]), torch.linalg.vander(a[0]), a.unfold(1, 2, 1),
                                torch.linalg.matrix_norm(a, 1), torch.linalg.matrix_power(a[:, :4], 2)), x, y)
    assert_native(lambda a: (F.unfold(a, (2, 3), dilation=(1, 2), padding=1, stride=2), torch.logspace(0, 2, 5)),
                  torch.randn(2, 3, 7, 8))
    for reduction in ("mean", "sum", "none"):
        assert_native(lambda a, b, c: (F.margin_ranking_loss(a, b, c, 0.3, reduction=reduction),
                                       F.soft_margin_loss(a, c, reduction=reduction),
                                       F.hinge_embedding_loss(a, c, 0.7, reduction=reduction),
                                       F.poisson_nll_loss(a, b.abs(), False, True, reduction=reduction),
                                       F.cosine_embedding_loss(a, b, c[:, 0], 0.2, reduction=reduction)), x, y, t)
    assert_native(lambda a, b, c: F.bilinear(a, b, c), x, torch.randn(4, 5), torch.randn(3, 6, 5))


def test_jit_pooling_block_with_inplace_relu():
    """A conv block as models write it, through the jit: every op native, the
    in-place ReLU a top-level INPLACE symbol."""
    import thunderlite
    F = torch.nn.functional
    w = torch.randn(4, 3, 3, 3)

    def block(a, weight):
        h = F.conv2d(a, weight, padding=1)
        F.relu(h, inplace=True)
        h = F.max_pool2d(h, 2)
        return F.interpolate(h, scale_factor=2, mode="nearest") + F.adaptive_avg_pool2d(h, 1)
    jfn = thunderlite.jit(block)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(jfn(x, w), block(x, w))
    first = thunderlite.last_traces(jfn)[0]
    assert not [b for b in flatten_to_prims(first).bound_symbols if Tag.OPAQUE in b.sym.tags]
    assert any(Tag.INPLACE in b.sym.tags and b.sym.name == "relu_" for b in first.bound_symbols)


@pytest.mark.parametrize("call", ["x.flip(0)", "x.flip(0, 1)", "x.flip((1,))", "x.flip([0, 1])", "torch.flip(x, (0,))",
                                  "torch.flip(x, [1])", "x.fliplr()", "x.flipud()"])
def test_flip_spellings_match_eager(call):
    fn = eval(f"lambda x: {call}", {"torch": torch})
    x = torch.randn(3, 4)
    assert torch.equal(thunderlite.jit(fn)(x), fn(x))


@pytest.mark.parametrize("call", ["x.mT", "x.movedim(0, -1)", "torch.movedim(x, [0], [-1])", "x.moveaxis(-1, 0)"])
def test_zero_dim_mT_and_movedim_are_the_identity_as_in_eager(call):
    import warnings
    fn = eval(f"lambda x: {call} * 2", {"torch": torch})
    x = torch.tensor(3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # eager deprecates mT on 0-d tensors
        assert torch.equal(thunderlite.jit(fn)(x), fn(x))


@pytest.mark.parametrize("call", [lambda x: x.sub(1, alpha=2), lambda x: x.add(3, alpha=0.5),
                                  lambda x: torch.add(x, 2, alpha=3), lambda x: torch.rsub(x, 1, alpha=2)],
                         ids=["sub", "add", "torch.add", "rsub"])
def test_alpha_scales_a_python_number_other(call):
    x = torch.randn(3)
    torch.testing.assert_close(thunderlite.jit(call)(x), call(x))
