"""Claim, compile and call a trace: the shortest path from a hand-built trace to
results, used by tests (the OpInfo sweep) and by the jit's pipeline tail."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from thunderlite.core.trace import Trace
from thunderlite.executors.registry import resolve_executors
from thunderlite.transforms.claim import claim_executors


def compile_trace(trace: Trace, executors: Sequence | None = None) -> tuple[Trace, Callable]:
    """``(claimed trace, its compiled callable)``; ``executors`` are names or
    Executor objects (default list when None; torch is always appended)."""
    claimed = claim_executors(trace, resolve_executors(executors))
    return claimed, claimed.python_callable()


def run_trace(trace: Trace, args: Sequence[Any], executors: Sequence | None = None) -> Any:
    """Run ``trace`` on concrete ``args`` (in ``trace.args`` order)."""
    return compile_trace(trace, executors)[1](*args)
