"""In-place code inside user ``torch.autograd.Function`` subclasses (issue 9):
writes in ``forward`` after ``save_for_backward``, inputs written and marked
dirty, tensors kept on ``ctx`` and written later, writes inside ``backward``.
Each program is compared with eager PyTorch (outputs, every input after the
call, gradients) with the default executors and with the reordering
``torchcompile`` fusion executor."""
from __future__ import annotations

import pytest
import torch

import thunderlite
from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.tests.fuzz_inplace_ops import (
    GradInPlace,
    SaveThenWrite,
    ShadowUpdate,
    SwishInplaceBackward,
    check_against_eager,
)
from thunderlite.transforms.autodiff.rematerialize import rematerialize

F64 = torch.float64
EXECUTORS = [pytest.param(None, id="default"), pytest.param(["torchcompile", "torch"], id="torchcompile")]


def _jit(fn, executors):
    return thunderlite.jit(fn) if executors is None else thunderlite.jit(fn, executors=executors)


class ScaleDirty(torch.autograd.Function):
    """Writes its input, marks it dirty and returns it."""

    @staticmethod
    def forward(ctx, x):
        x.mul_(3)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 + x * 0


class WriteReturned(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.sin()
        ctx.save_for_backward(x, y)
        y.add_(1)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * x.cos() + (y - 1 - x.sin())        # y is the written value: the second term is 0


class CtxAttribute(torch.autograd.Function):
    """A tensor kept as a ctx attribute and written after."""

    @staticmethod
    def forward(ctx, x):
        y = x.cos()
        ctx.y = y
        y.mul_(3)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.y


class WriteOutsideBuffer(torch.autograd.Function):
    """Writes an argument that needs no grad (without mark_dirty) and saves it."""

    @staticmethod
    def forward(ctx, x, buf):
        buf.add_(x.detach())
        ctx.save_for_backward(buf)
        return x * buf

    @staticmethod
    def backward(ctx, g):
        (buf,) = ctx.saved_tensors
        return g * buf, None


class WriteInputWithoutDirty(torch.autograd.Function):
    """Writes its input without mark_dirty: PyTorch runs forward without
    recording, so the input keeps its history and later reads see the write."""

    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3


PROGRAMS = {
    "save_then_write": (lambda x: SaveThenWrite.apply(x.sin()), [(5,)]),
    "mark_dirty_returned": (lambda x: ScaleDirty.apply(x * 1), [(5,)]),
    "mark_dirty_then_read_input": (lambda x: (lambda h: (ScaleDirty.apply(h), h + 1))(x * 1), [(5,)]),
    "write_returned_value": (lambda x: WriteReturned.apply(x * 2), [(4, 3)]),
    "ctx_attribute_written": (lambda x: CtxAttribute.apply(x), [(5,)]),
    "inplace_in_backward_on_saved": (lambda x: SwishInplaceBackward.apply(x * 2), [(6,)]),
    "inplace_in_backward_shared_input": (lambda x: (lambda h: SwishInplaceBackward.apply(h) + h * h)(x.exp()),
                                         [(6,)]),
    "inplace_on_grad_in_backward": (lambda x: GradInPlace.apply(x.exp()) * 3, [(5,)]),
    "input_written_without_mark_dirty": (lambda x: (lambda h: (WriteInputWithoutDirty.apply(h), h * h))(x * 1),
                                         [(4,)]),
}


@pytest.mark.parametrize("executors", EXECUTORS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_inplace_in_autograd_function_matches_eager(name, executors):
    fn, shapes = PROGRAMS[name]
    check_against_eager(fn, shapes, executors)


@pytest.mark.parametrize("executors", EXECUTORS)
def test_forward_writes_an_argument_that_needs_no_grad(executors):
    def fn(x, buf):
        before = buf * 1
        return WriteOutsideBuffer.apply(x, buf) + before, buf * 2
    check_against_eager(fn, [(5,), (5,)], executors, grad_mask=[True, False])


def test_no_grad_call_runs_the_forward_writes():
    def fn(x):
        h = x * 1
        return ScaleDirty.apply(h), SaveThenWrite.apply(h)
    x = torch.randn(4, dtype=F64)
    torch.testing.assert_close(thunderlite.jit(fn)(x.clone()), fn(x.clone()))


class WritesSavedInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        return h * 2

    @staticmethod
    def backward(ctx, g):
        (h,) = ctx.saved_tensors
        h.mul_(0)
        return g * 2


def test_backward_writing_a_value_an_earlier_backward_reads_raises_like_eager():
    """exp's backward reads its result after the user's backward zeroed it:
    eager raises 'modified by an inplace operation'; so do we, with the line."""
    def fn(x):
        h = x.exp()
        return WritesSavedInBackward.apply(h).sum() + (h * h).sum()
    x = torch.randn(4, dtype=F64, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        fn(x).backward()
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation: WritesSavedInBackward\.backward "
                                           r".*test_autograd_function_inplace\.py"):
        thunderlite.jit(fn)(x).backward()


def test_backward_writing_a_value_nobody_reads_later_works():
    def fn(x):
        h = x.sin()
        return WritesSavedInBackward.apply(h) + h * h
    check_against_eager(fn, [(4,)], None)


def test_forward_traces_carry_the_write_renamed():
    jfn = check_against_eager(PROGRAMS["mark_dirty_returned"][0], [(5,)], None)
    first = str(thunderlite.last_traces(jfn)[0])
    assert "prims.update_aliases" in first          # inside the Function's decomposition


# --- rematerialization never recomputes from a value a later write changes ------------------------

def test_rematerialize_refuses_a_chain_reading_an_overwritten_value():
    trc = Trace()
    with tracectx(trc):
        x = TensorProxy((4,), name="x", dtype=F64)
        trc.args = [x]
        b = prims.mul(x, 2.0)            # cheap: x * 2, x later overwritten
        w = prims.copy_(prims.neg(x), x)
        g = TensorProxy((4,), name="g", dtype=F64)
        use = prims.mul(g, b)
    fwd, bwd = trc.bound_symbols[:3], trc.bound_symbols[3:]
    _, saved = rematerialize(fwd, bwd, [b], {"x"})
    assert {p.name for p in saved} == {"x"}                      # without the fact: recomputed from x
    new_bwd, saved = rematerialize(fwd, bwd, [b], {"x"}, {"x", w.name})
    assert [p.name for p in saved] == [b.name] and new_bwd == bwd
    assert use is not None


@pytest.mark.parametrize("executors", EXECUTORS)
def test_value_needed_by_backward_then_its_input_overwritten(executors):
    def fn(x, w):
        y = (x * 2).sin() * w            # mul's backward needs sin(x * 2), a cheap chain from x
        x.add_(1)                        # ... and x is overwritten afterwards
        return y
    check_against_eager(fn, [(5,), (5,)], executors, grad_mask=[False, True])


# --- Functions in programs that functionalize rewrites (issue 9, found by the in-place fuzzer) --------


class ExpDoubled(torch.autograd.Function):
    """A write inside forward into a tensor it made; a backward that is not the
    forward's derivative, so a lost user backward shows."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        y.mul_(2)
        return y

    @staticmethod
    def backward(ctx, g):
        return g * 5


class DoubleDirty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 7


FUNCTIONALIZED = {
    # a write elsewhere in the program makes functionalize rewrite it: each call stays whole
    "user_backward_kept": (lambda x: (lambda b: ExpDoubled.apply(b[0:2]) + DoubleDirty.apply(b[1:3]))(
        (x * 1).add_(1)), [(3,)]),
    # forward writes a tensor requiring grad it does not mark dirty: autograd does not see it
    "unmarked_write_into_input": (lambda x, s: (lambda t: (ShadowUpdate.apply(x * 1, t), t * 2))(s * 1),
                                  [(4,), (4,)]),
}


@pytest.mark.parametrize("executors", EXECUTORS)
@pytest.mark.parametrize("name", list(FUNCTIONALIZED))
def test_function_in_functionalized_program_matches_eager(name, executors):
    fn, shapes = FUNCTIONALIZED[name]
    check_against_eager(fn, shapes, executors)


def test_forward_writing_an_unmarked_leaf_runs_as_in_eager():
    """Forward runs without grad: writing a leaf requiring grad there is allowed
    (marked dirty, eager refuses it)."""
    def fn(x, stat):
        return ShadowUpdate.apply(x, stat)
    x, stat = torch.randn(4, dtype=F64, requires_grad=True), torch.randn(4, dtype=F64, requires_grad=True)
    rstat = stat.detach().clone().requires_grad_()
    fn(x, rstat).sum().backward()
    thunderlite.jit(fn)(x, stat).sum().backward()
    torch.testing.assert_close(stat.detach(), rstat.detach())
    with pytest.raises(RuntimeError, match="leaf Variable"):
        thunderlite.jit(lambda x: DoubleDirty.apply(x))(torch.randn(3, requires_grad=True))


@pytest.mark.parametrize("executors", EXECUTORS)
def test_saved_input_that_functionalize_replaced(executors):
    """The Function saves a view of arguments sharing storage that a write
    changed before the call: functionalize gives the call the new value, and
    the backward reads what the call read (it named a value no longer computed)."""
    def fn(a, b):
        v = a.reshape(-1)
        a.masked_fill_(a > 0.2, -1.0)
        return GradInPlace.apply(v)
    grads = []
    for f in (fn, _jit(fn, executors)):
        x = torch.linspace(-1, 1, 24, dtype=F64).reshape(6, 4).requires_grad_()
        base = x * 1
        out = f(base, base[1:4])
        (out * 2).sum().backward()            # a fresh gradient: the backward writes it
        grads.append((out.detach(), base.detach(), x.grad))
    torch.testing.assert_close(grads[1], grads[0])


def _full_slice_eager_mode(x):
    h = x * 1
    out = GradInPlace.apply(h.exp())[0:5]
    with torch.no_grad():
        h.mul_(2)                    # a write under no_grad on a gradient path: eager mode
    return out, h


@pytest.mark.parametrize("executors", EXECUTORS)
@pytest.mark.parametrize("fn", [lambda x: GradInPlace.apply(x.exp())[0:5], _full_slice_eager_mode],
                         ids=["functional", "eager_mode"])
def test_backward_writing_its_gradient_after_a_full_slice(fn, executors):
    """Eager's slice VJP hands the backward fresh memory, so writing it in place
    works; the trace records no op for ``[0:5]`` of 5 rows, and the sum's
    gradient it would pass on is an expanded scalar."""
    check_against_eager(fn, [(5,)], executors)


def test_write_into_a_view_made_before_its_base_required_grad():
    """``v`` views a tensor that requires no grad; a write makes the base require
    grad; eager regenerates ``v``'s history when it is next used (here by a view
    nobody reads), so ``v.neg_()`` works. The replay drops the dead view, and
    still matches."""
    def fn(a):
        with torch.no_grad():
            d = a.detach()
        v = d.t()
        d.sub_(a)
        v.as_strided((2,), (1,))
        with torch.no_grad():
            a.mul_(1)                 # eager mode: a no_grad write on the gradient path
        v.neg_()
        return v * 1
    check_against_eager(fn, [(3, 2)], None)
