"""``ddp(module)``: data parallelism with the gradient all-reduce in the
backward trace (docs/architecture.md §15).

The returned ``DDPModule`` wraps the module (parameters and buffers are
broadcast from rank 0 first, so every replica starts equal) and carries a
``DDPTransform``, which ``thunderlite.jit`` runs after autodiff: in the
backward trace, the gradients of the wrapped module's parameters are grouped
into buckets in the order the backward produces them (up to
``bucket_size_mb``); each bucket is flattened into one tensor, all-reduced
(sum, then divided by the group size) and split back. The
``schedule_collectives`` pass issues each bucket's all-reduce right after its
last gradient is computed and waits at the end, so communication overlaps the
rest of the backward.

``with model.no_sync():`` skips the all-reduce (gradient accumulation): the
flag is read by the traced ``forward``, so the jit guards it and compiles the
two cases separately; what was accumulated without it is averaged at the end
of the next backward after the block. Example::

    model = thunderlite.jit(ddp(Net()))
    loss_fn(model(x), y).backward()      # grads are averaged across ranks
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.distributed.fsdp import shown, without_gradient
from thunderlite.torch import symbol_for
from thunderlite.torch.ops import distributed as d
from thunderlite.transforms.user import Transform


class DDPTransform(Transform):
    """Inserts the bucketed gradient all-reduce into the backward trace."""

    def __init__(self, module: DDPModule, group: Any, bucket_size_mb: float):
        self.module = module
        self.group = group
        self.caps = (int(bucket_size_mb * 2**20),)   # bucket caps in bytes (plan_buckets)
        self._param_names: set[str] = set()
        self._input_ids: dict[str, int] = {}

    def bind_inputs(self, values: dict[str, Any]) -> None:
        ids = {id(p) for p in self.module.synced_parameters()}
        self._input_ids = {name: id(v) for name, v in values.items() if id(v) in ids}
        self._param_names = set(self._input_ids)

    def after_autodiff(self, forward: Trace, backward: Trace) -> tuple[Trace, Trace]:
        if not self.module.require_backward_grad_sync:
            return forward, backward
        self._refuse_unused(forward.args, backward.return_bsym.args[0])
        if not self._param_names:
            return forward, backward
        return forward, _allreduce_grads(backward, forward.args, self._param_names, self.group, self.caps)

    def _refuse_unused(self, args: list, grads: Any) -> None:
        """A trained parameter this backward gives no gradient: another rank may
        use it (torch's ``find_unused_parameters=True`` case), and buckets made
        from this rank's gradients would not match that rank's (mixed gradients
        or a hang). torch's reducer learns which are unused at run time; the
        compiled all-reduce cannot."""
        trained = {id(p): n for n, p in self.module.module.named_parameters()
                   if p.requires_grad and n not in self.module.ignore}
        unused = without_gradient(args, grads, self._input_ids, trained)
        if unused:
            raise unused_refused(unused)


def unused_refused(unused: list[str]) -> NotImplementedError:
    """The refusal of a backward that leaves the trained parameters ``unused``
    of a data-parallel module without gradient (see ``DDPTransform._refuse_unused``)."""
    return NotImplementedError(
        f"thunderlite.jit of a data-parallel module: the parameters {shown(unused)} get no gradient in "
        "this backward (unused, torch's "
        "find_unused_parameters=True case). Which parameters are used may differ between ranks, and the "
        "compiled bucketed all-reduce cannot follow that (the ranks' buckets would not match). Use "
        "DistributedDataParallel(thunderlite.jit(m), find_unused_parameters=True), whose reducer finds "
        "unused parameters at run time, or set requires_grad=False on parameters that are not trained.")


def _allreduce_grads(backward: Trace, arg_proxies: list, params: set[str], group: Any,
                     caps: tuple[int, ...]) -> Trace:
    name, world = d.group_of(group)
    ret = backward.return_bsym
    grads = list(ret.args[0])
    slots = [i for i, (a, g) in enumerate(zip(arg_proxies, grads, strict=True))
             if getattr(a, "name", None) in params and type(g) is TensorProxy]
    if not slots:
        return backward
    body = backward.bound_symbols[:-1]
    produced = {p.name: k for k, b in enumerate(body) for p in b.proxy_outs()}
    slots.sort(key=lambda i: produced.get(grads[i].name, -1))
    after: dict[int, list[list[int]]] = {}
    for bucket in plan_buckets([grads[i] for i in slots], caps):
        members = [slots[k] for k in bucket]
        last = max(produced.get(grads[i].name, -1) for i in members)
        after.setdefault(last, []).append(members)
    new = backward.from_trace("DDP gradient all-reduce")

    def emit(bucket: list[int]) -> None:
        for i, avg in zip(bucket, average_bucket([grads[i] for i in bucket], name, world), strict=True):
            grads[i] = avg
    with tracectx(new):
        for bucket in after.get(-1, []):
            emit(bucket)
        for k, b in enumerate(body):
            new.add_bound_symbol(b)
            for bucket in after.get(k, []):
                emit(bucket)
        new.set_return(type(ret.args[0])(grads))
    return new


def plan_buckets(grads: list[TensorProxy], caps: tuple[int, ...]) -> list[list[int]]:
    """Positions in ``grads`` (in the order the backward produces them) grouped
    into buckets as torch's reducer groups them: a bucket takes gradients of one
    dtype until it holds ``caps[k]`` bytes or more (``k``: its number; the last
    cap serves every later bucket: DDP's smaller first bucket, then
    ``bucket_cap_mb``)."""
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for i, g in enumerate(grads):
        if not buckets or size >= caps[min(len(buckets) - 1, len(caps) - 1)] or g.dtype != dtype:
            buckets.append([])
            size, dtype = 0, g.dtype
        buckets[-1].append(i)
        size += g.numel() * g.element_size()
    return buckets


def average_bucket(values: list[TensorProxy], group: str, world: int) -> list[TensorProxy]:
    """Each of ``values`` averaged over the ranks of ``group`` by one all-reduce of
    their flattened concatenation (recorded into the current trace); every
    result in memory of its own (the division is the copy out of the bucket)."""
    flat = [prims.reshape(v, (v.numel(),)) for v in values]
    if len(flat) > 1:           # the concatenation is read by nothing else: reduced in place
        reduced = d.wait(d.all_reduce(symbol_for(torch.cat)(flat, 0), "sum", group, True))
    else:
        reduced = d.wait(d.all_reduce(flat[0], "sum", group))
    out, start = [], 0
    mul = symbol_for(torch.mul)
    for v in values:
        n = v.numel()
        piece = prims.reshape(prims.slice_prim(reduced, (start,), (start + n,), (1,)), v.shape)
        out.append(mul(piece, 1.0 / world))
        start += n
    return out


class DDPModule(torch.nn.Module):
    """A module whose gradients are averaged across the ranks of ``group`` when
    it runs under ``thunderlite.jit`` (its transform; the module alone, run
    eagerly, does no communication). ``module`` is the wrapped module."""

    def __init__(self, module: torch.nn.Module, *, group: Any = None, bucket_size_mb: float = 25.0,
                 broadcast_from: int | None = 0, ignore: frozenset[str] = frozenset()):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("thunderlite.distributed.ddp needs an initialized process group "
                               "(torch.distributed.init_process_group)")
        self.module = module
        self.group = group
        self.ignore = ignore                   # names of parameters (in ``module``) left unreduced
        self.require_backward_grad_sync = True
        self._pending_hooks: list = []         # see no_sync: averaging after the next backward
        self._average_queued = False
        if broadcast_from is not None:
            with torch.no_grad():
                for t in [*module.parameters(), *module.buffers()]:
                    dist.broadcast(t, broadcast_from, group=group)
        self._thunderlite_transforms = (DDPTransform(self, group, bucket_size_mb),)

    def synced_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters whose gradients are averaged (all but ``ignore``)."""
        return [p for n, p in self.module.named_parameters() if n not in self.ignore]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # read while tracing, so the jit guards the flag: synced and no_sync calls compile apart
        _ = self.require_backward_grad_sync
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip the gradient all-reduce for forwards run inside the block
        (gradient accumulation).

        The gradients accumulated without it are averaged across ranks (one
        eager all-reduce per dtype) at the end of the next backward after the
        block, whether that backward is a synced one or that of a forward run
        in the block, so each ``.grad`` is then the average of every rank's
        accumulated gradient, as with ``torch.nn.parallel.DistributedDataParallel``
        (averaging a sum of averages and local parts gives the same as averaging
        the sum, since the averaged parts are equal on every rank)."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old
            if old and not torch.compiler.is_compiling():   # traced: the program's backward averages (in_step.py)
                self._average_after_next_backward()

    def _average_after_next_backward(self) -> None:
        if self._pending_hooks:
            return

        def hook(_: torch.Tensor) -> None:
            if not self._average_queued:       # once, when the whole backward has accumulated
                self._average_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._average_pending)
        self._pending_hooks = [p.register_post_accumulate_grad_hook(hook)
                               for p in self.synced_parameters() if p.requires_grad]

    def _average_pending(self) -> None:
        for h in self._pending_hooks:
            h.remove()
        self._pending_hooks, self._average_queued = [], False
        self._average_accumulated_grads()

    @torch.no_grad()
    def _average_accumulated_grads(self) -> None:
        world = dist.get_world_size(self.group)
        by_dtype: dict = {}
        for p in self.synced_parameters():
            if p.grad is not None:
                by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.group)
            flat.div_(world)
            start = 0
            for g in grads:
                g.copy_(flat[start:start + g.numel()].view_as(g))
                start += g.numel()


def ddp(module: torch.nn.Module, *, group: Any = None, bucket_size_mb: float = 25.0,
        broadcast_from: int = 0) -> DDPModule:
    """Wrap ``module`` for data-parallel training under ``thunderlite.jit``."""
    return DDPModule(module, group=group, bucket_size_mb=bucket_size_mb, broadcast_from=broadcast_from)


# torch's DistributedDataParallel options that change what a step computes, and
# whether the trace honours them
_TORCH_DDP_REFUSED = {
    "broadcast_buffers": "broadcasts the module's buffers from rank 0 before every forward",
}


def syncs_buffers(model: torch.nn.parallel.DistributedDataParallel) -> bool:
    """Whether torch's DDP broadcasts ``model``'s buffers from rank 0 before forwards."""
    syncs = getattr(model, "forward_sync_buffers", None)          # torch >= 2.13; before: broadcast_buffers
    syncs = getattr(model, "broadcast_buffers", True) if syncs is None else syncs
    return bool(syncs) and any(True for _ in model.module.buffers())


def torch_ddp_options(model: torch.nn.parallel.DistributedDataParallel, refuse: Callable[[str, str], None],
                      broadcasts: bool = False) -> tuple[Any, tuple[int, ...], frozenset[str]]:
    """(process group, bucket caps in bytes as ``plan_buckets`` takes them, names
    of the parameters DDP ignores) of torch's ``model``, after ``refuse(option,
    why)`` for each option that changes results and that a trace does not honour:
    buffers broadcast before every forward (``broadcast_buffers`` /
    ``forward_sync_buffers`` with buffers; unless the caller ``broadcasts``
    them, but not through a buffer hook or under a ``Join``), a communication
    hook, DDP's ``mixed_precision``."""
    if syncs_buffers(model):
        if not broadcasts:
            refuse("broadcast_buffers=True (forward_sync_buffers)", _TORCH_DDP_REFUSED["broadcast_buffers"])
        if hasattr(model, "buffer_hook"):
            refuse("a buffer communication hook (_register_buffer_comm_hook)", "syncs buffers through the hook")
        if getattr(getattr(model, "_join_config", None), "enable", False):
            refuse("a Join context with broadcast_buffers=True", "broadcasts buffers from a rank agreed at run time")
    if getattr(model, "_comm_hooks", None):
        refuse("a communication hook (register_comm_hook)", "reduces gradients through the user's hook")
    if getattr(model, "mixed_precision", None) is not None:
        refuse("mixed_precision", "casts parameters and gradients for communication")
    cap = int(getattr(model, "bucket_bytes_cap", 25 * 2**20))
    config = getattr(model, "_bucket_config", None)
    if config is not None and config.per_bucket_bytes_caps:      # bucket_cap_mb_list, first bucket first
        caps = tuple(config.per_bucket_bytes_caps)
    elif config is not None:
        caps = (min(config.first_bucket_bytes_cap, cap), cap)
    else:
        caps = (cap,)
    return model.process_group, caps, frozenset(getattr(model, "parameters_to_ignore", ()))


def from_torch_ddp(model: torch.nn.parallel.DistributedDataParallel) -> DDPModule:
    """``thunderlite.jit(DistributedDataParallel(m))``: the same training as torch's
    DDP, with its bucketed gradient all-reduce in the backward trace (a
    ``DDPModule`` around ``model.module``, on ``model``'s process group and
    bucket size; its parameters were broadcast when ``model`` was made).
    ``no_sync()`` of the jitted module accumulates as torch's does. Options
    that change results and are not honoured raise here, naming the option:
    ``broadcast_buffers=True`` with buffers to broadcast, a communication hook.
    ``gradient_as_bucket_view`` and ``static_graph`` change no result; a
    backward leaving a trained parameter without gradient (what
    ``find_unused_parameters=True`` is for) is refused at its first call
    (``DDPTransform._refuse_unused``); parameters
    DDP was told to ignore (``_set_params_and_buffers_to_ignore_for_model``)
    keep their local gradients."""
    def refuse(option: str, why: str) -> None:
        raise NotImplementedError(
            f"thunderlite.jit(DistributedDataParallel(m)) does not support {option}: torch's DDP {why}, "
            "which the compiled program would not do. Use DistributedDataParallel(thunderlite.jit(m)) "
            "(thunderlite compiles the module, torch's DDP communicates), or thunderlite.distributed.ddp(m).")
    group, caps, ignore = torch_ddp_options(model, refuse)
    out = DDPModule(model.module, group=group, bucket_size_mb=caps[-1] / 2**20, broadcast_from=None,
                    ignore=ignore)
    out._thunderlite_transforms[0].caps = caps
    out.require_backward_grad_sync = model.require_backward_grad_sync
    return out


def from_data_parallel(model: torch.nn.DataParallel) -> torch.nn.Module:
    """``thunderlite.jit(DataParallel(m))``: with no devices to replicate over
    (CPU) ``DataParallel`` calls ``m`` itself, so that is what is compiled; over
    devices it scatters, replicates and gathers, which a trace does not do."""
    if model.device_ids:
        raise NotImplementedError(
            f"thunderlite.jit(DataParallel(m)) over devices {model.device_ids} is not supported: DataParallel "
            "replicates the module and scatters its inputs at every call, which the compiled program would not "
            "do. Use DistributedDataParallel (one process per device) with thunderlite.jit(m) inside it, or "
            "thunderlite.distributed.ddp(m).")
    return model.module
