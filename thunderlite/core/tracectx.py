"""Which trace is being recorded into, per thread, and the lock of the tables
every thread's compiles share.

Compiling is per call, not per process: two threads tracing at once each
record into their own trace, so every stack of tracing state (this one, the
active ``ShapeEnv``, the gradient recorder, the progress reporter) is a
``ThreadStack``. What compiles do share (symbols made on an op's first use,
unique printed names, code caches) is filled under ``tables_lock``, so two
threads meeting a new op at once get one symbol, never two with one name."""
from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any


class ThreadStack(threading.local):
    """A list private to each thread (``items``): the state of the calls this
    thread is tracing, innermost last. ``threading.local`` runs ``__init__``
    once per thread, on its first access."""

    def __init__(self):
        self.items: list = []


_traces = ThreadStack()

tables_lock = threading.RLock()
"""Held while a table shared by all threads gains an entry (re-entrant: making
one symbol may register another)."""


def made_once(table: dict, key, make: Callable[[], Any]) -> Any:
    """``table[key]``, made by ``make()`` the first time, under ``tables_lock``:
    threads racing for a missing key all get the one value the first made."""
    value = table.get(key)
    if value is None:
        with tables_lock:
            value = table.get(key)
            if value is None:
                value = table[key] = make()
    return value


def current_trace():
    """The trace symbols record into, or None outside tracing."""
    stack = _traces.items
    return stack[-1] if stack else None


def active_traces() -> tuple:
    """Every trace being recorded into, outermost first (a user
    ``autograd.Function``'s forward records into its own, inside the program's)."""
    return tuple(_traces.items)


@contextmanager
def tracectx(trace):
    stack = _traces.items
    stack.append(trace)
    try:
        yield trace
    finally:
        stack.pop()
