"""Opcode handler tables: one per Python version, validated at registration."""
from __future__ import annotations

import dis


class HandlerTable:
    """Maps opname -> handler for one Python version; handlers are indexed by opcode.

    ``register`` refuses an opname twice and opnames missing from this version's
    ``dis.opmap``. ``prepare`` functions run once per decoded instruction to turn
    ``argval`` into what the handler wants (no per-instruction string lookups).

    Example::

        t = HandlerTable("3.11")
        t.register("NOP", op_nop)
        t.handlers[dis.opmap["NOP"]] is op_nop
    """

    def __init__(self, version):
        self.version = version
        size = max(dis.opmap.values()) + 1  # pseudo-instructions are numbered above 255
        self.handlers = [None] * size
        self.prepare = [None] * size
        self.names = {}
        # Version-specific behaviour that is not an opcode, filled by the table module.
        self.unwind = None  # (frame, exc) -> bool: route exc to a handler in frame
        self.init_frame = None  # (frame) -> None: cells/closure set-up before the first instruction
        self.gen_prerun = False  # run a new generator frame up to RETURN_GENERATOR (3.11+)
        self.delegate_raised = None  # (frame, exc) -> exc or None after a delegate's throw() raised
        self.localsplus_names = None  # (code) -> names of the fast slots, when not the 3.11+ layout

    def register(self, opname, handler, prepare=None):
        if opname not in dis.opmap:
            raise ValueError(f"{opname} is not an opcode of Python {self.version}")
        if opname in self.names:
            raise ValueError(f"{opname} registered twice in the Python {self.version} table")
        op = dis.opmap[opname]
        self.names[opname] = handler
        self.handlers[op] = handler
        self.prepare[op] = prepare

    def register_all(self, entries):
        for entry in entries:
            self.register(*entry)
        return self
