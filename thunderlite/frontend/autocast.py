"""torch.autocast while tracing: the casts eager's autocast would make, made explicit.

Eager autocast casts the floating inputs of some ops at dispatch time (the
AutocastCPU / AutocastCUDA dispatch keys). Proxies never reach the dispatcher,
so the jit does the same at recording time: when the op called by user code is
on one of autocast's lists for its inputs' device type, and autocast is enabled
for that device type right now (at call time, or inside a ``with torch.autocast``
region the interpreted program entered: its ``__enter__`` runs natively and sets
torch's autocast state), the inputs are cast with ``ltorch.to`` before the op is
recorded. The trace then holds explicit casts; the computation runs with
autocast disabled (see ``without_autocast``) so nothing is cast twice.

Policies (as ``aten/src/ATen/autocast_mode.{h,cpp}`` of the installed torch):
``lower`` casts eligible inputs (floating, not float64) to the autocast dtype,
``fp32`` casts them to float32, ``promote`` casts them to the widest floating
dtype among them. Only the top-level call is cast: a composite's decomposition
runs on the cast inputs (as eager's autocast kernels redispatch below autocast).
The lists were checked against eager CPU autocast with the OpInfo samples.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core.proxies import TensorProxy, _BoundMethod
from thunderlite.core.symbol import Symbol
from thunderlite.torch import symbol_for

_CONV = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_LOSSES_FP32 = ("mse_loss", "l1_loss", "cross_entropy", "nll_loss", "kl_div", "binary_cross_entropy_with_logits",
                "smooth_l1_loss", "huber_loss", "cosine_embedding_loss", "hinge_embedding_loss",
                "margin_ranking_loss", "poisson_nll_loss", "soft_margin_loss", "triplet_margin_loss",
                "multi_margin_loss", "multilabel_margin_loss")

LOWER = {
    "cpu": frozenset(_CONV + ("prelu", "addmm", "addbmm", "baddbmm", "bmm", "mm", "matmul", "linear", "einsum",
                              "vecdot", "multi_dot", "chain_matmul", "tensordot", "scaled_dot_product_attention")),
    "cuda": frozenset(_CONV + ("prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "vecdot",
                               "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "multi_dot",
                               "scaled_dot_product_attention")),
}
FP32 = {
    "cpu": frozenset(_LOSSES_FP32 + ("binary_cross_entropy", "prod", "trace", "cdist", "grid_sample", "svd",
                                     "adaptive_avg_pool3d", "adaptive_max_pool3d", "max_unpool1d", "max_unpool2d",
                                     "max_unpool3d")),
    "cuda": frozenset(_LOSSES_FP32 + (
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow", "softplus", "layer_norm", "rms_norm", "group_norm", "cosine_similarity", "dist",
        "pdist", "cdist", "renorm", "logsumexp", "norm", "prod", "softmax", "log_softmax", "cumprod", "cumsum",
        "vector_norm", "matrix_norm", "sum")),
}
PROMOTE = {
    "cpu": frozenset(),
    "cuda": frozenset(("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sample",
                       "index_put", "tensordot", "scatter_add")),
}
# fp32 ops that take a ``dtype=``: autocast sets it only when the caller did not
_OPT_DTYPE = frozenset(("prod", "softmax", "log_softmax", "cumprod", "cumsum", "vector_norm", "matrix_norm", "sum"))
_OPERATORS = {"__matmul__": "matmul", "__rmatmul__": "matmul", "__pow__": "pow", "__rpow__": "pow"}
_DEVICE_TYPES = ("cpu", "cuda")


def op_name(fn: Callable) -> str | None:
    """The torch op name autocast's lists use for ``fn`` (a symbol, a proxy method
    or operator), or None when ``fn`` is not a torch op."""
    if isinstance(fn, _BoundMethod):
        fn = fn.fn
    if isinstance(fn, Symbol):
        if fn.module == "ltorch":
            return fn.name
        torch_fn = fn.torch_fn
        return getattr(torch_fn, "__name__", None) if torch_fn is not None else None
    return _OPERATORS.get(getattr(fn, "__name__", ""))


def cast_inputs(fn: Callable, args: tuple, kwargs: dict) -> tuple[Callable, tuple, dict]:
    """``fn, args, kwargs`` with the casts autocast makes for this call (if any)."""
    name = op_name(fn)
    if name is None:
        return fn, args, kwargs
    bound = fn.proxy if isinstance(fn, _BoundMethod) else None
    dev = _device_type(bound, args, kwargs)
    if dev is None or not torch.is_autocast_enabled(dev):
        return fn, args, kwargs
    if name in LOWER[dev]:
        target = torch.get_autocast_dtype(dev)
    elif name in FP32[dev] and not (name in _OPT_DTYPE and kwargs.get("dtype") is not None):
        target = torch.float32
    elif name in PROMOTE[dev]:
        target = _widest(bound, args, kwargs, dev)
    else:
        return fn, args, kwargs
    if target is None:
        return fn, args, kwargs

    def cast(v):
        if _eligible(v, dev) and v.dtype != target:
            return _to(v, target)
        if type(v) in (list, tuple):
            return type(v)(cast(y) for y in v)
        return v
    if bound is not None:
        fn = _BoundMethod(fn.fn, cast(bound))
    return fn, tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def _to(p: TensorProxy, dtype: torch.dtype) -> TensorProxy:
    return symbol_for(torch.Tensor.to)(p, dtype)


def _tensors(bound, args: tuple, kwargs: dict):
    if bound is not None:
        yield bound
    for v in (*args, *kwargs.values()):
        if type(v) is TensorProxy:
            yield v
        elif type(v) in (list, tuple):
            yield from (y for y in v if type(y) is TensorProxy)


def _device_type(bound, args: tuple, kwargs: dict) -> str | None:
    for p in _tensors(bound, args, kwargs):
        dev = p.device.type
        return dev if dev in _DEVICE_TYPES else None
    return None


def _eligible(v: Any, dev: str) -> bool:
    return (type(v) is TensorProxy and v.dtype.is_floating_point and v.dtype != torch.float64
            and v.device.type == dev)


def _widest(bound, args: tuple, kwargs: dict, dev: str) -> torch.dtype | None:
    dtypes = [p.dtype for p in _tensors(bound, args, kwargs) if _eligible(p, dev)]
    if not dtypes:
        return None
    return max(dtypes, key=lambda d: (torch.finfo(d).bits, d == torch.float32))


def autocast_state() -> tuple | None:
    """The autocast part of the cache key: enabled device types and their dtypes."""
    if not torch._C._is_any_autocast_enabled():
        return None
    return tuple((d, torch.get_autocast_dtype(d)) for d in _DEVICE_TYPES if torch.is_autocast_enabled(d))


def without_autocast(comp: Callable) -> Callable:
    """``comp`` run with autocast disabled: its trace already holds autocast's casts."""
    def run(*args):
        with contextlib.ExitStack() as stack:
            for dev in _DEVICE_TYPES:
                if torch.is_autocast_enabled(dev):
                    stack.enter_context(torch.autocast(dev, enabled=False))
            return comp(*args)
    return run
