"""Host overhead of the generated code: prims and torch wrappers printed as the
torch calls they make (core/codegen.py: ``direct_source``), checked against
eager, and the Python frames a cached training step enters."""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

import thunderlite
from thunderlite.tests.test_grad_jit import NanoGPT


def _code(jfn) -> str:
    text = str(thunderlite.last_traces(jfn)[-1])
    backward = thunderlite.last_backward_traces(jfn)
    if backward:
        text += str(backward[-1])
    return "\n".join(line.split("  #")[0] for line in text.splitlines() if not line.lstrip().startswith("#"))


def _check(fn, *args):
    """``fn`` jitted (forward and backward) equals eager; returns the printed code."""
    eager_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    jit_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    expected = fn(*eager_args)
    jfn = thunderlite.jit(fn)
    got = jfn(*jit_args)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if isinstance(expected, tuple):         # several outputs: the gradient of their sum
        expected, got = sum(e.sum() for e in expected), sum(g.sum() for g in got)
    if expected.requires_grad:
        expected.sum().backward()
        got.sum().backward()
        for e, g in zip(eager_args, jit_args, strict=True):
            torch.testing.assert_close(g.grad, e.grad, rtol=0, atol=0)
    return _code(jfn)


def test_broadcasts_fold_into_elementwise_calls():
    """A broadcast read by elementwise calls is what torch's broadcasting does
    in them (transforms/fold_views.py): no expand is left, a broadcast into
    leading dims becomes its reshape, and the reshapes around a reduction's
    gradient collapse."""
    def f(x, w, v):
        # w: trailing-aligned broadcast; v[:, None]: a broadcast into leading dims (reshape + expand)
        return x * w + x * v.unsqueeze(-1).expand(2, 3, 4) + x.sum(-1, keepdim=True)
    code = _check(f, torch.randn(2, 3, 4, requires_grad=True), torch.randn(4, requires_grad=True),
                  torch.randn(2, 3, requires_grad=True))
    assert "torchex.broadcast_in_dim" not in code
    assert "expand(" not in code
    assert "torch.mul(x, w)" in code


def test_broadcasts_read_otherwise_print_as_expand():
    """A broadcast a matmul reads (it does not broadcast its operands alike) stays an expand."""
    def f(x, w):
        return torch.matmul(w.expand(2, 4, 4), x)
    code = _check(f, torch.randn(2, 4, 3, requires_grad=True), torch.randn(4, 4, requires_grad=True))
    assert "torchex.broadcast_in_dim" not in code
    assert "torch.Tensor.expand(" in code


@pytest.mark.parametrize("case", ["zero_dim_promotes", "both_sides", "masked_fill", "returned", "where"])
def test_folds_only_where_exact(case):
    """Folds that would change a dtype, a shape or what the caller sees are
    not made; results equal eager's bit for bit either way."""
    x, y = torch.randn(2, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    if case == "zero_dim_promotes":
        # a 0-d float64 expanded is a dimensioned tensor: it promotes the float32 operand
        code = _check(lambda a, s: a * s.expand(2, 3), x, torch.tensor(2.0, dtype=torch.float64))
        assert "expand(" in code
    elif case == "both_sides":
        # each operand is broadcast: one may fold, not both (the result would shrink)
        code = _check(lambda a, b: a.sum(0).expand(2, 3) * b.expand(2, 3), x, y)
        assert code.split("def backward")[0].count("expand(") == 1
    elif case == "masked_fill":
        # masked_fill's first operand sets the shape (its decomposition's where broadcasts alike)
        _check(lambda a, b: b.expand(2, 3).masked_fill(a > 0, 1.0) + a, x, y)
        _check(lambda a, b: b.expand(2, 3).masked_fill(a > 0, 1.0), x.detach(), y.detach())
    elif case == "returned":
        # the caller gets the expanded view itself (a view of b, as eager's)
        code = _check(lambda a, b: (b.expand(2, 3), a * b.expand(2, 3)), x, y)
        assert "torch.Tensor.expand(b, (2, 3))" in code
    else:
        code = _check(lambda a, b: torch.where(a > 0, b.expand(2, 3), a), x, y)
        assert "expand(" not in code.split("def backward")[0]


def test_reshape_chains_read_the_first_input():
    """A reshape of a reshape that only split dims or added 1s reads the first
    one's input; a reshape back to that input's shape is that input."""
    from thunderlite.transforms.fold_views import splits_only
    assert splits_only((32, 128), (2, 16, 128)) and splits_only((2, 16), (2, 16, 1))
    assert splits_only((2, 1, 16), (2, 16)) and not splits_only((2, 16, 8), (2, 128))
    assert not splits_only((6, 4), (4, 6))

    def f(x, w):
        h = (x.reshape(2, 3, 4) * w).reshape(6, 4)
        return h.reshape(2, 3, 4).reshape(6, 4).reshape(24)
    code = _check(f, torch.randn(6, 4, requires_grad=True), torch.randn(4, requires_grad=True))
    forward = code.split("def backward")[0]
    # h.reshape(2, 3, 4).reshape(6, 4) is h; merging dims (6, 4) -> (24,) stays a reshape of its own
    assert forward.count("torch.reshape(") == 3 and forward.count("(2, 3, 4)") == 1


def test_sums_print_as_torch_sum_with_dtype():
    def f(x, i):
        return x.sum((0, 2)) + i.sum(0).float()       # an integer sum keeps int64 (torch.sum widens anyway)
    code = _check(f, torch.randn(2, 3, 4, requires_grad=True), torch.randint(0, 5, (2, 3), dtype=torch.int32))
    assert "torchex.sum(" not in code
    assert "torch.sum(" in code and "dtype=torch.float32" in code


def test_slices_and_pads_print_as_subscripts_and_constant_pad():
    def f(x):
        a, b = x[..., :2], x[..., 2:]
        return torch.cat([-b, a], -1) * x[1:3].repeat(2, 1, 1)[:, :3]
    code = _check(f, torch.randn(4, 3, 4, requires_grad=True))
    assert "torchex.slice_prim" not in code and "torchex.pad" not in code
    assert "torch.constant_pad_nd(" in code      # the slices' backward


def test_strided_slice_prints_its_step():
    code = _check(lambda x: x[1:5:2, ::3] * 2, torch.randn(6, 7, requires_grad=True))
    assert "torchex.slice_prim" not in code
    assert "1:5:2" in code and "0:7:3" in code
    assert "torchex.pad(" in code           # its backward pads with interior zeros: the prim's own function


def test_torch_wrappers_print_as_their_c_calls():
    def f(idx, table, x):
        q, k = torch.split(x, [3, 5], dim=-1)
        e = F.embedding(idx, table, padding_idx=-1)
        return F.silu(q).sum() + k.sum() + e.sum() + F.pad(idx, (1, 2), value=7).sum()   # no grad: runs as F.pad
    code = _check(f, torch.tensor([[0, 3], [2, 3]]), torch.randn(4, 5, requires_grad=True),
                  torch.randn(2, 8, requires_grad=True))
    assert "torch.split_with_sizes(" in code and "torch._C._nn.silu(" in code
    assert "torch.embedding(table, idx, 3, False, False)" in code
    assert "torch._C._nn.pad(" in code


def test_wrappers_without_a_direct_form_keep_their_call():
    def f(x):
        return F.pad(x, (1, 1), mode="reflect") * 2
    code = _check(f, torch.randn(1, 2, 5))
    assert "torch.nn.functional.pad(x, (1, 1), mode='reflect')" in code


def test_interior_padding_keeps_the_prim_function():
    from thunderlite.executors.torchex import pad

    class Bsym:
        args, kwargs = (None, 0.0, ((0, 0, 1),)), {}
    assert pad.direct_source(Bsym, repr) is None
    x = torch.arange(3.0)
    assert torch.equal(pad(x, 0.0, ((1, 0, 1),)), torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 2.0]))


@pytest.mark.parametrize("layers", [1, 2])
def test_cached_training_step_enters_no_prim_wrapper(layers):
    """The generated forward and backward call torch directly: no frame of
    torchex's prim functions, the autograd bridge's comprehensions or ATen's
    Python ``__call__`` in a cached step of a small GPT."""
    torch.manual_seed(0)
    model = NanoGPT(64, 16, 2, layers, 8)
    jm = thunderlite.jit(model)
    batch = tuple(torch.randint(0, 64, (2, 8)) for _ in range(2))
    for _ in range(2):
        jm(*batch).backward()
    entered = []

    def prof(frame, event, arg):
        if event == "call":
            entered.append((frame.f_code.co_filename, frame.f_code.co_name))
    sys.setprofile(prof)
    try:
        jm(*batch).backward()
    finally:
        sys.setprofile(None)
    assert not [e for e in entered if e[0].endswith("torchex.py")]
    assert not [e for e in entered if e[0].endswith("autograd_function.py") and e[1].startswith("<")]
    assert not [e for e in entered if e[0].endswith("_ops.py")]
    assert not [e for e in entered if e[0].endswith(("functional.py", "_VF.py"))]
