"""Workers for test_distributed_step.py: a whole training step (forward,
``loss.backward()``, clipping, the optimizer) jitted as one function over
torch's DDP, FSDP2 (``fully_shard``) and tensor-parallel models, on two gloo
ranks, against one process trained on the whole batches. Each worker asserts
its own results; the test only checks that every rank exited cleanly."""
from __future__ import annotations

import copy
import re

import torch
import torch.nn.functional as F

import thunderlite
from thunderlite.tests.dist_workers import _group

CLIP = 0.05


def net() -> torch.nn.Module:
    """Three linear layers; 5 outputs, so FSDP2 splits the last one unevenly (3 + 2 rows)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 5))


# --- the steps, written as a user writes them ---------------------------------------------------
def step(model, opt, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def accumulation_step(model, opt, xs, ys):
    """Two micro-batches, then clipping; the one-process reference and tensor parallelism."""
    for i in range(2):
        F.mse_loss(model(xs[i]), ys[i]).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    opt.zero_grad()
    return norm


def ddp_accumulation_step(model, opt, xs, ys):
    with model.no_sync():                        # the first micro-batch: local gradients only
        F.mse_loss(model(xs[0]), ys[0]).backward()
    F.mse_loss(model(xs[1]), ys[1]).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    opt.zero_grad()
    return norm


def fsdp2_accumulation_step(model, opt, xs, ys):
    model.set_requires_gradient_sync(False)      # the first micro-batch: unsharded gradients kept
    F.mse_loss(model(xs[0]), ys[0]).backward()
    model.set_requires_gradient_sync(True)
    F.mse_loss(model(xs[1]), ys[1]).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    opt.zero_grad()
    return norm


def _sgd(ps):
    return torch.optim.SGD(ps, lr=0.1, momentum=0.9)


def _adamw(ps):
    return torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _same_params(net_: torch.nn.Module, ref: torch.nn.Module, what: str) -> None:
    for (n, p), r in zip(net_.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(_full(p.detach()), r.detach(), atol=1e-5, rtol=0,
                                   msg=lambda m, n=n: f"{what} {n}: {m}")


def _batches(seed: int, micro: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Three whole batches of 8 rows (as two micro-batches of 8 when ``micro``)."""
    g = torch.Generator().manual_seed(seed)
    shape = (3, 2, 8) if micro else (3, 8)
    return torch.randn(*shape, 8, generator=g), torch.randn(*shape, 5, generator=g)


def _share(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's rows of a batch (of each micro-batch: the last dim but one)."""
    return t.chunk(world, dim=-2)[rank]


def _train(model, params, ref, jstep, rstep, opt, micro: bool, rank: int, world: int, split: bool = True):
    """Three jitted steps on this rank's share (the whole batch when not ``split``)
    and three eager steps of ``ref`` on the whole batches; the returned values
    (losses, clipping's total norm) compared each step."""
    o, ro = opt(params), opt(ref.parameters())
    xs, ys = _batches(1, micro)
    for s in range(3):
        x, y = (_share(xs[s], rank, world), _share(ys[s], rank, world)) if split else (xs[s], ys[s])
        got = jstep(model, o, x, y)
        want = rstep(ref, ro, xs[s], ys[s])
        if micro:                               # the total norm, the same on every rank
            torch.testing.assert_close(_full(got), want, atol=1e-5, rtol=1e-5)
    return o, ro


# --- what the traces show ---------------------------------------------------------------------
def _lines(trace) -> list[str]:
    return [ln.strip() for ln in str(trace).splitlines() if ln.strip() and not ln.strip().startswith(("#", "del("))]


def _collectives(lines: list[str], issue: str) -> tuple[list[int], list[int]]:
    """Line indices of the ``issue`` collectives (``dist.all_reduce``...) and of their waits."""
    issued = {m.group(1): i for i, ln in enumerate(lines) for m in [re.match(rf"(\w+) = {issue}\(", ln)] if m}
    waits = [i for i, ln in enumerate(lines) for m in [re.match(r"\w+ = dist\.wait\((\w+)\)", ln)]
             if m and m.group(1) in issued]
    return sorted(issued.values()), waits


def _overlapped(trace, issue: str, update: str, what: str) -> None:
    """The gradients' collectives are issued while the backward still computes
    (before its last ``tanh_backward``) and waited as late as possible, each
    right before the optimizer updates that read what it reduced: the first
    update follows the first wait, and a wait follows an update."""
    lines = _lines(trace)
    issues, waits = _collectives(lines, issue)
    backward = [i for i, ln in enumerate(lines) if "tanh_backward(" in ln]
    updates = [i for i, ln in enumerate(lines) if update in ln]
    assert len(issues) >= 2 and backward and updates, (what, issues, backward, updates)
    assert issues[0] < backward[-1], f"{what}: the first {issue} is issued after the backward\n{trace}"
    assert waits[0] > backward[-1], f"{what}: a gradient collective is waited during the backward\n{trace}"
    assert updates[0] > waits[0] and waits[-1] > updates[0], \
        f"{what}: the waits are not each right before the updates reading them\n{trace}"


# --- the models ----------------------------------------------------------------------------------
def _ddp_steps(rank: int, world: int) -> None:
    """torch's DDP called by a jitted step: SGD and AdamW, then two micro-batches
    with ``no_sync()`` and clipping; the bucketed all-reduces overlap the backward."""
    DDP = torch.nn.parallel.DistributedDataParallel
    for opt in (_sgd, _adamw):
        m, ref = net(), net()
        model = DDP(m, bucket_cap_mb=0.0005)             # 524 bytes: several buckets
        jstep = thunderlite.jit(step)
        _train(model, m.parameters(), ref, jstep, step, opt, False, rank, world)
        _same_params(m, ref, f"DDP {opt.__name__}")
        trace = thunderlite.last_traces(jstep)[-1]
        _overlapped(trace, "dist.all_reduce", "add_(" if opt is _sgd else "addcdiv_(", f"DDP {opt.__name__}")
        buckets = len(_collectives(_lines(trace), "dist.all_reduce")[0])
    m, ref = net(), net()
    model = DDP(m, bucket_cap_mb=0.0005)
    jstep = thunderlite.jit(ddp_accumulation_step)
    _train(model, m.parameters(), ref, jstep, accumulation_step, _adamw, True, rank, world)
    _same_params(m, ref, "DDP no_sync accumulation")
    issues, _ = _collectives(_lines(thunderlite.last_traces(jstep)[-1]), "dist.all_reduce")
    assert len(issues) == buckets, f"the no_sync micro-batch all-reduced: {len(issues)} vs {buckets} buckets"


def _ddp_buffers_step(rank: int, world: int) -> None:
    """A BatchNorm model under torch's DDP with its default ``broadcast_buffers``:
    rank 0's running statistics broadcast before each forward, as DDP does.
    Against eager DDP on the same ranks (each rank's batch statistics differ,
    so one process is not the reference): parameters and buffers."""
    DDP = torch.nn.parallel.DistributedDataParallel

    def bn_net():
        torch.manual_seed(0)
        # no bias before the norm: its gradient is rounding noise, which AdamW turns into full-size steps
        return torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.BatchNorm1d(16), torch.nn.Tanh(),
                                   torch.nn.Linear(16, 5))
    m, e = bn_net(), bn_net()
    model, eager = DDP(m), DDP(e)
    o, eo = _adamw(m.parameters()), _adamw(e.parameters())
    jstep = thunderlite.jit(step)
    xs, ys = _batches(6, False)
    for s in range(3):
        x, y = _share(xs[s], rank, world), _share(ys[s], rank, world)
        jstep(model, o, x, y)
        step(eager, eo, x, y)
    for (n, a), b in zip([*m.named_parameters(), *m.named_buffers()], [*e.parameters(), *e.buffers()], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=lambda msg, n=n: f"DDP buffers {n}: {msg}")
    assert str(thunderlite.last_traces(jstep)[-1]).count("dist.broadcast(") == 3     # mean, var, batches seen


def _fsdp2_steps(rank: int, world: int) -> None:
    """A model sharded by ``fully_shard`` per layer and at the root, called by a
    jitted step (``reshard_after_forward`` True and False): SGD and AdamW, then
    two micro-batches with ``set_requires_gradient_sync(False)`` for the first
    and clipping over the sharded gradients. The parameters, their gradients
    and AdamW's state stay DTensors; one reduce-scatter per parameter even with
    two micro-batches; resharded groups are gathered again in the backward."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    def sharded(reshard: bool) -> torch.nn.Module:
        m = net()
        for k in (0, 2, 4):
            fully_shard(m[k], reshard_after_forward=reshard)
        return fully_shard(m, reshard_after_forward=reshard)
    for reshard in (True, False):
        for opt in (_sgd, _adamw):
            m, ref = sharded(reshard), net()
            params = list(m.parameters())
            jstep = thunderlite.jit(step)
            o, _ = _train(m, params, ref, jstep, step, opt, False, rank, world)
            what = f"FSDP2 reshard={reshard} {opt.__name__}"
            _same_params(m, ref, what)
            assert [id(p) for p in m.parameters()] == [id(p) for p in params], what        # kept their identity
            assert all(isinstance(p, DTensor) and p.grad is None for p in m.parameters()), what
            trace = thunderlite.last_traces(jstep)[-1]
            _overlapped(trace, "dist.reduce_scatter", "add_(" if opt is _sgd else "addcdiv_(", what)
            text = str(trace)
            # the forward's 6 gathers; resharded: the backward's 2 of the later layers' weights again
            assert text.count("dist.all_gather(") == (8 if reshard else 6), (what, text)
            if opt is _adamw:
                st = o.state[params[0]]
                assert isinstance(st["exp_avg"], DTensor) and st["exp_avg"].placements == params[0].placements
        m, ref = sharded(reshard), net()
        jstep = thunderlite.jit(fsdp2_accumulation_step)
        _train(m, list(m.parameters()), ref, jstep, accumulation_step, _adamw, True, rank, world)
        what = f"FSDP2 reshard={reshard} set_requires_gradient_sync accumulation"
        _same_params(m, ref, what)
        text = str(thunderlite.last_traces(jstep)[-1])
        assert text.count("dist.reduce_scatter(") == 6, (what, text)   # one per parameter, not per micro-batch
        assert all(m_.reduce_grads for m_ in fully_shard.state(m[0])._fsdp_param_groups), what   # written back


def _tp_steps(rank: int, world: int) -> None:
    """A block sharded by ``parallelize_module`` (colwise then rowwise) called by a
    jitted step: AdamW, then two micro-batches and clipping (the norm's partial
    p-norms reduced across ranks), against the unsharded block on the same data."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (world,))
    for micro in (False, True):
        torch.manual_seed(0)
        ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))
        m = parallelize_module(copy.deepcopy(ref), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        jstep = thunderlite.jit(accumulation_step if micro else step)
        _train(m, m.parameters(), ref, jstep, accumulation_step if micro else step, _adamw, micro, rank, world,
               split=False)
        _same_params(m, ref, f"tensor parallel micro={micro}")
    assert "dist.all_reduce(" in str(thunderlite.last_traces(jstep)[-1])


def whole_steps_match_single_process(rank: int, world: int, store: str) -> None:
    """DDP, FSDP2 and tensor parallelism inside one jitted training step: one spawn."""
    with _group(rank, world, store):
        _ddp_steps(rank, world)
        _ddp_buffers_step(rank, world)
        _fsdp2_steps(rank, world)
        _tp_steps(rank, world)
