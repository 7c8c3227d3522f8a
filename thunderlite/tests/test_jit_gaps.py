"""thunderlite.jit front-door gaps: closure-cell writes (``nonlocal``) replayed by
the epilogue, and torch.autocast regions; ground truth is eager (issue 4)."""
from __future__ import annotations

import contextlib

import pytest
import torch

import thunderlite


def _counter():
    n = 0
    acc = torch.zeros(3)

    def step(x):
        nonlocal n, acc
        n += 1
        acc = acc + x * n
        return acc.sum()
    return step


@pytest.mark.filterwarnings("ignore:thunderlite recompiled")
def test_nonlocal_python_and_tensor_writes_replayed_every_call():
    eager, jitted_src = _counter(), _counter()
    jf = thunderlite.jit(jitted_src)
    for i in range(4):
        x = torch.full((3,), float(i + 1))
        torch.testing.assert_close(jf(x), eager(x))
    cells_e = [c.cell_contents for c in eager.__closure__]
    cells_j = [c.cell_contents for c in jitted_src.__closure__]
    for a, b in zip(cells_e, cells_j, strict=True):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(b, a)
        else:
            assert a == b == 4


def _tensor_accumulator():
    acc = torch.zeros(2, 2)

    def add(x):
        nonlocal acc
        acc = acc + x
        return acc * 2
    return add


def test_nonlocal_tensor_write_hits_cache_and_uses_run_outputs():
    eager, src = _tensor_accumulator(), _tensor_accumulator()
    jf = thunderlite.jit(src)
    for _ in range(3):
        x = torch.randn(2, 2)
        torch.testing.assert_close(jf(x), eager(x))
    torch.testing.assert_close(src.__closure__[0].cell_contents, eager.__closure__[0].cell_contents)
    info = thunderlite.cache_info(jf)
    assert (info["hits"], info["misses"]) == (2, 1)


def _reader_writer():
    scale = 1.0

    def bump():
        nonlocal scale
        scale = scale * 3.0

    def f(x):
        bump()
        y = x * scale           # reads the overlay: the value written by bump
        return y
    return f


def test_nonlocal_write_seen_by_later_reads_in_the_same_call():
    eager, src = _reader_writer(), _reader_writer()
    jf = thunderlite.jit(src)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(jf(x), eager(x))
    # the cell's value lives in bump's closure
    assert src.__closure__[0].cell_contents.__closure__[0].cell_contents == 27.0


def _deleter():
    tmp = torch.ones(2)

    def f(x):
        nonlocal tmp
        y = x + tmp
        del tmp
        return y
    return f


def test_nonlocal_delete_replayed():
    src = _deleter()
    jf = thunderlite.jit(src)
    x = torch.randn(2)
    torch.testing.assert_close(jf(x), x + 1)
    with pytest.raises(ValueError):         # the deleted cell is empty
        _ = src.__closure__[0].cell_contents


def test_cells_created_inside_the_call_stay_native():
    def f(x):
        total = x * 0

        def add(v):
            nonlocal total
            total = total + v

        for k in range(3):
            add(x * k)
        return total

    jf = thunderlite.jit(f)
    x = torch.randn(5)
    torch.testing.assert_close(jf(x), f(x))
    torch.testing.assert_close(jf(x + 1), f(x + 1))


# --- autocast ------------------------------------------------------------------------------------

class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 32)
        self.proj = torch.nn.Parameter(torch.randn(32, 8) / 4)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc(x))
        return (h @ self.proj).softmax(-1), torch.nn.functional.mse_loss(h, h * 0.5)


class _InnerAutocast(_Block):
    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = super().forward(x)
        return out[0] * 2, out[1]


def _bf16_close(actual, expected):
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, atol=1e-2, rtol=1.6e-2)


def _check_against_eager(model, x, under_autocast: bool):
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if under_autocast else contextlib.nullcontext
    jm = thunderlite.jit(model)
    xe, xj = x.clone().requires_grad_(), x.clone().requires_grad_()
    with ctx():
        expected = model(xe)
    with ctx():
        actual = jm(xj)
    for a, e in zip(actual, expected, strict=True):
        _bf16_close(a, e)
    assert expected[0].dtype == torch.bfloat16 and expected[1].dtype == torch.float32
    eg = torch.autograd.grad(sum(t.float().sum() for t in expected), [xe, *model.parameters()])
    ag = torch.autograd.grad(sum(t.float().sum() for t in actual), [xj, *model.parameters()])
    for a, e in zip(ag, eg, strict=True):
        _bf16_close(a, e)
    return jm


def test_autocast_at_call_time_matches_eager_values_dtypes_and_grads():
    torch.manual_seed(0)
    jm = _check_against_eager(_Block(), torch.randn(4, 16), under_autocast=True)
    src = str(thunderlite.last_traces(jm)[0])
    assert "bfloat16" in src
    # outside autocast the same model is a different cache entry, in float32
    x = torch.randn(4, 16)
    out = jm(x)
    assert out[0].dtype == torch.float32
    assert thunderlite.cache_info(jm)["misses"] == 2


def test_autocast_region_inside_jitted_code_matches_eager():
    torch.manual_seed(0)
    model = _InnerAutocast()
    jm = _check_against_eager(model, torch.randn(4, 16), under_autocast=False)
    assert not torch.is_autocast_enabled("cpu")     # the region's exit ran while tracing
    x = torch.randn(4, 16, requires_grad=True)
    _bf16_close(jm(x)[0], model(x)[0])              # a cache hit: the casts are in the trace
    assert thunderlite.cache_info(jm)["hits"] == 1


def test_autocast_disabled_region_inside_enabled_call():
    def f(a, b):
        c = a @ b
        with torch.autocast("cpu", enabled=False):
            d = a.float() @ b.float()
        return c, d

    a, b = torch.randn(3, 4), torch.randn(4, 5)
    jf = thunderlite.jit(f)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, actual = f(a, b), jf(a, b)
    for x, y in zip(actual, expected, strict=True):
        _bf16_close(x, y)
    assert actual[0].dtype == torch.bfloat16 and actual[1].dtype == torch.float32


F = torch.nn.functional
_OPS = {
    "conv2d": (lambda x, w: F.conv2d(x, w, padding=1), [(2, 3, 8, 8), (4, 3, 3, 3)]),
    "bmm": (torch.bmm, [(2, 3, 4), (2, 4, 5)]),
    "baddbmm": (torch.baddbmm, [(2, 3, 5), (2, 3, 4), (2, 4, 5)]),
    "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b), [(3, 4), (4, 5)]),
    "sdpa": (F.scaled_dot_product_attention, [(2, 2, 4, 8), (2, 2, 4, 8), (2, 2, 4, 8)]),
    "cross_entropy": (lambda a, b: F.cross_entropy(a @ b, torch.tensor([0, 2, 1])), [(3, 4), (4, 5)]),
    "layer_norm_after_mm": (lambda a, b: F.layer_norm(a @ b, (5,)), [(3, 4), (4, 5)]),
    "softmax_and_sum": (lambda a, b: ((a @ b).softmax(-1), (a @ b).sum()), [(3, 4), (4, 5)]),
    "mv_stays_fp32_on_cpu": (torch.mv, [(3, 4), (4,)]),
    "float64_not_cast": (lambda a, b: a.double() @ b.double(), [(3, 4), (4, 5)]),
}


@pytest.mark.parametrize("name", sorted(_OPS))
def test_autocast_cpu_ops_match_eager_dtypes_and_values(name):
    fn, shapes = _OPS[name]
    torch.manual_seed(0)
    args = [torch.randn(s) for s in shapes]
    jf = thunderlite.jit(fn)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, actual = fn(*args), jf(*args)
    if isinstance(expected, torch.Tensor):
        expected, actual = (expected,), (actual,)
    for a, e in zip(actual, expected, strict=True):
        _bf16_close(a, e)


def _bumper():
    n = 0

    def bump():
        nonlocal n
        n += 1
        return n
    return bump


@pytest.mark.filterwarnings("ignore:thunderlite recompiled")
def test_nonlocal_write_through_a_function_passed_as_argument():
    def f(x, counter):
        return x * counter()

    eager_b, jit_b = _bumper(), _bumper()
    jf = thunderlite.jit(f)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(jf(x, jit_b), f(x, eager_b))
    assert jit_b.__closure__[0].cell_contents == eager_b.__closure__[0].cell_contents == 3


@pytest.mark.filterwarnings("ignore:thunderlite recompiled")
def test_nonlocal_write_in_a_bound_method_registered_as_a_callback():
    def f(x):
        return x * _CALLBACKS["bump"]()     # a bound method read as a value

    x = torch.randn(3)
    jf = thunderlite.jit(f)
    outs = [jf(x) for _ in range(3)]
    for k, out in enumerate(outs, start=1):
        torch.testing.assert_close(out, x * k)
    assert _CALLBACKS["bump"].__func__.__closure__[0].cell_contents == 3


def _method_holder():
    n = 0

    class Holder:
        def bump(self):
            nonlocal n
            n += 1
            return n
    return Holder()


_CALLBACKS = {"bump": _method_holder().bump}


_DISABLED_SOFTMAX = torch._disable_dynamo(F.softmax)


def test_dynamo_disable_wrapper_is_looked_through():
    def f(x):
        return _DISABLED_SOFTMAX(x, -1) * 2     # the wrapped op, on this line

    x = torch.randn(3)
    jf = thunderlite.jit(f)
    torch.testing.assert_close(jf(x), f(x))
    src = str(thunderlite.last_traces(jf)[0])
    assert "ltorch.softmax" in src and "the wrapped op, on this line" in src
    assert "_compile.py" not in src and "_dynamo" not in src
