"""Generators, yield from / await, and async iteration and with-statements."""
from __future__ import annotations

import types

from ..asyncgen import AsyncGenStep, InterpretedAsyncGenerator, Wrapped
from ..calls import call, lookup
from ..loop import RETURN, YIELD, InterpretedCoroutine
from ..operators import get_iter
from .exceptions import enter_exit

MethodType = types.MethodType
_NATIVE_SEND = (types.GeneratorType, types.CoroutineType, InterpretedCoroutine)


# RETURN_GENERATOR (--): the generator object already exists; stop the set-up run here
def op_return_generator(f, ins):
    f.result = None
    return RETURN


# YIELD_VALUE (value -- sent); resumption pushes the sent value
def op_yield_value(f, ins):
    f.result = f.stack.pop()
    if ins.argval:
        f.delegate = f.stack[-1]
    return YIELD


def prepare_yield_value(ins, dec):
    """argval: True when suspended inside ``yield from``/``await`` (next is RESUME 2 or 3)."""
    opname, arg = ins.raw_next
    ins.argval = opname == "RESUME" and (arg & 3) >= 2


def send(receiver, v):
    """(True, yielded) or (False, returned) for one step of receiver.send(v)."""
    try:
        if type(receiver) in _NATIVE_SEND:
            return True, receiver.send(v)
        if v is None:
            return True, next(receiver)
        return True, receiver.send(v)
    except StopIteration as e:
        return False, e.value


# SEND (3.11: receiver v -- receiver retval | done: retval)
def op_send_311(f, ins):
    st = f.stack
    v = st.pop()
    going, r = send(st[-1], v)
    if going:
        st.append(r)
    else:
        st[-1] = r
        f.pc = ins.target


# SEND (3.12+: receiver v -- receiver retval), jumping to END_SEND when done
def op_send(f, ins):
    st = f.stack
    v = st.pop()
    going, r = send(st[-1], v)
    st.append(r)
    if not going:
        f.pc = ins.target


# END_SEND (receiver value -- value)
def op_end_send(f, ins):
    st = f.stack
    del st[-2]


# CLEANUP_THROW (sub_iter last_sent_val exc_value -- none value)
def op_cleanup_throw(f, ins):
    st = f.stack
    exc = st.pop()
    if isinstance(exc, StopIteration):
        del st[-2:]
        st.append(None)
        st.append(exc.value)
        return
    raise exc


def delegate_raised_312(f, exc):
    """3.12+: whatever the delegate's throw() raised goes into the frame (CLEANUP_THROW)."""
    return exc


def delegate_raised_311(f, exc):
    """3.11: pop the delegate and skip to the end of the SEND loop, as _gen_throw does."""
    f.stack.pop()
    send_ins = f.instrs[f.pc - 2]
    f.pc = send_ins.target
    if isinstance(exc, StopIteration):
        f.stack.append(exc.value)
        return None
    return exc


# GET_YIELD_FROM_ITER (iterable -- iter)
def op_get_yield_from_iter(f, ins):
    st = f.stack
    v = st[-1]
    if isinstance(v, (types.CoroutineType, InterpretedCoroutine)):
        if not f.code.co_flags & 0x180:
            raise TypeError("cannot 'yield from' a coroutine object in a non-coroutine generator")
    elif not isinstance(v, types.GeneratorType):
        st[-1] = get_iter(f.rt, v)


def awaitable_iter(rt, v):
    if isinstance(v, (types.CoroutineType, InterpretedCoroutine, AsyncGenStep)):
        return v
    if isinstance(v, types.GeneratorType) and v.gi_code.co_flags & 0x100:
        return v
    m = lookup(type(v), "__await__")
    if m is None:
        raise TypeError(f"object {type(v).__name__} can't be used in 'await' expression")
    it = call(rt, m, (v,))
    if isinstance(it, (types.CoroutineType, InterpretedCoroutine)):
        raise TypeError("__await__() returned a coroutine")
    if lookup(type(it), "__next__") is None:
        raise TypeError(f"__await__() returned non-iterator of type '{type(it).__name__}'")
    return it


# GET_AWAITABLE (iterable -- iter)
def op_get_awaitable(f, ins):
    f.stack[-1] = awaitable_iter(f.rt, f.stack[-1])


def make_before_async_with(missing):
    """BEFORE_ASYNC_WITH; missing(tp, dunder) builds the version's error."""

    # BEFORE_ASYNC_WITH (mgr -- exit awaitable)
    def op_before_async_with(f, ins):
        st = f.stack
        mgr = st[-1]
        enter, exit_ = enter_exit(type(mgr), "__aenter__", "__aexit__", missing)
        st[-1] = MethodType(exit_, mgr)
        st.append(awaitable_iter(f.rt, call(f.rt, enter, (mgr,))))

    return op_before_async_with


# GET_AITER (aiterable -- aiter)
def op_get_aiter(f, ins):
    st = f.stack
    v = st[-1]
    if type(v) is InterpretedAsyncGenerator:
        return
    m = lookup(type(v), "__aiter__")
    if m is None:
        raise TypeError(f"'async for' requires an object with __aiter__ method, got {type(v).__name__}")
    st[-1] = call(f.rt, m, (v,))


# GET_ANEXT (aiter -- aiter awaitable)
def op_get_anext(f, ins):
    st = f.stack
    v = st[-1]
    if type(v) is InterpretedAsyncGenerator:
        st.append(v.__anext__())
        return
    m = lookup(type(v), "__anext__")
    if m is None:
        raise TypeError(f"'async for' requires an iterator with __anext__ method, got {type(v).__name__}")
    st.append(awaitable_iter(f.rt, call(f.rt, m, (v,))))


# END_ASYNC_FOR (aiter exc --)
def op_end_async_for(f, ins):
    st = f.stack
    exc = st.pop()
    if isinstance(exc, StopAsyncIteration):
        st.pop()
        return
    raise exc


# ASYNC_GEN_WRAP (value -- wrapped)
def op_async_gen_wrap(f, ins):
    f.stack[-1] = Wrapped(f.stack[-1])


# YIELD_VALUE (3.10: value -- sent); an async generator's values are wrapped here
def op_yield_value_310(f, ins):
    v = f.stack.pop()
    f.result = Wrapped(v) if f.code.co_flags & 0x200 else v
    return YIELD
