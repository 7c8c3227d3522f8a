"""Numbers read from tensors (``item()``, ``tolist()``) and symbolic number
arguments behave as Python numbers: Python's number protocol on them is
recorded in the trace (torch/ops/numbers.py) and runs with the program, so
every call, the cached ones included, gives eager's result, with Python's
result types. What needs the value while tracing (branching, ``str``) raises
``DataDependentError`` naming the user's line."""
from __future__ import annotations

import cmath
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import thunderlite
from thunderlite.core.proxies import DataDependentError

EXECUTORS = [pytest.param(None, id="default"), pytest.param(["torchcompile", "torch"], id="torchcompile")]

# each gives a float sum n != 0, a count k of positives in 1..5, and differs from the others
INPUTS = [torch.tensor([0.5, -1.25, 2.0, 3.5, -0.75, 1.0]), torch.tensor([-2.5, 0.25, -1.0, -0.5, 4.0, -3.0]),
          torch.tensor([1.5, 2.25, 0.75, -0.25, 3.0, 2.0])]


def _same(got, want) -> None:
    """Equal values of the same Python type (tensors: values and dtype)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        torch.testing.assert_close(got, want, equal_nan=True)
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), (got, want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)
    else:
        assert type(got) is type(want), (got, want)
        if isinstance(want, (float, complex)):
            assert cmath.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6) or (cmath.isnan(got) and cmath.isnan(want)), \
                (got, want)
        else:
            assert got == want, (got, want)


def _check_against_eager(fn, executors, inputs=INPUTS) -> None:
    """Eager's result on every input from one compile: the numbers are trace
    values, not constants baked in by the first call."""
    jfn = thunderlite.jit(fn, executors=executors)
    for x in inputs:
        _same(jfn(x), fn(x))
    info = thunderlite.cache_info(jfn)
    assert info["misses"] == 1 and info["hits"] == len(inputs) - 1, info


# --- the number protocol -------------------------------------------------------------------------

def _brief(x):
    return x * (x.sum().item() + 1)


def _arithmetic(x):
    n, k = x.sum().item(), (x > 0).sum().item()          # a float, an int
    b, c = torch.equal(x, x), x.sum().item() + 2j       # a bool, a complex
    ops = []
    for a in (n, k, b, c):
        for o in (n, k, b, c, 3, 0.5, True, 1 - 2j):
            ops += [a + o, o + a, a - o, o - a, a * o, o * a, a / o, o / a]
            if not isinstance(a, complex) and not isinstance(o, complex):
                ops += [a // o, o // a, a % o, o % a]
    return ops


def _unary_and_builtins(x):
    n, k = x.sum().item(), (x > 0).sum().item()
    b = torch.equal(x, x)
    return (-n, +n, abs(n), -k, abs(k - 3), ~k, -b, abs(b), divmod(n, 0.75), divmod(7, k), divmod(k, -2),
            round(n), round(n, 2), round(k, -1), int(n), int(b), float(k), float(b), complex(n), complex(n, k),
            pow(n, 2), n ** k, k ** 2, 2 ** k, k ** 0.5, abs(n) ** 0.5, pow(k, 3, 5), k & 6, 9 | k, k ^ b, k << 2,
            64 >> k, k / 2, 1 / n)


def _math_functions(x):
    n, k = x.sum().item(), (x > 0).sum().item()
    a = abs(n) + 0.5
    return (math.floor(n), math.ceil(n), math.trunc(n), math.floor(k), math.sqrt(a), math.exp(n), math.log(a),
            math.log(a, 2), math.log(k), math.sin(n), math.cos(n), math.tanh(n), math.fabs(n), math.atan2(n, k),
            math.hypot(n, k), math.isnan(n), math.isinf(n / 0.5), math.isfinite(k), max(n, 0.25), min(n, -1.0, 2.0),
            max(k, 2), min(k, 3))


def _comparisons_as_values(x):
    n, k = x.sum().item(), (x > 0).sum().item()
    return (x * (n > 0), x + (k >= 3), torch.where(x > 0, x, float(n < 1)), n == n, k != 2, 3 < n, n <= k,
            k == 4, torch.equal(x, x) == (k > 0))


def _tensor_ops(x):
    n, k = x.sum().item(), (x > 0).sum().item()
    b = torch.equal(x, x.abs())
    return (x * n, n - x, torch.full((2,), n), torch.full((2,), k), torch.full((2,), b), x.clamp(max=n),
            x.clamp(min=k / 4), torch.tensor(n), torch.tensor([n, k]), torch.tensor([[k, True]]), x.add(x, alpha=n),
            x.abs() ** (n / 4), F.softplus(x, beta=abs(n)), torch.zeros(int(abs(n) * 2) + 1), torch.arange(k) * n)


def _tolist(x):
    a, b, c = x[:3].tolist()
    i, j = (x[:2] > 0).long().tolist()
    return a + b * c, a / (i + 1), (a > b) + (i == j), max(a, b, c), torch.full((i + 1,), c)


@pytest.mark.parametrize("executors", EXECUTORS)
@pytest.mark.parametrize("fn", [_brief, _arithmetic, _unary_and_builtins, _math_functions, _comparisons_as_values,
                                _tensor_ops, _tolist], ids=lambda f: f.__name__.strip("_"))
def test_number_protocol_matches_eager(fn, executors):
    _check_against_eager(fn, executors)


def test_operations_are_recorded_not_evaluated():
    jfn = thunderlite.jit(lambda x: x * math.floor(x.sum().item() * 2 + 1))
    jfn(INPUTS[0])
    text = str(thunderlite.last_traces(jfn)[-1])
    for op in ("number_mul", "number_add", "number_math_floor"):
        assert op in text


def test_gradients_past_numbers_read_from_tensors():
    def f(x):
        n = x.sum().item()
        return x * (n + 1) / math.sqrt(abs(n) + 1) + x * (n > 0)
    for executors in (None, ["torchcompile", "torch"]):
        jfn = thunderlite.jit(f, executors=executors)
        for x in INPUTS:
            x = x.clone().requires_grad_()
            got, want = jfn(x), f(x)
            _same(got, want)
            _same(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])


def test_isinstance_and_type_answer_the_python_type():
    def f(x):
        n, k, b = x.sum().item(), (x > 0).sum().item(), torch.equal(x, x)
        return (isinstance(n, float), isinstance(k, int), isinstance(b, bool), isinstance(n, int), type(n) is float,
                type(k) is int, type(b).__name__)
    _check_against_eager(f, None)


def test_symbolic_value_arguments_compute_without_falling_back():
    def f(x, s):
        return x * (s * 2 + 1) - math.exp(s) + round(s) + (s > 1)
    jfn = thunderlite.jit(f, cache="symbolic values")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s in (0.5, 1.75, -2.25):
            _same(jfn(INPUTS[0], s), f(INPUTS[0], s))
    assert thunderlite.cache_info(jfn)["misses"] == 1


def test_a_size_known_while_tracing_times_a_float_stays_dynamic():
    def f(x):
        return x * (x.shape[0] * 0.5)
    jfn = thunderlite.jit(f, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # no "symbolic sizes failed" fallback
        for n in (3, 5):
            _same(jfn(torch.ones(n)), f(torch.ones(n)))


def test_addmm_with_a_traced_beta_of_zero_ignores_nans_under_autodiff():
    def f(b, m, z):
        return torch.addmm(b, m, m, beta=z.sum().item())
    base = torch.full((2, 2), float("nan"))
    for beta in (0.0, 2.0):
        m = torch.eye(2, requires_grad=True)
        z = torch.full((1,), beta)
        got, want = thunderlite.jit(f)(base, m, z), f(base, m, z)
        _same(got, want)
        _same(torch.autograd.grad(got.sum(), m)[0], torch.autograd.grad(want.sum(), m)[0])


# --- what needs the value while tracing ------------------------------------------------------------

def _branch_on_comparison(x):
    if x.sum().item() > 0.5:  # needs-value
        return x
    return -x


def _truth(x):
    n = x.sum().item() - 1
    return x if n else -x  # needs-value


def _f_string(x):
    return x, f"{x.sum().item():.2f}"  # needs-value


def _str_of_int(x):
    return x, str((x > 0).sum().item())  # needs-value


def _membership(x):
    return x * (x.sum().item() in (1.0, 2.0))  # needs-value


def _max_of_mixed_types(x):
    return max((x > 0).sum().item(), x.sum().item())  # needs-value


def _library_decision(x):
    return F.smooth_l1_loss(x, -x, beta=x.abs().sum().item())  # needs-value


@pytest.mark.parametrize("fn, what", [
    (_branch_on_comparison, "n0 > 0.5"), (_truth, "its truth value"), (_f_string, "formatting"),
    (_str_of_int, "str() of the traced int"), (_membership, "n0 == 1.0"), (_max_of_mixed_types, "max()"),
    (_library_decision, "n0 == 0"),
], ids=lambda v: getattr(v, "__name__", "").strip("_") or None)
def test_what_needs_the_value_raises_naming_the_line(fn, what):
    """With the strict option; by default these programs split where the value
    is needed (test_splits.py), except a decision inside a torch op."""
    with pytest.raises(DataDependentError) as info:
        thunderlite.jit(fn, splits=False)(INPUTS[0])
    msg = str(info.value)
    assert what in msg
    assert f"{__file__}:" in msg and "# needs-value" in msg


def test_a_type_python_decides_from_the_values_is_checked_when_the_program_runs():
    def int_power(x):
        return 2 ** ((x > 0).sum().item() - 3)       # an int for a non-negative exponent, else a float
    jfn = thunderlite.jit(int_power)
    _same(jfn(INPUTS[0]), int_power(INPUTS[0]))
    with pytest.raises(ValueError, match="traced as an int"):
        jfn(INPUTS[1])

    def real_power(x):
        return x.sum().item() ** (1 / 3)                # complex for a negative base
    jfn = thunderlite.jit(real_power)
    _same(jfn(INPUTS[0]), real_power(INPUTS[0]))
    with pytest.raises(ValueError, match="complex number"):
        jfn(INPUTS[1])
