"""Writes eager PyTorch refuses are refused with eager's message and the
user's line (docs/architecture.md §5): a leaf that requires grad (or a view of one) while
grad mode is on, an inference tensor, an expanded view."""
from __future__ import annotations

import pytest
import torch

from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.transforms.aliasing.update_aliases import check_writes, update_aliases

_LINE = ("model.py", 7, "p.add_(1)")


def _record(build, requires_grad=True):
    trc = Trace()
    with tracectx(trc):
        p = TensorProxy((2, 3), name="p", requires_grad=requires_grad)
        trc.args = [p]
        trc.source = _LINE
        trc.set_return(build(p))
    return trc


def _eager_message(fn) -> str:
    with pytest.raises(RuntimeError) as info:
        fn()
    return str(info.value)


def test_write_into_leaf_requiring_grad():
    trc = _record(lambda p: prims.copy_(prims.sin(p), p))
    msg = _eager_message(lambda: torch.randn(2, 3, requires_grad=True).add_(1))
    with pytest.raises(RuntimeError) as info:
        update_aliases(trc, leaf_inputs={"p"})
    assert str(info.value).startswith(msg) and "model.py:7: p.add_(1)" in str(info.value)


def test_write_into_view_of_leaf_requiring_grad():
    trc = _record(lambda p: prims.copy_(prims.full((1, 3), 0.0, device="cpu", dtype=torch.float32),
                                        prims.slice_prim(p, (0, 0), (1, 3))))
    msg = _eager_message(lambda: torch.randn(2, 3, requires_grad=True)[0:1].zero_())
    with pytest.raises(RuntimeError) as info:
        check_writes(trc, leaf_inputs={"p"})
    assert str(info.value).startswith(msg)


def test_write_into_leaf_without_grad_mode_is_allowed():
    def build(p):
        new = prims.copy_(prims.sin(p), p)
        new.requires_grad = False          # what the jit records under torch.no_grad()
        return new
    check_writes(_record(build), leaf_inputs={"p"})
    check_writes(_record(lambda p: prims.copy_(prims.sin(p), p)), leaf_inputs=())   # not a leaf


def test_write_into_inference_tensor():
    trc = _record(lambda p: prims.copy_(prims.sin(p), p), requires_grad=False)
    with torch.inference_mode():
        t = torch.ones(3)
    msg = _eager_message(lambda: t.add_(1))
    with pytest.raises(RuntimeError) as info:
        check_writes(trc, inference_inputs={"p"})
    assert str(info.value).startswith(msg)


def test_write_through_expanded_view():
    def build(p):
        row = prims.slice_prim(p, (0, 0), (1, 3))
        wide = prims.broadcast_in_dim(row, (4, 3), (0, 1))
        return prims.copy_(prims.sin(prims.full((4, 3), 1.0, device="cpu", dtype=torch.float32)), wide)
    trc = _record(build, requires_grad=False)
    msg = _eager_message(lambda: torch.zeros(2, 3)[0:1].expand(4, 3).copy_(torch.ones(4, 3).sin()))
    with pytest.raises(RuntimeError) as info:
        update_aliases(trc)
    assert str(info.value).startswith(msg)


def test_write_into_a_plain_view_is_fine():
    def build(p):
        return prims.copy_(prims.full((1, 3), 1.0, device="cpu", dtype=torch.float32),
                           prims.slice_prim(p, (0, 0), (1, 3)))
    check_writes(_record(build, requires_grad=False))


def test_filling_an_expanded_view_is_allowed_as_in_eager():
    torch.zeros(2, 3)[0:1].expand(4, 3).fill_(1.0)                  # eager allows it

    def build(p):
        wide = prims.broadcast_in_dim(prims.slice_prim(p, (0, 0), (1, 3)), (4, 3), (0, 1))
        return prims.copy_(prims.full((4, 3), 1.0, device="cpu", dtype=torch.float32), wide)
    check_writes(_record(build, requires_grad=False))
