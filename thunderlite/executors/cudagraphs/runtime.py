"""Capturing and replaying the regions ``plan.py`` chose, and the user-facing
transform (docs/architecture.md §6, "CUDA graphs").

``GraphRunner`` is one region's callable. Its first call with a new input
signature (shapes, strides, dtypes, devices, the values of number inputs, the
addresses of parameters) copies the inputs into static buffers, runs the
region once on a side stream (the warm-up: its results are this call's, and
lazy work such as Inductor's compilation happens there, not during capture),
then captures one more run into a ``torch.cuda.CUDAGraph`` in the runner's own
memory pool. Later calls with that signature copy the inputs into the static
buffers (one ``_foreach_copy_``) and replay. Parameters are captured by
address (a new address is a new signature) rather than copied each call.

Outputs that outlive the trace's call (returned, saved for backward, aliased
later) are handed back as copies, because the next replay overwrites the
static output buffers; the others are the buffers themselves. A call that
autograd records (grad mode on and an input requiring grad: an eager-mode
program) runs the region's torch calls, so autograd sees eager's ops. A
capture that fails (an op that synchronises despite the plan, an unsupported
kernel) leaves that signature running uncaptured, with the error in
``fallbacks``.

Threads: each thread gets its own static buffers and graphs (the signature
holds the thread's id), because a replay overwrites buffers another thread's
call may still be reading; captures run one at a time, in
``capture_error_mode="thread_local"`` so other threads' work does not break one.

Without CUDA tensors the runner does what replay does with plain Python (copy
into static buffers, run, copy into static outputs, copy what escapes): the
CPU stand-in the tests use to check the plan and the buffer handling.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from thunderlite.core.trace import Trace
from thunderlite.executors.cudagraphs.plan import apply_plan, plan_graphs
from thunderlite.transforms.del_last_used import del_last_used
from thunderlite.transforms.fusion import Region
from thunderlite.transforms.user import Transform

MAX_GRAPHS = 16     # signatures captured per region; later ones run uncaptured (recorded in fallbacks)
_capture_lock = threading.Lock()


def _static_copy(t: torch.Tensor) -> torch.Tensor:
    buf = torch.empty_like(t)       # t's strides when dense, else contiguous
    buf.copy_(t)
    return buf


def _by_address(a) -> bool:
    return isinstance(a, torch.nn.Parameter)


def signature(args: tuple) -> tuple:
    """What a captured graph depends on in its inputs, and the calling thread."""
    key = [threading.get_ident()]
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((a.shape, a.stride(), a.dtype, a.device, a.requires_grad,
                        a.data_ptr() if _by_address(a) else None))
        else:
            key.append((type(a), a))
    return tuple(key)


class _Captured:
    """One signature's static buffers and graph (None: the CPU stand-in)."""
    __slots__ = ("static_in", "dst", "src_idx", "static_out", "graph")

    def __init__(self, static_in: list, args: tuple, static_out: tuple, graph):
        self.static_in = static_in
        self.src_idx = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and static_in[i] is not a]
        self.dst = [static_in[i] for i in self.src_idx]
        self.static_out = static_out
        self.graph = graph


class GraphRunner:
    """The callable of one graph symbol (see the module docstring)."""

    def __init__(self, fn: Callable, escaping: tuple[bool, ...], name: str):
        self.fn = fn
        self.escaping = escaping
        self.name = name
        self.fallbacks: list[str] = []
        self.captures = 0
        self.replays = 0
        self._graphs: dict[tuple, _Captured | None] = {}
        self._pool = None

    def __call__(self, *args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return self.fn(*args)
        key = signature(args)
        cap = self._graphs.get(key, False)
        if cap is False:
            return self._first_call(key, args)
        if cap is None:
            return self.fn(*args)
        if cap.src_idx:
            torch._foreach_copy_(cap.dst, [args[i] for i in cap.src_idx])
        if cap.graph is not None:
            cap.graph.replay()
        else:
            torch._foreach_copy_(list(cap.static_out), list(self.fn(*cap.static_in)))
        self.replays += 1
        return tuple(o.clone() if esc else o for o, esc in zip(cap.static_out, self.escaping, strict=True))

    def _first_call(self, key: tuple, args: tuple):
        if len(self._graphs) >= MAX_GRAPHS:
            self._graphs[key] = None
            self.fallbacks.append(f"more than {MAX_GRAPHS} input signatures: this one runs uncaptured")
            return self.fn(*args)
        static_in = [a if not isinstance(a, torch.Tensor) or _by_address(a) else _static_copy(a) for a in args]
        if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            outs, cap = self._capture(static_in, args)
        else:
            outs = tuple(self.fn(*static_in))
            cap = _Captured(static_in, args, tuple(o.clone() for o in outs), None)
        self._graphs[key] = cap
        return outs

    def _capture(self, static_in: list, args: tuple):
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            outs = tuple(self.fn(*static_in))      # warm-up: this call's results
        current.wait_stream(side)
        for o in outs:
            o.record_stream(current)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with _capture_lock, torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                static_out = tuple(self.fn(*static_in))
        except Exception as e:      # noqa: BLE001 -- any capture failure leaves the region uncaptured
            torch.cuda.synchronize()
            self.fallbacks.append(f"capture failed, runs uncaptured: {type(e).__name__}: {e}")
            return outs, None
        self.captures += 1
        return outs, _Captured(static_in, args, static_out, graph)


def make_runner(sub: Trace, region: Region, escaping: tuple[bool, ...]) -> GraphRunner:
    """The runner of one planned region: its trace, freeing each intermediate
    after its last use (inside a capture that lets the graph's pool reuse it)."""
    runner = GraphRunner(del_last_used(sub).python_callable(), escaping, sub.name)
    runner.__thunderlite_trace__ = sub
    return runner


class CUDAGraphs(Transform):
    """``jit(fn, transforms=[CUDAGraphs()])``, or ``jit(fn, cudagraphs=True)``:
    the static parts of each final trace (forward, backward, or the
    computation) run as CUDA graphs; every symbol left out carries the reason
    above it in the trace, and ``examine`` lists them. Combines with every
    executor: it runs after they claimed the trace. ``min_kernels``: the
    smallest region worth its input copies. ``devices``: the device types
    captured (``("cpu",)`` makes the plan and the CPU stand-in testable)."""

    def __init__(self, *, min_kernels: int = 2, devices: tuple[str, ...] = ("cuda",)):
        self.min_kernels = min_kernels
        self.devices = tuple(devices)

    def after_claiming(self, trace: Trace) -> Trace:
        plan = plan_graphs(trace, devices=self.devices, min_kernels=self.min_kernels)
        return apply_plan(trace, plan, make_runner)
