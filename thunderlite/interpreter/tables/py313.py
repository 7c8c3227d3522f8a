"""The Python 3.13 handler table (3.12's entries plus the 3.13 call and format forms)."""
from __future__ import annotations

from ..loop import unwind_exception_table
from ..ops import arith as A
from ..ops import build as B
from ..ops import calls as C
from ..ops import generators as G
from ..ops import loads as L
from ..ops import stack as S
from .py311 import COMMON
from .py312 import COMMON_312
from .registry import HandlerTable

_REPLACED = {"CALL_FUNCTION_EX"}

ONLY_313 = [
    ("LOAD_GLOBAL", L.op_load_global_null_after, L.prepare_load_global),
    ("LOAD_ATTR", L.op_load_attr_313, L.prepare_load_attr),
    ("LOAD_SUPER_ATTR", C.make_load_super_attr(null_after=True)),
    ("LOAD_FAST_LOAD_FAST", L.op_load_fast_load_fast), ("STORE_FAST_LOAD_FAST", L.op_store_fast_load_fast),
    ("STORE_FAST_STORE_FAST", L.op_store_fast_store_fast),
    ("END_FOR", S.op_end_for_1), ("CALL", C.op_call_313), ("CALL_KW", C.op_call_kw),
    ("CALL_FUNCTION_EX", C.make_call_function_ex("fn_null")),
    ("MAKE_FUNCTION", C.op_make_function_313), ("SET_FUNCTION_ATTRIBUTE", C.op_set_function_attribute),
    ("DICT_MERGE", B.make_dict_merge(3)),
    ("CONVERT_VALUE", B.op_convert_value), ("FORMAT_SIMPLE", B.op_format_simple),
    ("FORMAT_WITH_SPEC", B.op_format_with_spec),
    ("COMPARE_OP", A.op_compare_op_313, A.prepare_compare), ("TO_BOOL", A.op_to_bool),
]


def build():
    entries = [e for e in COMMON if e[0] not in _REPLACED] + COMMON_312 + ONLY_313
    t = HandlerTable("3.13").register_all(entries)
    t.unwind = unwind_exception_table
    t.gen_prerun = True
    t.delegate_raised = G.delegate_raised_312
    return t
