"""Decoding a code object once into a list of instructions with resolved jumps."""
from __future__ import annotations

import dis
import weakref

from .frame import UNBOUND, limit


class Instr:
    """One decoded instruction; ``target`` is the index of its jump target."""

    __slots__ = ("fn", "opname", "arg", "argval", "target", "line", "offset", "index", "raw_next")

    def __repr__(self):
        return f"<{self.index} {self.opname} {self.arg} {self.argval!r} line {self.line}>"


class Decoded:
    """The decoded form of a code object, shared by all its frames."""

    __slots__ = ("code_ref", "instrs", "exc_for", "index_of", "binder", "nlocalsplus", "names",
                 "simple_argc", "padding", "suspendable", "predicated_blocks")

    def __init__(self, code):
        self.code_ref = weakref.ref(code)  # the cache must not keep code objects alive
        self.binder = None
        self.predicated_blocks = {}  # jump index -> the blocks it guards (predicate.py)

    @property
    def code(self):
        return self.code_ref()


# id(code) -> Decoded. An entry is dropped when its code object dies, so ids are never stale.
_CACHE: dict = {}


def _unsupported(name):
    # <any opcode without a handler> (--): an InterpreterError naming it and the user's line
    def op_unsupported(f, ins):
        raise limit(f"opcode {name}", f)

    return op_unsupported


def _lines(code):
    table = {}
    for start, end, line in code.co_lines():
        for off in range(start, end, 2):
            table[off] = line
    return table


def _localsplus_names(code):
    cells = tuple(c for c in code.co_cellvars if c not in code.co_varnames)
    return code.co_varnames + cells + code.co_freevars


def decode(code, table):
    """The cached Decoded form of code (keyed by identity: hashing a code object is slow)."""
    hit = _CACHE.get(id(code))
    if hit is not None:
        return hit
    dec = Decoded(code)
    lines = _lines(code)
    instrs = []
    index_of = {}
    raw = [d for d in dis.get_instructions(code) if d.opname != "CACHE"]
    pending = []  # offsets of elided no-ops: they resolve to the next kept instruction
    for k, d in enumerate(raw):
        fn = table.handlers[d.opcode] or _unsupported(d.opname)
        if getattr(fn, "elidable", False) and k + 1 < len(raw):
            pending.append(d.offset)
            continue
        ins = Instr()
        ins.index = len(instrs)
        ins.opname = d.opname
        ins.arg = d.arg
        ins.argval = d.argval
        ins.offset = d.offset
        ins.line = lines.get(d.offset) or code.co_firstlineno
        ins.fn = fn
        ins.target = d.argval if d.opcode in dis.hasjrel or d.opcode in dis.hasjabs else None
        ins.raw_next = (raw[k + 1].opname, raw[k + 1].arg) if k + 1 < len(raw) else (None, None)
        for off in pending:
            index_of[off] = ins.index
        pending.clear()
        index_of[d.offset] = ins.index
        instrs.append(ins)
    for ins in instrs:
        if ins.target is not None:
            ins.target = index_of[ins.target]
    dec.instrs = instrs
    dec.index_of = index_of
    dec.names = (table.localsplus_names or _localsplus_names)(code)
    dec.nlocalsplus = len(dec.names)
    # Calls with exactly simple_argc positional arguments bind by copying them (-1: never).
    simple = not code.co_flags & 0x0C and not code.co_kwonlyargcount
    dec.simple_argc = code.co_argcount if simple else -1
    dec.padding = (UNBOUND,) * (dec.nlocalsplus - code.co_argcount)
    dec.suspendable = bool(code.co_flags & 0x2A0)  # generator, coroutine, async generator
    dec.exc_for = _exception_targets(code, instrs, index_of)
    for ins in instrs:
        prep = table.prepare[dis.opmap[ins.opname]]
        if prep is not None:
            prep(ins, dec)
    _CACHE[id(code)] = dec
    weakref.finalize(code, _CACHE.pop, id(code), None)
    return dec


def _exception_targets(code, instrs, index_of):
    """Per instruction index: (handler index, stack depth, push lasti) or None (3.11+)."""
    parse = getattr(dis, "_parse_exception_table", None)
    if parse is None:
        return None
    out = [None] * len(instrs)
    for e in parse(code):
        entry = (index_of[e.target], e.depth, e.lasti)
        for ins in instrs:
            if e.start <= ins.offset < e.end:
                out[ins.index] = entry
    return out
