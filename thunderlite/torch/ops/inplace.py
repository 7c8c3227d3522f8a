"""In-place variants, generated: ``add_(a, b)`` is recorded as the functional
``add`` followed by ``prims.copy_(result, a)`` (docs/architecture.md §5), under a
composite tagged ``Tag.INPLACE`` with ``inplace_of`` the functional symbol.
Also ``fill_``/``zero_``/``copy_`` and ``out=``-free torch spellings
(``torch.relu_``...)."""
from __future__ import annotations

import inspect
import linecache

import torch
import torch.nn.functional as F

from thunderlite.core import prims
from thunderlite.core.prims import check
from thunderlite.core.proxies import method_table, register_method
from thunderlite.core.retrace import rebind
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.interpreter import current_source_location
from thunderlite.torch.opaque import opaque_symbol_for
from thunderlite.torch.ops import creation, elementwise, indexing, linalg, nn, reductions, shapes  # noqa: F401
from thunderlite.torch.registry import all_symbols, register_torch_callable, torchsymbol
from thunderlite.torch.utils import convert, expand_to, is_tensor

T = torch.Tensor
INPLACE = {Tag.INPLACE}


def write_into(a, result):
    """``copy_(result, a)`` after checking torch's in-place rules (same shape
    after broadcasting, a result dtype castable to ``a``'s)."""
    check(result.shape == a.shape or prims.broadcast_shapes(result.shape, a.shape) == a.shape,
          lambda: f"output with shape {list(a.shape)} doesn't match the broadcast shape {list(result.shape)}")
    check(torch.can_cast(result.dtype, a.dtype),
          lambda: f"result type {str(result.dtype).removeprefix('torch.').capitalize()} can't be cast to the "
                  f"desired output type {str(a.dtype).removeprefix('torch.').capitalize()}")
    return prims.copy_(convert(expand_to(result, a.shape), a.dtype), a)


def _make_inplace(functional: Symbol, name: str, torch_fns) -> Symbol:
    def decomposition(a, *args, **kwargs):
        return write_into(a, functional(a, *args, **kwargs))
    decomposition.__name__ = name
    return torchsymbol(*torch_fns, name=name, method_name=name, tags=INPLACE, inplace_of=functional)(decomposition)


_NAMES = [
    "add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "atan2",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "bitwise_not",
    "logical_and", "logical_or", "logical_xor", "logical_not", "eq", "ne", "lt", "le", "gt", "ge",
    "copysign", "nextafter", "hypot", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt",
    "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "erf", "erfc", "erfinv", "lgamma", "digamma", "sigmoid", "reciprocal", "neg", "abs", "sign", "floor",
    "ceil", "round", "trunc", "frac", "square", "clamp", "clamp_min", "clamp_max", "lerp", "addcmul",
    "addcdiv", "masked_fill", "where", "relu", "logit", "nan_to_num", "xlogy", "deg2rad", "rad2deg",
    "sinc", "float_power", "fmax", "fmin", "ldexp", "hardshrink", "addmm", "baddbmm", "addbmm", "addmv",
    "addr", "index_add", "index_copy", "index_put", "scatter", "scatter_add", "tril", "triu", "clip", "sgn",
    "heaviside",
    "negative", "absolute", "arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "fix",
    "multiply", "subtract", "divide", "arctan2", "not_equal", "greater", "less", "greater_equal",
    "less_equal", "mvlgamma", "cumsum", "cumprod", "t", "transpose", "squeeze", "unsqueeze",
    "swapaxes", "swapdims", "exponent",
]
_SHAPE_INPLACE = {"t", "transpose", "squeeze", "unsqueeze", "swapaxes", "swapdims"}


def _generate():
    from thunderlite.torch.registry import symbol_for
    made = {}
    for name in _NAMES:
        functional = symbol_for(getattr(T, name, None))
        method = getattr(T, name + "_", None)
        if functional is None or method is None or name in _SHAPE_INPLACE:
            continue
        fns = [method] + [f for f in (getattr(torch, name + "_", None),) if f is not None]
        made[name + "_"] = _make_inplace(functional, name + "_", fns)
    return made


globals().update(_generate())


@torchsymbol(T.polygamma_, name="polygamma_", method_name="polygamma_", tags=INPLACE,
             inplace_of=all_symbols()["polygamma"])
def polygamma_(a, n: int):
    # the method takes (self, n) while torch.polygamma takes (n, input)
    return write_into(a, all_symbols()["polygamma"](n, a))


@torchsymbol(T.fill_, torch.fill_, method_name="fill_", tags=INPLACE)
def fill_(a, value):
    v = convert(expand_to(value, a.shape), a.dtype) if is_tensor(value) else \
        prims.full(a.shape, value, device=a.device, dtype=a.dtype)
    return prims.copy_(v, a)


@torchsymbol(T.zero_, torch.zero_, method_name="zero_", tags=INPLACE)
def zero_(a):
    return prims.copy_(prims.full(a.shape, False if a.dtype is torch.bool else 0, device=a.device, dtype=a.dtype), a)


@torchsymbol(T.copy_, method_name="copy_", tags=INPLACE)
def copy_(a, src, non_blocking: bool = False):
    return prims.copy_(convert(expand_to(src, a.shape), a.dtype), a)


def _nn_inplace(name: str, functional: Symbol, torch_fns):
    def decomposition(input, *args, **kwargs):
        return write_into(input, functional(input, *args, **kwargs))
    decomposition.__name__ = name
    return torchsymbol(*torch_fns, name=name, tags=INPLACE, inplace_of=functional)(decomposition)


for _name, _fns in [("elu_", (F.elu_,)), ("leaky_relu_", (F.leaky_relu_,)), ("hardtanh_", (F.hardtanh_,)),
                    ("celu_", (F.celu_, torch.celu_)), ("selu_", (F.selu_, torch.selu_)),
                    ("threshold_", (F.threshold_, torch.threshold_))]:
    globals()[_name] = _nn_inplace(_name, all_symbols()[_name[:-1]], _fns)


for _name, _fns in [("relu6_", ()), ("silu_", ()), ("mish_", ()), ("hardsigmoid_", ()), ("hardswish_", ()),
                    ("dropout_", ())]:
    globals()[_name] = _nn_inplace(_name, all_symbols()[_name[:-1]], _fns)


class InplaceFlag:
    """A torch callable with an ``inplace`` flag (``F.relu(x, inplace=True)``)
    records the in-place symbol when the flag is set (the functional op then
    ``copy_``, tagged INPLACE, so update_aliases sees the write at top level)
    and the functional symbol otherwise. Stands in for a symbol in the table."""

    def __init__(self, torch_fn, functional: Symbol, inplace: Symbol):
        self.functional, self.inplace = functional, inplace
        self.position = list(inspect.signature(torch_fn).parameters).index("inplace")
        self.__name__ = functional.name

    def __call__(self, *args, **kwargs):
        if len(args) > self.position:
            flag, args = args[self.position], args[:self.position] + args[self.position + 1:]
        else:
            kwargs = dict(kwargs)
            flag = kwargs.pop("inplace", False)
        return (self.inplace if flag else self.functional)(*args, **kwargs)

    def __repr__(self):
        return f"<{self.functional.id} or {self.inplace.id} by inplace=>"


for _fn, _name in [(F.relu, "relu"), (F.relu6, "relu6"), (F.hardtanh, "hardtanh"), (F.leaky_relu, "leaky_relu"),
                   (F.elu, "elu"), (F.celu, "celu"), (F.selu, "selu"), (F.silu, "silu"), (F.mish, "mish"),
                   (F.hardsigmoid, "hardsigmoid"), (F.hardswish, "hardswish"), (F.threshold, "threshold"),
                   (F.dropout, "dropout")]:
    register_torch_callable(_fn, InplaceFlag(_fn, all_symbols()[_name], all_symbols()[_name + "_"]))


# Augmented assignment on a tensor writes in place (``a += b`` is ``a.add_(b)``);
# without these Python falls back to ``a = a + b`` and the write is lost.
_AUGMENTED = {"__iadd__": "add_", "__isub__": "sub_", "__imul__": "mul_", "__itruediv__": "div_",
              "__ifloordiv__": "floor_divide_", "__imod__": "remainder_", "__ipow__": "pow_",
              "__iand__": "bitwise_and_", "__ior__": "bitwise_or_", "__ixor__": "bitwise_xor_",
              "__ilshift__": "bitwise_left_shift_", "__irshift__": "bitwise_right_shift_"}
for _op, _name in _AUGMENTED.items():
    register_method(_op, all_symbols()[_name])


class MetadataMutation:
    """Shape-changing in-place ops (``x.t_()``, ``x.unsqueeze_(0)``, ``resize_``,
    ``as_strided_``, ``set_``) change the tensor *object's* size and strides. A
    trace names values, not objects: the op records its functional form (a view
    of the old value, or for a growing ``resize_`` a new tensor holding the old
    elements) and ``core.retrace.rebind`` makes the proxy the program holds
    stand for that value from then on; on an input, the jit replays the op on
    the caller's tensor after the call (docs/architecture.md §5). Stands in for
    a symbol in the table."""

    def __init__(self, name: str):
        self.__name__ = name

    def __call__(self, a, *args, **kwargs):
        if self.__name__ != "set_" and _is_noop(self.__name__, a, args, kwargs):
            return a                        # x.squeeze_() with no size-1 dim, resize_ to the same size...
        new = _FUNCTIONAL[self.__name__](a, *args, **kwargs)
        grew = new.numel() > a.numel() and self.__name__ in ("resize_", "resize_as_")
        if self.__name__ == "set_":             # the caller's tensor is set to the value it viewed
            args, kwargs = (new,), {}
        # tensors among the arguments as they are now (the objects may change value later)
        args, kwargs = _snapshot(args), {k: _snapshot(v) for k, v in kwargs.items()}
        rebind(a, new, (self.__name__, args, kwargs, torch.is_grad_enabled(), grew))
        return a

    def __repr__(self):
        return f"<metadata mutation {self.__name__}>"


def _snapshot(x):
    if is_tensor(x):
        return x.replace(name=x.name)
    return tuple(_snapshot(y) for y in x) if type(x) is tuple else x


def _where() -> str:
    loc = current_source_location()
    return f" (at {loc[0]}:{loc[1]}: {linecache.getline(loc[0], loc[1]).strip()})" if loc else ""


def _view(name: str):
    return lambda a, *args, **kwargs: getattr(a, name)(*args, **kwargs)   # a traced or an opaque view


def _resized(a, *size, memory_format=None):
    """``a.resize_(size)``'s value: eager's contiguous tensor over ``a``'s storage
    from its offset on; a view of it when the storage holds enough elements,
    else fresh memory holding them and a tail that is zero-filled (eager leaves
    it uninitialized)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    check(not (a.requires_grad and torch.is_grad_enabled()), lambda: "cannot resize variables that require grad")
    n = 1
    for s in size:
        n *= s
    if n <= a.numel():
        return a.as_strided(size, _contiguous_strides(size))
    return opaque_symbol_for(grown)(a, tuple(size))


def _contiguous_strides(size) -> tuple:
    strides, step = [], 1
    for s in reversed(size):
        strides.append(step)
        step *= max(s, 1)
    return tuple(reversed(strides))


def grown(a: torch.Tensor, size: tuple) -> torch.Tensor:
    """What a growing ``a.resize_(size)`` holds: ``a``'s storage from its offset
    on, then zeros (run as an opaque op: it reads the storage, not the elements)."""
    off = a.storage_offset()
    stored = a.untyped_storage().nbytes() // a.element_size() - off
    out = a.new_zeros(size)
    k = min(out.numel(), stored)
    out.view(-1)[:k] = a.as_strided((k,), (1,), off)
    return out


def _resized_as(a, other, memory_format=None):
    return _resized(a, tuple(other.shape))


def _set(a, source=None, storage_offset=None, size=None, stride=None):
    """``a.set_(source)``: ``a`` views ``source``'s elements (``set_()``: empty);
    with an offset, sizes and strides, a strided view of ``source``'s storage."""
    if source is None:
        return creation.empty(0, dtype=a.dtype, device=a.device)
    if not is_tensor(source):
        raise NotImplementedError(f"Tensor.set_ from a {type(source).__name__}{_where()} is not supported by "
                                  "thunderlite; set_ from a tensor")
    check(source.dtype == a.dtype, lambda: f"Could not set tensor of type {source.dtype} to a tensor of type "
          f"{a.dtype}", TypeError)
    if size is None:
        return method_table["view_as"](source, source)
    return source.as_strided(size, stride, storage_offset)


_FUNCTIONAL = {name + "_": _view(name) for name in _SHAPE_INPLACE}
_FUNCTIONAL.update({"as_strided_": _view("as_strided"), "resize_": _resized, "resize_as_": _resized_as,
                    "set_": _set})


def _is_noop(name: str, a, args, kwargs) -> bool:
    """Whether the op leaves a contiguous tensor's size and strides as they are
    (asked of PyTorch on a meta tensor)."""
    try:
        m = torch.empty(a.shape, dtype=a.dtype, device="meta")
        before = (m.shape, m.stride())
        margs = [torch.empty(x.shape, dtype=x.dtype, device="meta") if is_tensor(x) else x for x in args]
        getattr(m, name)(*margs, **kwargs)
    except Exception:  # noqa: BLE001 - arguments eager would refuse: the functional form raises eager's error
        return False
    return (m.shape, m.stride()) == before


for _name in sorted(_FUNCTIONAL):
    _mm = MetadataMutation(_name)
    register_torch_callable(getattr(T, _name), _mm)
    register_method(_name, _mm)
    if hasattr(torch, _name):                   # torch.as_strided_, torch.resize_as_
        register_torch_callable(getattr(torch, _name), _mm)


def assign_data(a, value) -> None:
    """``a.data = value``: ``a`` stands for ``value``'s elements from now on
    (``rebind``; the caller's tensor is given them after the call). On a tensor
    that requires grad, whose later uses eager still differentiates as ``a``,
    ``value``'s elements are written through ``a.data`` instead (autograd does
    not see the write; unlike eager, ``a`` keeps its own memory), and another
    shape, dtype or device is refused."""
    if not is_tensor(value):
        raise TypeError(f"assigned data must be a Tensor, not {type(value).__name__}")
    if not a.requires_grad:
        new = method_table["view_as"](value.detach(), value)
        rebind(a, new, ("data", (_snapshot(new),), {}, torch.is_grad_enabled(), False))
        return
    if (tuple(value.shape), value.dtype, value.device) != (tuple(a.shape), a.dtype, a.device):
        raise NotImplementedError(f"assigning .data of another shape, dtype or device to a tensor that requires "
                                  f"grad{_where()} is not supported by thunderlite")
    a.data.copy_(value)
