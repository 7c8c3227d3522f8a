"""The custom ops and ``torch.autograd.Function``s of the jit in-place
fuzzer's menu (test_fuzz_inplace_jit.py), which the in-place suites of user
Functions and custom ops use too, in a module of their own: torch registers an
op name once per process, and pytest imports a test file under its own name
besides the package's. Also those suites' comparison with eager."""
from __future__ import annotations

import torch

import thunderlite


# Custom ops (issue 9, docs/architecture.md §5), defined once: a functional one with an autograd
# formula, mutating ones (torch allows no autograd formula there: eager's write is invisible to
# autograd), and one declared through a Library schema returning its written argument.
@torch.library.custom_op("tl_fuzz::scaled_sin", mutates_args=())
def _scaled_sin(x: torch.Tensor, s: float) -> torch.Tensor:
    return x.sin() * s


@_scaled_sin.register_fake
def _(x, s):
    return torch.empty_like(x)


def _scaled_sin_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.s = inputs[1]


_scaled_sin.register_autograd(lambda ctx, g: (g * ctx.saved_tensors[0].cos() * ctx.s, None),
                              setup_context=_scaled_sin_setup)


@torch.library.custom_op("tl_fuzz::scale_", mutates_args=("x",))
def _scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


@_scale_.register_fake
def _(x, s):
    return None


@torch.library.custom_op("tl_fuzz::mix_", mutates_args=("h",))
def mix_(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    h.add_(y)
    return y * 2


@mix_.register_fake
def _(h, y):
    return torch.empty_like(y)


_fuzz_lib = torch.library.Library("tl_fuzz_def", "DEF")
_fuzz_lib.define("inc_(Tensor(a!) x, float step) -> Tensor(a!)")
_fuzz_lib.impl("inc_", lambda x, step: x.add_(step), "CompositeExplicitAutograd")
_fuzz_lib.impl("inc_", lambda x, step: x, "Meta")


# autograd.Functions (issue 9) whose forward writes a tensor it saves or returns (marked dirty
# where it is an input) and whose backward writes in place, including into its gradient.
class ScaleDirty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


class AddDirty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        x.add_(y)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, g


class SaveThenWrite(torch.autograd.Function):
    """Saves ``y`` and then writes it: PyTorch takes the saved version when
    ``forward`` returns, so the backward sees the written value."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        y.mul_(2)
        return y * 1

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


class GradInPlace(torch.autograd.Function):
    """The backward writes its incoming gradient."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        g.mul_(x)
        return g.mul_(2)


class SwishInplaceBackward(torch.autograd.Function):
    """Memory-saving swish: the backward reuses its saved buffers in place."""

    @staticmethod
    def forward(ctx, x):
        s = torch.sigmoid(x)
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        t = x * (1 - s)
        t.add_(1)
        return g * s.mul_(t)


class ShadowUpdate(torch.autograd.Function):
    """Writes an argument that needs no grad (a running average), unmarked, as
    batch-norm style Functions do."""

    @staticmethod
    def forward(ctx, x, shadow):
        shadow.mul_(0.5).add_(x.detach(), alpha=0.5)
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3, None


FUNCTIONS = {cls.__name__: cls for cls in (ScaleDirty, AddDirty, SaveThenWrite, GradInPlace,
                                            SwishInplaceBackward, ShadowUpdate)}


def check_against_eager(fn, shapes, executors, *, grad_mask=None):
    """Run ``fn`` in eager and jitted (with ``executors``) on equal fresh float64
    inputs of ``shapes`` (``grad_mask``: which require grad, default all);
    compare the outputs, the inputs afterwards and, when an output requires
    grad, the gradients of ``sum(outputs)``. Returns the jitted function."""
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(s, dtype=torch.float64, generator=g) for s in shapes]
    grad_mask = grad_mask or [True] * len(shapes)

    def fresh():
        return [b.clone().requires_grad_(m) for b, m in zip(base, grad_mask, strict=True)]
    ref, ours = fresh(), fresh()
    jfn = thunderlite.jit(fn) if executors is None else thunderlite.jit(fn, executors=executors)
    want, got = fn(*ref), jfn(*ours)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for w, h in zip(want, got, strict=True):
        torch.testing.assert_close(h, w)
        assert h.requires_grad == w.requires_grad
    if any(w.requires_grad for w in want):
        sum(w.sum() for w in want if w.requires_grad).backward()
        sum(h.sum() for h in got if h.requires_grad).backward()
    for r, o in zip(ref, ours, strict=True):
        torch.testing.assert_close(o.detach(), r.detach())
        torch.testing.assert_close(o.grad, r.grad)
    return jfn
