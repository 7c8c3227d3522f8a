"""The torch executor: the executable spec of the prims (CONTRIBUTING.md, style 11), always
last in the executor list.

- Every prim has an implementation here (a test checks it). Where a torch
  function has the prim's exact signature it is bound directly, so the final
  trace calls torch with no wrapper frame (``t0 = torch.mul(a, b)``); the rest
  are small functions printed as ``torchex.<prim>``.
- Every torch-language symbol with a ``torch_fn`` (including opaque ops) runs as
  that single torch call with the bound symbol's own args and kwargs: the
  torch-language symbols mirror torch signatures, so this mapping is generic and
  made at claim time; an explicit ``register_implementation`` overrides it.
"""
from __future__ import annotations

import functools
import inspect
import types
from operator import itemgetter

import torch

from thunderlite.core import dtypes, prims
from thunderlite.core.aliasing import aten_name
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.tracectx import made_once
from thunderlite.executors.base import OperatorExecutor, torch_path


class TorchExecutor(OperatorExecutor):
    """Explicit implementations first, then the generic ``sym.torch_fn`` mapping."""

    def __init__(self):
        super().__init__("torch")
        self.print_module = "torchex"
        self._generic: dict[Symbol, Symbol] = {}

    def differentiation(self, bsym: BoundSymbol):
        """None: torch's implementations are the reference; autodiff's own rules
        and decompositions differentiate what it runs."""
        return None

    def claim(self, bsym: BoundSymbol) -> BoundSymbol | None:
        claimed = super().claim(bsym)
        if claimed is not None:
            return claimed
        sym = bsym.sym
        if sym.torch_fn is None or sym.executor is not None:
            return None
        exsym = made_once(self._generic, sym, lambda: self.executor_symbol(sym, _generic_impl(sym.torch_fn)))
        return bsym.replace(sym=exsym)


def _generic_impl(fn):
    """What a torch-language symbol mirroring ``fn`` runs as: ``fn``; an ATen
    op's C function; or, for a Python wrapper of torch's whose calls have a
    direct form (``_WRAPPER_SOURCE``), ``fn`` carrying that form."""
    source = _WRAPPER_SOURCE.get(fn) if type(fn) is types.FunctionType else None     # torch_fn may be unhashable
    if source is None:
        return aten_callable(fn)

    path = torch_path(fn)

    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    def direct_source(bsym, r):         # without a direct form: the wrapper's own call, as before
        text = source(bsym, r)
        if text is not None or path is None:
            return text
        return f"{path}({', '.join([*map(r, bsym.args), *(f'{k}={r(v)}' for k, v in bsym.kwargs.items())])})"
    call.__name__ = call.__qualname__ = fn.__name__
    call.__wrapped__ = fn
    call.direct_source = direct_source
    return call


def aten_callable(fn):
    """``fn``, or for an ATen op (``torch.ops.aten.x``, ``.default``) the C
    function its Python ``__call__`` forwards to: the same call without that
    frame (ops with TorchBind overloads keep their Python dispatch)."""
    if isinstance(fn, torch._ops.OpOverloadPacket) and not fn._has_torchbind_op_overload:
        return fn._op
    if isinstance(fn, torch._ops.OpOverload) and type(fn) is torch._ops.OpOverload:
        return fn._op
    return fn


torch_executor = TorchExecutor()
ex = torch_executor

# --- elementwise: torch functions with the prims' signatures -----------------------------

# Whether an implementation here may return a view is the prim's declared ATen op's
# schema (prims.make_prim(aten=...)); test_prims checks every implementation keeps to it.
def _register(name: str, impl) -> None:
    ex.register_implementation(getattr(prims, name), impl)


_TORCH_NAME = {"zeta": torch.special.zeta}
for _name in prims.UNARY + prims.BINARY + prims.TERNARY:
    _register(_name, _TORCH_NAME.get(_name) or getattr(torch, _name))

_DIRECT = {
    "where": torch.where, "reshape": torch.reshape, "permute": torch.permute, "squeeze": torch.squeeze,
    "flip": torch.flip, "cat": torch.cat, "gather": torch.gather, "take_along_axis": torch.take_along_dim,
    "index_select": torch.index_select, "scatter": torch.scatter, "scatter_add": torch.scatter_add,
    "index_add": torch.index_add, "index_put": torch.index_put, "matmul": torch.matmul,
    "convolution": torch.convolution, "var": torch.var, "var_mean": torch.var_mean,
    "argmax": torch.argmax, "argmin": torch.argmin, "cumsum": torch.cumsum, "cumprod": torch.cumprod,
    "topk": torch.topk, "full": torch.full, "empty": torch.empty,
    "clone": torch.clone, "item": torch.Tensor.item,
}
for _name, _fn in _DIRECT.items():
    _register(_name, _fn)


# --- prims whose torch spelling differs: one small function each ----------------------

def convert_element_type(a, dtype):
    if isinstance(a, torch.Tensor):
        return a.to(dtype, copy=True)         # fresh, as aten::_to_copy (prims.py), even for the same dtype
    return dtypes.python_type_of(dtype)(a)


def device_put(a, device):
    return a.to(device, copy=True)


def broadcast_in_dim(a, shape, broadcast_dims):
    if a.ndim and broadcast_dims[0] == len(shape) - a.ndim and broadcast_dims[-1] == len(shape) - 1:
        return a.expand(shape)            # trailing-aligned: what torch broadcasting does
    view = [1] * len(shape)
    for d, s in zip(broadcast_dims, a.shape, strict=True):
        view[d] = s
    return a.reshape(view).expand(shape)


def slice_prim(a, start_indices, end_indices, strides=None):
    # map over the builtin ``slice``: no Python frame per dim (a hot prim of rotary embeddings)
    if strides is None:
        return a[tuple(map(slice, start_indices, end_indices))]
    return a[tuple(map(slice, start_indices, end_indices, strides))]


def pad(a, padding_value, padding_config):
    if not any(map(itemgetter(2), padding_config)):      # no interior padding: ATen's constant_pad_nd
        flat = [p for lo, hi, _ in reversed(padding_config) for p in (lo, hi)]
        return torch.constant_pad_nd(a, flat, padding_value)
    grown = [size + max(lo, 0) + max(hi, 0) + max(size - 1, 0) * interior
             for size, (lo, hi, interior) in zip(a.shape, padding_config, strict=True)]
    out = torch.full(grown, padding_value, dtype=a.dtype, device=a.device)
    place = tuple(slice(max(lo, 0), max(lo, 0) + max(size - 1, 0) * (interior + 1) + 1, interior + 1)
                  for size, (lo, _, interior) in zip(a.shape, padding_config, strict=True))
    out[place] = a
    crop = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi, _) in zip(grown, padding_config, strict=True))
    return out[crop]


def _no_reduction(a, output_dtype):
    """``dims=()`` reduces nothing (torch would reduce every dim)."""
    return a.clone() if output_dtype in (None, a.dtype) else a.to(output_dtype)   # fresh, as aten::sum


def sum(a, dims, *, output_dtype=None):
    if not dims:
        return _no_reduction(a, output_dtype)
    return torch.sum(a, dims, dtype=output_dtype or a.dtype)    # torch would widen integers to int64


def prod(a, dims, *, output_dtype=None):
    if not dims:
        return _no_reduction(a, output_dtype)
    if len(dims) == a.ndim:
        return torch.prod(a, dtype=output_dtype or a.dtype)
    for d in sorted((d % a.ndim for d in dims), reverse=True):  # torch.prod takes one dim at a time
        a = torch.prod(a, d, dtype=output_dtype or a.dtype)
    return a


def amax(a, dims, *, output_dtype=None):
    out = torch.amax(a, dims) if dims else a.clone()
    return out if output_dtype is None else out.to(output_dtype)


def amin(a, dims, *, output_dtype=None):
    out = torch.amin(a, dims) if dims else a.clone()
    return out if output_dtype is None else out.to(output_dtype)


def iota(length, *, start, step, device, dtype):
    if isinstance(start, int) and isinstance(step, int) and not dtype.is_complex:
        return torch.arange(start, start + step * length, step, device=device, dtype=dtype)
    base = torch.arange(length, device=device, dtype=dtype if not dtype.is_complex else torch.float64)
    return (base * step + start).to(dtype)         # arange has no complex kernel


def uniform(shape, minval, maxval, *, device, dtype, generator=None):
    return torch.empty(shape, device=device, dtype=dtype).uniform_(minval, maxval, generator=generator)


def normal(shape, mean, std, *, device, dtype, generator=None):
    return torch.empty(shape, device=device, dtype=dtype).normal_(mean, std, generator=generator)


def randint(shape, low, high, *, device, dtype, generator=None):
    return torch.empty(shape, device=device, dtype=dtype).random_(low, high, generator=generator)


def bernoulli(shape, p, *, device, dtype, generator=None):
    return torch.empty(shape, device=device, dtype=dtype).bernoulli_(p, generator=generator)


def sort(a, dim, descending, *, stable=False):
    return torch.sort(a, dim=dim, descending=descending, stable=stable)   # stable= makes dim keyword-only


def copy_(src, dst):
    return dst.copy_(src)


# --- the same prims printed as the torch calls they make (core/codegen.py: direct_source) --------
# A call of one of the functions above costs a Python frame per symbol; printed as its torch
# calls it costs none (broadcasts, slices, pads and sums are a fifth of a Llama step's symbols).

def _broadcast_source(bsym, r) -> str | None:
    args, kwargs = bsym.args, bsym.kwargs
    a, shape, dims = args
    if kwargs or not isinstance(a, TensorProxy):
        return None
    n = len(shape)
    if tuple(dims) == tuple(range(n - a.ndim, n)):      # trailing-aligned (or same rank): a plain expand
        return f"torch.Tensor.expand({r(a)}, {r(tuple(shape))})"
    view = [1] * n
    for d, size in zip(dims, a.shape, strict=True):
        view[d] = size
    return f"torch.Tensor.expand(torch.reshape({r(a)}, {r(tuple(view))}), {r(tuple(shape))})"


def _is(x, value: int) -> bool:
    return type(x) is int and x == value


def _slice_source(bsym, r) -> str | None:
    args, kwargs = bsym.args, bsym.kwargs
    a, start, end = args[:3]
    strides = args[3] if len(args) > 3 else kwargs.get("strides")
    if set(kwargs) - {"strides"} or not isinstance(a, TensorProxy):
        return None
    parts = []
    for size, lo, hi, step in zip(a.shape, start, end, strides or [1] * len(start), strict=True):
        tail = "" if _is(step, 1) else f":{r(step)}"
        if not tail and _is(lo, 0) and type(size) is int and _is(hi, size):
            parts.append(":")
        else:
            parts.append(f"{r(lo)}:{r(hi)}{tail}")
    return f"{r(a)}[{', '.join(parts) if parts else '()'}]"


def _pad_source(bsym, r) -> str | None:
    args, kwargs = bsym.args, bsym.kwargs
    a, value, config = args
    if kwargs or not all(_is(interior, 0) for _, _, interior in config):
        return None
    flat = [p for lo, hi, _ in reversed(config) for p in (lo, hi)]
    return f"torch.constant_pad_nd({r(a)}, {r(flat)}, {r(value)})"


def _sum_source(bsym, r) -> str | None:
    args, kwargs = bsym.args, bsym.kwargs
    a, dims = args
    if not dims or set(kwargs) - {"output_dtype"} or not isinstance(a, TensorProxy):
        return None
    return f"torch.sum({r(a)}, {r(tuple(dims))}, dtype={r(kwargs.get('output_dtype') or a.dtype)})"


def _bound(bsym) -> dict:
    """The call's arguments by the mirrored torch function's parameter names."""
    bound = inspect.signature(bsym.sym.impl).bind(*bsym.args, **bsym.kwargs)     # follows __wrapped__
    bound.apply_defaults()
    return bound.arguments


def _silu_source(bsym, r) -> str | None:
    a = _bound(bsym)
    return None if a["inplace"] else f"torch._C._nn.silu({r(a['input'])})"


def _embedding_source(bsym, r) -> str | None:
    a = _bound(bsym)
    weight, padding_idx = a["weight"], a["padding_idx"]
    if a["max_norm"] is not None or not isinstance(weight, TensorProxy) or type(weight.shape[0]) is not int:
        return None
    if padding_idx is None:
        padding_idx = -1
    elif type(padding_idx) is not int or not -weight.shape[0] <= padding_idx < weight.shape[0]:
        return None                 # F.embedding's own check raises
    elif padding_idx < 0:
        padding_idx += weight.shape[0]
    return (f"torch.embedding({r(weight)}, {r(a['input'])}, {padding_idx}, {r(a['scale_grad_by_freq'])}, "
            f"{r(a['sparse'])})")


def _pad_call_source(bsym, r) -> str | None:
    a = _bound(bsym)
    if a["mode"] != "constant":       # other modes may take F.pad's Python paths
        return None
    return f"torch._C._nn.pad({r(a['input'])}, {r(a['pad'])}, 'constant', {r(a['value'])})"


def _split_source(bsym, r) -> str | None:
    a = _bound(bsym)
    t, dim, outs = a["tensor"], a["dim"], bsym.output
    if not isinstance(t, TensorProxy) or type(dim) is not int or not isinstance(outs, (tuple, list)):
        return None
    sizes = [o.shape[dim] if isinstance(o, TensorProxy) else None for o in outs]
    if not all(type(n) is int for n in sizes):
        return None
    return f"torch.split_with_sizes({r(t)}, {r(sizes)}, {dim})"


_WRAPPER_SOURCE = {torch.nn.functional.silu: _silu_source, torch.nn.functional.embedding: _embedding_source,
                   torch.nn.functional.pad: _pad_call_source, torch.split: _split_source}

broadcast_in_dim.direct_source = _broadcast_source
slice_prim.direct_source = _slice_source
pad.direct_source = _pad_source
sum.direct_source = _sum_source

for _fn in (convert_element_type, device_put, broadcast_in_dim, slice_prim, pad, sum, prod, amax, amin,
            iota, uniform, normal, randint, bernoulli, sort, copy_):
    _register(_fn.__name__, _fn)


# --- out=: where an elementwise result may be written into a dying input ------------------

_NO_OUT = ("isfinite", "isnan", "isinf", "real", "imag", "conj")     # no out= (real/imag/conj are views)
_IMPLEMENTED = {i.of: i.symbol for i in ex.implementations()}
_WRITES_OUT = frozenset(_IMPLEMENTED[getattr(prims, n)] for n in prims.UNARY + prims.BINARY + prims.TERNARY
                        if n not in _NO_OUT)
_WHERE = _IMPLEMENTED[prims.where]


def writes_out(bsym: BoundSymbol) -> bool:
    """Whether ``bsym`` runs as a torch elementwise function (or ATen
    elementwise kernel) taking ``out=``, so that ``out=`` one of its inputs computes it in place
    (transforms/reuse_buffers.py). The out= overloads want a tensor first
    (``torch.remainder(2, t, out=o)`` has none) and ``where`` three tensors.
    A torch-language symbol this executor runs as its ``torch.<fn>`` counts
    when that function has an ATen ``out`` overload and the symbol decomposes
    into elementwise prims only, and broadcasts of its operands
    (``torch.add(t, 1)``, ``torch.sin(t)``, ``torch.div(t, s)`` of a 0-d ``s``)."""
    if bsym.sym is _WHERE:
        return all(type(a) is TensorProxy for a in bsym.args)
    fn = bsym.sym.torch_fn
    if getattr(fn, "takes_out", False):     # an elementwise ATen kernel (autodiff/kernels.py)
        devices = getattr(fn, "out_devices", None)     # where the kernel is known to run in place
        return bsym.sym.executor is ex and (devices is None or
                                            all(t.device.type in devices for t in bsym.tensor_args()))
    if not bsym.args or type(bsym.args[0]) is not TensorProxy:
        return False
    return bsym.sym in _WRITES_OUT or (bsym.sym.executor is ex and _elementwise_torch_call(bsym))


_OUT_PRIMS = frozenset(getattr(prims, n) for n in prims.UNARY + prims.BINARY + prims.TERNARY
                       if n not in _NO_OUT) | {prims.convert_element_type}


def _elementwise_torch_call(bsym: BoundSymbol) -> bool:
    fn = bsym.sym.torch_fn
    if not bsym.subsymbols or not getattr(fn, "__qualname__", "").startswith("_VariableFunctionsClass."):
        return False
    # a broadcast spreads an operand (AdamW's ``sqrt(v) / bias_correction``); ``out`` has the result's shape
    return (all(b.sym in _OUT_PRIMS or b.sym is prims.broadcast_in_dim for b in bsym.subsymbols)
            and any(b.sym in _OUT_PRIMS for b in bsym.subsymbols) and _has_out_overload(fn))


@functools.cache
def _has_out_overload(fn) -> bool:
    name = aten_name(fn)
    if not name or not name.isidentifier():
        return False
    try:        # one dispatcher lookup, where listing the op's schemas costs up to tens of µs
        torch._C._dispatch_find_schema_or_throw(f"aten::{name}", "out")
    except RuntimeError:
        return False
    return True


# --- views folded into the torch calls that read them (transforms/fold_views.py) -----------
# A broadcast feeding only elementwise torch calls is what torch's own broadcasting does inside
# those calls: the expand (a Python call and a view per symbol) is dropped, and a reshape of a
# reshape reads the first one's input. The pass asks this executor which symbols are which.

_BROADCAST = _IMPLEMENTED[prims.broadcast_in_dim]
_RESHAPE = _IMPLEMENTED[prims.reshape]
_BROADCASTING_NAMES = frozenset(prims.BINARY + prims.TERNARY + ["where"])
_BROADCASTING = frozenset(_IMPLEMENTED[getattr(prims, n)] for n in _BROADCASTING_NAMES)


class ViewFolding:
    """What ``transforms/fold_views.py`` needs to know about this executor's symbols."""

    reshape_symbol = _RESHAPE
    view_symbols = frozenset({_BROADCAST, _RESHAPE})
    """A trace without these has nothing to fold (checked first: the pass costs a first call nothing then)."""

    @staticmethod
    def broadcast_of(bsym: BoundSymbol) -> tuple[TensorProxy, tuple] | None:
        """For a broadcast this executor runs as a view (``expand``): its
        input and the input's shape at the output's rank (1 in each new dim)."""
        if bsym.sym is not _BROADCAST or bsym.kwargs:
            return None
        a, shape, dims = bsym.args
        if type(a) is not TensorProxy:
            return None
        aligned = [1] * len(shape)
        for d, size in zip(dims, a.shape, strict=True):
            aligned[d] = size
        return a, tuple(aligned)

    @staticmethod
    def reshape_of(bsym: BoundSymbol) -> tuple[TensorProxy, tuple] | None:
        """For a reshape this executor runs as ``torch.reshape``: its input and shape."""
        if bsym.sym is not _RESHAPE or bsym.kwargs or type(bsym.args[0]) is not TensorProxy:
            return None
        return bsym.args[0], tuple(bsym.args[1])

    @staticmethod
    def broadcasts_operands(bsym: BoundSymbol) -> bool:
        """Whether ``bsym`` runs as a torch function that broadcasts all its
        tensor operands alike (a prim's ``torch.mul``, ``torch.where``, or a
        torch-language ``torch.mul`` of elementwise prims; not ``masked_fill``,
        whose first operand sets the shape)."""
        if bsym.sym in _BROADCASTING:
            return not bsym.subsymbols
        return (bsym.sym.executor is ex and aten_name(bsym.sym.torch_fn) in _BROADCASTING_NAMES
                and _elementwise_torch_call(bsym))


view_folding = ViewFolding()
