"""The symmetric-memory executor ``symm_mem`` (docs/architecture.md §15).

Symmetric memory (``torch.distributed._symmetric_memory``) is CUDA memory every
rank of a group can address directly; ops in PyTorch's ``symm_mem::`` namespace
and user custom ops declared with ``Library.register_symm_mem_args`` need some
arguments to live there. Opt in with ``executors=["symm_mem", ...]``; its
``fusion_pass`` (run when its turn comes in the execution transform):

1. lowers small ``sum`` all-reduces (``dist.all_reduce`` + its ``dist.wait``)
   over a group with symmetric memory to ``symm_mem.one_shot_all_reduce``
   (``torch.ops.symm_mem.one_shot_all_reduce``), whose ``input`` is declared;
2. plans allocation (``symm_mem.plan.plan_symm_mem``): declared arguments are
   produced into cached ``symm_mem.buffer``s (``empty`` + ``rendezvous`` once
   per shape, dtype, device, group and allocation site), copied only where the
   producer cannot write there.

``symm_mem::`` ops that mutate an argument and return it
(``two_shot_all_reduce_(Tensor(a!) input, ...) -> Tensor(a!)``) are custom ops
to the torch language (torch/custom_ops.py): their schema makes them writes,
so update_aliases orders every later reader after them.

Every CUDA-only call goes through a ``SymmMemBackend``; ``TorchSymmMem`` is the
real one. Tests build their own ``SymmMemExecutor(backend=...)`` with a fake
backend instead of touching torch globals.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from thunderlite.core import prims
from thunderlite.core.aliasing import register_view_rule
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.executors.base import OperatorExecutor, torch_path
from thunderlite.executors.symm_mem.plan import declare_symm_mem_args, memory_tag, plan_symm_mem
from thunderlite.torch import custom_ops
from thunderlite.torch.ops import distributed as ldist


class SymmMemBackend:
    """The calls that need CUDA symmetric memory; subclass to fake them."""

    def availability(self) -> tuple[bool, str]:
        raise NotImplementedError

    def group_enabled(self, group: str, device: torch.device) -> bool:
        """Whether tensors on ``device`` can use symmetric memory over ``group``."""
        raise NotImplementedError

    def empty(self, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        raise NotImplementedError

    def rendezvous(self, tensor: torch.Tensor, group: str) -> Any:
        raise NotImplementedError

    def one_shot_all_reduce(self, tensor: torch.Tensor, reduce_op: str, group: str) -> torch.Tensor:
        raise NotImplementedError


class TorchSymmMem(SymmMemBackend):
    """``torch.distributed._symmetric_memory`` and ``torch.ops.symm_mem``."""

    def availability(self) -> tuple[bool, str]:
        if not dist.is_available():
            return False, "torch.distributed is not available in this build"
        if not torch.cuda.is_available():
            return False, "symmetric memory needs CUDA (torch.cuda.is_available() is False)"
        try:
            importlib.import_module("torch.distributed._symmetric_memory")
            torch.ops.symm_mem.one_shot_all_reduce.default  # noqa: B018
        except (ImportError, AttributeError, RuntimeError) as e:
            return False, f"this torch build has no symmetric memory ({type(e).__name__}: {e})"
        return True, ""

    def group_enabled(self, group: str, device: torch.device) -> bool:
        if device.type != "cuda" or not dist.is_initialized():
            return False
        try:
            pg = torch._C._distributed_c10d._resolve_process_group(group)
            return dist.get_backend(pg) == "nccl"
        except (RuntimeError, ValueError):
            return False

    def empty(self, shape, dtype, device):
        from torch.distributed import _symmetric_memory as sm
        return sm.empty(*shape, dtype=dtype, device=device)

    def rendezvous(self, tensor, group):
        from torch.distributed import _symmetric_memory as sm
        return sm.rendezvous(tensor, group)

    def one_shot_all_reduce(self, tensor, reduce_op, group):
        return torch.ops.symm_mem.one_shot_all_reduce(tensor, reduce_op, group)


def _no_meta(*args, **kwargs):
    raise RuntimeError("symm_mem operators are placed by the executor's planning pass, not traced")


def _fresh_like(a: TensorProxy, *args, **kwargs) -> TensorProxy:
    return TensorProxy(shape=a.shape, dtype=a.dtype, device=a.device)


class SymmMemExecutor(OperatorExecutor):
    """Plans symmetric-memory allocation and lowers small all-reduces (module docstring).

    ``backend``: the CUDA-only calls (default ``TorchSymmMem()``).
    ``one_shot_max_bytes``: the largest all-reduce lowered to one-shot."""

    ONE_SHOT_ARGS = ["input", "reduce_op", "group_name"]

    def __init__(self, name: str = "symm_mem", *, backend: SymmMemBackend | None = None,
                 one_shot_max_bytes: int = 256 * 1024):
        super().__init__(name)
        self.backend = backend if backend is not None else TorchSymmMem()
        self.one_shot_max_bytes = one_shot_max_bytes
        self.buffers: dict[tuple, torch.Tensor] = {}      # (shape, dtype, device, group, site) -> buffer
        self.handles: dict[tuple, Any] = {}
        self.buffer = self.register_operator("buffer", fn=self._buffer, meta=_no_meta)
        register_view_rule(self.buffer, lambda b: [])           # new memory (cached across calls)
        self.one_shot_all_reduce = self.register_operator("one_shot_all_reduce", fn=self._one_shot,
                                                          meta=_fresh_like, tags={Tag.DONT_DCE})
        register_view_rule(self.one_shot_all_reduce, lambda b: [])
        declare_symm_mem_args(self.one_shot_all_reduce, ["input"])
        self.done = self.register_operator("wait", fn=lambda a: a, meta=_fresh_like)
        register_view_rule(self.done, lambda b: [(b.output, b.args[0])])
        self._into: dict[Callable, Symbol | None] = {}

    def check_availability(self) -> tuple[bool, str]:
        return self.backend.availability()

    # --- run time ---------------------------------------------------------------------------
    def _buffer(self, shape, dtype, device, group, site) -> torch.Tensor:
        key = (tuple(shape), dtype, torch.device(device), group, site)
        buf = self.buffers.get(key)
        if buf is None:
            buf = self.backend.empty(tuple(shape), dtype, torch.device(device))
            self.handles[key] = self.backend.rendezvous(buf, group)     # collective: once per buffer
            self.buffers[key] = buf
        return buf

    def clear_buffers(self) -> None:
        """Forget the cached buffers (call before destroying the groups they were
        rendezvoused with: a later group may reuse the name)."""
        self.buffers.clear()
        self.handles.clear()

    def _one_shot(self, tensor, reduce_op, group):
        return self.backend.one_shot_all_reduce(tensor, reduce_op, group)

    # --- planning ---------------------------------------------------------------------------
    def own_names(self, sym: Symbol) -> list[str] | None:
        return self.ONE_SHOT_ARGS if sym is self.one_shot_all_reduce else None

    def into_symbol(self, producer: BoundSymbol) -> Symbol | None:
        """The operator running ``producer``'s torch function with ``out=buf``, or None."""
        sym = producer.sym
        if (sym.executor is not None or sym.torch_fn is None or sym.tags & {Tag.INPLACE, Tag.VIEW, Tag.RANDOM,
                                                                            Tag.OPAQUE, Tag.DONT_DCE}
                or type(producer.output) is not TensorProxy
                or any(t.requires_grad for t in producer.tensor_args())):
            return None
        fn = sym.torch_fn
        if fn not in self._into:
            self._into[fn] = self._make_into(fn)
        return self._into[fn]

    def _make_into(self, fn: Callable) -> Symbol | None:
        path = torch_path(fn)
        if path is None or path.count(".") != 1:          # torch.<name> only: methods take no out=
            return None
        name = path.rpartition(".")[2]
        packet = getattr(torch.ops.aten, name, None)
        if packet is None or "out" not in packet.overloads():
            return None

        def run_into(buf, *args, **kwargs):
            return fn(*args, **kwargs, out=buf)
        op = self.register_operator(f"{name}_into", fn=run_into, meta=_no_meta)
        register_view_rule(op, lambda b: [(b.output, b.args[0])])
        return op

    def fusion_pass(self, trace: Trace, input_alias_groups=None) -> Trace:
        trace = self._lower_all_reduces(trace)
        return plan_symm_mem(trace, buffer_symbol=self.buffer, into_symbol=self.into_symbol,
                             own_names=self.own_names, clone_symbol=prims.clone)

    def _lower_all_reduces(self, trace: Trace) -> Trace:
        lowered: dict[str, TensorProxy] = {}
        out: list[BoundSymbol] = []
        for b in trace.bound_symbols:
            if b.sym is ldist.all_reduce and self._one_shot_ok(b):
                out.append(self.one_shot_all_reduce.bind(*b.args, output=b.output, source=b.source))
                lowered[b.output.name] = b.output
            elif b.sym is ldist.wait and isinstance(b.args[0], TensorProxy) and b.args[0].name in lowered:
                out.append(self.done.bind(*b.args, output=b.output, source=b.source))
            else:
                out.append(b)
        return trace.with_bound_symbols(trace.stage, out) if lowered else trace

    def _one_shot_ok(self, b: BoundSymbol) -> bool:
        a, op, group = b.args
        return (isinstance(a, TensorProxy) and op == "sum" and isinstance(group, str)
                and a.numel() * a.element_size() <= self.one_shot_max_bytes
                and self.backend.group_enabled(group, a.device))


# PyTorch's own symm_mem ops need their input in symmetric memory; torch does not declare it
for _q in ("symm_mem::one_shot_all_reduce", "symm_mem::one_shot_all_reduce_out", "symm_mem::two_shot_all_reduce_",
           "symm_mem::multimem_all_reduce_"):
    declare_symm_mem_args(_q, ["input"])


def _same_as_input(input, *rest):
    return input.clone()


def _out_alias(input, reduce_op, group_name, out):
    return out


# output shapes for the mutating ops on builds without their Meta kernels (CPU)
custom_ops.register_fake_fallback("symm_mem::two_shot_all_reduce_", _same_as_input)
custom_ops.register_fake_fallback("symm_mem::multimem_all_reduce_", _same_as_input)
custom_ops.register_fake_fallback("symm_mem::one_shot_all_reduce_out", _out_alias)
custom_ops.register_fake_fallback("symm_mem::one_shot_all_reduce", _same_as_input)

symm_mem_executor = SymmMemExecutor()
__all__ = ["SymmMemBackend", "TorchSymmMem", "SymmMemExecutor", "symm_mem_executor", "memory_tag"]
