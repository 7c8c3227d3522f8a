"""CALL_INTRINSIC_1 / CALL_INTRINSIC_2 (3.12+): small helpers the compiler calls by number."""
from __future__ import annotations

import operator
import typing

from ..asyncgen import Wrapped
from ..calls import call
from ..frame import limit
from ..operators import unary
from .exceptions import prep_reraise_star
from .loads import import_star


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


def _generic(f, params):
    unpacked = tuple(typing.Unpack[p] if isinstance(p, typing.TypeVarTuple) else p for p in params)
    return typing.Generic[unpacked]


def _type_alias(f, args):
    # The value is evaluated eagerly (CPython evaluates it on first __value__ access).
    name, type_params, compute_value = args
    return typing.TypeAliasType(name, call(f.rt, compute_value, ()), type_params=type_params or ())


_INTRINSIC_1 = {
    2: import_star,
    3: _stopiteration_error,
    5: lambda f, v: unary(f.rt, v, "__pos__", operator.pos),
    4: lambda f, v: Wrapped(v),
    6: lambda f, v: tuple(v),
    7: lambda f, name: typing.TypeVar(name, infer_variance=True),
    8: lambda f, name: typing.ParamSpec(name, infer_variance=True),
    9: lambda f, name: typing.TypeVarTuple(name),
    10: _generic,
    11: _type_alias,
}
_INTRINSIC_1_NAMES = {1: "PRINT"}


# CALL_INTRINSIC_1 (value -- res)
def op_call_intrinsic_1(f, ins):
    fn = _INTRINSIC_1.get(ins.arg)
    if fn is None:
        raise limit(f"CALL_INTRINSIC_1 {_INTRINSIC_1_NAMES.get(ins.arg, ins.arg)}", f)
    st = f.stack
    st[-1] = fn(f, st[-1])


def _set_type_params(f, func, params):
    func.__type_params__ = params
    return func


# Bounds and constraints are evaluated eagerly (CPython evaluates them lazily).
_INTRINSIC_2 = {
    1: lambda f, orig, excs: prep_reraise_star(orig, excs),
    2: lambda f, name, bound: typing.TypeVar(name, bound=call(f.rt, bound, ()), infer_variance=True),
    3: lambda f, name, cons: typing.TypeVar(name, *call(f.rt, cons, ()), infer_variance=True),
    4: _set_type_params,
}


# CALL_INTRINSIC_2 (value2 value1 -- res)
def op_call_intrinsic_2(f, ins):
    fn = _INTRINSIC_2.get(ins.arg)
    if fn is None:
        raise limit(f"CALL_INTRINSIC_2 {ins.arg} (type parameter defaults)", f)
    st = f.stack
    value1 = st.pop()
    st[-1] = fn(f, st[-1], value1)
