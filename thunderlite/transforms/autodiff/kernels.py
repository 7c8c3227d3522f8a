"""ATen's fused forward/backward kernels as symbols, for the VJP rules of the
ops that dominate real models (autodiff/torch_rules.py).

Each symbol mirrors one ATen op's signature and has two faces:

- ``torch_fn`` is the ATen op itself, so the torch executor runs the whole
  backward (or statistics-saving forward) as the one fused kernel eager runs;
- ``decomposition`` is the same math in torch-language ops (down to prims), so
  a fusion executor that does not claim the symbol can still fuse its parts.

The decompositions compute exactly what the kernels return (the same saved
statistics, in the same shapes and dtypes), so a forward run by one executor
and a backward run by another agree. float16/bfloat16 arguments are widened to
float32 once and the results rounded once, as the kernels compute in float32
(``upcast``, ``_down``). Example::

    out, mean, rstd = native_layer_norm(x, (d,), w, b, 1e-5)     # forward, saves stats
    gx, gw, gb = native_layer_norm_backward(g, x, (d,), mean, rstd, w, b, (True, True, True))
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from thunderlite.core import dtypes, prims
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.ops import indexing, linalg, shapes
from thunderlite.torch.ops import nn as lnn
from thunderlite.torch.ops import reductions as red
from thunderlite.torch.utils import convert, upcast

aten = torch.ops.aten


def _down(x, dtype):
    return None if x is None else convert(x, dtype)


def _kernel(torch_fn, tags=()) -> Callable[[Callable], Symbol]:
    """Decorator: the decomposition ``fn`` becomes a symbol run as ``torch_fn``."""
    def deco(fn: Callable) -> Symbol:
        return Symbol(fn.__name__, decomposition=fn, module="aten", torch_fn=torch_fn, tags=tags)
    return deco


def _out_form(op, overload: str = "grad_input", out_name: str = "grad_input") -> Callable:
    """``op``, or its out= overload where the trace passes ``out``: an
    elementwise kernel may write into an input of its own shape, so
    reuse_buffers.py gives these a dying input (the incoming gradient) and the
    backward allocates no fresh buffer for them (``takes_out``, torchex.writes_out)."""
    default, with_out = op.default._op, getattr(op, overload)._op     # the C functions: no Python frame

    def call(*args, out=None, **kwargs):
        if out is None:
            return default(*args, **kwargs)
        return with_out(*args, **kwargs, **{out_name: out})
    call.__name__ = call.__qualname__ = op.__name__
    call.takes_out = True
    return call


# --- elementwise activations -------------------------------------------------------------------

@_kernel(_out_form(aten.gelu_backward))
def gelu_backward(grad_output, self, *, approximate: str = "none"):
    dtype, grad_output, x = grad_output.dtype, upcast(grad_output), upcast(self)
    if approximate == "tanh":
        k, c = math.sqrt(2 / math.pi), 0.044715
        inner = ew.mul(ew.add(x, ew.mul(ew.mul(ew.mul(x, x), x), c)), k)
        t = ew.tanh(inner)
        dinner = ew.mul(ew.add(ew.mul(ew.mul(x, x), 3 * c), 1.0), k)
        d = ew.add(ew.mul(ew.add(t, 1.0), 0.5), ew.mul(ew.mul(ew.mul(x, 0.5), ew.sub(1.0, ew.mul(t, t))), dinner))
    else:
        cdf = ew.mul(ew.add(ew.erf(ew.mul(x, 1 / math.sqrt(2))), 1.0), 0.5)
        pdf = ew.mul(ew.exp(ew.mul(ew.mul(x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
        d = ew.add(cdf, ew.mul(x, pdf))
    return _down(ew.mul(grad_output, d), dtype)


@_kernel(_out_form(aten.silu_backward))
def silu_backward(grad_output, self):
    dtype, grad_output, x = grad_output.dtype, upcast(grad_output), upcast(self)
    s = ew.sigmoid(x)
    return _down(ew.mul(grad_output, ew.mul(s, ew.add(ew.mul(x, ew.sub(1.0, s)), 1.0))), dtype)


@_kernel(_out_form(aten.threshold_backward))
def threshold_backward(grad_output, self, threshold: float):
    """relu's backward (``self``: its output, ``threshold`` 0) and threshold's
    (``self``: its input): the gradient where ``self > threshold``."""
    return ew.where(ew.le(self, threshold), 0, grad_output)


@_kernel(_out_form(aten.tanh_backward))
def tanh_backward(grad_output, output):
    dtype, grad_output, output = grad_output.dtype, upcast(grad_output), upcast(output)
    return _down(ew.mul(grad_output, ew.sub(1.0, ew.mul(output, output))), dtype)


@_kernel(_out_form(aten.sigmoid_backward))
def sigmoid_backward(grad_output, output):
    dtype, grad_output, output = grad_output.dtype, upcast(grad_output), upcast(output)
    return _down(ew.mul(grad_output, ew.mul(output, ew.sub(1.0, output))), dtype)


# --- dropout: the forward returns its mask, the backward reuses it ---------------------------------

@_kernel(aten.native_dropout, tags=(Tag.RANDOM, Tag.DONT_DCE))
def native_dropout(input, p: float, train: bool):
    """``(output, mask)``; on the CPU the kernel draws what ``F.dropout`` draws."""
    keep = ew.lt(prims.uniform(input.shape, 0.0, 1.0, device=input.device, dtype=input.dtype), 1.0 - p)
    return ew.mul(ew.mul(input, keep), 1.0 / (1.0 - p)), keep


@_kernel(_out_form(aten.native_dropout_backward, "out", "out"))
def native_dropout_backward(grad_output, mask, scale: float):
    return ew.mul(ew.mul(grad_output, mask), scale)


# --- softmax family ----------------------------------------------------------------------------------

@_kernel(aten._softmax_backward_data)
def softmax_backward_data(grad_output, output, dim: int, input_dtype):
    grad_output, output = upcast(grad_output), upcast(output)
    gy = ew.mul(grad_output, output)
    return convert(ew.sub(gy, ew.mul(output, red.sum(gy, dim, True))), input_dtype)


@_kernel(aten._log_softmax_backward_data)
def log_softmax_backward_data(grad_output, output, dim: int, input_dtype):
    grad_output, output = upcast(grad_output), upcast(output)
    return convert(ew.sub(grad_output, ew.mul(ew.exp(output), red.sum(grad_output, dim, True))), input_dtype)


# --- cross entropy: log_softmax + nll_loss, as eager runs it --------------------------------------

def _cross_entropy_forward_impl(input, target, reduction: int, ignore_index: int, *, out=None):
    """``out``: where the log-probabilities go, given by reuse_buffers.py when
    the logits die here (the one buffer of the step's largest activation holds
    both, one after the other). The CPU kernel reads each row whole (its max
    and sum) before it writes that row's outputs, each from its own input
    element, so it runs in place; only there is ``out`` given (``out_devices``)."""
    log_probs = torch.log_softmax(input, 1) if out is None else torch.log_softmax(input, 1, out=out)
    loss, total_weight = aten.nll_loss_forward.default._op(log_probs, target, None, reduction, ignore_index)
    return loss, log_probs, total_weight


_cross_entropy_forward_impl.takes_out = True
_cross_entropy_forward_impl.out_output = 1          # out= holds the log-probabilities
_cross_entropy_forward_impl.out_devices = ("cpu",)


@_kernel(_cross_entropy_forward_impl)
def cross_entropy_forward(input, target, reduction: int, ignore_index: int):
    """``(loss, log_softmax(input), total_weight)`` for 2-d ``input``: what eager's
    log_softmax and nll_loss return (``reduction``: ATen's 0 none, 1 mean, 2 sum;
    ``total_weight`` is 0 for none)."""
    dtype = input.dtype
    log_probs = lnn.log_softmax(input, 1)
    valid = ew.ne(target, ignore_index)
    picked = indexing.gather(upcast(log_probs), 1, shapes.unsqueeze(ew.where(valid, target, 0), 1))
    losses = ew.where(valid, ew.neg(shapes.squeeze(picked, 1)), 0)
    count = red.sum(convert(valid, upcast(log_probs).dtype))
    if reduction == 0:
        return _down(losses, dtype), log_probs, _down(ew.mul(count, 0), dtype)
    total = red.sum(losses)
    return _down(ew.div(total, count) if reduction == 1 else total, dtype), log_probs, _down(count, dtype)


def _cross_entropy_backward_impl(grad, log_probs, target, reduction: int, ignore_index: int, total_weight,
                                 *, out=None):
    """Eager's two kernels, except for float32/float64 on the CPU: there the
    gradient is built in one buffer, ``softmax * -v`` plus ``v`` at each row's
    target (``v``: nll's gradient there; the same arithmetic as
    ``_log_softmax_backward_data``, whose row sum of the one-hot nll gradient
    is ``v``), so the step's largest backward temporary is allocated once,
    not twice (fresh pages cost CPU time; CUDA's caching allocator makes the
    second buffer free, and eager's kernels fewer launches). ``out``: that
    buffer, given by reuse_buffers.py when ``log_probs`` dies here (the
    ``exp`` reads each element before writing it): no allocation at all."""
    if log_probs.device.type != "cpu" or log_probs.dtype not in (torch.float32, torch.float64):
        g = aten.nll_loss_backward(grad, log_probs, target, None, reduction, ignore_index, total_weight)
        res = aten._log_softmax_backward_data(g, log_probs, 1, log_probs.dtype)
        return res if out is None else out.copy_(res)
    valid = target != ignore_index
    v = -(grad / total_weight if reduction == 1 else grad)
    v = torch.where(valid, v, 0).to(log_probs.dtype).unsqueeze(1)
    out = torch.exp(log_probs, out=out) if out is not None else torch.exp(log_probs)
    out.mul_(-v)
    return out.scatter_add_(1, torch.where(valid, target, 0).unsqueeze(1), v)


_cross_entropy_backward_impl.takes_out = True


@_kernel(_cross_entropy_backward_impl)
def cross_entropy_backward(grad, log_probs, target, reduction: int, ignore_index: int, total_weight):
    """nll_loss_backward then _log_softmax_backward_data: ``(softmax - onehot) * scale``."""
    n, c = log_probs.shape
    dtype, grad, log_probs, total_weight = log_probs.dtype, upcast(grad), upcast(log_probs), upcast(total_weight)
    valid = ew.ne(target, ignore_index)
    scale = {0: grad, 1: ew.div(grad, total_weight), 2: grad}[reduction]
    scale = ew.where(valid, scale, 0)
    classes = prims.broadcast_in_dim(prims.iota(c, start=0, step=1, device=target.device, dtype=target.dtype),
                                     (n, c), (1,))
    onehot = ew.eq(classes, prims.broadcast_in_dim(target, (n, c), (0,)))
    gl = ew.where(onehot, ew.neg(shapes.unsqueeze(scale, 1)), 0)
    return _down(ew.sub(gl, ew.mul(ew.exp(log_probs), red.sum(gl, 1, True))), dtype)


# --- nll_loss: eager's forward (saving the total weight) and backward ------------------------------

def _nll_weights(target, weight, ignore_index: int, dtype):
    """Each row's weight: 0 where ignored, its class weight (1 without weights) elsewhere."""
    valid = ew.ne(target, ignore_index)
    w = convert(valid, dtype)
    if weight is not None:
        w = ew.mul(w, prims.index_select(upcast(weight), 0, ew.where(valid, target, 0)))
    return w


@_kernel(aten.nll_loss_forward)
def nll_loss_forward(self, target, weight, reduction: int, ignore_index: int):
    """``(loss, total_weight)`` for 2-d log-probabilities ``[N, C]`` and 1-d
    class indices (``reduction``: ATen's 0 none, 1 mean, 2 sum;
    ``total_weight`` is the valid rows' summed weight, 0 for none)."""
    dtype, x = self.dtype, upcast(self)
    w = _nll_weights(target, weight, ignore_index, x.dtype)
    safe = ew.where(ew.ne(target, ignore_index), target, 0)
    losses = ew.neg(ew.mul(shapes.squeeze(indexing.gather(x, 1, shapes.unsqueeze(safe, 1)), 1), w))
    total = red.sum(w)
    if reduction == 0:
        return _down(losses, dtype), _down(ew.mul(total, 0), dtype)
    summed = red.sum(losses)
    return _down(ew.div(summed, total) if reduction == 1 else summed, dtype), _down(total, dtype)


@_kernel(aten.nll_loss_backward)
def nll_loss_backward(grad_output, self, target, weight, reduction: int, ignore_index: int, total_weight):
    """``-w[t] * grad`` (over the total weight for mean) at each row's target, 0 elsewhere."""
    n, c = self.shape
    dtype, g = self.dtype, upcast(grad_output)
    w = _nll_weights(target, weight, ignore_index, g.dtype)
    v = ew.neg(ew.mul(w, ew.div(g, upcast(total_weight)) if reduction == 1 else g))
    classes = prims.broadcast_in_dim(prims.iota(c, start=0, step=1, device=target.device, dtype=target.dtype),
                                     (n, c), (1,))
    onehot = ew.eq(classes, prims.broadcast_in_dim(target, (n, c), (0,)))
    return _down(ew.where(onehot, prims.broadcast_in_dim(v, (n, c), (0,)), 0), dtype)


# --- normalization --------------------------------------------------------------------------------------

def _lead(x, normalized_shape) -> tuple:
    return tuple(range(x.ndim - len(tuple(normalized_shape))))


def _norm_dims(x, normalized_shape) -> tuple:
    return tuple(range(x.ndim - len(tuple(normalized_shape)), x.ndim))


@_kernel(aten.native_layer_norm)
def native_layer_norm(input, normalized_shape, weight, bias, eps: float):
    """``(out, mean, rstd)``; the statistics keep the normalized dims as 1s.
    For float16/bfloat16 the CPU kernel returns them in that dtype, the CUDA
    one in float32."""
    dtype = input.dtype
    stats = torch.float32 if dtype in dtypes.low_precision_floats and input.device.type != "cpu" else dtype
    x = upcast(input)
    var, mean = red.var_mean(x, _norm_dims(x, normalized_shape), keepdim=True, correction=0)
    rstd = ew.rsqrt(ew.add(var, eps))
    out = ew.mul(ew.sub(x, mean), rstd)
    if weight is not None:
        out = ew.mul(out, upcast(weight))
    if bias is not None:
        out = ew.add(out, upcast(bias))
    return _down(out, dtype), _down(mean, stats), _down(rstd, stats)


@_kernel(aten.native_layer_norm_backward)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    dims, lead = _norm_dims(input, normalized_shape), _lead(input, normalized_shape)
    out_dtypes = [None if t is None else t.dtype for t in (input, weight, bias)]
    grad_out, input, mean, rstd, weight = (upcast(t) for t in (grad_out, input, mean, rstd, weight))
    xhat = ew.mul(ew.sub(input, mean), rstd)
    gi = gw = gb = None
    if output_mask[0]:
        gxhat = ew.mul(grad_out, weight) if weight is not None else grad_out
        centered = ew.sub(gxhat, red.mean(gxhat, dims, True))
        gi = _down(ew.mul(rstd, ew.sub(centered, ew.mul(xhat, red.mean(ew.mul(gxhat, xhat), dims, True)))),
                   out_dtypes[0])
    if output_mask[1] and weight is not None:
        gw = _down(red.sum(ew.mul(grad_out, xhat), lead) if lead else ew.mul(grad_out, xhat), out_dtypes[1])
    if output_mask[2] and bias is not None:
        gb = _down(red.sum(grad_out, lead) if lead else grad_out, out_dtypes[2])
    return gi, gw, gb


@_kernel(aten._fused_rms_norm)
def fused_rms_norm(input, normalized_shape, weight, eps):
    """``(out, rstd)``; ``eps=None`` is the compute dtype's machine epsilon (as
    ATen); rstd is float32 for float16/bfloat16 inputs."""
    dtype, x = input.dtype, upcast(input)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    rstd = ew.rsqrt(ew.add(red.mean(ew.mul(x, x), _norm_dims(x, normalized_shape), True), eps))
    out = ew.mul(x, rstd)
    return _down(ew.mul(out, upcast(weight)) if weight is not None else out, dtype), rstd


def _fused_rms_norm_backward_impl(grad_out, input, normalized_shape, rstd, weight, output_mask):
    """ATen's kernel where it exists (CUDA); on the CPU, which has none, the
    formula in a few torch calls."""
    if input.is_cuda:
        return aten._fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask)
    dtype, wdtype = input.dtype, None if weight is None else weight.dtype
    if dtype in dtypes.low_precision_floats:
        grad_out, input = grad_out.float(), input.float()
        weight = None if weight is None else weight.float()
    n = len(normalized_shape)
    dims, lead = tuple(range(input.ndim - n, input.ndim)), tuple(range(input.ndim - n))
    xhat = input * rstd
    gi = gw = None
    if output_mask[0]:
        gxhat = grad_out * weight if weight is not None else grad_out
        gi = (rstd * (gxhat - xhat * (gxhat * xhat).mean(dims, keepdim=True))).to(dtype)
    if output_mask[1] and weight is not None:
        gw = ((grad_out * xhat).sum(lead) if lead else grad_out * xhat).to(wdtype)
    return gi, gw


@_kernel(_fused_rms_norm_backward_impl)
def fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    dims, lead = _norm_dims(input, normalized_shape), _lead(input, normalized_shape)
    dtype, wdtype = input.dtype, None if weight is None else weight.dtype
    grad_out, input, rstd, weight = (upcast(t) for t in (grad_out, input, rstd, weight))
    xhat = ew.mul(input, rstd)
    gi = gw = None
    if output_mask[0]:
        gxhat = ew.mul(grad_out, weight) if weight is not None else grad_out
        gi = _down(ew.mul(rstd, ew.sub(gxhat, ew.mul(xhat, red.mean(ew.mul(gxhat, xhat), dims, True)))), dtype)
    if output_mask[1] and weight is not None:
        gw = _down(red.sum(ew.mul(grad_out, xhat), lead) if lead else ew.mul(grad_out, xhat), wdtype)
    return gi, gw


# --- embedding -------------------------------------------------------------------------------------------

@_kernel(aten.embedding_dense_backward)
def embedding_dense_backward(grad_output, indices, num_weights: int, padding_idx: int, scale_grad_by_freq: bool):
    """``padding_idx`` is ATen's: -1 for none, else a non-negative row."""
    n, dim = indices.numel(), grad_output.shape[-1]
    idx = prims.reshape(indices, (n,))
    g = prims.reshape(grad_output, (n, dim))
    if scale_grad_by_freq:
        ones = prims.full((n,), 1, device=g.device, dtype=g.dtype)
        counts = prims.index_add(prims.full((num_weights,), 0, device=g.device, dtype=g.dtype), 0, idx, ones)
        g = ew.div(g, shapes.unsqueeze(prims.index_select(counts, 0, idx), 1))
    if padding_idx >= 0:
        g = ew.where(shapes.unsqueeze(ew.ne(idx, padding_idx), 1), g, 0)
    return prims.index_add(prims.full((num_weights, dim), 0, device=g.device, dtype=g.dtype), 0, idx, g)


# --- grouped matmul (mixture of experts) -------------------------------------------------------------

def _grouped_mm_operand(t: torch.Tensor) -> torch.Tensor:
    """``t`` laid out as ``_grouped_mm`` takes it: one of its last two strides
    1, the other a multiple of 16 bytes. An incoming gradient may be anything
    (an expanded ``sum`` gradient, a transpose): eager's backward then raises
    "Invalid strides"; here it is copied into such a layout (padded rows, as
    the kernel's own outputs are)."""
    size, stride, item = t.shape, t.stride(), t.element_size()
    rows, cols = size[-2], size[-1]
    if (stride[-1] == 1 and stride[-2] >= max(1, cols) and stride[-2] * item % 16 == 0) or \
            (stride[-2] == 1 and stride[-1] >= max(1, rows) and stride[-1] * item % 16 == 0):
        return t
    per_row = 16 // item
    padded = -(-cols // per_row) * per_row
    out = t.new_empty((*size[:-1], padded))[..., :cols]
    return out.copy_(t)


def _column_major(t: torch.Tensor) -> bool:
    return t.stride(-2) == 1 and t.stride(-1) != 1


def _grouped_mm_backward_impl(grad, mat_a, mat_b, offs, output_mask):
    """Each gradient computed in its operand's layout, as eager's formula does
    (a column-major operand's gradient is the transposed product, transposed
    back), so the results are eager's bit for bit."""
    grad = _grouped_mm_operand(grad)
    gmm = linalg.grouped_mm.torch_fn
    ga = gb = None
    if output_mask[0]:
        ga = gmm(mat_b, grad.mT, offs).mT if _column_major(mat_a) else gmm(grad, mat_b.mT, offs)
    if output_mask[1]:
        gb = gmm(grad.mT, mat_a, offs).mT if _column_major(mat_b) else gmm(mat_a.mT, grad, offs)
    return ga, gb


@_kernel(_grouped_mm_backward_impl)
def grouped_mm_backward(grad, mat_a, mat_b, offs, output_mask):
    """``(grad_a, grad_b)`` of ``grouped_mm(mat_a, mat_b, offs)``, each one
    grouped GEMM again, in every layout: ``grad_a = grouped_mm(grad, mat_b^T,
    offs)``, ``grad_b = grouped_mm(mat_a^T, grad, offs)`` (2-d x 3-d's weight
    gradient is the 2-d x 2-d form, a group per slice of the rows; an empty
    group's gradient is zeros). ``output_mask``: which of the two are wanted."""
    ga = linalg.grouped_mm(grad, shapes.transpose(mat_b, -2, -1), offs) if output_mask[0] else None
    gb = linalg.grouped_mm(shapes.transpose(mat_a, -2, -1), grad, offs) if output_mask[1] else None
    return ga, gb


# --- attention: the math CPU flash, CUDA flash and CUDA efficient attention compute ---------------------------

def _scores(query, key, is_causal: bool, attn_mask, scale):
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    s = ew.mul(linalg.matmul(query, shapes.transpose(key, -2, -1)), scale)
    if is_causal:
        L, S = query.shape[-2], key.shape[-2]
        rows = prims.broadcast_in_dim(prims.iota(L, start=0, step=1, device=query.device, dtype=torch.int64),
                                      (L, S), (0,))
        cols = prims.broadcast_in_dim(prims.iota(S, start=0, step=1, device=query.device, dtype=torch.int64),
                                      (L, S), (1,))
        s = ew.where(ew.ge(rows, cols), s, -math.inf)
    if attn_mask is not None:
        s = ew.add(s, attn_mask)
    return s, scale


def _heads_of(t, heads: int):
    """Grouped-query attention: k or v with fewer heads than q, each head
    repeated for the ``heads // t.shape[-3]`` query heads of its group (as
    eager's ``enable_gqa`` math path ``repeat_interleave``s it)."""
    if t.shape[-3] == heads:
        return t
    *batch, h, s, e = t.shape
    wide = shapes.expand(shapes.unsqueeze(t, -3), (*batch, h, heads // h, s, e))
    return shapes.reshape(wide, (*batch, heads, s, e))


def _sum_groups(g, heads: int):
    """The gradient of ``_heads_of``: each kv head's group summed."""
    if g.shape[-3] == heads:
        return g
    *batch, h, s, e = g.shape
    return red.sum(shapes.reshape(g, (*batch, heads, h // heads, s, e)), -3)


def _attention(query, key, value, is_causal: bool, attn_mask, scale):
    """``(out, logsumexp)``: the logsumexp of each query row's scaled scores,
    ``[B, H, L]``. A fully masked row (all scores -inf) gives zeros and a
    logsumexp of 0, as the kernels do (its backward then gives it no gradient)."""
    key, value = _heads_of(key, query.shape[-3]), _heads_of(value, query.shape[-3])
    s, _ = _scores(query, key, is_causal, attn_mask, scale)
    m = red.amax(s, -1, True)
    m = ew.where(ew.isinf(m), 0, m)
    e = ew.exp(ew.sub(s, m))
    total = red.sum(e, -1, True)
    total = ew.where(ew.eq(total, 0), 1, total)
    lse = ew.add(shapes.squeeze(ew.log(total), -1), shapes.squeeze(m, -1))
    return linalg.matmul(ew.div(e, total), value), lse


def _attention_grads(grad_out, query, key, value, out, logsumexp, is_causal: bool, attn_mask, scale):
    """``(gq, gk, gv)``; the probabilities are recomputed from q, k and the saved
    logsumexp. k and v with fewer heads (grouped-query attention) get their
    groups' sums."""
    kv_heads = key.shape[-3]
    key, value = _heads_of(key, query.shape[-3]), _heads_of(value, query.shape[-3])
    s, scale = _scores(query, key, is_causal, attn_mask, scale)
    probs = ew.exp(ew.sub(s, shapes.unsqueeze(logsumexp, -1)))
    gv = linalg.matmul(shapes.transpose(probs, -2, -1), grad_out)
    gp = linalg.matmul(grad_out, shapes.transpose(value, -2, -1))
    rowdot = red.sum(ew.mul(grad_out, out), -1, True)
    gs = ew.mul(ew.mul(probs, ew.sub(gp, rowdot)), scale)
    gk = linalg.matmul(shapes.transpose(gs, -2, -1), query)
    return linalg.matmul(gs, key), _sum_groups(gk, kv_heads), _sum_groups(gv, kv_heads)


def _dense_last_dims(op, positions: tuple[int, ...]) -> Callable:
    """``op`` with the tensors at ``positions`` (q, k, v, and the backward's
    grad_out and out) given a dense last dim first (the same values). The
    attention kernels read them only so: CPU flash attention returns wrong
    numbers for others, the CUDA kernels raise. Eager's dispatcher never hands
    them such tensors (it takes the math path then); a trace does not see
    strides, so the call makes them dense, a copy only where one is needed."""
    run = op._op        # the C function the op's Python __call__ forwards to

    def call(*args, **kwargs):
        dense = args
        for i in positions:         # a plain loop: no Python frame per call beyond this one
            a = args[i]
            if a is not None and a.stride(-1) != 1:
                if dense is args:
                    dense = list(args)
                dense[i] = a.contiguous()
        return run(*dense, **kwargs)
    call.__name__ = call.__qualname__ = f"{op.__name__}_dense"
    return call


@_kernel(_dense_last_dims(aten._scaled_dot_product_flash_attention_for_cpu, (0, 1, 2)))
def sdpa_flash_cpu(query, key, value, dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask=None,
                   scale=None):
    """``(out, logsumexp)``, the logsumexp ``[B, H, L]`` (float32 for float16/bfloat16)."""
    out, lse = _attention(upcast(query), upcast(key), upcast(value), is_causal, upcast(attn_mask), scale)
    return _down(out, query.dtype), lse


@_kernel(_dense_last_dims(aten._scaled_dot_product_flash_attention_for_cpu_backward, (0, 1, 2, 3, 4)))
def sdpa_flash_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p: float, is_causal: bool, *,
                            attn_mask=None, scale=None):
    grads = _attention_grads(*(upcast(t) for t in (grad_out, query, key, value, out)), logsumexp, is_causal,
                             upcast(attn_mask), scale)
    return tuple(_down(g, query.dtype) for g in grads)


# --- attention (CUDA memory-efficient attention) --------------------------------------------------------

_LSE_ALIGN = 32         # the CUDA kernel pads its logsumexp along the query rows to a multiple of this


def _f32(x):
    return x if x is None or x.dtype == torch.float32 else convert(x, torch.float32)


@_kernel(_dense_last_dims(aten._scaled_dot_product_efficient_attention, (0, 1, 2)))
def sdpa_efficient(query, key, value, attn_bias, compute_log_sumexp: bool, dropout_p: float = 0.0,
                   is_causal: bool = False, *, scale=None):
    """``(out, logsumexp, philox_seed, philox_offset)`` as the CUDA kernel returns
    them without dropout: the logsumexp in float32, ``[B, H, L]`` padded to a
    multiple of 32 rows (the pad is never read), the philox state empty.
    Computed in float32, as the kernel accumulates."""
    out, lse = _attention(_f32(query), _f32(key), _f32(value), is_causal, _f32(attn_bias), scale)
    L = query.shape[-2]
    rows = -(-L // _LSE_ALIGN) * _LSE_ALIGN if compute_log_sumexp else 0
    lse = prims.pad(lse, 0.0, ((0, 0, 0), (0, 0, 0), (0, rows - L, 0)))
    philox = [prims.full((), 0, device=query.device, dtype=torch.int64) for _ in range(2)]
    return convert(out, query.dtype), lse, *philox


@_kernel(_dense_last_dims(aten._scaled_dot_product_efficient_attention_backward, (0, 1, 2, 3, 5)))
def sdpa_efficient_backward(grad_out_, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset,
                            dropout_p: float, grad_input_mask, is_causal: bool = False, *, scale=None):
    """``(gq, gk, gv, None)``: the bias's gradient is not asked for
    (``grad_input_mask[3]`` is False on the paths that use this kernel)."""
    B, H, L = logsumexp.shape[0], logsumexp.shape[1], query.shape[-2]
    lse = prims.slice_prim(logsumexp, (0, 0, 0), (B, H, L))
    grads = _attention_grads(_f32(grad_out_), _f32(query), _f32(key), _f32(value), _f32(out), lse, is_causal,
                             _f32(attn_bias), scale)
    return (*(convert(g, query.dtype) for g in grads), None)


# --- attention (CUDA flash attention) ----------------------------------------------------------------------

def _no_dropout(dropout_p: float, return_debug_mask: bool = False) -> None:
    prims.check(dropout_p == 0.0 and not return_debug_mask,
                lambda: "the flash attention decomposition models neither dropout nor the debug mask",
                NotImplementedError)


@_kernel(_dense_last_dims(aten._scaled_dot_product_flash_attention, (0, 1, 2)))
def sdpa_flash_cuda(query, key, value, dropout_p: float = 0.0, is_causal: bool = False, return_debug_mask: bool = False,
                    *, scale=None):
    """``(out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed,
    philox_offset, debug_attn_mask)`` as the CUDA kernel returns them without
    dropout: the logsumexp in float32, ``[B, H, L]`` (not padded), no cumulative
    lengths (a dense batch), the philox state uint64 ``[2]`` and ``[]`` (never
    read without dropout), an empty debug mask. Computed in float32, as the
    kernel accumulates."""
    _no_dropout(dropout_p, return_debug_mask)
    out, lse = _attention(_f32(query), _f32(key), _f32(value), is_causal, None, scale)
    seed = prims.full((2,), 0, device=query.device, dtype=torch.uint64)
    offset = prims.full((), 0, device=query.device, dtype=torch.uint64)
    debug = prims.full((0,), 0, device=query.device, dtype=query.dtype)
    return convert(out, query.dtype), lse, None, None, query.shape[-2], key.shape[-2], seed, offset, debug


@_kernel(_dense_last_dims(aten._scaled_dot_product_flash_attention_backward, (0, 1, 2, 3, 4)))
def sdpa_flash_cuda_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q: int, max_k: int,
                             dropout_p: float, is_causal: bool, philox_seed, philox_offset, *, scale=None):
    """``(gq, gk, gv)``, from the forward's float32 logsumexp."""
    _no_dropout(dropout_p)
    grads = _attention_grads(_f32(grad_out), _f32(query), _f32(key), _f32(value), _f32(out), logsumexp, is_causal,
                             None, scale)
    return tuple(convert(g, query.dtype) for g in grads)


# --- attention (CUDA cuDNN attention) ----------------------------------------------------------------------

@_kernel(_dense_last_dims(aten._scaled_dot_product_cudnn_attention, (0, 1, 2)))
def sdpa_cudnn(query, key, value, attn_bias, compute_log_sumexp: bool, dropout_p: float = 0.0,
               is_causal: bool = False, return_debug_mask: bool = False, *, scale=None):
    """``(out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed,
    philox_offset, debug_attn_mask)`` as cuDNN's kernel returns them without
    dropout or bias: the logsumexp float32 ``[B, H, L, 1]``, no cumulative
    lengths or debug mask, the philox state int64 scalars (never read without
    dropout). k and v may have fewer heads than q (grouped-query attention,
    which the kernel takes as it is). Computed in float32, as the kernel accumulates."""
    _no_dropout(dropout_p, return_debug_mask)
    prims.check(attn_bias is None, lambda: "the cuDNN attention symbol models no attn_bias", NotImplementedError)
    out, lse = _attention(_f32(query), _f32(key), _f32(value), is_causal, None, scale)
    seed, offset = (prims.full((), 0, device=query.device, dtype=torch.int64) for _ in range(2))
    return convert(out, query.dtype), shapes.unsqueeze(lse, -1), None, None, query.shape[-2], key.shape[-2], \
        seed, offset, None


@_kernel(_dense_last_dims(aten._scaled_dot_product_cudnn_attention_backward, (0, 1, 2, 3, 4)))
def sdpa_cudnn_backward(grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias,
                        cum_seq_q, cum_seq_k, max_q: int, max_k: int, dropout_p: float, is_causal: bool, *,
                        scale=None):
    """``(gq, gk, gv)``, from the forward's float32 ``[B, H, L, 1]`` logsumexp."""
    _no_dropout(dropout_p)
    grads = _attention_grads(_f32(grad_out), _f32(query), _f32(key), _f32(value), _f32(out),
                             shapes.squeeze(logsumexp, -1), is_causal, None, scale)
    return tuple(convert(g, query.dtype) for g in grads)
