"""Progress of a long compile on stderr: the stage and the symbols processed.

A compile shorter than ``SHOW_AFTER_S`` prints nothing. A longer one gets one
status line on stderr, rewritten in place every ``INTERVAL_S``::

    thunderlite: compiling forward: claim_executors, 1840 symbols (3.2 s)

and a last line saying how long it took. A daemon thread writes the line, so the
compile itself only sets two attributes per stage (``note``): nothing on the
cached-call path. ``jit(fn, progress=...)``: ``None`` (the default) shows it only
when stderr is a terminal, ``False`` never, ``True`` always.

Example::

    with compile_progress("forward", enabled=None):
        note("update_aliases", trace)      # called by the pipeline before each pass
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator

from thunderlite.core.tracectx import ThreadStack

SHOW_AFTER_S = 2.0
INTERVAL_S = 0.5

_active = ThreadStack()      # the reporters of the compiles this thread runs


class _Reporter:
    def __init__(self, name: str):
        self.name = name
        self.stage = "interpretation"
        self.trace = None
        self.start = time.perf_counter()
        self.shown = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thunderlite-progress", daemon=True)

    def symbols(self) -> int:
        trace = self.trace
        return len(trace.bound_symbols) if trace is not None else 0

    def _write(self, text: str) -> None:
        err = sys.stderr
        err.write(text)
        err.flush()

    def _run(self) -> None:
        if self._stop.wait(SHOW_AFTER_S):
            return
        while True:
            elapsed = time.perf_counter() - self.start
            self._write(f"\r\x1b[Kthunderlite: compiling {self.name}: {self.stage}, "
                        f"{self.symbols()} symbols ({elapsed:.1f} s)")
            self.shown = True
            if self._stop.wait(INTERVAL_S):
                return

    def finish(self, failed: bool) -> None:
        self._stop.set()
        self._thread.join()
        elapsed = time.perf_counter() - self.start
        if self.shown or elapsed >= SHOW_AFTER_S:
            what = "failed after" if failed else "compiled in"
            self._write(f"\r\x1b[Kthunderlite: {self.name} {what} {elapsed:.1f} s ({self.symbols()} symbols)\n")


def wanted(enabled: bool | None) -> bool:
    """The jit option resolved: None means 'when stderr is a terminal'."""
    if enabled is not None:
        return bool(enabled)
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextlib.contextmanager
def compile_progress(name: str, enabled: bool | None) -> Iterator[None]:
    """Report progress of the compile run inside the block (see module docstring)."""
    if not wanted(enabled):
        yield
        return
    reporter = _Reporter(name)
    _active.items.append(reporter)
    reporter._thread.start()
    failed = True
    try:
        yield
        failed = False
    finally:
        _active.items.remove(reporter)
        reporter.finish(failed)


def note(stage: str, trace) -> None:
    """The pipeline is about to run ``stage`` on ``trace`` (no-op without a reporter)."""
    if _active.items:
        reporter = _active.items[-1]
        reporter.stage, reporter.trace = stage, trace
