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
from thunderlite.transforms.functionalize import FUNCTIONALIZE_STAGE


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


FUNCTIONAL = [setitem_row, write_view_read_base, strided_slices_and_transpose, view_of_view_then_base_write,
              squeeze_and_select]


def write_into_argument(x, w):
    x.mul_(w)
    return x.sum()


def reshape_may_copy(x, w):
    y = (x * w).t()
    z = y.reshape(-1)           # a copy in eager (y is not contiguous): the write must not reach y
    z[2:4].sin_()
    return y, z


EAGER = [write_into_argument, reshape_may_copy]


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
    assert "prims.copy_" not in str(functional).split("def computation", 1)[1].replace("# ", "#")
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
    jfn = _run(write_into_argument, None)
    text = str(thunderlite.last_backward_traces(jfn)[0])
    assert "because of a write on a gradient path into x" in text and "test_functionalize.py:" in text
    text = str(next(t for t in thunderlite.last_traces(_run(reshape_may_copy, None)) if t.stage == EAGER_MODE_STAGE))
    assert "may copy instead of viewing" in text


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
