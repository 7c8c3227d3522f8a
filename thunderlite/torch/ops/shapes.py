"""Shape and view ops: view/reshape, permute/transpose, expand, squeeze/
unsqueeze, flatten, narrow/select/slicing, split/chunk/unbind, cat/stack,
flip/roll/repeat, diagonal, tril/triu, gather/scatter/index ops.
Which outputs alias which inputs is not written here: core/aliasing.py reads it
from each op's ATen schema (``Tensor(a)``) and from the view prims the
decompositions use. Indexing
(``__getitem__``/``__setitem__``) lives in indexing.py."""
from __future__ import annotations

import builtins

import torch

from thunderlite.core import prims
from thunderlite.core.prims import check
from thunderlite.core.proxies import DataDependentError, register_method
from thunderlite.core.symbol import Symbol
from thunderlite.core.symint import hint_of, is_int, known_or, statically_known, sym_max, sym_min
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.registry import _register_symbol, decomposable, register_torch_callable, torchsymbol
from thunderlite.torch.sizes import expect_size, item_int
from thunderlite.torch.utils import broadcast_shapes, canonical_dim, canonical_dims, convert, expand_to, is_tensor

T = torch.Tensor


def _shape_arg(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        return tuple(shape[0])
    return tuple(shape)


def infer_shape(shape, numel: int) -> tuple[int, ...]:
    """Resolve one ``-1`` in a view/reshape shape."""
    shape = tuple(shape)
    neg = [i for i, s in enumerate(shape) if s == -1]
    check(len(neg) <= 1, lambda: "only one dimension can be inferred")
    if not neg:
        return shape
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    check(known != 0 and numel % known == 0,
          lambda: f"shape '{list(shape)}' is invalid for input of size {numel}")
    out = list(shape)
    out[neg[0]] = numel // known
    return tuple(out)


def _reshape(a, shape):
    shape = infer_shape(shape, a.numel())
    return a if shape == a.shape else prims.reshape(a, shape)


@torchsymbol(T.view, method_name="view")
def view(a, *shape):
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        decomposable(shape[0] == a.dtype,
                     lambda: "view(dtype) that reinterprets bits is not supported by the decomposition")
        return a
    return _reshape(a, _shape_arg(shape))


@torchsymbol(T.reshape, torch.reshape, method_name="reshape")
def reshape(a, *shape):
    return _reshape(a, _shape_arg(shape))


@torchsymbol(T.view_as, method_name="view_as")
def view_as(a, other):
    return _reshape(a, other.shape)


@torchsymbol(T.reshape_as, method_name="reshape_as")
def reshape_as(a, other):
    return _reshape(a, other.shape)


@torchsymbol(torch.ravel, T.ravel, method_name="ravel")
def ravel(a):
    return _reshape(a, (a.numel(),))


@torchsymbol(torch.flatten, T.flatten, method_name="flatten")
def flatten(a, start_dim: int = 0, end_dim: int = -1):
    if a.ndim == 0:
        return _reshape(a, (1,))
    s, e = canonical_dim(start_dim, a.ndim), canonical_dim(end_dim, a.ndim)
    check(s <= e, lambda: "flatten() has invalid args: start_dim cannot come after end_dim")
    n = 1
    for d in a.shape[s:e + 1]:
        n *= d
    return _reshape(a, a.shape[:s] + (n,) + a.shape[e + 1:])


@torchsymbol(torch.unflatten, T.unflatten, method_name="unflatten")
def unflatten(a, dim: int, sizes):
    d = canonical_dim(dim, a.ndim)
    sizes = infer_shape(sizes, a.shape[d])
    return _reshape(a, a.shape[:d] + tuple(sizes) + a.shape[d + 1:])


@torchsymbol(T.permute, torch.permute, method_name="permute")
def permute(a, *dims):
    dims = canonical_dims(_shape_arg(dims), a.ndim)
    check(len(dims) == a.ndim, lambda: "permute(): number of dims don't match in permute")
    return a if dims == tuple(range(a.ndim)) else prims.permute(a, dims)


@torchsymbol(torch.transpose, T.transpose, torch.swapaxes, T.swapaxes, torch.swapdims, T.swapdims,
             method_name=("transpose", "swapaxes", "swapdims"))
def transpose(a, dim0: int, dim1: int):
    if a.ndim == 0:
        return a
    d0, d1 = canonical_dim(dim0, a.ndim), canonical_dim(dim1, a.ndim)
    perm = list(range(a.ndim))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return permute(a, perm)


@torchsymbol(torch.t, T.t, method_name="t")
def t(a):
    check(a.ndim <= 2, lambda: f"t() expects a tensor with <= 2 dimensions, but self is {a.ndim}D")
    return transpose(a, 0, 1) if a.ndim == 2 else a


@torchsymbol(torch.adjoint, T.adjoint, method_name="adjoint")
def adjoint(a):
    out = transpose(a, -2, -1)
    return ew.conj(out) if out.dtype.is_complex else out


def _T(a):
    return permute(a, tuple(reversed(range(a.ndim))))


def _mT(a):
    if a.ndim == 0:
        return a            # eager: the identity on 0-d tensors (deprecated there, with a warning)
    check(a.ndim >= 2, lambda: "tensor.mT is only supported on matrices or batches of matrices. Got 1-D tensor.")
    return transpose(a, -2, -1)


def _mH(a):
    return adjoint(a)


def _H(a):
    check(a.ndim <= 2, lambda: "tensor.H is only supported on matrices (2-D tensors).")
    return adjoint(a) if a.ndim == 2 else a


matrix_H = torchsymbol(name="H_property", properties=("H",), no_torch_fn=True)(_H)
matrix_mH = torchsymbol(name="mH_property", properties=("mH",), no_torch_fn=True)(_mH)
matrix_T = torchsymbol(name="T_property", properties=("T",), no_torch_fn=True)(_T)
matrix_mT = torchsymbol(name="mT_property", properties=("mT",), no_torch_fn=True)(_mT)


def _dims_tuple(d) -> tuple:
    return (d,) if isinstance(d, int) else tuple(d)


@torchsymbol(torch.movedim, T.movedim, torch.moveaxis, T.moveaxis, method_name=("movedim", "moveaxis"))
def movedim(a, source, destination):
    if a.ndim == 0:         # eager accepts dims 0 / -1 on a 0-d tensor and returns it
        check(all(d in (0, -1) for d in (*_dims_tuple(source), *_dims_tuple(destination))),
              lambda: "movedim: Dimension out of range (expected to be in range of [-1, 0])", IndexError)
        return a
    src = canonical_dims(source, a.ndim)
    dst = canonical_dims(destination, a.ndim)
    check(len(src) == len(dst), lambda: "movedim: Invalid source or destination dims")
    perm = [-1] * a.ndim
    for s, d in zip(src, dst, strict=True):
        perm[d] = s
    rest = iter(i for i in range(a.ndim) if i not in src)
    perm = [p if p != -1 else next(rest) for p in perm]
    return permute(a, perm)


@torchsymbol(T.expand, method_name="expand")
def expand(a, *sizes):
    sizes = _shape_arg(sizes)
    check(len(sizes) >= a.ndim, lambda: f"expand: the number of sizes provided ({len(sizes)}) must be greater or "
                                        f"equal to the number of dimensions in the tensor ({a.ndim})")
    off = len(sizes) - a.ndim
    shape = tuple(a.shape[i - off] if s == -1 else s for i, s in enumerate(sizes))
    for i, s in enumerate(a.shape):
        check(s == 1 or s == shape[i + off], lambda: f"The expanded size of the tensor ({shape[i + off]}) must match "
                                                     f"the existing size ({s}) at non-singleton dimension {i + off}")
    return expand_to(a, shape)


@torchsymbol(T.expand_as, method_name="expand_as")
def expand_as(a, other):
    return expand(a, other.shape)


@torchsymbol(torch.broadcast_to, T.broadcast_to, method_name="broadcast_to")
def broadcast_to(a, size):
    return expand(a, tuple(size))


@torchsymbol(torch.broadcast_tensors)
def broadcast_tensors(*tensors):
    shape = broadcast_shapes(*(x.shape for x in tensors))
    return tuple(expand_to(x, shape) for x in tensors)


@torchsymbol(torch.squeeze, T.squeeze, method_name="squeeze")
def squeeze(a, dim=None):
    if dim is None:
        dims = tuple(i for i, s in enumerate(a.shape) if s == 1)
    else:
        dims = tuple(d for d in canonical_dims(dim, a.ndim) if a.ndim and a.shape[d] == 1)
    return prims.squeeze(a, dims) if dims else a


@torchsymbol(torch.unsqueeze, T.unsqueeze, method_name="unsqueeze")
def unsqueeze(a, dim: int):
    d = canonical_dim(dim, a.ndim + 1)
    return prims.reshape(a, a.shape[:d] + (1,) + a.shape[d:])


def slice_dim(a, dim: int, start: int, stop: int, step: int = 1):
    """``a`` sliced along one dim with a canonical (clamped) start/stop."""
    if known_or(lambda: start == 0 and stop == a.shape[dim] and step == 1, False):
        return a
    starts = [0] * a.ndim
    ends = list(a.shape)
    strides = [1] * a.ndim
    starts[dim], ends[dim], strides[dim] = start, sym_max(stop, start), step
    return prims.slice_prim(a, starts, ends, strides)


@torchsymbol(torch.narrow, T.narrow, method_name="narrow")
def narrow(a, dim: int, start: int, length: int):
    """torch's checks, made when the program runs where they read a run-time
    int (``start`` given as a tensor, a ``length`` from ``item()``)."""
    d = canonical_dim(dim, a.ndim)
    size = a.shape[d]
    if is_tensor(start):
        check(start.ndim == 0 and not start.dtype.is_floating_point,
              lambda: "start must be an 0-dim integral Tensor.")
        start = item_int(start)
    expect_size(length, ">=", 0, "narrow(): length must be non-negative.")
    expect_size(start, ">=", -size, f"start out of range (expected to be in range of [{-size}, {size}])",
                IndexError)
    expect_size(start, "<=", size, f"start out of range (expected to be in range of [{-size}, {size}])",
                IndexError)
    start = _wrapped(start, size)
    expect_size(start + length, "<=", size,
                f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return slice_dim(a, d, start, start + length)


def _wrapped(start, size):
    """``start + size`` if ``start < 0`` else ``start``: when tracing cannot
    tell, ``start % size`` (equal for ``-size <= start < size``; at ``start ==
    size`` the slice is empty either way)."""
    negative = statically_known(start, "<", 0)
    if negative is None and hint_of(start) is not None:
        negative = start < 0
    if negative is not None:
        return start + size if negative else start
    return start % size if known_or(lambda: size > 0, False) else start


@torchsymbol(torch.select, T.select, method_name="select")
def select(a, dim: int, index: int):
    d = canonical_dim(dim, a.ndim)
    size = a.shape[d]
    check(-size <= index < size, lambda: f"select(): index {index} out of range for tensor of size {a.shape} "
                                         f"at dimension {dim}", IndexError)
    index %= size
    return prims.squeeze(slice_dim(a, d, index, index + 1), (d,))


def _split_sizes(total: int, split_size: int) -> list[int]:
    if split_size == 0:
        return [0] if total == 0 else []
    n = builtins.max((total + split_size - 1) // split_size, 1)
    return [split_size] * (n - 1) + [total - split_size * (n - 1)]


@torchsymbol(torch.split, T.split, method_name="split")
def split(a, split_size_or_sections, dim: int = 0):
    d = canonical_dim(dim, a.ndim)
    sizes = (_split_sizes(a.shape[d], split_size_or_sections) if is_int(split_size_or_sections)
             else list(split_size_or_sections))
    check(builtins.sum(sizes) == a.shape[d], lambda: f"split_with_sizes expects split_sizes to sum exactly to "
                                                    f"{a.shape[d]} (input tensor's size at dimension {d})")
    out, start = [], 0
    for s in sizes:
        out.append(slice_dim(a, d, start, start + s))
        start += s
    return tuple(out)


@torchsymbol(T.split_with_sizes, method_name="split_with_sizes")
def split_with_sizes(a, split_sizes, dim: int = 0):
    return split(a, list(split_sizes), dim)


@torchsymbol(torch.chunk, T.chunk, method_name="chunk")
def chunk(a, chunks: int, dim: int = 0):
    check(chunks > 0, lambda: "chunk expects `chunks` to be greater than 0")
    d = canonical_dim(dim, a.ndim)
    size = (a.shape[d] + chunks - 1) // chunks
    return split(a, size, d)


@torchsymbol(torch.tensor_split, T.tensor_split, method_name="tensor_split")
def tensor_split(a, indices_or_sections, dim: int = 0):
    d = canonical_dim(dim, a.ndim)
    n = a.shape[d]
    if isinstance(indices_or_sections, int):
        k = indices_or_sections
        bounds, start = [], 0
        for i in range(k):
            size = n // k + (1 if i < n % k else 0)
            bounds.append((start, start + size))
            start += size
    else:
        points = indices_or_sections
        if is_tensor(points):           # split points read when the program runs: run-time sizes
            check(points.ndim == 1, lambda: "tensor_split with a 0-dim tensor of sections: the number of "
                                            "outputs depends on its value; pass an int", DataDependentError)
            points = [item_int(select(points, 0, i)) for i in range(points.shape[0])]
        # a point of unknown sign is assumed non-negative (checked when the program runs)
        idx = [sym_min(sym_max(i + n if i < 0 else i, 0), n) for i in points]
        edges = [0, *idx, n]
        bounds = [(edges[i], sym_max(edges[i], edges[i + 1])) for i in range(len(edges) - 1)]
    return tuple(slice_dim(a, d, lo, hi) for lo, hi in bounds)


@torchsymbol(torch.unbind, T.unbind, method_name="unbind")
def unbind(a, dim: int = 0):
    check(a.ndim > 0, lambda: "Dimension specified as 0 but tensor has no dimensions", IndexError)
    d = canonical_dim(dim, a.ndim)
    return tuple(select(a, d, i) for i in range(a.shape[d]))


@torchsymbol(torch.diagonal, T.diagonal, method_name="diagonal")
def diagonal(a, offset: int = 0, dim1: int = 0, dim2: int = 1):
    d1, d2 = canonical_dim(dim1, a.ndim), canonical_dim(dim2, a.ndim)
    check(d1 != d2, lambda: f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    rest = [i for i in range(a.ndim) if i not in (d1, d2)]
    x = permute(a, (*rest, d1, d2))
    n1, n2 = x.shape[-2], x.shape[-1]
    lo1, lo2 = (0, offset) if offset >= 0 else (-offset, 0)
    length = builtins.max(builtins.min(n1 - lo1, n2 - lo2), 0)
    batch = x.shape[:-2]
    if length == 0:
        flat = prims.reshape(slice_dim(slice_dim(x, x.ndim - 2, 0, 0), x.ndim - 1, 0, 0), (*batch, 0, 0))
        return prims.reshape(flat, (*batch, 0))
    x = slice_dim(slice_dim(x, x.ndim - 2, lo1, lo1 + length), x.ndim - 1, lo2, lo2 + length)
    flat = prims.reshape(x, (*batch, length * length))
    return slice_dim(flat, flat.ndim - 1, 0, length * length, length + 1)


@torchsymbol(torch.flip)
def flip(a, dims):
    dims = canonical_dims(dims, a.ndim)
    return prims.flip(a, dims) if dims and a.ndim else a


@torchsymbol(T.flip, method_name="flip", name="tensor_flip")
def tensor_flip(a, *dims):
    """``x.flip(0)``, ``x.flip(0, 1)``, ``x.flip((0, 1))``: the method takes dims as varargs too."""
    return flip(a, _shape_arg(dims))


@torchsymbol(torch.fliplr, T.fliplr, method_name="fliplr")
def fliplr(a):
    check(a.ndim >= 2, lambda: "Input must be >= 2-d.")
    return flip(a, (1,))


@torchsymbol(torch.flipud, T.flipud, method_name="flipud")
def flipud(a):
    check(a.ndim >= 1, lambda: "Input must be >= 1-d.")
    return flip(a, (0,))


@torchsymbol(torch.roll, T.roll, method_name="roll")
def roll(a, shifts, dims=None):
    if dims is None:
        flat = prims.reshape(a, (a.numel(),))
        return prims.reshape(roll(flat, shifts if isinstance(shifts, int) else shifts[0], 0), a.shape)
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    out = a
    for s, d in zip(shifts, dims, strict=True):
        d = canonical_dim(d, a.ndim)
        n = a.shape[d]
        if n == 0 or s % n == 0:
            continue
        s %= n
        out = prims.cat([slice_dim(out, d, n - s, n), slice_dim(out, d, 0, n - s)], d)
    return out


@torchsymbol(torch.rot90, T.rot90, method_name="rot90")
def rot90(a, k: int = 1, dims=(0, 1)):
    d0, d1 = dims
    k %= 4
    if k == 1:
        return transpose(flip(a, (d1,)), d0, d1)
    if k == 2:
        return flip(a, (d0, d1))
    if k == 3:
        return flip(transpose(a, d0, d1), (d1,))
    return a


@torchsymbol(T.repeat, method_name="repeat")
def repeat(a, *repeats):
    repeats = _shape_arg(repeats)
    check(len(repeats) >= a.ndim, lambda: "Number of dimensions of repeat dims can not be smaller than number of "
                                          "dimensions of tensor")
    x = prims.reshape(a, (1,) * (len(repeats) - a.ndim) + a.shape)
    inter = []
    for r, s in zip(repeats, x.shape, strict=True):
        inter += [r, s]
    y = prims.broadcast_in_dim(x, tuple(inter), tuple(range(1, 2 * x.ndim, 2)))
    return prims.reshape(y, tuple(r * s for r, s in zip(repeats, x.shape, strict=True)))


@torchsymbol(T.tile, torch.tile, method_name="tile")
def tile(a, *dims):
    dims = _shape_arg(dims)
    dims = (1,) * (a.ndim - len(dims)) + dims
    return repeat(a, dims)


def _tensors_for_cat(tensors):
    dt = torch.result_type(torch.empty(0, dtype=tensors[0].dtype), torch.empty(0, dtype=tensors[0].dtype))
    for x in tensors:
        dt = torch.promote_types(dt, x.dtype)
    return [convert(x, dt) for x in tensors]


@torchsymbol(torch.cat, torch.concat, torch.concatenate)
def cat(tensors, dim: int = 0):
    tensors = list(tensors)
    check(len(tensors) > 0, lambda: "torch.cat(): expected a non-empty list of Tensors")
    nonempty = [x for x in tensors if not _legacy_empty(x)]
    if not nonempty:
        return _tensors_for_cat(tensors)[0]
    d = canonical_dim(dim, nonempty[0].ndim)
    converted = [x for x in _tensors_for_cat(tensors) if not _legacy_empty(x)]
    return prims.cat(converted, d)


def _legacy_empty(x) -> bool:
    """A 1-d empty tensor, which cat skips; a run-time length is taken as not
    empty (the same result wherever the ranks match, as they must otherwise)."""
    return x.ndim == 1 and known_or(lambda: x.shape[0] == 0, False)


@torchsymbol(torch.stack)
def stack(tensors, dim: int = 0):
    tensors = list(tensors)
    check(len(tensors) > 0, lambda: "stack expects a non-empty TensorList")
    d = canonical_dim(dim, tensors[0].ndim + 1)
    for x in tensors:
        check(x.shape == tensors[0].shape, lambda: f"stack expects each tensor to be equal size, but got "
                                                   f"{tensors[0].shape} at entry 0 and {x.shape}")
    return cat([unsqueeze(x, d) for x in tensors], d)


def _atleast(a, n: int):
    if a.ndim >= n:
        return a
    if n == 3 and a.ndim == 2:
        return unsqueeze(a, 2)
    shape = {1: (1,), 2: (1, a.numel()) if a.ndim else (1, 1)}.get(n)
    if n == 3:
        shape = (1, a.numel(), 1) if a.ndim == 1 else (1, 1, 1)
    return _reshape(a, shape)


@torchsymbol(torch.hstack)
def hstack(tensors):
    tensors = [_atleast(x, 1) for x in tensors]
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


@torchsymbol(torch.vstack, torch.row_stack)
def vstack(tensors):
    return cat([_atleast(x, 2) for x in tensors], 0)


@torchsymbol(torch.dstack)
def dstack(tensors):
    return cat([_atleast(x, 3) for x in tensors], 2)


@torchsymbol(torch.column_stack)
def column_stack(tensors):
    cols = [_reshape(x, (x.numel(), 1)) if x.ndim <= 1 else x for x in tensors]
    return cat(cols, 1)


def _tri_mask(a, diagonal: int, upper: bool):
    rows, cols = a.shape[-2], a.shape[-1]
    r = prims.iota(rows, start=0, step=1, device=a.device, dtype=torch.int64)
    c = prims.iota(cols, start=0, step=1, device=a.device, dtype=torch.int64)
    r = prims.broadcast_in_dim(r, (rows, cols), (0,))
    c = prims.broadcast_in_dim(c, (rows, cols), (1,))
    diff = ew.sub(c, r)
    return ew.ge(diff, diagonal) if upper else ew.le(diff, diagonal)


def _tri(a, diagonal: int, upper: bool, name: str):
    """tril's and triu's decomposition: ``a`` where the triangle's mask holds, zero elsewhere."""
    check(a.ndim >= 2, lambda: f"{name}: input tensor must have at least 2 dimensions")
    mask = expand_to(_tri_mask(a, diagonal, upper), a.shape)
    return prims.where(mask, a, prims.full(a.shape, False if a.dtype is torch.bool else 0, device=a.device,
                                           dtype=a.dtype))


@torchsymbol(torch.tril, T.tril, method_name="tril")
def tril(a, diagonal: int = 0):
    return _tri(a, diagonal, False, "tril")


@torchsymbol(torch.triu, T.triu, method_name="triu")
def triu(a, diagonal: int = 0):
    return _tri(a, diagonal, True, "triu")


def _contiguous_meta(a, memory_format=torch.contiguous_format):
    return a.replace()


# A leaf, not a no-op: eager's contiguous() changes the layout later views depend on
# (x.t().contiguous().view(-1)), so it must run. It returns its input when that is
# already contiguous: its schema says so (``Tensor(a)``: may alias).
contiguous = Symbol("contiguous", meta=_contiguous_meta, module="ltorch", torch_fn=T.contiguous)
_register_symbol(contiguous)
register_torch_callable(T.contiguous, contiguous)
register_method("contiguous", contiguous)


@torchsymbol(torch.clone, T.clone, method_name="clone")
def clone(a, *, memory_format=torch.preserve_format):
    return prims.clone(a)


def deepcopy(a, memo=None):
    """``copy.deepcopy(t)``: a new leaf with ``t``'s values and ``requires_grad``, as
    eager's ``Tensor.__deepcopy__`` (and ``Parameter``'s) make. Without it Python's
    reduce protocol rebuilt the proxy under its own name, so writes to the copy
    landed in ``t``."""
    out = clone(a.detach())
    return out.requires_grad_(True) if a.requires_grad else out


register_method("__deepcopy__", deepcopy)
