"""Reductions, scans, sorting: sum/mean/prod/amax/amin/max/min, var/std,
all/any, logsumexp, norms, cumsum/cumprod, argmax/argmin, topk/sort.
Prims reduce an explicit tuple of dims and never keep them; the language
handles ``dim=None``, ``keepdim`` and accumulation dtypes."""
from __future__ import annotations

import math

import torch

from thunderlite.core import dtypes, prims
from thunderlite.core.prims import check
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.registry import decomposable, torchsymbol
from thunderlite.torch.utils import canonical_dim, canonical_dims, convert, is_tensor, reduction_dtype

T = torch.Tensor


def _dims(a, dim) -> tuple[int, ...]:
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(a.ndim))
    return canonical_dims(dim, a.ndim)


def _keep(out, a, dims, keepdim: bool):
    """Reinsert reduced dims as size 1 (keepdim=True)."""
    if not keepdim or a.ndim == 0:
        return out
    shape = tuple(1 if i in dims else s for i, s in enumerate(a.shape))
    return prims.reshape(out, shape)


def _reduce(prim, a, dim, keepdim, out_dtype, compute_dtype=None):
    dims = _dims(a, dim)
    compute = compute_dtype if compute_dtype is not None else out_dtype
    x = convert(a, compute)
    out = prim(x, dims) if a.ndim else prim(x, ())
    return _keep(convert(out, out_dtype), a, dims, keepdim)


_UPCAST = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.complex32: torch.complex64}


@torchsymbol(torch.sum, T.sum, method_name="sum")
def sum(input, dim=None, keepdim: bool = False, *, dtype=None):
    out_dtype = reduction_dtype(input, dtype)
    return _reduce(prims.sum, input, dim, keepdim, out_dtype, _UPCAST.get(out_dtype, out_dtype))


@torchsymbol(torch.nansum, T.nansum, method_name="nansum")
def nansum(input, dim=None, keepdim: bool = False, *, dtype=None):
    x = ew.where(ew.isnan(input), 0, input) if dtypes.is_float(input.dtype) else input
    return sum(x, dim, keepdim, dtype=dtype)


@torchsymbol(torch.prod, T.prod, method_name="prod")
def prod(input, dim=None, keepdim: bool = False, *, dtype=None):
    out_dtype = reduction_dtype(input, dtype)
    return _reduce(prims.prod, input, dim, keepdim, out_dtype, _UPCAST.get(out_dtype, out_dtype))


def _numel(a, dims) -> int:
    if a.ndim == 0:
        return 1              # a 0-d tensor accepts dim 0 / -1 and reduces nothing
    n = 1
    for d in dims:
        n *= a.shape[d]
    return n


@torchsymbol(torch.mean, T.mean, method_name="mean")
def mean(input, dim=None, keepdim: bool = False, *, dtype=None):
    out_dtype = dtype if dtype is not None else input.dtype
    check(dtypes.is_inexact(out_dtype),
          lambda: f"mean(): could not infer output dtype. Input dtype must be either a floating point or "
                  f"complex dtype. Got: {out_dtype}")
    dims = _dims(input, dim)
    s = sum(input, dim, keepdim, dtype=_UPCAST.get(out_dtype, out_dtype))
    return convert(ew.div(s, _numel(input, dims)), out_dtype)


@torchsymbol(torch.nanmean, T.nanmean, method_name="nanmean")
def nanmean(input, dim=None, keepdim: bool = False, *, dtype=None):
    notnan = ew.logical_not(ew.isnan(input))
    return ew.div(nansum(input, dim, keepdim, dtype=dtype), sum(notnan, dim, keepdim))


@torchsymbol(torch.amax, T.amax, method_name="amax")
def amax(input, dim=(), keepdim: bool = False):
    return _reduce(prims.amax, input, dim, keepdim, input.dtype)


@torchsymbol(torch.amin, T.amin, method_name="amin")
def amin(input, dim=(), keepdim: bool = False):
    return _reduce(prims.amin, input, dim, keepdim, input.dtype)


def _arg(prim, input, dim, keepdim):
    if dim is None:
        flat = prims.reshape(input, (input.numel(),)) if input.ndim != 1 else input
        out = prim(flat, 0) if input.ndim else prim(prims.reshape(input, (1,)), 0)
        return prims.reshape(out, (1,) * input.ndim) if keepdim else out
    d = canonical_dim(dim, input.ndim)
    if input.ndim == 0:
        return prims.reshape(prim(prims.reshape(input, (1,)), 0), ())
    return _keep(prim(input, d), input, (d,), keepdim)


@torchsymbol(torch.argmax, T.argmax, method_name="argmax")
def argmax(input, dim=None, keepdim: bool = False):
    return _arg(prims.argmax, input, dim, keepdim)


@torchsymbol(torch.argmin, T.argmin, method_name="argmin")
def argmin(input, dim=None, keepdim: bool = False):
    return _arg(prims.argmin, input, dim, keepdim)


def _max_min(input, dim, keepdim, red, arg, binary):
    if is_tensor(dim):
        return binary(input, dim)
    if dim is None:
        check(input.numel() > 0, lambda: "max(): Expected reduction dim to be specified for input.numel() == 0. "
                                         "Specify the reduction dim with the 'dim' argument.", IndexError)
        return red(input)
    return red(input, dim, keepdim), arg(input, dim, keepdim)


@torchsymbol(torch.max, T.max, method_name="max")
def max(input, dim=None, keepdim: bool = False):
    return _max_min(input, dim, keepdim, amax, argmax, ew.maximum)


@torchsymbol(torch.min, T.min, method_name="min")
def min(input, dim=None, keepdim: bool = False):
    return _max_min(input, dim, keepdim, amin, argmin, ew.minimum)


@torchsymbol(torch.aminmax, T.aminmax, method_name="aminmax")
def aminmax(input, *, dim=None, keepdim: bool = False):
    return amin(input, () if dim is None else dim, keepdim), amax(input, () if dim is None else dim, keepdim)


def _var_args(dim, unbiased, correction):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return dim, correction


@torchsymbol(torch.var, T.var, method_name="var")
def var(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    dim, correction = _var_args(dim, unbiased, correction)
    dims = _dims(input, dim)
    x = convert(input, _UPCAST.get(input.dtype, input.dtype))
    out = prims.var(x, dims if input.ndim else (), correction=correction)
    return _keep(convert(out, dtypes.to_real(input.dtype)), input, dims, keepdim)


@torchsymbol(torch.std, T.std, method_name="std")
def std(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    return ew.sqrt(var(input, dim, unbiased, keepdim, correction=correction))


@torchsymbol(torch.var_mean)
def var_mean(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    return var(input, dim, unbiased, keepdim, correction=correction), mean(input, _var_args(dim, None, 0)[0], keepdim)


@torchsymbol(torch.std_mean)
def std_mean(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    dims, correction = _var_args(dim, unbiased, correction)
    return std(input, dims, keepdim=keepdim, correction=correction), mean(input, dims, keepdim)


@torchsymbol(torch.all, T.all, method_name="all")
def all(input, dim=None, keepdim: bool = False):
    out = ew.logical_not(any(ew.logical_not(input), dim, keepdim))
    return convert(out, torch.uint8) if input.dtype is torch.uint8 else out


@torchsymbol(torch.any, T.any, method_name="any")
def any(input, dim=None, keepdim: bool = False):
    out = _reduce(prims.amax, convert(input, torch.bool), dim, keepdim, torch.bool) if input.numel() else \
        _keep(convert(prims.sum(convert(input, torch.int64), _dims(input, dim)), torch.bool), input,
              _dims(input, dim), keepdim)
    return convert(out, torch.uint8) if input.dtype is torch.uint8 else out


@torchsymbol(torch.count_nonzero, T.count_nonzero, method_name="count_nonzero")
def count_nonzero(input, dim=None):
    return sum(ew.ne(input, 0), dim)


@torchsymbol(torch.logsumexp, T.logsumexp, torch.special.logsumexp, method_name="logsumexp")
def logsumexp(input, dim, keepdim: bool = False):
    x = convert(input, torch.get_default_dtype()) if not dtypes.is_inexact(input.dtype) else input
    dims = _dims(x, dim)
    m = amax(x, dims, True) if x.ndim else x
    m = ew.where(ew.isinf(m), 0, m)
    out = ew.add(ew.log(sum(ew.exp(ew.sub(x, m)), dims, True)), m)
    return out if keepdim or x.ndim == 0 else prims.squeeze(out, dims)


@torchsymbol(torch.linalg.vector_norm)
def vector_norm(x, ord=2, dim=None, keepdim: bool = False, *, dtype=None):
    if dtype is not None:
        x = convert(x, dtype)
    a = ew.abs(x)
    if ord == math.inf:
        return amax(a, () if dim is None else dim, keepdim)
    if ord == -math.inf:
        return amin(a, () if dim is None else dim, keepdim)
    if ord == 0:
        # the count of non-zeros, written with sign (zero gradient) rather than a
        # comparison, so the result requires grad (with zero gradient) as in eager
        return sum(ew.where(ew.isnan(a), 1.0, ew.sign(a)), dim, keepdim)
    if ord == 1:
        return sum(a, dim, keepdim)
    if ord == 2:
        return ew.sqrt(sum(ew.mul(a, a), dim, keepdim))
    return ew.pow(sum(ew.pow(a, ord), dim, keepdim), 1.0 / ord)


@torchsymbol(torch.norm, T.norm, method_name="norm")
def norm(input, p="fro", dim=None, keepdim: bool = False, dtype=None):
    decomposable(p == "fro" or not isinstance(p, str), lambda: f"norm: p={p!r} is not supported by the decomposition")
    return vector_norm(input, 2 if p == "fro" else p, dim, keepdim, dtype=dtype)


def _scan(prim, input, dim, dtype):
    d = canonical_dim(dim, input.ndim)
    out_dtype = reduction_dtype(input, dtype)
    x = convert(input, out_dtype)
    # an integer dtype asked for is kept (the prim's own default widens integers to int64)
    kw = {} if dtype is None else {"dtype": out_dtype}
    if input.ndim == 0:
        return prims.reshape(prim(prims.reshape(x, (1,)), 0, **kw), ())
    return prim(x, d, **kw)


@torchsymbol(torch.cumsum, T.cumsum, method_name="cumsum")
def cumsum(input, dim, *, dtype=None):
    return _scan(prims.cumsum, input, dim, dtype)


@torchsymbol(torch.cumprod, T.cumprod, method_name="cumprod")
def cumprod(input, dim, *, dtype=None):
    return _scan(prims.cumprod, input, dim, dtype)


@torchsymbol(torch.topk, T.topk, method_name="topk")
def topk(input, k, dim=-1, largest: bool = True, sorted: bool = True):
    return prims.topk(input, k, dim, largest, sorted)


@torchsymbol(torch.sort, T.sort, method_name="sort")
def sort(input, dim=-1, descending: bool = False, *, stable: bool = False):
    if isinstance(dim, bool):
        dim, descending = -1, dim
    if stable:
        return prims.sort(input, dim, descending, stable=True)
    return prims.sort(input, dim, descending)


@torchsymbol(torch.argsort, T.argsort, method_name="argsort")
def argsort(input, dim=-1, descending: bool = False, *, stable: bool = False):
    return sort(input, dim, descending, stable=stable)[1]
