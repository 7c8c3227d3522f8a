"""A CPython bytecode interpreter in pure Python (3.10-3.13) with hooks for the jit.

Imports neither torch nor anything else from thunderlite; ``ops/`` holds the
opcode handlers and ``tables/`` the per-version opcode tables built from them.
"""
from .api import call_past_lookaside, interpret
from .frame import active_frames, current_source_location, interpreted_functions, source_locations
from .hooks import MISSING, InterpreterError, InterpreterHooks

__all__ = ["interpret", "call_past_lookaside", "InterpreterHooks", "InterpreterError", "MISSING",
           "current_source_location", "source_locations", "interpreted_functions", "active_frames"]
