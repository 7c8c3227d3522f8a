"""A user ``torch.autograd.Function`` whose forward returns an input as it is,
or a view of it, keeps its own backward (it used to record nothing, so its
backward was silently dropped: a wrong gradient). Compared with eager, with the
default executors and with a reordering one."""
from __future__ import annotations

import pytest
import torch

import thunderlite


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.factor, None


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


class _Flip(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return y, x.view(x.shape)

    @staticmethod
    def backward(ctx, gy, gx):
        return -gx, 3 * gy


def _a(x, y):
    return (_ScaleGrad.apply(x, 0.25) * y).sum()


def _b(x, y):
    return (_Identity.apply(x) + y).pow(2).sum()


def _c(x, y):
    p, q = _Flip.apply(x, y)
    return (p * 5 + q.sin()).sum()


@pytest.mark.parametrize("executors", [None, ["torchcompile", "torch"]], ids=["default", "torchcompile"])
@pytest.mark.parametrize("fn", [_a, _b, _c], ids=["view_as", "return_input", "two_outputs"])
def test_function_returning_its_input_keeps_its_backward(fn, executors):
    if executors is not None:
        pytest.importorskip("torch._inductor")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True)
    xe, ye = (t.detach().clone().requires_grad_() for t in (x, y))
    got = thunderlite.jit(fn, executors=executors)(x, y)
    want = fn(xe, ye)
    torch.testing.assert_close(got, want)
    got.backward()
    want.backward()
    torch.testing.assert_close(x.grad, xe.grad)
    torch.testing.assert_close(y.grad, ye.grad)
