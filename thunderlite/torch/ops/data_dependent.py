"""Ops whose output size depends on the data: one trace for every size.

Each is built on a *sized leaf*: a symbol whose outputs are the tensors AND
the new sizes as ``NumberProxy`` ints, e.g. ``(t5, u0) = ltorch.nonzero_sized(x)``;
the torch executor runs it as the torch call and returns ``r.shape[0]`` with
it. The tensor's shape holds the *unbacked* symbol ``u0``
(core/symint.py: known only at run time), so later ops propagate it
symbolically, and ``u0`` is an ordinary trace value defined by that bound
symbol: dataflow, DCE, fusion, autodiff and ``del`` see who makes and reads
it. Sized leaves are tagged ``Tag.UNBACKED``: a composite calling one is
recorded as its decomposition (core/trace.py), so the size's definition is
never hidden inside a composite its readers cannot look into.

The torch-level ops return only what torch returns:

- ``nonzero``/``argwhere``/``where(cond)``: ``nonzero_sized``;
- ``masked_select``, ``x[mask]`` and ``x[mask] = v`` (torch/ops/indexing.py):
  ``nonzero`` of the mask, then a gather / ``index_put`` with its indices,
  so their gradients are the gather's (``index_add`` into zeros), as eager's;
- ``unique``/``unique_consecutive``: ``unique_sized`` (no gradient, as eager);
- ``repeat_interleave`` with a tensor of counts (torch/ops/composites.py):
  ``repeat_interleave_sized`` gives the indices, ``index_select`` gathers;
- ``item`` (torch/ops/elementwise.py) of an int tensor is an unbacked ``SymInt`` of
  unknown sign; ``tolist`` is one ``item`` per element; ``equal`` and
  ``allclose`` are a symbolic bool (``prims.item`` of ``all``).

Python code deciding on such a value (``if n > 3``, ``if torch.equal(a, b)``)
raises ``DataDependentError`` with the user's line (frontend/hooks.py).
"""
from __future__ import annotations

import torch

from thunderlite.core import prims
from thunderlite.core.prims import check
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.core.tracectx import current_trace
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.ops import reductions as red
from thunderlite.torch.ops import shapes
from thunderlite.torch.registry import register_leaf, torchsymbol
from thunderlite.torch.sizes import as_unbacked, unbacked
from thunderlite.torch.utils import canonical_dim, expand_to

T = torch.Tensor


# --- nonzero --------------------------------------------------------------------------------

def _nonzero_meta(a):
    proxy, n = unbacked(f"the length of torch.nonzero({a.name})")
    return TensorProxy(shape=(n, a.ndim), dtype=torch.int64, device=a.device), proxy


def _nonzero_impl(a):
    r = torch.nonzero(a)
    return r, r.shape[0]


nonzero_sized = register_leaf(Symbol("nonzero_sized", meta=_nonzero_meta, module="ltorch", tags={Tag.UNBACKED},
                                     torch_fn=_nonzero_impl))
"""``(indices, n) = nonzero_sized(a)``: ``torch.nonzero(a)`` and its length."""


def nonzero_of(a):
    """``nonzero_sized(a)[0]``, recorded once per tensor proxy while nothing is
    written in between: ``x[m] + y[m]`` has one length ``u0``, not ``u0``
    and ``u1`` (broadcasting two run-time sizes is refused)."""
    trc = current_trace()
    memo = trc.__dict__.setdefault("_nonzero_memo", {})
    hit = memo.get(a.name)
    if hit is not None and hit[0] == trc.writes and _recorded(trc, hit[1]):
        return hit[1]
    idx = nonzero_sized(a)[0]
    memo[a.name] = (trc.writes, idx)
    return idx


def _recorded(trc, idx) -> bool:
    """``idx`` is still made by a recorded symbol (not by a composite whose
    recording was abandoned for its opaque call)."""
    return any(b.sym is nonzero_sized and b.output[0] is idx for scope in trc._scopes for b in scope)


@torchsymbol(torch.nonzero, T.nonzero, method_name="nonzero")
def nonzero(input, *, as_tuple: bool = False):
    if as_tuple:
        return mask_indices(input)
    return nonzero_of(input)


@torchsymbol(torch.argwhere, T.argwhere, method_name="argwhere")
def argwhere(input):
    return nonzero_of(input)


def mask_indices(mask) -> tuple:
    """``torch.nonzero(mask, as_tuple=True)``: one index tensor per dim."""
    if mask.ndim == 0:
        mask = prims.reshape(mask, (1,))
    idx = nonzero_of(mask)
    return tuple(shapes.select(idx, 1, d) for d in range(mask.ndim))


@torchsymbol(torch.masked_select, T.masked_select, method_name="masked_select")
def masked_select(input, mask):
    check(mask.dtype is torch.bool, lambda: f"masked_select: expected BoolTensor for mask, got {mask.dtype}")
    shape = prims.broadcast_shapes(input.shape, mask.shape)
    n = 1
    for s in shape:
        n *= s
    flat = prims.reshape(expand_to(input, shape), (n,))
    idx = nonzero_sized(prims.reshape(expand_to(mask, shape), (n,)))[0]
    return prims.index_select(flat, 0, shapes.select(idx, 1, 0))


# --- unique ---------------------------------------------------------------------------------

def _unique_outputs(a, dim, return_inverse, return_counts, what):
    proxy, n = unbacked(f"the number of {what}({a.name})")
    if dim is None:
        values = TensorProxy(shape=(n,), dtype=a.dtype, device=a.device)
        inverse_shape = a.shape
    else:
        d = canonical_dim(dim, a.ndim)
        values = TensorProxy(shape=a.shape[:d] + (n,) + a.shape[d + 1:], dtype=a.dtype, device=a.device)
        inverse_shape = (a.shape[d],)
    out = [values]
    if return_inverse:
        out.append(TensorProxy(shape=inverse_shape, dtype=torch.int64, device=a.device))
    if return_counts:
        out.append(TensorProxy(shape=(n,), dtype=torch.int64, device=a.device))
    return (*out, proxy)


def _sized(out, dim):
    out = out if isinstance(out, tuple) else (out,)
    return (*out, out[0].shape[0 if dim is None else dim])


def _unique_impl(a, sorted, return_inverse, return_counts, dim):
    return _sized(torch.unique(a, sorted=sorted, return_inverse=return_inverse, return_counts=return_counts,
                               dim=dim), dim)


def _unique_consecutive_impl(a, return_inverse, return_counts, dim):
    return _sized(torch.unique_consecutive(a, return_inverse=return_inverse, return_counts=return_counts,
                                           dim=dim), dim)


unique_sized = register_leaf(Symbol(
    "unique_sized", module="ltorch", tags={Tag.UNBACKED}, torch_fn=_unique_impl,
    meta=lambda a, sorted, ri, rc, dim: _unique_outputs(a, dim, ri, rc, "torch.unique")))
"""``(values, [inverse], [counts], n) = unique_sized(a, sorted, return_inverse, return_counts, dim)``."""

unique_consecutive_sized = register_leaf(Symbol(
    "unique_consecutive_sized", module="ltorch", tags={Tag.UNBACKED}, torch_fn=_unique_consecutive_impl,
    meta=lambda a, ri, rc, dim: _unique_outputs(a, dim, ri, rc, "torch.unique_consecutive")))


def _unpacked(out: tuple):
    values = out[:-1]
    return values[0] if len(values) == 1 else values


@torchsymbol(torch.unique, T.unique, method_name="unique")
def unique(input, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False, dim=None):
    return _unpacked(unique_sized(input, sorted, return_inverse, return_counts, dim))


@torchsymbol(torch.unique_consecutive, T.unique_consecutive, method_name="unique_consecutive")
def unique_consecutive(input, return_inverse: bool = False, return_counts: bool = False, dim=None):
    return _unpacked(unique_consecutive_sized(input, return_inverse, return_counts, dim))


# --- repeat_interleave with a tensor of counts -----------------------------------------------

def _repeat_interleave_meta(repeats):
    proxy, n = unbacked(f"the sum of the counts {repeats.name} of torch.repeat_interleave")
    return TensorProxy(shape=(n,), dtype=repeats.dtype, device=repeats.device), proxy


def _repeat_interleave_impl(repeats):
    r = torch.repeat_interleave(repeats)
    return r, r.shape[0]


repeat_interleave_sized = register_leaf(Symbol(
    "repeat_interleave_sized", meta=_repeat_interleave_meta, module="ltorch", tags={Tag.UNBACKED},
    torch_fn=_repeat_interleave_impl))
"""``(indices, n) = repeat_interleave_sized(counts)``: ``torch.repeat_interleave(counts)``
(index ``i`` repeated ``counts[i]`` times) and its length."""


def repeat_interleave_tensor(input, repeats, dim, output_size):
    """``repeat_interleave`` with tensor counts: the indices, then ``index_select``."""
    if repeats is None:                                   # torch.repeat_interleave(counts)
        check(input.ndim <= 1, lambda: "repeat_interleave: repeats must be 0-dim or 1-dim tensor")
        return _indices(shapes.reshape(input, -1), output_size)
    x = shapes.reshape(input, -1) if dim is None else input
    d = 0 if dim is None else canonical_dim(dim, x.ndim)
    check(repeats.ndim <= 1, lambda: "repeat_interleave: repeats must be 0-dim or 1-dim tensor")
    counts = shapes.reshape(repeats, -1)
    if counts.shape[0] == 1 and x.shape[d] != 1:
        counts = expand_to(counts, (x.shape[d],))
    check(counts.shape[0] == x.shape[d],
          lambda: "repeats must have the same size as input along dim")
    return prims.index_select(x, d, _indices(counts, output_size))


def _indices(counts, output_size):
    idx = repeat_interleave_sized(counts)[0]
    if output_size is not None:            # the caller states the length: a static size
        idx = prims.reshape(idx, (output_size,))
    return idx


# --- bincount -------------------------------------------------------------------------------

def _bincount_meta(input, weights, minlength):
    check(input.ndim == 1 and not input.dtype.is_floating_point and input.dtype is not torch.bool,
          lambda: "bincount only supports 1-d non-negative integral inputs.")
    check(minlength >= 0, lambda: "minlength should be >= 0")
    check(weights is None or tuple(weights.shape) == tuple(input.shape),
          lambda: "weights should be 1-d and have the same length as input")
    proxy, n = unbacked(f"the length of torch.bincount({input.name})", lower=minlength)
    dtype = torch.int64 if weights is None else weights.dtype if weights.dtype is torch.float32 else torch.float64
    return TensorProxy(shape=(n,), dtype=dtype, device=input.device), proxy


def _bincount_impl(input, weights, minlength):
    r = torch.bincount(input, weights, minlength)
    return r, r.shape[0]


bincount_sized = register_leaf(Symbol("bincount_sized", meta=_bincount_meta, module="ltorch",
                                      tags={Tag.UNBACKED}, torch_fn=_bincount_impl))
"""``(counts, n) = bincount_sized(input, weights, minlength)``: ``torch.bincount`` and its
length (``max(input) + 1``, at least ``minlength``)."""


@torchsymbol(torch.bincount, T.bincount, method_name="bincount")
def bincount(input, weights=None, minlength: int = 0):
    return bincount_sized(input, weights, minlength)[0]


# --- values read back as Python numbers --------------------------------------------------------

@torchsymbol(torch.equal, T.equal, method_name="equal")
def equal(input, other):
    """A symbolic bool: return it or pass it on; branching on it is data-dependent."""
    if tuple(input.shape) != tuple(other.shape):
        return False
    return prims.item(red.all(ew.eq(input, other)))


@torchsymbol(torch.allclose, T.allclose, method_name="allclose")
def allclose(input, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False):
    return prims.item(red.all(ew.isclose(input, other, rtol, atol, equal_nan)))


@torchsymbol(T.item, method_name="item")
def item(a):
    """The number in a one-element tensor: an int is an unbacked ``SymInt`` (of
    unknown sign) usable in size arithmetic, a float or bool a ``NumberProxy``."""
    out = prims.item(a)
    return as_unbacked(out, f"{a.name}.item()") if out.python_type is int else out


@torchsymbol(T.tolist, method_name="tolist")
def tolist(a):
    """One ``item`` per element (each a symbolic number), nested as the tensor's dims."""
    return _tolist(a)


def _tolist(a):
    if a.ndim == 0:
        return item(a)
    return [_tolist(shapes.select(a, 0, i)) for i in range(a.shape[0])]


# --- checks of values, made when the program runs ---------------------------------------------

def _check_values_impl(cond, message, error):
    if not bool(cond):
        raise error(message)


check_values = register_leaf(Symbol("check_values", meta=lambda cond, message, error: None, module="ltorch",
                                    tags={Tag.DONT_DCE}, torch_fn=_check_values_impl))
"""``check_values(cond, message, error)``: raises ``error(message)`` when the bool
tensor ``cond`` is false: an op's check of its arguments' values (``any(var < 0)``
in ``gaussian_nll_loss``), which tracing cannot decide, runs with the program."""


def check_all(cond, message: str, error: type = RuntimeError) -> None:
    check_values(red.all(cond), message, error)


# --- torch calls whose sizes come from their arguments, with no meta kernel -------------------------

def _histogram_meta(input, bins, *, range=None, weight=None, density=False):
    n = bins.numel() - 1 if isinstance(bins, TensorProxy) else bins
    like = dict(dtype=input.dtype, device=input.device)
    return TensorProxy(shape=(n,), **like), TensorProxy(shape=(n + 1,), **like)


histogram_leaf = register_leaf(Symbol("histogram_leaf", meta=_histogram_meta, module="ltorch",
                                      torch_fn=lambda *a, **k: tuple(torch.histogram(*a, **k))))


@torchsymbol(torch.histogram, T.histogram, method_name="histogram")
def histogram(input, bins=100, *, range=None, weight=None, density: bool = False):
    """Sizes from ``bins`` (torch has no meta kernel for it: run as one torch call)."""
    return histogram_leaf(input, bins, range=range, weight=weight, density=density)
