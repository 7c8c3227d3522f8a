"""Jumps, conditional jumps and for-loops."""
from __future__ import annotations

from .. import predicate
from ..operators import EXHAUSTED, get_iter, next_or_exhausted, truth


# JUMP_FORWARD / JUMP_BACKWARD / JUMP_ABSOLUTE (--)
def op_jump(f, ins):
    f.pc = ins.target


# POP_JUMP_IF_FALSE (cond --)
def op_pop_jump_if_false(f, ins):
    v = f.stack.pop()
    if v is False or v is None:
        f.pc = ins.target
    elif v is not True and not (f.rt.predicate is not None and _predicated(f, ins, v, False)) \
            and not truth(f.rt, v):
        f.pc = ins.target


# POP_JUMP_IF_TRUE (cond --)
def op_pop_jump_if_true(f, ins):
    v = f.stack.pop()
    if v is True:
        f.pc = ins.target
    elif v is not False and v is not None and not (f.rt.predicate is not None and _predicated(f, ins, v, True)) \
            and truth(f.rt, v):
        f.pc = ins.target


def _predicated(f, ins, v, negated: bool) -> bool:
    """The block the jump guards, run predicated on ``v`` if the hook offers it."""
    spans = predicate.blocks(f.dec, ins)
    if spans is None:
        return False
    pred = f.rt.predicate(v)
    if pred is None:
        return False
    predicate.run(f, spans, pred, negated)
    return True


# POP_JUMP_IF_NONE (value --)
def op_pop_jump_if_none(f, ins):
    if f.stack.pop() is None:
        f.pc = ins.target


# POP_JUMP_IF_NOT_NONE (value --)
def op_pop_jump_if_not_none(f, ins):
    if f.stack.pop() is not None:
        f.pc = ins.target


# JUMP_IF_FALSE_OR_POP (cond -- cond if jumping)
def op_jump_if_false_or_pop(f, ins):
    v = f.stack[-1]
    if v is False or v is None or (v is not True and not truth(f.rt, v)):
        f.pc = ins.target
    else:
        f.stack.pop()


# JUMP_IF_TRUE_OR_POP (cond -- cond if jumping)
def op_jump_if_true_or_pop(f, ins):
    v = f.stack[-1]
    if v is True or (v is not False and v is not None and truth(f.rt, v)):
        f.pc = ins.target
    else:
        f.stack.pop()


# GET_ITER (iterable -- iter)
def op_get_iter(f, ins):
    f.stack[-1] = get_iter(f.rt, f.stack[-1])


# FOR_ITER (3.10/3.11: iter -- iter next | exhausted: iter --)
def op_for_iter_pop(f, ins):
    st = f.stack
    v = next_or_exhausted(f.rt, st[-1])
    if v is EXHAUSTED:
        st.pop()
        f.pc = ins.target
    else:
        st.append(v)


# FOR_ITER (3.12+: iter -- iter next); when exhausted, jumps to END_FOR with a dummy next
def op_for_iter_end_for(f, ins):
    st = f.stack
    v = next_or_exhausted(f.rt, st[-1])
    if v is EXHAUSTED:
        st.append(None)
        f.pc = ins.target
    else:
        st.append(v)
