"""Prims: the closed set of operations with no decomposition. Every executor
must be able to run a program of prims (the torch executor runs them all).

Prims are strict where torch is lenient, so that the torch language (which
decomposes into them) makes every promotion and broadcast explicit in the trace:
elementwise prims take tensors of one shape and one dtype (Python numbers
allowed), and produce that dtype (comparisons produce bool).

Adding a prim: one ``make_prim`` call with its meta function, here; its
implementation in executors/torchex.py; its VJP rule in transforms/autodiff_rules.
"""
from __future__ import annotations

from typing import Callable

import torch

from thunderlite.core import dtypes
from thunderlite.core.proxies import NumberProxy, TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag

_registry: dict[str, Symbol] = {}


def make_prim(name: str, meta: Callable, tags=()) -> Symbol:
    if name in _registry:
        raise ValueError(f"prim {name!r} is defined twice")
    sym = Symbol(name, meta=meta, module="prims", tags={Tag.PRIM, *tags})
    _registry[name] = sym
    return sym


def all_prims() -> dict[str, Symbol]:
    return dict(_registry)


def check(cond: bool, msg: Callable[[], str], exc=RuntimeError) -> None:
    """Raise lazily-built errors: the message costs nothing when cond holds."""
    if not cond:
        raise exc(msg())


# --- elementwise --------------------------------------------------------------------

def _elementwise_meta(out_dtype_fn):
    def meta(*args):
        tensors = [a for a in args if isinstance(a, TensorProxy)]
        check(bool(tensors), lambda: "elementwise prims need at least one tensor argument")
        t0 = tensors[0]
        for t in tensors[1:]:
            check(t.shape == t0.shape, lambda: f"prim operands differ in shape: {t0.shape} vs {t.shape}")
            check(t.dtype == t0.dtype, lambda: f"prim operands differ in dtype: {t0.dtype} vs {t.dtype}")
        return TensorProxy(shape=t0.shape, dtype=out_dtype_fn(t0.dtype), device=t0.device,
                           requires_grad=any(t.requires_grad for t in tensors))
    return meta


_same = _elementwise_meta(lambda d: d)
_to_bool = _elementwise_meta(lambda d: torch.bool)
_to_real = _elementwise_meta(dtypes.to_real)

UNARY = ["neg", "abs", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt",
         "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
         "atanh", "erf", "erfc", "erfinv", "lgamma", "digamma", "sigmoid", "floor", "ceil",
         "round", "trunc", "sign", "signbit", "reciprocal", "bitwise_not", "logical_not",
         "isfinite", "isnan", "isinf", "real", "imag", "conj"]
BINARY = ["add", "sub", "mul", "div", "floor_divide", "remainder", "fmod", "pow", "atan2",
          "maximum", "minimum", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
          "bitwise_right_shift", "eq", "ne", "lt", "le", "gt", "ge", "copysign", "nextafter",
          "hypot", "logical_and", "logical_or", "logical_xor", "zeta", "polygamma"]
_BOOL_OUT = {"eq", "ne", "lt", "le", "gt", "ge", "isfinite", "isnan", "isinf", "signbit",
             "logical_not", "logical_and", "logical_or", "logical_xor"}
_REAL_OUT = {"abs", "real", "imag"}

_g = globals()
for _name in UNARY + BINARY:
    _meta = _to_bool if _name in _BOOL_OUT else _to_real if _name in _REAL_OUT else _same
    _g[_name] = make_prim(_name, _meta)


def _where_meta(pred, a, b):
    shapes = [x.shape for x in (pred, a, b) if isinstance(x, TensorProxy)]
    check(all(s == shapes[0] for s in shapes), lambda: f"where operands differ in shape: {shapes}")
    check(isinstance(pred, TensorProxy) and pred.dtype is torch.bool, lambda: "where needs a bool tensor predicate")
    vals = [x for x in (a, b) if isinstance(x, TensorProxy)]
    dtype = vals[0].dtype if vals else dtypes.result_type(a, b)
    return TensorProxy(shape=pred.shape, dtype=dtype, device=pred.device,
                       requires_grad=any(v.requires_grad for v in vals))


where = make_prim("where", _where_meta)


def _convert_element_type_meta(a, dtype: torch.dtype):
    if isinstance(a, NumberProxy):
        return NumberProxy(None, dtypes.python_type_of(dtype))
    return a.replace(dtype=dtype, requires_grad=a.requires_grad and dtypes.is_inexact(dtype))


convert_element_type = make_prim("convert_element_type", _convert_element_type_meta)


# --- shapes -----------------------------------------------------------------------------

def _broadcast_in_dim_meta(a, shape, broadcast_dims):
    shape = tuple(shape)
    check(len(broadcast_dims) == a.ndim, lambda: f"broadcast_in_dim: {len(broadcast_dims)} dims for a {a.ndim}-d tensor")
    for d, s in zip(broadcast_dims, a.shape, strict=True):
        check(s == 1 or s == shape[d], lambda: f"broadcast_in_dim: cannot broadcast {a.shape} to {shape}")
    return a.replace(shape=shape)


broadcast_in_dim = make_prim("broadcast_in_dim", _broadcast_in_dim_meta)


def _reshape_meta(a, shape):
    shape = tuple(shape)
    n = 1
    for s in shape:
        n *= s
    check(n == a.numel(), lambda: f"reshape: shape {shape} is invalid for input of size {a.numel()}")
    return a.replace(shape=shape)


reshape = make_prim("reshape", _reshape_meta)


# --- reductions ---------------------------------------------------------------------------

def _reduction_meta(out_dtype_fn):
    def meta(a, dims, *, output_dtype=None):
        dims = tuple(sorted(d % max(a.ndim, 1) for d in dims))
        shape = tuple(s for i, s in enumerate(a.shape) if i not in dims)
        dtype = output_dtype if output_dtype is not None else out_dtype_fn(a.dtype)
        return a.replace(shape=shape, dtype=dtype, requires_grad=a.requires_grad and dtypes.is_inexact(dtype))
    return meta


sum = make_prim("sum", _reduction_meta(lambda d: d))
prod = make_prim("prod", _reduction_meta(lambda d: d))
amax = make_prim("amax", _reduction_meta(lambda d: d))
amin = make_prim("amin", _reduction_meta(lambda d: d))


# --- memory -------------------------------------------------------------------------------

def _copy_meta(src, dst):
    check(isinstance(dst, TensorProxy), lambda: "copy_ writes into a tensor")
    return dst.replace()


copy_ = make_prim("copy_", _copy_meta, tags={Tag.INPLACE})
"""``copy_(src, dst)`` writes ``src`` (broadcast and cast to dst's shape and dtype)
into ``dst`` and returns the result: the one way a trace writes into memory."""
