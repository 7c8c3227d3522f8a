"""Batching rules: the symbols of a per-example sub-trace re-recorded on a
leading batch dimension (``torch.func.vmap`` inside a trace, frontend/functorch/).

``batch(bsyms, env, size, randomness, what)`` replays ``bsyms`` (recorded on
per-example proxies) into the current trace. ``env`` maps the name of every
*batched* per-example value to its physical value, whose dim 0 is the batch
(size ``size``); values not in ``env`` are the same for every example and are
used as they are. A symbol none of whose arguments is batched is kept whole
(composites stay composites); a batched one is re-recorded by its rule
(``RULES``, keyed by symbol id: the prims and a few torch-level symbols), and a
composite without a rule is replaced by its decomposition, recursively. A leaf
without a rule is a ``NotImplementedError`` naming it and the user's line (a
batched opaque op runs under PyTorch's own ``torch.vmap``). Most rules shift
dims by one: elementwise ops see operands of one shape (an unbatched operand
is broadcast along the batch), views and reductions get ``dim + 1``, matmul
treats a batched vector as a matrix.

Random symbols follow vmap's ``randomness``: ``"error"`` refuses them (as
eager), ``"same"`` draws once for the whole batch, ``"different"`` draws one
value per example (a leading batch dim on the shape).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from thunderlite.core import prims, pytree
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag
from thunderlite.core.tracectx import current_trace, made_once
from thunderlite.torch import opaque_symbol_for
from thunderlite.transforms.autodiff.inline import cross_entropy_backward_reference

RULES: dict[str, Callable] = {}


class Batch:
    """What a rule sees: the batch size and the physical values of arguments."""

    def __init__(self, env: dict, size):
        self.env = env
        self.size = size

    def batched(self, x) -> bool:
        return type(x) is TensorProxy and x.name in self.env

    def phys(self, x):
        """The physical value (batch first) of a batched proxy, else ``x``; containers mapped."""
        if type(x) is TensorProxy:
            return self.env.get(x.name, x)
        if type(x) in (list, tuple):
            return type(x)(self.phys(y) for y in x)
        return x

    def lift(self, x):
        """``x`` with a batch dim: batched values as they are, others broadcast along it."""
        if type(x) is not TensorProxy:
            return x
        if x.name in self.env:
            return self.env[x.name]
        return prims.broadcast_in_dim(x, (self.size, *x.shape), tuple(range(1, x.ndim + 1)))


def register(*ids: str):
    def deco(fn):
        for i in ids:
            if i in RULES:
                raise ValueError(f"batching rule for {i} registered twice")
            RULES[i] = fn
        return fn
    return deco


def _where(bsym: BoundSymbol) -> str:
    if bsym.source is None:
        return "an unknown line"
    fname, lineno, text = bsym.source
    return f"{fname}:{lineno} ({(text or '').strip()})"


def batch(bsyms, env: dict, size, randomness: str, what: str) -> None:
    """Re-record ``bsyms`` batched into the current trace (see module docstring);
    ``env`` gains the physical values of the batched outputs."""
    trc = current_trace()
    b = Batch(env, size)
    for bsym in bsyms:
        sym = bsym.sym
        if Tag.RETURN in sym.tags:
            continue
        random = Tag.RANDOM in sym.tags
        if random and randomness == "error":
            raise RuntimeError(
                f"vmap: called random operation while in randomness error mode ({sym.id} at {_where(bsym)}). "
                "Please either use the 'same' or 'different' randomness flags on vmap or perform the randomness "
                "operation out of vmap")
        on_batch = any(p.name in env for p in bsym.proxy_args())
        if not on_batch and not (random and randomness == "different"):
            trc.add_bound_symbol(bsym)
            continue
        rule = RULES.get(sym.id)
        if rule is None and random and not bsym.subsymbols:
            rule = functools.partial(_random, sym)
        if rule is None and not bsym.subsymbols and Tag.OPAQUE in sym.tags and sym.torch_fn is not None:
            rule = functools.partial(_opaque, bsym)
        if rule is not None:
            source = trc.source
            trc.source = bsym.source
            try:
                out = rule(b, *bsym.args, **bsym.kwargs)
            finally:
                trc.source = source
            for lo, po in zip(pytree.leaves(bsym.output), pytree.leaves(out), strict=True):
                if type(lo) is TensorProxy and type(po) is TensorProxy:
                    env[lo.name] = po
            continue
        if bsym.subsymbols:
            subs = bsym.parts()
            batch(subs, env, size, randomness, what)
            continue
        raise NotImplementedError(
            f"{what}: no batching rule for {sym.id} (used at {_where(bsym)}); register one in "
            "thunderlite/transforms/batching.py, or call the function on each example")


# --- elementwise ----------------------------------------------------------------------

def _make_elementwise(sym):
    def rule(b: Batch, *args, **kwargs):
        return sym(*(b.lift(a) for a in args), **{k: b.lift(v) for k, v in kwargs.items()})
    return rule


for _name in prims.UNARY + prims.BINARY + prims.TERNARY + ["where", "convert_element_type", "device_put",
                                                            "clone"]:
    RULES[f"prims.{_name}"] = _make_elementwise(getattr(prims, _name))


# --- shapes and views ------------------------------------------------------------------

def _canon(d: int, ndim: int) -> int:
    return d % max(ndim, 1)


@register("prims.broadcast_in_dim")
def _broadcast_in_dim(b: Batch, a, shape, broadcast_dims):
    return prims.broadcast_in_dim(b.phys(a), (b.size, *shape), (0, *(d + 1 for d in broadcast_dims)))


@register("prims.reshape")
def _reshape(b: Batch, a, shape):
    return prims.reshape(b.phys(a), (b.size, *shape))


@register("prims.permute")
def _permute(b: Batch, a, perm):
    return prims.permute(b.phys(a), (0, *(_canon(p, a.ndim) + 1 for p in perm)))


@register("prims.slice_prim")
def _slice(b: Batch, a, start_indices, end_indices, strides=None):
    strides = (1,) * a.ndim if strides is None else tuple(strides)
    return prims.slice_prim(b.phys(a), (0, *start_indices), (b.size, *end_indices), (1, *strides))


@register("prims.squeeze")
def _squeeze(b: Batch, a, dims):
    return prims.squeeze(b.phys(a), tuple(_canon(d, a.ndim) + 1 for d in dims))


@register("prims.flip")
def _flip(b: Batch, a, dims):
    return prims.flip(b.phys(a), tuple(_canon(d, a.ndim) + 1 for d in dims))


@register("prims.cat")
def _cat(b: Batch, tensors, dim):
    return prims.cat([b.lift(t) for t in tensors], _canon(dim, tensors[0].ndim) + 1)


@register("prims.pad")
def _pad(b: Batch, a, padding_value, padding_config):
    return prims.pad(b.phys(a), padding_value, ((0, 0, 0), *padding_config))


@register("prims.copy_")
def _copy(b: Batch, src, dst):
    if not b.batched(dst):
        raise RuntimeError(
            "vmap: inplace arithmetic(self, *extra_args) is not possible because there exists a Tensor `other` in "
            "extra_args that has more elements than `self`. This happened due to `other` being vmapped over but "
            "`self` not being vmapped over in a vmap. Please try to use out-of-place operators instead of "
            "inplace arithmetic.")
    return prims.copy_(b.lift(src), b.phys(dst))


# --- reductions and scans --------------------------------------------------------------

def _dims(dims, ndim: int) -> tuple:
    return tuple(_canon(d, ndim) + 1 for d in dims)


def _make_reduction(sym):
    def rule(b: Batch, a, dims, **kwargs):
        return sym(b.phys(a), _dims(dims, a.ndim), **kwargs)
    return rule


for _name in ("sum", "prod", "amax", "amin", "var", "var_mean"):
    RULES[f"prims.{_name}"] = _make_reduction(getattr(prims, _name))


def _make_dim_op(sym):
    def rule(b: Batch, a, dim, *args, **kwargs):
        if dim is None:                 # argmax over all elements: over the flattened example
            flat = prims.reshape(b.phys(a), (b.size, a.numel()))
            return sym(flat, 1, *args, **kwargs)
        return sym(b.phys(a), _canon(dim, a.ndim) + 1, *args, **kwargs)
    return rule


for _name in ("argmax", "argmin", "cumsum", "cumprod"):
    RULES[f"prims.{_name}"] = _make_dim_op(getattr(prims, _name))


@register("prims.topk")
def _topk(b: Batch, a, k, dim, largest, sorted):
    return prims.topk(b.phys(a), k, _canon(dim, a.ndim) + 1, largest, sorted)


@register("prims.sort")
def _sort(b: Batch, a, dim, descending, **kwargs):
    return prims.sort(b.phys(a), _canon(dim, a.ndim) + 1, descending, **kwargs)


# --- indexing --------------------------------------------------------------------------

@register("prims.gather")
def _gather(b: Batch, a, dim, index):
    return prims.gather(b.lift(a), _canon(dim, a.ndim) + 1, b.lift(index))


@register("prims.take_along_axis")
def _take_along_axis(b: Batch, a, index, dim):
    return prims.take_along_axis(b.lift(a), b.lift(index), _canon(dim, a.ndim) + 1)


@register("prims.index_select")
def _index_select(b: Batch, a, dim, index):
    d = _canon(dim, a.ndim)
    if not b.batched(index):
        return prims.index_select(b.phys(a), d + 1, index)
    # a per-example index: a gather along the dim with the index broadcast over the other dims
    idx = b.phys(index)
    if index.ndim == 0:
        idx = prims.reshape(idx, (b.size, 1))
    n = idx.shape[1]
    shape = (b.size, *a.shape[:d], n, *a.shape[d + 1:])
    idx = prims.broadcast_in_dim(idx, shape, (0, d + 1))
    out = prims.gather(b.lift(a), d + 1, idx)
    return prims.squeeze(out, (d + 1,)) if index.ndim == 0 and a.ndim > 0 else out


def _make_scatter(sym):
    def rule(b: Batch, a, dim, index, src):
        return sym(b.lift(a), _canon(dim, a.ndim) + 1, b.lift(index), b.lift(src))
    return rule


RULES["prims.scatter"] = _make_scatter(prims.scatter)
RULES["prims.scatter_add"] = _make_scatter(prims.scatter_add)


@register("prims.index_add")
def _index_add(b: Batch, a, dim, index, source):
    if b.batched(index):
        raise NotImplementedError("vmap: index_add with a batched index has no batching rule")
    return prims.index_add(b.lift(a), _canon(dim, a.ndim) + 1, index, b.lift(source))


@register("prims.index_put")
def _index_put(b: Batch, a, indices, values, accumulate):
    """The batch is one more index: ``arange(B)`` broadcast against the
    example's (integer) indices; values get the batch dim in front of theirs."""
    if any(i.dtype in (torch.bool, torch.uint8) for i in indices):
        raise NotImplementedError("vmap: index_put with boolean indices has no batching rule")
    idx_shape = prims.broadcast_shapes(*(i.shape for i in indices))
    n = len(idx_shape)
    ar = prims.iota(b.size, start=0, step=1, device=a.device, dtype=torch.int64)
    ar = prims.broadcast_in_dim(ar, (b.size, *idx_shape), (0,))
    idx = [prims.broadcast_in_dim(b.lift(i), (b.size, *idx_shape), (0, *range(1 + n - i.ndim, 1 + n)))
           for i in indices]
    rest = tuple(a.shape[len(indices):])
    full = (*idx_shape, *rest)
    v = b.lift(values)
    v = prims.broadcast_in_dim(v, (b.size, *full), (0, *range(1 + len(full) - values.ndim, 1 + len(full))))
    return prims.index_put(b.lift(a), [ar, *idx], v, accumulate)


# --- matmul ----------------------------------------------------------------------------

@register("prims.matmul")
def _matmul(b: Batch, a, c):
    ba, bc = b.batched(a), b.batched(c)
    pa, pc = b.phys(a), b.phys(c)
    if ba and bc:
        # both batched: vectors become matrices so the batch dims line up
        if a.ndim == 1:
            pa = prims.reshape(pa, (b.size, 1, a.shape[0]))
        if c.ndim == 1:
            pc = prims.reshape(pc, (b.size, c.shape[0], 1))
        if a.ndim > 2 or c.ndim > 2:       # align the example's own batch dims (broadcast by matmul)
            nd = max(pa.ndim, pc.ndim)
            pa = _unsqueeze_after_batch(pa, nd - pa.ndim)
            pc = _unsqueeze_after_batch(pc, nd - pc.ndim)
        out = prims.matmul(pa, pc)
        drop = (() if a.ndim > 1 else (out.ndim - 2,)) + (() if c.ndim > 1 else (out.ndim - 1,))
        return prims.squeeze(out, drop) if drop else out
    if ba:
        if c.ndim > 2:
            return _matmul(_both(b, a, c), a, c)
        return prims.matmul(pa, pc)           # (B, ..., n, k) or (B, k) @ (k, m) or (k,)
    if c.ndim == 1 or a.ndim > 2:
        return _matmul(_both(b, a, c), a, c)
    # (n, k) or (k,) @ (B, ..., k, m): the batched operand carries the batch
    return prims.matmul(pa, pc)


def _both(b: Batch, *xs) -> Batch:
    env = dict(b.env)
    for x in xs:
        env[x.name] = b.lift(x)
    return Batch(env, b.size)


def _unsqueeze_after_batch(x: TensorProxy, n: int) -> TensorProxy:
    if n == 0:
        return x
    return prims.broadcast_in_dim(x, (x.shape[0], *(1,) * n, *x.shape[1:]),
                                  (0, *range(n + 1, x.ndim + n)))


# --- random and opaque -----------------------------------------------------------------

def _random(sym, b: Batch, shape, *params, **kwargs):
    """A draw per example: the batch is a leading dim of the drawn shape."""
    return sym((b.size, *shape), *(b.lift(p) for p in params), **kwargs)


_vmapped: dict = {}


def _under_torch_vmap(fn, what: str, b: Batch, args: tuple, kwargs: dict):
    """``fn`` (a torch callable) on the physical values under PyTorch's own vmap:
    one opaque call of ``torch.vmap(fn)``, which has batching rules of its own."""
    if any(b.batched(p) for p in pytree.leaves(kwargs)):
        raise NotImplementedError(f"vmap: {what} gets a batched tensor as a keyword argument; pass it positionally")
    dims = pytree.tree_map(lambda x: 0 if b.batched(x) else None, args)
    key = (fn, repr(dims))
    mapped = made_once(_vmapped, key, lambda: torch.vmap(fn, in_dims=dims))
    return opaque_symbol_for(mapped)(*b.phys(args), **kwargs)


def _opaque(bsym: BoundSymbol, b: Batch, *args, **kwargs):
    """A batched opaque op (no symbol of ours) runs under PyTorch's own vmap."""
    return _under_torch_vmap(bsym.sym.torch_fn, f"the opaque op {bsym.sym.name} (used at {_where(bsym)})",
                             b, args, kwargs)


@register("prims.convolution")
def _convolution(b: Batch, a, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if b.batched(weight) or b.batched(bias):
        return _under_torch_vmap(torch.ops.aten.convolution.default, "convolution", b,
                                 (a, weight, bias, stride, padding, dilation, transposed, output_padding, groups), {})
    # the examples' own batch dims folded into one
    pa = b.phys(a)
    folded = prims.reshape(pa, (b.size * a.shape[0], *a.shape[1:]))
    out = prims.convolution(folded, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    return prims.reshape(out, (b.size, a.shape[0], *out.shape[1:]))


def _conv_backward_kernel(g, a, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = torch.ops.aten.convolution_backward(
        g, a, weight, None if bias is None else list(bias.shape), stride, padding, dilation, transposed,
        output_padding, groups, [True, True, bias is not None])
    return out if bias is not None else out[:2]        # torch.vmap maps tensors only


@register("autodiff.convolution_backward")
def _convolution_backward(b: Batch, g, a, weight, bias, stride, padding, dilation, transposed, output_padding,
                          groups, mask=None):
    """Every gradient, batched (torch.vmap maps tensors only), then those ``mask`` leaves out dropped."""
    args = (g, a, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    out = _under_torch_vmap(_conv_backward_kernel, "convolution_backward", b, args, {})
    out = out if bias is not None else (*out, None)
    if mask is None:
        return out
    return tuple(o if keep else None for o, keep in zip(out, mask, strict=True))


@register("autodiff.cross_entropy_backward")
def _cross_entropy_backward(b: Batch, g, a, target, ignore_index, reduction):
    return _under_torch_vmap(cross_entropy_backward_reference, "cross_entropy_backward", b,
                             (g, a, target, ignore_index, reduction), {})
