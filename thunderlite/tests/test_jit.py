"""thunderlite.jit on functions: results against eager, traces, cache and guards,
write-backs, data-dependent errors (issue 4)."""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

import thunderlite
from thunderlite.core.proxies import DataDependentError


def tiny(a, b):
    return (a * b + 1).sin().sum()


def test_tiny_matches_eager_and_hits_cache():
    a, b = torch.randn(8), torch.randn(8)
    jf = thunderlite.jit(tiny)
    torch.testing.assert_close(jf(a, b), tiny(a, b))
    torch.testing.assert_close(jf(b, a), tiny(b, a))
    info = thunderlite.cache_info(jf)
    assert (info["hits"], info["misses"], info["entries"]) == (1, 1, 1)
    assert info["last_miss_reason"] == "first call"


def test_last_traces_every_stage_headed_and_last_one_ran():
    a, b = torch.randn(8), torch.randn(8)
    jf = thunderlite.jit(tiny)
    jf(a, b)
    traces = thunderlite.last_traces(jf)
    assert len(traces) >= 2
    for t in traces:
        assert str(t).startswith("# Constructed by ")
    assert str(traces[0]).startswith("# Constructed by interpretation")
    final = traces[-1]
    run = final.python_callable()
    torch.testing.assert_close(run(a, b), tiny(a, b))
    assert "test_jit.py" in str(traces[0])          # user lines appear in the trace
    pro = thunderlite.last_prologue_traces(jf)
    assert str(pro[-1]).startswith("# Constructed by prologue")
    stats = thunderlite.compile_stats(jf)
    assert stats["total_ms"] > 0 and "interpretation" in stats["stage_ms"]


def test_new_shape_dtype_requires_grad_respecialize():
    jf = thunderlite.jit(tiny)
    jf(torch.randn(8), torch.randn(8))
    jf(torch.randn(3, 5), torch.randn(3, 5))
    assert "shape" in thunderlite.cache_info(jf)["last_miss_reason"]
    out = jf(torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64))
    assert out.dtype == torch.float64
    assert thunderlite.cache_info(jf)["misses"] == 3


def test_python_scalar_specializes_and_reason_names_argument():
    def f(x, k):
        return x * k
    jf = thunderlite.jit(f)
    x = torch.randn(4)
    torch.testing.assert_close(jf(x, 2.0), x * 2.0)
    torch.testing.assert_close(jf(x, 3.0), x * 3.0)
    info = thunderlite.cache_info(jf)
    assert info["misses"] == 2 and "k" in info["last_miss_reason"] and "3.0" in info["last_miss_reason"]


def test_symbolic_values_mode_does_not_recompile_for_floats():
    def f(x, k):
        return x * k
    jf = thunderlite.jit(f, cache="symbolic values")
    x = torch.randn(4)
    for k in (2.0, 3.0, 4.5):
        torch.testing.assert_close(jf(x, k), x * k)
    assert thunderlite.cache_info(jf)["misses"] == 1


def test_no_caching_mode_retraces_every_call():
    jf = thunderlite.jit(tiny, cache="no caching")
    a, b = torch.randn(8), torch.randn(8)
    for _ in range(3):
        torch.testing.assert_close(jf(a, b), tiny(a, b))
    assert thunderlite.cache_info(jf)["misses"] == 3


def test_bad_cache_mode_is_refused():
    with pytest.raises(ValueError, match="cache="):
        thunderlite.jit(tiny, cache="sometimes")


SCALE = 2.0


def scaled(x):
    return x * SCALE


def test_changing_a_global_recompiles():
    global SCALE
    jf = thunderlite.jit(scaled)
    x = torch.randn(4)
    torch.testing.assert_close(jf(x), x * 2.0)
    SCALE = 5.0
    try:
        torch.testing.assert_close(jf(x), x * 5.0)
        assert "SCALE" in thunderlite.cache_info(jf)["last_miss_reason"]
    finally:
        SCALE = 2.0
    torch.testing.assert_close(jf(x), x * 2.0)


CALLS = 0
LAST = None


def counting(x):
    global CALLS, LAST
    CALLS = CALLS + 1
    y = x.cos()
    LAST = y
    return y + 1


def test_writes_to_globals_land_as_in_eager():
    global CALLS, LAST
    CALLS, LAST = 0, None
    jf = thunderlite.jit(counting)
    x = torch.randn(3)
    out = jf(x)
    assert CALLS == 1
    torch.testing.assert_close(LAST, x.cos())
    torch.testing.assert_close(out, x.cos() + 1)
    x2 = torch.randn(3)
    jf(x2)
    assert CALLS == 2
    torch.testing.assert_close(LAST, x2.cos())


def test_closures_tensor_and_value():
    w = torch.randn(4)
    k = 3

    def f(x):
        return x * w + k
    jf = thunderlite.jit(f)
    x = torch.randn(4)
    torch.testing.assert_close(jf(x), x * w + 3)


def test_list_and_dict_arguments_mutated_as_in_eager():
    def f(xs, d):
        y = xs[0] + xs[1]
        xs.append(y)
        d["out"] = y * 2
        return y
    a, b = torch.randn(3), torch.randn(3)
    xs, d = [a, b], {"k": 1}
    jf = thunderlite.jit(f)
    y = jf(xs, d)
    torch.testing.assert_close(y, a + b)
    assert len(xs) == 3 and xs[0] is a and xs[1] is b
    torch.testing.assert_close(xs[2], a + b)
    assert set(d) == {"k", "out"} and d["k"] == 1
    torch.testing.assert_close(d["out"], (a + b) * 2)


def test_star_args_from_generator_and_varargs():
    def total(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out

    def f(a, b, c):
        return total(*(t * 2 for t in (a, b, c)))
    a, b, c = torch.randn(2), torch.randn(2), torch.randn(2)
    torch.testing.assert_close(thunderlite.jit(f)(a, b, c), f(a, b, c))


def test_vmap_inside_jitted_code():
    def f(x, y):
        return torch.vmap(torch.dot)(x, y) + 1
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    torch.testing.assert_close(thunderlite.jit(f)(x, y), f(x, y))


def test_isinstance_type_and_print_on_proxies(capsys):
    def f(x):
        assert isinstance(x, torch.Tensor) and torch.is_tensor(x)
        print("value:", x)
        return x + 1 if type(x) is torch.Tensor else x
    x = torch.randn(2)
    torch.testing.assert_close(thunderlite.jit(f)(x), x + 1)
    assert "value:" in capsys.readouterr().out


def test_data_dependent_branch_names_the_line():
    """With the strict option (``splits=False``) a branch on a tensor's value
    raises, naming the line; by default the program splits there (test_splits.py)."""
    def f(t):
        if t.sum() > 0:  # the line the error must name
            return t + 1
        return t - 1
    with pytest.raises(DataDependentError, match="test_jit.py"):
        thunderlite.jit(f, splits=False)(torch.randn(4))


def test_item_is_a_symbolic_number_branching_on_it_names_the_line():
    def f(t):
        return t * t.sum().item()
    x = torch.randn(4)
    torch.testing.assert_close(thunderlite.jit(f)(x), f(x))

    def g(t):
        if t.sum().item() > 0:  # the line the error must name
            return t
        return -t
    with pytest.raises(DataDependentError, match="test_jit.py.*torch.where"):
        thunderlite.jit(g, splits=False)(torch.randn(4))


def test_inplace_on_input_stays_mutated():
    def f(a, b):
        a.add_(b)
        return a * 2
    a, b = torch.randn(4), torch.randn(4)
    ea, eb = a.clone(), b.clone()
    expected = f(ea, eb)
    out = thunderlite.jit(f)(a, b)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(a, ea)


def test_aliased_inputs_are_part_of_the_key():
    def f(a, b):
        a.mul_(2)
        return b + 1
    jf = thunderlite.jit(f)
    x = torch.ones(4)
    out = jf(x, x)                      # b sees a's write, as in eager
    torch.testing.assert_close(out, torch.full((4,), 3.0))
    y, z = torch.ones(4), torch.ones(4)
    torch.testing.assert_close(jf(y, z), torch.full((4,), 2.0))
    assert thunderlite.cache_info(jf)["misses"] == 2


def test_grad_matches_eager():
    def f(x, w):
        return torch.tanh(x @ w).sum()
    x = torch.randn(3, 4)
    w1 = torch.randn(4, 5, requires_grad=True)
    w2 = w1.detach().clone().requires_grad_(True)
    thunderlite.jit(f)(x, w1).backward()
    f(x, w2).backward()
    torch.testing.assert_close(w1.grad, w2.grad)


def test_no_grad_inside_jitted_code():
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y + x
    x = torch.randn(3, requires_grad=True)
    out = thunderlite.jit(f)(x)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3))


def test_repeated_misses_warn_once_naming_the_value():
    def f(x, step):
        return x + step
    jf = thunderlite.jit(f)
    x = torch.randn(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(6):
            jf(x, step)
    msgs = [str(w.message) for w in caught if "recompiled" in str(w.message)]
    assert len(msgs) == 1 and "step" in msgs[0]


def test_examine_reports():
    report = thunderlite.examine(tiny, torch.randn(8), torch.randn(8))
    assert report.ok and "claimed" in str(report)


def test_import_does_not_import_torch():
    code = "import sys, thunderlite; assert 'torch' not in sys.modules; print(thunderlite.__version__)"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


DEFAULT_W = torch.randn(4)


def test_tensor_default_argument_is_captured():
    def f(x, w=DEFAULT_W):
        return x * w
    x = torch.randn(4)
    torch.testing.assert_close(thunderlite.jit(f)(x), x * DEFAULT_W)


def test_backward_traces_recorded():
    def f(x):
        return (x.sin() * 2).sum()
    x = torch.randn(3, requires_grad=True)
    jf = thunderlite.jit(f)
    jf(x).backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())
    bwd = thunderlite.last_backward_traces(jf)
    assert bwd and str(bwd[-1]).startswith("# Constructed by")
    jf2 = thunderlite.jit(f)
    jf2(x.detach())
    assert thunderlite.last_backward_traces(jf2) == []


def test_module_global_written_by_library_code():
    import types
    lib = types.ModuleType("fake_hf_lib")
    exec("FLAG = None\ndef mark(t):\n    global FLAG\n    FLAG = 'seen'\n    return t * 3\n", lib.__dict__)

    def f(x):
        return lib.mark(x) + 1
    x = torch.randn(2)
    torch.testing.assert_close(thunderlite.jit(f)(x), x * 3 + 1)
    assert lib.FLAG == "seen"


def test_symbolic_values_fall_back_to_specializing_with_a_warning():
    def f(x, k):
        if k > 1.0:
            return x * k
        return x - k
    jf = thunderlite.jit(f, cache="symbolic values")
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="symbolic"):
        torch.testing.assert_close(jf(x, 2.0), x * 2.0)
    torch.testing.assert_close(jf(x, 0.5), x - 0.5)
    assert thunderlite.cache_info(jf)["cache_mode"] == "constant values"


def test_examine_lists_opaque_ops():
    def f(x):
        return torch.special.bessel_j0(x) + 1
    report = thunderlite.examine(f, torch.randn(5))
    assert report.ok and "bessel_j0" in str(report)


class Scaler:
    def __init__(self, k):
        self.k = k

    @thunderlite.jit
    def apply(self, x):
        return x * self.k


def test_jit_as_method_decorator_guards_attributes():
    x = torch.randn(3)
    s2, s3 = Scaler(2.0), Scaler(3.0)
    torch.testing.assert_close(s2.apply(x), x * 2.0)
    torch.testing.assert_close(s3.apply(x), x * 3.0)
    s2.k = 5.0
    torch.testing.assert_close(s2.apply(x), x * 5.0)


def test_shape_argument_is_keyed_by_value():
    def f(x, shape):
        return x.reshape(shape) + 1
    jf = thunderlite.jit(f)
    for _ in range(3):
        x = torch.randn(6)
        torch.testing.assert_close(jf(x, torch.Size([2, 3])), x.reshape(2, 3) + 1)
    assert thunderlite.cache_info(jf)["misses"] == 1


STEP = 0


def stepped(x):
    return x + STEP


def test_a_global_changing_every_call_keeps_the_cache_bounded():
    global STEP
    jf = thunderlite.jit(stepped)
    x = torch.zeros(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for STEP in range(12):
            torch.testing.assert_close(jf(x), x + STEP)
    info = thunderlite.cache_info(jf)
    assert info["misses"] == 12 and info["entries"] <= 8 and "STEP" in info["last_miss_reason"]
    STEP = 0
