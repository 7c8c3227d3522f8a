"""Errors a user can act on (issue 15): each names the construct by the name the
user wrote, gives the user's source line, and says what to do instead; things
that can never be compiled are refused at jit() time."""
from __future__ import annotations

import inspect

import pytest
import torch

import thunderlite
from thunderlite.core.proxies import DataDependentError
from thunderlite.frontend.hooks import NotTracedError
from thunderlite.torch.names import public_name

np = pytest.importorskip("numpy", reason="numpy is needed for the numpy cases")
HERE = __file__


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _geqrf(x):
    return torch.geqrf((x > 0).float().reshape(-1, 1))


def _histogramdd(x):
    y = x + 1
    return torch.histogramdd(y.reshape(5, 1), bins=3)


# nonzero, unique, tolist, bincount... are traced with sizes known at run time (tests/test_data_dependent.py)
@pytest.mark.parametrize("fn, public, text", [
    (_geqrf, "torch.geqrf", "torch.geqrf((x > 0).float().reshape(-1, 1))"),
    (_histogramdd, "torch.histogramdd", "torch.histogramdd(y.reshape(5, 1), bins=3)"),   # a Python function
])
def test_opaque_data_dependent_ops_named_publicly_with_users_line(fn, public, text):
    with pytest.raises(DataDependentError) as info:
        thunderlite.jit(fn)(torch.randn(5))
    msg = str(info.value)
    assert msg.startswith(f"{public} cannot be traced")
    assert f"{HERE}:{_line_of(fn, text)}: " in msg
    for internal in ("_VariableFunctionsClass", "TensorBase", "_config", "meta_nonzero", "fake impl"):
        assert internal not in msg
    assert info.value.__cause__ is None       # torch's meta-kernel message is not chained in


def test_public_names_of_torch_callables():
    import torch.nn.functional as F
    assert public_name(torch.nonzero) == "torch.nonzero"
    assert public_name(torch._C.TensorBase.tolist) == "Tensor.tolist"
    assert public_name(torch.randn(2).tolist) == "Tensor.tolist"
    assert public_name(torch._C._nn.gelu) == "torch.nn.functional.gelu"
    assert public_name(F.gelu) == "torch.nn.functional.gelu"
    assert public_name(torch.linalg.norm) == "torch.linalg.norm"
    assert public_name(torch.ops.aten.add.Tensor) == "torch.ops.aten.add.Tensor"


def _np_sin(x):
    return np.sin(x) + 1


def _np_ones(x):
    return x + torch.from_numpy(np.ones(4, dtype=np.float32))


def _np_random(x):
    return x + torch.from_numpy(np.random.rand(4))


def _to_numpy(x):
    return x.numpy()


@pytest.mark.parametrize("fn, text", [
    (_np_sin, "np.sin(x)"), (_np_ones, "np.ones(4"), (_np_random, "np.random.rand(4)"),
    (_to_numpy, "x.numpy()"),
])
def test_numpy_inside_a_jitted_function_is_refused(fn, text):
    with pytest.raises((NotTracedError, DataDependentError)) as info:
        thunderlite.jit(fn)(torch.randn(4))
    msg = str(info.value)
    assert msg.startswith("numpy arrays are not traced")
    assert f"{HERE}:{_line_of(fn, text)}: " in msg


def test_numpy_scalars_from_python_values_still_work():
    def f(x):
        return x * float(np.sqrt(4.0))
    x = torch.randn(3)
    torch.testing.assert_close(thunderlite.jit(f)(x), f(x))


@pytest.mark.parametrize("value", [42, None, "f", [1, 2]])
def test_non_callables_are_refused_at_jit_time(value):
    with pytest.raises(TypeError, match=r"thunderlite.jit expects a function or an nn.Module, got"):
        thunderlite.jit(value)


def _gen(x):
    yield x * 2


async def _coro(x):
    return x


async def _agen(x):
    yield x


@pytest.mark.parametrize("fn, kind", [(_gen, "a generator function"), (_coro, "a coroutine function"),
                                      (_agen, "an async generator function")])
def test_generator_and_coroutine_functions_are_refused_at_jit_time(fn, kind):
    with pytest.raises(TypeError, match=f"cannot compile '{fn.__name__}': it is {kind}, whose body runs only"):
        thunderlite.jit(fn)


def test_returning_a_generator_is_a_clear_error():
    def f(x):
        return (x * i for i in range(3))
    with pytest.raises(TypeError, match="returned a generator, whose body runs only when it is iterated"):
        thunderlite.jit(f)(torch.randn(3))


def test_generators_used_inside_the_function_still_trace():
    def f(x):
        return sum(x * i for i in range(3))
    x = torch.randn(3)
    torch.testing.assert_close(thunderlite.jit(f)(x), f(x))
