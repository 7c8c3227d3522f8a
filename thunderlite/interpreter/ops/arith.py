"""Binary, unary, comparison, identity, membership and truth opcodes."""
from __future__ import annotations

import dis
import operator

from ..operators import binary_op, compare_op, contains, truth, unary


# BINARY_OP (lhs rhs -- res)
def op_binary_op(f, ins):
    st = f.stack
    b = st.pop()
    st[-1] = binary_op(f.rt, st[-1], b, ins.arg)


def make_binary(k):
    """A 3.10 BINARY_*/INPLACE_* handler for BINARY_OP index k."""

    # BINARY_<OP> (lhs rhs -- res)
    def op_binary(f, ins):
        st = f.stack
        b = st.pop()
        st[-1] = binary_op(f.rt, st[-1], b, k)

    return op_binary


_CMP_INDEX = {name: i for i, name in enumerate(dis.cmp_op)}


def prepare_compare(ins, dec):
    ins.argval = _CMP_INDEX[ins.argval]


# COMPARE_OP (left right -- res)
def op_compare_op(f, ins):
    st = f.stack
    b = st.pop()
    st[-1] = compare_op(f.rt, st[-1], b, ins.argval)


# COMPARE_OP (3.13: left right -- res), bit 16 of the oparg coerces to bool
def op_compare_op_313(f, ins):
    st = f.stack
    b = st.pop()
    r = compare_op(f.rt, st[-1], b, ins.argval)
    st[-1] = truth(f.rt, r) if ins.arg & 16 and not _jump_may_predicate(f, ins, r) else r


# IS_OP (left right -- b)
def op_is_op(f, ins):
    st = f.stack
    b = st.pop()
    st[-1] = (st[-1] is b) ^ bool(ins.arg)


# CONTAINS_OP (left right -- b)
def op_contains_op(f, ins):
    st = f.stack
    container = st.pop()
    st[-1] = contains(f.rt, container, st[-1]) ^ bool(ins.arg)


# UNARY_NOT (value -- res)
def op_unary_not(f, ins):
    st = f.stack
    st[-1] = not truth(f.rt, st[-1])


# UNARY_NEGATIVE (value -- res)
def op_unary_negative(f, ins):
    st = f.stack
    st[-1] = unary(f.rt, st[-1], "__neg__", operator.neg)


# UNARY_POSITIVE (value -- res)
def op_unary_positive(f, ins):
    st = f.stack
    st[-1] = unary(f.rt, st[-1], "__pos__", operator.pos)


# UNARY_INVERT (value -- res)
def op_unary_invert(f, ins):
    st = f.stack
    st[-1] = unary(f.rt, st[-1], "__invert__", operator.invert)


# TO_BOOL (value -- res)
def op_to_bool(f, ins):
    st = f.stack
    v = st[-1]
    if type(v) is not bool and not _jump_may_predicate(f, ins, v):
        st[-1] = truth(f.rt, v)


_COND_JUMPS = frozenset({"POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE"})


def _jump_may_predicate(f, ins, v) -> bool:
    """3.13 makes a value a bool before a conditional jump: a value the jump may
    run its block predicated on (interpreter/predicate.py) reaches it as it is
    (the jump takes its truth itself otherwise)."""
    return f.rt.predicate is not None and ins.raw_next[0] in _COND_JUMPS and v is not None \
        and type(v) is not bool
