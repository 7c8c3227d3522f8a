"""Symbols only autodiff emits, each with the implementation that runs it.

They are leaf symbols with an ``impl`` (printed under ``autodiff.``): no
executor has anything better to do with them, and they must run exactly once
per call. Their bound symbols are built directly by autodiff.py (``bind``),
so their meta functions only check what they are given.
"""
from __future__ import annotations

import torch

from thunderlite.core import pytree
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import Symbol


def _unpack_saved_impl(saved: list) -> tuple:
    """Take the saved intermediates out of the list ``ctx`` kept them in, so the
    backward holds the only reference and can free each after its last use."""
    items = tuple(saved)
    saved.clear()
    return items


def _no_meta(*args, **kwargs):
    raise RuntimeError("this symbol is built by autodiff with bind(), never traced")


UNPACK_SAVED = Symbol("unpack_saved", meta=_no_meta, impl=_unpack_saved_impl, module="autodiff")


def _opaque_with_graph_impl(fn, args, kwargs, mask):
    """Run an opaque op with autograd on, on detached copies of its inputs
    (``mask`` says which tensor inputs need a gradient; 2: a gradient, and the op
    writes it). Returns the detached outputs and the handle ``[inputs, outputs]``
    holding the op's graph.

    A written input goes in as a clone of its detached leaf (a write into a leaf
    that requires grad is an error, into a non-leaf it is recorded as eager
    records it), and the clone's new value is copied back into the caller's
    tensor; an output that is the clone comes back as that tensor. A written
    tensor given twice is one clone (the op sees one tensor, as in eager): its
    leaf is listed at each position, and gets its gradient at the first.
    The handle's third item says which outputs are the op's own (not a written
    clone): only they lead through the op's node (``skip_graph``)."""
    flags = iter(mask)
    inputs, written = [], []
    once: dict[int, tuple] = {}

    def prep(x):
        flag = next(flags) if isinstance(x, torch.Tensor) else 0
        if not flag:
            return x
        if flag == 2 and id(x) in once:
            d, c = once[id(x)]
            inputs.append(d)
            return c
        d = x.detach().requires_grad_(True)
        inputs.append(d)
        if flag == 2:
            c = d.clone()
            written.append((c, x))
            once[id(x)] = (d, c)
            return c
        return d
    with torch.enable_grad():
        args2, kwargs2 = pytree.tree_map(prep, (args, kwargs))
        out = fn(*args2, **kwargs2)
    real = {}
    with torch.no_grad():
        for c, x in written:
            x.copy_(c)
            real[id(c)] = x
    outs = [o for o in pytree.leaves(out) if isinstance(o, torch.Tensor)]
    detached = pytree.tree_map(lambda o: (real[id(o)].detach() if id(o) in real else o.detach())
                               if isinstance(o, torch.Tensor) else o, out)
    return detached, [inputs, outs, [id(o) not in real for o in outs]]


OPAQUE_WITH_GRAPH = Symbol("opaque_with_graph", meta=_no_meta, impl=_opaque_with_graph_impl, module="autodiff")


def skip_graph(handle: list) -> None:
    """Mark a graph whose op's own outputs no gradient reaches: its
    ``opaque_backward`` differentiates only the tensors the op wrote (their
    history runs around the op: its write is below autograd), so eager's
    backward, which never visits the op's node, is what runs (an op with no
    autograd formula raises there only when reached)."""
    inputs, outs, own = handle
    handle[1] = [None if mine else o for o, mine in zip(outs, own, strict=True)]


def _opaque_backward_impl(handle: list, grads: tuple) -> tuple:
    """``torch.autograd.grad`` through the graph an ``opaque_with_graph`` kept;
    the handle is emptied so the graph is freed right away."""
    inputs, outs, _ = handle
    handle.clear()
    pairs = [(o, g) for o, g in zip(outs, grads, strict=True)
             if g is not None and o is not None and o.requires_grad]
    if not pairs or not inputs:
        return tuple(torch.zeros_like(i) for i in inputs)
    unique = list({id(i): i for i in inputs}.values())
    res = torch.autograd.grad([o for o, _ in pairs], unique, [g for _, g in pairs], allow_unused=True)
    first = {id(i): r for i, r in zip(unique, res, strict=True)}
    return tuple(torch.zeros_like(i) if r is None else r for i, r in
                 ((i, first.pop(id(i), None)) for i in inputs))


OPAQUE_BACKWARD = Symbol("opaque_backward", meta=_no_meta, impl=_opaque_backward_impl, module="autodiff")


_vjps: dict = {}


def autograd_vjp(fn, mask: tuple[bool, ...]):
    """``run(grads, args, kwargs)``: the gradients of ``fn(*args, **kwargs)``'s
    tensor outputs, weighted by ``grads`` (one per output, or None), with
    respect to the tensor leaves of ``(args, kwargs)`` that ``mask`` selects
    (zeros where no path reaches one), by PyTorch's autograd, recomputing
    ``fn``. Where it is differentiated once more (grad mode on and an input
    requiring grad: an opaque op with its graph) the gradients keep their graph
    (``create_graph``) and an input that requires grad is differentiated as it
    is, so the chain stays connected to order after order. One callable per
    ``(fn, mask)``."""
    key = (fn, mask)
    run = _vjps.get(key)
    if run is not None:
        return run

    def run(grads, args, kwargs):
        create = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                                 for t in pytree.leaves((grads, args, kwargs)))
        flags = iter(mask)
        wanted: list[torch.Tensor] = []

        def prep(x):
            if not isinstance(x, torch.Tensor) or not next(flags):
                return x
            x = x if create and x.requires_grad else x.detach().requires_grad_()
            wanted.append(x)
            return x
        with torch.enable_grad():
            ins, kw = pytree.tree_map(prep, (args, kwargs))
            out = fn(*ins, **kw)
            outs = [o for o in pytree.leaves(out) if isinstance(o, torch.Tensor)]
            pairs = [(o, g) for o, g in zip(outs, grads, strict=True)
                     if g is not None and o.requires_grad]
            unique = list({id(w): w for w in wanted}.values())     # a tensor given twice: its total, once
            res = torch.autograd.grad([o for o, _ in pairs], unique, [g for _, g in pairs], allow_unused=True,
                                      create_graph=create) if pairs else [None] * len(unique)
        first = {id(w): r for w, r in zip(unique, res, strict=True)}
        return tuple(torch.zeros_like(w) if r is None else r for w, r in
                     ((w, first.pop(id(w), None)) for w in wanted))
    run.__name__ = f"{getattr(fn, '__name__', 'op').lstrip('_')}_vjp"
    _vjps[key] = run
    return run


def _conv_output_mask(bias, mask) -> list[bool]:
    """Which of (input, weight, bias) get a gradient: ``mask`` (all by default), no bias none."""
    mask = (True, True, True) if mask is None else mask
    return [bool(mask[0]), bool(mask[1]), bias is not None and bool(mask[2])]


def _conv_backward_meta(g, a, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                        mask=None):
    want = _conv_output_mask(bias, mask)
    return tuple(t.replace(requires_grad=False) if w else None for t, w in zip((a, weight, bias), want, strict=True))


def _conv_backward_impl(g, a, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                        mask=None):
    return tuple(torch.ops.aten.convolution_backward(
        g, a, weight, None if bias is None else list(bias.shape), stride, padding, dilation,
        transposed, output_padding, groups, _conv_output_mask(bias, mask)))


convolution_backward = Symbol("convolution_backward", meta=_conv_backward_meta, impl=_conv_backward_impl,
                              module="autodiff")
"""The gradients of ``prims.convolution`` in one call (aten's own kernel):
decomposing them into transposed convolutions would be slower and longer.
``mask``: which of (input, weight, bias) to compute (the kernel skips the
others: a vision model's patch embedding needs no gradient of its pixels,
which cost four times the weight's)."""


def _backward_error_meta(message: str, shape, dtype, device):
    return TensorProxy(shape=shape, dtype=dtype, device=device)


def _backward_error_impl(message: str, shape, dtype, device):
    raise RuntimeError(message)


BACKWARD_ERROR = Symbol("backward_error", meta=_backward_error_meta, impl=_backward_error_impl, module="autodiff")
"""A gradient eager PyTorch does not implement: the forward runs, and the
backward raises the same error eager raises, when (and only if) it runs."""


# --- backward kernels of the fallback rules (N-d cross_entropy, batch_norm); the main ones,
# with decompositions for fusion executors, are in autodiff/kernels.py ---------------------

def _cross_entropy_backward_meta(g, a, target, ignore_index, reduction):
    return a.replace(requires_grad=False)


def _cross_entropy_backward_impl(g, a, target, ignore_index, reduction):
    """softmax(a) minus the one-hot target, masked and scaled, in place."""
    c_dim = 1 if a.ndim > 1 else 0
    grad = torch.softmax(a, c_dim)
    valid = (target != ignore_index).unsqueeze(c_dim)
    safe = target.unsqueeze(c_dim).masked_fill(~valid, 0)
    grad.scatter_add_(c_dim, safe, -valid.to(grad.dtype))
    grad.mul_(valid)
    if reduction == "mean":
        grad.mul_(g / valid.sum())
    elif reduction == "sum":
        grad.mul_(g)
    else:
        grad.mul_(g.unsqueeze(c_dim))
    return grad


cross_entropy_backward = Symbol("cross_entropy_backward", meta=_cross_entropy_backward_meta,
                                impl=_cross_entropy_backward_impl, module="autodiff")


def _batch_norm_backward_meta(g, a, weight, running_mean, running_var, training, eps, mask):
    return (a.replace(requires_grad=False),
            weight.replace(requires_grad=False) if mask[1] else None,
            weight.replace(requires_grad=False) if mask[2] else None)


def _batch_norm_backward_impl(g, a, weight, running_mean, running_var, training, eps, mask):
    """Training: batch statistics recomputed from the input (the running stats
    were updated in place by the forward and are not read). Eval: the running
    statistics, as eager."""
    if training:
        dims = [d for d in range(a.ndim) if d != 1]
        with torch.no_grad():   # the kernel's double backward accounts for the statistics' dependence on ``a``
            var, mean = torch.var_mean(a, dims, correction=0)
        return torch.ops.aten.native_batch_norm_backward(g, a, weight, None, None, mean, torch.rsqrt(var + eps),
                                                         True, eps, list(mask))
    return torch.ops.aten.native_batch_norm_backward(g, a, weight, running_mean, running_var, None, None,
                                                     False, eps, list(mask))


batch_norm_backward = Symbol("batch_norm_backward", meta=_batch_norm_backward_meta, impl=_batch_norm_backward_impl,
                             module="autodiff")
