"""The Triton executor (executors/triton/executor.py): generated kernels equal eager
PyTorch, one kernel per region, what it refuses falls through to torch. The
in-place suite and the alias fuzzer with ``executors=["triton", "torch"]`` run in
test_inplace_executors.py, the OpInfo sweep in test_triton_opinfo.py.

Without a GPU the kernels run under the Triton interpreter (slow: shapes stay
small here); on a GPU the same tests run natively. Skipped, with the reason,
when triton is not installed."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import thunderlite
from thunderlite.executors.triton.executor import TritonKernel, triton_executor

_ok, _why = triton_executor.is_available()
pytestmark = pytest.mark.skipif(not _ok, reason=f"Triton executor unavailable: {_why}")

EXECUTORS = ["triton", "torch"]


def _device() -> str:
    from thunderlite.executors.triton import runtime
    return runtime.DEVICE_TYPE


def _kernels(jfn) -> list:
    return [b for b in thunderlite.last_traces(jfn)[-1].bound_symbols if isinstance(b.sym.impl, TritonKernel)]


def _others(jfn) -> list[str]:
    return [b.sym.name for b in thunderlite.last_traces(jfn)[-1].bound_symbols
            if not isinstance(b.sym.impl, TritonKernel) and b.sym.name not in ("del", "python_return", "return")]


def _run(fn, *args, atol=None, rtol=None):
    jfn = thunderlite.jit(fn, executors=EXECUTORS)
    torch.testing.assert_close(jfn(*args), fn(*args), atol=atol, rtol=rtol, equal_nan=True)
    return jfn


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=_device())


# --- each family is one kernel ------------------------------------------------------------------

_FAMILIES = {
    "pointwise chain with broadcast": (lambda x, b: ((x * 2 + b).sin() - b.exp()).relu(), [(6, 10), (10,)]),
    "type promotion": (lambda x, i: x * i + (i > 2), [(6, 10), "int"]),
    "softmax": (lambda x: torch.softmax(x, -1), [(5, 33)]),
    "log_softmax over dim 0": (lambda x: F.log_softmax(x, 0), [(5, 33)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (33,), w, b), [(3, 5, 33), (33,), (33,)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (33,), w), [(5, 33), (33,)]),
    "row reductions": (lambda x: (x.sum(-1), x.mean(-1), x.amax(-1), x.amin(-1), x.var(-1)), [(5, 33)]),
    "full reductions": (lambda x: (x.sum(), x.amax()), [(7, 9)]),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), [(6, 17), "target17"]),
    "gelu mlp epilogue": (lambda x, b: F.gelu(x + b, approximate="none") * 0.5, [(4, 16), (16,)]),
}


def _inputs(specs):
    out = []
    for s in specs:
        if s == "int":
            out.append(torch.randint(0, 5, (6, 10), device=_device()))
        elif s == "target17":
            out.append(torch.randint(0, 17, (6,), device=_device()))
        else:
            out.append(_randn(*s))
    return out


@pytest.mark.parametrize("name", list(_FAMILIES))
def test_family_is_one_kernel_equal_to_eager(name):
    fn, specs = _FAMILIES[name]
    jfn = _run(fn, *_inputs(specs))
    assert len(_kernels(jfn)) == 1, thunderlite.last_traces(jfn)[-1]
    assert _others(jfn) == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_half_and_double_compute_like_eager(dtype):
    """float16 is computed in float32 and rounded once at the outputs (the numerics policy,
    docs/architecture.md §6): within eager's own error of a float64 reference."""
    from thunderlite.tests.test_triton_kernels import assert_within_eager_error
    x, w, b = _randn(4, 40, dtype=dtype), _randn(40, dtype=dtype), _randn(40, dtype=dtype)

    def fn(x, w, b):
        return torch.softmax(x, -1), F.layer_norm(x, (40,), w, b), (x * 3 + 1).exp(), x.sum(-1)
    jfn = thunderlite.jit(fn, executors=EXECUTORS)
    assert_within_eager_error(jfn(x, w, b), fn(x, w, b), fn(*(t.double() for t in (x, w, b))))
    assert len(_kernels(jfn)) == 1


def test_strided_expanded_and_offset_inputs():
    base = _randn(12, 20)
    xt = base.t()                       # transposed
    xs = base[2:, ::2]                  # offset and step
    xe = _randn(1, 20).expand(12, 20)   # stride 0
    for x in (xt, xs, xe):
        assert not x.is_contiguous()
        jfn = _run(lambda x: (torch.softmax(x, -1), x * 2 + 1), x)
        assert len(_kernels(jfn)) == 1


def test_nan_and_inf_like_eager():
    x = _randn(4, 9)
    x[0, 3] = float("nan")
    x[1, 2] = float("inf")
    x[2] = float("-inf")
    _run(lambda x: (x.amax(-1), x.amin(-1), torch.softmax(x, -1), torch.maximum(x, x.flip((0,))), x.isnan()), x)


def test_expm1_log1p_tanh_accurate_near_zero_and_at_the_edges():
    """Built from exp/log (the interpreter has no libdevice) with Kahan's corrections."""
    x = torch.cat([_randn(200), _randn(200) * 1e-5, _randn(50) * 30,
                   torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.7, -104.0, float("inf"), float("-inf"), float("nan")],
                                device=_device())])
    jfn = _run(lambda x: (torch.expm1(x), torch.log1p(x.abs()), torch.tanh(x), F.gelu(x, approximate="tanh")), x)
    assert len(_kernels(jfn)) == 1


def test_unsupported_ops_fall_through_to_torch():
    """matmul and a scan are torch's; the pointwise pieces around them, a row longer
    than one block (a looped reduction) and a column sum beside it are kernels."""
    def fn(x, w, y):
        h = (x @ w).sin()               # matmul -> torch; sin -> triton
        z = y.sum(0)                    # column sum of a [3, 20000] tensor: a kernel of its own
        return h * 2, y.amax(-1), z, y.cumsum(-1)
    jfn = _run(fn, _randn(4, 8), _randn(8, 5), _randn(3, 20000))
    assert _others(jfn) == ["matmul", "cumsum"]
    assert len(_kernels(jfn)) >= 3


def test_views_returned_to_the_user_are_not_claimed():
    """A kernel's output is fresh memory; a returned view must alias its input."""
    def fn(x):
        v = x.unsqueeze(0)
        return v, x * 2
    x = _randn(3, 4)
    jfn = thunderlite.jit(fn, executors=EXECUTORS)
    v, _ = jfn(x)
    assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_same_structure_shares_one_compiled_kernel():
    """Kernels are cached by structure, dtypes and shape class: other sizes reuse the source."""
    fn = lambda x: torch.softmax(x * 2, -1)  # noqa: E731
    j1 = _run(fn, _randn(3, 20))
    j2 = _run(fn, _randn(7, 30))
    (k1,), (k2,) = _kernels(j1), _kernels(j2)
    assert k1.sym.impl.source == k2.sym.impl.source
    assert k1.sym.impl._kernel is k2.sym.impl._kernel


def test_block_sizes_and_grid_come_from_the_shapes():
    jfn = _run(lambda x: torch.softmax(x, -1), _randn(7, 30))
    (k,) = _kernels(jfn)
    spec = k.sym.impl.spec
    assert spec.BN == 32 and spec.BM >= 1 and spec.grid == ((7 + spec.BM - 1) // spec.BM,)
    jfn = _run(lambda x, t: F.cross_entropy(x, t), _randn(9, 5), torch.randint(0, 5, (9,), device=_device()))
    (k,) = _kernels(jfn)
    assert k.sym.impl.spec.grid == (1,) and k.sym.impl.spec.plan.looped      # the batch mean: one looping program


def test_kernel_source_and_trace_show_the_fusion():
    jfn = _run(lambda x, w: F.rms_norm(x, (16,), w) + 1, _randn(4, 16), _randn(16))
    src = thunderlite.kernel_source(jfn)
    assert "def fusion_" in src and "tl.load" in src and "tl.reduce" in src and "tl.store" in src
    assert "triton.fusion" in str(thunderlite.last_traces(jfn)[-1])
    compile(src.split("\n", 1)[1], "<kernel>", "exec")      # the source (after its comment line) is Python


def test_backward_of_a_claimed_forward_matches_eager():
    x = _randn(4, 12).requires_grad_()
    w = _randn(12).requires_grad_()
    fn = lambda x, w: (F.layer_norm(x, (12,), w) * x.sigmoid()).sum()  # noqa: E731
    jfn = thunderlite.jit(fn, executors=EXECUTORS)
    got = jfn(x, w)
    got.backward()
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    fn(x, w).backward()
    torch.testing.assert_close(got, fn(x, w))
    torch.testing.assert_close((gx, gw), (x.grad, w.grad))
    assert _kernels(jfn)


def test_interpreter_mode_does_not_leak_into_the_environment():
    """The mode is chosen at import; TRITON_INTERPRET is set only around decoration."""
    code = ("import os, torch, thunderlite\n"
            "f = thunderlite.jit(lambda x: x.exp() + 1, executors=['triton'])\n"
            "x = torch.randn(8)\n"
            "torch.testing.assert_close(f(x), x.exp() + 1)\n"
            "from thunderlite.executors.triton import runtime as rt\n"
            "print(rt.INTERPRET, os.environ.get('TRITON_INTERPRET'))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(not torch.cuda.is_available()), "None"]
