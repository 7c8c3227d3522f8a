"""Pooling and interpolation as prims: max/avg pooling (1-3 spatial dims),
adaptive average pooling, and ``F.interpolate`` (nearest, nearest-exact,
linear/bilinear/trilinear with and without ``align_corners``).

Pooling pads the input, then takes one strided slice per kernel offset (each
slice has the output's shape) and combines them with ``maximum`` or ``add``:
kernels are small, so that is a handful of prims that fuse well. Interpolation
computes its source indices and weights in the trace from ``iota`` with the
same float32 arithmetic ATen uses, then gathers with ``index_select``
(separable: one spatial dim at a time). Cases outside these (indices
returned, antialiasing, bicubic, area) fall back to one opaque call.
"""
from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from thunderlite.core import dtypes, prims
from thunderlite.core.prims import check
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.ops import shapes
from thunderlite.torch.registry import decomposable, torchsymbol
from thunderlite.torch.utils import convert, ntuple


def _batched(input, nsp: int):
    """(input with a batch dim, whether it had one): unbatched inputs get one."""
    check(input.ndim in (nsp + 1, nsp + 2),
          lambda: f"expected a {nsp + 1}-d or {nsp + 2}-d input to {nsp}-d pooling, got {input.ndim}-d")
    return (input, True) if input.ndim == nsp + 2 else (shapes.unsqueeze(input, 0), False)


def _pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """ATen's pooling_output_shape: the last window must start inside the input
    or its left padding."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _extra(x, nsp: int, k, s, p, d, out) -> list[int]:
    """Per spatial dim, the high-side padding beyond ``p`` that ceil_mode's last
    window needs (those positions never count)."""
    lead = x.ndim - nsp
    return [max((out[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1 - (x.shape[lead + i] + 2 * p[i]), 0)
            for i in range(nsp)]


def _pad_spatial(x, nsp: int, lo, hi, value):
    if not any(lo) and not any(hi):
        return x
    config = [(0, 0, 0)] * (x.ndim - nsp) + [(a, b, 0) for a, b in zip(lo, hi, strict=True)]
    return prims.pad(x, value, config)


def _windows(padded, nsp: int, k, s, d, out):
    """Per kernel offset, the strided slice of ``padded`` (already padded) of the
    output's shape that offset contributes."""
    lead = padded.ndim - nsp
    for offs in itertools.product(*(range(ki) for ki in k)):
        starts = (0,) * lead + tuple(o * di for o, di in zip(offs, d, strict=True))
        ends = tuple(padded.shape[:lead]) + tuple(st + (o - 1) * si + 1
                                                  for st, o, si in zip(starts[lead:], out, s, strict=True))
        yield prims.slice_prim(padded, starts, ends, (1,) * lead + tuple(s))


def _pool_params(input, nsp, kernel_size, stride, padding, dilation, ceil_mode):
    k = ntuple(kernel_size, nsp)
    s = ntuple(stride, nsp) if stride not in (None, [], ()) else k
    p, d = ntuple(padding, nsp), ntuple(dilation, nsp)
    for i in range(nsp):
        check(k[i] > 0 and s[i] > 0 and d[i] > 0, lambda: "pooling: kernel size, stride and dilation must be > 0")
        check(2 * p[i] <= k[i], lambda: f"pad should be at most half of effective kernel size, but got pad={p[i]}, "
                                        f"kernel_size={k[i]}")
    out = tuple(_pool_out_size(input.shape[input.ndim - nsp + i], k[i], s[i], p[i], d[i], ceil_mode)
                for i in range(nsp))
    check(all(o > 0 for o in out), lambda: f"pooling: output size {out} is too small")
    return k, s, p, d, out


def _first_max(best, w):
    """``maximum`` keeping the earlier window element on ties (and NaN as ATen
    does), so the gradient goes to the first maximum like eager's, not half to each."""
    take = prims.gt(w, best)
    if dtypes.is_float(w.dtype):
        take = prims.logical_or(take, prims.isnan(w))
    return prims.where(take, w, best)


def _max_pool(input, nsp, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    decomposable(not return_indices, lambda: "max pooling with return_indices=True is not decomposed")
    x, batched = _batched(input, nsp)
    k, s, p, d, out = _pool_params(x, nsp, kernel_size, stride, padding, dilation, ceil_mode)
    low = -math.inf if dtypes.is_float(x.dtype) else torch.iinfo(x.dtype).min
    extra = _extra(x, nsp, k, s, p, d, out)
    padded = _pad_spatial(x, nsp, p, [pi + e for pi, e in zip(p, extra, strict=True)], low)
    result = None
    for w in _windows(padded, nsp, k, s, d, out):
        result = w if result is None else _first_max(result, w)
    return result if batched else shapes.squeeze(result, 0)


def _avg_pool(input, nsp, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    check(dtypes.is_inexact(input.dtype) or input.dtype is torch.int64,
          lambda: f"avg pooling is not implemented for {input.dtype}")
    decomposable(dtypes.is_inexact(input.dtype), lambda: "integer avg pooling is not decomposed")
    x, batched = _batched(input, nsp)
    if x.dtype in (torch.float16, torch.bfloat16):       # accumulate in float32, as ATen does
        x = convert(x, torch.float32)
    ones = (1,) * nsp
    k, s, p, _, out = _pool_params(x, nsp, kernel_size, stride, padding, ones, ceil_mode)
    extra = _extra(x, nsp, k, s, p, ones, out)
    padded = _pad_spatial(x, nsp, p, [pi + e for pi, e in zip(p, extra, strict=True)], 0)
    total = None
    for w in _windows(padded, nsp, k, s, ones, out):
        total = w if total is None else prims.add(total, w)
    if divisor_override:
        result = prims.div(total, float(divisor_override))
    else:
        # the divisor per output position: the window clipped to input+padding
        # (count_include_pad) or to the input, counted by pooling a mask the same way
        spatial = tuple(x.shape[x.ndim - nsp:])
        mask = prims.full(spatial, 1.0, device=x.device, dtype=x.dtype)
        mask = _pad_spatial(mask, nsp, p, p, 1.0 if count_include_pad else 0.0)
        mask = _pad_spatial(mask, nsp, (0,) * nsp, extra, 0.0)
        counts = None
        for w in _windows(mask, nsp, k, s, ones, out):
            counts = w if counts is None else prims.add(counts, w)
        result = ew.div(total, counts)
    result = convert(result, input.dtype)
    return result if batched else shapes.squeeze(result, 0)


@torchsymbol(F.max_pool1d, torch.max_pool1d)
def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool(input, 1, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


@torchsymbol(F.max_pool2d, torch.max_pool2d)
def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool(input, 2, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


@torchsymbol(F.max_pool3d, torch.max_pool3d)
def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool(input, 3, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


@torchsymbol(F.avg_pool1d)
def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool(input, 1, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@torchsymbol(F.avg_pool2d)
def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(input, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@torchsymbol(F.avg_pool3d)
def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(input, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@torchsymbol(F.unfold)
def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """im2col: every kernel offset's strided slice (as in pooling), stacked
    after the channel dim: (N, C * prod(kernel), L)."""
    check(input.ndim in (3, 4), lambda: f"Input Error: Only 3D or 4D input Tensors are supported (got {input.ndim}D)")
    x, batched = _batched(input, 2)
    k, d, p, s = (ntuple(v, 2) for v in (kernel_size, dilation, padding, stride))
    out = tuple((x.shape[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2))
    check(all(o > 0 for o in out), lambda: f"unfold: the sliding blocks {out} of input {tuple(x.shape)} are empty")
    padded = _pad_spatial(x, 2, p, p, 0)
    cols = shapes.stack(list(_windows(padded, 2, k, s, d, out)), 2)
    n, c = x.shape[:2]
    result = shapes.reshape(cols, n, c * k[0] * k[1], out[0] * out[1])
    return result if batched else shapes.squeeze(result, 0)


# --- adaptive average pooling ----------------------------------------------------------------------

def _window_max(x, d: int, keepdim: bool = False):
    """The max over dim ``d`` taken at the first maximum (``argmax``), so the
    gradient goes to that element, as eager's adaptive max pooling does."""
    index = prims.argmax(x, d)
    index = prims.reshape(index, x.shape[:d] + (1,) + x.shape[d + 1:])
    picked = prims.take_along_axis(x, index, d)
    return picked if keepdim else prims.squeeze(picked, (d,))


def _adaptive_dim(x, d: int, out: int, reduce: str):
    """Reduce ``x`` over windows [floor(i*n/out), ceil((i+1)*n/out)) of dim ``d``
    (separable: the N-d adaptive average or max is this along each dim)."""
    n = x.shape[d]
    if n == out:
        return x
    if n % out == 0:
        y = prims.reshape(x, x.shape[:d] + (out, n // out) + x.shape[d + 1:])
        return _window_max(y, d + 1) if reduce == "max" else prims.div(prims.sum(y, (d + 1,)), float(n // out))
    decomposable(out <= 64, lambda: f"adaptive pooling to {out} uneven windows is not decomposed")
    parts = []
    for i in range(out):
        lo, hi = (i * n) // out, -(-((i + 1) * n) // out)
        window = shapes.slice_dim(x, d, lo, hi)
        part = _window_max(window, d, keepdim=True) if reduce == "max" else \
            shapes.unsqueeze(prims.div(prims.sum(window, (d,)), float(hi - lo)), d)
        parts.append(part)
    return prims.cat(parts, d)


def _adaptive_even_max(x, nsp: int, sizes: tuple):
    """Adaptive max over even windows in one step: each output's window
    flattened row-major, so ties go to the first element as in eager (the
    dim-by-dim form would pick the first along each dim separately)."""
    lead = x.shape[:x.ndim - nsp]
    split = lead
    for n, o in zip(x.shape[x.ndim - nsp:], sizes, strict=True):
        split += (o, n // o)
    y = prims.reshape(x, split)
    nl = len(lead)
    perm = tuple(range(nl)) + tuple(nl + 2 * i for i in range(nsp)) + tuple(nl + 2 * i + 1 for i in range(nsp))
    y = prims.permute(y, perm)
    window = math.prod(split[nl + 2 * i + 1] for i in range(nsp))
    y = prims.reshape(y, lead + tuple(sizes) + (window,))
    return _window_max(y, y.ndim - 1)


def _adaptive(input, nsp: int, output_size, reduce: str):
    sizes = ntuple(output_size, nsp)
    spatial = input.shape[input.ndim - nsp:]
    full = tuple(n if o is None else o for n, o in zip(spatial, sizes, strict=True))
    if reduce == "max" and nsp > 1 and all(o > 0 and n % o == 0 for n, o in zip(spatial, full, strict=True)):
        return _adaptive_even_max(input, nsp, full)
    low = reduce == "avg" and input.dtype in (torch.float16, torch.bfloat16)
    out = convert(input, torch.float32) if low else input      # accumulate in float32, as ATen does
    for i, o in enumerate(sizes):
        d = input.ndim - nsp + i
        out = _adaptive_dim(out, d, input.shape[d] if o is None else o, reduce)
    return convert(out, input.dtype) if low else out


def _adaptive_avg(input, nsp: int, output_size):
    check(dtypes.is_inexact(input.dtype), lambda: f"adaptive_avg_pool: not implemented for {input.dtype}")
    return _adaptive(input, nsp, output_size, "avg")


def _adaptive_max(input, nsp: int, output_size, return_indices: bool):
    decomposable(not return_indices, lambda: "adaptive max pooling with return_indices=True is not decomposed")
    return _adaptive(input, nsp, output_size, "max")


@torchsymbol(F.adaptive_max_pool1d)
def adaptive_max_pool1d(input, output_size, return_indices: bool = False):
    return _adaptive_max(input, 1, output_size, return_indices)


@torchsymbol(F.adaptive_max_pool2d)
def adaptive_max_pool2d(input, output_size, return_indices: bool = False):
    return _adaptive_max(input, 2, output_size, return_indices)


@torchsymbol(F.adaptive_max_pool3d)
def adaptive_max_pool3d(input, output_size, return_indices: bool = False):
    return _adaptive_max(input, 3, output_size, return_indices)


@torchsymbol(F.adaptive_avg_pool1d, torch.adaptive_avg_pool1d)
def adaptive_avg_pool1d(input, output_size):
    return _adaptive_avg(input, 1, output_size)


@torchsymbol(F.adaptive_avg_pool2d)
def adaptive_avg_pool2d(input, output_size):
    return _adaptive_avg(input, 2, output_size)


@torchsymbol(F.adaptive_avg_pool3d)
def adaptive_avg_pool3d(input, output_size):
    return _adaptive_avg(input, 3, output_size)


# --- interpolation ---------------------------------------------------------------------------------

_LINEAR = {"linear": 1, "bilinear": 2, "trilinear": 3}


def _output_sizes(input, nsp: int, size, scale_factor, recompute_scale_factor):
    """(output sizes, the scales ATen receives: None where it derives in/out)."""
    check((size is None) != (scale_factor is None), lambda: "only one of size or scale_factor should be defined")
    spatial = input.shape[2:]
    if size is not None:
        return ntuple(size, nsp), (None,) * nsp
    factors = tuple(float(f) for f in ntuple(scale_factor, nsp))
    out = tuple(math.floor(float(n) * f) for n, f in zip(spatial, factors, strict=True))
    return out, ((None,) * nsp if recompute_scale_factor else factors)


def _scale(n_in: int, n_out: int, factor, dtype: torch.dtype) -> float:
    """ATen's compute_scales_value, rounded to the kernel's compute dtype."""
    value = 1.0 / factor if factor is not None and factor > 0 else n_in / n_out
    return torch.tensor(value, dtype=dtype).item()


def _positions(n: int, device, dtype):
    return prims.iota(n, start=0, step=1, device=device, dtype=dtype)


def _nearest_index(x, n_in: int, n_out: int, factor, exact: bool):
    """ATen's nearest_idx / nearest_exact_idx as prims on ``iota``."""
    dev = x.device
    if not exact and n_out == n_in:
        return None
    if exact:       # floorf((dst + 0.5) * scale): the product is in double
        src = ew.mul(ew.add(_positions(n_out, dev, torch.float64), 0.5), _scale(n_in, n_out, factor, torch.float32))
        src = convert(src, torch.float32)
    else:           # floorf(dst * scale) in float
        src = ew.mul(_positions(n_out, dev, torch.float32), _scale(n_in, n_out, factor, torch.float32))
    idx = convert(ew.floor(src), torch.int64)
    return ew.clamp(idx, None, n_in - 1)


def _linear_dim(x, d: int, n_out: int, factor, align_corners: bool):
    """Linear interpolation along dim ``d`` (ATen's compute_indices_weights_linear)."""
    n_in, dev, opmath = x.shape[d], x.device, x.dtype
    pos = _positions(n_out, dev, torch.float64)
    if align_corners:
        scale = _scale(n_in - 1, n_out - 1, None, opmath) if n_out > 1 else 0.0
        src = convert(ew.mul(pos, scale), opmath)
    else:
        scale = _scale(n_in, n_out, factor, opmath)
        src = convert(ew.clamp(ew.sub(ew.mul(ew.add(pos, 0.5), scale), 0.5), 0.0, None), opmath)
    i0 = ew.clamp(convert(ew.floor(src), torch.int64), None, n_in - 1)
    lam = ew.clamp(ew.sub(src, convert(i0, opmath)), 0.0, 1.0)
    i1 = ew.clamp(ew.add(i0, 1), None, n_in - 1)
    lam = prims.broadcast_in_dim(lam, x.shape[:d] + (n_out,) + x.shape[d + 1:], (d,))
    lo, hi = prims.index_select(x, d, i0), prims.index_select(x, d, i1)
    return ew.add(ew.mul(lo, ew.rsub(lam, 1.0)), ew.mul(hi, lam))


@torchsymbol(F.interpolate)
def interpolate(input, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                recompute_scale_factor=None, antialias: bool = False):
    nsp = input.ndim - 2
    decomposable(not antialias and (mode in ("nearest", "nearest-exact") and 1 <= nsp <= 3
                                    or _LINEAR.get(mode) == nsp),
                 lambda: f"interpolate(mode={mode!r}, antialias={antialias}) on a {input.ndim}-d input "
                         "is not decomposed")
    decomposable(align_corners is None or mode in _LINEAR, lambda: "align_corners with a nearest mode")
    out, factors = _output_sizes(input, nsp, size, scale_factor, recompute_scale_factor)
    check(all(o > 0 for o in out), lambda: f"interpolate: output size {out} must be positive")
    x = input
    if mode in _LINEAR:
        if x.dtype in (torch.float16, torch.bfloat16):
            x = convert(x, torch.float32)
        for i in range(nsp):
            x = _linear_dim(x, 2 + i, out[i], factors[i], bool(align_corners))
        return convert(x, input.dtype)
    for i in range(nsp):
        idx = _nearest_index(x, x.shape[2 + i], out[i], factors[i], mode == "nearest-exact")
        if idx is not None:
            x = prims.index_select(x, 2 + i, idx)
    return x
