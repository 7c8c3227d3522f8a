"""Torch ops written in terms of other torch-language ops (no prims of their
own): reflected operators as torch callables, ``*_copy`` variants of views,
real-tensor conjugation no-ops, atleast_nd, h/v/dsplit, diff, trace, kron,
cross, distances and similarities, pixel/channel shuffles, logcumsumexp."""
from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from thunderlite.core import dtypes, prims
from thunderlite.core.prims import check
from thunderlite.core.symint import is_int
from thunderlite.torch.opaque import opaque_symbol_for
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.ops import (
    linalg,  # registers matmul, reflected below
    shapes,
)
from thunderlite.torch.ops import reductions as red
from thunderlite.torch.ops.data_dependent import check_all, repeat_interleave_tensor
from thunderlite.torch.registry import all_symbols, decomposable, register_torch_callable, torchsymbol
from thunderlite.torch.utils import broadcast, canonical_dim, convert, is_tensor

T = torch.Tensor

# ``torch.Tensor.__radd__(x, 2)`` is ``2 + x`` (the OpInfos call the dunders directly).
for _dunder, _name in [("__radd__", "add"), ("__rsub__", "sub"), ("__rmul__", "mul"),
                       ("__rfloordiv__", "floor_divide"), ("__rmod__", "remainder"),
                       ("__rpow__", "pow"), ("__rmatmul__", "matmul"), ("__rand__", "bitwise_and"),
                       ("__ror__", "bitwise_or"), ("__rxor__", "bitwise_xor"), ("__rlshift__", "bitwise_left_shift"),
                       ("__rrshift__", "bitwise_right_shift")]:
    register_torch_callable(getattr(T, _dunder), ew.reflected(all_symbols()[_name]))
for _dunder in {T.__rtruediv__, T.__rdiv__}:    # one function under two names in torch
    register_torch_callable(_dunder, ew.rtruediv)


def _copy_of(view_name: str):
    view = all_symbols()[view_name]

    def decomposition(a, *args, **kwargs):
        out = view(a, *args, **kwargs)
        return tuple(shapes.clone(o) for o in out) if isinstance(out, tuple) else shapes.clone(out)
    decomposition.__name__ = view_name + "_copy"
    return decomposition


for _view in ["expand", "permute", "t", "transpose", "squeeze", "unsqueeze", "diagonal", "narrow", "unbind",
              "view", "split_with_sizes"]:
    torchsymbol(getattr(torch, _view + "_copy"), name=_view + "_copy")(_copy_of(_view))
register_torch_callable(torch.split_with_sizes, all_symbols()["split_with_sizes"])
register_torch_callable(torch.unsafe_split, all_symbols()["split"])
register_torch_callable(torch.unsafe_chunk, all_symbols()["chunk"])


@torchsymbol(torch.alias_copy)
def alias_copy(a):
    return shapes.clone(a)


def _real_only(a, name: str) -> None:
    decomposable(not dtypes.is_complex(a.dtype), lambda: f"{name} of a complex tensor is not decomposed")


def _real_identity(name: str):
    """The decomposition of ``name``, an op that returns a real input itself
    (``conj_physical`` too, though its schema does not say so)."""
    def decomposition(a):
        _real_only(a, name)
        return a
    decomposition.__name__ = name
    return decomposition


conj, resolve_conj, resolve_neg, conj_physical = (
    torchsymbol(getattr(torch, n), getattr(T, n), method_name=n)(_real_identity(n))
    for n in ("conj", "resolve_conj", "resolve_neg", "conj_physical"))


_ATLEAST = {(1, 0): lambda s: (1,), (2, 0): lambda s: (1, 1), (2, 1): lambda s: (1, *s),
            (3, 0): lambda s: (1, 1, 1), (3, 1): lambda s: (1, *s, 1), (3, 2): lambda s: (*s, 1)}


def _atleast(n: int, tensors):
    def one(a):
        return a if a.ndim >= n else shapes.reshape(a, *_ATLEAST[(n, a.ndim)](a.shape))
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        return tuple(one(a) for a in tensors[0])
    return one(tensors[0]) if len(tensors) == 1 else tuple(one(a) for a in tensors)


@torchsymbol(torch.atleast_1d)
def atleast_1d(*tensors):
    return _atleast(1, tensors)


@torchsymbol(torch.atleast_2d)
def atleast_2d(*tensors):
    return _atleast(2, tensors)


@torchsymbol(torch.atleast_3d)
def atleast_3d(*tensors):
    return _atleast(3, tensors)


def _nsplit(a, sections, dim: int, name: str, min_ndim: int):
    check(a.ndim >= min_ndim, lambda: f"torch.{name} requires a tensor with at least {min_ndim} dimension, "
                                      f"but got a tensor with {a.ndim} dimensions!")
    if isinstance(sections, int):
        check(a.shape[dim] % sections == 0, lambda: f"torch.{name} attempted to split along dimension {dim}, but "
                                                    f"the size of the dimension {a.shape[dim]} is not divisible "
                                                    f"by the split_size {sections}!")
    return shapes.tensor_split(a, sections, dim)


@torchsymbol(torch.hsplit, T.hsplit, method_name="hsplit")
def hsplit(a, sections):
    return _nsplit(a, sections, 1 if a.ndim > 1 else 0, "hsplit", 1)


@torchsymbol(torch.vsplit, T.vsplit, method_name="vsplit")
def vsplit(a, sections):
    return _nsplit(a, sections, 0, "vsplit", 2)


@torchsymbol(torch.dsplit, T.dsplit, method_name="dsplit")
def dsplit(a, sections):
    return _nsplit(a, sections, 2, "dsplit", 3)


@torchsymbol(torch.diff, T.diff, method_name="diff")
def diff(input, n: int = 1, dim: int = -1, prepend=None, append=None):
    d = canonical_dim(dim, input.ndim)
    parts = [p for p in (prepend, input, append) if p is not None]
    x = shapes.cat(parts, d) if len(parts) > 1 else input
    for _ in range(n):
        size = x.shape[d]
        if size == 0:
            break
        hi, lo = shapes.narrow(x, d, 1, size - 1), shapes.narrow(x, d, 0, size - 1)
        x = ew.logical_xor(hi, lo) if x.dtype is torch.bool else ew.sub(hi, lo)
    return x


@torchsymbol(torch.trace, T.trace, method_name="trace")
def trace(input):
    check(input.ndim == 2, lambda: "trace: expected a matrix")
    return red.sum(shapes.diagonal(input))


@torchsymbol(torch.kron, T.kron, method_name="kron")
def kron(a, b):
    nd = max(a.ndim, b.ndim)
    a = shapes.reshape(a, *((1,) * (nd - a.ndim) + a.shape))
    b = shapes.reshape(b, *((1,) * (nd - b.ndim) + b.shape))
    a2 = shapes.reshape(a, *[s for d in a.shape for s in (d, 1)])
    b2 = shapes.reshape(b, *[s for d in b.shape for s in (1, d)])
    return shapes.reshape(ew.mul(a2, b2), *[x * y for x, y in zip(a.shape, b.shape, strict=True)])


def _cross(a, b, dim):
    a, b = broadcast(a, b)
    d = canonical_dim(dim, a.ndim)
    check(a.shape[d] == 3, lambda: f"linalg.cross: inputs dimension {dim} must have length 3. Got {a.shape[d]}")
    x = [shapes.select(a, d, i) for i in range(3)]
    y = [shapes.select(b, d, i) for i in range(3)]
    parts = [ew.sub(ew.mul(x[1], y[2]), ew.mul(x[2], y[1])), ew.sub(ew.mul(x[2], y[0]), ew.mul(x[0], y[2])),
             ew.sub(ew.mul(x[0], y[1]), ew.mul(x[1], y[0]))]
    return shapes.stack(parts, d)


@torchsymbol(torch.linalg.cross)
def linalg_cross(input, other, *, dim: int = -1):
    return _cross(input, other, dim)


@torchsymbol(torch.cross, T.cross, method_name="cross")
def cross(input, other, dim=None):
    if dim is None:     # deprecated default: the first dim of size 3
        a, _ = broadcast(input, other)
        dim = next((i for i, s in enumerate(a.shape) if s == 3), -1)
    return _cross(input, other, dim)


@torchsymbol(torch.linalg.vecdot)
def vecdot(x, y, *, dim: int = -1):
    _real_only(x, "vecdot")
    return red.sum(ew.mul(x, y), dim)


def _not_p0(p) -> None:
    """The 0-"norm" counts nonzeros: eager's result still requires grad (with zero
    gradients), which a decomposition through a comparison cannot reproduce."""
    decomposable(p != 0, lambda: "a p=0 distance is not decomposed")


@torchsymbol(torch.dist, T.dist, method_name="dist")
def dist(input, other, p=2):
    _not_p0(p)
    return red.vector_norm(ew.sub(input, other), p)


@torchsymbol(F.pairwise_distance, torch.pairwise_distance)
def pairwise_distance(x1, x2, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False):
    return red.vector_norm(ew.add(ew.sub(x1, x2), eps), p, -1, keepdim)


@torchsymbol(F.cosine_similarity, torch.cosine_similarity)
def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8):
    x1, x2 = broadcast(x1, x2)
    n1 = ew.clamp_min(red.vector_norm(x1, 2, dim, True), eps)
    n2 = ew.clamp_min(red.vector_norm(x2, 2, dim, True), eps)
    return red.sum(ew.mul(ew.div(x1, n1), ew.div(x2, n2)), dim)


@torchsymbol(F.pixel_shuffle, torch.pixel_shuffle)
def pixel_shuffle(input, upscale_factor: int):
    r = upscale_factor
    *lead, c, h, w = input.shape
    check(c % (r * r) == 0, lambda: f"pixel_shuffle expects its input's 'channel' dimension to be divisible by "
                                    f"the square of upscale_factor, but input.size(-3)={c} is not divisible by {r * r}")
    n = len(lead)
    x = shapes.reshape(input, *lead, c // (r * r), r, r, h, w)
    x = shapes.permute(x, *range(n), n, n + 3, n + 1, n + 4, n + 2)
    return shapes.reshape(x, *lead, c // (r * r), h * r, w * r)


@torchsymbol(F.pixel_unshuffle, torch.pixel_unshuffle)
def pixel_unshuffle(input, downscale_factor: int):
    r = downscale_factor
    *lead, c, h, w = input.shape
    check(h % r == 0 and w % r == 0, lambda: "pixel_unshuffle expects height and width to be divisible by "
                                             "downscale_factor")
    n = len(lead)
    x = shapes.reshape(input, *lead, c, h // r, r, w // r, r)
    x = shapes.permute(x, *range(n), n, n + 2, n + 4, n + 1, n + 3)
    return shapes.reshape(x, *lead, c * r * r, h // r, w // r)


@torchsymbol(F.channel_shuffle, torch.channel_shuffle)
def channel_shuffle(input, groups: int):
    n, c, *rest = input.shape
    check(c % groups == 0, lambda: f"Number of channels must be divisible by groups. Got {c} channels and "
                                   f"{groups} groups.")
    x = shapes.reshape(input, n, groups, c // groups, *rest)
    return shapes.reshape(shapes.transpose(x, 1, 2), n, c, *rest)


@torchsymbol(torch.msort, T.msort, method_name="msort")
def msort(input):
    return red.sort(input, 0)[0]


@torchsymbol(torch.logcumsumexp, T.logcumsumexp, method_name="logcumsumexp")
def logcumsumexp(input, dim: int):
    decomposable(dtypes.is_float(input.dtype), lambda: "logcumsumexp of a non-float tensor is not decomposed")
    if input.ndim == 0:
        return input
    m = red.amax(input, dim, True)
    m = ew.where(ew.isinf(m), 0.0, m)
    return ew.add(ew.log(red.cumsum(ew.exp(ew.sub(input, m)), dim)), m)


@torchsymbol(torch.repeat_interleave, T.repeat_interleave, method_name="repeat_interleave")
def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    """Integer repeats (``k.repeat_interleave(n_rep, dim=1)`` in grouped-query
    attention): unsqueeze, expand, merge. Tensor counts: the indices they give
    (a length known at run time, torch/ops/data_dependent.py), then a gather."""
    if repeats is None or is_tensor(repeats):
        return repeat_interleave_tensor(input, repeats, dim, output_size)
    decomposable(is_int(repeats), lambda: f"repeat_interleave with repeats of type {type(repeats).__name__}")
    x = shapes.reshape(input, -1) if dim is None else input
    d = 0 if dim is None else canonical_dim(dim, x.ndim)
    shape = x.shape[:d + 1] + (repeats,) + x.shape[d + 1:]
    out = shapes.expand(shapes.unsqueeze(x, d + 1), *shape)
    return shapes.reshape(out, *x.shape[:d], x.shape[d] * repeats, *x.shape[d + 1:])


@torchsymbol(torch.diag, T.diag, method_name="diag")
def diag(input, diagonal: int = 0):
    check(input.ndim in (1, 2), lambda: f"diag(): Supports 1D or 2D tensors. Got {input.ndim}D")
    if input.ndim == 2:
        return shapes.clone(shapes.diagonal(input, diagonal))
    k, n = diagonal, input.shape[0] + abs(diagonal)
    rows = prims.broadcast_in_dim(prims.iota(n, start=0, step=1, device=input.device, dtype=torch.int64),
                                  (n, n), (0,))
    cols = prims.broadcast_in_dim(prims.iota(n, start=0, step=1, device=input.device, dtype=torch.int64),
                                  (n, n), (1,))
    on_diagonal = ew.eq(ew.add(rows, k), cols)
    values = prims.pad(input, False if input.dtype is torch.bool else 0, [(0, abs(k), 0)])
    values = prims.broadcast_in_dim(values, (n, n), (0,) if k >= 0 else (1,))
    return ew.where(on_diagonal, values, False if input.dtype is torch.bool else 0)


def linalg_norm(input, ord=None, dim=None, keepdim: bool = False, *, dtype=None):
    """``torch.linalg.norm`` records ``vector_norm`` itself for vector norms and the
    Frobenius norm (so vector_norm's own gradient rule, zero at zero, applies);
    other matrix norms are one opaque call."""
    dims = (dim,) if isinstance(dim, int) else dim
    matrix = (dims is not None and len(dims) == 2) or (dims is None and ord is not None and input.ndim == 2)
    if ord is None or (matrix and ord == "fro"):
        return red.vector_norm(input, 2, dim, keepdim, dtype=dtype)
    if not matrix and not isinstance(ord, str):
        return red.vector_norm(input, ord, dim, keepdim, dtype=dtype)
    return opaque_symbol_for(torch.linalg.norm)(input, ord, dim, keepdim, dtype=dtype)


register_torch_callable(torch.linalg.norm, linalg_norm)


@torchsymbol(torch.fill)
def fill(input, value):
    if is_tensor(value):
        check(value.ndim == 0, lambda: f"fill only supports 0-dimension value tensor but got tensor with "
                                       f"{value.ndim} dimensions.")
        value = convert(value, input.dtype)
    # a where on an all-true mask: like eager, the result is connected to input (zero gradient)
    everywhere = prims.full(input.shape, True, device=input.device, dtype=torch.bool)
    return ew.where(everywhere, value, input)


@torchsymbol(torch.meshgrid)
def meshgrid(*tensors, indexing: str | None = None):
    ts = list(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else list(tensors)
    indexing = "ij" if indexing is None else indexing
    check(indexing in ("ij", "xy"), lambda: f"torch.meshgrid: indexing must be one of 'xy' or 'ij', got {indexing}")
    ts = [shapes.reshape(t, -1) for t in ts]
    swap = indexing == "xy" and len(ts) >= 2
    order = [1, 0, *range(2, len(ts))] if swap else list(range(len(ts)))
    shape = tuple(ts[i].shape[0] for i in order)
    return tuple(prims.broadcast_in_dim(t, shape, (order.index(k),)) for k, t in enumerate(ts))


@torchsymbol(torch.tensordot)
def tensordot(a, b, dims=2, out=None):
    check(out is None, lambda: "tensordot: out= is not supported")
    if isinstance(dims, int):
        da, db = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        da, db = ([d] if isinstance(d, int) else list(d) for d in dims)
    da, db = [canonical_dim(d, a.ndim) for d in da], [canonical_dim(d, b.ndim) for d in db]
    check(len(da) == len(db), lambda: "both dimension lists should have same length")
    # a contracted dim of size 1 broadcasts against the other side's (as in eager):
    # the other side is summed over it first
    for i, j in zip(da, db, strict=True):
        if a.shape[i] != b.shape[j]:
            check(1 in (a.shape[i], b.shape[j]), lambda: f"contracted dimensions need to match, but first has "
                                                         f"size {a.shape[i]} in dim {i} and second has size "
                                                         f"{b.shape[j]} in dim {j}")
            if a.shape[i] == 1:
                b = red.sum(b, j, True)
            else:
                a = red.sum(a, i, True)
    fa, fb = [d for d in range(a.ndim) if d not in da], [d for d in range(b.ndim) if d not in db]
    k = 1
    for d in da:
        k *= a.shape[d]
    a2 = shapes.reshape(shapes.permute(a, *fa, *da), -1, k)
    b2 = shapes.reshape(shapes.permute(b, *db, *fb), k, -1)
    out_shape = [a.shape[d] for d in fa] + [b.shape[d] for d in fb]
    return shapes.reshape(linalg.matmul(a2, b2), *out_shape)


@torchsymbol(torch.cdist)
def cdist(x1, x2, p: float = 2.0, compute_mode: str = "use_mm_for_euclid_dist_if_necessary"):
    _not_p0(p)
    diff = ew.sub(shapes.unsqueeze(x1, -2), shapes.unsqueeze(x2, -3))
    return red.vector_norm(diff, p, -1)


@torchsymbol(torch.isin)
def isin(elements, test_elements, *, assume_unique: bool = False, invert: bool = False):
    test = shapes.reshape(test_elements, -1) if is_tensor(test_elements) else test_elements
    if not is_tensor(elements) or not is_tensor(test):
        decomposable(False, lambda: "isin with a scalar argument is not decomposed")
    hit = red.any(ew.eq(shapes.unsqueeze(elements, -1), test), -1)
    return ew.logical_not(hit) if invert else hit


def _count_below(sorted_seq, values, right: bool, out_int32: bool):
    """For each value, how many entries of the (last dim of) sorted sequence lie
    below it (``<=`` with right=True): its insertion index."""
    cmp = ew.le if right else ew.lt
    below = cmp(shapes.unsqueeze(sorted_seq, -2), shapes.unsqueeze(values, -1))
    counts = red.sum(below, -1, dtype=torch.int32 if out_int32 else torch.int64)
    return shapes.reshape(counts, *values.shape)


@torchsymbol(torch.bucketize)
def bucketize(input, boundaries, *, out_int32: bool = False, right: bool = False):
    decomposable(is_tensor(input), lambda: "bucketize of a scalar is not decomposed")
    return _count_below(boundaries, input, right, out_int32)


@torchsymbol(torch.searchsorted)
def searchsorted(sorted_sequence, values, *, out_int32: bool = False, right: bool = False, side=None,
                 sorter=None, out=None):
    decomposable(sorter is None and out is None and is_tensor(values),
                 lambda: "searchsorted(sorter=) is not decomposed")
    right = right or side == "right"
    if sorted_sequence.ndim > 1:
        check(sorted_sequence.shape[:-1] == values.shape[:-1],
              lambda: "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions "
                      "of boundaries tensor and input value tensor must match")
    return _count_below(sorted_sequence, values, right, out_int32)


@torchsymbol(torch.take, T.take, method_name="take")
def take(input, index):
    flat = shapes.reshape(input, -1)
    idx = shapes.reshape(index, -1)
    idx = ew.where(ew.lt(idx, 0), ew.add(idx, flat.shape[0]), idx)
    return shapes.reshape(prims.index_select(flat, 0, idx), *index.shape)


@torchsymbol(torch.index_fill, T.index_fill, method_name="index_fill")
def index_fill(input, dim: int, index, value):
    d = canonical_dim(dim, input.ndim)
    n = input.shape[d] if input.ndim else 1
    pos = prims.iota(n, start=0, step=1, device=input.device, dtype=torch.int64)
    idx = shapes.reshape(index, -1)
    idx = ew.where(ew.lt(idx, 0), ew.add(idx, n), idx)
    mask = red.any(ew.eq(shapes.unsqueeze(pos, 1), shapes.unsqueeze(idx, 0)), 1)
    if input.ndim:
        mask = prims.broadcast_in_dim(mask, input.shape, (d,))
    else:
        mask = prims.reshape(mask, ())
    fill = convert(value, input.dtype) if is_tensor(value) else value
    return ew.where(mask, fill, input)


@torchsymbol(torch.select_scatter)
def select_scatter(input, src, dim: int, index: int):
    d = canonical_dim(dim, input.ndim)
    i = index + input.shape[d] if index < 0 else index
    parts = [shapes.narrow(input, d, 0, i), shapes.unsqueeze(convert(src, input.dtype), d),
             shapes.narrow(input, d, i + 1, input.shape[d] - i - 1)]
    return shapes.cat(parts, d)


@torchsymbol(torch.slice_scatter)
def slice_scatter(input, src, dim: int = 0, start=None, end=None, step: int = 1):
    decomposable(step == 1, lambda: "slice_scatter with step > 1 is not decomposed")
    d = canonical_dim(dim, input.ndim)
    n = input.shape[d]
    lo = 0 if start is None else max(0, min(n, start + n if start < 0 else start))
    hi = n if end is None else max(lo, min(n, end + n if end < 0 else end))
    parts = [shapes.narrow(input, d, 0, lo), convert(src, input.dtype), shapes.narrow(input, d, hi, n - hi)]
    return shapes.cat(parts, d)


@torchsymbol(torch.diagflat, T.diagflat, method_name="diagflat")
def diagflat(input, offset: int = 0):
    return diag(shapes.reshape(input, -1), offset)


@torchsymbol(torch.vdot, T.vdot, method_name="vdot")
def vdot(input, other):
    _real_only(input, "vdot")
    check(input.ndim == 1 and other.ndim == 1, lambda: "1D tensors expected")
    return red.sum(ew.mul(input, other))


@torchsymbol(torch.linalg.diagonal)
def linalg_diagonal(A, *, offset: int = 0, dim1: int = -2, dim2: int = -1):
    return shapes.diagonal(A, offset, dim1, dim2)


@torchsymbol(torch.linalg.vander)
def vander(x, N=None):
    x = shapes.reshape(x, 1) if x.ndim == 0 else x
    n = x.shape[-1] if N is None else N
    powers = prims.iota(n, start=0, step=1, device=x.device, dtype=torch.int64)
    return ew.pow(shapes.unsqueeze(x, -1), powers)


@torchsymbol(torch.linalg.matrix_power, torch.matrix_power, T.matrix_power, method_name="matrix_power")
def matrix_power(A, n: int):
    decomposable(n >= 1, lambda: "matrix_power with an exponent < 1 (identity or inverse) is not decomposed")
    check(A.ndim >= 2 and A.shape[-1] == A.shape[-2], lambda: "matrix_power: expected square matrices")
    out = A
    for _ in range(n - 1):
        out = linalg.matmul(out, A)
    return out


@torchsymbol(torch.linalg.multi_dot)
def multi_dot(tensors, *, out=None):
    check(len(tensors) >= 2, lambda: "multi_dot(): expected at least 2 tensors")
    result = tensors[0]
    for t in tensors[1:]:
        result = linalg.matmul(result, t)
    return result


@torchsymbol(torch.linalg.matrix_norm)
def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim: bool = False, *, dtype=None, out=None):
    """Frobenius, and the max/min absolute row or column sums (ord = +-1, +-inf)."""
    decomposable(ord in ("fro", 1, -1, math.inf, -math.inf), lambda: f"matrix_norm(ord={ord!r}) needs an SVD")
    x = convert(A, dtype) if dtype is not None else A
    if ord == "fro":
        return red.vector_norm(x, 2, dim, keepdim)
    d0, d1 = (canonical_dim(d, x.ndim) for d in dim)
    sum_dim, max_dim = (d1, d0) if abs(ord) == math.inf else (d0, d1)
    sums = red.sum(ew.abs(x), sum_dim, True)
    out = (red.amax if ord > 0 else red.amin)(sums, max_dim, True)
    return out if keepdim else shapes.squeeze(out, tuple(sorted((d0, d1))))


@torchsymbol(torch.trapezoid, torch.trapz)
def trapezoid(y, x=None, *, dx=None, dim: int = -1):
    d = canonical_dim(dim, y.ndim)
    n = y.shape[d]
    if n == 0:
        return red.sum(y, d)
    avg = ew.add(shapes.narrow(y, d, 1, n - 1), shapes.narrow(y, d, 0, n - 1))
    if x is None or not is_tensor(x):
        step = (1 if dx is None else dx) if x is None else x
        return ew.mul(red.sum(avg, d), step / 2)
    decomposable(x.ndim == 1 or x.shape == y.shape, lambda: "trapezoid with a broadcast x is not decomposed")
    xd = d if x.ndim == y.ndim else 0
    m = x.shape[xd]
    widths = ew.sub(shapes.narrow(x, xd, 1, m - 1), shapes.narrow(x, xd, 0, m - 1))
    if x.ndim == 1 and y.ndim > 1:
        widths = prims.broadcast_in_dim(widths, avg.shape, (d,))
    return ew.div(red.sum(ew.mul(avg, widths), d), 2)


@torchsymbol(T.unfold, method_name="unfold")
def tensor_unfold(input, dimension: int, size: int, step: int):
    """Windows of ``size`` every ``step`` along a dim, as a new last dim: one
    index_select with indices start*step + offset."""
    d = canonical_dim(dimension, input.ndim)
    length = input.shape[d] if input.ndim else 1
    check(size <= length, lambda: f"maximum size for tensor at dimension {d} is {length} but size is {size}")
    check(step > 0, lambda: f"step is {step} but must be > 0")
    n = (length - size) // step + 1
    dev = input.device
    starts = prims.iota(n, start=0, step=step, device=dev, dtype=torch.int64)
    offsets = prims.iota(size, start=0, step=1, device=dev, dtype=torch.int64)
    idx = shapes.reshape(ew.add(shapes.unsqueeze(starts, 1), offsets), -1)
    x = input if input.ndim else shapes.reshape(input, 1)
    picked = prims.index_select(x, d, idx)
    picked = shapes.reshape(picked, *x.shape[:d], n, size, *x.shape[d + 1:])
    out = shapes.movedim(picked, d + 1, -1)
    return out if input.ndim else shapes.reshape(out, size)


# --- ops whose checks read values ---------------------------------------------------------------

@torchsymbol(torch.cov, T.cov, method_name="cov")
def cov(input, *, correction: int = 1, fweights=None, aweights=None):
    """ATen's cov (Correlation.cpp); its checks of the weights' values run with the program."""
    check(input.ndim <= 2, lambda: f"cov(): expected input to have two or fewer dimensions but got an input "
                                    f"with {input.ndim} dimensions")
    x = input if input.ndim == 2 else prims.reshape(input, (1, input.numel()))
    w = None
    if fweights is not None:
        check_all(ew.ge(fweights, 0), "cov(): fweights cannot be negative")
        w = fweights
    if aweights is not None:
        check_all(ew.ge(aweights, 0), "cov(): aweights cannot be negative")
        w = aweights if w is None else ew.mul(w, aweights)
    w_sum = x.shape[1] if w is None else red.sum(w)
    if w is not None and aweights is not None and correction != 0:
        norm = ew.sub(w_sum, ew.true_divide(ew.mul(red.sum(ew.mul(w, aweights)), correction), w_sum))
    else:
        norm = ew.sub(w_sum, correction) if w is not None else w_sum - correction
    norm = ew.where(ew.le(norm, 0), 0, norm) if is_tensor(norm) else max(norm, 0)
    avg = ew.true_divide(red.sum(x if w is None else ew.mul(x, w), 1), w_sum)
    xc = ew.sub(x, shapes.unsqueeze(avg, 1))
    other = xc if w is None else ew.mul(xc, w)
    c = linalg.mm(xc, conj(shapes.transpose(other, 0, 1)))
    return shapes.squeeze(ew.true_divide(c, norm))


@torchsymbol(torch.corrcoef, T.corrcoef, method_name="corrcoef")
def corrcoef(input):
    c = cov(input)
    if c.ndim == 0:
        return ew.true_divide(c, c)
    d = shapes.diagonal(c)
    std = ew.sqrt(ew.real(d) if dtypes.is_complex(d.dtype) else d)
    c = ew.true_divide(ew.true_divide(c, shapes.unsqueeze(std, 1)), shapes.unsqueeze(std, 0))
    if dtypes.is_complex(c.dtype):
        return ew.add(ew.clamp(ew.real(c), -1, 1), ew.mul(ew.clamp(ew.imag(c), -1, 1), 1j))
    return ew.clamp(c, -1, 1)


@torchsymbol(torch.combinations, method_name="combinations")
def combinations(input, r: int = 2, with_replacement: bool = False):
    """Static size (n choose r): the index tuples are made while tracing (ATen
    masks a grid, which a meta run cannot size), then one gather per position.
    No tuple (``r`` above the length) still gathers, from empty indices: eager's
    empty result is made from the input (a stack of masked selects), so it
    requires grad when the input does; ``r == 0`` gives eager's fresh empty tensor."""
    check(input.ndim == 1, lambda: f"Expect a 1D vector, but got shape {list(input.shape)}")
    check(r >= 0, lambda: f"Expect a non-negative number, but got {r}")
    if r == 0:
        return prims.full((0,), 0, device=input.device, dtype=input.dtype)
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = list(pick(range(input.shape[0]), r))
    if rows:
        cols = [_int_constant([row[k] for row in rows], input.device) for k in range(r)]
    else:
        cols = [prims.full((0,), 0, device=input.device, dtype=torch.int64)] * r
    picked = [prims.index_select(input, 0, c) for c in cols]
    return shapes.stack(picked, 1)


def _int_constant(values: list, device):
    """A 1-D int64 tensor of ``values`` known while tracing (iota when they count up)."""
    n = len(values)
    if values == list(range(values[0], values[0] + n)):
        return prims.iota(n, start=values[0], step=1, device=device, dtype=torch.int64)
    return prims.cat([prims.full((1,), v, device=device, dtype=torch.int64) for v in values], 0)
