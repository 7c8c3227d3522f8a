"""Stack manipulation, constants, returns and no-ops."""
from __future__ import annotations

from ..frame import NULL
from ..loop import RETURN


# NOP (--)
def op_nop(f, ins):
    return None


op_nop.elidable = True  # decode drops it: jumps to it land on the next instruction


# POP_TOP (value --)
def op_pop_top(f, ins):
    f.stack.pop()


# PUSH_NULL (-- null)
def op_push_null(f, ins):
    f.stack.append(NULL)


# COPY (bottom, unused[n-1] -- bottom, unused[n-1], top)
def op_copy(f, ins):
    f.stack.append(f.stack[-ins.arg])


# SWAP (bottom, unused[n-2], top -- top, unused[n-2], bottom)
def op_swap(f, ins):
    st = f.stack
    n = ins.arg
    st[-1], st[-n] = st[-n], st[-1]


# LOAD_CONST (-- value)
def op_load_const(f, ins):
    f.stack.append(ins.argval)


# RETURN_VALUE (retval --)
def op_return_value(f, ins):
    f.result = f.stack.pop()
    return RETURN


# RETURN_CONST (--)
def op_return_const(f, ins):
    f.result = ins.argval
    return RETURN


# END_FOR (3.12: second, first --)
def op_end_for_2(f, ins):
    del f.stack[-2:]


# END_FOR (3.13: value --)
def op_end_for_1(f, ins):
    f.stack.pop()


# ROT_TWO (a b -- b a)
def op_rot_two(f, ins):
    st = f.stack
    st[-1], st[-2] = st[-2], st[-1]


# ROT_THREE (a b c -- c a b)
def op_rot_three(f, ins):
    st = f.stack
    st[-3:] = [st[-1], st[-3], st[-2]]


# ROT_FOUR (a b c d -- d a b c)
def op_rot_four(f, ins):
    st = f.stack
    st[-4:] = [st[-1], st[-4], st[-3], st[-2]]


# ROT_N (a[n-1] top -- top a[n-1])
def op_rot_n(f, ins):
    st = f.stack
    st.insert(len(st) - ins.arg, st.pop())


# DUP_TOP (a -- a a)
def op_dup_top(f, ins):
    f.stack.append(f.stack[-1])


# DUP_TOP_TWO (a b -- a b a b)
def op_dup_top_two(f, ins):
    f.stack.extend(f.stack[-2:])
