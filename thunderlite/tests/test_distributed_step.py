"""A whole training step jitted as one function over torch's distributed
models (issue 37): ``loss.backward()``, clipping and the optimizer inside the
trace with a DDP, FSDP2 (``fully_shard``) or tensor-parallel model. Two gloo
ranks against one process on the whole batches (dist_step_workers.py, one
spawn); what the traces order and what is refused, on a one-rank group in
this process."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import thunderlite
from thunderlite.tests import dist_step_workers as w
from thunderlite.tests.test_distributed import _spawn

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available in this build")


def test_two_ranks_whole_steps_match_single_process():
    _spawn(w.whole_steps_match_single_process)


@pytest.fixture
def mesh(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (1,))


def test_what_a_step_cannot_honour_is_refused_at_the_first_call_by_name(one_rank_group):
    """torch's DDP options a trace does not honour (buffers synced by a hook, a
    gradient communication hook), and a parameter the backward leaves without
    gradient (torch's ``find_unused_parameters`` case), refused at the call
    inside the step with the option and the user's line."""
    DDP = torch.nn.parallel.DistributedDataParallel
    x, y = torch.randn(4, 8), torch.randn(4, 5)
    bn = DDP(torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.BatchNorm1d(5)))
    bn._register_buffer_comm_hook(None, lambda state, buffers: None)
    with pytest.raises(NotImplementedError,
                       match=r"buffer communication hook.*\(at .*loss = F\.mse_loss\(model\(x\), y\)"):
        thunderlite.jit(w.step)(bn, torch.optim.SGD(bn.parameters(), lr=0.1), x, y)
    hooked = DDP(w.net())
    hooked.register_comm_hook(None, lambda state, bucket: None)
    with pytest.raises(NotImplementedError, match=r"communication hook \(register_comm_hook\)"):
        thunderlite.jit(w.step)(hooked, torch.optim.SGD(hooked.parameters(), lr=0.1), x, y)

    class Unused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = torch.nn.Linear(8, 5), torch.nn.Linear(8, 5)

        def forward(self, x):
            return self.used(x)
    m = Unused()
    with pytest.raises(NotImplementedError, match=r"\['unused.weight', 'unused.bias'\].*find_unused_parameters"):
        thunderlite.jit(w.step)(DDP(m), torch.optim.SGD(m.parameters(), lr=0.1), x, y)


def _one_rank_fsdp2(mesh) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard
    m = w.net()
    for k in (0, 2, 4):
        fully_shard(m[k], mesh=mesh)
    return fully_shard(m, mesh=mesh)


def test_fsdp2_gradient_sync_off_must_end_inside_the_step(mesh):
    """FSDP2's ``set_requires_gradient_sync(False)`` keeps unsharded gradients in
    the program: left off when the jitted function returns, or with the
    backward outside it, it is refused naming the option."""
    x, y = torch.randn(4, 8), torch.randn(4, 5)
    m = _one_rank_fsdp2(mesh)

    def micro_step(model, x, y):
        model.set_requires_gradient_sync(False)
        F.mse_loss(model(x), y).backward()
    with pytest.raises(NotImplementedError, match=r"set_requires_gradient_sync\(False\).*pending when the jitted "
                       r"function returns"):
        thunderlite.jit(micro_step)(m, x, y)
    assert all(pg.reduce_grads for pg in (m[0]._get_fsdp_state()._fsdp_param_groups)), "a refused call wrote"
    m.set_requires_gradient_sync(False)
    with pytest.raises(NotImplementedError, match=r"set_requires_gradient_sync\(False\) \(on .*\) with the backward "
                       r"outside the jitted function"):
        thunderlite.jit(lambda x, y: F.mse_loss(m(x), y))(x, y)


def test_one_rank_step_over_fsdp2_accumulates_as_eager(mesh):
    """On one rank the reduce-scatters are the identity: the step with
    ``set_requires_gradient_sync(False)`` for the first micro-batch equals the
    unsharded model's, and the flags come back as the step left them; the trace
    has one reduce-scatter per parameter."""
    m, ref = _one_rank_fsdp2(mesh), w.net()
    opt, ropt = torch.optim.AdamW(m.parameters(), lr=1e-2), torch.optim.AdamW(ref.parameters(), lr=1e-2)
    jstep = thunderlite.jit(w.fsdp2_accumulation_step)
    xs, ys = w._batches(3, True)
    for s in range(2):
        torch.testing.assert_close(jstep(m, opt, xs[s], ys[s]).full_tensor(),
                                   w.accumulation_step(ref, ropt, xs[s], ys[s]))
    w._same_params(m, ref, "one rank")
    assert str(thunderlite.last_traces(jstep)[-1]).count("dist.reduce_scatter(") == 6


def test_thunderlite_ddp_no_sync_inside_a_step(one_rank_group):
    """``thunderlite.distributed.ddp(m)`` called by a step with its own
    ``no_sync()`` inside: the program averages the accumulated gradients once
    (one all-reduce), and leaving the block registers none of the hooks that
    average after an eager backward."""
    from thunderlite.distributed import ddp
    m, ref = w.net(), w.net()
    model = ddp(m)

    def step(model, opt, xs, ys):
        with model.no_sync():
            F.mse_loss(model(xs[0]), ys[0]).backward()
        F.mse_loss(model(xs[1]), ys[1]).backward()
        opt.step()
        opt.zero_grad()
    opt, ropt = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    jstep = thunderlite.jit(step)
    xs, ys = w._batches(4, True)
    for s in range(2):
        jstep(model, opt, xs[s], ys[s])
        for i in range(2):
            F.mse_loss(ref(xs[s][i]), ys[s][i]).backward()
        ropt.step()
        ropt.zero_grad()
    w._same_params(m, ref, "ddp(m) no_sync")
    assert not model._pending_hooks and model.require_backward_grad_sync
    assert str(thunderlite.last_traces(jstep)[-1]).count("dist.all_reduce(") == 1
