"""Writes into views on a gradient path (docs/architecture.md, autodiff): the
programs functionalize.py can rewrite are differentiated by thunderlite (a
backward trace exists); the rest run in eager mode, and say so and why in
``last_traces``, ``last_backward_traces`` and ``examine``. Every program is
compared with eager (outputs, gradients, mutated inputs), with the default
executors and the in-place fuzzer's random reordering executor."""
from __future__ import annotations

import pytest
import torch

import thunderlite
from thunderlite.executors.autograd_function import EAGER_MODE_STAGE
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion
from thunderlite.transforms.aliasing.functionalize import FUNCTIONALIZE_STAGE
from thunderlite.transforms.aliasing.write_backs import take_write_backs


def setitem_row(x, w):
    y = x * w
    y[0] = 0
    return y.sum()


def write_view_read_base(x, w):
    y = x * w
    v = y[:, 0]
    v.mul_(2)
    return (y * 3).sum(), v


def strided_slices_and_transpose(x, w):
    y = (x * w).t()
    y[1:, ::2] += 1.5
    v = y.t().view(-1)[2:5]
    v.sin_()
    return y * w, v


def view_of_view_then_base_write(x, w):
    y = x.exp() * w
    a = y[1:]
    b = a[:, 1:].unsqueeze(0)
    b.mul_(w[0, 0])
    y.add_(1)
    return a.sum() + b.sum() + y.pow(2).sum()


def squeeze_and_select(x, w):
    y = (x + w).unsqueeze(1)
    z = y.squeeze(1)
    z[:, 2].copy_(w[:, 0] * 3)
    return y, z


def write_into_argument(x, w):
    x.mul_(w)
    return x.sum()


def write_argument_through_views_and_return_it(x, w):
    x.mul_(w)
    x[0].add_(w[1])
    x.t()[1:, 0] = w[0, 1:] * 2
    return x.sum(), x


def overwrite_argument_return_both(x, w):
    y = w * 2
    x.copy_(y)
    return y, x


def write_argument_read_before_and_after(x, w):
    a = (x.exp() * w).sum()
    x[1:].sub_(w[1:].exp())
    return a + (x * w).sum()


FUNCTIONAL = [setitem_row, write_view_read_base, strided_slices_and_transpose, view_of_view_then_base_write,
              squeeze_and_select, write_into_argument, write_argument_through_views_and_return_it,
              overwrite_argument_return_both, write_argument_read_before_and_after]


def return_view_of_written_argument(x, w):
    x.mul_(w)
    return x[0]


def reshape_copies(x, w):
    y = (x * w).t()
    z = y.reshape(-1)           # a copy in eager (y is not contiguous): the write must not reach y
    z[2:4].sin_()
    return y, z


def flatten_views(x, w):
    y = x * w
    z = y.flatten()             # a view in eager (y is contiguous): the write reaches y
    z[2:4].sin_()
    return y * 2, z


def write_reading_another_view_of_itself(x, w):
    y = x * w
    v = y[:, ::2]                   # not dense: eager's kernel reads it while writing y, in its own order
    y.sub_(v[:, :1], alpha=2)
    return y


def write_through_alias(x, w):
    y = x * w
    a = torch.ops.aten.alias(y)         # the identity view
    a.mul_(w)
    return y * 2, a


def write_through_contiguous_view(x, w):
    y = x * w
    c = y.contiguous()                  # y itself (contiguous): the write reaches y
    c[0].mul_(2)
    return y, c


def write_through_contiguous_copy(x, w):
    y = x.t() * w.t()
    c = y.contiguous()                  # a copy (y is not contiguous): the write does not reach y
    c[0].mul_(2)
    return y, c


def write_through_unchanged_results(x, w):
    y = x * w                           # each call returns its input unchanged
    y.sum_to_size(y.shape).add_(1.0)
    y.type_as(w)[0].mul_(w[1])
    y.view_as(w)[:, 1].sub_(w[2])
    y.expand_as(w).mul_(1.5)
    y.reshape(3, 3)[2].add_(w[0])
    y.float().div_(2.0)
    y.to(torch.float32)[1, 1:].mul_(w[0, 1:])
    return y


def write_through_as_strided(x, w):
    y = x * w
    v = y.as_strided((2, 2), (1, 3), 1)   # a transposed 2x2 block at offset 1: no element twice
    v.mul_(w[0, 0])
    return y, v


def write_argument_through_as_strided_and_return_it(x, w):
    x.mul_(w)
    v = x.as_strided((3,), (4,))          # the diagonal of the written argument
    v.add_(w[0])
    return v, x.sum()


def write_base_of_overlapping_as_strided(x, w):
    y = x * w
    v = y.as_strided((3, 3), (0, 1))      # every row is y's first row: read, never written
    r = v * 2
    y[0].add_(w[1])
    return r, v


def write_through_expanded_view(x, w):
    y = x * w
    e = y[0].unsqueeze(0).expand(2, 3)    # rows of e are y[0] twice over
    e[1].add_(1.4)                        # one broadcast copy: each element of y[0] once
    return y, e


def write_through_complex_round_trip(x, w):
    y = x * w
    z = y.view(9)[:8].view(4, 2)
    v = torch.view_as_real(torch.view_as_complex(z))   # the elements of z, through a complex view
    v.mul_(w[0, 1:])
    return y, v


FUNCTIONAL += [reshape_copies, flatten_views, return_view_of_written_argument]
OPAQUE_VIEWS = [write_through_alias, write_through_contiguous_view, write_through_contiguous_copy,
                write_through_unchanged_results, write_through_as_strided,
                write_argument_through_as_strided_and_return_it, write_base_of_overlapping_as_strided,
                write_through_expanded_view, write_through_complex_round_trip]
FUNCTIONAL += OPAQUE_VIEWS
EAGER = [write_reading_another_view_of_itself]


def _run(fn, executors, seed=0):
    torch.manual_seed(seed)
    x, w = torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)
    xr, wr = x.clone(), w.detach().clone().requires_grad_()
    jfn = thunderlite.jit(fn) if executors is None else thunderlite.jit(fn, executors=executors)
    out, ref = jfn(x, w), fn(xr, wr)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x, xr)
    loss = lambda o: sum((t * (i + 1)).sum() for i, t in enumerate(o if isinstance(o, tuple) else (o,)))  # noqa: E731
    loss(out).backward()
    loss(ref).backward()
    torch.testing.assert_close(w.grad, wr.grad)
    return jfn


EXECUTORS = [None, "shuffle"]


def _exs(name):
    return None if name is None else [ShuffleFusion(7), "torch"]


@pytest.mark.parametrize("exs", EXECUTORS, ids=["default", "shuffle"])
@pytest.mark.parametrize("fn", FUNCTIONAL, ids=lambda f: f.__name__)
def test_functionalized_programs_match_eager_and_have_a_backward(fn, exs):
    jfn = _run(fn, _exs(exs))
    stages = [t.stage for t in thunderlite.last_traces(jfn)]
    assert FUNCTIONALIZE_STAGE in stages and EAGER_MODE_STAGE not in stages
    bwd = thunderlite.last_backward_traces(jfn)
    assert bwd and bwd[0].stage != EAGER_MODE_STAGE and bwd[-1].bound_symbols
    functional = next(t for t in thunderlite.last_traces(jfn) if t.stage == FUNCTIONALIZE_STAGE)
    body, write_backs, _ = take_write_backs(functional)     # only the write-backs into inputs stay writes
    assert "prims.copy_" not in str(body).split("def computation", 1)[1].replace("# ", "#")
    assert {b.args[1].name for b in write_backs} <= {a.name for a in functional.args}
    assert "functionalized" in thunderlite.examine(fn, *(_args())).autodiff


def _args():
    return torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)


@pytest.mark.parametrize("exs", EXECUTORS, ids=["default", "shuffle"])
@pytest.mark.parametrize("fn", EAGER, ids=lambda f: f.__name__)
def test_eager_mode_fallback_is_named(fn, exs):
    jfn = _run(fn, _exs(exs))
    traces = thunderlite.last_traces(jfn)
    named = [t for t in traces if t.stage == EAGER_MODE_STAGE]
    assert len(named) == 1
    text = str(named[0])
    assert text.startswith(f"# Constructed by {EAGER_MODE_STAGE}") and "because of" in text
    bwd = thunderlite.last_backward_traces(jfn)
    assert len(bwd) == 1 and bwd[0].stage == EAGER_MODE_STAGE
    assert "no backward trace: PyTorch autograd differentiates this program" in str(bwd[0])
    report = thunderlite.examine(fn, *(_args()))
    assert report.autodiff.startswith("eager-mode fallback") and "autodiff: eager-mode fallback" in str(report)


def test_fallback_reason_names_the_line():
    jfn = _run(write_reading_another_view_of_itself, None)
    text = str(thunderlite.last_backward_traces(jfn)[0])
    assert "because of a write on a gradient path into" in text and "test_functionalize.py:" in text
    assert "reads another view of the memory it writes" in text


def test_returned_view_of_written_argument_is_a_view_of_it():
    """A view of a written input the program returns is made from the input
    after the write-back, so it is a view of the caller's tensor, as in eager."""
    x, w = torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)
    v = thunderlite.jit(return_view_of_written_argument)(x, w)
    assert v._base is x and v.requires_grad
    v.add_(1.0)
    torch.testing.assert_close(x[0], v)


def _matches_eager_on_layout(fn, jfn, layout: str) -> None:
    """One call of ``jfn`` and of eager ``fn`` on an ``x`` whose layout is
    ``layout`` ("contiguous" or "transposed") and a ``w`` requiring grad:
    the outputs and ``w``'s gradients are eager's."""
    x, w = torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)
    x = x.t() if layout == "transposed" else x
    w_r = w.detach().clone().requires_grad_()
    out, ref = jfn(x, w), fn(x.clone(), w_r)
    torch.testing.assert_close(out, ref)
    (out[0].sum() + (out[1] * 2).sum()).backward()
    (ref[0].sum() + (ref[1] * 2).sum()).backward()
    torch.testing.assert_close(w.grad, w_r.grad)


@pytest.mark.parametrize("fn", [reshape_copies, flatten_views], ids=lambda f: f.__name__)
def test_reshape_follows_the_strides_it_was_compiled_for(fn):
    """Whether eager's reshape/flatten is a view depends on the strides of the
    inputs it is computed from: they are guarded, and other strides recompile
    (each layout still matches eager)."""
    jfn = thunderlite.jit(fn)
    for layout in ("contiguous", "transposed", "contiguous"):
        _matches_eager_on_layout(fn, jfn, layout)
        assert EAGER_MODE_STAGE not in [t.stage for t in thunderlite.last_traces(jfn)]
    info = thunderlite.cache_info(jfn)
    assert (info["misses"], info["hits"]) == (2, 1) and "strides of argument 0 changed" in info["last_miss_reason"]
    assert "check_strides" in str(thunderlite.last_prologue_traces(jfn)[-1])


def test_argument_write_keeps_eager_history():
    """Eager mode, the one left for writes into arguments: the written argument
    carries autograd history afterwards, as in eager."""
    x, w = torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)
    xr, wr = x.clone(), w.detach().clone().requires_grad_()
    thunderlite.jit(write_into_argument)(x, w)
    write_into_argument(xr, wr)
    assert x.requires_grad and x.grad_fn is not None
    (x * 2).sum().backward()
    (xr * 2).sum().backward()
    torch.testing.assert_close(w.grad, wr.grad)


def test_no_grad_program_is_untouched():
    """Without a gradient path nothing is functionalized or replayed."""
    x, w = torch.randn(3, 3), torch.randn(3, 3)
    jfn = thunderlite.jit(write_view_read_base)
    torch.testing.assert_close(jfn(x.clone(), w), write_view_read_base(x.clone(), w))
    stages = [t.stage for t in thunderlite.last_traces(jfn)]
    assert FUNCTIONALIZE_STAGE not in stages and EAGER_MODE_STAGE not in stages
    assert thunderlite.last_backward_traces(jfn) == []


def _graph_inputs(kind: str, leaf: torch.Tensor):
    """``x`` as the caller passes it: a non-leaf requiring grad, or a view of one
    (eager then rewrites the base's history too), and the tensor to inspect."""
    h = leaf * 1.5
    if kind == "non-leaf":
        return h, h
    return h[1:], h


@pytest.mark.parametrize("exs", EXECUTORS, ids=["default", "shuffle"])
@pytest.mark.parametrize("kind", ["non-leaf", "view of a non-leaf"])
@pytest.mark.parametrize("fn", [write_into_argument, write_argument_through_views_and_return_it,
                                write_argument_read_before_and_after], ids=lambda f: f.__name__)
def test_written_argument_requiring_grad_matches_eager(fn, kind, exs):
    """The written argument requires grad itself (a non-leaf, or a view of one):
    its gradient, its base's value and the gradient reaching the leaf behind it
    are eager's, and its history continues from the program's."""
    torch.manual_seed(1)
    leaf, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    leaf_r, w_r = leaf.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    x, base = _graph_inputs(kind, leaf)
    x_r, base_r = _graph_inputs(kind, leaf_r)
    x, x_r = (x[:3], x_r[:3]) if kind == "non-leaf" else (x, x_r)
    jfn = thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=_exs(exs))
    out, ref = jfn(x, w), fn(x_r, w_r)
    assert EAGER_MODE_STAGE not in [t.stage for t in thunderlite.last_traces(jfn)]
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(base, base_r)
    assert x.requires_grad and x.grad_fn is not None
    loss = lambda o, b: sum((t * (i + 1)).sum() for i, t in enumerate(o if isinstance(o, tuple) else (o,))) \
        + (b * b).sum()  # noqa: E731
    loss(out, base).backward()
    loss(ref, base_r).backward()
    torch.testing.assert_close(w.grad, w_r.grad)
    torch.testing.assert_close(leaf.grad, leaf_r.grad)


def test_returned_argument_is_the_argument():
    """A program returning the input it writes returns that tensor (as eager),
    and a value written into it stays a distinct tensor."""
    x, w = torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)
    y, same = thunderlite.jit(overwrite_argument_return_both)(x, w)
    assert same is x and y is not x
    torch.testing.assert_close(x, w * 2)
    y.add_(1)            # y is not x's memory
    torch.testing.assert_close(x, w * 2)


def test_written_argument_saved_for_backward_is_the_old_value():
    """The write-back happens after the forward: a gradient needing the
    argument's old value gets it (saved as it was)."""
    x, w = torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)
    x0 = x.clone()
    jfn = thunderlite.jit(write_into_argument)
    jfn(x, w).backward()
    torch.testing.assert_close(w.grad, x0)


def _overlapping_rows(leaf):
    base = leaf * 1.5
    return base, (base[0:3], base[2:5])


@pytest.mark.parametrize("exs", EXECUTORS, ids=["default", "shuffle"])
def test_written_arguments_sharing_storage(exs):
    """Arguments sharing storage (overlapping rows of one tensor): they are
    gathers from that storage, a write a scatter into it; every argument and
    the base are eager's afterwards, and so are the gradients. Their offsets
    are guarded: other rows of the same base recompile."""
    def f(x, y, w):
        x.mul_(w)
        y[0].add_(1.0)              # the row x and y share
        return (y * w).sum(), x
    leaf, w = torch.randn(5, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    leaf_r, w_r = leaf.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    jfn = thunderlite.jit(f) if exs is None else thunderlite.jit(f, executors=_exs(exs))
    base, (x, y) = _overlapping_rows(leaf)
    base_r, (x_r, y_r) = _overlapping_rows(leaf_r)
    out, ref = jfn(x, y, w), f(x_r, y_r, w_r)
    assert EAGER_MODE_STAGE not in [t.stage for t in thunderlite.last_traces(jfn)]
    assert out[1] is x
    torch.testing.assert_close((out, base), (ref, base_r))
    (out[0] + (out[1] * 2).sum() + (base * base).sum()).backward()
    (ref[0] + (ref[1] * 2).sum() + (base_r * base_r).sum()).backward()
    torch.testing.assert_close((w.grad, leaf.grad), (w_r.grad, leaf_r.grad))
    other = torch.randn(6, 3, requires_grad=True) * 1.0
    jfn(other[1:4], other[3:6], w)
    assert "storage offset of" in thunderlite.cache_info(jfn)["last_miss_reason"]


@pytest.mark.parametrize("exs", EXECUTORS, ids=["default", "shuffle"])
def test_write_reading_another_view_of_itself_keeps_eager_mode(exs):
    jfn = _run(write_reading_another_view_of_itself, _exs(exs))
    named = [t for t in thunderlite.last_traces(jfn) if t.stage == EAGER_MODE_STAGE]
    assert named and "reads another view of the memory it writes" in str(named[0])


@pytest.mark.parametrize("exs", EXECUTORS, ids=["default", "shuffle"])
def test_write_through_detached_alias_keeps_requires_grad(exs):
    """A write autograd does not see (into ``x.detach()``) changes values, not
    which tensors require grad: the returned alias still does not."""
    def f(a):
        d = a.detach()
        d.clamp_(-0.5, 0.5)
        return d, a.reshape(-1)
    leaf = torch.randn(2, 3, requires_grad=True)
    leaf_r = leaf.detach().clone().requires_grad_()
    jfn = thunderlite.jit(f) if exs is None else thunderlite.jit(f, executors=_exs(exs))
    out, ref = jfn(leaf * 2), f(leaf_r * 2)
    torch.testing.assert_close(out, ref)
    assert [t.requires_grad for t in out] == [t.requires_grad for t in ref] == [False, True]
    out[1].sum().backward()
    ref[1].sum().backward()
    torch.testing.assert_close(leaf.grad, leaf_r.grad)


def _untracked_alias_write(x, w):
    y = x * w
    v = y.unsafe_split(1)[0]            # not a view to autograd: the write changes y, not its history
    v.mul_(2)
    return y * y


@pytest.mark.parametrize("exs", EXECUTORS, ids=["default", "shuffle"])
def test_write_through_an_alias_autograd_does_not_track_keeps_eager_mode(exs):
    """``unsafe_split``'s pieces share memory with their input, but autograd does
    not rebase the input's history on a write into one: eager's gradient is
    not the functional one, so the program keeps eager mode and says why."""
    jfn = _run(_untracked_alias_write, _exs(exs))
    bwd = thunderlite.last_backward_traces(jfn)
    assert len(bwd) == 1 and bwd[0].stage == EAGER_MODE_STAGE
    assert "autograd does not track as a view" in str(bwd[0])


@pytest.mark.parametrize("fn", [write_through_contiguous_view, write_through_as_strided],
                         ids=lambda f: f.__name__)
def test_opaque_view_follows_the_strides_it_was_compiled_for(fn):
    """``contiguous`` is a view or a copy and ``as_strided`` picks storage
    positions by the strides eager has: the inputs they are computed from are
    guarded, and other strides recompile (each layout still matches eager)."""
    jfn = thunderlite.jit(fn)
    for layout in ("contiguous", "transposed"):
        _matches_eager_on_layout(fn, jfn, layout)
        assert thunderlite.last_backward_traces(jfn)[0].stage != EAGER_MODE_STAGE
    assert "strides of argument 0 changed" in thunderlite.cache_info(jfn)["last_miss_reason"]


def test_as_strided_view_of_written_argument_is_guarded_on_its_offset():
    """``as_strided`` places its view by the storage offset of the argument it
    views: a written argument's offset is guarded, and the returned view is a
    view of the caller's tensor, as in eager."""
    jfn = thunderlite.jit(write_argument_through_as_strided_and_return_it)
    for start in (0, 1):
        base = torch.randn(13)
        x, w = base[start:start + 9].view(3, 3), torch.randn(3, 3, requires_grad=True)
        base_r, w_r = base.clone(), w.detach().clone().requires_grad_()
        x_r = base_r[start:start + 9].view(3, 3)
        out, ref = jfn(x, w), write_argument_through_as_strided_and_return_it(x_r, w_r)
        torch.testing.assert_close((out, base), (ref, base_r))
        assert out[0]._base is not None and out[0].untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        (out[0] * 3).sum().add(out[1]).backward()
        (ref[0] * 3).sum().add(ref[1]).backward()
        torch.testing.assert_close(w.grad, w_r.grad)
        assert thunderlite.last_backward_traces(jfn)[0].stage != EAGER_MODE_STAGE
    assert "storage offset of" in thunderlite.cache_info(jfn)["last_miss_reason"]


# --- a write reading another view of the memory it writes (view_geometry.py) ---------------------
# Functional where the view read lies apart from the one written, or on the same positions read
# elementwise; eager mode where it overlaps partially (eager's order), or exactly but not elementwise.

def read_same_positions_by_another_route(x, w):
    y = x * w
    y[:, 0:2].add_(y.t()[0:2].t())          # the same elements, reached through two transposes
    return y


def read_apart_through_a_reduction(x, w):
    y = x * w
    y[0:1].sub_(y[1:3].sum(0, keepdim=True))
    y[:, 1].add_(y[:, ::2].sum(1))          # interleaved: the intervals overlap, the positions do not
    return y


def setitem_from_rows_apart(x, w):
    y = x * w
    y[0] = y[2] * 1.0
    y[1:2] = y[2:3]
    return y


def read_same_positions_not_elementwise(x, w):
    y = x * w
    y.addmm_(y.t().t(), w.detach())         # matmul reads every element of a row it writes
    return y


def addmm_reading_what_it_writes(x, w):
    y = x * w
    v = y[0:3]                              # all of y: no view in the trace
    v.addmm_(v, w.detach())                 # BLAS reads v while writing it: only eager's kernel knows
    return y


def read_overlapping_partially(x, w):
    y = x * w
    y[:, 0:2].add_(y[:, 1:3])               # not dense, eager's kernel order decides
    return y


OVERLAP_FUNCTIONAL = [read_same_positions_by_another_route, read_apart_through_a_reduction, setitem_from_rows_apart]
OVERLAP_EAGER = [read_same_positions_not_elementwise, addmm_reading_what_it_writes, read_overlapping_partially]
OVERLAP_EXECUTORS = [None, ["torchcompile", "torch"], "shuffle"]


def _overlap_exs(name):
    return name if name != "shuffle" else _exs(name)


def _mode(jfn) -> str:
    text = str(thunderlite.last_backward_traces(jfn)[-1])
    return "eager" if EAGER_MODE_STAGE in text.split("\n", 1)[0] else "functional"


@pytest.mark.parametrize("exs", OVERLAP_EXECUTORS, ids=["default", "torchcompile", "shuffle"])
@pytest.mark.parametrize("fn", OVERLAP_FUNCTIONAL + OVERLAP_EAGER, ids=lambda f: f.__name__)
def test_write_reading_its_own_memory(fn, exs):
    jfn = _run(fn, _overlap_exs(exs))
    assert _mode(jfn) == ("functional" if fn in OVERLAP_FUNCTIONAL else "eager")
    if fn in OVERLAP_EAGER:
        why = "reads another view of the memory it writes" if fn is read_overlapping_partially else \
            "reads an operand sharing the memory it writes"
        assert why in str(thunderlite.last_backward_traces(jfn)[-1])


def _shared(leaf, rows: tuple, cols: tuple):
    """Two arguments viewing one base (rows/cols: slice bounds of each)."""
    base = leaf * 1.5
    return base, tuple(base[r0:r1, c0:c1] for (r0, r1), (c0, c1) in zip(rows, cols, strict=True))


def add_into(a, b, w):
    b.add_(a)
    return (b * w).sum()


def addcmul_copy_and_setitem(a, b, w):
    b.addcmul_(a, w.detach())
    a.copy_(b * 2)
    a[0] = b[0]
    return a


SHARED = [  # (program, rows, cols, functional?)
    (add_into, ((0, 3), (0, 3)), ((0, 3), (0, 3)), True),                # the same elements
    (addcmul_copy_and_setitem, ((0, 3), (0, 3)), ((0, 3), (0, 3)), True),
    (add_into, ((0, 3), (3, 6)), ((0, 3), (0, 3)), True),                # rows apart
    (addcmul_copy_and_setitem, ((0, 3), (0, 3)), ((0, 3), (3, 6)), True),  # columns apart, interleaved
    (add_into, ((0, 3), (0, 3)), ((0, 3), (1, 4)), False),               # overlapping columns
]


@pytest.mark.parametrize("exs", OVERLAP_EXECUTORS, ids=["default", "torchcompile", "shuffle"])
@pytest.mark.parametrize("case", range(len(SHARED)), ids=lambda i: f"{SHARED[i][0].__name__}-{i}")
def test_arguments_sharing_storage_read_and_written(case, exs):
    """Arguments viewing one base, one written while reading the other: the
    arguments, the base and the gradients are eager's afterwards."""
    fn, rows, cols, functional = SHARED[case]
    leaf, w = torch.randn(6, 6, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    leaf_r, w_r = leaf.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    jfn = thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=_overlap_exs(exs))
    base, args = _shared(leaf, rows, cols)
    base_r, args_r = _shared(leaf_r, rows, cols)
    out, ref = jfn(*args, w), fn(*args_r, w_r)
    assert _mode(jfn) == ("functional" if functional else "eager")
    torch.testing.assert_close((out, args, base), (ref, args_r, base_r))
    (out.sum() + (base * base).sum()).backward()
    (ref.sum() + (base_r * base_r).sum()).backward()
    torch.testing.assert_close((w.grad, leaf.grad), (w_r.grad, leaf_r.grad))


def test_placement_the_decision_read_is_guarded():
    """Written exactly over, then called with the arguments overlapping
    partially: the offsets are guarded, so it recompiles and keeps eager's
    order (eager mode)."""
    jfn = thunderlite.jit(add_into)
    w = torch.randn(3, 3, requires_grad=True)
    for cols, mode in ((((0, 3), (0, 3)), "functional"), (((0, 3), (1, 4)), "eager")):
        leaf = torch.randn(6, 6, requires_grad=True)
        leaf_r = leaf.detach().clone().requires_grad_()
        (base, args), (base_r, args_r) = _shared(leaf, ((0, 3), (0, 3)), cols), _shared(leaf_r, ((0, 3), (0, 3)), cols)
        torch.testing.assert_close(jfn(*args, w), add_into(*args_r, w))
        torch.testing.assert_close(base, base_r)
        assert _mode(jfn) == mode
    assert "storage offset of" in thunderlite.cache_info(jfn)["last_miss_reason"]


def test_same_positions_eager_refuses_are_refused():
    """Two dense views of the same elements with different shapes: eager
    raises ("refer to a single memory location"), and so does the program."""
    def f(x, w):
        y = x * w
        y[0:1].add_(y[0])
        return y
    with pytest.raises(RuntimeError, match="single memory location"):
        f(torch.randn(3, 3), torch.randn(3, 3, requires_grad=True))
    with pytest.raises(RuntimeError, match="single memory location"):
        thunderlite.jit(f)(torch.randn(3, 3), torch.randn(3, 3, requires_grad=True))


def _random_view(rng, base: torch.Tensor) -> torch.Tensor:
    v = base
    for _ in range(rng.randint(1, 3)):
        d = rng.randrange(v.ndim)
        n = v.shape[d]
        lo = rng.randrange(n)
        v = v.narrow(d, lo, rng.randint(1, n - lo))[(slice(None),) * d + (slice(None, None, rng.randint(1, 2)),)]
        if rng.random() < 0.3:
            v = v.t() if v.ndim == 2 else v
    return v


def test_view_geometry_agrees_with_torch():
    """Disjointness, same positions and reshape strides, against the positions
    torch's own views of one storage hold (the stand-in coordinates are the
    storage's: a contiguous base)."""
    import random

    from thunderlite.transforms.aliasing import view_geometry as vg
    rng = random.Random(0)
    base = torch.arange(60).reshape(6, 10)
    geo = lambda t: vg.Geo(tuple(t.shape), tuple(t.stride()), t.storage_offset(), None, True)  # noqa: E731
    for _ in range(300):
        a, b = _random_view(rng, base), _random_view(rng, base)
        pa, pb = a.flatten().tolist(), b.flatten().tolist()
        assert vg.disjoint(geo(a), geo(b)) == (not set(pa) & set(pb))
        assert vg.same_positions(geo(a), geo(b)) == (pa == pb)
        new = (a.numel(),) if rng.random() < 0.5 else (1, a.numel(), 1)
        strides = vg._reshape_strides(tuple(a.shape), tuple(a.stride()), new)
        try:
            viewed = a.view(new)
        except RuntimeError:
            assert strides is None
        else:
            assert strides is not None
            assert vg.same_positions(geo(viewed), vg.Geo(new, strides, a.storage_offset(), None, True))
