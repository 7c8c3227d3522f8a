"""Every prim's VJP rule against PyTorch autograd on the same program.

Ground truth: the prim trace claimed by the torch executor and run with
autograd on (each prim is then an eager torch call PyTorch differentiates);
the candidate: the same trace through ``make_differentiable``."""
from __future__ import annotations

import pytest
import torch

from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy, proxy_of_tensor
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.core.verify import verify_trace
from thunderlite.executors.autograd_function import make_differentiable
from thunderlite.executors.run import compile_trace
from thunderlite.transforms.autodiff import rules

F64 = torch.float64


def _finalize(trace: Trace) -> Trace:
    return compile_trace(trace)[0]


def _make(shape=(3, 4), low=-2.0, high=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=F64) * (high - low) + low).requires_grad_()


def _int_index(shape, high, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g)


def trace_of(fn, args, kwargs=None):
    """Record ``fn`` on proxies standing for the tensors among ``args``."""
    trc = Trace()
    with tracectx(trc):
        proxies = [proxy_of_tensor(a, name=f"a{i}") if isinstance(a, torch.Tensor) else a
                   for i, a in enumerate(args)]
        trc.args = [p for p in proxies if isinstance(p, TensorProxy)]
        trc.set_return(fn(*proxies, **(kwargs or {})))
    return trc


def check_grad(fn, *args, kwargs=None, ref_fn=None):
    """Trace ``fn`` (prims or torch-language symbols), differentiate it with
    ``make_differentiable`` and compare outputs, ``requires_grad`` and input
    gradients with eager autograd (``ref_fn``, default: the trace run as eager
    torch calls). Returns the differentiable program for trace checks."""
    trc = trace_of(fn, args, kwargs)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    mask = [t.requires_grad for t in tensors]
    program = make_differentiable(trc, mask, _finalize)
    for t in program.forward_traces + program.backward_traces:
        verify_trace(t)
    leaves_ref = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    if ref_fn is None:
        ref = _finalize(trc).python_callable()(*leaves_ref)
    else:
        it = iter(leaves_ref)
        ref = ref_fn(*[next(it) if isinstance(a, torch.Tensor) else a for a in args], **(kwargs or {}))
    got = program(*tensors)
    refs = ref if isinstance(ref, tuple) else (ref,)
    gots = got if isinstance(got, tuple) else (got,)
    diff = [(r, g) for r, g in zip(refs, gots, strict=True) if isinstance(r, torch.Tensor) and r.requires_grad]
    for r, g in zip(refs, gots, strict=True):
        torch.testing.assert_close(g.detach(), r.detach(), equal_nan=True)
        assert g.requires_grad == r.requires_grad
    assert diff, "the sample must produce a differentiable output"
    gouts = [torch.randn(r.shape, dtype=r.dtype, generator=torch.Generator().manual_seed(3)) for r, _ in diff]
    want = torch.autograd.grad([r for r, _ in diff], [t for t in leaves_ref if t.requires_grad], gouts,
                               allow_unused=True)
    have = torch.autograd.grad([g for _, g in diff], [t for t in tensors if t.requires_grad], gouts,
                               allow_unused=True)
    for w, h in zip(want, have, strict=True):
        if w is None:
            assert h is None or not h.any()
        else:
            torch.testing.assert_close(h, w, equal_nan=True)
    return program


_UNARY_DOMAIN = {"log": (0.1, 3), "log1p": (-0.5, 3), "log2": (0.1, 3), "log10": (0.1, 3),
                 "sqrt": (0.1, 3), "rsqrt": (0.1, 3), "asin": (-0.9, 0.9), "acos": (-0.9, 0.9),
                 "atanh": (-0.9, 0.9), "acosh": (1.1, 3), "erfinv": (-0.9, 0.9), "lgamma": (0.1, 3),
                 "digamma": (0.1, 3), "reciprocal": (0.5, 2)}
_DIFF_UNARY = [n for n in prims.UNARY if rules.vjp_rule(getattr(prims, n)) is not None
               and n not in ("real", "imag", "conj")]


@pytest.mark.parametrize("name", _DIFF_UNARY)
def test_unary(name):
    low, high = _UNARY_DOMAIN.get(name, (-2, 2))
    check_grad(getattr(prims, name), _make(low=low, high=high))


_BINARY_DOMAIN = {"pow": ((0.5, 2), (-2, 2)), "zeta": ((1.5, 3), (0.5, 2)), "polygamma": None,
                  "remainder": ((-3, 3), (0.5, 2)), "fmod": ((-3, 3), (0.5, 2)),
                  "floor_divide": ((-3, 3), (0.5, 2)), "div": ((-2, 2), (0.5, 2))}
_TENSOR_ONLY = {"atan2", "maximum", "minimum", "hypot", "nextafter"}   # torch takes no Python number there
_DIFF_BINARY = [n for n in prims.BINARY if rules.vjp_rule(getattr(prims, n)) is not None
                and n not in ("polygamma", "zeta")]


@pytest.mark.parametrize("name", [n for n in _DIFF_BINARY if n != "floor_divide"])
def test_binary(name):
    (la, ha), (lb, hb) = _BINARY_DOMAIN.get(name) or ((-2, 2), (-2, 2))
    sym = getattr(prims, name)
    check_grad(sym, _make(low=la, high=ha, seed=0), _make(low=lb, high=hb, seed=1))
    if name not in _TENSOR_ONLY:
        check_grad(lambda a: sym(a, 1.5), _make(low=la, high=ha, seed=2))


def test_binary_special():
    check_grad(lambda a: prims.polygamma(1, a), _make(low=0.5, high=2))
    check_grad(lambda b: prims.zeta(2.0, b), _make(low=0.5, high=2))
    a = _make(seed=4)
    check_grad(lambda x, y: prims.maximum(x, y), a, a.detach().clone().requires_grad_())
    check_grad(lambda x: prims.pow(x, 0.0), _make())


def test_where_lerp_convert():
    c = torch.rand(3, 4) > 0.5
    check_grad(prims.where, c, _make(), _make(seed=1))
    check_grad(lambda p, a: prims.where(p, a, 0.0), c, _make())
    check_grad(prims.lerp, _make(), _make(seed=1), _make(seed=2))
    check_grad(lambda a: prims.convert_element_type(a, torch.float32), _make())
    check_grad(lambda a: prims.clone(a), _make())


def test_shapes():
    check_grad(lambda a: prims.broadcast_in_dim(a, (2, 3, 4), (1, 2)), _make())
    check_grad(lambda a: prims.broadcast_in_dim(a, (3, 4, 5), (0, 1)), _make((3, 1)))
    check_grad(lambda a: prims.reshape(a, (12,)), _make())
    check_grad(lambda a: prims.permute(a, (2, 0, 1)), _make((2, 3, 4)))
    check_grad(lambda a: prims.slice_prim(a, (1, 0), (3, 4), (1, 2)), _make())
    check_grad(lambda a: prims.slice_prim(a, (0, 1), (3, 4), (2, 3)), _make((3, 5)))
    check_grad(lambda a: prims.squeeze(a, (1,)), _make((3, 1, 4)))
    check_grad(lambda a: prims.flip(a, (0,)), _make())
    check_grad(lambda a, b: prims.cat((a, b), 1), _make(), _make((3, 2), seed=1))
    check_grad(lambda a: prims.pad(a, 0.5, ((1, 2, 1), (-1, 0, 0))), _make())


def test_reductions():
    for sym in (prims.sum, prims.prod, prims.amax, prims.amin):
        check_grad(lambda a: sym(a, (1,)), _make())
        check_grad(lambda a: sym(a, (0, 1)), _make(seed=5))
    check_grad(lambda a: prims.var(a, (1,), correction=1), _make())
    check_grad(lambda a: prims.var_mean(a, (0,), correction=0), _make())
    check_grad(lambda a: prims.var_mean(a, (0,), correction=1)[1], _make())
    check_grad(lambda a: prims.cumsum(a, 1), _make())
    check_grad(lambda a: prims.cumprod(a, 0), _make(low=0.5, high=2))
    check_grad(lambda a: prims.topk(a, 2, 1, True, True), _make())
    check_grad(lambda a: prims.sort(a, 0, False), _make())


def test_indexing():
    idx = _int_index((3, 2), 4)
    check_grad(lambda a, i: prims.gather(a, 1, i), _make(), idx)
    check_grad(lambda a, i: prims.take_along_axis(a, i, 1), _make(), idx)
    check_grad(lambda a, i: prims.index_select(a, 1, i), _make(), _int_index((5,), 4))
    check_grad(lambda a, i, s: prims.scatter(a, 1, i, s), _make(), torch.tensor([[0, 1], [2, 3], [1, 0]]),
               _make((3, 2), seed=1))
    check_grad(lambda a, i, s: prims.scatter_add(a, 1, i, s), _make(), idx, _make((3, 2), seed=1))
    check_grad(lambda a, i, s: prims.index_add(a, 0, i, s), _make(), _int_index((5,), 3), _make((5, 4), seed=1))
    rows, cols = torch.tensor([0, 2, -1]), torch.tensor([1, 3, 0])
    check_grad(lambda a, r, c, v: prims.index_put(a, (r, c), v, False), _make(), rows, cols, _make((3,), seed=2))
    check_grad(lambda a, r, v: prims.index_put(a, (r,), v, True), _make(), rows, _make((3, 4), seed=2))


def test_linear_algebra():
    for sa, sb in [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
                   ((2, 1, 3, 4), (5, 4, 2))]:
        check_grad(prims.matmul, _make(sa), _make(sb, seed=1))
    x, w, b = _make((2, 3, 7)), _make((4, 3, 3), seed=1), _make((4,), seed=2)
    check_grad(lambda x, w, b: prims.convolution(x, w, b, (2,), (1,), (1,), False, (0,), 1), x, w, b)
    x2, w2 = _make((1, 4, 5, 5)), _make((4, 2, 3, 3), seed=1)
    check_grad(lambda x, w: prims.convolution(x, w, None, (1, 1), (0, 0), (1, 1), False, (0, 0), 2), x2, w2)


def test_copy_into_intermediate():
    def fn(a, b):
        t = prims.mul(a, 2.0)
        t2 = prims.copy_(prims.sin(b), t)
        return prims.mul(t2, a)
    check_grad(fn, _make(), _make(seed=1))


def test_every_prim_has_a_rule_or_is_non_differentiable():
    assert rules.missing_prim_rules() == []


def test_duplicate_rule_refused():
    with pytest.raises(ValueError, match="already"):
        rules.register_vjp(prims.sin)(lambda g, out, a: (g,))


def test_requires_grad_inside_the_program_makes_a_new_leaf():
    """``ltorch.requires_grad_`` (no output; the torch language flips the proxy's
    flag while tracing) starts a new differentiable leaf, as eager's does."""
    from thunderlite.core.symbol import Symbol
    from thunderlite.transforms.autodiff.split import REQUIRES_GRAD_ID

    def meta(a, requires_grad=True):
        a.requires_grad = requires_grad
    marker = Symbol(REQUIRES_GRAD_ID.split(".")[1], meta=meta, impl=lambda a, requires_grad=True: None,
                    module="ltorch")

    def fn(x, w):
        y = prims.mul(w, 2.0)      # w does not require grad: y is a leaf
        marker(y)
        return prims.mul(y, x), prims.mul(y, 3.0)
    x, w = _make(), _make(seed=1).detach()
    trc = trace_of(fn, (x, w))
    program = make_differentiable(trc, [True, False], _finalize)
    a, b = program(x, w)
    assert a.requires_grad and b.requires_grad
    (ga,) = torch.autograd.grad((a + b).sum(), x)
    torch.testing.assert_close(ga, 2 * w)


def test_finalize_may_return_every_stage():
    from thunderlite.transforms.del_last_used import del_last_used

    def stages(trace):
        claimed = _finalize(trace)
        return [claimed, del_last_used(claimed)]
    x = _make()
    program = make_differentiable(trace_of(lambda a: prims.sum(prims.sin(a), (0, 1)), (x,)), [True], stages)
    # reuse_buffers writes the gradient into cos(x), which dies there (executors/autograd_function.py)
    assert [t.stage for t in program.backward_traces][-3:] == ["claim_executors", "del_last_used", "reuse_buffers"]
    program(x).backward()
    torch.testing.assert_close(x.grad, torch.cos(x.detach()))
