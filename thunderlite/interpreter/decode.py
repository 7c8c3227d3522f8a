"""Decoding a code object once into a list of instructions with resolved jumps."""
from __future__ import annotations

import bisect
import dis
import weakref

from .frame import UNBOUND, limit
from .instructions import instructions

_JUMPS = [op in dis.hasjrel or op in getattr(dis, "hasjabs", ()) for op in range(512)]


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
        # the cache must not keep code objects alive: the entry goes when its code object dies
        key = id(code)
        self.code_ref = weakref.ref(code, lambda _: _CACHE.pop(key, None))
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


def _localsplus_names(code):
    cells = tuple(c for c in code.co_cellvars if c not in code.co_varnames)
    return code.co_varnames + cells + code.co_freevars


def decode(code, table):
    """The cached Decoded form of code (keyed by identity: hashing a code object is slow)."""
    hit = _CACHE.get(id(code))
    if hit is not None:
        return hit
    dec = Decoded(code)
    spans = [span for span in code.co_lines() if span[0] < span[1]]    # (start, end, line), in order
    nspans = len(spans)
    j = 0
    instrs = []
    index_of = {}
    raw = instructions(code)
    last = len(raw) - 1
    pending = []  # offsets of elided no-ops: they resolve to the next kept instruction
    prepare = table.prepare
    prepared = []
    for k, (offset, opcode, opname, arg, argval) in enumerate(raw):
        fn = table.handlers[opcode] or _unsupported(opname)
        if k < last and getattr(fn, "elidable", False):
            pending.append(offset)
            continue
        ins = Instr()
        if prepare[opcode] is not None:
            prepared.append((prepare[opcode], ins))
        ins.index = len(instrs)
        ins.opname = opname
        ins.arg = arg
        ins.argval = argval
        ins.offset = offset
        while j < nspans and spans[j][0] <= offset:
            j += 1
        span = spans[j - 1] if j else None
        ins.line = (span[2] if span is not None and span[1] > offset else None) or code.co_firstlineno
        ins.fn = fn
        ins.target = argval if _JUMPS[opcode] else None
        ins.raw_next = raw[k + 1][2:4] if k < last else (None, None)
        for off in pending:
            index_of[off] = ins.index
        pending.clear()
        index_of[offset] = ins.index
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
    for prep, ins in prepared:
        prep(ins, dec)
    _CACHE[id(code)] = dec
    return dec


def _exception_targets(code, instrs, index_of):
    """Per instruction index: (handler index, stack depth, push lasti) or None (3.11+)."""
    parse = getattr(dis, "_parse_exception_table", None)
    if parse is None:
        return None
    out = [None] * len(instrs)
    if not code.co_exceptiontable:
        return out
    offsets = [ins.offset for ins in instrs]       # ascending: each range is a slice of them
    for e in parse(code):
        entry = (index_of[e.target], e.depth, e.lasti)
        for k in range(bisect.bisect_left(offsets, e.start), bisect.bisect_left(offsets, e.end)):
            out[k] = entry
    return out
