"""torch.distributed collectives in traces (docs/architecture.md §15).

Each collective is recorded functionally, as c10d's functional collectives
are: an *issue* symbol (``dist.all_reduce``, ``dist.all_gather``,
``dist.reduce_scatter``, ``dist.broadcast``) returning the in-flight result,
and ``dist.wait`` returning it once complete. A collective that writes into
its argument (``torch.distributed.all_reduce(t)``) is that pair followed by
``prims.copy_`` into ``t``, so it goes through update_aliases like any
in-place op. The symbols are tagged DONT_DCE (every rank must issue every
collective) and ORDER_BARRIER-free: passes order them by their data
dependencies; ``transforms/schedule_collectives.py`` issues them early and
waits late.

Process groups enter the trace as their c10d names (``group.group_name``),
so the torch executor runs ``torch.ops._c10d_functional.*`` on them (gloo on
CPU, NCCL on GPU). Eager c10d writes are invisible to autograd, so an
in-place collective writes through ``detach()`` of its argument, as eager does.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from thunderlite.core import prims
from thunderlite.core.aliasing import register_view_rule
from thunderlite.core.prims import check
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.torch.ops import shapes
from thunderlite.torch.registry import register_torch_callable

_c10d = torch.ops._c10d_functional


def _like(a: TensorProxy, shape=None) -> TensorProxy:
    return TensorProxy(shape=a.shape if shape is None else shape, dtype=a.dtype, device=a.device,
                       requires_grad=a.requires_grad)


def _all_reduce_meta(a: TensorProxy, op: str, group: str, consume: bool = False) -> TensorProxy:
    check(op in _REDUCE_OPS.values(), lambda: f"all_reduce: unknown reduce op {op!r}")
    return _like(a)


def _all_reduce_impl(a: torch.Tensor, op: str, group: str, consume: bool = False) -> torch.Tensor:
    """``consume``: the caller's trace reads ``a`` nowhere else (a gradient bucket
    it just concatenated), so it is reduced in place, without the copy
    ``all_reduce`` makes of its input."""
    return (_c10d.all_reduce_ if consume else _c10d.all_reduce)(a, op, group)


def _all_gather_meta(a: TensorProxy, world: int, group: str) -> TensorProxy:
    check(a.ndim >= 1, lambda: "all_gather of a 0-d tensor: gather a 1-element tensor instead")
    return _like(a, (a.shape[0] * world, *a.shape[1:]))


def _reduce_scatter_meta(a: TensorProxy, op: str, world: int, group: str) -> TensorProxy:
    check(a.ndim >= 1 and a.shape[0] % world == 0,
          lambda: f"reduce_scatter: dim 0 ({a.shape[0] if a.ndim else 0}) must divide by the group size {world}")
    return _like(a, (a.shape[0] // world, *a.shape[1:]))


def _broadcast_meta(a: TensorProxy, src: int, group: str) -> TensorProxy:
    return _like(a)


def _wait_meta(a: TensorProxy) -> TensorProxy:
    return _like(a)


def _collective(name: str, meta: Callable, impl: Callable) -> Symbol:
    sym = Symbol(name, meta=meta, impl=impl, module="dist", tags={Tag.DONT_DCE})
    register_view_rule(sym, (lambda b: [(b.output, b.args[0])]) if name == "wait" else (lambda b: []))
    return sym


all_reduce = _collective("all_reduce", _all_reduce_meta, _all_reduce_impl)
def _all_gather_impl(a: torch.Tensor, world: int, group: str) -> torch.Tensor:
    """Into an output allocated here (``all_gather_into_tensor_out``: c10d's
    ``_allgather_base``), never through ``all_gather_into_tensor``: on gloo
    that one runs ``allgather_into_tensor_coalesced``, whose asynchronous works
    corrupt the heap when two are in flight at once (torch 2.13: SIGABRT
    "unaligned tcache chunk" or SIGSEGV within a few thousand calls; the
    scheduler keeps several gathers in flight). Complex tensors travel as
    their real view, as the functional op does."""
    real = torch.view_as_real(a) if a.is_complex() else a
    out = real.new_empty((real.shape[0] * world, *real.shape[1:]))
    _c10d.all_gather_into_tensor_out(real, world, group, out=out)
    return torch.view_as_complex(out) if a.is_complex() else out


all_gather = _collective("all_gather", _all_gather_meta, _all_gather_impl)
reduce_scatter = _collective("reduce_scatter", _reduce_scatter_meta,
                             lambda a, op, world, group: _c10d.reduce_scatter_tensor(a, op, world, group))
broadcast = _collective("broadcast", _broadcast_meta, lambda a, src, group: _c10d.broadcast(a, src, group))
wait = _collective("wait", _wait_meta, lambda a: _c10d.wait_tensor(a))
ISSUES = (all_reduce, all_gather, reduce_scatter, broadcast)

_REDUCE_OPS = {"SUM": "sum", "AVG": "avg", "PRODUCT": "product", "MIN": "min", "MAX": "max"}


def reduce_op_name(op: Any) -> str:
    """``ReduceOp.SUM`` / ``"sum"`` -> the functional collectives' spelling."""
    if isinstance(op, str):
        check(op.lower() in _REDUCE_OPS.values(), lambda: f"unknown reduce op {op!r}")
        return op.lower()
    for name, spelled in _REDUCE_OPS.items():
        if op == getattr(dist.ReduceOp, name):
            return spelled
    raise NotImplementedError(f"reduce op {op!r} is not supported in thunderlite traces (use SUM, AVG, "
                              "PRODUCT, MIN or MAX)")


def group_of(group: Any) -> tuple[str, int]:
    """(c10d group name, group size) of a ProcessGroup, a group name or None (WORLD)."""
    if group is None:
        group = dist.group.WORLD
    if isinstance(group, str):
        pg = torch._C._distributed_c10d._resolve_process_group(group)
        return group, pg.size()
    if isinstance(group, dist.ProcessGroup):
        return group.group_name, group.size()
    raise NotImplementedError(f"process group {group!r} ({type(group).__name__}) is not supported in "
                              "thunderlite traces: pass a ProcessGroup, its name, or None")


class Work:
    """What ``async_op=True`` returns while tracing: ``wait()`` records the wait
    (and the write into the collective's output tensor) where the program waits."""

    def __init__(self, finish: Callable[[], None]):
        self._finish = finish
        self._done = False

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            self._done = True
            self._finish()
        return True

    def is_completed(self) -> bool:
        return self._done


def _write_into(dst: TensorProxy, issued: TensorProxy, async_op: bool, post: Callable | None = None):
    # eager's c10d writes are invisible to autograd: write through a detached alias
    target = dst.detach() if dst.requires_grad else dst

    def finish():
        done = wait(issued)
        prims.copy_(post(done) if post is not None else done, target)
    if async_op:
        return Work(finish)
    finish()
    return None


def _tensor_arg(t: Any, what: str) -> TensorProxy:
    check(isinstance(t, TensorProxy), lambda: f"torch.distributed.{what} takes a tensor, got {type(t).__name__}",
          TypeError)
    return t


# --- torch.distributed (c10d, in place) -------------------------------------------------------

def _dist_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    name, _ = group_of(group)
    t = _tensor_arg(tensor, "all_reduce")
    return _write_into(t, all_reduce(t.detach() if t.requires_grad else t, reduce_op_name(op), name), async_op)


def _dist_broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    name, _ = group_of(group)
    t = _tensor_arg(tensor, "broadcast")
    root = src if src is not None else dist.get_global_rank(group or dist.group.WORLD, group_src or 0)
    return _write_into(t, broadcast(t.detach() if t.requires_grad else t, root, name), async_op)


def _dist_all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    name, world = group_of(group)
    out, inp = _tensor_arg(output_tensor, "all_gather_into_tensor"), _tensor_arg(input_tensor, "all_gather_into_tensor")
    gathered = all_gather(inp.detach() if inp.requires_grad else inp, world, name)
    check(gathered.numel() == out.numel(), lambda: f"all_gather_into_tensor: output has {out.numel()} elements, "
                                                   f"expected {gathered.numel()}")
    post = (lambda done: done.reshape(out.shape)) if gathered.shape != out.shape else None   # (world, n) output
    return _write_into(out, gathered, async_op, post)


def _dist_reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    name, world = group_of(group)
    out, inp = _tensor_arg(output, "reduce_scatter_tensor"), _tensor_arg(input, "reduce_scatter_tensor")
    if inp.shape[0] != out.shape[0] * world:      # a (world, *out) stacked input: flatten dim 0
        inp = inp.reshape((out.shape[0] * world, *out.shape[1:]))
    return _write_into(out, reduce_scatter(inp.detach() if inp.requires_grad else inp, reduce_op_name(op),
                                           world, name), async_op)


def _dist_all_gather(tensor_list, tensor, group=None, async_op=False):
    name, world = group_of(group)
    t = _tensor_arg(tensor, "all_gather")
    check(len(tensor_list) == world, lambda: f"all_gather: tensor_list has {len(tensor_list)} tensors for a "
                                             f"group of {world}")
    flat = t.reshape((1, *t.shape)) if t.ndim == 0 else t
    issued = all_gather(flat.detach() if flat.requires_grad else flat, world, name)

    def finish():
        done = wait(issued)
        for i, dst in enumerate(tensor_list):
            piece = done[i * flat.shape[0]:(i + 1) * flat.shape[0]].reshape(t.shape)
            prims.copy_(piece, dst.detach() if dst.requires_grad else dst)
    if async_op:
        return Work(finish)
    finish()
    return None


for _fn, _rec in ((dist.all_reduce, _dist_all_reduce), (dist.broadcast, _dist_broadcast),
                  (dist.all_gather_into_tensor, _dist_all_gather_into_tensor),
                  (dist.reduce_scatter_tensor, _dist_reduce_scatter_tensor), (dist.all_gather, _dist_all_gather)):
    register_torch_callable(_fn, _rec)


# --- functional collectives (results are new tensors) ------------------------------------------

def _funcol_all_reduce(self, reduceOp, group, tag=""):
    name, _ = group_of(_funcol_group(group))
    return wait(all_reduce(self, reduce_op_name(reduceOp), name))


def _funcol_all_gather_tensor(self, gather_dim, group, tag=""):
    name, world = group_of(_funcol_group(group))
    out = wait(all_gather(self.contiguous() if gather_dim else self, world, name))
    if gather_dim == 0:
        return out
    chunks = [out[i * self.shape[0]:(i + 1) * self.shape[0]] for i in range(world)]
    return shapes.cat(chunks, gather_dim)


def _funcol_reduce_scatter_tensor(self, reduceOp, scatter_dim, group, tag=""):
    name, world = group_of(_funcol_group(group))
    check(scatter_dim == 0, lambda: "reduce_scatter_tensor: only scatter_dim=0 is supported in traces",
          NotImplementedError)
    return wait(reduce_scatter(self, reduce_op_name(reduceOp), world, name))


def _funcol_broadcast(self, src, group, tag=""):
    name, _ = group_of(_funcol_group(group))
    return wait(broadcast(self, src, name))


def _funcol_wait_tensor(tensor):
    return tensor            # collectives recorded here are waited where they are issued


def _funcol_group(group):
    if isinstance(group, (list, tuple)):
        raise NotImplementedError("functional collectives over a list of ranks are not supported in thunderlite "
                                  "traces: pass a ProcessGroup")
    return group


# the c10d functional ops themselves (what dynamo graphs and funcol's internals call)
def _op_all_reduce(a, op, group):
    return all_reduce(a, reduce_op_name(op), group)


def _op_all_gather(a, world, group):
    return all_gather(a, world, group)


def _op_reduce_scatter(a, op, world, group):
    return reduce_scatter(a, reduce_op_name(op), world, group)


def _op_broadcast(a, src, group):
    return broadcast(a, src, group)


def _register_functional() -> None:
    import torch.distributed._functional_collectives as funcol
    for fn, rec in ((funcol.all_reduce, _funcol_all_reduce), (funcol.all_gather_tensor, _funcol_all_gather_tensor),
                    (funcol.all_gather_tensor_autograd, _funcol_all_gather_tensor),
                    (funcol.reduce_scatter_tensor, _funcol_reduce_scatter_tensor),
                    (funcol.reduce_scatter_tensor_autograd, _funcol_reduce_scatter_tensor),
                    (funcol.broadcast, _funcol_broadcast), (funcol.wait_tensor, _funcol_wait_tensor)):
        register_torch_callable(fn, rec)
    for packet, rec in ((_c10d.all_reduce, _op_all_reduce), (_c10d.all_gather_into_tensor, _op_all_gather),
                        (_c10d.reduce_scatter_tensor, _op_reduce_scatter), (_c10d.broadcast, _op_broadcast),
                        (_c10d.wait_tensor, wait)):
        register_torch_callable(packet, rec)
        register_torch_callable(packet.default, rec)


if dist.is_available():
    _register_functional()
