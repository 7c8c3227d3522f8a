"""Record a function called by the traced program into a scratch trace.

A ``torch.func`` transform needs what its function computes as symbols of
their own (to differentiate or batch them) before anything lands in the
enclosing trace. ``record(hooks, fn, args, kwargs)`` interprets ``fn`` with the
same hooks (its reads of globals, modules and closures get provenance and
guards like any other), into a trace that shares the enclosing trace's names,
and gives back its symbols and output. The symbols read enclosing values
freely; the caller inlines what it derives from them.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import current_trace, tracectx
from thunderlite.interpreter import interpret


@contextlib.contextmanager
def _grad_mode(hooks, enabled: bool | None):
    """Grad mode for the recording: ``torch.func.grad`` turns it on inside
    (eager: an outer ``no_grad`` does not reach into it), without a recorded switch."""
    if enabled is None:
        yield
        return
    was, native = hooks.grad_enabled, torch.is_grad_enabled()
    hooks.grad_enabled = enabled
    torch._C._set_grad_enabled(enabled)
    try:
        yield
    finally:
        hooks.grad_enabled = was
        torch._C._set_grad_enabled(native)


def record(hooks, fn: Callable, args: tuple, kwargs: dict, grad: bool | None = None) -> tuple[list[BoundSymbol], Any]:
    """``fn(*args, **kwargs)`` interpreted into a scratch trace: (symbols, output)."""
    saved = hooks.trace

    def run():
        hooks.trace = current_trace()       # the hooks stamp lines and grad flags on the scratch
        with _grad_mode(hooks, grad):
            return (hooks.lookaside(fn) or interpret(fn, hooks))(*args, **kwargs)
    try:
        return recorded(run)
    finally:
        hooks.trace = saved


def recorded(fn: Callable, *args) -> tuple[list[BoundSymbol], Any]:
    """``fn(*args)`` (thunderlite's own code recording symbols, run natively)
    recorded into a scratch trace: (symbols, output)."""
    outer = current_trace()
    scratch = Trace("sub-trace", names=outer.names)
    scratch.source = outer.source
    with tracectx(scratch):
        out = fn(*args)
    return scratch.bound_symbols, out


def inline(bsyms) -> None:
    """Append ``bsyms`` to the current trace as they are."""
    trc = current_trace()
    for b in bsyms:
        trc.add_bound_symbol(b)
