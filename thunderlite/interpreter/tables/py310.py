"""The Python 3.10 handler table: block stack, separate binary opcodes, 3.10 calls."""
from __future__ import annotations

from ..ops import arith as A
from ..ops import blocks as K
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
    return f"local variable '{name}' referenced before assignment"


def unbound_free(name):
    return f"free variable '{name}' referenced before assignment in enclosing scope"


_deref = L.make_deref_ops((unbound_local, unbound_free), lambda f: len(f.code.co_varnames))

_BINARY = ["ADD", "AND", "FLOOR_DIVIDE", "LSHIFT", "MATRIX_MULTIPLY", "MULTIPLY", "MODULO", "OR", "POWER",
           "RSHIFT", "SUBTRACT", "TRUE_DIVIDE", "XOR"]

ENTRIES = [
    ("NOP", S.op_nop), ("POP_TOP", S.op_pop_top), ("ROT_TWO", S.op_rot_two), ("ROT_THREE", S.op_rot_three),
    ("ROT_FOUR", S.op_rot_four), ("ROT_N", S.op_rot_n), ("DUP_TOP", S.op_dup_top), ("DUP_TOP_TWO", S.op_dup_top_two),
    ("LOAD_CONST", S.op_load_const), ("EXTENDED_ARG", S.op_nop), ("RETURN_VALUE", S.op_return_value),
    ("LOAD_FAST", L.make_load_fast(unbound_local)), ("STORE_FAST", L.op_store_fast),
    ("DELETE_FAST", L.make_delete_fast(unbound_local)),
    ("LOAD_CLOSURE", K.op_load_closure_310),
    ("LOAD_DEREF", _deref[0]), ("STORE_DEREF", _deref[1]), ("DELETE_DEREF", _deref[2]),
    ("LOAD_CLASSDEREF", _deref[3]),
    ("LOAD_GLOBAL", L.op_load_global), ("STORE_GLOBAL", L.op_store_global), ("DELETE_GLOBAL", L.op_delete_global),
    ("LOAD_NAME", L.op_load_name), ("STORE_NAME", L.op_store_name), ("DELETE_NAME", L.op_delete_name),
    ("LOAD_ATTR", L.op_load_attr), ("LOAD_METHOD", L.op_load_method),
    ("STORE_ATTR", L.op_store_attr), ("DELETE_ATTR", L.op_delete_attr),
    ("BINARY_SUBSCR", L.op_binary_subscr), ("STORE_SUBSCR", L.op_store_subscr), ("DELETE_SUBSCR", L.op_delete_subscr),
    ("IMPORT_NAME", L.op_import_name), ("IMPORT_FROM", L.op_import_from), ("IMPORT_STAR", L.op_import_star),
    ("SETUP_ANNOTATIONS", L.op_setup_annotations),
    ("BUILD_TUPLE", B.op_build_tuple), ("BUILD_LIST", B.op_build_list), ("BUILD_SET", B.op_build_set),
    ("BUILD_MAP", B.op_build_map), ("BUILD_CONST_KEY_MAP", B.op_build_const_key_map),
    ("BUILD_STRING", B.op_build_string), ("BUILD_SLICE", B.op_build_slice), ("LIST_APPEND", B.op_list_append),
    ("SET_ADD", B.op_set_add), ("MAP_ADD", B.op_map_add), ("LIST_EXTEND", B.op_list_extend),
    ("SET_UPDATE", B.op_set_update), ("DICT_UPDATE", B.op_dict_update), ("DICT_MERGE", B.make_dict_merge(2)),
    ("LIST_TO_TUPLE", B.op_list_to_tuple), ("UNPACK_SEQUENCE", B.op_unpack_sequence), ("UNPACK_EX", B.op_unpack_ex),
    ("FORMAT_VALUE", B.op_format_value),
    ("COMPARE_OP", A.op_compare_op, A.prepare_compare), ("IS_OP", A.op_is_op), ("CONTAINS_OP", A.op_contains_op),
    ("UNARY_NOT", A.op_unary_not), ("UNARY_NEGATIVE", A.op_unary_negative), ("UNARY_POSITIVE", A.op_unary_positive),
    ("UNARY_INVERT", A.op_unary_invert),
    ("JUMP_FORWARD", J.op_jump), ("JUMP_ABSOLUTE", J.op_jump),
    ("POP_JUMP_IF_FALSE", J.op_pop_jump_if_false), ("POP_JUMP_IF_TRUE", J.op_pop_jump_if_true),
    ("JUMP_IF_FALSE_OR_POP", J.op_jump_if_false_or_pop), ("JUMP_IF_TRUE_OR_POP", J.op_jump_if_true_or_pop),
    ("GET_ITER", J.op_get_iter), ("FOR_ITER", J.op_for_iter_pop),
    ("CALL_FUNCTION", K.op_call_function), ("CALL_FUNCTION_KW", K.op_call_function_kw),
    ("CALL_METHOD", K.op_call_method), ("CALL_FUNCTION_EX", C.make_call_function_ex("fn")),
    ("MAKE_FUNCTION", C.op_make_function_310), ("LOAD_BUILD_CLASS", C.op_load_build_class),
    ("SETUP_FINALLY", K.op_setup_finally), ("POP_BLOCK", K.op_pop_block), ("POP_EXCEPT", K.op_pop_except_310),
    ("RERAISE", K.op_reraise_310), ("RAISE_VARARGS", E.op_raise_varargs),
    ("JUMP_IF_NOT_EXC_MATCH", K.op_jump_if_not_exc_match), ("LOAD_ASSERTION_ERROR", E.op_load_assertion_error),
    ("SETUP_WITH", K.op_setup_with), ("WITH_EXCEPT_START", K.op_with_except_start_310),
    ("GEN_START", K.op_gen_start), ("YIELD_VALUE", G.op_yield_value_310),
    ("YIELD_FROM", K.op_yield_from), ("GET_YIELD_FROM_ITER", G.op_get_yield_from_iter),
    ("GET_AWAITABLE", K.op_get_awaitable_310), ("BEFORE_ASYNC_WITH", G.make_before_async_with(K.missing_dunder)),
    ("SETUP_ASYNC_WITH", K.op_setup_async_with), ("GET_AITER", G.op_get_aiter), ("GET_ANEXT", G.op_get_anext),
    ("END_ASYNC_FOR", K.op_end_async_for_310),
    ("MATCH_CLASS", M.make_match_class("called match pattern must be a type", push_success=True)),
    ("MATCH_MAPPING", M.op_match_mapping),
    ("MATCH_SEQUENCE", M.op_match_sequence), ("MATCH_KEYS", M.op_match_keys_310), ("GET_LEN", M.op_get_len),
    ("COPY_DICT_WITHOUT_KEYS", K.op_copy_dict_without_keys),
]
ENTRIES += [(f"BINARY_{name}", A.make_binary(k)) for k, name in enumerate(_BINARY)]
ENTRIES += [(f"INPLACE_{name}", A.make_binary(k + 13)) for k, name in enumerate(_BINARY)]


def build():
    t = HandlerTable("3.10").register_all(ENTRIES)
    t.unwind = K.unwind_block_stack
    t.init_frame = K.init_frame_310
    t.gen_prerun = False
    t.delegate_raised = K.delegate_raised_310
    t.localsplus_names = K.localsplus_names_310
    return t
