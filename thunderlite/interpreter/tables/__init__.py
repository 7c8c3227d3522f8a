"""Opcode -> handler tables, one per Python version (``py310`` ... ``py313``,
built on ``registry.HandlerTable``), and the pick of the running Python's
(the one version check). May import ``interpreter.ops`` and the interpreter's
own modules only."""
from __future__ import annotations

import importlib
import sys

_MODULES = {(3, 10): "py310", (3, 11): "py311", (3, 12): "py312", (3, 13): "py313"}
_TABLE = []


def current_table():
    """The HandlerTable of the running Python, built (and validated) on first use."""
    if not _TABLE:
        name = _MODULES.get(sys.version_info[:2])
        if name is None:
            raise ImportError(f"thunderlite.interpreter supports Python 3.10-3.13, not {sys.version}")
        _TABLE.append(importlib.import_module(f"{__package__}.{name}").build())
    return _TABLE[0]
