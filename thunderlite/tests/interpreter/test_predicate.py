"""The predicate hook: conditional blocks run both ways for a hook that makes
their effects conditional (interpreter/predicate.py), on every Python."""
from __future__ import annotations

import pytest

from thunderlite.interpreter import InterpreterHooks, interpret


class Flag:
    """A value whose truth the hook cannot read."""

    def __bool__(self):
        raise AssertionError("the truth of a Flag was read")


class Refused(Exception):
    pass


class Recorder:
    def __init__(self):
        self.log = []

    def begin(self, negated):
        self.log.append(("begin", negated))

    def switch(self):
        self.log.append("switch")

    def end(self):
        self.log.append("end")

    def refuse(self, reason):
        e = Refused(reason)
        e.predication = self
        return e


class Predicating(InterpreterHooks):
    def __init__(self):
        self.made = []

    def predicate(self, value):
        if not isinstance(value, Flag):
            return None
        self.made.append(Recorder())
        return self.made[-1]


def run(fn, *args):
    hooks = Predicating()
    return interpret(fn, hooks)(*args), [r.log for r in hooks.made]


def if_only(c, out):
    if c:
        out.append("then")
    out.append("after")
    return out


def if_else(c, out):
    if c:
        out.append("then")
    else:
        out.append("else")
    out.append("after")
    return out


def if_not(c, out):
    if not c:
        out.append("then")
    return out


def loop_inside(c, items, out):
    if c:
        for x in items:         # x is not read after the block
            out.append(x * 2)
    return out


def comparison(c, out):
    if c == 3:                  # a Flag compared: Flag (no __eq__ of its own) -> bool, not predicated
        out.append("never")
    return out


def test_blocks_run_both_ways_under_the_predication():
    assert run(if_only, Flag(), []) == (["then", "after"], [[("begin", False), "end"]])
    assert run(if_else, Flag(), []) == (["then", "else", "after"], [[("begin", False), "switch", "end"]])
    assert run(if_not, Flag(), []) == (["then"], [[("begin", True), "end"]])
    assert run(loop_inside, Flag(), [1, 2], []) == ([2, 4], [[("begin", False), "end"]])
    assert run(comparison, Flag(), []) == ([], [])


def test_plain_values_are_not_offered():
    assert run(if_else, 0, []) == (["else", "after"], [])
    assert run(if_else, [1], []) == (["then", "after"], [])


def returns_inside(c):
    if c:
        return 1
    return 2


def local_read_after(c):
    y = 0
    if c:
        y = 1
    return y


def loop_carried(c, xs):
    total = 0
    for x in xs:
        if c:
            total = total + x
    return total


def raises_inside(c):
    if c:
        raise ValueError("no")
    return 1


def test_blocks_that_cannot_be_predicated():
    # a block that returns is not offered: its truth is read as usual
    with pytest.raises(AssertionError, match="truth of a Flag"):
        run(returns_inside, Flag())
    with pytest.raises(Refused, match="'y'"):
        run(local_read_after, Flag())
    # refused, or (3.12+, whose jump at the loop's end goes back to its head) not offered
    with pytest.raises((Refused, AssertionError), match="'total'|truth of a Flag"):
        run(loop_carried, Flag(), [1, 2])
    with pytest.raises(AssertionError, match="truth of a Flag"):   # raise: not offered
        run(raises_inside, Flag())
