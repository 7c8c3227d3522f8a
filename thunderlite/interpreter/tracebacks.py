"""User-facing tracebacks: the user's interpreted frames, not the interpreter's own.

An exception raised under the interpreter travels through the interpreter's
Python frames (dispatch loop, handlers, call protocol), so its native
``__traceback__`` names them instead of the user's functions, which have no
real frames. While it propagates, each interpreted frame it arises in records its
code and line on the exception (``record_raise``), where CPython would add a
traceback entry. When it leaves the
outermost ``interpret(...)`` call, ``make_user_facing`` drops the interpreter's
frames from the traceback (keeping the caller's frames and any frame that ran
natively, e.g. where a library function raised) and, on Python 3.11+, adds a
note listing the interpreted frames the way CPython prints a traceback::

    Traceback of the interpreted code (most recent call last):
      File "model.py", line 12, in forward
        return self.block(x)
      File "model.py", line 5, in block
        raise ValueError("bad shape")

The exception's type and ``str()`` are unchanged; an exception caught by the
user's own ``try`` inside interpreted code is left alone (it never reaches
the outermost call). On 3.10 (no ``add_note``) the traceback is only stripped,
and one entry of the entry point (``interpreted`` in api.py) stays: 3.10's
bare ``raise`` restores the traceback object it caught, whose head is that frame.
"""
from __future__ import annotations

import linecache
import os
import types

NOTE_HEADER = "Traceback of the interpreted code (most recent call last):"
_FRAMES_ATTR = "_thunderlite_interpreted_frames"
_SHOWN_ATTR = "_thunderlite_shown_frames"
# Instructions that re-raise without a new traceback entry (CPython jumps past
# PyTraceBack_Here): the frame keeps the line where the exception first arose.
_NO_TRACEBACK_ENTRY = frozenset(("RERAISE", "END_ASYNC_FOR", "CLEANUP_THROW"))


def adds_traceback_entry(ins) -> bool:
    """Whether an exception raised by instruction ``ins`` gets a new entry
    (a bare ``raise`` is ``RAISE_VARARGS 0``: it re-raises, like ``RERAISE``)."""
    return ins.opname not in _NO_TRACEBACK_ENTRY and not (ins.opname == "RAISE_VARARGS" and not ins.arg)
_INTERPRETER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def record_raise(exc: BaseException, f) -> None:
    """Add ``f``'s current line to the interpreted traceback of ``exc``, where
    CPython would add a traceback entry for ``f`` (innermost first)."""
    try:
        frames = exc.__dict__.setdefault(_FRAMES_ATTR, [])
    except AttributeError:  # an exception type without instance attributes
        return
    frames.append((f.code, f.lineno))


def interpreted_frames(exc: BaseException) -> list[tuple[str, int]]:
    """(filename, lineno) of the interpreted frames ``exc`` passed through, outermost first."""
    d = getattr(exc, "__dict__", {})
    frames = d.get(_FRAMES_ATTR) or d.get(_SHOWN_ATTR) or ()
    return [(code.co_filename, lineno) for code, lineno in reversed(frames)]


def _is_internal(tb) -> bool:
    return tb.tb_frame.f_code.co_filename.startswith(_INTERPRETER_DIR)


def _strip(exc: BaseException) -> None:
    """Drop the interpreter's entries from ``exc.__traceback__`` (kept in order)."""
    head = exc.__traceback__
    kept, total = [], 0
    tb = head
    while tb is not None:
        total += 1
        if not _is_internal(tb):
            kept.append(tb)
        tb = tb.tb_next
    if len(kept) == total:
        return
    new = None
    for tb in reversed(kept):
        new = types.TracebackType(new, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    if head is not None and _is_internal(head):
        head.tb_next = new  # what 3.10's bare ``raise`` restores
    exc.__traceback__ = new


def format_frames(frames: list) -> str:
    """The note text for recorded ``(code, lineno)`` pairs, innermost first."""
    lines = [NOTE_HEADER]
    for code, lineno in reversed(frames):
        lines.append(f'  File "{code.co_filename}", line {lineno}, in {code.co_name}')
        source = linecache.getline(code.co_filename, lineno).strip() if lineno else ""
        if source:
            lines.append(f"    {source}")
    return "\n".join(lines)


def make_user_facing(exc: BaseException) -> None:
    """Strip and annotate ``exc`` and the exceptions chained to it (cause/context)."""
    seen = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        frames = None
        if hasattr(e, "__dict__"):
            frames = e.__dict__.pop(_FRAMES_ATTR, None)
            if frames:
                e.__dict__[_SHOWN_ATTR] = frames     # kept for interpreted_frames
        _strip(e)
        if frames and hasattr(e, "add_note"):
            e.add_note(format_frames(frames))
        todo += [e.__cause__, e.__context__]
