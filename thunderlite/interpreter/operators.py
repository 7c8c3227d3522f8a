"""Operator protocols (binary, in-place, unary, comparison, truth, iteration, format).

Only heap types can carry Python dunders, so two static (builtin) operands take the
native ``operator`` path directly. Otherwise the dunders are resolved on the types in
CPython's order, and each is called through ``calls.call`` (lookaside, then interpreted
when it is a Python function, else native).
"""
from __future__ import annotations

import operator

from .calls import HEAPTYPE, FunctionType, call, lookup, py_dunder, run_native

# NB_* order of BINARY_OP (3.11+); 3.10 opcodes map onto the same indices.
_BIN = [
    ("+", operator.add, "add"), ("&", operator.and_, "and"), ("//", operator.floordiv, "floordiv"),
    ("<<", operator.lshift, "lshift"), ("@", operator.matmul, "matmul"), ("*", operator.mul, "mul"),
    ("%", operator.mod, "mod"), ("|", operator.or_, "or"), ("**", operator.pow, "pow"),
    (">>", operator.rshift, "rshift"), ("-", operator.sub, "sub"), ("/", operator.truediv, "truediv"),
    ("^", operator.xor, "xor"),
]
_INPLACE = [
    operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
    operator.imul, operator.imod, operator.ior, operator.ipow, operator.irshift, operator.isub,
    operator.itruediv, operator.ixor,
]
BINARY_NATIVE = [b[1] for b in _BIN] + _INPLACE
_SYM = [b[0] for b in _BIN]
_LNAME = [f"__{b[2]}__" for b in _BIN]
_RNAME = [f"__r{b[2]}__" for b in _BIN]
_INAME = [f"__i{b[2]}__" for b in _BIN]
# Their __add__/__mul__ are sequence concat/repeat, which CPython tries after the other side's slot.
_SEQ_TYPES = (str, list, tuple, bytes, bytearray)


# builtin values whose operators never read an object's identity (other native operands are shown
# to the ``native_use`` hook: an object a tracer keys by type must not be read unseen)
_VALUE_TYPES = frozenset({int, float, bool, str, bytes, complex, type(None), tuple, list, dict, set, frozenset})


def show_native(rt, fn, *values) -> None:
    """Show ``values`` (about to be run natively by ``fn``) to ``native_use``
    unless they are builtin values."""
    if rt.native_use is not None and not all(type(v) in _VALUE_TYPES for v in values):
        rt.native_use(fn, values)


def binary_op(rt, a, b, k):
    """a <op k> b for k in 0..25 (13.. are in-place)."""
    if not (type(a).__flags__ | type(b).__flags__) & HEAPTYPE:
        show_native(rt, BINARY_NATIVE[k], a, b)
        return BINARY_NATIVE[k](a, b)
    if k >= 13:
        return _inplace(rt, a, b, k - 13)
    return _binary(rt, a, b, k, _SYM[k])


def _binary(rt, a, b, k, sym):
    ta, tb = type(a), type(b)
    lm = lookup(ta, _LNAME[k])
    rm = lookup(tb, _RNAME[k]) if tb is not ta else None
    if rt.lookaside is None and type(lm) is not FunctionType and type(rm) is not FunctionType:
        return BINARY_NATIVE[k](a, b)
    seq_lhs = ta in _SEQ_TYPES and k in (0, 5)
    reflected_first = rm is not None and issubclass(tb, ta) and rm is not lookup(ta, _RNAME[k])
    r = _dispatch(rt, a, b, None if seq_lhs else lm, rm, reflected_first)
    if r is not NotImplemented:
        return r
    if seq_lhs:
        return BINARY_NATIVE[k](a, b)
    if sym == "**":
        sym = "** or pow()"
    raise TypeError(f"unsupported operand type(s) for {sym}: '{ta.__name__}' and '{tb.__name__}'")


def _dispatch(rt, a, b, lm, rm, reflected_first: bool):
    """CPython's order for a binary operator or a rich comparison: the right
    operand's method ``rm`` first when ``reflected_first`` (its type subclasses
    the left's and overrides it), then the left's ``lm``, then ``rm``; a method
    that is None is skipped. NotImplemented when every one declines."""
    if reflected_first:
        r = call(rt, rm, (b, a))
        if r is not NotImplemented:
            return r
        rm = None
    if lm is not None:
        r = call(rt, lm, (a, b))
        if r is not NotImplemented:
            return r
    if rm is not None:
        return call(rt, rm, (b, a))
    return NotImplemented


def _inplace(rt, a, b, k):
    im = lookup(type(a), _INAME[k])
    if im is not None:
        if type(im) is not FunctionType and rt.lookaside is None and py_dunder(type(b), _RNAME[k]) is None:
            return BINARY_NATIVE[k + 13](a, b)
        r = call(rt, im, (a, b))
        if r is not NotImplemented:
            return r
    return _binary(rt, a, b, k, _SYM[k] + "=")


# ----------------------------------------------------------------------------- compare

COMPARE_NATIVE = [operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge]
_CMP_SYM = ["<", "<=", "==", "!=", ">", ">="]
_CMP_NAME = ["__lt__", "__le__", "__eq__", "__ne__", "__gt__", "__ge__"]
_CMP_SWAP = [4, 5, 2, 3, 0, 1]


def compare_op(rt, a, b, k):
    """a <cmp k> b for k in 0..5 (lt, le, eq, ne, gt, ge)."""
    ta, tb = type(a), type(b)
    if not (ta.__flags__ | tb.__flags__) & HEAPTYPE:
        show_native(rt, COMPARE_NATIVE[k], a, b)
        return COMPARE_NATIVE[k](a, b)
    lm = lookup(ta, _CMP_NAME[k])
    rm = lookup(tb, _CMP_NAME[_CMP_SWAP[k]])
    if rt.lookaside is None and type(lm) is not FunctionType and type(rm) is not FunctionType:
        return COMPARE_NATIVE[k](a, b)
    r = _dispatch(rt, a, b, lm, rm, tb is not ta and issubclass(tb, ta) and rm is not None)
    if r is not NotImplemented:
        return r
    if k == 2:
        return a is b
    if k == 3:
        return a is not b
    raise TypeError(
        f"'{_CMP_SYM[k]}' not supported between instances of '{ta.__name__}' and '{tb.__name__}'"
    )


def slot(rt, tp, name):
    """The dunder to call through ``call`` for tp.name: a Python function, or any
    resolved dunder of a heap type while a lookaside is installed; else None (native)."""
    if not tp.__flags__ & HEAPTYPE:
        return None
    m = lookup(tp, name)
    if type(m) is FunctionType or (m is not None and rt.lookaside is not None):
        return m
    return None


def contains(rt, container, item):
    m = slot(rt, type(container), "__contains__")
    if m is None:
        if rt.native_use is not None:
            rt.native_use("in", (item, container))
        return item in container
    return bool(truth(rt, call(rt, m, (container, item))))


# ----------------------------------------------------------------------------- unary / truth

def unary(rt, v, name, native):
    m = slot(rt, type(v), name)
    if m is None:
        show_native(rt, native, v)
        return native(v)
    return call(rt, m, (v,))


def truth(rt, v):
    """bool(v) with a Python __bool__/__len__ interpreted."""
    t = type(v)
    if t is bool:
        return v
    if not t.__flags__ & HEAPTYPE:
        show_native(rt, bool, v)
        return bool(v)
    m = lookup(t, "__bool__")
    if type(m) is FunctionType or (m is not None and rt.lookaside is not None):
        r = call(rt, m, (v,))
        if type(r) is not bool:
            raise TypeError(f"__bool__ should return bool, returned {type(r).__name__}")
        return r
    if m is None:
        m = lookup(t, "__len__")
        if type(m) is FunctionType:
            n = operator.index(call(rt, m, (v,)))
            if n < 0:
                raise ValueError("__len__() should return >= 0")
            return n != 0
    return bool(v)


def length(rt, v):
    """len(v) with a Python __len__ interpreted (natively its reads would go unseen)."""
    m = py_dunder(type(v), "__len__")
    if m is None:
        return len(v)
    n = operator.index(call(rt, m, (v,)))
    if n < 0:
        raise ValueError("__len__() should return >= 0")
    return n


# ----------------------------------------------------------------------------- iteration

def get_iter(rt, v):
    m = slot(rt, type(v), "__iter__")
    if m is None:
        show_native(rt, iter, v)
        return iter(v)
    it = call(rt, m, (v,))
    if lookup(type(it), "__next__") is None:
        raise TypeError(f"iter() returned non-iterator of type '{type(it).__name__}'")
    return it


EXHAUSTED = object()


def next_or_exhausted(rt, it, keep_stop=False):
    """next(it), or EXHAUSTED when it is exhausted (keep_stop: let StopIteration out)."""
    t = type(it)
    if t.__flags__ & HEAPTYPE:
        m = slot(rt, t, "__next__")
        if m is not None:
            if keep_stop:
                return call(rt, m, (it,))
            try:
                return call(rt, m, (it,))
            except StopIteration:
                return EXHAUSTED
    return next(it) if keep_stop else next(it, EXHAUSTED)


# ----------------------------------------------------------------------------- strings

def to_str(rt, v):
    t = type(v)
    if t is str:
        return v
    if t.__flags__ & HEAPTYPE:
        m = lookup(t, "__str__")
        if m is object.__str__:
            return to_repr(rt, v)
        if type(m) is FunctionType:
            r = call(rt, m, (v,))
            if not isinstance(r, str):
                raise TypeError(f"__str__ returned non-string (type {type(r).__name__})")
            return r
    return run_native(rt, str, (v,))


def to_repr(rt, v):
    m = py_dunder(type(v), "__repr__")
    if m is None:
        return run_native(rt, repr, (v,))       # object.__repr__ shows the address
    r = call(rt, m, (v,))
    if not isinstance(r, str):
        raise TypeError(f"__repr__ returned non-string (type {type(r).__name__})")
    return r


def format_value(rt, v, spec):
    t = type(v)
    if t is str and not spec:
        return v
    if t.__flags__ & HEAPTYPE:
        m = lookup(t, "__format__")
        if type(m) is FunctionType:
            r = call(rt, m, (v, spec))
            if not isinstance(r, str):
                raise TypeError(f"__format__ must return a str, not {type(r).__name__}")
            return r
        if m is object.__format__ and not spec:
            return to_str(rt, v)
    return run_native(rt, format, (v, spec))


def convert(rt, v, which):
    """f-string conversion: 1 str, 2 repr, 3 ascii."""
    if which == 1:
        return to_str(rt, v)
    if which == 2:
        return to_repr(rt, v)
    return ascii(v)
