"""The Python 3.11 handler table."""
from __future__ import annotations

from ..loop import unwind_exception_table
from ..ops import arith as A
from ..ops import build as B
from ..ops import calls as C
from ..ops import control as J
from ..ops import exceptions as E
from ..ops import generators as G
from ..ops import loads as L
from ..ops import match as M
from ..ops import stack as S
from .registry import HandlerTable


def unbound_local(name):
    return f"cannot access local variable '{name}' where it is not associated with a value"


def unbound_free(name):
    return f"cannot access free variable '{name}' where it is not associated with a value in enclosing scope"


DEREF_MSGS = (unbound_local, unbound_free)
_deref = L.make_deref_ops(DEREF_MSGS, lambda f: 0)

# Entries shared with 3.12 and 3.13 (which import this list and adjust it).
COMMON = [
    ("NOP", S.op_nop), ("POP_TOP", S.op_pop_top), ("PUSH_NULL", S.op_push_null), ("COPY", S.op_copy),
    ("SWAP", S.op_swap), ("LOAD_CONST", S.op_load_const), ("RESUME", S.op_nop),
    ("EXTENDED_ARG", S.op_nop), ("RETURN_VALUE", S.op_return_value),
    ("STORE_FAST", L.op_store_fast), ("DELETE_FAST", L.make_delete_fast(unbound_local)),
    ("MAKE_CELL", L.op_make_cell), ("COPY_FREE_VARS", L.op_copy_free_vars), ("LOAD_CLOSURE", L.op_load_closure),
    ("LOAD_DEREF", _deref[0]), ("STORE_DEREF", _deref[1]), ("DELETE_DEREF", _deref[2]),
    ("STORE_GLOBAL", L.op_store_global), ("DELETE_GLOBAL", L.op_delete_global),
    ("LOAD_NAME", L.op_load_name), ("STORE_NAME", L.op_store_name), ("DELETE_NAME", L.op_delete_name),
    ("STORE_ATTR", L.op_store_attr), ("DELETE_ATTR", L.op_delete_attr),
    ("BINARY_SUBSCR", L.op_binary_subscr), ("STORE_SUBSCR", L.op_store_subscr), ("DELETE_SUBSCR", L.op_delete_subscr),
    ("IMPORT_NAME", L.op_import_name), ("IMPORT_FROM", L.op_import_from),
    ("SETUP_ANNOTATIONS", L.op_setup_annotations),
    ("BUILD_TUPLE", B.op_build_tuple), ("BUILD_LIST", B.op_build_list), ("BUILD_SET", B.op_build_set),
    ("BUILD_MAP", B.op_build_map), ("BUILD_CONST_KEY_MAP", B.op_build_const_key_map),
    ("BUILD_STRING", B.op_build_string), ("BUILD_SLICE", B.op_build_slice), ("LIST_APPEND", B.op_list_append),
    ("SET_ADD", B.op_set_add), ("MAP_ADD", B.op_map_add), ("LIST_EXTEND", B.op_list_extend),
    ("SET_UPDATE", B.op_set_update), ("DICT_UPDATE", B.op_dict_update),
    ("UNPACK_SEQUENCE", B.op_unpack_sequence), ("UNPACK_EX", B.op_unpack_ex),
    ("BINARY_OP", A.op_binary_op), ("IS_OP", A.op_is_op),
    ("CONTAINS_OP", A.op_contains_op), ("UNARY_NOT", A.op_unary_not), ("UNARY_NEGATIVE", A.op_unary_negative),
    ("UNARY_INVERT", A.op_unary_invert),
    ("JUMP_FORWARD", J.op_jump), ("JUMP_BACKWARD", J.op_jump), ("JUMP_BACKWARD_NO_INTERRUPT", J.op_jump),
    ("GET_ITER", J.op_get_iter),
    ("CALL_FUNCTION_EX", C.make_call_function_ex("null_fn")), ("LOAD_BUILD_CLASS", C.op_load_build_class),
    ("PUSH_EXC_INFO", E.op_push_exc_info), ("POP_EXCEPT", E.op_pop_except), ("RERAISE", E.op_reraise),
    ("RAISE_VARARGS", E.op_raise_varargs), ("CHECK_EXC_MATCH", E.op_check_exc_match),
    ("CHECK_EG_MATCH", E.op_check_eg_match), ("LOAD_ASSERTION_ERROR", E.op_load_assertion_error),
    ("BEFORE_WITH", E.op_before_with), ("WITH_EXCEPT_START", E.op_with_except_start),
    ("RETURN_GENERATOR", G.op_return_generator), ("YIELD_VALUE", G.op_yield_value, G.prepare_yield_value),
    ("GET_YIELD_FROM_ITER", G.op_get_yield_from_iter), ("GET_AWAITABLE", G.op_get_awaitable),
    ("BEFORE_ASYNC_WITH", G.make_before_async_with(E.missing_protocol)), ("GET_AITER", G.op_get_aiter),
    ("GET_ANEXT", G.op_get_anext),
    ("END_ASYNC_FOR", G.op_end_async_for),
    ("MATCH_MAPPING", M.op_match_mapping),
    ("MATCH_SEQUENCE", M.op_match_sequence), ("MATCH_KEYS", M.op_match_keys), ("GET_LEN", M.op_get_len),
]

ONLY_311 = [
    ("MATCH_CLASS", M.make_match_class("called match pattern must be a type", push_success=False)),
    ("IMPORT_STAR", L.op_import_star),
    ("COMPARE_OP", A.op_compare_op, A.prepare_compare),
    ("LOAD_FAST", L.make_load_fast(unbound_local)), ("LOAD_CLASSDEREF", _deref[3]),
    ("LOAD_GLOBAL", L.op_load_global_null, L.prepare_load_global),
    ("LOAD_ATTR", L.op_load_attr), ("LOAD_METHOD", L.op_load_method),
    ("UNARY_POSITIVE", A.op_unary_positive),
    ("POP_JUMP_FORWARD_IF_FALSE", J.op_pop_jump_if_false), ("POP_JUMP_BACKWARD_IF_FALSE", J.op_pop_jump_if_false),
    ("POP_JUMP_FORWARD_IF_TRUE", J.op_pop_jump_if_true), ("POP_JUMP_BACKWARD_IF_TRUE", J.op_pop_jump_if_true),
    ("POP_JUMP_FORWARD_IF_NONE", J.op_pop_jump_if_none), ("POP_JUMP_BACKWARD_IF_NONE", J.op_pop_jump_if_none),
    ("POP_JUMP_FORWARD_IF_NOT_NONE", J.op_pop_jump_if_not_none),
    ("POP_JUMP_BACKWARD_IF_NOT_NONE", J.op_pop_jump_if_not_none),
    ("JUMP_IF_FALSE_OR_POP", J.op_jump_if_false_or_pop), ("JUMP_IF_TRUE_OR_POP", J.op_jump_if_true_or_pop),
    ("FOR_ITER", J.op_for_iter_pop),
    ("PRECALL", C.op_precall), ("CALL", C.op_call), ("KW_NAMES", C.op_kw_names, C.prepare_kw_names),
    ("MAKE_FUNCTION", C.op_make_function), ("DICT_MERGE", B.make_dict_merge(2)),
    ("FORMAT_VALUE", B.op_format_value), ("LIST_TO_TUPLE", B.op_list_to_tuple),
    ("PREP_RERAISE_STAR", E.op_prep_reraise_star), ("SEND", G.op_send_311),
    ("ASYNC_GEN_WRAP", G.op_async_gen_wrap),
]


def build():
    t = HandlerTable("3.11").register_all(COMMON + ONLY_311)
    t.unwind = unwind_exception_table
    t.gen_prerun = True
    t.delegate_raised = G.delegate_raised_311
    return t
