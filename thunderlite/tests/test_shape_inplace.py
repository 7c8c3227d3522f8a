"""Shape-changing in-place ops and ``.data`` assignment through ``thunderlite.jit``
(docs/architecture.md §5, "Tensor objects that change value"): ``unsqueeze_``,
``squeeze_``, ``t_``, ``transpose_``, ``swapdims_``/``swapaxes_``,
``as_strided_``, ``resize_``, ``resize_as_``, ``set_`` and ``x.data = v`` on
inputs, parameters, buffers and locals. Each program is compared with eager
PyTorch on two calls (the compile and a cache hit): outputs, and every input's
shape, strides, storage offset and values afterwards; with the default
executors, torchcompile, and a randomly reordering fusion executor."""
from __future__ import annotations

import pytest
import torch

import thunderlite
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion

EXECUTORS = {"default": lambda: None, "torchcompile": lambda: ["torchcompile", "torch"],
             "reordering": lambda: [ShuffleFusion(0)]}


def _jit(fn, executors):
    exs = EXECUTORS[executors]()
    return thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=exs)


def _same_tensor_state(got: torch.Tensor, want: torch.Tensor) -> None:
    assert (got.shape, got.stride(), got.storage_offset()) == (want.shape, want.stride(), want.storage_offset())
    torch.testing.assert_close(got, want)


def _check(fn, make, executors: str) -> None:
    """``make(seed)`` -> the argument list; two calls, each against eager."""
    jfn = _jit(fn, executors)
    for seed in (0, 1):
        args, ref = make(seed), make(seed)
        got, want = jfn(*args), fn(*ref)
        torch.testing.assert_close(got, want)
        for a, r in zip(args, ref, strict=True):
            if isinstance(a, torch.Tensor):
                _same_tensor_state(a, r)


def _rand(*shapes):
    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(s, generator=g) for s in shapes]
    return make


# --- on inputs ------------------------------------------------------------------------------------

def unsqueeze_then_write(x):
    x.unsqueeze_(0)
    x.add_(1)
    return x * 2


def squeeze_all(x):
    x.squeeze_()
    return x + 1


def squeeze_dim(x):
    x.squeeze_(1)
    x.mul_(3)
    return x.sum(0)


def transpose_t(x):
    x.t_()
    return x.sum(0)


def transpose_then_write(x, y):
    x.transpose_(0, 1)
    x.mul_(y)
    return x + 0


def swapdims_swapaxes(x):
    x.swapdims_(0, 1)
    y = x.exp()
    x.swapaxes_(1, 0)
    return y, x * 2


def as_strided_view(x):
    x.as_strided_((2, 2), (1, 3), 1)
    x.mul_(10)
    return x + 1


def resize_shrink(x):
    x.resize_(5)
    x.add_(1)
    return x * 2


def resize_grow(x):
    x.resize_(20)
    x[12:] = 2.0
    return x.sum()


def resize_as(x, y):
    x.resize_as_(y)
    x.copy_(y)
    return x + 1


def set_to_other(x, y):
    x.set_(y)
    x.add_(1)           # writes y too: they share storage now, as in eager
    return x * 2


def set_strided(x, y):
    x.set_(y, 1, (2, 2), (3, 1))
    return x + 1


def data_assign(x, q):
    x.data = q * 2
    return x + 1


def data_assign_reshaped(x, q):
    x.data = q[:2] * 2
    return x.sum(0)


def data_read_and_copy(x, q):
    d = x.data
    x.data.copy_(q)
    return d + x


def shape_op_then_no_op(x):
    x.unsqueeze_(0)
    x.squeeze_(1)           # no size-1 dim 1: eager leaves it as it is
    return x * 1


INPUT_PROGRAMS = [
    (unsqueeze_then_write, _rand((3, 4))),
    (squeeze_all, _rand((3, 1, 4))),
    (squeeze_dim, _rand((3, 1, 4))),
    (transpose_t, _rand((3, 4))),
    (transpose_then_write, _rand((3, 4), (4, 3))),
    (swapdims_swapaxes, _rand((3, 4))),
    (as_strided_view, _rand((3, 4))),
    (resize_shrink, _rand((3, 4))),
    (resize_grow, _rand((3, 4))),
    (resize_as, _rand((3, 4), (2, 5))),
    (set_to_other, _rand((3, 4), (2, 5))),
    (set_strided, _rand((3, 4), (3, 3))),
    (data_assign, _rand((3, 4), (3, 4))),
    (data_assign_reshaped, _rand((3, 4), (4, 3))),
    (data_read_and_copy, _rand((3, 4), (3, 4))),
    (shape_op_then_no_op, _rand((3, 4))),
]


@pytest.mark.parametrize("executors", sorted(EXECUTORS))
@pytest.mark.parametrize("fn,make", INPUT_PROGRAMS, ids=[f.__name__ for f, _ in INPUT_PROGRAMS])
def test_shape_inplace_on_inputs_matches_eager(fn, make, executors):
    _check(fn, make, executors)


def test_non_contiguous_input():
    def fn(x):
        x.t_()
        x.resize_(8)            # storage order from the offset, as eager
        return x * 2

    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(4, 5, generator=g)[1:, ::2]]
    _check(fn, make, "default")


# --- on locals ------------------------------------------------------------------------------------

def locals_chain(x):
    y = x * 2
    y.t_()
    y.unsqueeze_(0)
    z = torch.zeros(2, 3)
    z.resize_(4)
    w = torch.ones(4)
    w.set_(y.flatten())
    v = x.t().contiguous()
    v.data = torch.arange(6.0)
    return y + 1, z, w, v


def local_view_of_input(x):
    y = x.t()
    y.unsqueeze_(1)
    y.mul_(2)           # writes x through the view
    return y.sum()


@pytest.mark.parametrize("executors", sorted(EXECUTORS))
@pytest.mark.parametrize("fn", [locals_chain, local_view_of_input])
def test_shape_inplace_on_locals_matches_eager(fn, executors):
    _check(fn, _rand((3, 2)), executors)


def test_list_holding_the_tensor_sees_the_new_shape():
    def fn(x):
        held = [x * 1]
        held[0].unsqueeze_(0)
        return held[0].shape[0], held[0] + 1
    got, want = thunderlite.jit(fn)(torch.ones(3)), fn(torch.ones(3))
    assert got[0] == want[0]
    torch.testing.assert_close(got[1], want[1])


# --- module state and gradients ----------------------------------------------------------------

class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("buf", torch.zeros(2, 3))


def _net_pair():
    torch.manual_seed(0)
    a = _Net()
    b = _Net()
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("executors", sorted(EXECUTORS))
def test_parameter_data_assignment_keeps_the_parameter(executors):
    def step(net, q, x):
        net.lin.weight.data = q * 2             # same shape: the values, the Parameter stays
        net.buf.resize_(6)
        net.buf.fill_(1.5)
        net.buf.unsqueeze_(0)
        return net.lin(x).sum()
    jnet, enet = _net_pair()
    weight = jnet.lin.weight
    jstep = _jit(step, executors)
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        q, x = torch.randn(3, 4, generator=g), torch.randn(2, 4, generator=g)
        if seed:
            jnet.buf.resize_(2, 3)
            enet.buf.resize_(2, 3)
        got, want = jstep(jnet, q, x), step(enet, q, x)
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want)
        assert jnet.lin.weight is weight and isinstance(weight, torch.nn.Parameter)
        _same_tensor_state(jnet.lin.weight, enet.lin.weight)
        torch.testing.assert_close(jnet.lin.weight.grad, enet.lin.weight.grad)
        _same_tensor_state(jnet.buf, enet.buf)


@pytest.mark.parametrize("executors", sorted(EXECUTORS))
def test_gradient_through_a_local_that_changed_shape(executors):
    def fn(x, w):
        h = x * 2
        h.t_()
        h.unsqueeze_(0)
        return (h * w).sum()
    jfn = _jit(fn, executors)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 4, generator=g, requires_grad=True), torch.randn(1, 4, 3, generator=g)
    xe = x.detach().clone().requires_grad_()
    got, want = jfn(x, w), fn(xe, w)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, xe.grad)


def test_shape_op_under_no_grad_on_a_parameter():
    def fn(p, x):
        with torch.no_grad():
            p.t_()
        return x * 2
    p = torch.nn.Parameter(torch.randn(3, 4))
    pe = torch.nn.Parameter(p.detach().clone())
    x = torch.randn(3)
    torch.testing.assert_close(thunderlite.jit(fn)(p, x), fn(pe, x))
    _same_tensor_state(p, pe)
    assert isinstance(p, torch.nn.Parameter) and p.requires_grad


def test_shape_op_under_no_grad_on_a_parameter_read_later_is_refused():
    """Eager differentiates the later read with respect to the same leaf in its
    new shape: refused before anything runs."""
    def fn(p):
        with torch.no_grad():
            p.t_()
        return p * 2
    p = torch.nn.Parameter(torch.randn(3, 4))
    with pytest.raises(NotImplementedError, match="under no_grad on the input p, which requires grad"):
        thunderlite.jit(fn)(p)
    assert p.shape == (3, 4)
    with torch.no_grad():                   # no gradient to give: the whole call under no_grad runs
        pe = torch.nn.Parameter(p.detach().clone())
        torch.testing.assert_close(thunderlite.jit(fn)(p), fn(pe))
    _same_tensor_state(p, pe)


# --- refusals: before the caller's tensors are touched ------------------------------------------

def test_growing_resize_of_shared_storage_is_refused_with_the_line():
    def fn(x):
        y = x[:, ::2]
        y.resize_(30)
        return y.sum()
    x = torch.randn(3, 4)
    before = x.clone()
    with pytest.raises(NotImplementedError, match=r"resize_ grows .* shares storage with x .*y\.resize_\(30\)"):
        thunderlite.jit(fn)(x)
    assert x.shape == (3, 4)
    torch.testing.assert_close(x, before)


def test_resize_of_input_sharing_storage_with_another_is_refused():
    def fn(a, b):
        a.resize_(8)
        return a * 2, b
    base = torch.randn(6)
    with pytest.raises(NotImplementedError, match="resize_ .*shares storage with"):
        thunderlite.jit(fn)(base[:3], base[3:])
    assert base.shape == (6,)


def test_shape_op_on_leaf_requiring_grad_raises_like_eager():
    def fn(x):
        x.unsqueeze_(0)
        return x * 2
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        fn(torch.randn(3, requires_grad=True))
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        thunderlite.jit(fn)(x)
    assert x.shape == (3,)


def test_data_of_another_shape_on_a_tensor_requiring_grad_is_refused():
    def fn(p, q):
        p.data = q
        return p * 2
    p = torch.nn.Parameter(torch.randn(3))
    with pytest.raises(NotImplementedError, match=r"\.data of another shape.*p\.data = q"):
        thunderlite.jit(fn)(p, torch.randn(4))
    assert p.shape == (3,)


@pytest.mark.parametrize("executors", sorted(EXECUTORS))
def test_data_assignment_shares_memory_like_eager(executors):
    def fn(x, y):
        x.data = y
        y.add_(1)                   # x sees it: they share memory now
        return x * 2
    _check(fn, _rand((3,), (2, 2)), executors)
    x, y = torch.zeros(3), torch.ones(4)
    _jit(fn, "default")(x, y)
    assert x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


def test_data_of_the_same_shape_on_a_parameter_keeps_its_gradient():
    def fn(p, q, x):
        p.data = q * 2
        return (p * x).sum()
    g = torch.Generator().manual_seed(0)
    q, x = torch.randn(3, generator=g), torch.randn(3, generator=g)
    p, pe = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    thunderlite.jit(fn)(p, q, x).backward()
    fn(pe, q, x).backward()
    _same_tensor_state(p, pe)
    torch.testing.assert_close(p.grad, pe.grad)


def resize_as_function_forms(x, y):
    torch.resize_as_(x, y)
    torch.as_strided_(y, (2,), (2,))        # y changes after x was resized like it
    return x * 1, y * 1


def shrink_shared_input(a, b):
    a.resize_(2)                            # shrinking keeps the storage: fine with b sharing it
    a.mul_(2)
    return a + 0, b * 1


@pytest.mark.parametrize("executors", sorted(EXECUTORS))
def test_function_forms_and_shared_shrink(executors):
    _check(resize_as_function_forms, _rand((3, 4), (2, 5)), executors)

    def make(seed):
        base = torch.randn(6, generator=torch.Generator().manual_seed(seed))
        return [base[:3], base[3:]]
    _check(shrink_shared_input, make, executors)


def views_taken_before(x):
    y = x * 2
    v = y[0]
    y.t_()
    y.add_(1)                   # v sees it: same memory
    w = y[:, 1]
    y.unsqueeze_(0)
    y.mul_(3)                   # so do v and w
    return v + 0, w + 0, y + 0


def input_view_then_shape_change(x):
    v = x[1]
    x.t_()
    x[0].fill_(5.0)             # the caller's x and v see it
    return v * 1


@pytest.mark.parametrize("executors", sorted(EXECUTORS))
@pytest.mark.parametrize("fn", [views_taken_before, input_view_then_shape_change])
def test_views_across_shape_changes_match_eager(fn, executors):
    _check(fn, _rand((3, 4)), executors)
