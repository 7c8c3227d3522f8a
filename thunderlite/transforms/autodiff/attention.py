"""Attention takes the kernel eager's dispatcher takes (docs/architecture.md §9).

``sdpa_kernel(bsym)`` says which: on the CPU, ATen's flash attention where
sdp_utils_cpp.cpp's ``use_flash_attention_cpp`` takes the call (grouped-query
attention included), else the math path; on CUDA, cuDNN, flash or
memory-efficient attention in eager's priority order under the user's
toggles, else the math path. The forward registered here records the chosen
kernel's ATen op, returning the statistics its backward reads (logsumexp,
philox state), and each kernel's VJP emits its ATen backward as one symbol
(autodiff/kernels.py). The math path is the decomposition (``lnn.
scaled_dot_product_attention``), differentiated by ``_sdpa`` (float32/64)
or through its parts. ``sdpa_kernel`` also gives the reason in words, for
``thunderlite.examine``.
"""
from __future__ import annotations

import math
import os

import torch

from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.ops import linalg, shapes
from thunderlite.torch.ops import nn as lnn
from thunderlite.torch.ops import reductions as red
from thunderlite.transforms.autodiff import kernels
from thunderlite.transforms.autodiff.rules import register_forward, register_vjp, sum_to
from thunderlite.transforms.autodiff.torch_rules import _arg, _float_input, _wants


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
    return lnn.safe_softmax(scores)


_CPU_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _cpu_flash_refusal(bsym) -> str | None:
    """Why eager's CPU dispatcher (sdp_utils_cpp.cpp ``use_flash_attention_cpp``,
    checked in its order) does not take ATen's CPU flash attention for this call
    and runs the math path instead; None where it takes it. Strides are not
    checked: the kernel symbols make the last dims dense (``_dense_last_dims``),
    where eager would take the math path for such inputs."""
    q, k, v = _arg(bsym, 0, "query"), _arg(bsym, 1, "key"), _arg(bsym, 2, "value")
    mask, dropout_p = _arg(bsym, 3, "attn_mask"), _arg(bsym, 4, "dropout_p", 0.0)
    if not all(isinstance(t, TensorProxy) for t in (q, k, v)):
        return "q, k and v are not all tensors"
    if not torch.backends.cuda.flash_sdp_enabled():
        return "flash attention is disabled (torch.backends.cuda.enable_flash_sdp, sdpa_kernel)"
    if not isinstance(dropout_p, (int, float)) or dropout_p > 0.0:
        return ("dropout_p > 0: the CPU flash kernel takes no dropout (eager's math path draws the dropout "
                "mask as thunderlite's dropout does)")
    if not q.ndim == k.ndim == v.ndim == 4:
        return "q, k and v are not all 4-d"
    if not _heads_ok(bsym):
        return ("batch sizes or head counts differ (grouped-query attention needs enable_gqa=True and one kv "
                "head count dividing q's)")
    refusal = _cpu_mask_refusal(mask, q, k)
    if refusal is not None:
        return refusal
    if not q.shape[-1] == k.shape[-1] == v.shape[-1]:
        return "q, k and v head dims differ"
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        return "an empty sequence"
    if not (q.dtype == k.dtype == v.dtype and q.dtype in _CPU_FLASH_DTYPES):
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype} (the kernel takes one float dtype)"
    if isinstance(_arg(bsym, 6, "scale"), TensorProxy):
        return "a scale computed at run time"
    return None


def _cpu_mask_refusal(mask, q, k) -> str | None:
    """sdp_utils_cpp.h ``check_attn_mask_shape``: a mask that needs no grad,
    2-d or 4-d, its dims q's or 1."""
    if mask is None:
        return None
    if not isinstance(mask, TensorProxy):
        return "a mask that is not a tensor"
    if mask.requires_grad:
        return "the mask requires grad (the kernel returns no gradient for it)"
    if mask.ndim not in (2, 4):
        return f"a {mask.ndim}-d mask (the kernel takes 2-d and 4-d masks)"
    ok = mask.shape[-2] in (q.shape[-2], 1) and mask.shape[-1] in (k.shape[-2], 1)
    if mask.ndim == 4:
        ok = ok and mask.shape[0] in (q.shape[0], 1) and mask.shape[1] in (q.shape[1], 1)
    return None if ok else f"a mask of shape {tuple(mask.shape)} (its dims must be q's, k's or 1)"


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


_MATH_CUDA = ("eager's dispatcher takes the math path: no fused CUDA kernel thunderlite models takes this call "
               "under the current toggles (torch.backends.cuda.*_sdp_enabled)")
_DROPOUT_CUDA = ("dropout_p > 0: eager's fused CUDA kernels draw the dropout mask from their own philox stream, which "
                 "thunderlite's attention symbols do not model; the decomposition draws it with thunderlite's "
                 "dropout (the same distribution and scaling, not the same values)")

KERNEL_OPS = {"flash_cpu": "aten._scaled_dot_product_flash_attention_for_cpu",
              "flash": "aten._scaled_dot_product_flash_attention",
              "efficient": "aten._scaled_dot_product_efficient_attention",
              "cudnn": "aten._scaled_dot_product_cudnn_attention"}


def sdpa_kernel(bsym) -> tuple[str | None, str]:
    """``(kernel, why)``: the kernel eager's dispatcher takes for this
    ``scaled_dot_product_attention`` call where thunderlite has its symbols
    (``"flash_cpu"``, ``"flash"``, ``"efficient"``, ``"cudnn"``: keys of
    ``KERNEL_OPS``), or None for the math path (the decomposition); ``why``
    in words."""
    q = _arg(bsym, 0, "query")
    device = q.device.type if isinstance(q, TensorProxy) else None
    if device == "cpu":
        refusal = _cpu_flash_refusal(bsym)
        if refusal is None:
            return "flash_cpu", "eager's CPU dispatcher takes flash attention for this call"
        return None, f"eager's CPU dispatcher takes the math path: {refusal}"
    if device == "cuda":
        kernel = _cuda_sdpa_kernel(bsym)
        if kernel is not None:
            return kernel, f"eager's CUDA dispatcher takes {kernel} attention for this call"
        dropout_p = _arg(bsym, 4, "dropout_p", 0.0)
        return None, _DROPOUT_CUDA if not isinstance(dropout_p, (int, float)) or dropout_p > 0 else _MATH_CUDA
    return None, f"no fused attention kernel is modelled on {device!r}: the decomposition runs"


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


@register_forward(lnn.scaled_dot_product_attention, when=lambda b: sdpa_kernel(b)[0] is not None,
                  why=lambda b: sdpa_kernel(b)[1])
def _sdpa_forward(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The output plus the statistics eager's kernel saves: CPU flash
    attention's logsumexp (k and v with fewer heads, grouped-query attention,
    as they are: the kernel takes them); CUDA flash attention's logsumexp and philox state;
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


