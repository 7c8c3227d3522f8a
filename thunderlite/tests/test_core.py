"""The IR on its own: promotion, proxies, recording, printing, compiling, verifying."""
import itertools

import pytest
import torch

from thunderlite.core import prims
from thunderlite.core.dtypes import result_type
from thunderlite.core.proxies import DataDependentError, NumberProxy, TensorProxy, register_method
from thunderlite.core.symbol import Symbol
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.core.verify import TraceVerificationError, verify_trace

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]


@pytest.mark.parametrize("a,b", list(itertools.product(DTYPES, DTYPES)))
def test_result_type_matches_torch_for_tensor_pairs(a, b):
    for na, nb in [(1, 1), (1, 0), (0, 1), (0, 0)]:
        x, y = torch.zeros((2,) * na, dtype=a), torch.zeros((2,) * nb, dtype=b)
        assert result_type(x, y) == torch.result_type(x, y), (a, na, b, nb)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scalar", [True, 2, 2.5, 1j])
def test_result_type_matches_torch_with_python_scalars(dtype, scalar):
    for nd in (0, 1):
        x = torch.zeros((2,) * nd, dtype=dtype)
        assert result_type(x, scalar) == torch.result_type(x, scalar)


def _simple_trace():
    trc = Trace()
    with tracectx(trc):
        a = TensorProxy((2, 3), name=trc.claim_name("a"))
        b = TensorProxy((2, 3), dtype=torch.float64, name=trc.claim_name("b"))
        trc.args = [a, b]
        add = Symbol("add_demo", module="ltorch",
                     decomposition=lambda x, y: prims.add(x, prims.convert_element_type(y, x.dtype)))
        trc.source = ("user.py", 7, "    return a + b")
        c = add(a, b)
        s = prims.sum(prims.sin(c), (0, 1))
        trc.set_return((s, c))
    return trc


_IMPLS = {"add_demo": lambda a, b: a + b.to(a.dtype), "add": torch.add, "sin": torch.sin,
          "sum": lambda a, dims: torch.sum(a, dims),
          "convert_element_type": lambda a, dt: a.to(dt)}


def test_trace_prints_readable_python_with_metadata_and_source():
    src = str(_simple_trace())
    assert "def computation(a, b):" in src
    assert '# a: "cpu f32[2, 3]"' in src
    assert "# user.py:7: return a + b" in src
    assert "t1 = ltorch.add_demo(a, b)" in src
    assert "    # t0 = prims.convert_element_type(b, torch.float32)" in src
    assert src.rstrip().endswith("return (t3, t1)")
    compile(src, "<test>", "exec")


def test_python_callable_round_trip_matches_eager():
    trc = _simple_trace()
    verify_trace(trc)
    fn = trc.python_callable(resolve=lambda s: _IMPLS[s.name])
    x, y = torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64)
    s, c = fn(x, y)
    torch.testing.assert_close(c, x + y.float())
    torch.testing.assert_close(s, torch.sin(x + y.float()).sum())


def test_unclaimed_trace_refuses_to_compile_naming_the_symbol():
    with pytest.raises(NotImplementedError, match="ltorch.add_demo"):
        _simple_trace().python_callable()


def test_names_are_unique_across_derived_traces():
    trc = _simple_trace()
    derived = trc.from_trace("Derived")
    with tracectx(derived):
        p = TensorProxy((1,))
    taken = {b.output.name for b in trc.bound_symbols if isinstance(b.output, TensorProxy)}
    assert p.name not in taken and p.name not in ("a", "b")


def test_verifier_catches_use_before_definition_and_missing_return():
    trc = _simple_trace()
    broken = trc.with_bound_symbols("Broken", list(reversed(trc.bound_symbols)))
    with pytest.raises(TraceVerificationError, match="return is not the last|used before"):
        verify_trace(broken)
    with pytest.raises(TraceVerificationError, match="no return"):
        verify_trace(trc.with_bound_symbols("No return", trc.bound_symbols[:-1]))


def test_prim_meta_is_strict_about_shapes_and_dtypes():
    trc = Trace()
    with tracectx(trc):
        a = TensorProxy((2, 3))
        with pytest.raises(RuntimeError, match="differ in shape"):
            prims.add(a, TensorProxy((3, 2)))
        with pytest.raises(RuntimeError, match="differ in dtype"):
            prims.add(a, TensorProxy((2, 3), dtype=torch.float64))
        assert prims.lt(a, 1.0).dtype is torch.bool


def test_registries_refuse_duplicates():
    with pytest.raises(ValueError, match="defined twice"):
        prims.make_prim("add", lambda a, b: a)
    register_method("_test_only_method", lambda self: self)
    with pytest.raises(ValueError, match="already registered"):
        register_method("_test_only_method", lambda self: self)


def test_tensor_proxy_refuses_data_dependent_python_values():
    with tracectx(Trace()):
        a = TensorProxy((2,))
    for conv in (bool, int, float):
        with pytest.raises(DataDependentError, match="not known while tracing"):
            conv(a)
    with pytest.raises(DataDependentError, match="not known while tracing"):
        bool(NumberProxy(3, int, name="n"))


def test_composite_that_returns_its_input_records_nothing():
    trc = Trace()
    noop = Symbol("noop_demo", decomposition=lambda x: x)
    with tracectx(trc):
        a = TensorProxy((2,), name="a")
        assert noop(a) is a
    assert trc.bound_symbols == []


def test_source_line_is_the_plain_tuple_plus_its_callers_and_library_frames():
    import pickle

    from thunderlite.core.symbol import SourceLine
    s = SourceLine(("user.py", 10, "y = self.proj(x)"), (("main.py", 3),), (("linear.py", 134),))
    assert s == ("user.py", 10, "y = self.proj(x)") and s.callers == (("main.py", 3),)
    assert s.via == (("linear.py", 134),)
    fname, lineno, text = s
    t = pickle.loads(pickle.dumps(s))
    assert t == s and t.callers == s.callers and t.via == s.via


def test_generated_code_is_compiled_once_per_text_and_keeps_each_programs_lines():
    """compile_source keeps small code objects by their comment-free text; a
    program differing only in comments reuses one and still shows its own lines."""
    import linecache

    from thunderlite.core import codegen
    srcs = ["# shape 8\ndef f(a):\n  # a: 8\n  return a + 1  # out: 8\n",
            "# shape 9\ndef f(a):\n  # a: 9\n  return a + 1  # out: 9\n"]
    code = "\ndef f(a):\n\n  return a + 1\n"
    f8 = codegen.compile_source(srcs[0], "f", {}, code)
    f9 = codegen.compile_source(srcs[1], "f", {}, code)
    assert f8(1) == f9(1) == 2
    assert f8.__code__.co_code == f9.__code__.co_code
    assert f8.__code__.co_filename != f9.__code__.co_filename
    assert "out: 9" in linecache.getline(f9.__code__.co_filename, 4)
    other = codegen.compile_source("def f(a):\n  return a + 2\n", "f", {}, "def f(a):\n  return a + 2\n")
    assert other(1) == 3
