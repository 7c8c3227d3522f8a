"""ThunderFX takes nothing it cannot honour: a tensor hook on a value the graph
makes stays with thunderlite only in a graph it takes as one piece (its
backward applies the hook; a piece boundary would lose it); otherwise tensor
hooks, BackwardState, higher-order ops and calls the backend does not model
send the whole graph to the fallback (with the reason in the report), and a program eager refuses
raises as eager does, whichever fallback is configured. Every case is
compared against eager PyTorch."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch.utils.checkpoint import checkpoint

from thunderlite.dynamo import ThunderCompiler, last_traces, report, thunderfx

F64 = torch.float64
FALLBACKS = ["inductor", "eager"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _grads(fn, compiled, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(eager's gradient of x, the compiled function's), from equal inputs."""
    xe = x.detach().clone().requires_grad_()
    xc = x.detach().clone().requires_grad_()
    fn(xe).backward()
    compiled(xc).backward()
    return xe.grad, xc.grad


def _whole(compiled) -> list:
    """The pieces of every graph; asserts each graph went whole to the fallback."""
    graphs = compiled.thunder_compiler.graphs
    assert graphs, "dynamo handed the backend no graph"
    pieces = [p for g in graphs for p in g.pieces]
    assert all(p.whole and not p.thunder for p in pieces), report(compiled)
    assert len(pieces) == len(graphs), report(compiled)
    return pieces


# --- tensor hooks -----------------------------------------------------------------------------

def _hook_scales(x):
    h = x.sin()
    h.register_hook(lambda g: g * 3)
    return (h * h).sum()


def _hook_reads_forward_value(x):
    h = x.sin()
    h.register_hook(lambda g: g * h.detach())      # dynamo passes h into the hook's body
    return (h * x).sum()


@pytest.mark.parametrize("fallback", FALLBACKS)
@pytest.mark.parametrize("fn", [_hook_scales, _hook_reads_forward_value], ids=["scales", "reads_forward"])
def test_hook_on_intermediate_returning_a_grad_matches_eager(fn, fallback):
    x = torch.randn(5, dtype=F64)
    cf = thunderfx(fn, fallback=fallback)
    want, got = _grads(fn, cf, x)
    torch.testing.assert_close(got, want)
    (piece,) = _thunderlite_whole(cf)           # one piece: thunderlite's backward applies the hook
    assert "torch.ops.higher_order.register_hook" in piece.ops
    # later calls reuse it; the hook still applies
    want, got = _grads(fn, cf, x + 1)
    torch.testing.assert_close(got, want)


def _thunderlite_whole(compiled) -> list:
    """The pieces of every graph; asserts thunderlite took each graph as one piece."""
    pieces = [p for g in compiled.thunder_compiler.graphs for p in g.pieces]
    assert pieces and all(p.thunder and not p.whole for p in pieces), report(compiled)
    assert len(pieces) == len(compiled.thunder_compiler.graphs), report(compiled)
    return pieces


@pytest.mark.parametrize("fallback", FALLBACKS)
def test_hook_in_a_graph_that_would_be_split_goes_whole(fallback):
    """A piece boundary would lose the hook: a graph thunderlite cannot take
    whole (here: ``nonzero``'s data-dependent size) goes whole to the fallback."""
    def f(x):
        h = x.sin()
        h.register_hook(lambda g: g * 3)
        n = torch.nonzero(h > 0)
        return (h * h).sum() + n.shape[0]
    x = torch.randn(5, dtype=F64)
    old = torch._dynamo.config.capture_dynamic_output_shape_ops
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    try:
        cf = thunderfx(f, fallback=fallback)
        want, got = _grads(f, cf, x)
    finally:
        torch._dynamo.config.capture_dynamic_output_shape_ops = old
    torch.testing.assert_close(got, want)
    pieces = [p for g in cf.thunder_compiler.graphs for p in g.pieces if "torch.ops.higher_order.register_hook"
              in p.ops]
    assert pieces and all(p.whole and not p.thunder for p in pieces), report(cf)
    text = report(cf)
    assert f"[{fallback}]" in text and "whole graph to the fallback" in text
    assert "tensor hook" in text and "test_thunderfx_refusals.py" in text and "h.register_hook(" in text
    assert "the graph would be split" in text


@pytest.mark.parametrize("fallback", FALLBACKS)
def test_hook_on_intermediate_returning_none_sees_eagers_gradient(fallback):
    seen = torch.zeros(4, dtype=F64)

    def record(g):
        seen.copy_(g)                               # returns None: the gradient flows on unchanged

    def f(x):
        h = x.exp()
        h.register_hook(record)
        return (h * h.cos()).sum()
    x = torch.randn(4, dtype=F64)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    f(xe).backward()
    seen_eager = seen.clone()
    seen.zero_()
    cf = thunderfx(f, fallback=fallback)
    cf(xc).backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    torch.testing.assert_close(seen, seen_eager)    # the hook ran, on the gradient eager computes
    assert seen_eager.abs().sum() > 0
    _thunderlite_whole(cf)


def test_retain_grad_on_intermediate_matches_eager():
    """Dynamo (2.13) does not capture ``retain_grad`` (it runs the frame
    eagerly); whatever it hands the backend must not lose the retained grad."""
    def f(x):
        h = x * 2
        h.retain_grad()
        return (h * h.sin()).sum(), h
    x = torch.randn(3, dtype=F64)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    oe, he = f(xe)
    cf = thunderfx(f)
    oc, hc = cf(xc)
    torch.testing.assert_close(oc, oe)
    oe.backward()
    oc.backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    assert hc.grad is not None
    torch.testing.assert_close(hc.grad, he.grad)
    for g in cf.thunder_compiler.graphs:            # none today; if dynamo starts capturing it
        assert all(p.whole for p in g.pieces), report(cf)


@pytest.mark.parametrize("fallback", FALLBACKS)
def test_hook_on_leaf_input_matches_eager(fallback):
    """Dynamo registers a hook on an input outside the graph: the graph is
    thunderlite's, and autograd applies the hook to the gradient it returns."""
    def f(x):
        x.register_hook(lambda g: g * 3)
        return (x.sin() * x).sum()
    x = torch.randn(6, dtype=F64)
    cf = thunderfx(f, fallback=fallback)
    want, got = _grads(f, cf, x)
    torch.testing.assert_close(got, want)
    assert last_traces(cf) and not cf.thunder_compiler.splits(), report(cf)


@pytest.fixture
def _compiled_autograd():
    with torch._dynamo.config.patch(compiled_autograd=True):
        yield


@pytest.mark.parametrize("fallback", FALLBACKS)
def test_backward_state_and_compiled_autograd_graphs_go_whole(_compiled_autograd, fallback):
    """With compiled autograd a hook reaches the backend as a BackwardState
    input and a call registering it, and the backward as a graph of compiled
    autograd's ops: neither is split (the old splitter crashed on the former)."""
    def step(x):
        h = x * 2
        h.register_hook(lambda g: g * 3)
        (h * h.sin()).sum().backward()
        return x.grad
    x = torch.randn(3, dtype=F64)
    want = step(x.clone().requires_grad_())
    compiler = ThunderCompiler(fallback=fallback)
    got = torch.compile(step, backend=compiler)(x.clone().requires_grad_())
    torch.testing.assert_close(got, want)
    text = compiler.report()
    assert compiler.graphs and all(p.whole for g in compiler.graphs for p in g.pieces), text
    assert "BackwardState" in text and "compiled autograd" in text


# --- higher-order ops and calls the backend does not model --------------------------------------

class _Cube(torch.autograd.Function):
    """A backward eager would not derive (3x the true one): a lost Function shows."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 9 * g * x * x


def _custom_function(x):
    return _Cube.apply(x.sin()).sum()


def _checkpointed(x):
    return checkpoint(lambda t: t.sin().cos() * t, x, use_reentrant=False).sum()


@pytest.mark.parametrize("fallback", FALLBACKS)
@pytest.mark.parametrize("fn", [_custom_function, _checkpointed], ids=["autograd_function", "checkpoint"])
def test_higher_order_ops_send_the_graph_whole_with_the_reason(fn, fallback):
    x = torch.randn(5, dtype=F64)
    cf = thunderfx(fn, fallback=fallback)
    want, got = _grads(fn, cf, x)
    torch.testing.assert_close(got, want)
    _whole(cf)
    assert "higher-order op" in report(cf) and "test_thunderfx_refusals.py" in report(cf)


def _opaque_to_dynamo(t: torch.Tensor) -> torch.Tensor:
    return t.cos() + 1


def test_call_kept_opaque_by_dynamo_goes_whole():
    fn = torch._dynamo.allow_in_graph(_opaque_to_dynamo)

    def f(x):
        return fn(x.sin()) * 2
    x = torch.randn(4)
    cf = thunderfx(f, fallback="eager")
    torch.testing.assert_close(cf(x), f(x))
    _whole(cf)
    assert "_opaque_to_dynamo" in report(cf) and "not a torch op" in report(cf)


def _modeled(x, w):
    """Calls the allow-list must keep with thunderlite: ``.data`` writes under
    no_grad, autocast, detach, unbind, where, a tensor literal, size arithmetic."""
    with torch.no_grad():
        w.data.mul_(0.9).add_(x.data * 0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = (x @ x.t()).float()
    parts = torch.where(x > 0, x, 0.0).unbind(0)
    return (y.sum() + parts[0].sum() + x.detach().sin().sum() + torch.tensor([1.5]).sum()) * x.shape[0] + (w * x).sum()


def test_modeled_calls_stay_with_thunderlite():
    torch.manual_seed(0)
    x, w = torch.randn(3, 4), torch.randn(3, 4)
    xe, we = x.clone().requires_grad_(), w.clone()
    xc, wc = x.clone().requires_grad_(), w.clone()
    cf = thunderfx(_modeled)
    want, got = _modeled(xe, we), cf(xc, wc)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(wc, we)
    want.backward()
    got.backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    assert last_traces(cf) and not cf.thunder_compiler.splits(), report(cf)


# --- what eager refuses --------------------------------------------------------------------------

def _expand_add(x):
    return x.expand(3, -1).add_(1)


def _expand_mul_beside(x):
    y = x.expand(3, -1)
    return x.sin(), y.mul_(2)


@pytest.mark.parametrize("fallback", FALLBACKS)
@pytest.mark.parametrize("fn", [_expand_add, _expand_mul_beside], ids=["add_", "mul_beside"])
def test_write_into_expanded_tensor_raises_like_eager(fn, fallback):
    x = torch.randn(4)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        fn(x.clone())
    cf = thunderfx(fn, fallback=fallback)
    before = x.clone()
    for _ in range(2):                              # every call, not only the first
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor") as err:
            cf(x)
        torch.testing.assert_close(x, before)       # nothing was written
    assert "test_thunderfx_refusals.py" in str(err.value)     # thunderlite's copy of eager's error: the line
    pieces = [p for g in cf.thunder_compiler.graphs for p in g.pieces]
    assert pieces and all(p.thunder for p in pieces), report(cf)


@pytest.mark.parametrize("fallback", FALLBACKS)
def test_piece_thunderlite_refuses_but_eager_runs_goes_to_the_fallback(fallback, monkeypatch):
    """Eager decides a refused piece: here it runs (``t_``, made refused for the
    test: dynamo breaks the graph before anything thunderlite still refuses),
    so the fallback takes the piece."""
    from thunderlite.tests.test_thunderfx import _refuse_transpose_
    _refuse_transpose_(monkeypatch)

    def f(x):
        y = x + 1
        y.t_()
        return y * 2
    x = torch.randn(2, 3)
    cf = thunderfx(f, fallback=fallback)
    with pytest.warns(UserWarning, match="fallback"):
        torch.testing.assert_close(cf(x), f(x.clone()))
    x2 = torch.randn(2, 3)
    torch.testing.assert_close(cf(x2), f(x2.clone()))           # the fallback compiled on this call
    assert "thunderlite could not trace this piece" in report(cf)
    assert not any(p.thunder for g in cf.thunder_compiler.graphs for p in g.pieces)
