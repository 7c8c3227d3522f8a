"""transforms/reuse_buffers.py: an elementwise result written into an input
that dies there (``out=``), never into storage anything else can still see."""
from __future__ import annotations

import pytest
import torch

import thunderlite
from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy, proxy_of_tensor
from thunderlite.core.verify import verify_trace
from thunderlite.executors import torchex
from thunderlite.executors.run import compile_trace
from thunderlite.tests.test_grad_prims import trace_of
from thunderlite.transforms.del_last_used import del_last_used
from thunderlite.transforms.reuse_buffers import reuse_buffers

F64 = torch.float64


def _reused(fn, *args):
    """The final trace of ``fn`` with buffers reused, checked against the same
    trace without reuse on fresh copies of ``args``."""
    claimed = del_last_used(compile_trace(trace_of(fn, args))[0])
    reused = reuse_buffers(claimed, torchex.writes_out)
    verify_trace(reused)
    want = claimed.python_callable()(*[a.clone() for a in args])
    copies = [a.clone() for a in args]
    got = reused.python_callable()(*copies)
    torch.testing.assert_close(got, want)
    for a, c in zip(args, copies, strict=True):
        assert torch.equal(a, c), "an input was written"
    return reused


def _targets(trace) -> list[str]:
    return [b.kwargs["out"].name for b in trace.bound_symbols if "out" in b.kwargs]


def _x(*shape):
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(0))


def test_a_dying_intermediate_takes_the_result():
    t = _reused(lambda a: prims.add(prims.mul(a, 2.0), 1.0), _x(3, 4))
    (add,) = [b for b in t.bound_symbols if "out" in b.kwargs]
    assert add.kwargs["out"] is add.args[0] and add.sym.name == "add"


def test_inputs_are_never_written():
    assert _targets(_reused(lambda a, b: prims.add(a, b), _x(3), _x(3))) == []


def test_no_write_while_a_view_of_the_buffer_lives():
    def fn(a):
        t = prims.mul(a, 2.0)
        v = prims.reshape(t, (12,))
        u = prims.add(t, 1.0)                 # t's last use, but v still reads its storage
        return u, prims.mul(v, 3.0)
    t = _reused(fn, _x(3, 4))
    mul_t, reshape = t.bound_symbols[0], next(b for b in t.bound_symbols if b.sym.name == "reshape")
    # not t at the add; the reshape at the last mul, once t has died (it holds the whole buffer)
    assert _targets(t) == [reshape.output.name] and mul_t.output.name not in _targets(t)


def test_a_strided_view_is_never_written():
    def fn(a):
        t = prims.mul(a, 2.0)
        v = prims.permute(t, (1, 0))           # not a reshape: only _RESHAPES of an owned buffer count
        return prims.mul(v, 3.0)
    assert _targets(_reused(fn, _x(3, 4))) == []


def test_a_returned_view_keeps_its_base():
    def fn(a):
        t = prims.mul(a, 2.0)
        return prims.add(t, 1.0), prims.permute(t, (1, 0))
    assert _targets(_reused(fn, _x(3, 4))) == []


def test_a_dead_view_does_not_block():
    def fn(a):
        t = prims.mul(a, 2.0)
        s = prims.sum(prims.reshape(t, (12,)), (0,))    # the view dies here
        return prims.add(t, prims.broadcast_in_dim(s, (3, 4), ()))
    t = _reused(fn, _x(3, 4))
    assert len(_targets(t)) == 1


def test_never_broadcast_into_a_smaller_input():
    def fn(a, b):
        return prims.add(prims.broadcast_in_dim(prims.mul(a, 2.0), (3, 4), (1,)), b)
    assert _targets(_reused(fn, _x(4), _x(3, 4))) == []


def test_dtype_change_is_not_written_in_place():
    fn = lambda a: prims.convert_element_type(prims.mul(a, 2.0), torch.float32)    # noqa: E731
    assert _targets(_reused(fn, _x(3))) == []


_IMPLS = {i.of: i.symbol for i in torchex.ex.implementations()}
_ELEMENTWISE = prims.UNARY + prims.BINARY + prims.TERNARY + ["where"]


def _args(name: str, x: torch.Tensor) -> tuple:
    if name.startswith(("bitwise", "logical")):
        x = (x * 10).to(torch.int32)
    return {"where": (x > 1, x, x.flip(0)), "lerp": (x, x.flip(0), 0.3), "polygamma": (1, x)}.get(
        name, (x,) if name in prims.UNARY else (x, x.flip(0)))


@pytest.mark.parametrize("name", _ELEMENTWISE)
def test_out_capable_functions_take_out(name):
    """``writes_out`` promises ``fn(*args, out=a)`` computes ``fn(*args)`` into
    ``a`` for the calls it accepts (a tensor first; where: three tensors)."""
    sym = _IMPLS[getattr(prims, name)]
    args = _args(name, torch.rand(4, dtype=F64) + 0.5)
    bsym = sym.bind(*[proxy_of_tensor(a, name=f"a{i}") if isinstance(a, torch.Tensor) else a
                      for i, a in enumerate(args)], output=None)
    if not torchex.writes_out(bsym):
        assert name in torchex._NO_OUT or not isinstance(args[0], torch.Tensor)
        return
    want = sym.impl(*args)
    out = torch.empty_like(want)
    assert sym.impl(*args, out=out) is out
    torch.testing.assert_close(out, want, equal_nan=True)


def _sin_plus_cos(x, w):
    h = x @ w
    return (h.sin() + h.cos()).sum()


def test_gradient_accumulation_is_in_place_and_correct():
    x, w = _x(5, 3).requires_grad_(), _x(3, 4).requires_grad_()
    jf = thunderlite.jit(_sin_plus_cos)
    jf(x, w).backward()
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    _sin_plus_cos(x, w).backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)
    bwd = thunderlite.last_backward_traces(jf)[-1]
    assert bwd.stage == "reuse_buffers"
    adds = [b for b in bwd.bound_symbols if b.sym.name == "add"]
    assert adds and all("out" in b.kwargs for b in adds), str(bwd)


def test_saved_values_and_gradients_given_to_the_backward_are_not_written():
    x, w = _x(5, 3).requires_grad_(), _x(3, 4).requires_grad_()
    jf = thunderlite.jit(_sin_plus_cos)
    jf(x, w).backward()
    bwd = thunderlite.last_backward_traces(jf)[-1]
    foreign = {p.name for p in bwd.args if isinstance(p, TensorProxy)}
    foreign |= {o.name for b in bwd.bound_symbols if b.sym.executor is None for o in b.tensor_outs()}
    assert _targets(bwd) and not set(_targets(bwd)) & foreign


def test_activation_backward_kernels_write_into_the_incoming_gradient():
    """gelu/silu/tanh/sigmoid backward kernels are elementwise: the backward
    gives them the dying incoming gradient as ``out`` (their ATen ``grad_input``
    overload), so no fresh buffer is allocated; the gradients equal eager's."""
    import torch.nn.functional as F

    for act in (F.gelu, F.silu, torch.tanh, torch.sigmoid):
        def fn(x, w):
            return (act(x @ w) @ w.t()).sum()

        x, w = _x(5, 4).requires_grad_(), _x(4, 4).requires_grad_()
        jf = thunderlite.jit(fn)
        jf(x, w).backward()
        got = x.grad, w.grad
        x.grad = w.grad = None
        fn(x, w).backward()
        torch.testing.assert_close(got[0], x.grad)
        torch.testing.assert_close(got[1], w.grad)
        bwd = thunderlite.last_backward_traces(jf)[-1]
        kernels = [b for b in bwd.bound_symbols if b.sym.name.endswith("_backward")]
        assert len(kernels) == 1 and kernels[0].kwargs.get("out") is kernels[0].args[0], str(bwd)


def _final_targets(jfn) -> list[str]:
    return _targets(thunderlite.last_traces(jfn)[-1])


def test_a_program_without_grad_reuses_its_dying_intermediates():
    """The torch-language call itself (``torch.add(t, 1)``, ``torch.sin(t)``)
    takes ``out=`` of a dying intermediate; inputs are never written."""
    def f(a, b):
        return (a * b + 1).sin().sum()
    jf = thunderlite.jit(f)
    a, b = torch.randn(8), torch.randn(8)
    a0, b0 = a.clone(), b.clone()
    torch.testing.assert_close(jf(a, b), f(a0, b0))
    assert torch.equal(a, a0) and torch.equal(b, b0)
    assert _final_targets(jf) == ["t0", "t1"]
    with torch.no_grad():
        jn = thunderlite.jit(lambda x: (x.exp() * 2).tanh())
        x = torch.randn(4, 3)
        torch.testing.assert_close(jn(x), (x.exp() * 2).tanh())
        assert len(_final_targets(jn)) == 2


def test_a_leaf_made_inside_a_program_without_grad_is_never_written_with_out():
    """Autograd refuses ``out=`` where it records: a factory with
    ``requires_grad=True`` makes a leaf the trace's proxies do not mark."""
    def f(x):
        w = torch.ones(3, requires_grad=True)
        return ((w * x).exp() + 1).sin()
    jf = thunderlite.jit(f)
    x = torch.randn(3)
    out = jf(x)
    assert out.requires_grad
    torch.testing.assert_close(out, f(x))
    assert _final_targets(jf) == []
