"""Writes autograd does not record, differentiated by thunderlite (docs/architecture.md §9):
writes under ``torch.no_grad()`` and through ``detach()``/``.data`` aliases change a
tensor's values, not its history. functionalize.py gives them a functional form
(``overwrite_values``: the new values, the whole gradient to the old history),
values made under no_grad are constants, and an input written only that way is
written back without autograd recording (a parameter stays a leaf). Each program
and module is compared with eager (outputs and their ``requires_grad``, inputs
and module state after the call, gradients), with the default executors, a
randomly reordering one and torchcompile, and must not fall back to eager mode.

Where eager's backward would read a tensor such a write changed after autograd
saved it (eager raises "modified by an inplace operation"; through ``.data`` it
differentiates with the new values), the program keeps eager mode, which does
exactly that."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thunderlite
from thunderlite.executors.autograd_function import EAGER_MODE_STAGE
from thunderlite.executors.registry import get_executor
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion
from thunderlite.transforms.aliasing.functionalize import FUNCTIONALIZE_STAGE


def _executors(name):
    if name == "shuffle":
        return [ShuffleFusion(5), "torch"]
    if name == "torchcompile":
        ok, reason = get_executor("torchcompile").is_available()
        if not ok:
            pytest.skip(f"torchcompile executor unavailable: {reason}")
        return ["torchcompile", "torch"]
    return None


EXECUTORS = [None, "shuffle", "torchcompile"]
IDS = ["default", "shuffle", "torchcompile"]


def _jit(fn, exs):
    exs = _executors(exs)
    return thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=exs)


def _assert_differentiated(jfn):
    stages = [t.stage for t in thunderlite.last_traces(jfn)]
    assert EAGER_MODE_STAGE not in stages, str(thunderlite.last_traces(jfn)[-1])
    bwd = thunderlite.last_backward_traces(jfn)
    assert bwd and bwd[0].stage != EAGER_MODE_STAGE and bwd[-1].bound_symbols


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _loss(outputs, extra=()):
    terms = [(t * (i + 1)).sum() for i, t in enumerate(list(outputs) + list(extra))
             if isinstance(t, torch.Tensor) and t.requires_grad]
    return sum(terms)


# --- programs ------------------------------------------------------------------------------------

def nograd_write_into_intermediate(x, w, a):
    h = x * w
    with torch.no_grad():
        h.mul_(0.9)                     # EMA-style decay: h keeps its history, values change
    return h.exp(), h


def nograd_write_into_view(x, w, a):
    h = x * w
    v = h[1:]
    with torch.no_grad():
        h[0].mul_(0.5)
        v.add_(1.0)
    return h.exp(), v * 2


def nograd_value_and_view_write(x, w, a):
    h = x * w
    v = h[1:]
    with torch.no_grad():
        s = h * 10                      # a constant for autodiff
    v.add_(1)
    return h * s, s


def nograd_view_made_inside(x, w, a):
    h = x * w
    with torch.no_grad():
        v = h[0]                        # a view made under no_grad: no gradient, ever
        h.mul_(0.5)
        s = v * 2
    return s, h.exp()


def detach_made_under_no_grad_read_after(x, w, a):
    h = x * w
    v = h[1:]
    with torch.no_grad():
        d = h.detach()                  # not a view autograd guards: reading it after the write is fine
        d.mul_(0.5)
    v.add_(w[0])
    return d.sum(0) * w, h.exp()


def detach_write(x, w, a):
    h = x + w                           # add saves nothing
    h.detach().mul_(0.9)
    return h.sin()


def data_write(x, w, a):
    h = x * w                           # mul saves x and w, not h
    h.data.add_(0.5)
    return h.cos(), h


def detach_slice_write_with_views(x, w, a):
    h = (x * w).t()
    v = h[1:]
    h.detach()[0].fill_(3.0)
    d = h.detach()
    d[:, 1:].mul_(2)
    return h.cos(), v * 2, d


def nograd_write_into_leaf_argument(x, w, a):
    with torch.no_grad():
        w.mul_(0.9)                     # a parameter update: w stays a leaf
    return (x * w).sum()


def detach_write_into_argument_return_view(x, w, a):
    w.detach()[0].mul_(2)
    return (x * w).sum(), w[1]


def data_write_into_non_leaf_argument(x, w, a):
    a.data.add_(1.0)
    return a * w, a


def detach_write_of_grad_value(x, w, a):
    m = (x * w).mean(0)
    a.detach().mul_(0.9).add_(m * 0.1)  # the alias would carry m's history: it is never read
    return (x * w - m).sum(), a


def grad_value_only_through_alias(x, w, a):
    a.detach().add_(w * 2)              # w reaches nothing eager differentiates: its gradient stays None
    return a.exp()


def detach_and_recorded_view_writes(x, w, a):
    h = x * w
    d = h.detach()
    h[0].mul_(w[0])                     # recorded, into a view: functionalized
    d[1:].add_(1.0)                     # through the alias: values only
    return h.exp(), d * 2


def read_saves_nothing_then_nograd_write(x, w, a):
    y = a + 1.0                         # add saves nothing: eager's backward does not check a
    with torch.no_grad():
        a.mul_(2)
    return y * w, a


FUNCTIONAL = [nograd_write_into_intermediate, nograd_write_into_view, nograd_value_and_view_write,
              nograd_view_made_inside, detach_made_under_no_grad_read_after, detach_write, data_write,
              detach_slice_write_with_views,
              nograd_write_into_leaf_argument, detach_write_into_argument_return_view,
              data_write_into_non_leaf_argument, detach_write_of_grad_value, grad_value_only_through_alias,
              detach_and_recorded_view_writes,
              read_saves_nothing_then_nograd_write]
# writes only through aliases (into intermediates or inputs), off every gradient path: the functional forward keeps
# them in place (the alias barrier's VJP is the identity), no functionalization needed
IN_PLACE = [detach_write, data_write, detach_slice_write_with_views, detach_write_into_argument_return_view,
            data_write_into_non_leaf_argument]


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 3, generator=g)
    w = torch.randn(3, 3, generator=g).requires_grad_()
    leaf = torch.randn(3, 3, generator=g).requires_grad_()
    return x, w, leaf


def _args(x, w, leaf):
    return x.clone(), w.detach().clone().requires_grad_(), leaf.detach().clone().requires_grad_()


@pytest.mark.parametrize("exs", EXECUTORS, ids=IDS)
@pytest.mark.parametrize("fn", FUNCTIONAL, ids=lambda f: f.__name__)
def test_unrecorded_writes_are_differentiated(fn, exs):
    jfn = _jit(fn, exs)
    for seed in range(2):                        # the second call runs the cached program
        x, w, leaf = _args(*_inputs(seed))
        xr, wr, leaf_r = _args(*_inputs(seed))
        a, ar = leaf * 1.5, leaf_r * 1.5          # a non-leaf argument
        out, ref = _tuple(jfn(x, w, a)), _tuple(fn(xr, wr, ar))
        _assert_differentiated(jfn)
        torch.testing.assert_close(out, ref)
        assert [t.requires_grad for t in out] == [t.requires_grad for t in ref]
        torch.testing.assert_close((x, w, a), (xr, wr, ar))
        assert (w.is_leaf, w.requires_grad) == (wr.is_leaf, wr.requires_grad) == (True, True)
        _loss(out, (a,)).backward()
        _loss(ref, (ar,)).backward()
        assert (w.grad is None) == (wr.grad is None)
        torch.testing.assert_close((w.grad, leaf.grad), (wr.grad, leaf_r.grad))
    if fn not in IN_PLACE:
        assert FUNCTIONALIZE_STAGE in [t.stage for t in thunderlite.last_traces(jfn)]


def test_overwrite_values_in_the_functional_trace():
    """The no_grad write is ``overwrite_values`` in the forward, and its
    gradient is the identity in the backward (no mul by 0.9 there)."""
    jfn = thunderlite.jit(nograd_write_into_intermediate)
    x, w, leaf = _inputs(0)
    jfn(x, w, leaf * 1.0)
    functional = next(t for t in thunderlite.last_traces(jfn) if t.stage == FUNCTIONALIZE_STAGE)
    assert "functionalize.overwrite_values" in str(functional)
    assert "0.9" not in str(thunderlite.last_backward_traces(jfn)[-1])


# --- eager raises (or reads new values): eager mode, named --------------------------------------

def saved_then_detach_write(x, w, a):
    y = (x * w).exp()                   # exp saves its output
    y.detach().mul_(2)
    return y


def saved_then_nograd_write(x, w, a):
    y = a * w                           # mul saves a (w requires grad) and w
    with torch.no_grad():
        a.mul_(2)
    return y


def saved_then_data_write(x, w, a):
    y = (x * w).exp()
    y.data.mul_(2)                      # .data has its own version counter: eager reads the new values
    return y


@pytest.mark.parametrize("exs", [None, "shuffle"], ids=["default", "shuffle"])
@pytest.mark.parametrize("fn", [saved_then_detach_write, saved_then_nograd_write, saved_then_data_write],
                         ids=lambda f: f.__name__)
def test_write_into_saved_tensor_keeps_eager_mode(fn, exs):
    jfn = _jit(fn, exs)
    x, w, leaf = _args(*_inputs(0))
    xr, wr, leaf_r = _args(*_inputs(0))
    out, ref = jfn(x, w, leaf * 1.5), fn(xr, wr, leaf_r * 1.5)
    torch.testing.assert_close(out, ref)
    named = [t for t in thunderlite.last_traces(jfn) if t.stage == EAGER_MODE_STAGE]
    assert named and "which eager saved for the backward of" in str(named[0])
    assert "test_functionalize_nograd.py:" in str(named[0])
    if fn is saved_then_data_write:
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close((w.grad, leaf.grad), (wr.grad, leaf_r.grad))
        return
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        ref.sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def _view_made_under_no_grad_then_recorded_write(x, w, a):
    h = x * w
    with torch.no_grad():
        v = h[0]
    h.mul_(w)
    return v * 2, h


def _view_made_under_no_grad_then_unrecorded_write(x, w, a):
    h = x * w
    with torch.no_grad():
        v = h[0]
        h.mul_(0.5)
    return v * 2, h


@pytest.mark.parametrize("fn", [_view_made_under_no_grad_then_recorded_write,
                                _view_made_under_no_grad_then_unrecorded_write], ids=["recorded", "no_grad"])
def test_view_made_under_no_grad_read_after_a_write_raises_as_eager(fn):
    """Eager forbids reading (with grad mode on) a view made under no_grad of a
    tensor requiring grad once its base was written: eager mode replays the
    program and raises it."""
    x, w, leaf = _args(*_inputs(0))
    with pytest.raises(RuntimeError, match="view was created in no_grad mode"):
        fn(x, w, leaf * 1.0)
    jfn = thunderlite.jit(fn)
    with pytest.raises(RuntimeError, match="view was created in no_grad mode"):
        jfn(x, w, leaf * 1.0)


def test_grad_value_written_through_detach_then_read_keeps_eager_mode():
    """Eager gives the alias the written value's history: reading it is not functionalized."""
    def f(x, w, a):
        d = a.detach()
        d.add_(x * w)
        return d * 2, a
    jfn = thunderlite.jit(f)
    x, w, leaf = _args(*_inputs(0))
    xr, wr, leaf_r = _args(*_inputs(0))
    out, ref = jfn(x, w, leaf * 1.5), f(xr, wr, leaf_r * 1.5)
    torch.testing.assert_close(out, ref)
    assert [t.requires_grad for t in out] == [t.requires_grad for t in ref] == [True, True]
    named = [t for t in thunderlite.last_traces(jfn) if t.stage == EAGER_MODE_STAGE]
    assert named and "reads a detach()/.data alias" in str(named[0])
    _loss(out).backward()
    _loss(ref).backward()
    torch.testing.assert_close((w.grad, leaf.grad), (wr.grad, leaf_r.grad))


# --- modules: parameters and buffers -------------------------------------------------------------

class EmaInForward(nn.Module):
    """An EMA of the layer's weight, updated under no_grad inside forward, then read."""
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("ema", self.lin.weight.detach().clone() * 0.5)

    def forward(self, x):
        out = self.lin(x)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(self.lin.weight, alpha=0.1)
        return out, F.linear(x, self.ema)


class TargetNetwork(nn.Module):
    """A target network's parameters (requiring grad) updated through detach()."""
    def __init__(self):
        super().__init__()
        self.online, self.target = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x):
        for p, q in zip(self.target.parameters(), self.online.parameters(), strict=True):
            p.detach().mul_(0.9).add_(q.detach(), alpha=0.1)
        return self.online(x), self.target(x).tanh()


class RunningStats(nn.Module):
    """BatchNorm-like running statistics through ``.detach()`` (the batch mean requires grad)."""
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4))
        self.register_buffer("running_mean", torch.zeros(4))
        self.register_buffer("running_var", torch.ones(4))

    def forward(self, x):
        mean, var = x.mean(0), x.var(0)
        self.running_mean.detach().mul_(0.9).add_(mean * 0.1)
        self.running_var.detach().mul_(0.9).add_(var.detach() * 0.1)
        return (x - mean) / (var + 1e-5).sqrt() * self.weight


class DataDecay(nn.Module):
    """Weight decay through ``p.data`` before the layer runs."""
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        for p in self.lin.parameters():
            p.data.mul_(0.99)
        return self.lin(x).relu()


class ShadowUnderNoGrad(nn.Module):
    """Shadow parameters and a weight update under ``torch.no_grad()`` inside forward."""
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("shadow", torch.zeros(3, 4))

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.mul_(0.999)
            self.shadow.mul_(0.5).add_(self.lin.weight * 0.5)
        out = self.lin(x).sigmoid()
        with torch.no_grad():
            self.shadow[0].add_(out.mean(0).sum())
        return out, self.shadow * 2


MODULES = [EmaInForward, TargetNetwork, RunningStats, DataDecay, ShadowUnderNoGrad]


@pytest.mark.parametrize("exs", EXECUTORS, ids=IDS)
@pytest.mark.parametrize("make", MODULES, ids=lambda m: m.__name__)
def test_module_state_updates_are_differentiated(make, exs):
    torch.manual_seed(0)
    ours = make()
    ref = copy.deepcopy(ours)
    jm = _jit(ours, exs)
    for step in range(3):
        leaf = torch.randn(5, 4, generator=torch.Generator().manual_seed(step), requires_grad=True)
        leaf_r = leaf.detach().clone().requires_grad_()
        x, xr = leaf * 1.0, leaf_r * 1.0
        out, want = _tuple(jm(x)), _tuple(ref(xr))
        _assert_differentiated(jm)
        torch.testing.assert_close(out, want)
        assert [t.requires_grad for t in out] == [t.requires_grad for t in want]
        _loss(out).backward()
        _loss(want).backward()
        torch.testing.assert_close(leaf.grad, leaf_r.grad)
        for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
            assert a.is_leaf
            torch.testing.assert_close(a, b, msg=lambda m, n=n: f"{n}: {m}")
            torch.testing.assert_close(a.grad, b.grad, msg=lambda m, n=n: f"{n} grad: {m}")
        for (n, a), b in zip(ours.named_buffers(), ref.buffers(), strict=True):
            torch.testing.assert_close(a, b, msg=lambda m, n=n: f"{n}: {m}")
