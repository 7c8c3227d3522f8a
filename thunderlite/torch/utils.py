"""Helpers every torch-language module shares: broadcasting, type promotion,
dimension canonicalization. The language makes promotion and broadcasting
explicit because prims are strict (same shape, same dtype)."""
from __future__ import annotations

import enum
import numbers
from collections.abc import Sequence

import torch

from thunderlite.core import dtypes, prims
from thunderlite.core.prims import broadcast_shapes, check  # re-exported
from thunderlite.core.proxies import DataDependentError, NumberProxy, TensorProxy, proxy_of_tensor
from thunderlite.core.symbol import Symbol
from thunderlite.core.symint import SymInt, statically_known


def is_tensor(x) -> bool:
    return type(x) is TensorProxy


def is_number(x) -> bool:
    return isinstance(x, (numbers.Number, NumberProxy, SymInt)) and not isinstance(x, TensorProxy)


def known_equal(x, value) -> bool:
    """Whether tracing knows ``x == value``: for shortcuts (``alpha == 1`` skips a
    multiply) whose general path is right for every value. A traced number
    (its value known only when the program runs, or a size not known equal
    without a guard) takes the general path; deciding ``==`` on it would
    raise or specialize the trace to one value."""
    if type(x) is NumberProxy:
        return False
    if type(x) is SymInt:
        return type(value) is int and statically_known(x, "==", value) is True
    return x == value


def canonical_dim(dim: int, ndim: int, *, wrap_scalar: bool = True) -> int:
    """``dim`` in ``[0, ndim)``, accepting negative dims as torch does (a 0-d
    tensor accepts dims 0 and -1)."""
    n = max(ndim, 1) if wrap_scalar else ndim
    check(-n <= dim < n, lambda: f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})",
          IndexError)
    return dim % n


def canonical_dims(dims, ndim: int) -> tuple[int, ...]:
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    out = tuple(canonical_dim(d, ndim) for d in dims)
    check(len(set(out)) == len(out), lambda: f"dim {dims} appears multiple times in the list of dims")
    return out


def expand_to(a, shape: Sequence[int]):
    """``a`` broadcast to ``shape`` (a no-op when it already has it)."""
    shape = tuple(shape)
    if not is_tensor(a) or _same_shape(a.shape, shape):
        return a
    offset = len(shape) - a.ndim
    check(offset >= 0, lambda: f"cannot broadcast a tensor of shape {a.shape} to {shape}")
    return prims.broadcast_in_dim(a, shape, tuple(range(offset, len(shape))))


def _same_shape(a: tuple, b: tuple) -> bool:
    """Whether two shapes are provably one (a size known only at run time
    against 1 is not: broadcasting covers both cases)."""
    if len(a) != len(b):
        return False
    try:
        return a == b
    except DataDependentError:
        return False


def broadcast(*args):
    """Tensor args broadcast to their common shape; numbers pass through."""
    shape = broadcast_shapes(*(a.shape for a in args if is_tensor(a)))
    return tuple(expand_to(a, shape) for a in args)


def convert(a, dtype: torch.dtype):
    if is_tensor(a):
        return a if a.dtype == dtype else prims.convert_element_type(a, dtype)
    return a


class Promotion(enum.Enum):
    """How an elementwise op's result dtype follows from the promoted type."""
    DEFAULT = "default"              # the promoted type
    INT_TO_FLOAT = "int_to_float"    # ints and bools become the default float (sin, div)
    ALWAYS_BOOL = "always_bool"      # comparisons
    COMPLEX_TO_FLOAT = "complex_to_float"  # abs
    BOOL_TO_LONG = "bool_to_long"    # bools become int64


_LOW_PRECISION = {torch.float16: torch.float32, torch.bfloat16: torch.float32,
                  torch.complex32: torch.complex64}


def upcast(a):
    """A tensor in the dtype eager computes it in (half precision widened, see
    ``promote``); anything else (None, a number, a wider tensor) as it is."""
    return convert(a, _LOW_PRECISION[a.dtype]) if is_tensor(a) and a.dtype in _LOW_PRECISION else a


def promote(args, kind: Promotion = Promotion.DEFAULT) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) for an elementwise op on ``args``.
    Half-precision floats compute in float32, as eager PyTorch's opmath does."""
    dt = dtypes.result_type(*args)
    if kind is Promotion.INT_TO_FLOAT and not dtypes.is_inexact(dt):
        dt = torch.get_default_dtype()
    elif kind is Promotion.BOOL_TO_LONG and dt is torch.bool:
        dt = torch.int64
    compute = _LOW_PRECISION.get(dt, dt)
    if kind is Promotion.ALWAYS_BOOL:
        return dt, torch.bool
    if kind is Promotion.COMPLEX_TO_FLOAT:
        return compute, dtypes.to_real(dt)
    return compute, dt


def _constant_meta(t: torch.Tensor) -> TensorProxy:
    p = proxy_of_tensor(t)
    p.requires_grad = False
    return p


# A concrete tensor made by code that runs while tracing without the jit's hooks
# (``torch.masked.mean``'s element count, in a hand-built trace): a trace value
# holding a copy of it, so prims see a tensor, never a "scalar" tensor object.
TENSOR_CONSTANT = Symbol("tensor_constant", meta=_constant_meta, impl=lambda t: t.clone(), module="ltorch")


def elementwise(prim, *args, kind: Promotion = Promotion.DEFAULT, upcast: bool = True):
    """Apply an elementwise prim torch-style: promote, broadcast, compute
    (half precision in float32), and cast the result back."""
    if any(isinstance(a, torch.Tensor) for a in args):
        args = tuple(TENSOR_CONSTANT(a) if isinstance(a, torch.Tensor) else a for a in args)
    compute, result = promote(args, kind)
    if not upcast and kind is not Promotion.ALWAYS_BOOL:
        compute = result if kind is not Promotion.COMPLEX_TO_FLOAT else compute
    args = broadcast(*args)
    args = tuple(convert(a, compute) if is_tensor(a) else _number_as(a, compute) for a in args)
    out = prim(*args)
    return convert(out, result)


def _number_as(x, dtype: torch.dtype):
    """A Python number of the kind a tensor of ``dtype`` holds (so prims see
    e.g. ``2.0`` for a float computation, never a complex for a real one)."""
    if isinstance(x, (NumberProxy, SymInt)) or x is None:
        return x            # a symbolic size stays an int: torch computes t / n as t / float(n)
    if dtypes.is_complex(dtype):
        return x
    if dtypes.is_float(dtype) and isinstance(x, (bool, int)):
        return float(x)
    return x


def full_like_scalar(value, like: TensorProxy, dtype: torch.dtype | None = None):
    """A tensor of ``like``'s shape filled with ``value`` (prims that do not
    take Python numbers need one)."""
    dtype = like.dtype if dtype is None else dtype
    return prims.full(like.shape, value, device=like.device, dtype=dtype)


def tensor_of(x, like: TensorProxy, dtype: torch.dtype):
    """``x`` as a tensor with ``like``'s shape and ``dtype``."""
    if is_tensor(x):
        return convert(expand_to(x, like.shape), dtype)
    return full_like_scalar(x, like, dtype)


def reduction_dtype(a: TensorProxy, dtype: torch.dtype | None, *, int_to_long: bool = True) -> torch.dtype:
    """The dtype sum/prod accumulate and return: ints and bools become int64."""
    if dtype is not None:
        return dtype
    if int_to_long and (a.dtype is torch.bool or dtypes.is_integer(a.dtype)):
        return torch.int64
    return a.dtype


def ntuple(x, n: int) -> tuple:
    """``x`` as an ``n``-tuple: a scalar repeated, or a 1- or n-sequence (conv,
    pooling and interpolation sizes)."""
    if isinstance(x, (tuple, list)):
        check(len(x) in (1, n), lambda: f"expected 1 or {n} values, got {tuple(x)}")
        return tuple(x) * (n if len(x) == 1 else 1)
    return (x,) * n
