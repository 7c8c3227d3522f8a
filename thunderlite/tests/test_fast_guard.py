"""The fast guard of the cached call (frontend/caching/entries.py: make_fast_guard): an
entry the key path served twice in a row is then called without building the
key. Every change the key would see must still reach another entry (or a
compile), and every call must still equal eager."""
from __future__ import annotations

import linecache

import pytest
import torch

import thunderlite
from thunderlite.api import _no_fast_guard
from thunderlite.frontend.caching.entries import make_fast_guard
from thunderlite.frontend.caching.keys import describe
from thunderlite.frontend.entry import MISS


def _armed(jfn) -> bool:
    j = jfn._jitted if isinstance(jfn, thunderlite.ThunderliteModule) else jfn
    return j._fast is not _no_fast_guard


def _warm(jfn, *args, **kwargs):
    for _ in range(3):
        out = jfn(*args, **kwargs)
    assert _armed(jfn)
    return out


def tiny(a, b):
    return (a * b + 1).sin().sum()


def test_an_entry_served_twice_is_armed_and_serves_the_next_calls():
    a, b = torch.randn(8), torch.randn(8)
    jf = thunderlite.jit(tiny)
    jf(a, b)
    assert not _armed(jf)          # compiled: a candidate
    jf(a, b)
    assert _armed(jf)              # served again by the key path: armed
    for _ in range(3):
        a2, b2 = torch.randn(8), torch.randn(8)
        torch.testing.assert_close(jf(a2, b2), tiny(a2, b2))
    info = thunderlite.cache_info(jf)
    assert (info["hits"], info["misses"]) == (4, 1)
    assert thunderlite.last_traces(jf)[-1] is jf.last.traces[-1]


@pytest.mark.parametrize("change", ["shape", "dtype", "requires_grad", "no_grad", "default_dtype",
                                    "device_type_of_arg", "kwargs", "arity", "parameter"])
def test_what_the_key_sees_misses_the_fast_guard(change):
    a, b = torch.randn(8), torch.randn(8)
    jf = thunderlite.jit(tiny)
    _warm(jf, a, b)
    fast = jf._fast
    if change == "shape":
        args, ctx = (torch.randn(9), torch.randn(9)), None
    elif change == "dtype":
        args, ctx = (a.double(), b.double()), None
    elif change == "requires_grad":
        args, ctx = (a.clone().requires_grad_(), b), None
    elif change == "no_grad":
        args, ctx = (a, b), torch.no_grad()
    elif change == "default_dtype":
        args, ctx = (a, b), _default_dtype(torch.float64)
    elif change == "device_type_of_arg":
        args, ctx = (a, 2.0), None
    elif change == "kwargs":
        assert fast((a,), {"b": b}) is MISS
        return
    elif change == "arity":
        assert fast((a, b, b), {}) is MISS
        return
    else:
        args, ctx = (torch.nn.Parameter(a), b), None
    if ctx is None:
        assert fast(args, {}) is MISS
        expect = tiny(*args)
        got = jf(*args)
    else:
        with ctx:
            assert fast(args, {}) is MISS
            expect = tiny(*args)
            got = jf(*args)
    torch.testing.assert_close(got, expect)
    assert thunderlite.cache_info(jf)["misses"] == 2


class _default_dtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.old = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.old)


def test_strides_are_not_in_the_key_and_not_in_the_fast_guard():
    a = torch.randn(4, 4)
    jf = thunderlite.jit(lambda x: x.exp() + 1)
    _warm(jf, a)
    t = torch.randn(4, 4).t()
    assert jf._fast((t,), {}) is not MISS
    torch.testing.assert_close(jf(t), t.exp() + 1)
    assert thunderlite.cache_info(jf)["misses"] == 1


def test_values_and_objects_in_the_key_are_checked():
    def f(x, k, obj):
        return x * k + obj.bias
    class Obj:
        bias = 1.0
    class Other:
        bias = 1.0
    o1, o2 = Obj(), Obj()
    x = torch.randn(4)
    jf = thunderlite.jit(f)
    _warm(jf, x, 2, o1)
    assert jf._fast((x, 3, o1), {}) is MISS
    assert jf._fast((x, 2.0, o1), {}) is MISS       # the key checks the type as well as the value
    assert jf._fast((x, 2, Other()), {}) is MISS    # an object is keyed by its type (keys.keyed_by_type)
    torch.testing.assert_close(jf._fast((x, 2, o2), {}), f(x, 2, o2))     # what it reads of it: guarded
    o2.bias = 3.0
    assert jf._fast((x, 2, o2), {}) is MISS
    torch.testing.assert_close(jf(x, 3, o1), f(x, 3, o1))
    torch.testing.assert_close(jf(x, 2, o2), f(x, 2, o2))
    # a module (or a function) is keyed by identity
    lin1, lin2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    jg = thunderlite.jit(lambda x, m: m(x))
    _warm(jg, x, lin1)
    assert jg._fast((x, lin2), {}) is MISS
    torch.testing.assert_close(jg(x, lin2), lin2(x))


def test_a_writing_program_checks_which_inputs_share_storage():
    def f(a, b):
        a.add_(1)
        return b * 2
    jf = thunderlite.jit(f)
    a, b = torch.zeros(4), torch.zeros(4)
    _warm(jf, a, b)
    z, w = torch.zeros(8), torch.zeros(8)
    assert jf._fast((z[:4], z[2:6]), {}) is MISS
    out = jf(z[:4], z[2:6])
    expect = f(w[:4], w[2:6])
    torch.testing.assert_close(out, expect)
    torch.testing.assert_close(z, w)


def test_a_reading_program_needs_no_storage_check_and_stays_right():
    z = torch.randn(8)
    x, y = z[:4], z[4:]
    jf = thunderlite.jit(tiny)
    _warm(jf, torch.randn(4), torch.randn(4))
    assert jf._fast((x, y), {}) is not MISS     # sharing storage cannot change what it computes
    torch.testing.assert_close(jf(x, y), tiny(x, y))
    assert jf._fast((x, x), {}) is MISS         # torch's guard refuses one tensor passed twice
    torch.testing.assert_close(jf(x, x), tiny(x, x))


def test_prologue_guards_still_run_on_the_fast_path():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.scale = 2.0

        def forward(self, x):
            return self.lin(x) * self.scale
    m = M()
    jm = thunderlite.jit(m)
    x = torch.randn(3, 4)
    _warm(jm, x)
    m.scale = 3.0
    torch.testing.assert_close(jm(x), m(x))
    with torch.no_grad():
        m.lin.weight.mul_(2)
    torch.testing.assert_close(jm(x), m(x))


def test_calls_alternating_between_entries_disarm_and_stay_right():
    jf = thunderlite.jit(tiny, dynamic=False)
    small, big = (torch.randn(4), torch.randn(4)), (torch.randn(6), torch.randn(6))
    _warm(jf, *small)
    for args in [big, small, big, small, big]:
        torch.testing.assert_close(jf(*args), tiny(*args))
        assert thunderlite.last_traces(jf)[0].args[0].shape[0] == args[0].shape[0]
    assert not _armed(jf)
    jf(*big)
    jf(*big)
    assert _armed(jf)


def test_no_fast_guard_for_symbolic_numbers():
    x = torch.randn(4)
    sig = describe((x, 2.0), {}, symbolic_numbers=True)
    assert make_fast_guard(sig) is None


def test_symbolic_sizes_get_a_fast_guard_serving_every_size_of_two_or_more():
    """A symbolic dim is checked as the key has it (0, 1, or "2 or more"): the
    fast guard armed at one size serves the others, and refuses sizes 0 and 1
    (entries of their own), whose calls the key path serves."""
    assert make_fast_guard(describe((torch.randn(4),), {}), {0: {0}}) is not None
    jf = thunderlite.jit(lambda t: t + 1, dynamic=True)
    for n in (4, 5, 6):
        torch.testing.assert_close(jf(torch.ones(n)), torch.ones(n) + 1)
    assert _armed(jf)
    fast = jf._fast
    for n in (7, 30):
        assert fast((torch.ones(n),), {}) is not MISS
    for n in (0, 1):
        assert fast((torch.ones(n),), {}) is MISS
        torch.testing.assert_close(jf(torch.ones(n)), torch.ones(n) + 1)
    assert fast((torch.ones(3, dtype=torch.float64),), {}) is MISS


def test_calls_the_fast_guard_always_refuses_do_not_re_arm_it_each_time():
    """One tensor passed twice: torch's guard refuses it, the key path serves it;
    after a bounded number of armings the key path keeps serving without re-arming."""
    jf = thunderlite.jit(tiny)
    x = torch.randn(4)
    for _ in range(3):
        jf(x, x)
    armed = jf._fast
    for _ in range(5):
        torch.testing.assert_close(jf(x, x), tiny(x, x))
    assert jf._fast is armed
    assert thunderlite.cache_info(jf)["misses"] == 1


class _TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(self.a(x).relu())


@pytest.mark.parametrize("change", ["shape", "dtype", "requires_grad", "plain_tensor", "same_meta"])
def test_parameters_are_checked_at_once_on_the_fast_path(change):
    """A module's parameters are checked by one C++ call on the fast path
    (entry._tensor_guard): a parameter with other metadata misses it and the
    key path's own checks decide; one with the same metadata is served."""
    m = _TwoLayers()
    jm = thunderlite.jit(m)
    x = torch.randn(3, 4)
    _warm(jm, x)
    src = "".join(linecache.getlines(jm._jitted._fast.__code__.co_filename))
    assert "_tensor_meta(" in src and "isinstance(" not in src.split("try:")[1]
    w = m.a.weight
    new = {"shape": lambda: torch.nn.Parameter(torch.randn(5, 4)),
           "dtype": lambda: torch.nn.Parameter(w.detach().double()),
           "requires_grad": lambda: torch.nn.Parameter(w.detach().clone(), requires_grad=False),
           "plain_tensor": lambda: w.detach().clone(),
           "same_meta": lambda: torch.nn.Parameter(torch.randn(4, 4))}[change]()
    if change == "shape":
        m.a.bias = torch.nn.Parameter(torch.randn(5))
        m.b.weight = torch.nn.Parameter(torch.randn(2, 5))
    if change == "plain_tensor":
        del m.a.weight
    m.a.weight = new
    if change == "dtype":
        m.a.bias = torch.nn.Parameter(m.a.bias.detach().double())
        m.b.double()
        x = x.double()
    expected = m(x)
    torch.testing.assert_close(jm(x), expected)
    torch.testing.assert_close(jm(x), expected)
    misses = thunderlite.cache_info(jm)["misses"]
    assert misses == (1 if change == "same_meta" else 2)


def test_hooks_registered_after_arming_run():
    """A module's hook dicts are checked by truthiness (as Module._call_impl reads them)."""
    m = _TwoLayers()
    jm = thunderlite.jit(m)
    x = torch.randn(3, 4)
    _warm(jm, x)
    seen = []
    handle = m.b.register_forward_hook(lambda mod, args, out: seen.append(out.shape) or out * 2)
    torch.testing.assert_close(jm(x), m(x))
    assert seen
    handle.remove()
    torch.testing.assert_close(jm(x), m(x))
    pre = torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, args: None)
    try:
        torch.testing.assert_close(jm(x), m(x))
    finally:
        pre.remove()
    assert thunderlite.cache_info(jm)["misses"] >= 2


def test_alternating_entries_re_arm_without_compiling_again(monkeypatch):
    """Calls alternating between two entries (a decode loop's prefill and
    step) re-arm the fast guard at each switch: the armed function reuses its
    entry's compiled code, however long the entry's source (a model's)."""
    import builtins

    from thunderlite.core import codegen
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(24)])
    jm = thunderlite.jit(model, dynamic=False)
    a, b = torch.randn(2, 4), torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(3):
            for x in (a, a, a, b, b, b):
                torch.testing.assert_close(jm(x), model(x))
        assert len(jm._jitted.last.fn.__thunderlite_source__) > codegen._CODE_CACHE_MAX_SOURCE
        compiled = []
        real = builtins.compile
        monkeypatch.setattr(builtins, "compile", lambda src, *a, **k: compiled.append(src) or real(src, *a, **k))
        for _ in range(3):
            for x in (a, a, a, b, b, b):
                torch.testing.assert_close(jm(x), model(x))
    assert _armed(jm) and compiled == []


def test_an_entry_found_under_an_older_key_lets_the_fast_guard_re_arm():
    """A decode loop: the prefill's entry was compiled before the step's dim
    became symbolic and is found under its older key; every round, the steps
    after it are served by the fast guard again (it was left disarmed for good
    after two rounds, each step paying the key and the entry's full guards)."""
    jf = thunderlite.jit(lambda t: t * 2)
    prefill, step = torch.randn(8), torch.randn(1)
    for _ in range(5):
        torch.testing.assert_close(jf(prefill), prefill * 2)
        for _ in range(4):
            torch.testing.assert_close(jf(step), step * 2)
        assert _armed(jf)
        assert jf._fast((step,), {}) is not MISS
    assert thunderlite.cache_info(jf)["misses"] == 2
