"""Opcode handlers, one module per family (stack, loads, build, arith,
control, calls, exceptions, generators, match, intrinsics, and 3.10's blocks);
each handler's docstring states its stack effect.

May import the interpreter's own modules only (no torch, nothing else of thunderlite).
"""
