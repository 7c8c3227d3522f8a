"""DTensor proxies (issue 28): ``DTensor`` arguments and ``DTensor.from_local``
inside jitted functions, traced on the local tensors with the collectives
torch's sharding propagation asks for, against eager ``DTensor``
(``dist_workers.dtensor_program_checks``): on a one-rank group in-process and
on two gloo ranks (one spawn). Refusals name the construct and the line."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import thunderlite
from thunderlite.distributed.dtensor import DTensorRefused
from thunderlite.tests import dist_workers
from thunderlite.tests.test_distributed import _spawn

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available in this build")


def test_dtensor_programs_one_rank(one_rank_group):
    dist_workers.dtensor_program_checks(1)


def test_dtensor_programs_two_ranks():
    _spawn(dist_workers.dtensor_programs_match_eager)


def test_refusals_name_the_construct_and_line(one_rank_group):
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
    mesh = init_device_mesh("cpu", (1,))
    x = distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)])

    def setitem(t):
        t[0] = 1
        return t
    with pytest.raises(DTensorRefused, match=r"(?s)in-place op __setitem__.*t\[0\] = 1"):
        thunderlite.jit(setitem)(x)
    before = x.full_tensor().clone()

    def rewrites_placement(t):
        s = t.sum()                         # a Partial sum: adding 1 needs it all-reduced first, in place
        s.add_(1)
        return s
    with pytest.raises(DTensorRefused, match=r"(?s)add_ on a DTensor.*s.add_\(1\)"):
        thunderlite.jit(rewrites_placement)(x)
    torch.testing.assert_close(x.full_tensor(), before)      # refused: nothing written
    flat = init_device_mesh("cpu", (1, 1))
    with pytest.raises(DTensorRefused, match=r"2-dimensional device mesh"):
        thunderlite.jit(lambda t: t + 1)(distribute_tensor(torch.randn(2, 2), flat, [Shard(0), Shard(1)]))


class _Holder(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = torch.nn.Parameter(w, requires_grad=False)


def test_dtensor_module_attribute_is_guarded_and_unpacked(one_rank_group):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
    mesh = init_device_mesh("cpu", (1,))
    m = _Holder(distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)]))

    def f(x):
        return (x @ m.w.T).full_tensor()
    x = distribute_tensor(torch.randn(2, 3), mesh, [Replicate()])
    jf = thunderlite.jit(f)
    torch.testing.assert_close(jf(x), f(x))
    prologue = str(thunderlite.last_prologue_traces(jf)[-1])
    assert "w.placements" in prologue and "w._local_tensor" in prologue, prologue
    with torch.no_grad():
        m.w.mul_(2)             # the same DTensor written in place: the next call reads it
    torch.testing.assert_close(jf(x), f(x))
    m.w = torch.nn.Parameter(distribute_tensor(m.w.full_tensor(), mesh, [Replicate()]), requires_grad=False)
    torch.testing.assert_close(jf(x), f(x))          # new placements: the guard fails, a new program
    assert thunderlite.cache_info(jf)["misses"] == 2, thunderlite.cache_info(jf)
