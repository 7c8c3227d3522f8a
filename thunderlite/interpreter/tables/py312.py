"""The Python 3.12 handler table (3.11's common entries plus the 3.12 forms)."""
from __future__ import annotations

from ..loop import unwind_exception_table
from ..ops import arith as A
from ..ops import build as B
from ..ops import calls as C
from ..ops import control as J
from ..ops import generators as G
from ..ops import intrinsics as I
from ..ops import loads as L
from ..ops import match as M
from ..ops import stack as S
from .py311 import COMMON, DEREF_MSGS, unbound_local
from .registry import HandlerTable

# Entries 3.12 shares with 3.13 (which imports this list and adjusts it).
COMMON_312 = [
    ("LOAD_FAST", L.op_load_fast_nocheck), ("LOAD_FAST_CHECK", L.make_load_fast(unbound_local)),
    ("LOAD_FAST_AND_CLEAR", L.op_load_fast_and_clear), ("STORE_FAST_MAYBE_NULL", L.op_store_fast_maybe_null),
    ("RETURN_CONST", S.op_return_const), ("BINARY_SLICE", L.op_binary_slice), ("STORE_SLICE", L.op_store_slice),
    ("LOAD_LOCALS", L.op_load_locals), ("LOAD_FROM_DICT_OR_GLOBALS", L.op_load_from_dict_or_globals),
    ("LOAD_FROM_DICT_OR_DEREF", L.make_load_from_dict_or_deref(DEREF_MSGS)),
    ("POP_JUMP_IF_FALSE", J.op_pop_jump_if_false), ("POP_JUMP_IF_TRUE", J.op_pop_jump_if_true),
    ("POP_JUMP_IF_NONE", J.op_pop_jump_if_none), ("POP_JUMP_IF_NOT_NONE", J.op_pop_jump_if_not_none),
    ("FOR_ITER", J.op_for_iter_end_for), ("SEND", G.op_send), ("END_SEND", G.op_end_send),
    ("CLEANUP_THROW", G.op_cleanup_throw),
    ("CALL_INTRINSIC_1", I.op_call_intrinsic_1), ("CALL_INTRINSIC_2", I.op_call_intrinsic_2),
    ("MATCH_CLASS", M.make_match_class("called match pattern must be a class", push_success=False)),
]

ONLY_312 = [
    ("LOAD_GLOBAL", L.op_load_global_null, L.prepare_load_global),
    ("LOAD_ATTR", L.op_load_attr_312, L.prepare_load_attr),
    ("LOAD_SUPER_ATTR", C.make_load_super_attr(null_after=False)),
    ("END_FOR", S.op_end_for_2), ("CALL", C.op_call), ("KW_NAMES", C.op_kw_names, C.prepare_kw_names),
    ("MAKE_FUNCTION", C.op_make_function), ("DICT_MERGE", B.make_dict_merge(2)),
    ("FORMAT_VALUE", B.op_format_value), ("COMPARE_OP", A.op_compare_op, A.prepare_compare),
]


def build():
    t = HandlerTable("3.12").register_all(COMMON + COMMON_312 + ONLY_312)
    t.unwind = unwind_exception_table
    t.gen_prerun = True
    t.delegate_raised = G.delegate_raised_312
    return t
