"""Interpreted frames, the runtime (hooks) they share and the stack of active frames."""
from __future__ import annotations

import threading

from .hooks import HOOK_NAMES, InterpreterError, InterpreterHooks


class _Null:
    __slots__ = ()

    def __repr__(self):
        return "NULL"


NULL = _Null()  # the NULL CPython pushes below callables and for unbound slots


class _Unbound:
    __slots__ = ()

    def __repr__(self):
        return "<unbound>"


UNBOUND = _Unbound()  # an unassigned fast local

class ThreadState:
    """Per-thread interpreter state.

    ``frames``: the active interpreted frames, innermost last (so that
    current_source_location() is O(1)). ``handled``: the exception interpreted code is
    handling (what sys.exc_info() returns there); generators save and restore it
    around their resumption.
    """

    __slots__ = ("frames", "handled")

    def __init__(self):
        self.frames = []
        self.handled = None


_TLS = threading.local()


def thread_state():
    ts = getattr(_TLS, "ts", None)
    if ts is None:
        ts = _TLS.ts = ThreadState()
    return ts


class Runtime:
    """The hooks of one ``interpret`` call, with default (not overridden) hooks as None."""

    __slots__ = ("hooks", "table") + HOOK_NAMES

    def __init__(self, hooks, table):
        self.hooks = hooks
        self.table = table
        for name in HOOK_NAMES:
            mine = getattr(hooks, name)
            base = getattr(InterpreterHooks, name)
            setattr(self, name, None if getattr(mine, "__func__", None) is base else mine)


class Frame:
    """One activation of a code object: value stack, localsplus, exception bookkeeping."""

    __slots__ = (
        "dec", "pc", "stack", "fast", "globals", "builtins", "locals", "fn", "closure", "rt",
        "kw_names", "ts", "result", "entry_handled",
        "delegate", "saved_handled",  # generator frames only (set by make_suspendable)
        "blocks",  # 3.10 only (set by its init_frame)
    )

    def __init__(self, rt, dec, fn, globals_, builtins_, locals_, fast, closure):
        self.dec = dec
        self.pc = 0
        self.stack = []
        self.fast = fast
        self.globals = globals_
        self.builtins = builtins_
        self.locals = locals_
        self.fn = fn
        self.closure = closure
        self.rt = rt
        self.kw_names = ()
        self.ts = thread_state()

    @property
    def code(self):
        return self.dec.code

    @property
    def instrs(self):
        return self.dec.instrs

    @property
    def lineno(self):
        return self.instrs[self.pc - 1].line if self.pc else self.code.co_firstlineno


def current_source_location():
    """(filename, lineno) of the innermost interpreted user frame, or None outside one."""
    frames = thread_state().frames
    if not frames:
        return None
    f = frames[-1]
    return f.code.co_filename, f.lineno


def source_locations() -> list[tuple[str, int]]:
    """(filename, lineno) of every interpreted frame, outermost first."""
    return [(f.code.co_filename, f.lineno) for f in thread_state().frames]


def active_frames() -> list:
    """The active interpreted frames of this thread, outermost first: what a
    caller inspecting the program's live values walks (their stacks, locals,
    cells)."""
    return list(thread_state().frames)


def interpreted_functions() -> list:
    """The function objects of the interpreted frames, innermost first (None for
    frames without one, a class body or ``exec``'d code)."""
    return [f.fn for f in reversed(thread_state().frames)]


def limit(construct, f=None):
    """An InterpreterError naming the construct and the user's file:line."""
    if f is None and thread_state().frames:
        f = thread_state().frames[-1]
    where = f"{f.code.co_filename}:{f.lineno}" if f is not None else "<unknown>"
    return InterpreterError(f"{construct} is not supported by the interpreter at {where}")
