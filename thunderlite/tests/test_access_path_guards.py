"""Single constructs of the access-path probe, each pinned by its own test: what
thunderlite refuses by line because a trace cannot replay it (iterators kept
from outside, Python random draws and clocks, attributes set on a tensor, changes
to big containers), and the library state it leaves alone. The everyday programs
are in test_access_paths_outside.py."""
from __future__ import annotations

import copy
import itertools
import math
import types

import pytest
import torch
import torch.nn as nn

import thunderlite


def test_a_tensor_computed_natively_from_real_ones_is_refused_at_the_return():
    """``sum()`` over a container the program holds no copy of (a list longer
    than the 64 items the jit copies) adds the real tensors in C: the result is
    neither an input nor a trace value, so returning or storing it is refused
    (it used to be returned as the stale trace-time constant on every call)."""
    st = types.SimpleNamespace(window=[torch.ones(2) for _ in range(70)])

    def f(s):
        return sum(s.window)
    with pytest.raises(RuntimeError, match=r"cannot tell where a tensor \(\(2,\), torch.float32\) comes from: it "
                                           r"was returned by the program"):
        thunderlite.jit(f)(st)

    def g(s, x):
        s.total = sum(s.window)
        return x
    with pytest.raises(RuntimeError, match="it was stored where it outlives the call"):
        thunderlite.jit(g)(st, torch.ones(2))
    assert not hasattr(st, "total")


def test_deepcopy_of_a_tensor_is_a_new_tensor():
    """``copy.deepcopy(t)`` inside the program is a new leaf with ``t``'s values
    (it used to rebuild the proxy under ``t``'s own name: writes to the copy
    landed in the caller's tensor)."""
    def f(w):
        c = copy.deepcopy(w)
        c.mul_(3)
        return c, copy.copy(w)
    w = torch.ones(2)
    c, d = thunderlite.jit(f)(w)
    assert torch.equal(w, torch.ones(2)) and torch.equal(c, torch.full((2,), 3.0)) and torch.equal(d, w)

    def g(w):       # eager refuses to deepcopy a tensor with autograd history
        return copy.deepcopy(w * 2)
    with pytest.raises(RuntimeError, match="Only Tensors created explicitly by the user"):
        thunderlite.jit(g)(torch.ones(2, requires_grad=True))


def test_a_big_container_is_length_guarded_and_its_in_place_changes_refused():
    """Containers over 64 items are not copied: their length is guarded (a list
    grown between calls is read afresh) and changing one in place inside the
    program is refused by line (done while tracing, it would happen once)."""
    st = types.SimpleNamespace(big=[torch.ones(1) for _ in range(70)])

    def f(s, x):
        return x * len(s.big)
    jf, x = thunderlite.jit(f), torch.ones(2)
    torch.testing.assert_close(jf(st, x), f(st, x))
    st.big.append(torch.ones(1))
    torch.testing.assert_close(jf(st, x), f(st, x))

    def g(s, x):
        s.big.append(x)
        return x
    with pytest.raises(RuntimeError, match=r"does not trace changes to a list of 71 items .*list.append at .*"
                                           r"s.big.append\(x\)"):
        thunderlite.jit(g)(st, x)
    assert len(st.big) == 71


@pytest.mark.parametrize("kind", ["generator", "cycle", "count", "list_iterator", "argument"])
def test_an_iterator_kept_from_outside_the_call_is_refused(kind):
    """An iterator the program reads from outside the call (``next(self.gen)``
    over a module container, ``itertools.cycle``/``count``) would be advanced
    once, while tracing: every later call replayed that one step's item (a
    silent wrong answer). It is refused by line, before it is advanced."""
    torch.manual_seed(0)
    ps = nn.ParameterList([nn.Parameter(torch.full((2,), float(i))) for i in range(3)])
    made = {"generator": lambda: iter(ps), "cycle": lambda: itertools.cycle([1.0, 2.0]),
            "count": itertools.count, "list_iterator": lambda: iter([1.0, 2.0]), "argument": lambda: iter([1.0])}
    st = types.SimpleNamespace(it=made[kind]())
    if kind == "argument":
        with pytest.raises(RuntimeError, match="does not trace an iterator passed in .list_iterator, argument 0"):
            thunderlite.jit(lambda it, x: x * next(it))(st.it, torch.ones(2))
        assert next(st.it) == 1.0
        return

    def f(s, x):
        return x * next(s.it)
    with pytest.raises(RuntimeError, match=r"does not trace an iterator kept from outside the call .* argument "
                                           r"0.it\) at .*return x \* next\(s.it\)"):
        thunderlite.jit(f)(st, torch.ones(2))
    first = next(st.it)          # not advanced by the refused call
    assert first is ps[0] if kind == "generator" else first in (0, 1.0)


def test_python_random_draws_are_refused():
    """``random.random()``/``random.uniform`` draw from Python's generator, which
    the trace cannot replay: drawn once while tracing, every call reused that
    number (a silent wrong answer); refused naming the user's line."""
    import random

    def f(x):
        if random.uniform(0, 1) < 0.5:        # stochastic depth written with Python's random
            return x * 2
        return x
    with pytest.raises(RuntimeError, match=r"does not trace Python's random module: random.random at "
                                           r".*test_access_path_guards.py:\d+: if random.uniform\(0, 1\) < 0.5"):
        thunderlite.jit(f)(torch.ones(2))


def test_a_library_counter_advanced_while_tracing_is_not_refused():
    """torch's own ``AUTOGRAD_FUNCTION_COUNTER`` (an ``itertools.count``) is
    advanced when a ``torch.autograd.Function`` class is made, as
    ``torch.masked`` does inside its ops: library state, not the program's
    iterator, so the refusal above does not apply to it."""
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def f(x, m):
        class Inner(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                return a + 1

            @staticmethod
            def backward(ctx, g):
                return g
        return Scale.apply(Inner.apply(x)), torch.masked.sum(x, 0, mask=m)

    x = torch.randn(3, 4, requires_grad=True)
    m = torch.rand(3, 4) > 0.3
    jf = thunderlite.jit(f)
    for _ in range(2):
        got, want = jf(x, m), f(x, m)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
        gx, = torch.autograd.grad(got[0].sum() + got[1].sum(), x)
        wx, = torch.autograd.grad(want[0].sum() + want[1].sum(), x)
        torch.testing.assert_close(gx, wx)


def test_value_methods_of_an_item_number_need_its_value():
    """``float.is_integer()`` and ``math.isclose`` on an ``.item()`` number answer
    from its value, unknown while tracing: the data-dependence error names the
    user's line (as ``bool()`` of it does), never an internal AttributeError;
    by default the program splits there."""
    from thunderlite.core.proxies import DataDependentError

    def f(x):
        v = x.sum().item()
        if v.is_integer():
            return x
        return x * 2

    def g(x):
        v = x.sum().item()
        if math.isclose(v, 2.0):
            return x
        return x * 2
    with pytest.raises(DataDependentError, match=r"\.is_integer\(\) needs its value.*"
                                                 r"test_access_path_guards.py:\d+: if v.is_integer\(\)"):
        thunderlite.jit(f, splits=False)(torch.ones(2))
    with pytest.raises(DataDependentError, match=r"needs its value.*"
                                                 r"test_access_path_guards.py:\d+: if math.isclose\(v, 2.0\)"):
        thunderlite.jit(g, splits=False)(torch.ones(2))
    for fn in (f, g):       # by default the program splits there
        jfn = thunderlite.jit(fn)
        for x in (torch.ones(2), torch.full((2,), 0.75), torch.ones(2)):
            torch.testing.assert_close(jfn(x), fn(x))


@pytest.mark.parametrize("which", ["input", "intermediate"])
def test_python_attribute_set_on_a_tensor_is_refused(which):
    """``t.tag = "x"`` inside the program would land on a traced stand-in, not on
    the caller's tensor nor on later calls' tensors: refused naming the line,
    and the caller's tensor is left as it was."""
    def f(x):
        y = x if which == "input" else x * 2
        y.tag = "x"
        return y + 1

    x = torch.ones(2)
    with pytest.raises(RuntimeError, match=r"does not trace Python attributes set on a tensor \(t.tag = \.\.\.\) "
                                           r"at .*test_access_path_guards.py:\d+: y.tag = \"x\""):
        thunderlite.jit(f)(x)
    assert not hasattr(x, "tag")


@pytest.mark.parametrize("clock", ["time", "perf_counter"])
def test_python_clocks_are_refused(clock):
    """``time.time()`` read while tracing would be baked into the trace, every
    call replaying that stale time: refused naming the user's line, as Python's
    random module is."""
    import time
    read = getattr(time, clock)

    def f(x):
        return x + read()
    with pytest.raises(RuntimeError, match=rf"does not trace Python's clocks: time.{clock}\(\) at "
                                           r".*test_access_path_guards.py:\d+: return x \+ read\(\)"):
        thunderlite.jit(f)(torch.ones(2))
