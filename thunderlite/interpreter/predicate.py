"""Conditional blocks run predicated: both ways at once, for a hook that can make
their effects conditional on a value it cannot read (``InterpreterHooks.predicate``).

At ``if v:`` (a conditional jump over a block) on a value that is not a bool,
the interpreter may ask the hook for a *predication*: an object with

- ``begin(negated)``: the block guarded by the jump starts; it runs where
  ``v`` is true (``negated``: where it is false, ``if not v:``);
- ``switch()``: the ``else`` block starts (it runs where the first did not);
- ``end()``: both blocks ran; the hook makes their effects conditional (it
  may refuse by raising);
- ``refuse(reason)``: the exception to raise when the block does something a
  predication cannot express (it returns, jumps out, raises, changes a local
  the rest of the function reads).

Only blocks of a simple shape are offered: a forward jump over a block whose
jumps stay inside it, optionally ending with a forward jump over an ``else``
block of the same kind, with no ``return``/``yield``/``raise`` in either.
"""
from __future__ import annotations

from types import CellType

from .hooks import InterpreterError

_JUMPS_OVER_ELSE = frozenset({"JUMP_FORWARD", "JUMP", "JUMP_NO_INTERRUPT", "JUMP_ABSOLUTE"})
_EXITS = frozenset({"RETURN_VALUE", "RETURN_CONST", "YIELD_VALUE", "YIELD_FROM", "RAISE_VARARGS", "SEND",
                    "RETURN_GENERATOR", "GET_AWAITABLE", "INSTRUMENTED_RETURN_VALUE"})
def blocks(dec, ins) -> tuple | None:
    """The ``(start, end)`` instruction spans the conditional jump ``ins`` guards
    (the block, then an ``else`` block if any), or None when their shape is not
    one a predication can run."""
    cache = dec.predicated_blocks
    if ins.index not in cache:
        cache[ins.index] = _blocks(dec.instrs, ins.index + 1, ins.target)
    return cache[ins.index]


def _blocks(instrs: list, start: int, target: int) -> tuple | None:
    if target is None or target <= start:
        return None
    last = instrs[target - 1]
    spans = ((start, target),)
    if last.opname in _JUMPS_OVER_ELSE and last.target is not None and last.target > target:
        spans = ((start, target - 1), (target, last.target))
    for a, b in spans:
        for i in range(a, b):
            x = instrs[i]
            if x.opname in _EXITS or x.target is not None and not a <= x.target <= b:
                return None
    return spans


def run(f, spans: tuple, pred, negated: bool) -> None:
    """Run the frame's ``spans`` one after the other under ``pred``; leaves the
    frame after the last one."""
    instrs = f.dec.instrs
    depth = len(f.stack)
    before = [_slot(v) for v in f.fast]
    pred.begin(negated)
    for k, (a, b) in enumerate(spans):
        if k:
            pred.switch()
        f.pc = a
        try:
            while f.pc != b:
                if not a <= f.pc < b:
                    raise pred.refuse("it jumps out of the block")
                i = instrs[f.pc]
                f.pc += 1
                if i.fn(f, i) is not None:
                    raise pred.refuse("it returns from the block")
        except InterpreterError:
            pred.refuse("the interpreter stopped")     # the predication ends; the error is the program's
            raise
        except BaseException as e:
            if getattr(e, "predication", None) is pred:
                raise
            raise pred.refuse(f"it raised {type(e).__name__} ({e})") from e
    if len(f.stack) != depth:
        raise pred.refuse("it leaves values on the stack")
    names = f.dec.names
    for i, v in enumerate(f.fast):
        if _slot(v) != before[i] and _read_after(instrs, names[i], spans):
            raise pred.refuse(f"it assigns the local {names[i]!r}, which the function reads afterwards")
    pred.end()
    f.pc = spans[-1][1]


def _slot(v):
    """A local's identity, a cell's by its contents."""
    if type(v) is CellType:
        try:
            return ("cell", id(v), id(v.cell_contents))
        except ValueError:
            return ("cell", id(v), None)
    return id(v)


def _names(ins) -> tuple:
    v = ins.argval
    return v if type(v) is tuple else (v,)


def _read_after(instrs: list, name: str, spans: tuple) -> bool:
    """Whether ``name`` may be read with the value the block gave it: anywhere
    outside the blocks, or inside them before they assign it (a loop around)."""
    lo, hi = spans[0][0], spans[-1][1]
    for i, x in enumerate(instrs):
        if lo <= i < hi:
            continue
        if x.opname.startswith(("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE", "STORE_FAST_LOAD_FAST")) \
                and name in _names(x) or x.opname == "LOAD_NAME" and x.argval == name:
            return True
    for a, b in spans:
        for x in instrs[a:b]:
            if name not in _names(x):
                continue
            if x.opname.startswith(("STORE_", "DELETE_")):
                break
            if x.opname.startswith("LOAD_"):
                return True
    return False
