"""Data-parallel models called inside a jitted training step, whose
``loss.backward()`` runs in the trace (docs/architecture.md §15, "The whole
training step").

torch's ``DistributedDataParallel`` (and ``thunderlite.distributed.ddp``)
average gradients in autograd hooks a trace never runs. Inside a jitted step
the call runs the wrapped module instead, and the step's own backward
(frontend/training/traced_autograd.py) asks ``reduce_gradients`` to do what
DDP's reducer does once the backward has accumulated: each trained
parameter's accumulated gradient (``.grad`` plus this backward's, or this
backward's alone) is bucketed in the order the backward produces them
(``ddp.plan_buckets``, the wrapper's bucket caps), each bucket all-reduced and
divided by the group size (``ddp.average_bucket``), and the averages become
the ``.grad`` values (written into an existing ``.grad`` in place, as the
reducer copies into it). Each bucket's all-reduce is placed right after its
last gradient is computed, so it is issued while the rest of the backward
runs; ``schedule_collectives`` waits for it as late as possible, right
before the optimizer (or clipping) reads those gradients.

A forward run under ``no_sync()`` (``require_backward_grad_sync`` False,
read when the model is called, as DDP reads it) records nothing: its
backward accumulates the local gradients, and the next synced backward
averages the sum, as DDP does. torch's DDP broadcasting buffers
(``broadcast_buffers``, the default) broadcasts them from rank 0 before a
forward that follows a synced one (or the first), as its ``_pre_forward``
does (``TracingHooks._calling_data_parallel``). Options a trace does not
honour are refused at the call by name (``ddp.torch_ddp_options``).
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from thunderlite.core.proxies import TensorProxy
from thunderlite.distributed.ddp import DDPModule, average_bucket, plan_buckets, syncs_buffers, torch_ddp_options
from thunderlite.torch.ops import distributed as d


@dataclass(frozen=True)
class DataParallel:
    """What a data-parallel model called in the step averages, and how."""
    model: torch.nn.Module         # torch's DistributedDataParallel or a DDPModule
    module: torch.nn.Module        # the model it wraps (what the call runs)
    group: str                     # c10d group name
    world: int
    caps: tuple[int, ...]          # bucket caps in bytes (ddp.plan_buckets)
    ignore: frozenset[str]         # parameters left unreduced
    buffers: tuple = ()            # buffers torch's DDP broadcasts from rank 0 before a forward

    def trained(self) -> dict[int, str]:
        """id(parameter) -> name, for the parameters whose gradients are averaged."""
        return {id(p): n for n, p in self.module.named_parameters() if p.requires_grad and n not in self.ignore}


def is_data_parallel(module: Any) -> bool:
    return isinstance(module, (torch.nn.parallel.DistributedDataParallel, DDPModule))


def data_parallel(model: torch.nn.Module) -> DataParallel:
    """The ``DataParallel`` of ``model``, refusing (by option) what the step cannot honour."""
    buffers: tuple = ()
    if isinstance(model, DDPModule):
        tr = model._thunderlite_transforms[0]
        group, caps, ignore = tr.group, tr.caps, model.ignore
    else:
        def refuse(option: str, why: str) -> None:
            raise NotImplementedError(
                f"torch's DistributedDataParallel called inside a jitted function does not support {option}: "
                f"torch's DDP {why}, which the compiled program would not do. Use DistributedDataParallel("
                "thunderlite.jit(m)) (thunderlite compiles the module, torch's DDP communicates), with the "
                "backward and the optimizer outside the jitted function.")
        group, caps, ignore = torch_ddp_options(model, refuse, broadcasts=True)
        if syncs_buffers(model):
            buffers = tuple(model.modules_buffers)
    name, world = d.group_of(group)
    return DataParallel(model, model.module, name, world, caps, ignore, buffers)


def reduce_gradients(trace: Any, grads: list[tuple[TensorProxy, TensorProxy, TensorProxy | None, bool]],
                     dp: DataParallel, call: Callable) -> tuple[dict[str, TensorProxy], list, list]:
    """After a backward recorded into ``trace``: ``grads`` holds (parameter leaf,
    this backward's gradient, its ``.grad`` before it or None, whether that
    ``.grad`` is the caller's tensor) for the parameters of ``dp`` the backward
    reached. Returns each leaf's new ``.grad`` (by name: the caller's tensor
    written in place, as the reducer copies into it, else the average itself)
    and the symbols recorded (part of that backward): those placed among the
    backward's (each bucket's all-reduce, after its last gradient), and those
    left at the end of the trace. ``call`` records a torch callable into the
    trace (the jit's lookaside)."""
    bsyms = trace.bound_symbols
    n0 = len(bsyms)
    produced = {p.name: k for k, b in enumerate(bsyms) for p in b.proxy_outs()}
    order = sorted(range(len(grads)), key=lambda i: produced.get(grads[i][1].name, n0))
    hoisted: dict[int, list] = {}          # trace position -> the bucket issues to place after it
    result: dict[str, TensorProxy] = {}
    for bucket in plan_buckets([grads[order[k]][1] for k in range(len(order))], dp.caps):
        members = [grads[order[k]] for k in bucket]
        start = len(bsyms)
        values = [g if cur is None else call(torch.add, cur, g) for _, g, cur, _ in members]
        averaged = average_bucket(values, dp.group, dp.world)
        issue = next(k for k in range(start, len(bsyms)) if bsyms[k].sym.id == d.all_reduce.id)
        last = max(produced.get(g.name, n0 - 1) for _, g, _, _ in members)
        hoisted.setdefault(min(last, n0 - 1), []).extend(bsyms[start:issue + 1])
        del bsyms[start:issue + 1]
        for (leaf, _, cur, callers), avg in zip(members, averaged, strict=True):
            if callers:
                call(torch.Tensor.copy_, cur, avg)
                result[leaf.name] = cur
            else:
                result[leaf.name] = avg
    made = bsyms[n0:]
    moved = [b for k in sorted(hoisted) for b in hoisted[k]]
    out = []
    for k, b in enumerate(bsyms[:n0]):
        out.append(b)
        out.extend(hoisted.get(k, ()))
    bsyms[:] = out + made
    trace.writes += 1
    return result, moved, made


# torch's DDP -> the DDPModule whose transform averages its gradients in a compiled backward
_OUTER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def outer_transform(dp: DataParallel) -> Any:
    """The transform averaging ``dp``'s gradients in the backward of the compiled
    program (the call's backward runs after the program, through autograd):
    ``ddp(m)``'s own; for torch's DDP, that of a ``DDPModule`` on its module,
    group and buckets (one per DDP model), always synced: a micro-batch run
    under torch's ``no_sync()`` is averaged too (more traffic, the same
    accumulated average: averaging is linear)."""
    if isinstance(dp.model, DDPModule):
        return dp.model._thunderlite_transforms[0]
    out = _OUTER.get(dp.model)
    if out is None:
        out = DDPModule(dp.module, group=dp.model.process_group, broadcast_from=None, ignore=dp.ignore)
        out._thunderlite_transforms[0].caps = dp.caps
        _OUTER[dp.model] = out
    return out._thunderlite_transforms[0]
