"""Prims: the closed set of operations with no decomposition. Every executor
must be able to run a program of prims (the torch executor runs them all, see
executors/torchex.py; ``executors.run_trace`` runs a hand-built trace).

Prims are strict where torch is lenient, so that the torch language (which
decomposes into them) makes every promotion and broadcast explicit in the trace:

- elementwise prims take tensors of one shape and one dtype and produce that
  dtype (comparisons produce bool, ``abs/real/imag`` the real dtype). Python
  numbers are allowed but must not be of a higher category than the tensors
  (no float scalar with an int tensor), so torch computes in exactly the dtype
  the meta function announces. Transcendental ops (``sin``, ``exp``, ``div``,
  ...) need a float or complex dtype: ``div`` is true division; integer floor
  division is ``floor_divide`` and truncation is the language's business.
- dims may be negative (torch style); shapes are tuples of ints.
- reductions take an explicit tuple of dims, never "all" by omission, and
  never keep dims (the language reshapes); ``dims=()`` reduces nothing.

Views. Prims are functional in the IR, but the torch executor runs each prim
as an ATen op (``reshape``, ``permute``, ``expand`` for ``broadcast_in_dim``,
``slice``, ``squeeze``, ``real``/``imag``/``conj``; ``_to_copy``, always fresh,
for ``convert_element_type`` and ``device_put``...), so at run time a result may share storage with
an input exactly where that op's would. Each prim names that op
(``make_prim(..., aten=...)``, default: its own name) and core/aliasing.py
reads the aliasing from the op's schema annotations (``Tensor(a)``).

Random numbers (``uniform``, ``normal``, ``bernoulli``, ``randint``). They draw
from torch's generator implicitly: the generator of the output's device, or an
explicit ``generator=`` argument (printed as a constant). Their state is not a
trace value, so each random prim is tagged ``Tag.RANDOM`` and ``Tag.DONT_DCE``:
DCE/CSE never drop or merge them, and fusion/reordering keeps random symbols in
trace order. Reproducibility follows from that: the torch executor runs each
prim as the same torch kernel eager PyTorch uses (``uniform_``, ``normal_``,
``bernoulli_``, ``random_`` on a fresh tensor), in program order, so after
``torch.manual_seed(s)`` a jitted function draws exactly what eager draws.
A fusion executor that cannot reproduce torch's stream must not claim them.

Writing memory: ``copy_(src, dst)`` is the only prim that writes into an
existing tensor; it returns a new proxy naming the updated ``dst``.

Adding a prim: one ``make_prim`` call with its meta function, here; its
implementation in executors/torchex.py (a test checks every prim has one); its
VJP rule in transforms/autodiff/rules.py.
"""
from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence

import torch

from thunderlite.core import devices, dtypes
from thunderlite.core.proxies import DataDependentError, NumberProxy, TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.symint import SymInt, is_int, sym_max
from thunderlite.core.tags import Tag

_registry: dict[str, Symbol] = {}


_aten_of: dict[Callable, str] = {}      # prim meta -> the ATen op whose alias contract it has


def make_prim(name: str, meta: Callable, tags=(), aten: str | None = None) -> Symbol:
    """``aten``: the ATen op (``torch.ops.aten.<aten>``, default ``name``) whose
    schema states the prim's aliasing: the torch executor runs the prim as that
    op (or one with the same contract), and core/aliasing.py reads the schema."""
    if name in _registry:
        raise ValueError(f"prim {name!r} is defined twice")
    sym = Symbol(name, meta=meta, module="prims", tags={Tag.PRIM, *tags})
    _registry[name] = sym
    _aten_of[meta] = aten or name
    return sym


def aten_op_of(sym: Symbol) -> str | None:
    """The ATen op a prim (or an executor's symbol sharing its meta) follows."""
    return _aten_of.get(sym.meta) if sym.meta is not None else None


def all_prims() -> dict[str, Symbol]:
    return dict(_registry)


def check(cond: bool, msg: Callable[[], str], exc=RuntimeError) -> None:
    """Raise lazily-built errors: the message costs nothing when cond holds."""
    if not cond:
        raise exc(msg())


# --- shared helpers -------------------------------------------------------------------

def _grad(*tensors, dtype: torch.dtype | None = None) -> bool:
    """Whether an output of ``dtype`` computed from ``tensors`` requires grad."""
    if dtype is not None and not dtypes.is_inexact(dtype):
        return False
    return builtins.any(isinstance(t, TensorProxy) and t.requires_grad for t in tensors)


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """The broadcast of ``shapes`` (``torch.broadcast_shapes`` imports torch's
    symbolic-shape machinery, and sympy with it: seconds on a first trace)."""
    ndim = builtins.max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        for i, d in enumerate(s, start=ndim - len(s)):
            o = out[i]
            if d is o or (type(d) is int and d == 1):
                continue
            if type(o) is int and o == 1:       # asked first: a run-time size is never asked "== 1?"
                out[i] = d
                continue
            if _same_size(o, d, i) or d == 1:
                continue
            check(o == 1, lambda: f"The size of tensor a ({o}) must match the size of tensor b ({d}) "
                                  f"at non-singleton dimension {i}")
            out[i] = d
    return tuple(out)


def _same_size(a, b, dim: int) -> bool:
    """``a == b`` for broadcasting. Sizes known only at run time (``u0`` of
    nonzero) broadcast against 1 or themselves; against anything else whether
    one is 1 would decide the result's shape, so that is a clear error."""
    try:
        return a == b
    except DataDependentError as e:
        err = DataDependentError(f"broadcasting sizes {a} and {b} at dim {dim} needs to know whether they are "
                                 f"equal or one is 1: {e}")
        err.unbacked = getattr(e, "unbacked", None)     # the sizes a split program reads (frontend/splits/)
        raise err from None


def _canon_dim(d: int, ndim: int, what: str) -> int:
    n = builtins.max(ndim, 1)
    check(isinstance(d, int) and -n <= d < n,
          lambda: f"{what}: dim {d} is out of range for a {ndim}-d tensor", IndexError)
    return d % n


def _canon_dims(dims: Sequence[int], ndim: int, what: str) -> tuple[int, ...]:
    out = tuple(_canon_dim(d, ndim, what) for d in dims)
    check(len(set(out)) == len(out), lambda: f"{what}: dims {tuple(dims)} repeat a dim")
    return out


def _check_tensor(a, what: str) -> None:
    check(isinstance(a, TensorProxy), lambda: f"{what} expects a tensor, got {type(a).__name__}", TypeError)


def _check_index(index, what: str) -> None:
    _check_tensor(index, what)
    check(index.dtype in (torch.int64, torch.int32),
          lambda: f"{what}: index must be an int64 or int32 tensor, got {index.dtype}", TypeError)


# --- elementwise --------------------------------------------------------------------

_PY_CATEGORY = {bool: 0, int: 1, float: 2, complex: 3, SymInt: 1}


def _dtype_category(dtype: torch.dtype) -> int:
    if dtype is torch.bool:
        return 0
    return 1 if dtypes.is_integer(dtype) else 2 if dtypes.is_float(dtype) else 3


def _number_category(x) -> int | None:
    pt = x.python_type if isinstance(x, NumberProxy) else type(x)
    return _PY_CATEGORY.get(pt)


def _elementwise_meta(out_dtype_fn, name: str, inexact_only: bool = False):
    def meta(*args):
        tensors = [a for a in args if isinstance(a, TensorProxy)]
        check(bool(tensors), lambda: f"prims.{name} needs at least one tensor argument")
        t0 = tensors[0]
        for t in tensors[1:]:
            check(t.shape == t0.shape, lambda: f"prims.{name}: operands differ in shape: {t0.shape} vs {t.shape}")
            check(t.dtype == t0.dtype, lambda: f"prims.{name}: operands differ in dtype: {t0.dtype} vs {t.dtype}")
        cat = _dtype_category(t0.dtype)
        for a in args:
            if not isinstance(a, TensorProxy):
                c = _number_category(a)
                check(c is not None and c <= cat,
                      lambda: f"prims.{name}: the scalar {a!r} would promote a {t0.dtype} tensor; "
                              "convert explicitly first", TypeError)
        check(not inexact_only or dtypes.is_inexact(t0.dtype),
              lambda: f"prims.{name} needs a float or complex tensor, got {t0.dtype}; "
                      "convert_element_type first", TypeError)
        out_dtype = out_dtype_fn(t0.dtype)
        return TensorProxy(shape=t0.shape, dtype=out_dtype, device=t0.device,
                           requires_grad=_grad(*tensors, dtype=out_dtype))
    return meta


UNARY = ["neg", "abs", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt",
         "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
         "atanh", "erf", "erfc", "erfinv", "lgamma", "digamma", "sigmoid", "floor", "ceil",
         "round", "trunc", "sign", "signbit", "reciprocal", "bitwise_not", "logical_not",
         "isfinite", "isnan", "isinf", "real", "imag", "conj"]
BINARY = ["add", "sub", "mul", "div", "floor_divide", "remainder", "fmod", "pow", "atan2",
          "maximum", "minimum", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
          "bitwise_right_shift", "eq", "ne", "lt", "le", "gt", "ge", "copysign", "nextafter",
          "hypot", "logical_and", "logical_or", "logical_xor", "zeta", "polygamma"]
TERNARY = ["lerp"]
_BOOL_OUT = {"eq", "ne", "lt", "le", "gt", "ge", "isfinite", "isnan", "isinf", "signbit",
             "logical_not", "logical_and", "logical_or", "logical_xor"}
_REAL_OUT = {"abs", "real", "imag"}
_INEXACT_ONLY = {"exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "sin",
                 "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
                 "atanh", "erf", "erfc", "erfinv", "lgamma", "digamma", "sigmoid", "reciprocal",
                 "div", "atan2", "copysign", "nextafter", "hypot", "zeta", "polygamma", "lerp"}


def _out_dtype_fn(name: str):
    if name in _BOOL_OUT:
        return lambda d: torch.bool
    if name in _REAL_OUT:
        return dtypes.to_real
    return lambda d: d


_ATEN_NAME = {"zeta": "special_zeta"}
_g = globals()
for _name in UNARY + BINARY + TERNARY:
    _g[_name] = make_prim(_name, _elementwise_meta(_out_dtype_fn(_name), _name, _name in _INEXACT_ONLY),
                         aten=_ATEN_NAME.get(_name))
"""``polygamma(n, a)`` takes the int order first, as torch.polygamma does."""


def _where_meta(pred, a, b):
    shapes = [x.shape for x in (pred, a, b) if isinstance(x, TensorProxy)]
    check(all(s == shapes[0] for s in shapes), lambda: f"where operands differ in shape: {shapes}")
    check(isinstance(pred, TensorProxy) and pred.dtype is torch.bool, lambda: "where needs a bool tensor predicate")
    vals = [x for x in (a, b) if isinstance(x, TensorProxy)]
    check(len({v.dtype for v in vals}) <= 1, lambda: f"where operands differ in dtype: {[v.dtype for v in vals]}")
    # torch.where promotes a tensor with a scalar of a higher category (int tensor, 1.0 -> float)
    dtype = dtypes.result_type(a, b)
    return TensorProxy(shape=pred.shape, dtype=dtype, device=pred.device,
                       requires_grad=_grad(*vals, dtype=dtype))


where = make_prim("where", _where_meta)
"""``where(pred, a, b)``: tensors of one shape and dtype; a Python scalar promotes
as in torch.where (the result dtype is ``result_type(a, b)``)."""


def _convert_element_type_meta(a, dtype: torch.dtype):
    if not isinstance(a, TensorProxy):
        return NumberProxy(None, dtypes.python_type_of(dtype))
    return a.replace(dtype=dtype, requires_grad=a.requires_grad and dtypes.is_inexact(dtype))


convert_element_type = make_prim("convert_element_type", _convert_element_type_meta, aten="_to_copy")


def _device_put_meta(a, device):
    _check_tensor(a, "device_put")
    return a.replace(device=devices.to_device(device))


device_put = make_prim("device_put", _device_put_meta, aten="_to_copy")
"""``device_put(a, device)``: ``a`` on ``device`` (a copy unless already there)."""


# --- shapes -----------------------------------------------------------------------------

def _broadcast_in_dim_meta(a, shape, broadcast_dims):
    shape = tuple(shape)
    check(len(broadcast_dims) == a.ndim,
          lambda: f"broadcast_in_dim: {len(broadcast_dims)} dims for a {a.ndim}-d tensor")
    check(list(broadcast_dims) == sorted(set(broadcast_dims)),
          lambda: f"broadcast_in_dim: broadcast_dims {broadcast_dims} must be increasing")
    for d, s in zip(broadcast_dims, a.shape, strict=True):
        check(0 <= d < len(shape) and (s == 1 or s == shape[d]),
              lambda: f"broadcast_in_dim: cannot broadcast {a.shape} to {shape} along {broadcast_dims}")
    return a.replace(shape=shape)


broadcast_in_dim = make_prim("broadcast_in_dim", _broadcast_in_dim_meta, aten="expand")


def _reshape_meta(a, shape):
    shape = tuple(shape)
    n = 1
    for s in shape:
        check(is_int(s) and s >= 0, lambda: f"reshape: shape {shape} must be non-negative ints (no -1)")
        n *= s
    check(n == a.numel(), lambda: f"reshape: shape {shape} is invalid for input of size {a.numel()}")
    return a.replace(shape=shape)


reshape = make_prim("reshape", _reshape_meta)


def _permute_meta(a, perm):
    perm = _canon_dims(perm, a.ndim, "permute")
    check(len(perm) == a.ndim, lambda: f"permute: {tuple(perm)} is not a permutation of {a.ndim} dims")
    return a.replace(shape=tuple(a.shape[p] for p in perm))


permute = make_prim("permute", _permute_meta)


def _slice_meta(a, start_indices, end_indices, strides=None):
    strides = (1,) * a.ndim if strides is None else tuple(strides)
    check(len(start_indices) == len(end_indices) == len(strides) == a.ndim,
          lambda: f"slice_prim: need one start, end and stride per dim of a {a.ndim}-d tensor")
    shape = []
    for size, lo, hi, st in zip(a.shape, start_indices, end_indices, strides, strict=True):
        check(0 <= lo <= hi <= size and st >= 1,
              lambda: f"slice_prim: invalid slice {lo}:{hi}:{st} of a dim of size {size}", IndexError)
        shape.append((hi - lo + st - 1) // st)
    return a.replace(shape=tuple(shape))


slice_prim = make_prim("slice_prim", _slice_meta, aten="slice")
"""``slice_prim(a, start_indices, end_indices, strides=None)``: a strided view with
``0 <= start <= end <= size`` and ``stride >= 1`` per dim (canonical: the language
clamps and normalizes Python slices)."""


def _squeeze_meta(a, dims):
    dims = _canon_dims(dims, a.ndim, "squeeze")
    for d in dims:
        check(a.ndim > 0 and a.shape[d] == 1, lambda: f"squeeze: dim {d} of shape {a.shape} is not of size 1")
    return a.replace(shape=tuple(s for i, s in enumerate(a.shape) if i not in dims))


squeeze = make_prim("squeeze", _squeeze_meta)


def _flip_meta(a, dims):
    _canon_dims(dims, a.ndim, "flip")
    return a.replace()


flip = make_prim("flip", _flip_meta)


def _cat_meta(tensors, dim):
    check(len(tensors) > 0, lambda: "cat needs at least one tensor")
    t0 = tensors[0]
    d = _canon_dim(dim, t0.ndim, "cat")
    check(t0.ndim > 0, lambda: "cat: zero-dimensional tensors cannot be concatenated")
    total = 0
    for t in tensors:
        check(t.ndim == t0.ndim and t.dtype == t0.dtype and t.device == t0.device,
              lambda: f"cat: tensors differ in rank, dtype or device: {t0!r} vs {t!r}")
        check(all(s == s0 for i, (s, s0) in enumerate(zip(t.shape, t0.shape, strict=True)) if i != d),
              lambda: f"cat: shapes {t0.shape} and {t.shape} differ outside dim {d}")
        total += t.shape[d]
    shape = t0.shape[:d] + (total,) + t0.shape[d + 1:]
    return t0.replace(shape=shape, requires_grad=_grad(*tensors))


cat = make_prim("cat", _cat_meta)


def _pad_meta(a, padding_value, padding_config):
    check(len(padding_config) == a.ndim, lambda: f"pad: need one (lo, hi, interior) per dim of a {a.ndim}-d tensor")
    shape = []
    for size, (lo, hi, interior) in zip(a.shape, padding_config, strict=True):
        check(interior >= 0, lambda: f"pad: interior padding {interior} must be >= 0")
        n = size + lo + hi + sym_max(size - 1, 0) * interior
        check(n >= 0, lambda: f"pad: config {tuple(padding_config)} gives a negative size for {a.shape}")
        shape.append(n)
    return a.replace(shape=tuple(shape))


pad = make_prim("pad", _pad_meta, aten="constant_pad_nd")
"""``pad(a, padding_value, padding_config)``: per dim ``(lo, hi, interior)``;
``lo``/``hi`` may be negative (cropping), ``interior`` inserts that many
``padding_value`` elements between neighbours (XLA's pad)."""


# --- indexing -------------------------------------------------------------------------------

def _gather_meta(a, dim, index):
    _canon_dim(dim, a.ndim, "gather")
    if index.numel() == 0:        # eager accepts an empty index of any dtype and rank
        _check_tensor(index, "gather")
        return TensorProxy(shape=index.shape, dtype=a.dtype, device=a.device, requires_grad=_grad(a))
    _check_index(index, "gather")
    check(index.ndim == a.ndim or (a.ndim == 0 and index.ndim <= 1),
          lambda: f"gather: index rank {index.ndim} differs from input rank {a.ndim}")
    return TensorProxy(shape=index.shape, dtype=a.dtype, device=a.device, requires_grad=_grad(a))


gather = make_prim("gather", _gather_meta)


def _take_along_axis_meta(a, index, dim):
    _check_index(index, "take_along_axis")
    d = _canon_dim(dim, a.ndim, "take_along_axis")
    check(index.ndim == a.ndim
          and all(i == s for k, (i, s) in enumerate(zip(index.shape, a.shape, strict=True)) if k != d),
          lambda: f"take_along_axis: index shape {index.shape} must match {a.shape} outside dim {d}")
    return TensorProxy(shape=index.shape, dtype=a.dtype, device=a.device, requires_grad=_grad(a))


take_along_axis = make_prim("take_along_axis", _take_along_axis_meta, aten="take_along_dim")


def _index_select_meta(a, dim, index):
    _check_index(index, "index_select")
    d = _canon_dim(dim, a.ndim, "index_select")
    check(index.ndim <= 1, lambda: f"index_select: index must be 0- or 1-d, got {index.ndim}-d")
    shape = list(a.shape)
    if shape:
        shape[d] = index.numel()
    return a.replace(shape=tuple(shape))


index_select = make_prim("index_select", _index_select_meta)


def _scatter_like_meta(name: str):
    def meta(a, dim, index, src):
        _check_index(index, name)
        _canon_dim(dim, a.ndim, name)
        if isinstance(src, TensorProxy):
            check(src.dtype == a.dtype, lambda: f"{name}: src dtype {src.dtype} differs from {a.dtype}")
        check(index.ndim == a.ndim or a.ndim == 0, lambda: f"{name}: index rank {index.ndim} differs from {a.ndim}")
        return a.replace(requires_grad=_grad(a, src))
    return meta


scatter = make_prim("scatter", _scatter_like_meta("scatter"))
"""``scatter(a, dim, index, src)``: functional; ``src`` a tensor or a number."""
scatter_add = make_prim("scatter_add", _scatter_like_meta("scatter_add"))


def _index_add_meta(a, dim, index, source):
    _check_index(index, "index_add")
    _canon_dim(dim, a.ndim, "index_add")
    check(source.dtype == a.dtype, lambda: f"index_add: source dtype {source.dtype} differs from {a.dtype}")
    return a.replace(requires_grad=_grad(a, source))


index_add = make_prim("index_add", _index_add_meta)


def _index_put_meta(a, indices, values, accumulate):
    check(len(indices) <= a.ndim, lambda: f"index_put: {len(indices)} indices for a {a.ndim}-d tensor", IndexError)
    for i in indices:
        _check_tensor(i, "index_put")
        check(i.dtype in (torch.int64, torch.int32, torch.bool, torch.uint8),
              lambda: f"index_put: indices must be integer or bool tensors, got {i.dtype}", TypeError)
    check(values.dtype == a.dtype, lambda: f"index_put: values dtype {values.dtype} differs from {a.dtype}")
    return a.replace(requires_grad=_grad(a, values))


index_put = make_prim("index_put", _index_put_meta)
"""``index_put(a, indices, values, accumulate)``: functional (a new tensor)."""


# --- linear algebra ---------------------------------------------------------------------

def _matmul_shape(sa: tuple, sb: tuple) -> tuple:
    check(len(sa) >= 1 and len(sb) >= 1, lambda: "matmul: both arguments need at least 1 dim")
    a2 = (1,) + sa if len(sa) == 1 else sa
    b2 = sb + (1,) if len(sb) == 1 else sb
    check(a2[-1] == b2[-2], lambda: f"matmul: shapes {sa} and {sb} cannot be multiplied")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    shape = tuple(batch) + (a2[-2], b2[-1])
    if len(sb) == 1:
        shape = shape[:-1]
    if len(sa) == 1:
        shape = shape[:-2] + shape[-1:] if len(sb) > 1 else shape[:-1]
    return shape


def _matmul_meta(a, b):
    check(a.dtype == b.dtype, lambda: f"matmul: operands differ in dtype: {a.dtype} vs {b.dtype}")
    return a.replace(shape=_matmul_shape(a.shape, b.shape), requires_grad=_grad(a, b))


matmul = make_prim("matmul", _matmul_meta)
"""``matmul(a, b)``: torch.matmul semantics (1-d promotion, batch broadcasting)."""


def _expand_int(x, n: int) -> tuple:
    return tuple(x) * (n if len(x) == 1 else 1) if isinstance(x, (tuple, list)) else (x,) * n


def _convolution_meta(a, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    nsp = weight.ndim - 2
    check(nsp >= 1 and a.ndim == weight.ndim,
          lambda: f"convolution: input {a.shape} and weight {weight.shape} need matching batched ranks")
    check(a.dtype == weight.dtype and (bias is None or bias.dtype == a.dtype),
          lambda: "convolution: input, weight and bias differ in dtype")
    stride, padding, dilation = (_expand_int(x, nsp) for x in (stride, padding, dilation))
    output_padding = _expand_int(output_padding, nsp)
    k = weight.shape[2:]
    if transposed:
        check(a.shape[1] == weight.shape[0], lambda: f"convolution: {a.shape[1]} channels for weight {weight.shape}")
        c_out = weight.shape[1] * groups
        spatial = [(i - 1) * s - 2 * p + d * (kk - 1) + op + 1 for i, s, p, d, kk, op
                   in zip(a.shape[2:], stride, padding, dilation, k, output_padding, strict=True)]
    else:
        check(a.shape[1] == weight.shape[1] * groups,
              lambda: f"convolution: input has {a.shape[1]} channels, weight {weight.shape} with groups={groups}")
        c_out = weight.shape[0]
        spatial = [(i + 2 * p - d * (kk - 1) - 1) // s + 1 for i, s, p, d, kk
                   in zip(a.shape[2:], stride, padding, dilation, k, strict=True)]
    check(all(s > 0 for s in spatial), lambda: f"convolution: output size {spatial} is too small")
    return a.replace(shape=(a.shape[0], c_out, *spatial), requires_grad=_grad(a, weight, bias))


convolution = make_prim("convolution", _convolution_meta)
"""Arguments exactly as ``torch.convolution`` (batched input; int lists)."""


# --- reductions ---------------------------------------------------------------------------

def _reduction_meta(out_dtype_fn, name: str):
    def meta(a, dims, *, output_dtype=None):
        dims = _canon_dims(dims, a.ndim, name)
        shape = tuple(s for i, s in enumerate(a.shape) if i not in dims)
        dtype = output_dtype if output_dtype is not None else out_dtype_fn(a.dtype)
        return a.replace(shape=shape, dtype=dtype, requires_grad=a.requires_grad and dtypes.is_inexact(dtype))
    return meta


sum = make_prim("sum", _reduction_meta(lambda d: d, "sum"))
prod = make_prim("prod", _reduction_meta(lambda d: d, "prod"))
amax = make_prim("amax", _reduction_meta(lambda d: d, "amax"))
amin = make_prim("amin", _reduction_meta(lambda d: d, "amin"))


def _var_meta(a, dims, *, correction=1):
    check(dtypes.is_inexact(a.dtype), lambda: f"var needs a float or complex tensor, got {a.dtype}", TypeError)
    dims = _canon_dims(dims, a.ndim, "var")
    check(bool(dims) or a.ndim == 0, lambda: "var: dims must not be empty (pass every dim to reduce all)")
    shape = tuple(s for i, s in enumerate(a.shape) if i not in dims)
    return a.replace(shape=shape, dtype=dtypes.to_real(a.dtype))


var = make_prim("var", _var_meta)


def _var_mean_meta(a, dims, *, correction=1):
    v = _var_meta(a, dims, correction=correction)
    return v, v.replace(dtype=a.dtype)


var_mean = make_prim("var_mean", _var_mean_meta)


def _arg_reduction_meta(name: str):
    def meta(a, dim):
        check(a.dtype is not torch.bool, lambda: f"{name} does not support bool tensors; convert first", TypeError)
        if dim is None:
            return TensorProxy(shape=(), dtype=torch.int64, device=a.device)
        d = _canon_dim(dim, a.ndim, name)
        shape = tuple(s for i, s in enumerate(a.shape) if i != d)
        return TensorProxy(shape=shape, dtype=torch.int64, device=a.device)
    return meta


argmax = make_prim("argmax", _arg_reduction_meta("argmax"))
argmin = make_prim("argmin", _arg_reduction_meta("argmin"))


def _scan_meta(name: str):
    def meta(a, dim, *, dtype=None):
        _canon_dim(dim, a.ndim, name)
        promoted = torch.int64 if a.dtype is torch.bool or dtypes.is_integer(a.dtype) else a.dtype
        out = dtype if dtype is not None else promoted
        return a.replace(dtype=out, requires_grad=_grad(a, dtype=out))
    return meta


cumsum = make_prim("cumsum", _scan_meta("cumsum"))
"""``cumsum(a, dim, *, dtype=None)``: as torch.cumsum (bool/int inputs accumulate in int64)."""
cumprod = make_prim("cumprod", _scan_meta("cumprod"))


def _topk_meta(a, k, dim, largest, sorted):
    d = _canon_dim(dim, a.ndim, "topk")
    size = a.shape[d] if a.ndim else 1
    check(0 <= k <= size, lambda: f"topk: k={k} is out of range for a dim of size {size}", IndexError)
    shape = a.shape[:d] + (k,) + a.shape[d + 1:] if a.ndim else ()
    return a.replace(shape=shape), TensorProxy(shape=shape, dtype=torch.int64, device=a.device)


topk = make_prim("topk", _topk_meta)
"""``topk(a, k, dim, largest, sorted) -> (values, indices)``, as torch.topk."""


def _sort_meta(a, dim, descending, *, stable=False):
    _canon_dim(dim, a.ndim, "sort")
    return a.replace(), TensorProxy(shape=a.shape, dtype=torch.int64, device=a.device)


sort = make_prim("sort", _sort_meta)
"""``sort(a, dim, descending, *, stable=False) -> (values, indices)``."""


# --- creation -------------------------------------------------------------------------------

def _shape_of(shape) -> tuple:
    shape = tuple(shape)
    check(all(is_int(s) and s >= 0 for s in shape), lambda: f"shape {shape} must be non-negative ints")
    return shape


def _full_meta(shape, fill_value, *, device, dtype):
    return TensorProxy(shape=_shape_of(shape), dtype=dtype, device=devices.to_device(device))


full = make_prim("full", _full_meta)


def _empty_meta(shape, *, device, dtype):
    return TensorProxy(shape=_shape_of(shape), dtype=dtype, device=devices.to_device(device))


empty = make_prim("empty", _empty_meta)


def _iota_meta(length, *, start, step, device, dtype):
    check(is_int(length) and length >= 0, lambda: f"iota: length {length} must be a non-negative int")
    return TensorProxy(shape=(length,), dtype=dtype, device=devices.to_device(device))


iota = make_prim("iota", _iota_meta, aten="arange")
"""``iota(length, *, start, step, device, dtype)``: ``start + step * arange(length)``."""


def _clone_meta(a):
    _check_tensor(a, "clone")
    return a.replace()


clone = make_prim("clone", _clone_meta)
"""``clone(a)``: a copy in fresh memory (contiguous-or-preserved, as torch.clone)."""


# --- random (see the module docstring for how generator state flows) ----------------------

_RANDOM = {Tag.RANDOM, Tag.DONT_DCE}


def _random_meta(name: str, float_only: bool = True):
    def meta(shape, *params, device, dtype, generator=None):
        check(not float_only or dtypes.is_inexact(dtype), lambda: f"{name} draws floats, got {dtype}", TypeError)
        return TensorProxy(shape=_shape_of(shape), dtype=dtype, device=devices.to_device(device))
    return meta


uniform = make_prim("uniform", _random_meta("uniform"), tags=_RANDOM)
"""``uniform(shape, minval, maxval, *, device, dtype, generator=None)`` on [minval, maxval)."""
normal = make_prim("normal", _random_meta("normal"), tags=_RANDOM)
"""``normal(shape, mean, std, *, device, dtype, generator=None)``."""
randint = make_prim("randint", _random_meta("randint", float_only=False), tags=_RANDOM)
"""``randint(shape, low, high, *, device, dtype, generator=None)`` on [low, high)."""


def _bernoulli_meta(shape, p, *, device, dtype, generator=None):
    shape = _shape_of(shape)
    if isinstance(p, TensorProxy):
        check(p.shape == shape, lambda: f"bernoulli: probabilities of shape {p.shape} for shape {shape}")
    # eager's bernoulli(p) output requires grad when p does (its gradient is zero)
    rg = isinstance(p, TensorProxy) and p.requires_grad and dtypes.is_inexact(dtype)
    return TensorProxy(shape=shape, dtype=dtype, device=devices.to_device(device), requires_grad=rg)


bernoulli = make_prim("bernoulli", _bernoulli_meta, tags=_RANDOM)
"""``bernoulli(shape, p, *, device, dtype, generator=None)``: 1 with probability
``p`` (a number, or a tensor of ``shape``), else 0."""


# --- memory and scalars -------------------------------------------------------------------

def _copy_meta(src, dst):
    check(isinstance(dst, TensorProxy), lambda: "copy_ writes into a tensor")
    return dst.replace()


copy_ = make_prim("copy_", _copy_meta, tags={Tag.INPLACE})
"""``copy_(src, dst)`` writes ``src`` (broadcast and cast to dst's shape and dtype)
into ``dst`` and returns the result: the one way a trace writes into memory."""


def _item_meta(a):
    _check_tensor(a, "item")
    check(a.numel() == 1, lambda: f"item: a tensor with {a.numel()} elements cannot be converted to a number")
    return NumberProxy(None, dtypes.python_type_of(a.dtype))


item = make_prim("item", _item_meta, tags={Tag.UNBACKED})
"""``item(a)``: the Python number in a one-element tensor (a device sync)."""
