"""Every prim: its meta function against what torch produces on real tensors
(shape, dtype), and the torch executor's result against eager PyTorch."""
import pytest
import torch

from thunderlite.core import prims, pytree
from thunderlite.core.aliasing import views
from thunderlite.core.proxies import NumberProxy, TensorProxy, proxy_of_tensor
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.core.verify import verify_trace
from thunderlite.executors import run_trace

F = torch.nn.functional


def _record(prim, args, kwargs):
    """A trace calling ``prim`` once, with every tensor in args/kwargs an input."""
    trc = Trace()
    tensors = [x for x in pytree.leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    with tracectx(trc):
        proxies = {id(t): proxy_of_tensor(t, trc.fresh_name("x")) for t in tensors}
        trc.args = list(proxies.values())
        swap = lambda x: proxies[id(x)] if isinstance(x, torch.Tensor) else x  # noqa: E731
        out = prim(*pytree.tree_map(swap, args), **pytree.tree_map(swap, kwargs))
        trc.set_return(out)
    verify_trace(trc)
    return trc, tensors, out


def check_prim(prim, args, kwargs=None, ref=None):
    kwargs = kwargs or {}
    trc, tensors, meta_out = _record(prim, args, kwargs)
    got = run_trace(trc, tensors)
    _check_aliasing_declared(trc, tensors, meta_out, got)
    for m, g in zip(pytree.leaves(meta_out), pytree.leaves(got), strict=True):
        if isinstance(m, TensorProxy):
            assert tuple(g.shape) == m.shape and g.dtype == m.dtype, (prim, m, g.shape, g.dtype)
            assert g.device == m.device
        else:
            assert isinstance(m, NumberProxy) and type(g) is m.python_type
    if ref is not None:
        want = ref(*args, **kwargs)
        for w, g in zip(pytree.leaves(want), pytree.leaves(got), strict=True):
            torch.testing.assert_close(g, w, equal_nan=True)
    return got


def _check_aliasing_declared(trc, tensors, meta_out, got) -> None:
    """The torch executor runs a prim within its declared ATen contract: an
    output sharing storage with an input is one ``views`` lists (core/aliasing.py)."""
    declared = {(o.name, b.name) for bsym in trc.bound_symbols for o, b in views(bsym)}
    pairs = [(m, g) for m, g in zip(pytree.leaves(meta_out), pytree.leaves(got), strict=True)
             if isinstance(m, TensorProxy)]
    for m, g in pairs:
        for p, t in zip(trc.args, tensors, strict=True):
            if g.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() and t.numel():
                assert (m.name, p.name) in declared, f"{trc.bound_symbols[0].sym.id}: {m.name} aliases {p.name}"


def _t(*shape, dtype=torch.float32, low=-2.0, high=2.0):
    if dtype is torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.rand(shape, dtype=dtype) * (high - low) + low)
    return torch.randint(int(low) - 3, int(high) + 4, shape, dtype=dtype)


_INT_OPS = {"bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
            "bitwise_right_shift"}
_BOOL_OPS = {"logical_not", "logical_and", "logical_or", "logical_xor"}
_COMPLEX_OPS = {"real", "imag", "conj"}


def _elementwise_dtype(name):
    if name in _INT_OPS:
        return torch.int64
    if name in _BOOL_OPS:
        return torch.bool
    return torch.complex64 if name in _COMPLEX_OPS else torch.float32


@pytest.mark.parametrize("name", prims.UNARY + prims.BINARY + prims.TERNARY)
def test_elementwise_prim_matches_torch(name):
    prim = getattr(prims, name)
    dt = _elementwise_dtype(name)
    fn = torch.special.zeta if name == "zeta" else getattr(torch, name)
    if name == "polygamma":
        args = (1, _t(3, 4, low=0.5, high=3.0))
    elif name in ("bitwise_left_shift", "bitwise_right_shift"):
        args = (_t(3, 4, dtype=dt), torch.randint(0, 5, (3, 4)))
    else:
        arity = 1 if name in prims.UNARY else 2 if name in prims.BINARY else 3
        args = tuple(_t(3, 4, dtype=dt, low=0.1) for _ in range(arity))
    check_prim(prim, args, ref=fn)


def test_elementwise_prims_accept_python_scalars_of_the_same_category():
    x = _t(2, 3)
    check_prim(prims.add, (x, 2.5), ref=torch.add)
    check_prim(prims.mul, (3, _t(2, 3, dtype=torch.int32)), ref=torch.mul)


@pytest.mark.parametrize("bad,match", [
    (lambda x, i: prims.add(i, 2.5), "would promote"),
    (lambda x, i: prims.sin(i), "float or complex"),
    (lambda x, i: prims.add(x, x.replace(shape=(3, 2))), "differ in shape"),
    (lambda x, i: prims.add(x, x.replace(dtype=torch.float64)), "differ in dtype"),
    (lambda x, i: prims.sum(x, (2,)), "out of range"),
    (lambda x, i: prims.reshape(x, (-1,)), "non-negative"),
    (lambda x, i: prims.broadcast_in_dim(x, (4, 3), (0, 1)), "cannot broadcast"),
    (lambda x, i: prims.slice_prim(x, (0, 0), (3, 4), (1, 1)), "invalid slice"),
    (lambda x, i: prims.matmul(x, x), "cannot be multiplied"),
    (lambda x, i: prims.squeeze(x, (0,)), "not of size 1"),
    (lambda x, i: prims.var(i, (0,)), "float or complex"),
    (lambda x, i: prims.argmax(prims.gt(x, 0.0), 0), "bool"),
])
def test_prims_are_strict_with_clear_messages(bad, match):
    with tracectx(Trace()):
        x = TensorProxy((2, 3))
        i = TensorProxy((2, 3), dtype=torch.int64)
        with pytest.raises((RuntimeError, TypeError, IndexError), match=match):
            bad(x, i)


def _pad_ref(a, value, config):
    out = a
    for d, (lo, hi, interior) in enumerate(config):
        if interior:
            n = out.shape[d]
            idx = torch.arange(n) * (interior + 1)
            shape = list(out.shape)
            shape[d] = max(n - 1, 0) * (interior + 1) + 1 if n else 0
            grown = torch.full(shape, value, dtype=a.dtype)
            grown.index_copy_(d, idx, out)
            out = grown
        pads = [0, 0] * (out.ndim - d - 1) + [lo, hi]
        out = F.pad(out, pads, value=value)
    return out


def _bcast_ref(a, shape, dims):
    view = [1] * len(shape)
    for d, s in zip(dims, a.shape, strict=True):
        view[d] = s
    return a.reshape(view).expand(shape)


def _idx():
    return torch.tensor([[0, 1, 2, 0], [2, 2, 1, 0]])


SHAPE_CASES = {
    "broadcast_in_dim": [((_t(3, 1), (2, 3, 4), (1, 2)), _bcast_ref), ((_t(3), (3, 2), (0,)), _bcast_ref),
                         ((_t(4), (2, 4), (1,)), _bcast_ref)],
    "reshape": [((_t(2, 6), (3, 4)), torch.reshape), ((_t(2, 3, 4).transpose(0, 2), (24,)), torch.reshape)],
    "permute": [((_t(2, 3, 4), (2, 0, 1)), torch.permute), ((_t(2, 3), (-1, 0)), torch.permute)],
    "slice_prim": [((_t(5, 6), (1, 0), (4, 6), (2, 3)), lambda a, s, e, st: a[1:4:2, 0:6:3]),
                   ((_t(5), (2,), (2,)), lambda a, s, e: a[2:2])],
    "squeeze": [((_t(2, 1, 3, 1), (1, -1)), lambda a, d: a.squeeze(1).squeeze(-1)),
                ((_t(2, 1), ()), lambda a, d: a)],
    "flip": [((_t(3, 4), (0, 1)), torch.flip)],
    "cat": [(([_t(2, 3), _t(4, 3)], 0), torch.cat), (([_t(2, 3), _t(2, 1)], -1), torch.cat)],
    "pad": [((_t(3, 4), 0.5, [(1, 2, 0), (0, 1, 0)]), _pad_ref), ((_t(3, 4), -1.0, [(1, 0, 2), (-1, 2, 1)]), _pad_ref),
            ((_t(3), 0.0, [(-1, -1, 0)]), _pad_ref)],
    "gather": [((_t(3, 4), 1, torch.tensor([[0, 3], [1, 1], [2, 0]])), torch.gather)],
    "take_along_axis": [((_t(3, 4), torch.tensor([[0], [3], [1]]), 1), torch.take_along_dim)],
    "index_select": [((_t(3, 4), 0, torch.tensor([2, 0, 2, 1])), torch.index_select)],
    "scatter": [((_t(3, 4), 0, _idx(), _t(2, 4)), torch.scatter), ((_t(3, 4), 0, _idx(), 2.0), torch.scatter)],
    "scatter_add": [((_t(3, 4), 0, _idx(), _t(2, 4)), torch.scatter_add)],
    "index_add": [((_t(3, 4), 0, torch.tensor([0, 2, 0]), _t(3, 4)), torch.index_add)],
    "index_put": [((_t(3, 4), (torch.tensor([0, 2, 0]),), _t(3, 4), True), torch.index_put),
                  ((_t(3, 4), (torch.tensor([0, 2]), torch.tensor([1, 3])), _t(2), False), torch.index_put)],
    "matmul": [((_t(3), _t(3)), torch.matmul), ((_t(5, 2, 3), _t(3, 4)), torch.matmul),
               ((_t(3), _t(2, 3, 4)), torch.matmul), ((_t(2, 1, 2, 3), _t(4, 3, 5)), torch.matmul)],
    "convolution": [((_t(2, 4, 9), _t(6, 2, 3), _t(6), [2], [1], [1], False, [0], 2), torch.convolution),
                    ((_t(1, 3, 5, 5), _t(3, 2, 3, 3), None, [2, 2], [1, 1], [1, 1], True, [1, 1], 1),
                     torch.convolution)],
    "sum": [((_t(2, 3, 4), (0, 2)), lambda a, d: a.sum(d)), ((_t(2, 3), ()), lambda a, d: a),
            ((_t(2, 3, dtype=torch.int32), (1,)), lambda a, d: a.sum(d, dtype=torch.int32))],
    "prod": [((_t(2, 3, 4), (0, 2)), lambda a, d: a.prod(2).prod(0)),
             ((_t(2, 3, dtype=torch.complex64), (0, 1)), lambda a, d: a.prod()),
             ((_t(2, 3, dtype=torch.int16), (0,)), lambda a, d: a.prod(0, dtype=torch.int16))],
    "amax": [((_t(2, 3, 4), (1,)), torch.amax), ((_t(2, 3), ()), lambda a, d: a)],
    "amin": [((_t(2, 3, 4), (-1, 0)), torch.amin)],
    "var": [((_t(4, 5), (1,)), lambda a, d: a.var(d))],
    "var_mean": [((_t(4, 5, dtype=torch.complex64), (0, 1)), lambda a, d: torch.var_mean(a, d))],
    "argmax": [((_t(4, 5), 1), torch.argmax), ((_t(4, 5), None), torch.argmax)],
    "argmin": [((_t(4, 5), -2), torch.argmin)],
    "cumsum": [((_t(4, 5), 1), torch.cumsum), ((_t(4, 5, dtype=torch.int32), 1), torch.cumsum)],
    "cumprod": [((_t(4, 5), 0), torch.cumprod)],
    "topk": [((_t(4, 5), 2, 1, True, True), torch.topk), ((_t(6), 3, 0, False, True), torch.topk)],
    "sort": [((_t(4, 5), 0, True), torch.sort)],
    "clone": [((_t(2, 3),), torch.clone)],
    "device_put": [((_t(2, 3), torch.device("cpu")), lambda a, d: a)],
    "where": [((_t(2, 3) > 0, _t(2, 3), _t(2, 3)), torch.where), ((_t(2, 3) > 0, _t(2, 3), 0.0), torch.where),
              ((_t(2, 3) > 0, _t(2, 3, dtype=torch.int32), 1.5), torch.where),
              ((_t(2, 3) > 0, _t(2, 3, dtype=torch.bool), 0), torch.where)],
    "convert_element_type": [((_t(2, 3), torch.int32), lambda a, d: a.to(d)), ((2.7, torch.int64), lambda a, d: 2)],
    "item": [((_t(1, 1),), lambda a: a.item())],
    "copy_": [((_t(3), _t(2, 3)), lambda s, d: s.expand(2, 3))],
}


@pytest.mark.parametrize("name,case", [(n, c) for n, cs in SHAPE_CASES.items() for c in cs],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_prim_meta_and_torch_executor_match_eager(name, case):
    args, ref = case
    check_prim(getattr(prims, name), args, ref=ref)


def test_stable_sort_keeps_the_order_of_ties():
    a = torch.tensor([2.0, 1.0, 2.0, 1.0, 1.0])
    check_prim(prims.sort, (a, -1, False), dict(stable=True), ref=lambda a, d, desc, stable: torch.sort(a, stable=True))


def test_creation_prims():
    cpu = torch.device("cpu")
    check_prim(prims.full, ((2, 3), 1.5), dict(device=cpu, dtype=torch.float64),
               ref=lambda s, v, **kw: torch.full(s, v, **kw))
    check_prim(prims.iota, (5,), dict(start=2, step=3, device=cpu, dtype=torch.int64),
               ref=lambda n, **kw: torch.arange(2, 17, 3))
    check_prim(prims.iota, (4,), dict(start=0.5, step=0.25, device=cpu, dtype=torch.float32),
               ref=lambda n, **kw: torch.tensor([0.5, 0.75, 1.0, 1.25]))
    check_prim(prims.iota, (3,), dict(start=1, step=2, device=cpu, dtype=torch.complex64),
               ref=lambda n, **kw: torch.tensor([1, 3, 5], dtype=torch.complex64))
    out = check_prim(prims.empty, ((4, 0),), dict(device=cpu, dtype=torch.bfloat16))
    assert out.shape == (4, 0)


def test_copy_writes_into_its_destination_and_returns_it():
    src, dst = _t(3), torch.zeros(2, 3, dtype=torch.float64)
    trc, tensors, _ = _record(prims.copy_, (src, dst), {})
    got = run_trace(trc, tensors)
    assert got is dst
    torch.testing.assert_close(dst, src.double().expand(2, 3))
    assert Tag.INPLACE in prims.copy_.tags


_RANDOM_CASES = [
    (prims.uniform, ((3, 4), 0.0, 1.0), torch.float32, lambda: torch.rand(3, 4)),
    (prims.uniform, ((5,), -2.0, 3.0), torch.float64, lambda: torch.empty(5, dtype=torch.float64).uniform_(-2, 3)),
    (prims.normal, ((3, 4), 0.0, 1.0), torch.float32, lambda: torch.randn(3, 4)),
    (prims.randint, ((6,), 0, 10), torch.int64, lambda: torch.randint(0, 10, (6,))),
    (prims.bernoulli, ((8,), 0.3), torch.float32, lambda: torch.empty(8).bernoulli_(0.3)),
]


@pytest.mark.parametrize("prim,args,dtype,eager", _RANDOM_CASES, ids=lambda x: getattr(x, "name", ""))
def test_random_prims_reproduce_eager_draws_after_manual_seed(prim, args, dtype, eager):
    assert {Tag.RANDOM, Tag.DONT_DCE} <= prim.tags
    kwargs = dict(device=torch.device("cpu"), dtype=dtype)
    trc, tensors, _ = _record(prim, args, kwargs)
    torch.manual_seed(1234)
    first, second = run_trace(trc, tensors), run_trace(trc, tensors)
    torch.manual_seed(1234)
    torch.testing.assert_close(first, eager())
    torch.testing.assert_close(second, eager())
    assert not torch.equal(first, second) or prim is prims.bernoulli


def test_random_prims_take_an_explicit_generator():
    g = torch.Generator().manual_seed(7)
    kwargs = dict(device=torch.device("cpu"), dtype=torch.float32, generator=g)
    trc, tensors, _ = _record(prims.normal, ((4,), 1.0, 2.0), kwargs)
    got = run_trace(trc, tensors)
    torch.testing.assert_close(got, torch.empty(4).normal_(1.0, 2.0, generator=torch.Generator().manual_seed(7)))


def test_bernoulli_takes_a_tensor_of_probabilities():
    p = torch.rand(10)
    kwargs = dict(device=torch.device("cpu"), dtype=torch.float32)
    trc, tensors, _ = _record(prims.bernoulli, ((10,), p), kwargs)
    torch.manual_seed(3)
    got = run_trace(trc, tensors)
    torch.manual_seed(3)
    torch.testing.assert_close(got, torch.bernoulli(p))


def test_requires_grad_flows_through_metas_for_inexact_outputs_only():
    with tracectx(Trace()):
        x = TensorProxy((2, 3), requires_grad=True)
        assert prims.sin(x).requires_grad
        assert not prims.gt(x, 0.0).requires_grad
        assert not prims.argmax(x, 0).requires_grad
        assert prims.matmul(x, TensorProxy((3, 2))).requires_grad
        values, indices = prims.topk(x, 1, 1, True, True)
        assert values.requires_grad and not indices.requires_grad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_prims_run_on_cuda_and_move_between_devices():
    cuda = torch.device("cuda")
    a = _t(3, 4)
    moved = check_prim(prims.device_put, (a, cuda), ref=lambda x, d: x.to(d))
    assert moved.is_cuda
    x = a.to(cuda)
    check_prim(prims.matmul, (x, x.t().contiguous()), ref=torch.matmul)
    check_prim(prims.sum, (x, (1,)), ref=lambda t, d: t.sum(d))
    check_prim(prims.full, ((2,), 3.0), dict(device=cuda, dtype=torch.float16),
               ref=lambda s, v, **kw: torch.full(s, v, **kw))
    trc, tensors, _ = _record(prims.uniform, ((16,), 0.0, 1.0), dict(device=cuda, dtype=torch.float32))
    torch.manual_seed(5)
    got = run_trace(trc, tensors)
    torch.manual_seed(5)
    torch.testing.assert_close(got, torch.rand(16, device=cuda))
