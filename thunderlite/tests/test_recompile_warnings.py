"""Recompile warnings (issue 15) point at the user's call of the jitted
function, for functions and modules alike, and their hint matches the cause."""
from __future__ import annotations

import warnings

import torch

import thunderlite


def _recompile_warnings(calls) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls()
    return [w for w in caught if "recompiled" in str(w.message)]


def test_scalar_int_warning_points_at_the_call_and_offers_symbolic_ints():
    jf = thunderlite.jit(lambda x, step: x + step)
    x = torch.randn(2)

    def calls():
        for step in range(5):
            jf(x, step)                                   # the line the warning must name
    line = calls.__code__.co_firstlineno + 2
    (w,) = _recompile_warnings(calls)
    assert w.filename == __file__ and w.lineno == line
    assert "pass it as a tensor" in str(w.message)
    assert "ints become symbols" in str(w.message)


def test_scalar_float_hint_offers_symbolic_values():
    jf = thunderlite.jit(lambda x, scale: x * scale, dynamic=False)     # by default a changing float is an input
    x = torch.randn(2)
    (w,) = _recompile_warnings(lambda: [jf(x, 0.5 + i) for i in range(5)])
    assert "cache='symbolic values'" in str(w.message) and w.filename == __file__


def test_new_signature_hint_is_not_symbolic_values():
    jf = thunderlite.jit(lambda xs: sum(xs))
    x = torch.randn(2)

    def calls():
        for n in range(1, 6):
            jf([x] * n)
    line = calls.__code__.co_firstlineno + 2
    (w,) = _recompile_warnings(calls)
    msg = str(w.message)
    assert "new signature" in msg and "symbolic" not in msg
    assert "same structure and types" in msg
    assert w.filename == __file__ and w.lineno == line


def test_shape_change_hint_names_shapes():
    jf = thunderlite.jit(lambda x: x * 2, dynamic=False)
    (w,) = _recompile_warnings(lambda: [jf(torch.randn(n)) for n in range(1, 6)])
    msg = str(w.message)
    assert "x.shape changed" in msg and "dynamic=" in msg and "shapes" in msg


def test_changing_sizes_do_not_warn_by_default():
    jf = thunderlite.jit(lambda x: x * 2)
    assert _recompile_warnings(lambda: [jf(torch.randn(n)) for n in range(1, 8)]) == []
    assert thunderlite.cache_info(jf)["misses"] == 2


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 1.0

    def forward(self, x):
        return x * self.scale


def test_module_guard_warning_points_at_the_users_module_call():
    m = _Scaled()
    jm = thunderlite.jit(m, dynamic=False)      # by default a changing float attribute becomes a trace input
    x = torch.randn(2)

    def calls():
        for i in range(5):
            m.scale = float(i)
            jm(x)                                          # through nn.Module.__call__
    line = calls.__code__.co_firstlineno + 3
    (w,) = _recompile_warnings(calls)
    assert w.filename == __file__ and w.lineno == line
    assert "scale" in str(w.message) and "as an argument" in str(w.message)
