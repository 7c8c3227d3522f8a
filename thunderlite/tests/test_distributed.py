"""Distributed (issues 13, 28): collectives traced as symbols, run by gloo in
two processes on localhost; ``thunderlite.distributed.ddp`` / ``fsdp``, torch's
DDP (both ways round), FSDP2 and tensor parallelism under ``jit`` against a
single-process eager model trained on the full batch. Each case spawns its
ranks (bounded in time; every rank exits on its own; several checks share a
spawn) and passes when every rank's own assertions held. Trace-level checks
(the scheduling pass, FSDP2/TP traces, refusals) run in one process on a
one-rank group, on CUDA/NCCL too when a GPU is present."""
from __future__ import annotations

import copy
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import thunderlite
from thunderlite.tests import dist_workers
from thunderlite.tests.conftest import one_rank

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available in this build")
WORLD = 2
TIMEOUT_S = 240


def _spawn(worker) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")       # a file of this run's own: no port shared with a concurrent run
        ctx = mp.start_processes(worker, args=(WORLD, store), nprocs=WORLD, join=False, start_method="spawn")
        end = time.monotonic() + TIMEOUT_S
        while not ctx.join(timeout=5):
            if time.monotonic() > end:
                for p in ctx.processes:
                    p.kill()
                pytest.fail(f"{worker.__name__}: ranks still running after {TIMEOUT_S} s")


# several checks per spawn: starting two ranks costs more than most checks
@pytest.mark.parametrize("worker", [dist_workers.collectives_and_their_gradients,
                                    dist_workers.gathers_in_flight_together,
                                    dist_workers.data_parallel_matches_single_process,
                                    dist_workers.sharded_models_match_single_process],
                         ids=lambda w: w.__name__)
def test_two_ranks(worker):
    _spawn(worker)


def test_issue_early_wait_late_and_issue_order_kept(one_rank_group):
    def f(a, b):
        x = a.exp()
        dist.all_reduce(x)                  # in place: issue, wait, copy_
        y = b.cos() * 3                     # independent of x: runs while x is in flight
        dist.all_reduce(y)
        return x + 1, y
    a, b = torch.randn(4), torch.randn(4)
    jf = thunderlite.jit(f)
    out = jf(a.clone(), b.clone())
    torch.testing.assert_close(out, f(a.clone(), b.clone()))       # one rank: all_reduce is the identity
    lines = [ln.strip() for ln in str(thunderlite.last_traces(jf)[-1]).splitlines()
             if not ln.strip().startswith(("#", "del("))]
    issues = [i for i, ln in enumerate(lines) if "dist.all_reduce(" in ln]
    waits = [i for i, ln in enumerate(lines) if "dist.wait(" in ln]
    cos = next(i for i, ln in enumerate(lines) if "torch.cos(" in ln)
    assert len(issues) == 2 and len(waits) == 2
    assert issues[0] < cos < waits[0], "the first wait moved after the independent compute"
    assert issues[1] < waits[0], "both collectives are in flight together"


def test_inplace_collective_goes_through_update_aliases(one_rank_group):
    def f(a):
        v = a[1:]
        dist.all_reduce(v)                  # writes through a view of the argument
        return a * 2
    a = torch.randn(5)
    ref = a.clone()
    got = thunderlite.jit(f)(a)
    torch.testing.assert_close(got, f(ref))
    torch.testing.assert_close(a, ref)


def test_collective_symbols_are_never_dead_code(one_rank_group):
    def f(a):
        t = a + 1
        dist.all_reduce(t)                  # result unused: other ranks still wait for it
        return a * 2
    jf = thunderlite.jit(f)
    jf(torch.randn(3))
    assert "dist.all_reduce(" in str(thunderlite.last_traces(jf)[-1])


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_wrappers_require_a_process_group(wrap):
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    import thunderlite.distributed as td
    with pytest.raises(RuntimeError, match="init_process_group"):
        getattr(td, wrap)(torch.nn.Linear(2, 2))


def test_fsdp_one_rank_gathers_where_used_and_matches_eager(one_rank_group):
    import copy

    from thunderlite.distributed import fsdp, full_state_dict
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    ref = copy.deepcopy(net)
    model = thunderlite.jit(fsdp(net))
    x = torch.randn(5, 4)
    torch.testing.assert_close(model(x), ref(x))
    model(x).sum().backward()
    ref(x).sum().backward()
    grads = {n.removeprefix("module.").replace("_fsdp_shard_", ""): p.grad for n, p in model.named_parameters()}
    for n, p in ref.named_parameters():
        torch.testing.assert_close(grads[n].view(p.shape), p.grad)     # one rank: the shard is everything
    assert set(full_state_dict(model)) == set(ref.state_dict())


@pytest.mark.usefixtures("one_rank_group")
def test_torch_ddp_options_the_trace_does_not_honour_are_refused_by_name():
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with pytest.raises(NotImplementedError, match="broadcast_buffers=True.*DistributedDataParallel\\(thunderlite.jit"):
        thunderlite.jit(torch.nn.parallel.DistributedDataParallel(net))
    ok = thunderlite.jit(torch.nn.parallel.DistributedDataParallel(net, broadcast_buffers=False))
    x = torch.randn(3, 4)
    torch.testing.assert_close(ok(x), net(x))


def test_data_parallel_without_devices_compiles_its_module():
    net = torch.nn.Linear(4, 3)
    jm = thunderlite.jit(torch.nn.DataParallel(net, device_ids=[]))
    x = torch.randn(2, 4)
    torch.testing.assert_close(jm(x), net(x))


@pytest.fixture(params=["cpu", "cuda"])
def one_rank_mesh(request):
    """A one-rank process group and device mesh: gloo on CPU, NCCL on CUDA
    (skipped without a GPU); one rank still traces every collective."""
    device = request.param
    if device == "cuda" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        pytest.skip("needs CUDA and NCCL (runs in scripts/gpu_checks.sh)")
    from torch.distributed.device_mesh import init_device_mesh
    with one_rank("gloo" if device == "cpu" else "nccl"):
        yield init_device_mesh(device, (1,))


def _grads_equal(sharded: torch.nn.Module, ref: torch.nn.Module) -> None:
    for (n, p), r in zip(sharded.named_parameters(), ref.parameters(), strict=True):
        assert type(p.grad) is type(p.data), n          # a DTensor parameter's gradient is a DTensor
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        torch.testing.assert_close(grad, r.grad, msg=lambda m, n=n: f"{n}: {m}")


def test_fsdp2_and_tensor_parallel_one_rank_traces(one_rank_mesh):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    device = one_rank_mesh.device_type
    torch.manual_seed(0)
    ref = dist_workers._Block().to(device)
    x = torch.randn(2, 4, 16, device=device)
    sharded = copy.deepcopy(ref)
    for layer in (sharded.q, sharded.o):
        fully_shard(layer, mesh=one_rank_mesh)
    fully_shard(sharded, mesh=one_rank_mesh)
    tp = copy.deepcopy(ref)
    parallelize_module(tp, one_rank_mesh, {"q": ColwiseParallel(), "up": ColwiseParallel(),
                                           "o": RowwiseParallel(), "down": RowwiseParallel()})
    ref(x).square().mean().backward()
    for model, gathers in ((sharded, True), (tp, False)):
        jm = thunderlite.jit(model)
        out = jm(x)
        torch.testing.assert_close(out, ref(x))
        out.square().mean().backward()
        _grads_equal(model, ref)
        fwd, bwd = str(thunderlite.last_traces(jm)[-1]), str(thunderlite.last_backward_traces(jm)[-1])
        if gathers:       # every parameter gathered; the gradients reduce-scattered
            n = len(list(ref.parameters()))
            assert fwd.count("dist.all_gather(") == n and bwd.count("dist.reduce_scatter(") == n
        else:             # o and down: partial sums all-reduced; up's input gradient too
            assert fwd.count("dist.all_reduce(") == 2 and bwd.count("dist.all_reduce(") == 1


def test_dtensor_constructs_not_translated_are_refused_by_name(one_rank_mesh):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, SequenceParallel, parallelize_module
    if one_rank_mesh.device_type != "cpu":
        pytest.skip("refusals are device independent: checked once, on CPU")

    def net():
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 4))
    # DTensor arguments and from_local are traced (test_dtensor.py); what they cannot do is refused there
    from torch.distributed.tensor import DTensor, Shard
    dt = distribute_tensor(torch.randn(4), one_rank_mesh, [Replicate()])
    torch.testing.assert_close(thunderlite.jit(lambda t: t * 2)(dt).full_tensor(), dt.full_tensor() * 2)

    def wraps(t):
        return DTensor.from_local(t, one_rank_mesh, [Shard(0)]).full_tensor()
    t = torch.randn(4)
    torch.testing.assert_close(thunderlite.jit(wraps)(t), t)
    with pytest.raises(NotImplementedError, match=r"DTensor or FSDP internals: distribute_tensor\(\.\.\.\) at "):
        thunderlite.jit(lambda t: distribute_tensor(t, one_rank_mesh, [Shard(0)]))(t)
    with pytest.raises(NotImplementedError, match=r"ColwiseParallel\(.*use_local_output=False\) on module '0'"):
        thunderlite.jit(parallelize_module(net(), one_rank_mesh, {"0": ColwiseParallel(use_local_output=False)}))
    with pytest.raises(NotImplementedError, match="SequenceParallel on module '1' \\(LayerNorm\\)"):
        thunderlite.jit(parallelize_module(net(), one_rank_mesh, {"1": SequenceParallel()}))
    whole = fully_shard(net(), mesh=one_rank_mesh)
    inside = thunderlite.jit(lambda t: whole(t))                    # reached inside a function: its view runs
    t = torch.randn(2, 4)
    torch.testing.assert_close(inside(t), thunderlite.jit(whole)(t))
    assert str(thunderlite.last_traces(inside)[-1]).count("dist.all_gather(") == len(list(whole.parameters()))
    plain = net()
    plain.load_state_dict({k: v.full_tensor() for k, v in whole.state_dict().items()})

    def whole_step(model, opt, t):          # the backward and the optimizer over DTensor parameters: traced
        model(t).sum().backward()
        opt.step()
        opt.zero_grad()
    jstep = thunderlite.jit(whole_step)
    opt, ropt = torch.optim.SGD(whole.parameters(), lr=0.1), torch.optim.SGD(plain.parameters(), lr=0.1)
    for _ in range(2):
        jstep(whole, opt, t)
        whole_step(plain, ropt, t)
    for p, r in zip(whole.parameters(), plain.parameters(), strict=True):
        assert isinstance(p, DTensor)
        torch.testing.assert_close(p.full_tensor(), r)
    from torch.distributed.fsdp import FullyShardedDataParallel
    with pytest.raises(NotImplementedError, match=r"FullyShardedDataParallel \(FSDP1\)"):
        thunderlite.jit(FullyShardedDataParallel(net(), device_id=torch.device("cpu")))
    inner, plain = net(), net()
    plain.load_state_dict(inner.state_dict())
    fully_shard(inner[0], mesh=one_rank_mesh)       # no root: inner[0] is a root of its own, as in eager FSDP2
    j = thunderlite.jit(inner)
    t = torch.randn(3, 4)
    torch.testing.assert_close(j(t), plain(t))
    assert str(thunderlite.last_traces(j)[-1]).count("dist.all_gather(") == 2     # inner[0]'s weight and bias
    divided = fully_shard(net(), mesh=one_rank_mesh)
    divided.set_gradient_divide_factor(3.0)
    with pytest.raises(NotImplementedError, match=r"set_gradient_divide_factor\(\)"):
        thunderlite.jit(divided)
    no_sync = fully_shard(net(), mesh=one_rank_mesh)
    no_sync.set_requires_gradient_sync(False)       # honoured inside a whole step only (test_distributed_step.py)
    with pytest.raises(NotImplementedError, match=r"set_requires_gradient_sync\(False\) \(on \['the root'\]\) "
                       "with the backward outside the jitted function"):
        thunderlite.jit(no_sync)(torch.randn(2, 4))
