"""Which trace is being recorded into. A plain module-level stack: tracing is
single-threaded per call, and a list lookup is the cheapest thing there is."""
from __future__ import annotations

from contextlib import contextmanager

_stack: list = []


def current_trace():
    """The trace symbols record into, or None outside tracing."""
    return _stack[-1] if _stack else None


def active_traces() -> tuple:
    """Every trace being recorded into, outermost first (a user
    ``autograd.Function``'s forward records into its own, inside the program's)."""
    return tuple(_stack)


@contextmanager
def tracectx(trace):
    _stack.append(trace)
    try:
        yield trace
    finally:
        _stack.pop()
