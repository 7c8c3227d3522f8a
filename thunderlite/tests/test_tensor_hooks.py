"""Tensor hooks, ``retain_grad`` and ``requires_grad_`` inside a jitted function
whose backward runs outside it (docs/architecture.md §9, "Tensor hooks"):
outputs, input gradients, the gradients each hook saw and how often it ran,
and retained ``.grad`` equal eager's, with the default executors,
torchcompile and a randomly reordering fusion executor, on two calls."""
from __future__ import annotations

import pytest
import torch

import thunderlite
from thunderlite.dynamo import thunderfx
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion

EXECUTORS = {"default": lambda: None, "torchcompile": lambda: ["torchcompile", "torch"],
             "reordering": lambda: [ShuffleFusion(1)]}


def _jit(fn, executors):
    exs = EXECUTORS[executors]()
    return thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=exs)


def _leaves(seed: int, *shapes):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]


def _loss(out):
    outs = out if isinstance(out, tuple) else (out,)
    return sum((o * (i + 1)).sum() for i, o in enumerate(outs) if isinstance(o, torch.Tensor))


def _check(make_fn, executors: str, *shapes, calls: int = 2):
    """``make_fn(log)`` -> the program; ``log`` is a list its hooks append to.
    Eager and the jit each get their own log; both must end equal."""
    elog, jlog = [], []
    efn, jfn = make_fn(elog), _jit(make_fn(jlog), executors)
    for seed in range(calls):
        ea, ja = _leaves(seed, *shapes), _leaves(seed, *shapes)
        eout, jout = efn(*ea), jfn(*ja)
        torch.testing.assert_close(jout, eout)
        _loss(eout).backward()
        _loss(jout).backward()
        for e, j in zip(ea, ja, strict=True):
            torch.testing.assert_close(j.grad, e.grad)
        assert len(jlog) == len(elog)
        for j, e in zip(jlog, elog, strict=True):
            torch.testing.assert_close(j, e)
    return jfn


def replacing_hook(log):
    def fn(x):
        h = x * 2
        h.register_hook(lambda g: g * 3)
        return h.sin()
    return fn


def hooks_in_order(log):
    def fn(x):
        h = x.exp()
        h.register_hook(lambda g: g + 1)
        h.register_hook(lambda g: None)
        h.register_hook(lambda g: g * 3)            # sees (g + 1): order matters
        h.register_hook(lambda g: log.append(g.detach().clone()))
        return h.cos()
    return fn


def total_gradient_once(log):
    def fn(x, w):
        h = x * w
        h.register_hook(lambda g: log.append(g.detach().clone()))
        a = h.sin()
        b = (h * h).sum()
        return a, b, h               # h reached three ways: its hook runs once, with the sum
    return fn


def hook_reading_a_traced_tensor(log):
    def fn(x):
        h = x.tanh()
        s = x * 0.5
        h.register_hook(lambda g: g * s.detach() + 1)
        return (h * h).sum()
    return fn


def opaque_hook_reading_a_traced_tensor(log):
    def fn(x):
        h = x.tanh()
        s = x * 0.5
        h.register_hook(lambda g: log.append(s.detach().clone()) or g * s)
        return (h * h).sum()
    return fn


def hook_closing_over_state(log):
    calls = {"n": 0}

    def count(g):
        calls["n"] += 1
        log.append(torch.tensor(float(calls["n"])))
        return g * calls["n"]        # the counter changes at each backward, as in eager

    def fn(x):
        h = x + 1
        h.register_hook(count)
        return h.exp()
    return fn


def hook_then_inplace_write(log):
    def fn(x):
        h = x * 2
        h.register_hook(lambda g: log.append(g.detach().clone()) or g * 3)
        h.mul_(x)                   # eager: the hook sees the gradient of h before the write
        return h.sin()
    return fn


def hook_then_shape_change(log):
    def fn(x):
        h = x * 2
        h.register_hook(lambda g: log.append(g.detach().clone()) or g * 3)
        h.t_()
        return (h * torch.arange(6.0, dtype=torch.float64).view(3, 2)).sin()
    return fn


def hook_on_input(log):
    def fn(x, w):
        x.register_hook(lambda g: log.append(g.detach().clone()) or g * 2)
        return (x * w).sum(), w.sin()
    return fn


def hook_on_output_and_input(log):
    def fn(x):
        y = x.sigmoid()
        y.register_hook(lambda g: g - 0.25)
        x.register_hook(lambda g: g * 0.5)
        return y
    return fn


PROGRAMS = {
    "replacing_hook": (replacing_hook, [(3,)]),
    "hooks_in_order": (hooks_in_order, [(4,)]),
    "total_gradient_once": (total_gradient_once, [(3,), (3,)]),
    "hook_reading_a_traced_tensor": (hook_reading_a_traced_tensor, [(5,)]),
    "hook_closing_over_state": (hook_closing_over_state, [(3,)]),
    "opaque_hook_reading_a_traced_tensor": (opaque_hook_reading_a_traced_tensor, [(4,)]),
    "hook_on_input": (hook_on_input, [(3,), (3,)]),
    "hook_then_inplace_write": (hook_then_inplace_write, [(3,)]),
    "hook_then_shape_change": (hook_then_shape_change, [(2, 3)]),
    "hook_on_output_and_input": (hook_on_output_and_input, [(2, 3)]),
}


@pytest.mark.parametrize("executors", sorted(EXECUTORS))
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_hooks_match_eager(name, executors):
    make_fn, shapes = PROGRAMS[name]
    _check(make_fn, executors, *shapes)


@pytest.mark.parametrize("make_fn,shape,traced", [
    (replacing_hook, (3,), True), (hook_reading_a_traced_tensor, (5,), True),
    (hook_closing_over_state, (3,), False), (opaque_hook_reading_a_traced_tensor, (4,), False)])
def test_tensor_math_hooks_are_traced_others_called_at_run_time(make_fn, shape, traced):
    jfn = _check(make_fn, "default", shape, calls=1)
    text = str(thunderlite.last_backward_traces(jfn)[-1])
    assert ("call_tensor_hook" not in text) == traced


def test_hook_on_input_stays_on_the_callers_tensor_like_eager():
    """Eager registers the hook on the caller's tensor: it fires for later
    backwards too, and each call adds one more."""
    def make(log):
        def fn(x):
            x.register_hook(lambda g: log.append(1))
            return x * 2
        return fn
    elog, jlog = [], []
    efn, jfn = make(elog), thunderlite.jit(make(jlog))
    ex, jx = _leaves(0, (3,))[0], _leaves(0, (3,))[0]
    for _ in range(2):
        efn(ex).sum().backward()
        jfn(jx).sum().backward()
    (ex * 3).sum().backward()
    (jx * 3).sum().backward()
    assert len(jlog) == len(elog) == 5
    torch.testing.assert_close(jx.grad, ex.grad)


# --- retain_grad and requires_grad_ ------------------------------------------------------------

@pytest.mark.parametrize("executors", sorted(EXECUTORS))
def test_retain_grad_on_returned_intermediate(executors):
    def fn(x):
        h = x * 2
        h.retain_grad()
        return h, h.sin()           # h.grad: both uses, as in eager
    jfn = _jit(fn, executors)
    for seed in range(2):
        ex, jx = _leaves(seed, (4,))[0], _leaves(seed, (4,))[0]
        (eh, ey), (jh, jy) = fn(ex), jfn(jx)
        (eh.sum() + ey.sum() * 3).backward()
        (jh.sum() + jy.sum() * 3).backward()
        torch.testing.assert_close(jh.grad, eh.grad)
        torch.testing.assert_close(jx.grad, ex.grad)


def test_retain_grad_on_stored_intermediate():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3).double()
            self.h = None

        def forward(self, x):
            h = self.lin(x)
            h.retain_grad()
            self.h = h
            return h.relu().sum()
    torch.manual_seed(0)
    em = M()
    jm = M()
    jm.load_state_dict(em.state_dict())
    jf = thunderlite.jit(jm)
    for seed in range(2):
        x = _leaves(seed, (2, 3))[0].detach()
        em(x).backward()
        jf(x).backward()
        torch.testing.assert_close(jm.h.grad, em.h.grad)
        torch.testing.assert_close(jm.lin.weight.grad, em.lin.weight.grad)


def test_retain_grad_on_inputs():
    def fn(x, y):
        x.retain_grad()             # a leaf: nothing to do, as in eager
        y.retain_grad()             # not a leaf of the caller: its .grad is kept
        return (x * y).sum()
    a = _leaves(0, (3,))[0]
    ex, jx = _leaves(1, (3,))[0], _leaves(1, (3,))[0]
    ey, jy = a * 2, a * 2
    fn(ex, ey).backward()
    thunderlite.jit(fn)(jx, jy).backward()
    torch.testing.assert_close(jy.grad, ey.grad)
    torch.testing.assert_close(jx.grad, ex.grad)


@pytest.mark.parametrize("executors", sorted(EXECUTORS))
def test_requires_grad_on_a_fresh_tensor_and_an_input(executors):
    def fresh(x):
        w = torch.ones(3, dtype=torch.float64).requires_grad_()
        w.register_hook(lambda g: g * 2)
        return (x * w).sum(), w

    def on_input(x, y):
        y.requires_grad_()
        return (x * y).sum()
    ex, jx = _leaves(0, (3,))[0], _leaves(0, (3,))[0]
    (eo, ew), (jo, jw) = fresh(ex), _jit(fresh, executors)(jx)
    eo.backward()
    jo.backward()
    torch.testing.assert_close(jw.grad, ew.grad)
    torch.testing.assert_close(jx.grad, ex.grad)
    ey, jy = torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    ex, jx = _leaves(1, (3,))[0], _leaves(1, (3,))[0]
    on_input(ex, ey).backward()
    _jit(on_input, executors)(jx, jy).backward()
    assert jy.requires_grad and ey.requires_grad
    torch.testing.assert_close(jy.grad, ey.grad)


# --- errors ---------------------------------------------------------------------------------------

def test_hook_on_a_tensor_without_grad_raises_like_eager():
    def fn(x):
        h = x * 2
        h.register_hook(lambda g: g)
        return h
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        fn(torch.randn(3))
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        thunderlite.jit(fn)(torch.randn(3))


def test_removing_a_hook_inside_is_refused():
    def fn(x):
        h = x * 2
        handle = h.register_hook(lambda g: g)
        handle.remove()
        return h
    with pytest.raises(NotImplementedError, match="removing a tensor hook"):
        thunderlite.jit(fn)(torch.randn(3, requires_grad=True))


# --- ThunderFX: graphs with hooks go whole to the fallback, results equal eager ------------------

def test_thunderfx_hooks_and_retain_grad_match_eager():
    torch._dynamo.reset()
    seen_e, seen_c = [], []

    def make(seen):
        def f(x):
            h = x.sin()
            h.register_hook(lambda g: seen.append(1) or g * 2)
            h.retain_grad()
            return h, (h * h).sum()
        return f
    ex, cx = _leaves(0, (3,))[0], _leaves(0, (3,))[0]
    eh, eo = make(seen_e)(ex)
    ch, co = thunderfx(make(seen_c))(cx)
    (eh.sum() + eo).backward()
    (ch.sum() + co).backward()
    torch.testing.assert_close(cx.grad, ex.grad)
    torch.testing.assert_close(ch.grad, eh.grad)
    assert len(seen_c) == len(seen_e) == 1
    torch._dynamo.reset()


def test_traced_hook_reading_a_tensor_written_later_is_refused_with_the_line():
    def fn(x):
        h = x * 2
        s = x * 0.5
        h.register_hook(lambda g: g * s)
        s.add_(1)                   # eager's hook would read s as it is after this write
        return h.sin() + s
    with pytest.raises(NotImplementedError, match=r"registered at .*test_tensor_hooks.py:\d+ .*h\.register_hook"):
        thunderlite.jit(fn)(torch.randn(3, requires_grad=True))


@pytest.mark.parametrize("on_input", [False, True])
def test_hook_holding_a_list_argument_is_refused_with_the_line(on_input):
    """The program sees a list argument as a copy, and a hook made while
    tracing serves every call: eager's would fill each call's own list."""
    def fn(x, log):
        h = x if on_input else x * 2
        h.register_hook(lambda g: log.append(g))
        return h.sin()
    with pytest.raises(NotImplementedError, match=r"h\.register_hook.*list or dict argument.*'log'"):
        thunderlite.jit(fn)(torch.randn(3, requires_grad=True), [])


def test_hook_holding_an_object_made_in_the_call_is_refused():
    def fn(x):
        grads = []
        h = x * 2
        h.register_hook(grads.append)
        return h.sin(), grads
    with pytest.raises(NotImplementedError, match="list made during the call"):
        thunderlite.jit(fn)(torch.randn(3, requires_grad=True))


def test_hook_that_is_a_method_of_a_module_argument():
    class Saver(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.seen = []

        def save(self, g):
            self.seen.append(g.detach().clone())

    def fn(x, saver):
        h = x.exp()
        h.register_hook(saver.save)
        return h.sum()
    es, js = Saver(), Saver()
    ex, jx = _leaves(0, (3,))[0], _leaves(0, (3,))[0]
    jfn = thunderlite.jit(fn)
    for _ in range(2):
        fn(ex, es).backward()
        jfn(jx, js).backward()
    assert len(js.seen) == len(es.seen) == 2
    for a, b in zip(js.seen, es.seen, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("executors", sorted(EXECUTORS))
def test_hooks_reading_traced_tensors_in_eager_mode(executors):
    """``retain_grad`` of an intermediate runs the program in eager mode: the
    hooks are registered on the real tensors, with the real values they read."""
    def make(log):
        def fn(x):
            h = x.tanh()
            s = x * 0.5
            h.retain_grad()
            h.register_hook(lambda g: g * s.detach())
            h.register_hook(lambda g: log.append(s.detach().clone()) or g + s.detach())
            return h, (h * h).sum()
        return fn
    elog, jlog = [], []
    ex, jx = _leaves(0, (4,))[0], _leaves(0, (4,))[0]
    (eh, eo), (jh, jo) = make(elog)(ex), _jit(make(jlog), executors)(jx)
    (eh.sum() + eo).backward()
    (jh.sum() + jo).backward()
    torch.testing.assert_close(jx.grad, ex.grad)
    torch.testing.assert_close(jh.grad, eh.grad)
    assert len(jlog) == len(elog) == 1
    torch.testing.assert_close(jlog[0], elog[0])
