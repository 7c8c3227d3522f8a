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
import os

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


@register_vjp(linalg.linear, when=_linear_when)
def _linear(g, out, input, weight, bias=None):
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
    return _kernel_input(bsym) and _arg(bsym, 3, "dtype") is None and bsym.tensor_args()[0].ndim > 0


@register_vjp(lnn.softmax, when=_softmax_when)
def _softmax(g, out, input, dim=None, _stacklevel=3, dtype=None):
    return (kernels.softmax_backward_data(g, out, _softmax_dim(input, dim) % input.ndim, input.dtype),)


@register_vjp(lnn.log_softmax, when=_softmax_when)
def _log_softmax(g, out, input, dim=None, _stacklevel=3, dtype=None):
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


@register_forward(lnn.rms_norm, when=lambda b: _kernel_input(b) and not isinstance(_arg(b, 2, "weight", 0), float))
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


@register_vjp(lnn.batch_norm, when=_batch_norm_when)
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


@register_forward(lnn.cross_entropy, when=lambda b: _ce_when(b, _kernel_input) and b.tensor_args()[0].ndim == 2
                  and _arg(b, 1, "target").ndim == 1)
def _cross_entropy_forward(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                           reduction="mean", label_smoothing=0.0):
    """log_softmax + nll_loss, saving the log-probabilities (eager's choice)."""
    return kernels.cross_entropy_forward(input, target, _REDUCTION[reduction], ignore_index)


@register_vjp(kernels.cross_entropy_forward)
def _cross_entropy_kernel(g, out, input, target, reduction, ignore_index):
    if g[0] is None:
        return None, None, None, None
    return kernels.cross_entropy_backward(g[0], out[1], target, reduction, ignore_index, out[2]), None, None, None


@register_vjp(lnn.cross_entropy, when=_ce_when)
def _cross_entropy(g, out, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    return cross_entropy_backward(g, input, target, ignore_index, reduction), None, None, None, None, None, None, None


# --- attention ---------------------------------------------------------------------------------------

def _sdpa_when(bsym) -> bool:
    q, k = _arg(bsym, 0, "query"), _arg(bsym, 1, "key")
    mask = _arg(bsym, 3, "attn_mask")
    gqa = _arg(bsym, 7, "enable_gqa", False) and k.shape[-3] != q.shape[-3]
    mask_ok = mask is None or (isinstance(mask, TensorProxy) and not _arg(bsym, 5, "is_causal", False))
    return (_float_input(bsym) and _arg(bsym, 4, "dropout_p", 0.0) == 0.0 and not gqa and mask_ok
            and q.ndim >= 2 and q.dtype == k.dtype == _arg(bsym, 2, "value").dtype)


def _attention_probs(q, k, mask, is_causal, scale):
    scores = ew.mul(linalg.matmul(q, shapes.transpose(k, -2, -1)), scale)
    L, S = q.shape[-2], k.shape[-2]
    if is_causal:
        rows = prims.broadcast_in_dim(prims.iota(L, start=0, step=1, device=q.device, dtype=torch.int64), (L, S), (0,))
        cols = prims.broadcast_in_dim(prims.iota(S, start=0, step=1, device=q.device, dtype=torch.int64), (L, S), (1,))
        scores = ew.where(ew.ge(rows, cols), scores, -math.inf)
    if mask is not None:
        scores = ew.where(mask, scores, -math.inf) if mask.dtype is torch.bool else ew.add(scores, mask)
    return lnn.softmax(scores, -1)


def _flash_cpu_when(bsym) -> bool:
    """What ATen's CPU flash attention takes: 4-d q/k/v on the CPU with one
    head size, no dropout or GQA, a boolean mask or a float mask of q's dtype
    that needs no grad."""
    q, k, v = _arg(bsym, 0, "query"), _arg(bsym, 1, "key"), _arg(bsym, 2, "value")
    mask = _arg(bsym, 3, "attn_mask")
    mask_ok = mask is None or (isinstance(mask, TensorProxy) and mask.dtype in (q.dtype, torch.bool)
                               and not _wants(mask))
    return (_kernel_input(bsym) and _arg(bsym, 4, "dropout_p", 0.0) == 0.0 and not _arg(bsym, 7, "enable_gqa", False)
            and mask_ok and q.dtype == k.dtype == v.dtype and q.device.type == "cpu" and q.ndim == k.ndim == v.ndim == 4
            and q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[:2] == k.shape[:2] == v.shape[:2]
            and not isinstance(_arg(bsym, 6, "scale"), TensorProxy))


_EFFICIENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _cuda_capability(device) -> tuple[int, int] | None:
    """The compute capability of the GPU a CUDA proxy lives on, or None where no
    GPU answers (a trace made without one, a ROCm build): then no kernel choice
    that depends on it is made."""
    if torch.version.hip is not None:
        return None
    try:
        return tuple(torch.cuda.get_device_capability(device))
    except (AssertionError, RuntimeError):
        return None


def _efficient_cuda_when(bsym) -> bool:
    """What ATen's CUDA memory-efficient attention takes as eager calls it: 4-d
    q/k/v on CUDA of one half or float dtype (bfloat16 only from sm80), q and k
    of one head size aligned to 16 bytes, no dropout or GQA, and a mask
    (boolean, or a float mask of q's dtype that needs no grad) whose key length
    is a multiple of 16 (eager pads other lengths first)."""
    q, k, v = _arg(bsym, 0, "query"), _arg(bsym, 1, "key"), _arg(bsym, 2, "value")
    mask = _arg(bsym, 3, "attn_mask")
    if not all(isinstance(t, TensorProxy) for t in (q, k, v)) or q.device.type != "cuda":
        return False
    mask_ok = mask is None or (isinstance(mask, TensorProxy) and mask.dtype in (q.dtype, torch.bool)
                               and not _wants(mask) and k.shape[-2] % 16 == 0 and mask.ndim <= 4)
    align = 16 // q.dtype.itemsize if q.dtype in _EFFICIENT_DTYPES else 0
    ok = (q.dtype in _EFFICIENT_DTYPES and q.dtype == k.dtype == v.dtype and q.ndim == k.ndim == v.ndim == 4
          and q.shape[-1] == k.shape[-1] and q.shape[-1] % align == 0 and v.shape[-1] % align == 0
          and q.shape[:2] == k.shape[:2] == v.shape[:2] and _arg(bsym, 4, "dropout_p", 0.0) == 0.0
          and not _arg(bsym, 7, "enable_gqa", False) and mask_ok
          and not isinstance(_arg(bsym, 6, "scale"), TensorProxy))
    if ok and q.dtype == torch.bfloat16:
        cap = _cuda_capability(q.device)
        return cap is None or cap >= (8, 0)
    return ok


def _flash_training_head_dim_ok(cap: tuple[int, int], head_dim: int, training: bool) -> bool:
    """On sm86-89 and sm120-121 flash attention's backward takes head dims up
    to 192, and above 224 only without dropout (which these symbols never
    have); eager's dispatcher checks this when an input requires grad."""
    if not training or not ((8, 6) <= cap <= (8, 9) or (12, 0) <= cap <= (12, 1)):
        return True
    return head_dim <= 192 or head_dim > 224


def _flash_cuda_when(bsym) -> bool:
    """What eager's dispatcher (sdp_utils.cpp ``can_use_flash_attention``) lets
    ATen's CUDA flash attention take, less what thunderlite's symbols do not
    model: 4-d float16/bfloat16 q/k/v on an sm80..sm121 GPU of a build with
    flash attention, one head size at most 256 and a multiple of 8 (eager pads
    others, a recorded forward cannot), one batch size and head count, or with
    ``enable_gqa`` k and v of one head count dividing q's (the kernel takes
    grouped-query attention as it is), non-empty sequences, no mask or
    dropout, ``is_causal`` only with as many queries as keys."""
    q, k, v = _arg(bsym, 0, "query"), _arg(bsym, 1, "key"), _arg(bsym, 2, "value")
    if not all(isinstance(t, TensorProxy) for t in (q, k, v)) or q.device.type != "cuda":
        return False
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    shapes_ok = (q.dtype in (torch.float16, torch.bfloat16) and q.dtype == k.dtype == v.dtype
                 and q.ndim == k.ndim == v.ndim == 4 and E == k.shape[-1] == v.shape[-1] and E <= 256 and E % 8 == 0
                 and _heads_ok(bsym) and S == v.shape[-2] and L > 0 and S > 0
                 and (not _arg(bsym, 5, "is_causal", False) or L == S))
    if not (shapes_ok and _arg(bsym, 3, "attn_mask") is None and _arg(bsym, 4, "dropout_p", 0.0) == 0.0
            and not isinstance(_arg(bsym, 6, "scale"), TensorProxy)):
        return False
    cap = _cuda_capability(q.device)
    return (cap is not None and (8, 0) <= cap <= (12, 1) and torch.backends.cuda.is_flash_attention_available()
            and _flash_training_head_dim_ok(cap, E, any(_wants(t) for t in (q, k, v))))


def _heads_ok(bsym) -> bool:
    """sdp_utils ``check_batch_size_and_num_heads_dense`` for kernels that take
    grouped-query attention: one batch size; one head count, or with
    ``enable_gqa`` k and v of one head count that divides q's."""
    q, k, v = _arg(bsym, 0, "query"), _arg(bsym, 1, "key"), _arg(bsym, 2, "value")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        return False
    hq, hk, hv = q.shape[1], k.shape[1], v.shape[1]
    if _arg(bsym, 7, "enable_gqa", False):
        return hk == hv and hk > 0 and hq % hk == 0
    return hq == hk == hv


def _cudnn_version() -> int | None:
    return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None


_CUDNN_MAX_HEAD_DIM = 128   # eager allows 256 on sm90/sm10x with cuDNN > 9.22 and a frontend built for it


def _cudnn_cuda_when(bsym) -> bool:
    """What eager's dispatcher (sdp_utils.cpp ``can_use_cudnn_attention``) lets
    cuDNN attention take, less what thunderlite's symbols do not model: 4-d
    float16/bfloat16 q/k/v on an sm80..sm121 GPU with cuDNN 9+, one head size
    at most 128 and a multiple of 8, batch and heads at most 65535, grouped
    query attention as flash takes it, non-empty queries, more than one key, no
    mask (cuDNN takes some; their turn is skipped here) or dropout, and not
    under ``torch.use_deterministic_algorithms`` (unless warn-only)."""
    q, k, v = _arg(bsym, 0, "query"), _arg(bsym, 1, "key"), _arg(bsym, 2, "value")
    if not all(isinstance(t, TensorProxy) for t in (q, k, v)) or q.device.type != "cuda":
        return False
    version = _cudnn_version()
    if version is None or version < 90000:
        return False
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        return False
    E = q.shape[-1]
    ok = (q.dtype in (torch.float16, torch.bfloat16) and q.dtype == k.dtype == v.dtype
          and q.ndim == k.ndim == v.ndim == 4 and E == k.shape[-1] == v.shape[-1] and E <= _CUDNN_MAX_HEAD_DIM
          and E % 8 == 0 and _heads_ok(bsym) and q.shape[0] <= 65535 and q.shape[1] <= 65535
          and q.shape[-2] > 0 and k.shape[-2] > 1 and k.shape[-2] == v.shape[-2]
          and _arg(bsym, 3, "attn_mask") is None and _arg(bsym, 4, "dropout_p", 0.0) == 0.0
          and not isinstance(_arg(bsym, 6, "scale"), TensorProxy))
    cap = _cuda_capability(q.device) if ok else None
    return cap is not None and (8, 0) <= cap <= (12, 1)


_SDP_MATH, _SDP_FLASH, _SDP_EFFICIENT, _SDP_CUDNN = 0, 1, 2, 3     # torch.nn.attention.SDPBackend's values
_DEFAULT_ORDER = [_SDP_FLASH, _SDP_EFFICIENT, _SDP_MATH, _SDP_CUDNN]


def _prefers_cudnn(device) -> bool:
    """sdp_utils.cpp ``check_prefer_cudnn_attention``: on sm90/sm10x (with a
    CUDA 12 build: sm90, sm100, sm103) and cuDNN newer than 9.15.0, eager's
    first SDPA call puts cuDNN attention first in the priority order, unless
    ``TORCH_CUDNN_SDPA_DEPRIORITIZED`` is set."""
    if os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").lower() in ("1", "true", "on", "yes"):
        return False
    version = _cudnn_version()
    cap = _cuda_capability(device)
    if version is None or version <= 91500 or cap is None or cap[0] not in (9, 10):
        return False
    cuda = tuple(int(x) for x in (torch.version.cuda or "0").split(".")[:1])
    return cuda >= (13,) or cap[1] in (0, 3)


def _sdp_priority_order(device=None) -> list[int]:
    """Eager's order: torch's setting, which its first CUDA SDPA call replaces
    by cuDNN, flash, efficient, math where cuDNN is preferred (read before any
    such call, torch still reports the default order)."""
    get = getattr(torch._C, "_get_sdp_priority_order", None)
    order = list(get()) if get is not None else list(_DEFAULT_ORDER[:3])
    if order[:4] == _DEFAULT_ORDER and device is not None and _prefers_cudnn(device):
        return [_SDP_CUDNN, _SDP_FLASH, _SDP_EFFICIENT, _SDP_MATH, *order[4:]]
    return order


def _cuda_sdpa_kernel(bsym) -> str | None:
    """``"cudnn"``, ``"flash"`` or ``"efficient"``: the CUDA attention kernel
    eager's dispatcher (sdp_utils.cpp ``select_sdp_backend``) picks for this
    call, walking its priority order under the user's toggles, where
    thunderlite has that kernel's symbols and can tell from the metadata that
    the kernel takes the call; None where eager takes the math path (the
    decomposition's VJP). A call cuDNN would take but thunderlite does not
    model for it (a mask, head dims above 128) skips cuDNN's turn."""
    backends = torch.backends.cuda
    q = _arg(bsym, 0, "query")
    for backend in _sdp_priority_order(q.device if isinstance(q, TensorProxy) and q.device.type == "cuda" else None):
        if backend == _SDP_CUDNN and backends.cudnn_sdp_enabled() and _cudnn_cuda_when(bsym):
            return "cudnn"
        if backend == _SDP_FLASH and backends.flash_sdp_enabled() and _flash_cuda_when(bsym):
            return "flash"
        if backend == _SDP_EFFICIENT and backends.mem_efficient_sdp_enabled() and _efficient_cuda_when(bsym):
            return "efficient"
        if backend == _SDP_MATH and backends.math_sdp_enabled():
            return None
    return None


class _Call:
    """A call's arguments in a bound symbol's shape, for the predicates above."""

    def __init__(self, *args):
        self.args, self.kwargs = args, {}


def _additive(attn_mask, query):
    """A boolean mask made additive (0 / -inf in q's dtype), as eager converts it."""
    if attn_mask is None or attn_mask.dtype is not torch.bool:
        return attn_mask
    attn_mask = ew.where(attn_mask, 0.0, -math.inf)
    return attn_mask if attn_mask.dtype == query.dtype else prims.convert_element_type(attn_mask, query.dtype)


@register_forward(lnn.scaled_dot_product_attention,
                  when=lambda b: _flash_cpu_when(b) or _cuda_sdpa_kernel(b) is not None)
def _sdpa_forward(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The output plus the statistics eager's kernel saves: CPU flash
    attention's logsumexp; CUDA flash attention's logsumexp and philox state;
    or CUDA memory-efficient attention's logsumexp and philox state (its bias
    expanded to ``[B, H, L, S]``, as eager passes it)."""
    call = _Call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    attn_mask = _additive(attn_mask, query)
    if query.device.type == "cpu":
        return kernels.sdpa_flash_cpu(query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale)
    kernel = _cuda_sdpa_kernel(call)
    if kernel == "cudnn":
        return kernels.sdpa_cudnn(query, key, value, None, True, 0.0, is_causal, False, scale=scale)
    if kernel == "flash":
        return kernels.sdpa_flash_cuda(query, key, value, 0.0, is_causal, False, scale=scale)
    if attn_mask is not None:
        attn_mask = shapes.expand(attn_mask, (*query.shape[:-1], key.shape[-2]))
    return kernels.sdpa_efficient(query, key, value, attn_mask, True, 0.0, is_causal, scale=scale)


@register_vjp(kernels.sdpa_flash_cpu)
def _sdpa_flash(g, out, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if g[0] is None:
        return {}
    gq, gk, gv = kernels.sdpa_flash_cpu_backward(g[0], query, key, value, out[0], out[1], 0.0, is_causal,
                                                 attn_mask=attn_mask, scale=scale)
    return {"query": gq if _wants(query) else None, "key": gk if _wants(key) else None,
            "value": gv if _wants(value) else None}


@register_vjp(kernels.sdpa_flash_cuda)
def _sdpa_flash_cuda(g, out, query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
                     scale=None):
    if g[0] is None:
        return {}
    gq, gk, gv = kernels.sdpa_flash_cuda_backward(g[0], query, key, value, out[0], out[1], out[2], out[3], out[4],
                                                  out[5], 0.0, is_causal, out[6], out[7], scale=scale)
    return {"query": gq if _wants(query) else None, "key": gk if _wants(key) else None,
            "value": gv if _wants(value) else None}


@register_vjp(kernels.sdpa_cudnn)
def _sdpa_cudnn(g, out, query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                return_debug_mask=False, *, scale=None):
    if g[0] is None:
        return {}
    gq, gk, gv = kernels.sdpa_cudnn_backward(g[0], query, key, value, out[0], out[1], out[6], out[7], None, None,
                                             None, out[4], out[5], 0.0, is_causal, scale=scale)
    return {"query": gq if _wants(query) else None, "key": gk if _wants(key) else None,
            "value": gv if _wants(value) else None}


@register_vjp(kernels.sdpa_efficient)
def _sdpa_efficient(g, out, query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,
                    scale=None):
    if g[0] is None:
        return {}
    mask = (_wants(query), _wants(key), _wants(value), False)
    gq, gk, gv, _ = kernels.sdpa_efficient_backward(g[0], query, key, value, attn_bias, out[0], out[1], out[2],
                                                    out[3], 0.0, mask, is_causal, scale=scale)
    return {"query": gq if mask[0] else None, "key": gk if mask[1] else None, "value": gv if mask[2] else None}


@register_vjp(lnn.scaled_dot_product_attention, when=_sdpa_when)
def _sdpa(g, out, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Recomputes the attention probabilities from q and k instead of saving them."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    probs = _attention_probs(query, key, attn_mask, is_causal, scale)
    gv = sum_to(linalg.matmul(shapes.transpose(probs, -2, -1), g), value.shape) if _wants(value) else None
    gp = linalg.matmul(g, shapes.transpose(value, -2, -1))
    gs = ew.mul(probs, ew.sub(gp, red.sum(ew.mul(gp, probs), -1, True)))
    gq = sum_to(ew.mul(linalg.matmul(gs, key), scale), query.shape) if _wants(query) else None
    gk = sum_to(ew.mul(linalg.matmul(shapes.transpose(gs, -2, -1), query), scale), key.shape) if _wants(key) else None
    gm = sum_to(gs, attn_mask.shape) if _wants(attn_mask) else None
    return gq, gk, gv, gm, None, None, None, None


# --- embedding -------------------------------------------------------------------------------------------

def _embedding_when(bsym) -> bool:
    w = _arg(bsym, 1, "weight")
    return (_arg(bsym, 3, "max_norm") is None and not _arg(bsym, 6, "sparse", False)
            and isinstance(w, TensorProxy) and w.ndim == 2)


@register_vjp(lnn.embedding, when=_embedding_when)
def _embedding(g, out, input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
               scale_grad_by_freq=False, sparse=False):
    num = weight.shape[0]
    pad = -1 if padding_idx is None else (padding_idx if padding_idx >= 0 else padding_idx + num)
    return None, kernels.embedding_dense_backward(g, input, num, pad, scale_grad_by_freq), None, None, None, None, None


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

@register_vjp(lnn.gelu, when=_kernel_input)
def _gelu(g, out, input, approximate="none"):
    return kernels.gelu_backward(g, input, approximate=approximate), None


@register_vjp(lnn.silu, when=_kernel_input)
def _silu(g, out, input, inplace=False):
    return kernels.silu_backward(g, input), None


@register_vjp(ew.tanh, when=_kernel_input)
def _tanh(g, out, a):
    return (kernels.tanh_backward(g, out),)


@register_vjp(ew.sigmoid, when=_kernel_input)
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
