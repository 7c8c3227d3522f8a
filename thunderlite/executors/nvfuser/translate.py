"""The prim -> nvFuser translation table (one dict), and the prims nvFuser
deliberately does not run, each with its reason.

Every prim is in exactly one of ``TRANSLATIONS`` and ``UNSUPPORTED`` (a test
checks it against ``prims.all_prims()`` on CPU). A translation is
``fn(fd, bsym, args, kwargs) -> nvFuser value(s)``: ``args``/``kwargs`` are the
bound symbol's arguments with every proxy replaced by the nvFuser value that
stands for it (``fd.ops.*`` results or fusion inputs) and Python numbers left
as they are (``scalar(fd, x)`` defines them). ``accepts(bsym)`` refuses calls a
translation cannot express (interior padding, zero-dim reductions...).

The API is ``nvfuser_direct``'s (NVIDIA/Fuser ``python/nvfuser_direct``):
``FusionDefinition``, ``fd.ops.<op>``, ``fd.define_scalar``, ``DataType``.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from thunderlite.core import dtypes
from thunderlite.core.proxies import NumberProxy

_DTYPE_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Int", torch.int32: "Int32", torch.bool: "Bool",
    torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}


def nv_dtype(dtype: torch.dtype):
    """nvFuser's ``DataType`` for a torch dtype (``KeyError``: not representable)."""
    from nvfuser_direct import DataType
    return getattr(DataType, _DTYPE_NAMES[dtype])


def supported_dtype(dtype) -> bool:
    return dtype in _DTYPE_NAMES


def scalar(fd, x):
    """A Python number as an nvFuser constant (values already nvFuser's pass through)."""
    if isinstance(x, bool):
        return fd.define_scalar(x, dtype=nv_dtype(torch.bool))
    if isinstance(x, int):
        return fd.define_scalar(x, dtype=nv_dtype(torch.int64))
    if isinstance(x, float):
        return fd.define_scalar(x, dtype=nv_dtype(torch.float64))
    if isinstance(x, complex):
        return fd.define_scalar(x, dtype=nv_dtype(torch.complex128))
    return x


def _ew(name: str) -> Callable:
    """An elementwise prim that is the nvFuser op ``name`` on its arguments."""
    def translate(fd, bsym, args, kwargs):
        return getattr(fd.ops, name)(*(scalar(fd, a) for a in args))
    return translate


_SAME_NAME_UNARY = ("neg", "abs", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt",
                    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
                    "atanh", "erf", "erfc", "erfinv", "lgamma", "sigmoid", "floor", "ceil", "trunc", "sign",
                    "signbit", "reciprocal", "bitwise_not", "logical_not", "isfinite", "isnan", "isinf",
                    "real", "imag")
_SAME_NAME_BINARY = ("add", "sub", "mul", "remainder", "fmod", "pow", "atan2", "maximum", "minimum",
                     "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
                     "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "nextafter")


def _convert_element_type(fd, bsym, args, kwargs):
    a, dtype = args
    return fd.ops.cast(scalar(fd, a), dtype=nv_dtype(dtype))


def _where(fd, bsym, args, kwargs):
    return fd.ops.where(*(scalar(fd, a) for a in args))


def _broadcast_in_dim(fd, bsym, args, kwargs):
    a, shape, dims = args
    return fd.ops.broadcast_in_dim(a, shape=list(shape), broadcast_dims=list(dims))


def _reshape(fd, bsym, args, kwargs):
    a, shape = args
    return fd.ops.reshape(a, new_shape=list(shape))


def _permute(fd, bsym, args, kwargs):
    a, perm = args
    return fd.ops.permute(a, dims=list(perm))


def _slice(fd, bsym, args, kwargs):
    a, start, end, *rest = args
    strides = rest[0] if rest else kwargs.get("strides")
    return fd.ops.slice(a, start_indices=list(start), end_indices=list(end),
                        strides=list(strides) if strides else None)


def _squeeze(fd, bsym, args, kwargs):
    a, dims = args
    return fd.ops.squeeze(a, dims=list(dims))


def _cat(fd, bsym, args, kwargs):
    tensors, dim = args
    return fd.ops.cat(list(tensors), dim=dim)


def _pad(fd, bsym, args, kwargs):
    a, value, config = args
    widths = [w for lo, hi, _ in reversed(config) for w in (lo, hi)]   # last dim first, as torch's F.pad
    return fd.ops.pad(a, widths, scalar(fd, value))


def _reduction(name: str) -> Callable:
    def translate(fd, bsym, args, kwargs):
        a, dims = args
        out_dtype = kwargs.get("output_dtype") or bsym.output.dtype
        return getattr(fd.ops, name)(a, dims=list(dims), keepdim=False, dtype=nv_dtype(out_dtype))
    return translate


def _minmax(name: str) -> Callable:
    def translate(fd, bsym, args, kwargs):
        a, dims = args
        out = getattr(fd.ops, name)(a, dims=list(dims), keepdim=False)
        want = kwargs.get("output_dtype")
        return fd.ops.cast(out, dtype=nv_dtype(want)) if want is not None and want != bsym.args[0].dtype else out
    return translate


def _var(fd, bsym, args, kwargs):
    a, dims = args
    return fd.ops.var(a, dims=list(dims), correction=kwargs.get("correction", 1), keepdim=False)


def _var_mean(fd, bsym, args, kwargs):
    a, dims = args
    v, m = fd.ops.var_mean(a, dims=list(dims), correction=kwargs.get("correction", 1), keepdim=False)
    return v, m


def _full(fd, bsym, args, kwargs):
    shape, value = args
    return fd.ops.full(shape=list(shape), fill_value=scalar(fd, value), dtype=nv_dtype(kwargs["dtype"]))


def _iota(fd, bsym, args, kwargs):
    (length,) = args
    return fd.ops.iota(scalar(fd, length), scalar(fd, kwargs["start"]), scalar(fd, kwargs["step"]),
                       dtype=nv_dtype(kwargs["dtype"]))


def _matmul(fd, bsym, args, kwargs):
    return fd.ops.matmul(*args)


def _take_along_axis(fd, bsym, args, kwargs):
    a, index, dim = args
    return fd.ops.take_along_axis(a, index, dim)


def _gather(fd, bsym, args, kwargs):
    a, dim, index = args
    return fd.ops.gather(a, index, dim)


def _index_select(fd, bsym, args, kwargs):
    a, dim, index = args
    return fd.ops.index_select(a, index, dim)


def _scan(name: str) -> Callable:
    def translate(fd, bsym, args, kwargs):
        a, dim = args[0], args[1]
        return getattr(fd.ops, name)(a, dim)
    return translate


def _clone(fd, bsym, args, kwargs):
    return fd.ops.set(args[0])


TRANSLATIONS: dict[str, Callable] = {
    **{n: _ew(n) for n in _SAME_NAME_UNARY},
    **{n: _ew(n) for n in _SAME_NAME_BINARY},
    "div": _ew("truediv"),               # prims.div is true division, nvFuser's div truncates integers
    "lerp": _ew("lerp"),
    "where": _where,
    "convert_element_type": _convert_element_type,
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "permute": _permute,
    "slice_prim": _slice,
    "squeeze": _squeeze,
    "cat": _cat,
    "pad": _pad,
    "sum": _reduction("sum"),
    "prod": _reduction("prod"),
    "amax": _minmax("max"),
    "amin": _minmax("min"),
    "var": _var,
    "var_mean": _var_mean,
    "full": _full,
    "iota": _iota,
    "matmul": _matmul,
    "take_along_axis": _take_along_axis,
    "gather": _gather,
    "index_select": _index_select,
    "cumsum": _scan("cumsum"),
    "cumprod": _scan("cumprod"),
    "clone": _clone,
}

_RANDOM = "random draws stay with torch so that results match eager's generator stream"
_INPLACE = "writes into memory: regions are functional (the alias barriers keep writes with torch)"

UNSUPPORTED: dict[str, str] = {
    "digamma": "nvFuser has no digamma op",
    "conj": "nvFuser has no conj op (complex conjugation)",
    "round": "nvFuser's round is not documented to round halves to even as torch.round does",
    "floor_divide": "nvFuser has no floor division (its div truncates)",
    "copysign": "nvFuser has no copysign op",
    "hypot": "nvFuser has no hypot op",
    "logical_xor": "nvFuser has no logical_xor op",
    "zeta": "nvFuser has no zeta op",
    "polygamma": "nvFuser has no polygamma op",
    "device_put": "moves data between devices: not a fusible computation",
    "flip": "nvFuser has no flip op",
    "scatter": "a write into a copy of its input; left to torch (nvFuser's scatter semantics differ on duplicates)",
    "scatter_add": "nvFuser has no scatter_add op",
    "index_add": "nvFuser has no index_add op",
    "index_put": "nvFuser has no index_put op",
    "convolution": "nvFuser has no convolution op",
    "argmax": "nvFuser has no argmax op",
    "argmin": "nvFuser has no argmin op",
    "topk": "nvFuser's topk does not promise torch's order for ties",
    "sort": "nvFuser's argsort-based sort does not promise torch's order for ties",
    "empty": "uninitialised memory: nothing to compute",
    "uniform": _RANDOM,
    "normal": _RANDOM,
    "randint": _RANDOM,
    "bernoulli": _RANDOM,
    "copy_": _INPLACE,
    "item": "returns a Python number (a host sync), not a tensor",
}


def accepts(bsym) -> bool:
    """Whether the translation of this prim call can express it exactly."""
    name = bsym.sym.name
    if name not in TRANSLATIONS:
        return False
    tensors = bsym.tensor_args() + bsym.tensor_outs()
    if not all(supported_dtype(t.dtype) and t.device.type == "cuda" for t in tensors):
        return False
    if any(isinstance(a, complex) or (type(a) is NumberProxy and a.python_type is complex)
           for a in bsym.flat_args()):
        return False                               # complex scalars (a traced one too: item() of a complex)
    if name == "pad":
        return all(interior == 0 for _, _, interior in bsym.args[2])
    if name in ("sum", "prod", "amax", "amin", "var", "var_mean"):
        return bool(bsym.args[1])                  # dims=() is a copy, not a reduction
    if name == "convert_element_type":
        return supported_dtype(bsym.args[1]) and not dtypes.is_complex(bsym.args[1])
    if name in ("cumsum", "cumprod"):
        return bsym.output.dtype == bsym.args[0].dtype       # torch widens integer scans to int64
    return True
