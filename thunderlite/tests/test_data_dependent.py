"""Data-dependent output sizes (issue 14): ops whose output size depends on the
data are traced with *unbacked* sizes (known only at run time), so one trace
serves every input without recompiling; values, gradients and errors are
eager's (torch/ops/data_dependent.py, docs/architecture.md §8)."""
from __future__ import annotations

import pytest
import torch

import thunderlite
from thunderlite import DataDependentError

EXECUTORS = [pytest.param(None, id="default"), pytest.param(["torchcompile", "torch"], id="torchcompile")]

X = [torch.tensor([1.0, -2.0, 3.0, 0.0, 5.0, -1.0]), torch.tensor([-1.0, -2.0, -3.0, 4.0, -5.0, -6.0]),
     torch.tensor([2.0, 2.0, 3.0, 3.0, 3.0, 7.0]), torch.tensor([-1.0, 0.0, 0.0, -1.0, -2.0, -3.0])]


def _assert_same(a, b):
    if isinstance(a, (tuple, list)):
        assert type(a) is type(b) or isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif isinstance(b, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b)
    else:
        assert a == b and type(a) is type(b), (a, b)


def _nonzero(x):
    return torch.nonzero(x > 0) * 2


def _nonzero_tuple(x):
    return torch.nonzero(x.reshape(2, 3) > 0, as_tuple=True)


def _argwhere(x):
    return torch.argwhere(x.reshape(3, 2))


def _masked_select(x):
    return torch.masked_select(x.reshape(2, 3), x[:3] > 0) + 1     # the mask broadcasts


def _mask_index(x):
    y = x[x > 0]
    return y * y.shape[0], y.sum()


def _mask_index_2d(x):
    m = x.reshape(2, 3)
    return m[:, m[0] < 2].exp()


def _mask_setitem(x):
    y = x.clone()
    y[y < 0] = 0.5
    return y


def _unique(x):
    return torch.unique(x, return_inverse=True, return_counts=True)


def _unique_plain(x):
    return torch.unique(x * 0 + x.round()).sum()


def _unique_consecutive(x):
    return torch.unique_consecutive(x, return_counts=True)


def _repeat_interleave(x):
    return torch.repeat_interleave(x, (x > 0).long() + 1).sin()


def _repeat_counts(x):
    return torch.repeat_interleave((x > 0).long())


def _item_as_size(x):
    n = (x > 0).sum().item()
    return torch.zeros(n) + n, x * (n + 1)


def _tolist(x):
    a, b = (x[:2] > 0).long().tolist()
    return torch.ones(a) * (b + 1), x * (a - b)


def _equal_allclose(x):
    return torch.equal(x, x.abs()), torch.allclose(x, x + 1e-9), x.equal(x.sum())


def _slice_to_item(x):
    n = (x > 0).sum().item()                 # 0..6: x[:n] is min(n, 6) long
    return x[:n] * 2, x[1:n], x[n:], x[:n + 3].sum()


def _slice_between_items(x):
    a, b = (x > 0).sum().item(), (x < 0).sum().item()
    return x[a:b] + 1


def _narrow_item(x):
    n = (x > 0).sum().item()
    return torch.narrow(x, 0, 0, n), x.narrow(0, 6 - n, n)


def _narrow_tensor_start(x):
    start = (x > 0).sum() - 5                # -5..1: negative starts count from the end
    return torch.narrow(x, 0, start, 2)


def _tensor_split(x):
    points = torch.stack([(x > 0).sum(), (x > 1).sum() + 2])
    return torch.tensor_split(x, points)


def _softmax_run_time(x):
    y = x[x > 0]                             # 0..6 elements: softmax of nothing is nothing
    return torch.softmax(y, 0), torch.log_softmax(y * 2, -1), torch.cat([y, x[:1]])


def _bincount(x):
    c = x.abs().round().long()
    return torch.bincount(c), torch.bincount(c, minlength=9), torch.bincount(c, weights=x)


def _same_mask_twice(x):
    m = x > 0
    y = x * 3
    return x[m] + y[m], torch.nonzero(m).shape[0] == torch.argwhere(m).shape[0]


def _setitem_from_same_mask(x):
    y, z = x.clone(), x * 3
    y[x > 0] = z[x > 0]
    m = x < 0
    y[m] = y[m] * z[m]
    return y


def _lstsq(x):
    A = x.reshape(3, 2) + 3 * torch.eye(3, 2)
    B = torch.stack([x[:3], x[3:] * 2], 1)
    return torch.linalg.lstsq(A, B), torch.linalg.lstsq(A.T, B[:2], driver="gelsd")[0]


OPS = [_nonzero, _nonzero_tuple, _argwhere, _masked_select, _mask_index, _mask_index_2d, _mask_setitem, _unique,
       _unique_plain, _unique_consecutive, _repeat_interleave, _repeat_counts, _item_as_size, _tolist,
       _equal_allclose, _slice_to_item, _slice_between_items, _narrow_item, _narrow_tensor_start, _tensor_split,
       _softmax_run_time, _bincount, _same_mask_twice, _setitem_from_same_mask, _lstsq]


@pytest.mark.parametrize("executors", EXECUTORS)
@pytest.mark.parametrize("fn", OPS, ids=lambda f: f.__name__.strip("_"))
def test_sizes_from_the_data_one_compile(fn, executors):
    """Every input gives eager's result (sizes from 0 to 6) from one trace."""
    jfn = thunderlite.jit(fn, executors=executors)
    for x in X:
        _assert_same(jfn(x.clone()), fn(x.clone()))
    assert thunderlite.cache_info(jfn)["misses"] == 1


def _lstsq_solution(x):
    sol = torch.linalg.lstsq(x.reshape(3, 2) + 3 * torch.eye(3, 2), torch.stack([x[:3], x[3:]], 1), driver="gels")
    return sol.solution, sol.residuals


GRAD_OPS = [_masked_select, _mask_index, _mask_index_2d, _repeat_interleave,
            lambda x: (x * 2)[x.detach() > 0].sum() * x, _slice_to_item, _slice_between_items, _narrow_item,
            _narrow_tensor_start, _tensor_split, _softmax_run_time, _same_mask_twice, _setitem_from_same_mask,
            _lstsq_solution]


def _tensors(out) -> list:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return [out] if isinstance(out, torch.Tensor) else []


@pytest.mark.parametrize("executors", EXECUTORS)
@pytest.mark.parametrize("fn", GRAD_OPS, ids=["masked_select", "mask_index", "mask_index_2d", "repeat_interleave",
                                              "mask_then_broadcast", "slice_to_item", "slice_between_items",
                                              "narrow_item", "narrow_tensor_start", "tensor_split",
                                              "softmax_run_time", "same_mask_twice", "setitem_from_same_mask",
                                              "lstsq"])
def test_gradients_through_data_dependent_sizes(fn, executors):
    """Gathers by run-time indices differentiate as eager (index_add into
    zeros); the size symbol flows into the backward."""
    jfn = thunderlite.jit(fn, executors=executors)
    for x in X:
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_j, out_e = _tensors(jfn(a)), _tensors(fn(b))
        _assert_same([o.detach() for o in out_j], [o.detach() for o in out_e])
        sum(o.sum() for o in out_j if o.requires_grad).backward()
        sum(o.sum() for o in out_e if o.requires_grad).backward()
        torch.testing.assert_close(a.grad, b.grad)
    assert thunderlite.cache_info(jfn)["misses"] == 1


def test_the_size_is_a_trace_value_defined_by_its_op():
    jfn = thunderlite.jit(_mask_index)
    jfn(X[0])
    first, final = thunderlite.last_traces(jfn)[0], str(thunderlite.last_traces(jfn)[-1])
    assert "(t2, u0) = ltorch.nonzero_sized(t1)" in str(first)      # at top level, not inside getitem
    assert "u0 = " not in final.replace("(t2, u0) = ", "") and "nonzero_sized(t1)" in final
    assert 'f32[u0]' in final


def test_static_programs_pay_nothing():
    """A program without data-dependent ops traces exactly as before: no size
    symbols, no size guards."""
    jfn = thunderlite.jit(lambda x: x * 2)
    jfn(X[0])
    assert "check_size" not in str(thunderlite.last_prologue_traces(jfn)[-1])      # no size guards
    assert "u0" not in str(thunderlite.last_traces(jfn)[-1])


# --- errors ----------------------------------------------------------------------------------

def _branch_on_item(x):
    n = (x > 0).sum().item()
    if n > 3:  # branch
        return x
    return -x


def _branch_on_tensor(x):
    if x.sum() > 0:  # branch
        return x
    return -x


def _branch_on_equal(x):
    if torch.equal(x, x.abs()):  # branch
        return x
    return -x


def _branch_on_size(x):
    y = x[x > 0]
    if y.shape[0] == 2:  # branch
        return y
    return -y


def _broadcast_run_time_size(x):
    return x[x > 0] + x[:3]  # branch


@pytest.mark.parametrize("fn, what", [
    (_branch_on_item, "n0 > 3"), (_branch_on_tensor, "bool(tensor)"), (_branch_on_equal, "b0"),
    (_branch_on_size, "u0 == 2"), (_broadcast_run_time_size, "broadcasting sizes u0 and 3"),
], ids=["item", "tensor", "equal", "size", "broadcast"])
def test_deciding_on_a_run_time_value_names_the_line_and_the_ways_out(fn, what):
    """With the strict option; by default the program splits at the branch
    (test_splits.py runs these), but not in an op (broadcasting)."""
    with pytest.raises(DataDependentError) as info:
        thunderlite.jit(fn, splits=False)(X[0])
    msg = str(info.value)
    assert what in msg
    assert f"{__file__}:" in msg and "# branch" in msg
    assert "torch.where" in msg and 'backend="thunderlite"' in msg


def test_an_item_used_as_a_size_is_checked_when_the_program_runs():
    def f(x):
        n = x.sum().long().item()
        return torch.zeros(n)
    jfn = thunderlite.jit(f)
    assert jfn(torch.tensor([2.0, 1.0])).shape == (3,)
    with pytest.raises(RuntimeError, match="negative"):
        jfn(torch.tensor([-2.0, 1.0]))
    assert thunderlite.cache_info(jfn)["misses"] == 1


def test_static_shape_executors_leave_run_time_sizes_to_the_next():
    """triton plans kernels for sizes it can read while tracing: symbols with a
    run-time size stay for the torch executor, the rest still fuse."""
    pytest.importorskip("triton")

    def f(x):
        y = x[x > 0]
        return (y * 2).sin() + 1, (x * 2).sin()
    jfn = thunderlite.jit(f, executors=["triton", "torch"])
    for x in X:
        _assert_same(jfn(x), f(x))
    assert thunderlite.cache_info(jfn)["misses"] == 1
    final = str(thunderlite.last_traces(jfn)[-1])
    assert "triton.fusion" in final and "nonzero_sized" in final


def test_a_slice_bound_from_item_clamps_and_a_negative_one_is_checked():
    """``x[:n]`` is ``min(n, size)`` long; a negative ``n`` (legal Python) was
    assumed away while tracing, so the program raises instead of answering wrong."""
    def f(x):
        return x[:x.sum().long().item()]
    jfn = thunderlite.jit(f)
    assert jfn(torch.tensor([2.0, 1.0, 0.0, 0.0])).shape == (3,)
    assert jfn(torch.tensor([5.0, 2.0, 0.0, 0.0])).shape == (4,)
    with pytest.raises(RuntimeError, match="negative"):
        jfn(torch.tensor([-2.0, 1.0, 0.0, 0.0]))
    assert thunderlite.cache_info(jfn)["misses"] == 1
    assert "min(" in str(thunderlite.last_traces(jfn)[-1])


def test_narrow_checks_its_run_time_bounds_when_the_program_runs():
    def f(x):
        return torch.narrow(x, 0, 1, x.sum().long().item())
    jfn = thunderlite.jit(f)
    torch.testing.assert_close(jfn(torch.tensor([1.0, 1.0, 0.0, 0.0])), torch.tensor([1.0, 0.0]))
    with pytest.raises(RuntimeError, match="exceeds dimension size"):
        jfn(torch.tensor([2.0, 2.0, 0.0, 0.0]))
    with pytest.raises(RuntimeError, match="length must be non-negative"):
        jfn(torch.tensor([-2.0, 1.0, 0.0, 0.0]))
    assert thunderlite.cache_info(jfn)["misses"] == 1


def test_lstsq_whose_residuals_depend_on_the_rank_names_the_construct():
    with pytest.raises(DataDependentError, match="driver='gelsd' and more rows than columns"):
        thunderlite.jit(lambda a, b: torch.linalg.lstsq(a, b, driver="gelsd"))(torch.randn(4, 3), torch.randn(4, 2))
