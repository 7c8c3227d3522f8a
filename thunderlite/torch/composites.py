"""Torch ops written in terms of other torch-language ops (no prims of their
own): reflected operators as torch callables, ``*_copy`` variants of views,
real-tensor conjugation no-ops, atleast_nd, h/v/dsplit, diff, trace, kron,
cross, distances and similarities, pixel/channel shuffles, logcumsumexp."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from thunderlite.core import dtypes, prims
from thunderlite.core.prims import check
from thunderlite.core.tags import Tag
from thunderlite.torch import elementwise as ew
from thunderlite.torch import linalg  # noqa: F401 - registers matmul, reflected below
from thunderlite.torch import reductions as red
from thunderlite.torch import shapes
from thunderlite.torch.registry import all_symbols, decomposable, register_torch_callable, torchsymbol
from thunderlite.torch.utils import broadcast, canonical_dim, convert, is_tensor

T = torch.Tensor

# ``torch.Tensor.__radd__(x, 2)`` is ``2 + x`` (the OpInfos call the dunders directly).
for _dunder, _name in [("__radd__", "add"), ("__rsub__", "sub"), ("__rmul__", "mul"), ("__rtruediv__", "div"),
                       ("__rdiv__", "div"), ("__rfloordiv__", "floor_divide"), ("__rmod__", "remainder"),
                       ("__rpow__", "pow"), ("__rmatmul__", "matmul"), ("__rand__", "bitwise_and"),
                       ("__ror__", "bitwise_or"), ("__rxor__", "bitwise_xor"), ("__rlshift__", "bitwise_left_shift"),
                       ("__rrshift__", "bitwise_right_shift")]:
    if _dunder != "__rdiv__" or T.__rdiv__ is not T.__rtruediv__:     # one function under two names
        register_torch_callable(getattr(T, _dunder), ew.reflected(all_symbols()[_name]))


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


@torchsymbol(torch.conj, T.conj, method_name="conj", tags={Tag.VIEW})
def conj(a):
    _real_only(a, "conj")
    return a


@torchsymbol(torch.resolve_conj, T.resolve_conj, method_name="resolve_conj", tags={Tag.VIEW})
def resolve_conj(a):
    _real_only(a, "resolve_conj")
    return a


@torchsymbol(torch.resolve_neg, T.resolve_neg, method_name="resolve_neg", tags={Tag.VIEW})
def resolve_neg(a):
    _real_only(a, "resolve_neg")
    return a


@torchsymbol(torch.conj_physical, T.conj_physical, method_name="conj_physical")
def conj_physical(a):
    _real_only(a, "conj_physical")
    return shapes.clone(a)


_ATLEAST = {(1, 0): lambda s: (1,), (2, 0): lambda s: (1, 1), (2, 1): lambda s: (1, *s),
            (3, 0): lambda s: (1, 1, 1), (3, 1): lambda s: (1, *s, 1), (3, 2): lambda s: (*s, 1)}


def _atleast(n: int, tensors):
    def one(a):
        return a if a.ndim >= n else shapes.reshape(a, *_ATLEAST[(n, a.ndim)](a.shape))
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        return tuple(one(a) for a in tensors[0])
    return one(tensors[0]) if len(tensors) == 1 else tuple(one(a) for a in tensors)


@torchsymbol(torch.atleast_1d, tags={Tag.VIEW})
def atleast_1d(*tensors):
    return _atleast(1, tensors)


@torchsymbol(torch.atleast_2d, tags={Tag.VIEW})
def atleast_2d(*tensors):
    return _atleast(2, tensors)


@torchsymbol(torch.atleast_3d, tags={Tag.VIEW})
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


@torchsymbol(torch.hsplit, T.hsplit, method_name="hsplit", tags={Tag.VIEW})
def hsplit(a, sections):
    return _nsplit(a, sections, 1 if a.ndim > 1 else 0, "hsplit", 1)


@torchsymbol(torch.vsplit, T.vsplit, method_name="vsplit", tags={Tag.VIEW})
def vsplit(a, sections):
    return _nsplit(a, sections, 0, "vsplit", 2)


@torchsymbol(torch.dsplit, T.dsplit, method_name="dsplit", tags={Tag.VIEW})
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


@torchsymbol(torch.dist, T.dist, method_name="dist")
def dist(input, other, p=2):
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
    attention): unsqueeze, expand, merge. Tensor repeats are data-dependent."""
    decomposable(isinstance(repeats, int), lambda: "repeat_interleave with tensor repeats is data-dependent")
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


@torchsymbol(torch.linalg.norm)
def linalg_norm(input, ord=None, dim=None, keepdim: bool = False, *, dtype=None):
    """Vector norms, and the Frobenius matrix norm (``ord=None``/``'fro'``)."""
    dims = (dim,) if isinstance(dim, int) else dim
    matrix = (dims is not None and len(dims) == 2) or (dims is None and ord is not None and input.ndim == 2)
    if ord is None or (matrix and ord == "fro"):
        return red.vector_norm(input, 2, dim, keepdim, dtype=dtype)
    decomposable(not matrix and not isinstance(ord, str), lambda: f"linalg.norm(ord={ord!r}) of a matrix")
    return red.vector_norm(input, ord, dim, keepdim, dtype=dtype)


@torchsymbol(torch.fill)
def fill(input, value):
    if is_tensor(value):
        check(value.ndim == 0, lambda: f"fill only supports 0-dimension value tensor but got tensor with "
                                       f"{value.ndim} dimensions.")
        return prims.broadcast_in_dim(convert(value, input.dtype), input.shape, ())
    return prims.full(input.shape, value, device=input.device, dtype=input.dtype)
