"""Indexing: ``__getitem__`` (basic and advanced), ``__setitem__`` (functional
scatter then ``copy_`` into the indexed tensor), and the gather/scatter/index
op family."""
from __future__ import annotations

import operator

import torch

from thunderlite.core import prims
from thunderlite.core.prims import check
from thunderlite.core.symint import is_int, known_or, sym_max, sym_min
from thunderlite.core.tags import Tag
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.ops import shapes
from thunderlite.torch.ops.data_dependent import mask_indices
from thunderlite.torch.registry import decomposable, torchsymbol
from thunderlite.torch.sizes import expect_size
from thunderlite.torch.utils import canonical_dim, convert, expand_to, is_tensor, known_equal

T = torch.Tensor


def _normalize_key(key):
    return key if isinstance(key, tuple) else (key,)


def _basic(a, key):
    """Apply ints, slices, None and Ellipsis; return the view and, for each
    remaining tensor index, (output dim it applies to, index)."""
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis and not isinstance(k, bool))
    n_real = n_real + sum(k.ndim - 1 for k in key if is_tensor(k) and k.dtype is torch.bool)
    check(n_real <= a.ndim, lambda: f"too many indices for tensor of dimension {a.ndim}", IndexError)
    out, dim, advanced = a, 0, []
    for k in key:
        if k is Ellipsis:
            dim += a.ndim - n_real
            continue
        if k is None or isinstance(k, bool):
            out = shapes.unsqueeze(out, dim)
            if k is False:
                out = shapes.slice_dim(out, dim, 0, 0)
            dim += 1
            continue
        if is_int(k):
            out = shapes.select(out, dim, k)
            continue
        if isinstance(k, slice):
            out = _slice(out, dim, k)
            dim += 1
            continue
        if isinstance(k, (list, tuple)):
            k = _const_index(k, a.device)
        check(is_tensor(k), lambda: f"indexing with {type(k).__name__} is not supported", TypeError)
        if k.dtype in (torch.bool, torch.uint8):
            out, dim = _mask(out, dim, k, advanced)
            continue
        advanced.append((dim, k))
        dim += 1
    return out, advanced


def _mask(out, dim: int, mask, advanced: list):
    """A boolean mask indexes the dims it covers with the indices of its true
    elements (``nonzero(mask, as_tuple=True)``: a size known at run time)."""
    if mask.ndim == 0:                      # x[True]: a new dim of size 1 (or 0), as eager
        out = shapes.unsqueeze(out, dim)
    else:
        covered = tuple(out.shape[dim:dim + mask.ndim])
        check(tuple(mask.shape) == covered, lambda: f"The shape of the mask {list(mask.shape)} at index {dim} "
                                                    f"does not match the shape of the indexed tensor {list(covered)}",
              IndexError)
    for i in mask_indices(convert(mask, torch.bool)):
        advanced.append((dim, i))
        dim += 1
    return out, dim


def _const_index(seq, device):
    check(all(isinstance(i, int) for i in seq), lambda: "only flat int sequences can index a tensor here", IndexError)
    vals = [prims.full((1,), int(i), device=device, dtype=torch.int64) for i in seq]
    return prims.cat(vals, 0) if vals else prims.full((0,), 0, device=device, dtype=torch.int64)


def _slice(a, dim, s: slice):
    size = a.shape[dim]
    step = 1 if s.step is None else s.step
    check(step > 0, lambda: "step must be greater than zero", ValueError)
    start, stop = _clamp(s.start, size, 0), _clamp(s.stop, size, size)
    return shapes.slice_dim(a, dim, start, sym_max(start, stop), step)


def _clamp(i, size, default):
    """A slice bound made canonical as ``slice.indices`` does, in comparisons a
    symbolic size can answer (``slice.indices`` would need a concrete int); a
    run-time bound (``x[:n]`` of an ``item()``) is ``min(n, size)``, its
    sign assumed non-negative and checked when the program runs."""
    if i is None:
        return default
    if i < 0:
        return sym_max(i + size, 0)
    return sym_min(i, size)


def _advanced(x, advanced):
    """Gather with tensor indices at output dims; torch's placement rules."""
    dims = [d for d, _ in advanced]
    idx = list(shapes.broadcast_tensors(*[i for _, i in advanced]))
    bshape = idx[0].shape
    lin = None
    for d, i in zip(dims, idx, strict=True):
        i = ew.where(ew.lt(i, 0), ew.add(i, x.shape[d]), i)
        lin = i if lin is None else ew.add(ew.mul(lin, x.shape[d]), i)
    rest = [d for d in range(x.ndim) if d not in dims]
    moved = shapes.permute(x, dims + rest)
    flat_n = 1
    for d in dims:
        flat_n *= x.shape[d]
    moved = prims.reshape(moved, (flat_n,) + tuple(x.shape[d] for d in rest))
    picked = prims.index_select(moved, 0, prims.reshape(convert(lin, torch.int64), (lin.numel(),)))
    out = prims.reshape(picked, bshape + tuple(x.shape[d] for d in rest))
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if adjacent and dims[0] != 0:
        nb = len(bshape)
        perm = list(range(nb, nb + dims[0])) + list(range(nb)) + list(range(nb + dims[0], out.ndim))
        out = shapes.permute(out, perm)
    return out


@torchsymbol(T.__getitem__, operators=("__getitem__",))
def getitem(a, key):
    view, advanced = _basic(a, _normalize_key(key))
    return _advanced(view, advanced) if advanced else view


def _setitem_impl(a, key, value):
    a[key] = value
    return a


def _setitem_value(a, key, value):
    """The functional result of ``a[key] = value``."""
    key = _normalize_key(key)
    check(all(not is_tensor(k) and not isinstance(k, (list, tuple)) for k in key),
          lambda: "setitem with tensor indices is recorded through index_put", IndexError)
    view, _ = _basic(a, key)
    v = convert(expand_to(_drop_leading_ones(value, view.ndim), view.shape), a.dtype) if is_tensor(value) else \
        prims.full(view.shape, value, device=a.device, dtype=a.dtype)
    mask = prims.full(view.shape, True, device=a.device, dtype=torch.bool)
    return _scatter_back(a, key, v, mask)


def _drop_leading_ones(value, ndim: int):
    """Eager drops a value's leading size-1 dims beyond the target's rank
    (``b[0:2] = v`` with ``v`` of shape (1, 2, 3))."""
    lead = 0
    while value.ndim - lead > ndim and value.shape[lead] == 1:
        lead += 1
    return prims.squeeze(value, tuple(range(lead))) if lead else value


def _scatter_back(a, key, v, mask):
    """Undo the basic indexing of ``key`` on (v, mask): pad back to a's shape."""
    dim, ops = 0, []
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis and not isinstance(k, bool))
    for k in key:
        if k is Ellipsis:
            dim += a.ndim - n_real
            ops.append(("keep", a.ndim - n_real))
        elif k is None or isinstance(k, bool):
            ops.append(("squeeze", None))
        elif is_int(k):
            ops.append(("int", dim, k % a.shape[dim]))
            dim += 1
        else:
            ops.append(("slice", dim, k))
            dim += 1
    out_dim = 0
    for op in ops:
        if op[0] == "squeeze":
            v, mask = prims.squeeze(v, (out_dim,)), prims.squeeze(mask, (out_dim,))
        elif op[0] == "int":
            v, mask = shapes.unsqueeze(v, out_dim), shapes.unsqueeze(mask, out_dim)
            out_dim += 1
        elif op[0] == "keep":
            out_dim += op[1]
        else:
            out_dim += 1
    config = [(0, 0, 0)] * a.ndim
    for op in ops:
        if op[0] == "int":
            _, d, i = op
            config[d] = (i, a.shape[d] - i - 1, 0)
        elif op[0] == "slice":
            _, d, s = op
            size = a.shape[d]
            start, stop, step = _clamp(s.start, size, 0), _clamp(s.stop, size, size), s.step or 1
            n = max(-((start - stop) // step), 0)
            last = start + (n - 1) * step if n else start
            config[d] = (start, a.shape[d] - last - 1, step - 1) if n else (start, a.shape[d] - start, 0)
    v = prims.pad(v, 0, config)
    mask = prims.pad(mask, False, config)
    return prims.where(mask, v, a)


@torchsymbol(operator.setitem, operators=("__setitem__",), tags={Tag.INPLACE}, torch_fn=_setitem_impl)
def setitem(a, key, value):
    key_t = _normalize_key(key)
    if any(is_tensor(k) or isinstance(k, (list, tuple)) for k in key_t):
        decomposable(all(is_tensor(k) for k in key_t),
                     lambda: "setitem mixing tensor indices with other indices is not decomposed")
        values = convert(value, a.dtype) if is_tensor(value) else prims.full((), value, device=a.device,
                                                                               dtype=a.dtype)
        if len(key_t) == 1 and key_t[0].dtype is torch.bool and key_t[0].ndim and \
                (a.requires_grad or values.requires_grad):
            # differentiable as the mask's indices (index_put by a mask has no gradient rule);
            # ``y[m] = f(y[m])`` reads the same nonzero, so the lengths agree; another run-time
            # length must equal it, which the program checks (as eager's index_put does)
            mask = key_t[0]
            key_t = mask_indices(mask)
            lead = values.ndim - (a.ndim - mask.ndim + 1)
            if lead >= 0 and not known_or(lambda: values.shape[lead] == 1, False):
                expect_size(values.shape[lead], "==", key_t[0].shape[0],
                            "shape mismatch: value tensor cannot be broadcast to the indexing result of its mask")
        return prims.copy_(prims.index_put(a, list(key_t), values, False), a)
    return prims.copy_(_setitem_value(a, key, value), a)


@torchsymbol(torch.index_select, T.index_select, method_name="index_select")
def index_select(input, dim: int, index):
    if input.ndim == 0:
        flat = prims.index_select(prims.reshape(input, (1,)), 0, prims.reshape(index, (index.numel(),)))
        return prims.reshape(flat, ())
    return prims.index_select(input, dim, index)


@torchsymbol(torch.gather, T.gather, method_name="gather")
def gather(input, dim: int, index, *, sparse_grad: bool = False):
    return prims.gather(input, dim, index)


@torchsymbol(torch.take_along_dim, T.take_along_dim, method_name="take_along_dim")
def take_along_dim(input, indices, dim=None):
    if dim is None:
        return prims.take_along_axis(shapes.ravel(input), shapes.ravel(indices), 0)
    d = canonical_dim(dim, input.ndim)
    check(input.ndim == indices.ndim, lambda: "torch.take_along_dim(): input and indices should have the same "
                                              f"number of dimensions, but got {input.ndim} and {indices.ndim}")
    # every dim broadcasts except ``d``, where each keeps its own size
    shape = list(prims.broadcast_shapes(*(tuple(1 if k == d else n for k, n in enumerate(t.shape))
                                          for t in (input, indices))))
    a_shape, i_shape = list(shape), list(shape)
    a_shape[d], i_shape[d] = input.shape[d], indices.shape[d]
    return prims.take_along_axis(expand_to(input, a_shape), expand_to(indices, i_shape), d)


@torchsymbol(torch.scatter, T.scatter, method_name="scatter")
def scatter(input, dim: int, index, src=None, *, value=None, reduce=None):
    decomposable(reduce is None, lambda: "scatter(reduce=) is not decomposed")
    src = value if src is None else src
    return prims.scatter(input, dim, index, convert(src, input.dtype) if is_tensor(src) else src)


@torchsymbol(torch.scatter_add, T.scatter_add, method_name="scatter_add")
def scatter_add(input, dim: int, index, src):
    return prims.scatter_add(input, dim, index, convert(src, input.dtype))


@torchsymbol(torch.index_add, T.index_add, method_name="index_add")
def index_add(input, dim: int, index, source, *, alpha=1):
    source = source if known_equal(alpha, 1) else ew.mul(source, alpha)
    return prims.index_add(input, dim, index, convert(source, input.dtype))


@torchsymbol(torch.index_copy, T.index_copy, method_name="index_copy")
def index_copy(input, dim: int, index, source):
    """A scatter of ``source`` along ``dim`` at the rows ``index`` names: one
    symbol (torch's ``index_copy``, in place ``index_copy_``: a static KV
    cache's write) that fusing executors see through."""
    d = canonical_dim(dim, max(input.ndim, 1))
    check(index.ndim <= 1, lambda: f"index_copy_(): Index should have dimension 1 or 0 (got {index.ndim})",
          IndexError)
    check(index.dtype is torch.int64, lambda: "index_copy_(): Expected a long tensor for index, but got "
                                              f"{str(index.dtype).removeprefix('torch.').capitalize()}")
    check(source.dtype == input.dtype, lambda: "index_copy_(): self and source expected to have the same dtype, "
                                               f"but got (self) {input.dtype} and (source) {source.dtype}")
    if input.ndim == 0 or source.ndim == 0:
        check(input.ndim == 0 and source.numel() == 1 and index.numel() == 1,
              lambda: "index_copy_(): When source and destination are not scalars, their dimensionality must "
                      f"match. Source dimensionality ({source.ndim}), destination dimensionality ({input.ndim})")
        return shapes.reshape(source, ())
    check(source.ndim == input.ndim,
          lambda: "index_copy_(): When source and destination are not scalars, their dimensionality must match. "
                  f"Source dimensionality ({source.ndim}), destination dimensionality ({input.ndim})")
    check(source.shape[d] == index.numel(),
          lambda: f"index_copy_(): Number of indices ({index.numel()}) should be equal to "
                  f"source.size(dim) ({source.shape[d]})")
    idx = shapes.reshape(index, tuple(-1 if k == d else 1 for k in range(source.ndim)))
    return prims.scatter(input, d, expand_to(idx, source.shape), source)


@torchsymbol(torch.index_put, T.index_put, method_name="index_put")
def index_put(input, indices, values, accumulate: bool = False):
    return prims.index_put(input, list(indices), convert(values, input.dtype), accumulate)
