"""Programs needing Python 3.11+: except* and exception groups."""
# ruff: noqa
from __future__ import annotations

from interp_harness import program


@program()
def except_star_basic():
    out = []
    try:
        raise ExceptionGroup("eg", [ValueError(1), TypeError(2), ValueError(3)])
    except* ValueError as e:
        out.append(("V", [str(x) for x in e.exceptions]))
    except* TypeError as e:
        out.append(("T", [str(x) for x in e.exceptions]))
    return out


@program()
def except_star_partial_reraise():
    try:
        try:
            raise ExceptionGroup("eg", [ValueError(1), KeyError(2)])
        except* ValueError:
            pass
    except ExceptionGroup as e:
        return [type(x).__name__ for x in e.exceptions], str(e)


@program()
def except_star_naked():
    out = []
    try:
        raise ValueError("naked")
    except* ValueError as e:
        out.append((type(e).__name__, [str(x) for x in e.exceptions]))
    return out


@program()
def except_star_raise_new():
    try:
        try:
            raise ExceptionGroup("eg", [ValueError(1)])
        except* ValueError:
            raise KeyError("new")
    except ExceptionGroup as e:
        return [repr(x) for x in e.exceptions]
    except KeyError as e:
        return "bare", repr(e)


@program()
def exception_group_split():
    eg = ExceptionGroup("x", [ValueError(1), TypeError(2)])
    m, r = eg.split(ValueError)
    return str(m), str(r), len(eg.exceptions)


@program()
def exception_notes():
    try:
        try:
            raise ValueError("v")
        except ValueError as e:
            e.add_note("note1")
            raise
    except ValueError as e:
        return e.__notes__
