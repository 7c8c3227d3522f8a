"""The torch language against eager PyTorch: promotion, broadcasting, 0-dim,
empty and non-contiguous inputs, Python scalars, indexing, in-place variants
(functional op + copy_), the opaque fallback and registry validation."""
from __future__ import annotations

import itertools

import pytest
import torch

import thunderlite.torch as ltorch
from thunderlite.core import dtypes
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
           torch.ones(2, 3, dtype=torch.float64), torch.ones((), dtype=torch.float64), torch.ones((), dtype=torch.int32),
           torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(2, 3, dtype=torch.complex64), 2, 2.5, True, 1j]


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
        with pytest.raises(Exception):
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
    assert Tag.VIEW in ltorch.symbol_for(torch.Tensor.view).tags
    assert Tag.VIEW in ltorch.symbol_for(torch.transpose).tags


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
        record(torch.nonzero, (torch.randn(3),), {})


def test_relu_inplace_true_goes_through_copy():
    x = torch.randn(5)
    trc = record(lambda a: torch.nn.functional.relu(a, inplace=True), (x,), {})
    assert any(b.sym.name == "copy_" for b in flatten_to_prims(trc).bound_symbols)
    got = x.clone()
    compile_trace(trc)[1](got)
    torch.testing.assert_close(got, torch.relu(x))


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
