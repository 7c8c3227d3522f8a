"""Selects the handler table of the running Python (the one version check)."""
from __future__ import annotations

import importlib
import sys

_MODULES = {(3, 10): "table_310", (3, 11): "table_311", (3, 12): "table_312", (3, 13): "table_313"}
_TABLE = []


def current_table():
    """The HandlerTable of the running Python, built (and validated) on first use."""
    if not _TABLE:
        name = _MODULES.get(sys.version_info[:2])
        if name is None:
            raise ImportError(f"thunderlite.interpreter supports Python 3.10-3.13, not {sys.version}")
        _TABLE.append(importlib.import_module(f"{__package__}.{name}").build())
    return _TABLE[0]
