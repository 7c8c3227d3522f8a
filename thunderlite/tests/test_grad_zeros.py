"""prod/cumprod gradients with zeros (issue 6): exact where ``out / x`` is not.

Inputs hold 0, 1 or 2 zeros at the start, middle and end of the reduced
dims; gradients are compared with eager ``torch.autograd.grad`` in float64,
at trace level (the prims' rules) and through ``thunderlite.jit``."""
from __future__ import annotations

import math

import pytest
import torch

import thunderlite
from thunderlite.core import prims
from thunderlite.tests.test_grad_prims import check_grad

F64 = torch.float64

# (shape, positions of zeros): none, one, two in one row, two in different rows, all
_ZERO_CASES = [
    ((3, 4), ()),
    ((3, 4), ((1, 0),)),
    ((3, 4), ((1, 3),)),
    ((3, 4), ((0, 2), (2, 1))),
    ((3, 4), ((1, 1), (1, 2))),
    ((3, 4), ((0, 0), (1, 0), (2, 3), (2, 0))),
    ((2, 3, 4), ((0, 1, 2),)),
    ((2, 3, 4), ((0, 1, 2), (0, 2, 2))),
    ((2, 3, 4), ((1, 0, 0), (1, 0, 3), (0, 2, 1))),
]


def _with_zeros(shape, zeros, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=F64) * 1.5 + 0.25
    x = x * torch.where(torch.rand(shape, generator=g) < 0.3, -1.0, 1.0).to(F64)
    for idx in zeros:
        x[idx] = 0.0
    return x.requires_grad_()


def _case_id(case):
    shape, zeros = case
    return f"{'x'.join(map(str, shape))}-{len(zeros)}zeros"


def _dims_for(ndim):
    return [(0,), (ndim - 1,), (0, ndim - 1), tuple(range(ndim))] + ([(1,)] if ndim > 2 else [])


@pytest.mark.parametrize("case", _ZERO_CASES, ids=_case_id)
def test_prod_prim_grad_with_zeros(case):
    x = _with_zeros(*case)
    for dims in _dims_for(x.ndim):
        check_grad(lambda a, d=dims: prims.prod(a, d), x,
                   ref_fn=lambda a, d=dims: _eager_prod(a, d))


def _eager_prod(a, dims):
    for d in sorted(dims, reverse=True):
        a = a.prod(d)
    return a


@pytest.mark.parametrize("case", _ZERO_CASES, ids=_case_id)
def test_cumprod_prim_grad_with_zeros(case):
    x = _with_zeros(*case)
    for dim in range(-1, x.ndim):
        check_grad(lambda a, d=dim: prims.cumprod(a, d), x, ref_fn=lambda a, d=dim: torch.cumprod(a, d))


def test_prod_and_cumprod_rows_of_zeros_and_single_elements():
    for x in (torch.zeros(2, 3, dtype=F64), torch.tensor([[0.0], [2.0]], dtype=F64),
              torch.tensor([0.0, 0.0, 3.0, 0.0], dtype=F64), torch.tensor(0.0, dtype=F64)):
        x = x.requires_grad_()
        dims = tuple(range(x.ndim))
        check_grad(lambda a, d=dims: prims.prod(a, d), x, ref_fn=lambda a, d=dims: _eager_prod(a, d))
        if x.ndim:
            check_grad(lambda a: prims.cumprod(a, -1), x, ref_fn=lambda a: torch.cumprod(a, -1))


def _jit_grad_matches(fn, x):
    ours = x.detach().clone().requires_grad_()
    ref = x.detach().clone().requires_grad_()
    out_ours, out_ref = thunderlite.jit(fn)(ours), fn(ref)
    torch.testing.assert_close(out_ours, out_ref)
    g = torch.randn(out_ref.shape, dtype=F64, generator=torch.Generator().manual_seed(7))
    (want,) = torch.autograd.grad(out_ref, ref, g)
    (have,) = torch.autograd.grad(out_ours, ours, g)
    torch.testing.assert_close(have, want, equal_nan=True)


_JIT_FNS = {
    "prod_all": lambda x: torch.prod(x),
    "prod_dim0": lambda x: torch.prod(x, 0),
    "prod_last_keepdim": lambda x: x.prod(-1, keepdim=True),
    "prod_dim1_keepdim": lambda x: torch.prod(x, 1, keepdim=True),
    "cumprod_dim0": lambda x: torch.cumprod(x, 0),
    "cumprod_last": lambda x: x.cumprod(-1),
    "cumprod_then_prod": lambda x: torch.cumprod(x, 1).prod(0) * 2,
}


@pytest.mark.parametrize("name", list(_JIT_FNS))
@pytest.mark.parametrize("case", _ZERO_CASES, ids=_case_id)
def test_jit_prod_cumprod_grad_with_zeros(name, case):
    _jit_grad_matches(_JIT_FNS[name], _with_zeros(*case))


def _t(*values):
    return torch.tensor(values, dtype=F64)


_TIES_2D = torch.tensor([[[[1.0, 2.0, 2.0, 0.0], [2.0, 1.0, 0.0, 0.0], [0.0, 0.0, 3.0, 3.0],
                            [0.0, 0.0, 3.0, 3.0]]]], dtype=F64)
_RAMP = torch.arange(1.0, 17.0, dtype=F64).reshape(1, 1, 4, 4)

# Special values where differentiating a decomposition gives nan or the wrong
# share of a tie while eager's own backward formula gives a number.
_SPECIAL = {
    "vector_norm_at_0": (lambda x: torch.linalg.vector_norm(x), torch.zeros(3, dtype=F64)),
    "norm_dim_row_of_0": (lambda x: torch.norm(x, dim=1, keepdim=True),
                          torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=F64)),
    "vector_norm_p3_at_0": (lambda x: torch.linalg.vector_norm(x, 3, dim=0), torch.zeros(3, 2, dtype=F64)),
    "vector_norm_p1.5": (lambda x: torch.linalg.vector_norm(x, 1.5), _t(0.0, -1.0, 2.0)),
    "vector_norm_p0.5": (lambda x: torch.linalg.vector_norm(x, 0.5), _t(0.0, -1.0, 2.0)),
    "fro_at_0": (lambda x: torch.linalg.matrix_norm(x), torch.zeros(2, 2, dtype=F64)),
    "normalize_at_0": (lambda x: torch.nn.functional.normalize(x, dim=-1), torch.zeros(2, 3, dtype=F64)),
    "dist_at_0": (lambda x: torch.dist(x, torch.ones(3, dtype=F64)), torch.ones(3, dtype=F64)),
    "cdist_self": (lambda x: torch.cdist(x, x), torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=F64)),
    "cosine_similarity_at_0": (lambda x: torch.nn.functional.cosine_similarity(x, torch.ones(2, 3, dtype=F64)),
                               torch.zeros(2, 3, dtype=F64)),
    "std_of_constant": (lambda x: x.std(), torch.ones(4, dtype=F64)),
    "std_dim_keepdim": (lambda x: x.std(0, keepdim=True), torch.tensor([[1.0, 2.0], [1.0, 5.0]], dtype=F64)),
    "std_mean_of_constant": (lambda x: torch.std_mean(x, 1)[0], torch.ones(2, 3, dtype=F64)),
    "max_dim_ties": (lambda x: x.max(0).values, _t(2.0, 2.0, 1.0)),
    "min_dim_ties_keepdim": (lambda x: x.min(1, keepdim=True)[0], torch.tensor([[1.0, 1.0], [0.0, 3.0]], dtype=F64)),
    "hardtanh_edges": (lambda x: torch.nn.functional.hardtanh(x), _t(-1.0, 1.0, 0.5)),
    "relu6_edges": (lambda x: torch.nn.functional.relu6(x), _t(0.0, 6.0, 3.0)),
    "atan2_at_origin": (lambda x: torch.atan2(x, x), _t(0.0, 1.0)),
    "bce_saturated": (lambda x: torch.nn.functional.binary_cross_entropy(x, _t(1.0, 0.0, 1.0)), _t(1.0, 0.0, 0.5)),
    "bce_weighted_sum": (lambda x: torch.nn.functional.binary_cross_entropy(x, _t(1.0, 0.0), _t(2.0, 3.0),
                                                                             reduction="sum"), _t(0.0, 1.0)),
    "logcumsumexp_leading_-inf": (lambda x: torch.logcumsumexp(x, 1) * _RAMP[0, 0, :2, :3],
                                  torch.tensor([[-math.inf, 0.0, 1.0], [2.0, -math.inf, -1.0]], dtype=F64)),
    "softplus_saturated": (lambda x: torch.nn.functional.softplus(x), _t(-1000.0, 1000.0, 0.0)),
    "logsigmoid_saturated": (lambda x: torch.nn.functional.logsigmoid(x), _t(-1000.0, 1000.0, 0.0)),
    "entr_at_0": (lambda x: torch.special.entr(x), _t(0.0, 1.0, 0.5)),
    "hardsigmoid_edges": (lambda x: torch.nn.functional.hardsigmoid(x), _t(-3.0, 3.0, 0.0)),
    "hardswish_edges": (lambda x: torch.nn.functional.hardswish(x), _t(-3.0, 3.0, 0.0)),
    "max_pool1d_ties": (lambda x: torch.nn.functional.max_pool1d(x, 2), torch.ones(1, 1, 4, dtype=F64)),
    "max_pool2d_relu_zeros": (lambda x: torch.nn.functional.max_pool2d(torch.relu(x - 5), 3, 1, 1) * _RAMP,
                              _TIES_2D),
    "adaptive_max_pool1d_ties": (lambda x: torch.nn.functional.adaptive_max_pool1d(x, 2) * _t(1.0, 2.0),
                                 torch.ones(1, 1, 4, dtype=F64)),
    "adaptive_max_pool2d_ties": (lambda x: torch.nn.functional.adaptive_max_pool2d(x, 2) * _RAMP[..., :2, :2],
                                 _TIES_2D),
}


@pytest.mark.parametrize("name", list(_SPECIAL))
def test_jit_grad_at_special_values(name):
    fn, x = _SPECIAL[name]
    _jit_grad_matches(fn, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("beta,threshold", [(1.0, 20.0), (2.0, 20.0), (1.0, 100.0)])
def test_softplus_low_precision_gradient_saturates_like_eager(dtype, beta, threshold):
    """Above the threshold the gradient is 1 (not the nan of the decomposition's
    overflowing exp), computed in float32 and rounded once."""
    import torch.nn.functional as F
    x = torch.tensor([1.0, 11.0, 12.0, 20.0, 50.0, 1000.0, -20.0, 0.3], dtype=dtype, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    thunderlite.jit(lambda t: F.softplus(t * 3, beta, threshold).sum())(x).backward()
    F.softplus(xe * 3, beta, threshold).sum().backward()
    assert torch.equal(x.grad, xe.grad)
