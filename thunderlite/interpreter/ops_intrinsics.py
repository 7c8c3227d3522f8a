"""CALL_INTRINSIC_1 / CALL_INTRINSIC_2 (3.12+): small helpers the compiler calls by number."""
from __future__ import annotations

import operator

from .asyncgen import Wrapped
from .frame import limit
from .operators import unary
from .ops_loads import import_star
from .ops_exceptions import prep_reraise_star


def _stopiteration_error(f, exc):
    if isinstance(exc, StopIteration):
        kind = "coroutine" if f.code.co_flags & 0x80 else "async generator" if f.code.co_flags & 0x200 else "generator"
        new = RuntimeError(f"{kind} raised StopIteration")
    elif isinstance(exc, StopAsyncIteration) and f.code.co_flags & 0x200:
        new = RuntimeError("async generator raised StopAsyncIteration")
    else:
        return exc
    new.__cause__ = exc
    new.__context__ = exc
    return new


_INTRINSIC_1 = {
    2: import_star,
    3: _stopiteration_error,
    5: lambda f, v: unary(f.rt, v, "__pos__", operator.pos),
    4: lambda f, v: Wrapped(v),
    6: lambda f, v: tuple(v),
}
_INTRINSIC_1_NAMES = {1: "PRINT", 7: "TYPEVAR", 8: "PARAMSPEC", 9: "TYPEVARTUPLE",
                      10: "SUBSCRIPT_GENERIC", 11: "TYPEALIAS"}


# CALL_INTRINSIC_1 (value -- res)
def op_call_intrinsic_1(f, ins):
    fn = _INTRINSIC_1.get(ins.arg)
    if fn is None:
        raise limit(f"CALL_INTRINSIC_1 {_INTRINSIC_1_NAMES.get(ins.arg, ins.arg)}", f)
    st = f.stack
    st[-1] = fn(f, st[-1])


# CALL_INTRINSIC_2 (value2 value1 -- res)
def op_call_intrinsic_2(f, ins):
    if ins.arg != 1:
        raise limit(f"CALL_INTRINSIC_2 {ins.arg} (type parameters)", f)
    st = f.stack
    excs = st.pop()
    st[-1] = prep_reraise_star(st[-1], excs)
