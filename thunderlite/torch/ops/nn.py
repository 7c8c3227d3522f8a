"""torch.nn.functional: activations, softmax, norms, losses, embedding,
dropout, attention, convolution, padding. Pooling and interpolation live in
pooling.py."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from thunderlite.core import dtypes, prims
from thunderlite.core.prims import check
from thunderlite.core.symint import known_or
from thunderlite.core.tags import Tag
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.ops import reductions as red
from thunderlite.torch.ops import shapes
from thunderlite.torch.ops.data_dependent import check_all
from thunderlite.torch.ops.linalg import matmul
from thunderlite.torch.registry import decomposable, torchsymbol
from thunderlite.torch.utils import canonical_dim, convert, expand_to, is_tensor, known_equal, ntuple, upcast

T = torch.Tensor


# --- activations --------------------------------------------------------------------------

def _not_inplace(inplace: bool) -> None:
    """``F.relu(x, inplace=True)`` is recorded as the in-place symbol (see
    torch/ops/inplace.py, ``InplaceFlag``); a direct call of the functional symbol
    with ``inplace=True`` goes through the opaque fallback, which records the
    write functionally followed by copy_ (never a silent mutation)."""
    decomposable(not inplace, lambda: "inplace=True is recorded through the opaque fallback")


@torchsymbol(torch.relu, T.relu, method_name="relu", torch_fn=F.relu)
def relu(input, inplace: bool = False):
    _not_inplace(inplace)
    return ew.where(ew.le(input, 0), 0, input) if input.dtype is not torch.bool else input


@torchsymbol(torch_fn=F.relu6)
def relu6(input, inplace: bool = False):
    _not_inplace(inplace)
    return hardtanh(input, 0.0, 6.0)


@torchsymbol(torch_fn=F.hardtanh)
def hardtanh(input, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
    _not_inplace(inplace)
    return ew.clamp(input, min_val, max_val)


@torchsymbol(torch_fn=F.leaky_relu)
def leaky_relu(input, negative_slope: float = 0.01, inplace: bool = False):
    _not_inplace(inplace)
    return ew.where(ew.gt(input, 0), input, ew.mul(input, negative_slope))


@torchsymbol(torch_fn=F.elu)
def elu(input, alpha: float = 1.0, inplace: bool = False):
    _not_inplace(inplace)
    return ew.where(ew.gt(input, 0), input, ew.mul(ew.expm1(input), alpha))


@torchsymbol(torch.celu, torch_fn=F.celu)
def celu(input, alpha: float = 1.0, inplace: bool = False):
    _not_inplace(inplace)
    return ew.where(ew.gt(input, 0), input, ew.mul(ew.expm1(ew.div(input, alpha)), alpha))


@torchsymbol(torch.selu, torch_fn=F.selu)
def selu(input, inplace: bool = False):
    _not_inplace(inplace)
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return ew.mul(ew.where(ew.gt(input, 0), input, ew.mul(ew.expm1(input), alpha)), scale)


@torchsymbol(F.gelu)
def gelu(input, approximate: str = "none"):
    x = upcast(input)
    if approximate == "tanh":
        inner = ew.mul(ew.add(x, ew.mul(ew.mul(ew.mul(x, x), x), 0.044715)), math.sqrt(2.0 / math.pi))
        out = ew.mul(ew.mul(x, 0.5), ew.add(ew.tanh(inner), 1.0))
    else:
        out = ew.mul(ew.mul(x, 0.5), ew.add(ew.erf(ew.mul(x, 1.0 / math.sqrt(2.0))), 1.0))
    return convert(out, input.dtype)


@torchsymbol(torch_fn=F.silu)
def silu(input, inplace: bool = False):
    _not_inplace(inplace)
    x = upcast(input)
    return convert(ew.mul(x, ew.sigmoid(x)), input.dtype)


@torchsymbol(torch_fn=F.mish)
def mish(input, inplace: bool = False):
    _not_inplace(inplace)
    x = upcast(input)
    return convert(ew.mul(x, ew.tanh(softplus(x))), input.dtype)


@torchsymbol(F.softplus)
def softplus(input, beta: float = 1.0, threshold: float = 20.0):
    # float16/bfloat16 compute in float32 and round once, as eager's kernel does
    # (exp rounded to float16 would overflow from x > 11)
    x = upcast(input)
    scaled = x if known_equal(beta, 1) else ew.mul(x, beta)
    soft = ew.log1p(ew.exp(scaled))
    soft = soft if known_equal(beta, 1) else ew.div(soft, beta)
    return convert(ew.where(ew.gt(scaled, threshold), x, soft), input.dtype)


@torchsymbol(F.softsign)
def softsign(input):
    return ew.div(input, ew.add(ew.abs(input), 1))


@torchsymbol(torch_fn=F.hardsigmoid)
def hardsigmoid(input, inplace: bool = False):
    _not_inplace(inplace)
    return ew.div(ew.clamp(ew.add(input, 3.0), 0.0, 6.0), 6.0)


@torchsymbol(torch_fn=F.hardswish)
def hardswish(input, inplace: bool = False):
    _not_inplace(inplace)
    return ew.mul(input, hardsigmoid(input))


@torchsymbol(F.hardshrink, torch.hardshrink, T.hardshrink, method_name="hardshrink")
def hardshrink(input, lambd: float = 0.5):
    return ew.where(ew.gt(ew.abs(input), lambd), input, 0)


@torchsymbol(F.softshrink)
def softshrink(input, lambd: float = 0.5):
    return ew.where(ew.gt(input, lambd), ew.sub(input, lambd),
                    ew.where(ew.lt(input, -lambd), ew.add(input, lambd), 0))


@torchsymbol(F.tanhshrink)
def tanhshrink(input):
    return ew.sub(input, ew.tanh(input))


@torchsymbol(torch.threshold, torch_fn=F.threshold)
def threshold(input, threshold: float, value: float, inplace: bool = False):
    _not_inplace(inplace)
    return ew.where(ew.le(input, threshold), value, input)


@torchsymbol(F.logsigmoid)
def logsigmoid(input):
    return ew.neg(softplus(ew.neg(input)))


@torchsymbol(F.glu)
def glu(input, dim: int = -1):
    a, b = shapes.chunk(input, 2, dim)
    return ew.mul(a, ew.sigmoid(b))


@torchsymbol(torch.prelu, F.prelu)
def prelu(input, weight):
    w = weight
    if weight.numel() != 1 and input.ndim >= 2:
        w = prims.reshape(weight, (weight.numel(),) + (1,) * (input.ndim - 2))
    return ew.where(ew.gt(input, 0), input, ew.mul(w, input))


# --- softmax family -------------------------------------------------------------------------

def _softmax_in(input, dtype, stacklevel=None):
    if isinstance(stacklevel, torch.dtype):      # torch.softmax(x, dim, dtype) spells dtype third
        dtype = stacklevel
    x = convert(input, dtype) if dtype is not None else input
    return x, x.dtype


def _softmax_args(input, dim, dtype, stacklevel):
    """The input (cast to ``dtype``, upcast to compute), the dim (torch's legacy
    default when None) and the output dtype, shared by softmax and log_softmax."""
    x, out_dtype = _softmax_in(input, dtype, stacklevel)
    if dim is None:
        dim = 0 if x.ndim in (0, 1, 3) else 1
    return upcast(x), dim, out_dtype


def _row_max(x, dim):
    """``amax(x, dim, keepdim=True)``, also where ``dim`` may be empty when the
    program runs (a run-time size: amax of nothing raises, softmax of nothing is
    nothing): a ``-inf`` slice joins the dim, which changes no maximum."""
    d = canonical_dim(dim, x.ndim)
    if known_or(lambda: x.shape[d] != 0, False):
        return red.amax(x, d, True)
    pad = prims.full(tuple(x.shape[:d]) + (1,) + tuple(x.shape[d + 1:]), -math.inf, device=x.device, dtype=x.dtype)
    return red.amax(shapes.cat([x, pad], d), d, True)


@torchsymbol(F.softmax, torch.softmax, T.softmax, torch.special.softmax, method_name="softmax")
def softmax(input, dim=None, _stacklevel: int = 3, dtype=None):
    x, dim, out_dtype = _softmax_args(input, dim, dtype, _stacklevel)
    if known_or(lambda: x.numel() == 0, False):
        return convert(prims.clone(x), out_dtype)
    if x.ndim == 0:
        return convert(ew.div(ew.exp(ew.sub(x, x)), ew.exp(ew.sub(x, x))), out_dtype)
    # no masking of an infinite max: a row holding +inf or only -inf is all NaN, as in eager
    e = ew.exp(ew.sub(x, _row_max(x, dim)))
    return convert(ew.div(e, red.sum(e, dim, True)), out_dtype)


@torchsymbol(F.log_softmax, torch.log_softmax, T.log_softmax, torch.special.log_softmax,
             method_name="log_softmax")
def log_softmax(input, dim=None, _stacklevel: int = 3, dtype=None):
    x, dim, out_dtype = _softmax_args(input, dim, dtype, _stacklevel)
    if known_or(lambda: x.numel() == 0, False):
        return convert(prims.clone(x), out_dtype)
    if x.ndim == 0:
        return convert(ew.sub(x, x), out_dtype)
    # eager's formula (x - max) - log(sum(exp(x - max))): an infinite max makes the row NaN,
    # where x - logsumexp(x) would give -inf beside a +inf
    shifted = ew.sub(x, _row_max(x, dim))
    return convert(ew.sub(shifted, ew.log(red.sum(ew.exp(shifted), dim, True))), out_dtype)


@torchsymbol(F.softmin)
def softmin(input, dim=None, _stacklevel: int = 3, dtype=None):
    return softmax(ew.neg(input), dim, dtype=dtype)


# --- normalization ----------------------------------------------------------------------------

def _norm_dims(a, normalized_shape):
    n = len(tuple(normalized_shape))
    return tuple(range(a.ndim - n, a.ndim))


def _standardize(x, mean, var, eps):
    """``(x - mean) / sqrt(var + eps)``: the normalization every ``*_norm`` here shares."""
    return ew.mul(ew.sub(x, mean), ew.rsqrt(ew.add(var, eps)))


@torchsymbol(F.layer_norm, torch.layer_norm)
def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    x = upcast(input)
    dims = _norm_dims(x, normalized_shape)
    var, mean = red.var_mean(x, dims, keepdim=True, correction=0)
    out = _standardize(x, mean, var, eps)
    if weight is not None:
        out = ew.mul(out, weight)
    if bias is not None:
        out = ew.add(out, bias)
    return convert(out, input.dtype)


@torchsymbol(F.rms_norm, torch.rms_norm)
def rms_norm(input, normalized_shape, weight=None, eps: float | None = None):
    x = upcast(input)
    dims = _norm_dims(x, normalized_shape)
    eps = torch.finfo(x.dtype).eps if eps is None else eps      # the compute dtype's, as ATen
    out = ew.mul(x, ew.rsqrt(ew.add(red.mean(ew.mul(x, x), dims, True), eps)))
    if weight is not None:
        out = ew.mul(out, weight)
    return convert(out, input.dtype)


def _channel_shape(a, v):
    return prims.reshape(v, (1, a.shape[1]) + (1,) * (a.ndim - 2)) if a.ndim > 1 else v


def _channel_affine(x, out, weight, bias, dtype):
    """Batch, group and instance norm's per-channel ``weight`` and ``bias``
    (shaped to broadcast over ``x``'s dim 1) applied to the normalized ``out``,
    back in the input's ``dtype``."""
    if weight is not None:
        out = ew.mul(out, _channel_shape(x, weight))
    if bias is not None:
        out = ew.add(out, _channel_shape(x, bias))
    return convert(out, dtype)


@torchsymbol(F.batch_norm)
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5):
    x = upcast(input)
    dims = tuple(i for i in range(x.ndim) if i != 1)
    if training or running_mean is None:
        var, mean = red.var_mean(x, dims, keepdim=True, correction=0)
        if training and running_mean is not None:
            n = x.numel() // max(x.shape[1] if x.ndim > 1 else 1, 1)     # values per channel
            new_mean = ew.add(ew.mul(running_mean, 1 - momentum), ew.mul(shapes.reshape(mean, (-1,)), momentum))
            unbiased = ew.mul(shapes.reshape(var, (-1,)), n / max(n - 1, 1))
            new_var = ew.add(ew.mul(running_var, 1 - momentum), ew.mul(unbiased, momentum))
            prims.copy_(convert(new_mean, running_mean.dtype), running_mean)
            prims.copy_(convert(new_var, running_var.dtype), running_var)
    else:
        mean, var = _channel_shape(x, running_mean), _channel_shape(x, running_var)
    out = _standardize(x, mean, var, eps)
    return _channel_affine(x, out, weight, bias, input.dtype)


@torchsymbol(F.group_norm, torch.group_norm)
def group_norm(input, num_groups: int, weight=None, bias=None, eps: float = 1e-5):
    x = upcast(input)
    n, c = x.shape[0], x.shape[1]
    check(c % num_groups == 0, lambda: f"Expected number of channels in input to be divisible by num_groups, "
                                       f"but got input of shape {x.shape} and num_groups={num_groups}")
    g = prims.reshape(x, (n, num_groups, x.numel() // max(n * num_groups, 1)) if n * num_groups else (n, num_groups, 0))
    var, mean = red.var_mean(g, (2,), keepdim=True, correction=0)
    out = prims.reshape(_standardize(g, mean, var, eps), x.shape)
    return _channel_affine(x, out, weight, bias, input.dtype)


@torchsymbol(F.instance_norm)
def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5):
    decomposable(running_mean is None and use_input_stats, lambda: "instance_norm with running stats is not decomposed")
    x = upcast(input)
    var, mean = red.var_mean(x, tuple(range(2, x.ndim)), keepdim=True, correction=0)
    out = _standardize(x, mean, var, eps)
    return _channel_affine(x, out, weight, bias, input.dtype)


@torchsymbol(F.normalize)
def normalize(input, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out=None):
    decomposable(out is None, lambda: "normalize(out=) is not decomposed")
    n = red.vector_norm(input, p, dim, True)
    return ew.div(input, shapes.expand_as(ew.clamp_min(n, eps), input))


# --- embedding, dropout, one_hot ------------------------------------------------------------------

@torchsymbol(F.embedding)
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False):
    decomposable(max_norm is None, lambda: "embedding(max_norm=...) renormalizes the weight in place; not decomposed")
    flat = prims.reshape(input, (input.numel(),))
    rows = prims.index_select(weight, 0, flat)
    return prims.reshape(rows, input.shape + (weight.shape[1],))


@torchsymbol(torch.dropout, tags={Tag.RANDOM}, torch_fn=F.dropout)
def dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False):
    _not_inplace(inplace)
    check(0.0 <= p <= 1.0, lambda: f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return ew.mul(input, 0.0)
    keep = prims.uniform(input.shape, 0.0, 1.0, device=input.device, dtype=upcast(input).dtype)
    mask = ew.lt(keep, 1.0 - p)
    return ew.mul(ew.mul(input, mask), 1.0 / (1.0 - p))


@torchsymbol(F.one_hot)
def one_hot(tensor, num_classes: int = -1):
    check(num_classes >= 0, lambda: "one_hot without num_classes depends on the data; pass num_classes")
    classes = prims.iota(num_classes, start=0, step=1, device=tensor.device, dtype=torch.int64)
    return convert(ew.eq(shapes.unsqueeze(tensor, -1), classes), torch.int64)


# --- losses ----------------------------------------------------------------------------------------

def _reduce_loss(loss, reduction: str):
    if reduction == "mean":
        return red.mean(loss)
    if reduction == "sum":
        return red.sum(loss)
    check(reduction == "none", lambda: f"{reduction} is not a valid value for reduction")
    return loss


@torchsymbol(F.mse_loss)
def mse_loss(input, target, size_average=None, reduce=None, reduction: str = "mean", weight=None):
    decomposable(weight is None, lambda: "mse_loss(weight=) is not decomposed")
    d = ew.sub(input, target)
    return _reduce_loss(ew.mul(d, d), reduction)


@torchsymbol(F.l1_loss)
def l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean", weight=None):
    decomposable(weight is None, lambda: "l1_loss(weight=) is not decomposed")
    return _reduce_loss(ew.abs(ew.sub(input, target)), reduction)


@torchsymbol(F.smooth_l1_loss)
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean", beta: float = 1.0):
    d = ew.abs(ew.sub(input, target))
    if beta == 0:
        return _reduce_loss(d, reduction)
    loss = ew.where(ew.lt(d, beta), ew.div(ew.mul(ew.mul(d, d), 0.5), beta), ew.sub(d, 0.5 * beta))
    return _reduce_loss(loss, reduction)


@torchsymbol(F.huber_loss)
def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0, weight=None):
    decomposable(weight is None, lambda: "huber_loss(weight=) is not decomposed")
    # float16/bfloat16: the elementwise loss is computed in float32 and rounded once, as eager's kernel
    d = ew.abs(ew.sub(upcast(input), upcast(target)))
    loss = ew.where(ew.lt(d, delta), ew.mul(ew.mul(d, d), 0.5), ew.mul(ew.sub(d, 0.5 * delta), delta))
    return _reduce_loss(convert(loss, torch.promote_types(input.dtype, target.dtype)), reduction)


@torchsymbol(F.nll_loss)
def nll_loss(input, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
             reduction: str = "mean"):
    c_dim = 1 if input.ndim > 1 else 0
    safe = ew.where(ew.eq(target, ignore_index), 0, target)
    picked = prims.take_along_axis(input, shapes.unsqueeze(safe, c_dim), c_dim) if input.ndim > 1 else \
        prims.reshape(prims.index_select(input, 0, prims.reshape(safe, (1,))), ())
    picked = shapes.squeeze(picked, c_dim) if input.ndim > 1 else picked
    valid = ew.ne(target, ignore_index)
    w = convert(valid, input.dtype)
    if weight is not None:
        w = ew.mul(w, prims.reshape(prims.index_select(weight, 0, prims.reshape(safe, (safe.numel(),))), safe.shape))
    loss = ew.neg(ew.mul(picked, w))
    if reduction == "mean":
        return ew.div(red.sum(loss), red.sum(w))
    return _reduce_loss(loss, reduction)


@torchsymbol(F.cross_entropy)
def cross_entropy(input, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                  reduction: str = "mean", label_smoothing: float = 0.0):
    c_dim = 1 if input.ndim > 1 else 0
    logp = log_softmax(input, c_dim)
    if dtypes.is_inexact(target.dtype):
        decomposable(label_smoothing == 0.0,
                     lambda: "cross_entropy with probabilities and label_smoothing is not decomposed")
        w = logp if weight is None else ew.mul(logp, _channel_shape(logp, weight) if logp.ndim > 1 else weight)
        loss = ew.neg(red.sum(ew.mul(w, target), c_dim))
        if reduction == "mean":
            return ew.div(red.sum(loss), loss.numel() if input.ndim > 1 else 1)
        return _reduce_loss(loss, reduction)
    decomposable(label_smoothing == 0.0 or weight is None,
          lambda: "cross_entropy with class weights and label_smoothing is not decomposed")
    nll = nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if label_smoothing == 0.0:
        return nll
    valid = convert(ew.ne(target, ignore_index), logp.dtype)
    smooth = ew.mul(ew.neg(red.sum(logp, c_dim)), valid)
    smooth = ew.div(red.sum(smooth), red.sum(valid)) if reduction == "mean" else _reduce_loss(smooth, reduction)
    n = input.shape[c_dim]
    return ew.add(ew.mul(nll, 1 - label_smoothing), ew.mul(smooth, label_smoothing / n))


@torchsymbol(F.binary_cross_entropy)
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction: str = "mean"):
    logx = ew.clamp_min(ew.log(input), -100)
    log1mx = ew.clamp_min(ew.log1p(ew.neg(input)), -100)
    loss = ew.neg(ew.add(ew.mul(target, logx), ew.mul(ew.rsub(target, 1), log1mx)))
    if weight is not None:
        loss = ew.mul(loss, weight)
    return _reduce_loss(loss, reduction)


@torchsymbol(F.binary_cross_entropy_with_logits)
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction: str = "mean", pos_weight=None):
    log_sig = logsigmoid(input)
    log_one_minus = logsigmoid(ew.neg(input))
    pos = ew.mul(target, log_sig)
    if pos_weight is not None:
        pos = ew.mul(pos, pos_weight)
    loss = ew.neg(ew.add(pos, ew.mul(ew.rsub(target, 1), log_one_minus)))
    if weight is not None:
        loss = ew.mul(loss, weight)
    return _reduce_loss(loss, reduction)


@torchsymbol(F.kl_div)
def kl_div(input, target, size_average=None, reduce=None, reduction: str = "mean", log_target: bool = False):
    if log_target:
        loss = ew.mul(ew.exp(target), ew.sub(target, input))
    else:
        loss = ew.sub(ew.xlogy(target, target), ew.mul(target, input))
    if reduction == "batchmean":
        return ew.div(red.sum(loss), input.shape[0] if input.ndim else 1)
    return _reduce_loss(loss, reduction)


def _legacy_reduction(size_average, reduce) -> None:
    decomposable(size_average is None and reduce is None, lambda: "size_average=/reduce= are not decomposed")


@torchsymbol(F.margin_ranking_loss)
def margin_ranking_loss(input1, input2, target, margin: float = 0, size_average=None, reduce=None,
                        reduction: str = "mean"):
    _legacy_reduction(size_average, reduce)
    loss = ew.clamp_min(ew.add(ew.mul(ew.neg(target), ew.sub(input1, input2)), margin), 0)
    return _reduce_loss(loss, reduction)


@torchsymbol(F.soft_margin_loss)
def soft_margin_loss(input, target, size_average=None, reduce=None, reduction: str = "mean"):
    _legacy_reduction(size_average, reduce)
    return _reduce_loss(ew.log1p(ew.exp(ew.mul(ew.neg(target), input))), reduction)


@torchsymbol(F.hinge_embedding_loss)
def hinge_embedding_loss(input, target, margin: float = 1.0, size_average=None, reduce=None,
                         reduction: str = "mean"):
    _legacy_reduction(size_average, reduce)
    margin_part = ew.where(ew.ne(target, 1), ew.clamp_min(ew.rsub(input, margin), 0), 0)
    self_part = ew.where(ew.ne(target, -1), input, 0)
    return _reduce_loss(ew.add(margin_part, self_part), reduction)


@torchsymbol(F.poisson_nll_loss)
def poisson_nll_loss(input, target, log_input: bool = True, full: bool = False, size_average=None,
                     eps: float = 1e-8, reduce=None, reduction: str = "mean"):
    _legacy_reduction(size_average, reduce)
    if log_input:
        loss = ew.sub(ew.exp(input), ew.mul(target, input))
    else:
        loss = ew.sub(input, ew.mul(target, ew.log(ew.add(input, eps))))
    if full:        # Stirling's approximation of log(target!), where target > 1
        stirling = ew.add(ew.sub(ew.mul(target, ew.log(target)), target),
                          ew.mul(ew.log(ew.mul(target, 2 * math.pi)), 0.5))
        loss = ew.add(loss, ew.where(ew.gt(target, 1), stirling, 0))
    return _reduce_loss(loss, reduction)


@torchsymbol(F.cosine_embedding_loss)
def cosine_embedding_loss(input1, input2, target, margin: float = 0, size_average=None, reduce=None,
                          reduction: str = "mean"):
    _legacy_reduction(size_average, reduce)
    d = input1.ndim - 1
    eps = 1e-12
    mag1 = ew.add(red.sum(ew.mul(input1, input1), d), eps)
    mag2 = ew.add(red.sum(ew.mul(input2, input2), d), eps)
    cos = ew.div(red.sum(ew.mul(input1, input2), d), ew.sqrt(ew.mul(mag1, mag2)))
    pos = ew.where(ew.eq(target, 1), ew.rsub(cos, 1), 0)
    neg = ew.where(ew.eq(target, -1), ew.clamp_min(ew.sub(cos, margin), 0), 0)
    return _reduce_loss(ew.add(pos, neg), reduction)


@torchsymbol(F.bilinear, torch.bilinear)
def bilinear(input1, input2, weight, bias=None):
    """out[..., o] = x1[..., i] W[o, i, j] x2[..., j]: one matmul, then a product-sum over j."""
    o, i, j = weight.shape
    lead = input1.shape[:-1]
    x1 = shapes.reshape(input1, -1, i)
    t = matmul(x1, shapes.reshape(shapes.permute(weight, 1, 0, 2), i, o * j))
    t = shapes.reshape(t, x1.shape[0], o, j)
    out = red.sum(ew.mul(t, shapes.unsqueeze(shapes.reshape(input2, -1, j), 1)), -1)
    out = shapes.reshape(out, *lead, o)
    return out if bias is None else ew.add(out, bias)


# --- attention ------------------------------------------------------------------------------------

@torchsymbol(F.scaled_dot_product_attention)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale=None, enable_gqa: bool = False):
    check(attn_mask is None or attn_mask.dtype in (torch.bool, torch.float32, query.dtype),
          lambda: f"Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: "
                  f"{attn_mask.dtype} and  query.dtype: {query.dtype} instead.")
    L, S = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key = _repeat_heads(key, rep)
        value = _repeat_heads(value, rep)
    scores = ew.mul(matmul(query, shapes.transpose(key, -2, -1)), scale)
    if is_causal:
        keep = ew.ge(prims.broadcast_in_dim(prims.iota(L, start=0, step=1, device=query.device, dtype=torch.int64),
                                            (L, S), (0,)),
                     prims.broadcast_in_dim(prims.iota(S, start=0, step=1, device=query.device, dtype=torch.int64),
                                            (L, S), (1,)))
        scores = ew.where(keep, scores, -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype is torch.bool:
            scores = ew.where(attn_mask, scores, -math.inf)
        else:
            scores = ew.add(scores, attn_mask)
    probs = safe_softmax(scores)
    if dropout_p > 0.0:
        probs = dropout(probs, dropout_p)
    return matmul(probs, value)


def safe_softmax(scores):
    """Eager's math attention's softmax over the last dim (``_safe_softmax``):
    a row whose scores are all -inf (fully masked) gives zeros, not nan, and
    so does its gradient (the row is softmaxed as zeros, then replaced)."""
    masked = ew.isneginf(red.amax(scores, -1, True))
    return ew.where(masked, 0, softmax(ew.where(masked, 0, scores), -1))


def _repeat_heads(x, rep: int):
    x = shapes.unsqueeze(x, -3)
    shape = x.shape[:-3] + (rep,) + x.shape[-2:]
    x = expand_to(x, shape)
    return prims.reshape(x, x.shape[:-4] + (x.shape[-4] * rep,) + x.shape[-2:])


# --- convolution and padding ------------------------------------------------------------------------

def _conv(input, weight, bias, stride, padding, dilation, groups, nsp: int):
    batched = input.ndim == nsp + 2
    x = input if batched else shapes.unsqueeze(input, 0)
    if isinstance(padding, str):
        x, padding = _string_padding(x, weight, padding, ntuple(stride, nsp), ntuple(dilation, nsp), nsp)
    out = prims.convolution(x, weight, bias, ntuple(stride, nsp), ntuple(padding, nsp), ntuple(dilation, nsp), False,
                            (0,) * nsp, groups)
    return out if batched else shapes.squeeze(out, 0)


def _string_padding(x, weight, padding: str, stride, dilation, nsp: int):
    """'valid' is no padding; 'same' pads (k-1)*d in total per dim, the extra
    element on the high side, as torch does (stride must be 1)."""
    if padding == "valid":
        return x, (0,) * nsp
    check(padding == "same", lambda: f"Invalid padding string '{padding}'")
    decomposable(all(s == 1 for s in stride), lambda: "padding='same' with stride > 1 is not decomposed")
    config = [(0, 0, 0), (0, 0, 0)]
    for k, d in zip(weight.shape[2:], dilation, strict=True):
        total = d * (k - 1)
        config.append((total // 2, total - total // 2, 0))
    return prims.pad(x, 0, config), (0,) * nsp


@torchsymbol(F.conv1d, torch.conv1d)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    return _conv(input, weight, bias, stride, padding, dilation, groups, 1)


@torchsymbol(F.conv2d, torch.conv2d)
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    return _conv(input, weight, bias, stride, padding, dilation, groups, 2)


@torchsymbol(F.conv3d, torch.conv3d)
def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    return _conv(input, weight, bias, stride, padding, dilation, groups, 3)


@torchsymbol(F.pad, torch._C._nn.pad)
def pad(input, pad, mode: str = "constant", value=None):
    check(len(pad) % 2 == 0 and len(pad) // 2 <= input.ndim, lambda: "Padding length must be divisible by 2")
    pairs = [(pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]
    if mode == "constant":
        config = [(0, 0, 0)] * input.ndim
        for i, (lo, hi) in enumerate(pairs):
            config[input.ndim - 1 - i] = (lo, hi, 0)
        return prims.pad(input, 0 if value is None else value, config)
    decomposable(mode in ("reflect", "replicate", "circular"), lambda: f"pad(mode={mode!r}) is not decomposed")
    out = input
    for i, (lo, hi) in enumerate(pairs):
        out = _pad_dim(out, input.ndim - 1 - i, lo, hi, mode)
    return out


def _pad_dim(x, d: int, lo: int, hi: int, mode: str):
    """Pad (or crop, for negative amounts) one dim by slicing and concatenating."""
    if mode == "replicate":
        return _replicate_dim(x, d, lo, hi)
    n = x.shape[d]
    if lo < 0:
        x, n, lo = shapes.slice_dim(x, d, -lo, n), n + lo, 0
    if hi < 0:
        x, n, hi = shapes.slice_dim(x, d, 0, n + hi), n + hi, 0
    parts = []
    if lo:
        parts.append(_edge(x, d, n, lo, mode, low=True))
    parts.append(x)
    if hi:
        parts.append(_edge(x, d, n, hi, mode, low=False))
    return prims.cat(parts, d) if len(parts) > 1 else x


def _replicate_dim(x, d: int, lo: int, hi: int):
    """Replicate padding as eager defines it, crops included: output element ``j``
    (of ``n + lo + hi``) is input element ``clamp(j - lo, 0, n - 1)``. So the output
    is ``a`` copies of the first element, a middle slice, ``b`` copies of the last,
    where a crop larger than the input leaves only copies of one edge."""
    n = x.shape[d]
    m = n + lo + hi
    check(m >= 0, lambda: f"padding {(lo, hi)} leaves a negative size for dim {d} (size {n})")
    if m == 0:
        return shapes.slice_dim(x, d, 0, 0)
    a, b = min(max(lo, 0), m), min(max(hi, 0), m)
    parts = []
    if a:
        parts.append(_edge(x, d, n, a, "replicate", low=True))
    if m - a - b > 0:
        parts.append(shapes.slice_dim(x, d, max(0, -lo), n + min(hi, 0)))
    if b:
        parts.append(_edge(x, d, n, b, "replicate", low=False))
    return prims.cat(parts, d) if len(parts) > 1 else parts[0]


def _edge(x, d: int, n: int, k: int, mode: str, low: bool):
    if mode == "replicate":
        edge = shapes.slice_dim(x, d, 0, 1) if low else shapes.slice_dim(x, d, n - 1, n)
        shape = list(x.shape)
        shape[d] = k
        return prims.broadcast_in_dim(edge, tuple(shape), tuple(range(x.ndim)))
    if mode == "circular":
        return shapes.slice_dim(x, d, n - k, n) if low else shapes.slice_dim(x, d, 0, k)
    check(k < n, lambda: f"Padding size should be less than the corresponding input dimension, but got: padding "
                         f"{k} at dimension {d} of input {list(x.shape)}")
    part = shapes.slice_dim(x, d, 1, k + 1) if low else shapes.slice_dim(x, d, n - k - 1, n - 1)
    return prims.flip(part, (d,))


@torchsymbol(F.gaussian_nll_loss)
def gaussian_nll_loss(input, target, var, full: bool = False, eps: float = 1e-6, reduction: str = "mean"):
    """torch's Python function, its ``any(var < 0)`` check run with the program."""
    if not is_tensor(var):
        check(var >= 0, lambda: "var has negative entry/entries", ValueError)
        var = prims.full(input.shape, float(var), device=input.device, dtype=input.dtype)
    else:
        check_all(ew.logical_not(red.any(ew.lt(var, 0))), "var has negative entry/entries", ValueError)
    if tuple(var.shape) != tuple(input.shape):
        if tuple(input.shape[:-1]) == tuple(var.shape):
            var = shapes.unsqueeze(var, -1)
        else:
            check(input.ndim == var.ndim and sum(y for x, y in zip(input.shape, var.shape, strict=True) if x != y) == 1,
                  lambda: "var is of incorrect size", ValueError)
    check(reduction in ("none", "mean", "sum"), lambda: f"{reduction} is not valid", ValueError)
    # eager clamps a clone under no_grad: the value is clamped, the gradient passes as through the identity
    var = ew.add(var, ew.sub(ew.clamp(var, min=eps), var).detach()) if var.requires_grad else ew.clamp(var, min=eps)
    loss = ew.mul(ew.add(ew.log(var), ew.true_divide(ew.pow(ew.sub(input, target), 2), var)), 0.5)
    if full:
        loss = ew.add(loss, 0.5 * math.log(2 * math.pi))
    return red.mean(loss) if reduction == "mean" else red.sum(loss) if reduction == "sum" else loss
