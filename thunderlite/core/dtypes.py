"""dtype facts the IR needs: categories, short names for printing, promotion.

thunderlite uses ``torch.dtype`` objects directly as its dtype representation:
converting at every boundary would cost time on the cached-call path and buys
nothing, since every executor we have speaks torch dtypes.
"""
from __future__ import annotations

import torch

bool_ = torch.bool
float_dtypes = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64,
                          torch.float8_e4m3fn, torch.float8_e5m2})
low_precision_floats = frozenset({torch.float16, torch.bfloat16})
"""Floats eager computes in float32 (ATen's opmath) and rounds back."""
complex_dtypes = frozenset({torch.complex32, torch.complex64, torch.complex128})
int_dtypes = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                        torch.uint16, torch.uint32, torch.uint64})

_SHORT = {
    torch.bool: "b8", torch.uint8: "ui8", torch.int8: "i8", torch.int16: "i16",
    torch.int32: "i32", torch.int64: "i64", torch.uint16: "ui16", torch.uint32: "ui32",
    torch.uint64: "ui64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.float32: "f32", torch.float64: "f64", torch.complex32: "c32",
    torch.complex64: "c64", torch.complex128: "c128",
    torch.float8_e4m3fn: "f8e4m3", torch.float8_e5m2: "f8e5m2",
}


def short_name(dtype: torch.dtype) -> str:
    """'f32' for torch.float32: the compact form used in trace comments."""
    return _SHORT.get(dtype, str(dtype).removeprefix("torch."))


def is_float(dtype: torch.dtype) -> bool:
    return dtype in float_dtypes


def is_complex(dtype: torch.dtype) -> bool:
    return dtype in complex_dtypes


def is_integer(dtype: torch.dtype) -> bool:
    """Integer dtypes, bool excluded."""
    return dtype in int_dtypes


def is_inexact(dtype: torch.dtype) -> bool:
    return dtype in float_dtypes or dtype in complex_dtypes


_CORRESPONDING_REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32,
                       torch.complex128: torch.float64}
_CORRESPONDING_COMPLEX = {torch.float16: torch.complex32, torch.bfloat16: torch.complex64,
                          torch.float32: torch.complex64, torch.float64: torch.complex128}


def to_real(dtype: torch.dtype) -> torch.dtype:
    """The real dtype of a complex dtype (abs, real, imag return it)."""
    return _CORRESPONDING_REAL.get(dtype, dtype)


def to_complex(dtype: torch.dtype) -> torch.dtype:
    return _CORRESPONDING_COMPLEX.get(dtype, torch.complex64)


def python_type_of(dtype: torch.dtype) -> type:
    """The Python number type whose values a tensor of ``dtype`` holds."""
    if dtype is torch.bool:
        return bool
    if dtype in int_dtypes:
        return int
    if dtype in complex_dtypes:
        return complex
    return float


def _category(dtype: torch.dtype) -> int:
    if dtype is torch.bool:
        return 0
    if dtype in int_dtypes:
        return 1
    if dtype in float_dtypes:
        return 2
    return 3


_PY_CATEGORY = {bool: 0, int: 1, float: 2, complex: 3}


def result_type(*args) -> torch.dtype:
    """PyTorch's type promotion over tensors (anything with .dtype and .shape),
    dtypes and Python numbers, exactly as ``torch.result_type`` does it:
    dimensioned tensors outrank 0-dim tensors, which outrank Python scalars, and
    a lower-priority operand only matters when it is of a higher category."""
    dim_dtype = zero_dim_dtype = None
    py_cat = -1
    for a in args:
        if a is None:
            continue
        if isinstance(a, torch.dtype):
            dim_dtype = a if dim_dtype is None else torch.promote_types(dim_dtype, a)
            continue
        dt = getattr(a, "dtype", None)
        if dt is not None and hasattr(a, "shape"):
            if len(a.shape) == 0:
                zero_dim_dtype = dt if zero_dim_dtype is None else torch.promote_types(zero_dim_dtype, dt)
            else:
                dim_dtype = dt if dim_dtype is None else torch.promote_types(dim_dtype, dt)
            continue
        pt = getattr(a, "python_type", None) or type(a)
        py_cat = max(py_cat, _PY_CATEGORY.get(pt, 2 if issubclass(pt, float) else 1))
    result = dim_dtype
    if zero_dim_dtype is not None:
        if result is None:
            result = zero_dim_dtype
        elif _category(zero_dim_dtype) > _category(result):
            result = _upgrade(result, zero_dim_dtype)
    if py_cat >= 0:
        if result is None:
            result = {0: torch.bool, 1: torch.int64, 2: torch.get_default_dtype(),
                      3: to_complex(torch.get_default_dtype())}[py_cat]
        elif py_cat > _category(result):
            result = {1: torch.int64, 2: torch.get_default_dtype(),
                      3: to_complex(result if is_float(result) else torch.get_default_dtype())}[py_cat]
    return result if result is not None else torch.get_default_dtype()


def _upgrade(low: torch.dtype, high: torch.dtype) -> torch.dtype:
    """A lower-priority operand of a higher category: the result takes its
    category; float from a 0-dim float keeps the 0-dim's dtype, complex keeps
    the float width where it can."""
    if is_complex(high) and is_float(low):
        return to_complex(low)
    return high
