"""Direct VJP rules for torch-level symbols where differentiating the
decomposition would be wasteful: the forward keeps the one torch call (a fused
kernel), the backward is the short textbook formula, and the saved values are
the op's inputs (which the program usually keeps anyway) instead of every
intermediate of the decomposition.

Each rule has a ``when`` predicate; a call it does not cover (an unusual
dtype, dropout inside attention, ``max_norm`` on an embedding...) is
differentiated through its decomposition instead, which is always correct.
Registered into the one table of autodiff/rules.py.
"""
from __future__ import annotations

import math

import torch

from thunderlite.core import dtypes, prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.torch.ops import composites, linalg, shapes
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.ops import nn as lnn
from thunderlite.torch.ops import reductions as red
from thunderlite.transforms.autodiff import kernels
from thunderlite.transforms.autodiff.rules import (
    UNARY_RULES,
    backward_error,
    matmul_vjp,
    register_differentiable_again,
    register_forward,
    register_vjp,
    reshape_to,
    sum_to,
    vjp_rule,
    zeros_like,
)
from thunderlite.transforms.autodiff.symbols import batch_norm_backward, cross_entropy_backward

_FLOATS = (torch.float32, torch.float64)


def _wants(x) -> bool:
    return isinstance(x, TensorProxy) and x.requires_grad


def _float_input(bsym) -> bool:
    first = bsym.tensor_args()
    return bool(first) and first[0].dtype in _FLOATS


def _kernel_input(bsym) -> bool:
    """Float input of any precision: the rules whose backward is ATen's fused
    kernel (autodiff/kernels.py) take float16/bfloat16 too, as eager runs
    them, the kernels computing in float32 (so mixed-precision training gets
    them); the other rules, float32/float64 only."""
    first = bsym.tensor_args()
    return bool(first) and (first[0].dtype in _FLOATS or first[0].dtype in dtypes.low_precision_floats)


def _arg(bsym, index: int, name: str, default=None):
    if len(bsym.args) > index:
        return bsym.args[index]
    return bsym.kwargs.get(name, default)


# --- matmul and linear -----------------------------------------------------------------------

register_vjp(linalg.matmul)(lambda g, out, input, other: matmul_vjp(g, input, other))


def _linear_when(bsym) -> bool:
    """A 2-d weight and a float input."""
    w = _arg(bsym, 1, "weight")
    return isinstance(w, TensorProxy) and w.ndim == 2 and _kernel_input(bsym)


@register_vjp(shapes.split, when=lambda b: _kernel_input(b) and b.tensor_args()[0].ndim > 0)
def _split(g, out, a, split_size_or_sections, dim=0):
    """One cat of the pieces' gradients (eager's split_backward), not a pad and
    an add per piece."""
    parts = [gi if gi is not None else zeros_like(o) for gi, o in zip(g, out, strict=True)]
    return shapes.cat(parts, dim % a.ndim), None, None


@register_vjp(shapes.contiguous)
def _contiguous(g, out, a, memory_format=None):
    return (g,)


@register_vjp(linalg.linear, when=_linear_when, fused=True)
def _linear(g, out, input, weight, bias=None):
    """The forward stays one linear (addmm); the backward is two matmuls and a sum, as eager's."""
    n_out, n_in = weight.shape
    rows = math.prod(input.shape[:-1])      # 0 for an empty batch; 1 for a 1-d input
    g2 = reshape_to(g, (rows, n_out))
    # the weight's gradient first: it is the last read of the saved input (often an activation, or one
    # recomputed for it), which then dies before the input's gradient, as large, is allocated
    gw = linalg.matmul(shapes.transpose(g2, 0, 1), reshape_to(input, (rows, n_in))) if _wants(weight) else None
    gb = red.sum(g2, 0) if _wants(bias) else None
    gi = linalg.matmul(g, weight) if _wants(input) else None
    return gi, gw, gb


# --- dropout ------------------------------------------------------------------------------------------

def _dropout_when(bsym) -> bool:
    """float32/float64 input, training, 0 < p < 1, not in place."""
    p, training = _arg(bsym, 1, "p", 0.5), _arg(bsym, 2, "training", True)
    return (_float_input(bsym) and training is True and isinstance(p, float) and 0.0 < p < 1.0
            and not _arg(bsym, 3, "inplace", False))


@register_forward(lnn.dropout, when=_dropout_when)
def _dropout_forward(input, p=0.5, training=True, inplace=False):
    """native_dropout: the output and the mask its backward reuses (eager's)."""
    return kernels.native_dropout(input, p, True)


@register_vjp(kernels.native_dropout)
def _native_dropout(g, out, input, p, train):
    if g[0] is None:
        return None, None, None
    return kernels.native_dropout_backward(g[0], out[1], 1.0 / (1.0 - p)), None, None


# --- softmax family ----------------------------------------------------------------------------

def _softmax_dim(input, dim):
    return dim if dim is not None else (0 if input.ndim in (0, 1, 3) else 1)


def _softmax_when(bsym) -> bool:
    """A float input of at least one dim, no dtype= conversion."""
    return _kernel_input(bsym) and _arg(bsym, 3, "dtype") is None and bsym.tensor_args()[0].ndim > 0


@register_vjp(lnn.softmax, when=_softmax_when, fused=True)
def _softmax(g, out, input, dim=None, _stacklevel=3, dtype=None):
    """The forward stays one softmax; the backward is ATen's _softmax_backward_data from its output."""
    return (kernels.softmax_backward_data(g, out, _softmax_dim(input, dim) % input.ndim, input.dtype),)


@register_vjp(lnn.log_softmax, when=_softmax_when, fused=True)
def _log_softmax(g, out, input, dim=None, _stacklevel=3, dtype=None):
    """The forward stays one log_softmax; the backward is ATen's _log_softmax_backward_data from its output."""
    return (kernels.log_softmax_backward_data(g, out, _softmax_dim(input, dim) % input.ndim, input.dtype),)


# --- normalization -----------------------------------------------------------------------------

def _norm_when(bsym) -> bool:
    """Float inputs; weight and bias absent or tensors of the input's dtype
    (aten's kernels take no numbers; mixed dtypes change its statistics' dtype)."""
    w, b = _arg(bsym, 2, "weight"), _arg(bsym, 3, "bias")
    return _kernel_input(bsym) and all(x is None or isinstance(x, TensorProxy) and x.dtype == bsym.args[0].dtype
                                       for x in (w, b))


@register_forward(lnn.layer_norm, when=_norm_when)
def _layer_norm_forward(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """native_layer_norm: the output plus the mean and rstd eager saves."""
    return kernels.native_layer_norm(input, tuple(normalized_shape), weight, bias, eps)


@register_vjp(kernels.native_layer_norm)
def _native_layer_norm(g, out, input, normalized_shape, weight, bias, eps):
    if g[0] is None:
        return None, None, None, None, None
    mask = [_wants(input), _wants(weight), _wants(bias)]
    gi, gw, gb = kernels.native_layer_norm_backward(g[0], input, normalized_shape, out[1], out[2], weight, bias, mask)
    return gi, None, gw, gb, None


def _rms_norm_when(bsym) -> bool:
    """A float input; the weight absent or a tensor."""
    return _kernel_input(bsym) and not isinstance(_arg(bsym, 2, "weight", 0), float)


@register_forward(lnn.rms_norm, when=_rms_norm_when)
def _rms_norm_forward(input, normalized_shape, weight=None, eps=None):
    """_fused_rms_norm: the output plus the rstd eager saves."""
    return kernels.fused_rms_norm(input, tuple(normalized_shape), weight, eps)


@register_vjp(kernels.fused_rms_norm)
def _fused_rms_norm(g, out, input, normalized_shape, weight, eps):
    if g[0] is None:
        return None, None, None, None
    gi, gw = kernels.fused_rms_norm_backward(g[0], input, normalized_shape, out[1], weight,
                                             [_wants(input), _wants(weight)])
    return gi, None, gw, None


def _batch_norm_when(bsym) -> bool:
    x, w = _arg(bsym, 0, "input"), _arg(bsym, 3, "weight")
    training = _arg(bsym, 5, "training", False) or _arg(bsym, 1, "running_mean") is None
    return (_float_input(bsym) and x.ndim >= 2 and (w is None or isinstance(w, TensorProxy))
            and (training or isinstance(_arg(bsym, 2, "running_var"), TensorProxy)))


@register_vjp(lnn.batch_norm, when=_batch_norm_when, fused=True)
def _batch_norm(g, out, input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
                eps=1e-5):
    """aten's fused backward. The running-statistics update inside the op carries
    no gradient (as in eager): the rule owns that write."""
    training = training or running_mean is None
    if weight is None:
        weight_arg = prims.full((input.shape[1],), 1, device=input.device, dtype=input.dtype)
    else:
        weight_arg = weight
    mask = (_wants(input), _wants(weight), _wants(bias))
    gi, gw, gb = batch_norm_backward(g, input, weight_arg, None if training else running_mean,
                                     None if training else running_var, training, eps, mask)
    return (gi if mask[0] else None), None, None, gw, gb, None, None, None


# its kernel's VJP is PyTorch's exact double backward (autodiff/inline.py), and its decomposition
# would expose the running-statistics update as a write on the gradient path
register_differentiable_again(lnn.batch_norm)


# --- cross entropy -------------------------------------------------------------------------------

def _ce_when(bsym, dtype_ok=_float_input) -> bool:
    target = _arg(bsym, 1, "target")
    plain = (_arg(bsym, 2, "weight") is None and _arg(bsym, 3, "size_average") is None
             and _arg(bsym, 5, "reduce") is None and _arg(bsym, 7, "label_smoothing", 0.0) == 0.0)
    return (plain and dtype_ok(bsym) and isinstance(target, TensorProxy)
            and not target.dtype.is_floating_point and _arg(bsym, 6, "reduction", "mean") in ("mean", "sum", "none"))


_REDUCTION = {"none": 0, "mean": 1, "sum": 2}


def _ce_kernel_when(bsym) -> bool:
    """2-d float logits and 1-d class indices, no class weights, label smoothing
    or legacy size_average/reduce arguments."""
    return _ce_when(bsym, _kernel_input) and bsym.tensor_args()[0].ndim == 2 and _arg(bsym, 1, "target").ndim == 1


@register_forward(lnn.cross_entropy, when=_ce_kernel_when)
def _cross_entropy_forward(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                           reduction="mean", label_smoothing=0.0):
    """log_softmax + nll_loss, saving the log-probabilities (eager's choice)."""
    return kernels.cross_entropy_forward(input, target, _REDUCTION[reduction], ignore_index)


@register_vjp(kernels.cross_entropy_forward)
def _cross_entropy_kernel(g, out, input, target, reduction, ignore_index):
    if g[0] is None:
        return None, None, None, None
    return kernels.cross_entropy_backward(g[0], out[1], target, reduction, ignore_index, out[2]), None, None, None


def _nll_when(bsym) -> bool:
    """2-d float log-probabilities and 1-d class indices, class weights that
    need no grad (eager differentiates none), no legacy size_average/reduce."""
    input, target, weight = _arg(bsym, 0, "input"), _arg(bsym, 1, "target"), _arg(bsym, 2, "weight")
    return (_kernel_input(bsym) and input.ndim == 2 and isinstance(target, TensorProxy) and target.ndim == 1
            and not target.dtype.is_floating_point and (weight is None or isinstance(weight, TensorProxy)
                                                        and not _wants(weight))
            and _arg(bsym, 3, "size_average") is None and _arg(bsym, 5, "reduce") is None
            and _arg(bsym, 6, "reduction", "mean") in _REDUCTION)


@register_forward(lnn.nll_loss, when=_nll_when)
def _nll_loss_forward(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                      reduction="mean"):
    """nll_loss_forward: the loss plus the total weight eager saves."""
    return kernels.nll_loss_forward(input, target, weight, _REDUCTION[reduction], ignore_index)


@register_vjp(kernels.nll_loss_forward)
def _nll_loss_kernel(g, out, self, target, weight, reduction, ignore_index):
    if g[0] is None:
        return None, None, None, None, None
    return kernels.nll_loss_backward(g[0], self, target, weight, reduction, ignore_index, out[1]), None, None, None, \
        None


@register_vjp(lnn.cross_entropy, when=_ce_when, fused=True)
def _cross_entropy(g, out, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    return cross_entropy_backward(g, input, target, ignore_index, reduction), None, None, None, None, None, None, None


# --- embedding -------------------------------------------------------------------------------------------

def _embedding_when(bsym) -> bool:
    """A 2-d weight, no max_norm, not sparse."""
    w = _arg(bsym, 1, "weight")
    return (_arg(bsym, 3, "max_norm") is None and not _arg(bsym, 6, "sparse", False)
            and isinstance(w, TensorProxy) and w.ndim == 2)


@register_vjp(lnn.embedding, when=_embedding_when, fused=True)
def _embedding(g, out, input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
               scale_grad_by_freq=False, sparse=False):
    """The forward stays one embedding; the backward is ATen's embedding_dense_backward."""
    num = weight.shape[0]
    pad = -1 if padding_idx is None else (padding_idx if padding_idx >= 0 else padding_idx + num)
    return None, kernels.embedding_dense_backward(g, input, num, pad, scale_grad_by_freq), None, None, None, None, None


# --- grouped matmul (mixture of experts) ---------------------------------------------------------------

def _grouped_mm_when(bsym) -> bool:
    """No bias and the output in the operands' dtype (what PyTorch's kernel
    computes); the other calls run under PyTorch's autograd (``grouped_mm_call``)."""
    out_dtype = _arg(bsym, 4, "out_dtype")
    a = _arg(bsym, 0, "mat_a")
    return _arg(bsym, 3, "bias") is None and (out_dtype is None or out_dtype == a.dtype)


@register_vjp(linalg.grouped_mm, when=_grouped_mm_when, fused=True)
def _grouped_mm(g, out, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The forward stays ATen's grouped GEMM; the backward is two more of them."""
    ga, gb = kernels.grouped_mm_backward(g, mat_a, mat_b, offs, (_wants(mat_a), _wants(mat_b)))
    return ga, gb, None, None, None


@register_vjp(kernels.grouped_mm_backward)
def _grouped_mm_backward(gs, out, grad, mat_a, mat_b, offs, output_mask):
    """Double backward: ``grad_a = grouped_mm(grad, mat_b^T)`` and ``grad_b =
    grouped_mm(mat_a^T, grad)`` are grouped GEMMs, each differentiated by the
    same kernel."""
    gga, ggb = gs
    dgrad = da = db = None
    if gga is not None:
        dgrad, dbt = kernels.grouped_mm_backward(gga, grad, shapes.transpose(mat_b, -2, -1), offs,
                                                 (_wants(grad), _wants(mat_b)))
        db = None if dbt is None else shapes.transpose(dbt, -2, -1)
    if ggb is not None:
        dat, dgrad2 = kernels.grouped_mm_backward(ggb, shapes.transpose(mat_a, -2, -1), grad, offs,
                                                  (_wants(mat_a), _wants(grad)))
        da = None if dat is None else shapes.transpose(dat, -2, -1)
        dgrad = dgrad2 if dgrad is None else (dgrad if dgrad2 is None else ew.add(dgrad, dgrad2))
    return dgrad, da, db, None, None


register_differentiable_again(linalg.grouped_mm)


# --- float16/bfloat16 arithmetic: eager's formulas on the half-precision tensors --------------------------

def _half_arith(bsym) -> bool:
    """Every tensor argument (at least one) and the result of one half dtype
    (binary arithmetic here, unary ops in ``_install_half_unary``):
    differentiated through the decomposition, the op's gradient would be made
    from its float32 widenings and save them (twice eager's bytes, and a
    widening and a rounding kernel around each backward op); eager saves and
    multiplies the half-precision tensors, each op computing in float32."""
    tensors = [a for a in (*bsym.args, *bsym.kwargs.values()) if isinstance(a, TensorProxy)]
    out = bsym.output
    return (bool(tensors) and isinstance(out, TensorProxy) and out.dtype in dtypes.low_precision_floats
            and all(t.dtype == out.dtype for t in tensors))


def _to(g, like):
    """``g`` as the gradient of ``like``: reduced over broadcast dims; None for a number."""
    return sum_to(g, like.shape) if isinstance(like, TensorProxy) else None


def _scaled(g, alpha):
    return g if alpha == 1 else ew.mul(g, alpha)


@register_vjp(ew.add, when=_half_arith)
def _half_add(g, out, input, other, *, alpha=1):
    return _to(g, input), _to(_scaled(g, alpha), other)


@register_vjp(ew.sub, when=_half_arith)
def _half_sub(g, out, input, other, *, alpha=1):
    return _to(g, input), _to(ew.neg(_scaled(g, alpha)), other)


@register_vjp(ew.mul, when=_half_arith)
def _half_mul(g, out, input, other):
    return (_to(ew.mul(g, other), input) if isinstance(input, TensorProxy) else None,
            _to(ew.mul(g, input), other) if isinstance(other, TensorProxy) else None)


def _half_div(g, input, other):
    """eager's: ``grad / other`` and ``-grad * ((input / other) / other)``."""
    ga = _to(ew.div(g, other), input) if isinstance(input, TensorProxy) else None
    gb = (_to(ew.mul(ew.neg(g), ew.div(ew.div(input, other), other)), other)
          if isinstance(other, TensorProxy) else None)
    return ga, gb


def _install_half_unary() -> None:
    """The unary ops' prim rules (``UNARY_RULES``) applied to the half-precision
    tensors themselves: eager's formulas (``grad * result`` for exp, ``grad /
    self`` for log...) on what eager saves. Ops with a rule of their own
    (tanh, sigmoid: fused kernels) keep it."""
    for name, fn in UNARY_RULES.items():
        sym = getattr(ew, name, None)
        if sym is None or vjp_rule(sym) is not None:
            continue
        register_vjp(sym, when=_half_arith)(lambda g, out, a, _fn=fn: (_fn(g, out, a),))


# --- rounding divisions: eager's derivatives differ between the two spellings -----------------------

@register_vjp(ew.div, when=lambda b: _arg(b, 2, "rounding_mode") is not None or _half_arith(b))
def _div(g, out, input, other, *, rounding_mode=None):
    if rounding_mode is None:
        return _half_div(g, input, other)
    return (zeros_like(input) if _wants(input) else None, zeros_like(other) if _wants(other) else None)


@register_vjp(ew.floor_divide)
def _floor_divide(g, out, input, other):
    msg = "derivative for aten::floor_divide is not implemented"
    return (backward_error(input, msg) if _wants(input) else None,
            backward_error(other, msg) if _wants(other) else None)


# --- activations: one backward kernel instead of the formula's elementwise chain --------------------

@register_vjp(lnn.gelu, when=_kernel_input, fused=True)
def _gelu(g, out, input, approximate="none"):
    return kernels.gelu_backward(g, input, approximate=approximate), None


@register_vjp(lnn.silu, when=_kernel_input, fused=True)
def _silu(g, out, input, inplace=False):
    return kernels.silu_backward(g, input), None


@register_vjp(lnn.relu, when=lambda b: _kernel_input(b) and not _arg(b, 1, "inplace", False), fused=True)
def _relu(g, out, input, inplace=False):
    """eager's ``threshold_backward(g, result, 0)``: the forward stays one relu
    (not ``le`` and ``where``) and the backward reads its output, which the
    next layer saves anyway."""
    return kernels.threshold_backward(g, out, 0), None


@register_vjp(lnn.threshold, when=lambda b: _kernel_input(b) and not _arg(b, 3, "inplace", False), fused=True)
def _threshold(g, out, input, threshold, value, inplace=False):
    return kernels.threshold_backward(g, input, threshold), None, None, None


@register_vjp(ew.tanh, when=_kernel_input, fused=True)
def _tanh(g, out, a):
    return (kernels.tanh_backward(g, out),)


@register_vjp(ew.sigmoid, when=_kernel_input, fused=True)
def _sigmoid(g, out, a):
    return (kernels.sigmoid_backward(g, out),)


@register_vjp(ew.pow, when=lambda b: _float_input(b) and isinstance(b.tensor_args()[0], TensorProxy)
              and type(_arg(b, 1, "exponent")) in (int, float) and _arg(b, 1, "exponent") == 2)
def _square(g, out, input, exponent):
    """``g * 2x``, eager's pow_backward (RMSNorm's ``x.pow(2)``): two kernels,
    where the decomposition ``x * x`` gives ``g x + g x``, three."""
    return ew.mul(g, ew.mul(input, 2.0)), None


# --- special values: eager's masked formulas where the decomposition's chain rule gives nan ---------
# (sqrt'(0) * 0, a clamp's edge, 0 * log 0): each rule is eager's own backward formula.

def _reduced_dims(input, dim) -> tuple:
    if input.ndim == 0:
        return ()
    dims = tuple(range(input.ndim)) if dim is None or dim == () else ((dim,) if isinstance(dim, int) else dim)
    return tuple(sorted(d % input.ndim for d in dims))


def _keepdim(t, input, dims: tuple, keepdim: bool):
    """``t`` (a reduction's output or gradient) with the reduced dims kept as 1s."""
    if keepdim or not dims:
        return t
    return reshape_to(t, tuple(1 if d in dims else s for d, s in enumerate(input.shape)))


def _vector_norm_when(bsym) -> bool:
    ord = _arg(bsym, 1, "ord", 2)
    return _float_input(bsym) and isinstance(ord, (int, float)) and ord not in (0, 1, math.inf, -math.inf)


@register_vjp(red.vector_norm, when=_vector_norm_when)
def _vector_norm(g, out, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """aten's norm_backward: the gradient is 0 where the norm is 0 (not nan)."""
    xs = prims.convert_element_type(x, dtype) if dtype is not None and dtype != x.dtype else x
    dims = _reduced_dims(x, dim)
    norm, gk = _keepdim(out, x, dims, keepdim), _keepdim(g, x, dims, keepdim)
    if ord < 1:
        mag = ew.where(ew.eq(xs, 0), 0, ew.pow(ew.abs(xs), ord - 1))
        grad = ew.mul(ew.mul(ew.sgn(xs), mag), ew.mul(gk, ew.pow(norm, 1 - ord)))
    else:
        scaled = xs if ord == 2 else (ew.mul(ew.sgn(xs), ew.pow(ew.abs(xs), ord - 1)) if ord < 2
                                       else ew.mul(xs, ew.pow(ew.abs(xs), ord - 2)))
        denom = norm if ord == 2 else ew.pow(norm, ord - 1)
        grad = ew.mul(scaled, ew.where(ew.eq(norm, 0), 0, ew.div(gk, denom)))
    return prims.convert_element_type(grad, x.dtype) if grad.dtype != x.dtype else grad, None, None, None


def _std_when(bsym) -> bool:
    """Calls whose recorded arguments torch.std accepts (not ``unbiased=None``)."""
    explicit_none = (len(bsym.args) > 2 and bsym.args[2] is None) or \
        ("unbiased" in bsym.kwargs and bsym.kwargs["unbiased"] is None)
    return _float_input(bsym) and not explicit_none


@register_vjp(red.std, when=_std_when)
def _std(g, out, input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """aten's std_backward: 0 (not nan) where the standard deviation is 0."""
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    dims = _reduced_dims(input, dim)
    n = math.prod(input.shape[d] for d in dims)
    std, gk = _keepdim(out, input, dims, keepdim), _keepdim(g, input, dims, keepdim)
    gvar = ew.where(ew.eq(std, 0), 0, ew.div(gk, ew.mul(std, 2)))
    scale = 2.0 / (n - correction) if n - correction > 0 else math.inf
    centered = ew.sub(input, red.mean(input, dims, True)) if dims else ew.sub(input, input)
    return ew.mul(ew.mul(gvar, centered), scale), None, None, None


@register_vjp(red.max, red.min, when=lambda b: _float_input(b) and _arg(b, 1, "dim") is not None
              and not isinstance(_arg(b, 1, "dim"), TensorProxy))
def _max_min_dim(g, out, input, dim=None, keepdim=False):
    """All of the gradient goes to the returned index (eager), not split among ties."""
    gv = g[0]
    if gv is None:
        return None, None, None
    if input.ndim == 0:
        return reshape_to(gv, ()), None, None
    d = dim % input.ndim
    index, gv = _keepdim(out[1], input, (d,), keepdim), _keepdim(gv, input, (d,), keepdim)
    return prims.scatter_add(zeros_like(input), d, index, gv), None, None


@register_vjp(lnn.hardtanh, when=_float_input)
def _hardtanh(g, out, input, min_val=-1.0, max_val=1.0, inplace=False):
    """0 at the edges (eager's hardtanh_backward), unlike clamp which passes them."""
    inside = ew.logical_and(ew.gt(input, min_val), ew.lt(input, max_val))
    return ew.where(inside, g, 0), None, None, None


def _bce_when(bsym) -> bool:
    target, weight = _arg(bsym, 1, "target"), _arg(bsym, 2, "weight")
    return _float_input(bsym) and not _wants(target) and not _wants(weight)


@register_vjp(lnn.binary_cross_entropy, when=_bce_when)
def _binary_cross_entropy(g, out, input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """aten's formula ``(x - y) / max(x (1 - x), 1e-12)``: finite at x = 0 and 1."""
    gk = g
    if reduction == "mean":
        gk = ew.div(g, max(input.numel(), 1))
    grad = ew.mul(gk, ew.div(ew.sub(input, target), ew.clamp_min(ew.mul(ew.rsub(input, 1), input), 1e-12)))
    if weight is not None:
        grad = ew.mul(grad, weight)
    return sum_to(grad, input.shape) if grad.shape != input.shape else grad, None, None, None, None, None


def _inexact_input(bsym) -> bool:
    first = bsym.tensor_args()
    return bool(first) and first[0].dtype.is_floating_point


@register_vjp(lnn.softplus, when=_inexact_input)
def _softplus(g, out, input, beta=1.0, threshold=20.0):
    """Eager's ``sigmoid(beta x)`` below the threshold, 1 above (finite where
    the decomposition's unused ``log1p(exp(x))`` branch overflows to nan);
    float16/bfloat16 are computed in float32 and rounded once, as eager does."""
    low = input.dtype in (torch.float16, torch.bfloat16)
    x = prims.convert_element_type(input, torch.float32) if low else input
    gx = prims.convert_element_type(g, torch.float32) if low else g
    scaled = ew.mul(x, beta) if beta != 1 else x
    grad = ew.mul(gx, ew.where(ew.gt(scaled, threshold), 1.0, ew.sigmoid(scaled)))
    return (prims.convert_element_type(grad, input.dtype) if low else grad), None, None


@register_vjp(lnn.hardsigmoid, when=_float_input)
def _hardsigmoid(g, out, input, inplace=False):
    """1/6 strictly inside (-3, 3), 0 at and beyond the edges (eager)."""
    inside = ew.logical_and(ew.gt(input, -3.0), ew.lt(input, 3.0))
    return ew.where(inside, ew.div(g, 6.0), 0), None


@register_vjp(lnn.hardswish, when=_float_input)
def _hardswish(g, out, input, inplace=False):
    """Eager's piecewise derivative: 0 up to -3, x/3 + 1/2 inside, 1 from 3."""
    slope = ew.where(ew.le(input, -3.0), 0.0, ew.where(ew.lt(input, 3.0), ew.add(ew.div(input, 3.0), 0.5), 1.0))
    return ew.mul(g, slope), None


@register_vjp(ew.entr, when=_float_input)
def _entr(g, out, a):
    """``-(1 + log x)`` as eager (inf at 0, where the decomposition's masked branch gives 0)."""
    return (ew.mul(g, ew.neg(ew.add(ew.log(a), 1.0))),)


def _reverse_logcumsumexp(x, dim: int):
    return shapes.flip(composites.logcumsumexp(shapes.flip(x, (dim,)), dim), (dim,))


@register_vjp(composites.logcumsumexp, when=lambda b: _float_input(b) and b.tensor_args()[0].ndim > 0)
def _logcumsumexp(g, out, input, dim):
    """aten's log-space formula (positive and negative parts of ``g`` apart):
    finite after a leading -inf, where the decomposition's ``log(0)`` spreads nan."""
    d = dim % input.ndim
    lowest = torch.finfo(g.dtype).min
    log_abs = ew.log(ew.abs(g))
    parts = [ew.exp(ew.add(_reverse_logcumsumexp(ew.sub(ew.where(sign, log_abs, lowest), out), d), input))
             for sign in (ew.gt(g, 0), ew.lt(g, 0))]
    return ew.sub(parts[0], parts[1]), None


_install_half_unary()       # last: after the rules of their own (tanh, sigmoid)
