"""Python 3.10 only: the block stack (SETUP_FINALLY/POP_BLOCK/...), its exception
unwinding, and the 3.10 forms of calls, with-statements and yield from."""
from __future__ import annotations

import types

from ..calls import call
from ..frame import UNBOUND
from ..loop import YIELD, chain_context
from .calls import _kw_split, pop_method_call
from .exceptions import _check_catchable, enter_exit
from .generators import awaitable_iter, send

SETUP_FINALLY = 0
EXCEPT_HANDLER = 1
MethodType = types.MethodType


def init_frame_310(f):
    """3.10 frames: cells for cellvars (copying arguments) and the closure, before running."""
    code = f.code
    f.blocks = []
    nvar = len(code.co_varnames)
    fast = f.fast
    for i, name in enumerate(code.co_cellvars):
        cell = types.CellType()
        if name in code.co_varnames:
            j = code.co_varnames.index(name)
            if fast[j] is not UNBOUND:
                cell.cell_contents = fast[j]
            fast[j] = UNBOUND
        fast[nvar + i] = cell
    if code.co_freevars:
        base = nvar + len(code.co_cellvars)
        fast[base:base + len(code.co_freevars)] = f.closure


def localsplus_names_310(code):
    return code.co_varnames + code.co_cellvars + code.co_freevars


def unwind_block_stack(f, exc):
    """Pop blocks until a SETUP_FINALLY handler takes exc (True), or give up."""
    ts = f.ts
    chain_context(ts, exc)
    blocks = f.blocks
    st = f.stack
    while blocks:
        kind, handler, level = blocks.pop()
        if kind == EXCEPT_HANDLER:
            del st[level + 3:]
            st.pop()
            ts.handled = st.pop()
            st.pop()
            continue
        del st[level:]
        blocks.append((EXCEPT_HANDLER, -1, len(st)))
        old = ts.handled
        st.extend((None, old, type(old) if old is not None else None))
        ts.handled = exc
        st.extend((exc.__traceback__, exc, type(exc)))
        f.pc = handler
        return True
    ts.handled = f.entry_handled
    return False


# SETUP_FINALLY (--): push a handler block
def op_setup_finally(f, ins):
    f.blocks.append((SETUP_FINALLY, ins.target, len(f.stack)))


# POP_BLOCK (--)
def op_pop_block(f, ins):
    f.blocks.pop()


# POP_EXCEPT (tb value type --): restores the previously handled exception
def op_pop_except_310(f, ins):
    f.blocks.pop()
    st = f.stack
    st.pop()
    f.ts.handled = st.pop()
    st.pop()


# RERAISE (tb value type --)
def op_reraise_310(f, ins):
    st = f.stack
    st.pop()
    exc = st.pop()
    st.pop()
    raise exc


# JUMP_IF_NOT_EXC_MATCH (exc_type match_type --)
def op_jump_if_not_exc_match(f, ins):
    st = f.stack
    right = st.pop()
    left = st.pop()
    _check_catchable(right)
    if not issubclass(left, right):
        f.pc = ins.target


def missing_dunder(tp, name):
    """3.10's error for a context manager lacking ``name``."""
    return AttributeError(name)


# SETUP_WITH (mgr -- exit res), pushing a handler block between them
def op_setup_with(f, ins):
    st = f.stack
    mgr = st[-1]
    enter, exit_ = enter_exit(type(mgr), "__enter__", "__exit__", missing_dunder)
    st[-1] = MethodType(exit_, mgr)
    res = call(f.rt, enter, (mgr,))
    f.blocks.append((SETUP_FINALLY, ins.target, len(st)))
    st.append(res)


# SETUP_ASYNC_WITH (res -- res), pushing a handler block below res
def op_setup_async_with(f, ins):
    st = f.stack
    res = st.pop()
    f.blocks.append((SETUP_FINALLY, ins.target, len(st)))
    st.append(res)


# WITH_EXCEPT_START (exit, prev[3], tb value type -- exit, prev[3], tb value type res)
def op_with_except_start_310(f, ins):
    st = f.stack
    st.append(call(f.rt, st[-7], (st[-1], st[-2], st[-3])))


# END_ASYNC_FOR (aiter, prev[3], tb value type --)
def op_end_async_for_310(f, ins):
    st = f.stack
    t = st.pop()
    if issubclass(t, StopAsyncIteration):
        kind, _, level = f.blocks.pop()
        del st[level + 3:]
        st.pop()
        f.ts.handled = st.pop()
        st.pop()
        st.pop()
        return
    exc = st.pop()
    st.pop()
    raise exc


# GEN_START (sent --)
def op_gen_start(f, ins):
    f.stack.pop()


# YIELD_FROM (receiver v -- retval)
def op_yield_from(f, ins):
    st = f.stack
    v = st.pop()
    going, r = send(st[-1], v)
    if going:
        f.pc -= 1
        f.delegate = st[-1]
        f.result = r
        return YIELD
    st[-1] = r


def delegate_raised_310(f, exc):
    """Pop the delegate and step past YIELD_FROM, as 3.10's _gen_throw does."""
    f.stack.pop()
    f.pc += 1
    if isinstance(exc, StopIteration):
        f.stack.append(exc.value)
        return None
    return exc


# GET_AWAITABLE (iterable -- iter)
def op_get_awaitable_310(f, ins):
    f.stack[-1] = awaitable_iter(f.rt, f.stack[-1])


# CALL_FUNCTION (callable args[n] -- res)
def op_call_function(f, ins):
    st = f.stack
    n = ins.arg
    base = len(st) - n - 1
    fn = st[base]
    args = st[base + 1:]
    del st[base:]
    st.append(call(f.rt, fn, args))


# CALL_FUNCTION_KW (callable args[n] kwnames -- res)
def op_call_function_kw(f, ins):
    st = f.stack
    kwn = st.pop()
    n = ins.arg
    base = len(st) - n - 1
    fn = st[base]
    args, kwargs = _kw_split(st[base + 1:], kwn)
    del st[base:]
    st.append(call(f.rt, fn, args, kwargs))


# CALL_METHOD (meth|NULL self|callable args[n] -- res)
def op_call_method(f, ins):
    st = f.stack
    fn, args = pop_method_call(st, ins.arg)
    st.append(call(f.rt, fn, args))


# COPY_DICT_WITHOUT_KEYS (subject keys -- subject rest)
def op_copy_dict_without_keys(f, ins):
    st = f.stack
    keys = st[-1]
    rest = dict(st[-2])
    for k in keys:
        del rest[k]
    st[-1] = rest


# LOAD_CLOSURE (-- cell): 3.10 numbers cells after the fast locals
def op_load_closure_310(f, ins):
    f.stack.append(f.fast[len(f.code.co_varnames) + ins.arg])
