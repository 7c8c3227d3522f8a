"""Raising, catching and re-raising; with-statements; except* helpers."""
from __future__ import annotations

import types

from ..calls import call, lookup

MethodType = types.MethodType


# PUSH_EXC_INFO (exc -- prev_exc exc)
def op_push_exc_info(f, ins):
    st = f.stack
    exc = st[-1]
    st[-1] = f.ts.handled
    f.ts.handled = exc
    st.append(exc)


# POP_EXCEPT (prev_exc --)
def op_pop_except(f, ins):
    f.ts.handled = f.stack.pop()


# RERAISE (values[n] exc -- values[n])
def op_reraise(f, ins):
    raise f.stack.pop()


def _instance(rt, exc):
    if isinstance(exc, type) and issubclass(exc, BaseException):
        value = call(rt, exc, ())
        if not isinstance(value, BaseException):
            raise TypeError(
                f"calling {exc!r} should have returned an instance of BaseException, not {type(value).__name__}"
            )
        return value
    if isinstance(exc, BaseException):
        return exc
    return None


def do_raise(rt, exc, cause, has_cause):
    value = _instance(rt, exc)
    if value is None:
        raise TypeError("exceptions must derive from BaseException")
    if has_cause:
        if cause is not None:
            c = _instance(rt, cause)
            if c is None:
                raise TypeError("exception causes must derive from BaseException")
            cause = c
        value.__cause__ = cause
    raise value


# RAISE_VARARGS (args[n] --)
def op_raise_varargs(f, ins):
    st = f.stack
    n = ins.arg
    if n == 0:
        exc = f.ts.handled
        if exc is None:
            raise RuntimeError("No active exception to reraise")
        raise exc
    cause = st.pop() if n == 2 else None
    do_raise(f.rt, st.pop(), cause, n == 2)


def _check_catchable(t):
    types_ = t if isinstance(t, tuple) else (t,)
    for x in types_:
        if not (isinstance(x, type) and issubclass(x, BaseException)):
            raise TypeError("catching classes that do not inherit from BaseException is not allowed")


# CHECK_EXC_MATCH (exc type -- exc b)
def op_check_exc_match(f, ins):
    st = f.stack
    t = st.pop()
    _check_catchable(t)
    st.append(isinstance(st[-1], t))


# CHECK_EG_MATCH (exc type -- rest match)
def op_check_eg_match(f, ins):
    st = f.stack
    t = st.pop()
    exc = st.pop()
    _check_catchable(t)
    for x in t if isinstance(t, tuple) else (t,):
        if issubclass(x, BaseExceptionGroup):
            raise TypeError("catching ExceptionGroup with except* is not allowed. Use except instead.")
    if isinstance(exc, BaseExceptionGroup):
        match, rest = exc.split(t)
    elif isinstance(exc, t):
        match = (ExceptionGroup if isinstance(exc, Exception) else BaseExceptionGroup)("", [exc])
        rest = None
    else:
        match, rest = None, exc
    st.append(rest)
    st.append(match)
    if match is not None:
        f.ts.handled = match


def _leaf_ids(exc, out):
    if isinstance(exc, BaseExceptionGroup):
        for e in exc.exceptions:
            _leaf_ids(e, out)
    else:
        out.add(id(exc))


def _same_metadata(a, b):
    return (
        getattr(a, "__notes__", None) is getattr(b, "__notes__", None)
        and a.__traceback__ is b.__traceback__
        and a.__cause__ is b.__cause__
        and a.__context__ is b.__context__
    )


def prep_reraise_star(orig, excs):
    """What an except* block re-raises: new raises plus the unhandled part of orig."""
    excs = [e for e in excs if e is not None]
    if not excs:
        return None
    if not isinstance(orig, BaseExceptionGroup):
        return excs[0]
    raised, reraised = [], []
    for e in excs:
        (reraised if _same_metadata(e, orig) else raised).append(e)
    ids = set()
    for e in reraised:
        _leaf_ids(e, ids)
    if ids:
        match, _ = orig.split(lambda leaf: id(leaf) in ids)
        if match is not None:
            raised.append(match)
    if not raised:
        return None
    if len(raised) == 1:
        return raised[0]
    return ExceptionGroup("", raised)


# PREP_RERAISE_STAR (orig excs -- result)
def op_prep_reraise_star(f, ins):
    st = f.stack
    excs = st.pop()
    st[-1] = prep_reraise_star(st[-1], excs)


# LOAD_ASSERTION_ERROR (-- AssertionError)
def op_load_assertion_error(f, ins):
    f.stack.append(AssertionError)


def missing_protocol(tp, dunder):
    """The 3.11+ error for a context manager lacking ``dunder``."""
    kind = "asynchronous context manager" if dunder.startswith("__a") else "context manager"
    missed = f" (missed {dunder} method)" if dunder.endswith("exit__") else ""
    return TypeError(f"'{tp.__name__}' object does not support the {kind} protocol{missed}")


def enter_exit(tp, enter_name, exit_name, missing):
    """(enter, exit) looked up on the type, or the version's error from missing(tp, dunder)."""
    enter = lookup(tp, enter_name)
    if enter is None:
        raise missing(tp, enter_name)
    exit_ = lookup(tp, exit_name)
    if exit_ is None:
        raise missing(tp, exit_name)
    return enter, exit_


# BEFORE_WITH (mgr -- exit res)
def op_before_with(f, ins):
    st = f.stack
    mgr = st[-1]
    enter, exit_ = enter_exit(type(mgr), "__enter__", "__exit__", missing_protocol)
    st[-1] = MethodType(exit_, mgr)
    st.append(call(f.rt, enter, (mgr,)))


# WITH_EXCEPT_START (exit lasti prev_exc val -- exit lasti prev_exc val res)
def op_with_except_start(f, ins):
    st = f.stack
    val = st[-1]
    st.append(call(f.rt, st[-4], (type(val), val, val.__traceback__)))
