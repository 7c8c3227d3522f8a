"""Elementwise torch ops: unary math, binary arithmetic and comparisons,
where/clamp/lerp and friends, and casts. Every op promotes and broadcasts
explicitly (utils.elementwise) and bottoms out in elementwise prims."""
from __future__ import annotations

import math

import torch

from thunderlite.core import dtypes, prims
from thunderlite.core.prims import check
from thunderlite.core.proxies import register_method as _register_method
from thunderlite.torch.registry import torchsymbol
from thunderlite.torch.utils import (
    Promotion,
    broadcast,
    convert,
    elementwise,
    expand_to,
    is_number,
    is_tensor,
    known_equal,
    promote,
    tensor_of,
)

T = torch.Tensor
S = torch.special
_INT_TO_FLOAT = Promotion.INT_TO_FLOAT
_BOOL = Promotion.ALWAYS_BOOL


def _unary(name, prim, kind=Promotion.DEFAULT, torch_fns=(), aliases=(), methods=True, special=()):
    """Define ``torch.<name>`` (and ``Tensor.<name>``) as ``prim`` applied torch-style."""
    fns = [getattr(torch, name)] if hasattr(torch, name) else []
    fns += list(torch_fns) + [getattr(torch, a) for a in aliases] + [getattr(S, s) for s in special]
    meths = []
    if methods:
        meths = [m for m in (name, *aliases) if hasattr(T, m)]
        fns += [getattr(T, m) for m in meths]

    def decomposition(a):
        return elementwise(prim, a, kind=kind)
    decomposition.__name__ = name
    return torchsymbol(*fns, name=name, method_name=meths)(decomposition)


_g = globals()
for _n, _aliases, _special in [
        ("exp", (), ()), ("exp2", (), ("exp2",)), ("expm1", (), ("expm1",)), ("log", (), ()),
        ("log1p", (), ("log1p",)), ("log2", (), ()), ("log10", (), ()), ("sqrt", (), ()), ("rsqrt", (), ()),
        ("sin", (), ()), ("cos", (), ()), ("tan", (), ()), ("asin", ("arcsin",), ()), ("acos", ("arccos",), ()),
        ("atan", ("arctan",), ()), ("sinh", (), ()), ("cosh", (), ()), ("tanh", (), ()),
        ("asinh", ("arcsinh",), ()), ("acosh", ("arccosh",), ()), ("atanh", ("arctanh",), ()),
        ("erf", (), ("erf",)), ("erfc", (), ("erfc",)), ("erfinv", (), ("erfinv",)),
        ("lgamma", (), ("gammaln",)), ("digamma", (), ("digamma", "psi")), ("sigmoid", (), ("expit",)),
        ("reciprocal", (), ())]:
    _g[_n] = _unary(_n, getattr(prims, _n), _INT_TO_FLOAT, aliases=_aliases, special=_special)

for _n, _aliases in [("neg", ("negative",)), ("sign", ()), ("bitwise_not", ())]:
    _g[_n] = _unary(_n, getattr(prims, _n), aliases=_aliases)

# unary operators on proxies: ``-x`` and ``~mask`` (used by HF rotary embeddings and masks)
_register_method("__neg__", neg)
_register_method("__invert__", bitwise_not)

for _n in ("isfinite", "isnan", "isinf", "signbit", "logical_not"):
    _g[_n] = _unary(_n, getattr(prims, _n), _BOOL)


def _rounding(name, prim, aliases=()):
    fns = [getattr(torch, name), getattr(T, name)] + [getattr(torch, a) for a in aliases]
    fns += [getattr(T, a) for a in aliases]

    def decomposition(a):
        if not dtypes.is_inexact(a.dtype):
            return a
        return elementwise(prim, a)
    decomposition.__name__ = name
    return torchsymbol(*fns, name=name, method_name=[name, *aliases])(decomposition)


floor = _rounding("floor", prims.floor)
ceil = _rounding("ceil", prims.ceil)
trunc = _rounding("trunc", prims.trunc, aliases=("fix",))


@torchsymbol(torch.round, T.round, S.round, method_name="round")
def round(a, *, decimals: int = 0):
    if not dtypes.is_inexact(a.dtype):
        return a
    if decimals == 0:
        return elementwise(prims.round, a)
    scale = 10.0 ** decimals
    return div(elementwise(prims.round, mul(a, scale)), scale)


@torchsymbol(torch.abs, T.abs, torch.absolute, T.absolute, method_name=("abs", "absolute"), operators=("__abs__",))
def abs(a):
    if a.dtype is torch.bool:
        return a
    return elementwise(prims.abs, a, kind=Promotion.COMPLEX_TO_FLOAT)


@torchsymbol(torch.real, properties=("real",))
def real(a):
    if not dtypes.is_complex(a.dtype):
        return a
    return prims.real(a)


@torchsymbol(torch.imag, properties=("imag",))
def imag(a):
    check(dtypes.is_complex(a.dtype), lambda: "imag is not implemented for tensors with non-complex dtypes.")
    return prims.imag(a)


@torchsymbol(torch.positive, T.positive, method_name="positive", operators=("__pos__",))
def positive(a):
    check(a.dtype is not torch.bool, lambda: "The `+` operator, on a bool tensor is not supported.")
    return a


@torchsymbol(torch.square, T.square, method_name="square")
def square(a):
    return mul(a, a) if a.dtype is not torch.bool else convert(mul(a, a), torch.int64)


@torchsymbol(torch.frac, T.frac, method_name="frac")
def frac(a):
    return sub(a, trunc(a))


@torchsymbol(torch.deg2rad, T.deg2rad, method_name="deg2rad")
def deg2rad(a):
    return mul(elementwise(lambda x: x, a, kind=_INT_TO_FLOAT), math.pi / 180.0)


@torchsymbol(torch.rad2deg, T.rad2deg, method_name="rad2deg")
def rad2deg(a):
    return mul(elementwise(lambda x: x, a, kind=_INT_TO_FLOAT), 180.0 / math.pi)


@torchsymbol(torch.sgn, T.sgn, method_name="sgn")
def sgn(a):
    if not dtypes.is_complex(a.dtype):
        return sign(a)
    mag = abs(a)
    safe = where(eq(mag, 0), 1.0, mag)
    return where(eq(mag, 0), 0, div(a, safe))


@torchsymbol(torch.sinc, T.sinc, S.sinc, method_name="sinc")
def sinc(a):
    x = mul(elementwise(lambda v: v, a, kind=_INT_TO_FLOAT), math.pi)
    safe = where(eq(x, 0), 1.0, x)
    return where(eq(x, 0), 1.0, div(sin(safe), safe))


@torchsymbol(torch.logit, T.logit, S.logit, method_name="logit")
def logit(a, eps: float | None = None):
    a = elementwise(lambda v: v, a, kind=_INT_TO_FLOAT)
    if eps is not None:
        a = clamp(a, eps, 1.0 - eps)
    return log(div(a, rsub(a, 1)))


@torchsymbol(S.ndtr)
def ndtr(a):
    a = elementwise(lambda v: v, a, kind=_INT_TO_FLOAT)
    return mul(add(erf(mul(a, 1.0 / math.sqrt(2.0))), 1.0), 0.5)


@torchsymbol(S.entr)
def entr(a):
    a = elementwise(lambda v: v, a, kind=_INT_TO_FLOAT)
    val = neg(mul(a, log(where(gt(a, 0), a, 1.0))))
    return where(isnan(a), a, where(lt(a, 0), -math.inf, where(eq(a, 0), 0.0, val)))


@torchsymbol(torch.nan_to_num, T.nan_to_num, method_name="nan_to_num")
def nan_to_num(a, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None):
    if not dtypes.is_float(a.dtype):
        return a
    info = torch.finfo(a.dtype)
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    out = where(isnan(a), nan, a)
    out = where(logical_and(isinf(a), gt(a, 0)), posinf, out)
    return where(logical_and(isinf(a), lt(a, 0)), neginf, out)


@torchsymbol(torch.isreal, method_name="isreal")
def isreal(a):
    if not dtypes.is_complex(a.dtype):
        return tensor_of(True, a, torch.bool)
    return eq(imag(a), 0)


@torchsymbol(torch.isposinf, T.isposinf, method_name="isposinf")
def isposinf(a):
    return logical_and(isinf(a), gt(a, 0)) if dtypes.is_float(a.dtype) else elementwise(prims.isinf, a, kind=_BOOL)


@torchsymbol(torch.isneginf, T.isneginf, method_name="isneginf")
def isneginf(a):
    return logical_and(isinf(a), lt(a, 0)) if dtypes.is_float(a.dtype) else elementwise(prims.isinf, a, kind=_BOOL)


# --- binary ------------------------------------------------------------------------------

# torch refuses a Python number for these in the tensor slots, so prims get tensors.
_TENSOR_ONLY = {"maximum", "minimum", "atan2", "nextafter", "hypot", "logical_and", "logical_or",
                "logical_xor", "eq", "ne", "lt", "le", "gt", "ge", "polygamma", "zeta", "copysign"}


def _binary_prim(prim, a, b, kind=Promotion.DEFAULT):
    """``prim(a, b)`` torch-style; a leading Python number (which torch only
    sometimes accepts there) and numbers for tensor-only ops become tensors."""
    if is_number(a) and is_tensor(b) or (prim.name in _TENSOR_ONLY and (is_number(a) or is_number(b))):
        compute, result = promote((a, b), kind)
        a, b = broadcast(a, b)
        shape_like = a if is_tensor(a) else b
        a, b = (tensor_of(x, shape_like, compute) for x in (a, b))
        out = prim(a, b)
        return convert(out, result)
    return elementwise(prim, a, b, kind=kind)


def _binary(name, prim, kind=Promotion.DEFAULT, aliases=(), operators=(), special=(), methods=True):
    fns = [getattr(torch, n) for n in (name, *aliases) if hasattr(torch, n)]
    fns += [getattr(S, s) for s in special]
    meths = [m for m in (name, *aliases) if methods and hasattr(T, m)]
    fns += [getattr(T, m) for m in meths]

    def decomposition(a, b):
        return _binary_prim(prim, a, b, kind)
    decomposition.__name__ = name
    return torchsymbol(*fns, name=name, method_name=meths, operators=operators)(decomposition)


for _n, _kind, _aliases, _ops, _special in [
        ("atan2", _INT_TO_FLOAT, ("arctan2",), (), ()),
        ("maximum", Promotion.DEFAULT, (), (), ()), ("minimum", Promotion.DEFAULT, (), (), ()),
        ("fmod", Promotion.DEFAULT, (), (), ()),
        ("remainder", Promotion.DEFAULT, (), ("__mod__",), ()),
        ("bitwise_and", Promotion.DEFAULT, (), ("__and__",), ()),
        ("bitwise_or", Promotion.DEFAULT, (), ("__or__",), ()),
        ("bitwise_xor", Promotion.DEFAULT, (), ("__xor__",), ()),
        ("bitwise_left_shift", Promotion.DEFAULT, (), ("__lshift__",), ()),
        ("bitwise_right_shift", Promotion.DEFAULT, (), ("__rshift__",), ()),
        ("eq", _BOOL, (), ("__eq__",), ()), ("ne", _BOOL, ("not_equal",), ("__ne__",), ()),
        ("lt", _BOOL, ("less",), ("__lt__",), ()), ("le", _BOOL, ("less_equal",), ("__le__",), ()),
        ("gt", _BOOL, ("greater",), ("__gt__",), ()), ("ge", _BOOL, ("greater_equal",), ("__ge__",), ()),
        ("copysign", _INT_TO_FLOAT, (), (), ()), ("nextafter", Promotion.DEFAULT, (), (), ()),
        ("hypot", Promotion.DEFAULT, (), (), ()),
        ("logical_and", _BOOL, (), (), ()), ("logical_or", _BOOL, (), (), ()),
        ("logical_xor", _BOOL, (), (), ()),
        ("zeta", _INT_TO_FLOAT, (), (), ("zeta",))]:
    _g[_n] = _binary(_n, getattr(prims, _n), _kind, _aliases, _ops, _special, methods=_n != "zeta")


def _scaled(b, alpha):
    if alpha is None or (is_number(alpha) and known_equal(alpha, 1)):
        return b
    return b * alpha if is_number(b) else mul(b, alpha)       # x.sub(1, alpha=2): a number times a number


@torchsymbol(torch.add, T.add, method_name="add", operators=("__add__",))
def add(input, other, *, alpha=1):
    if is_tensor(input) and input.dtype is torch.bool and is_tensor(other) and other.dtype is torch.bool \
            and alpha == 1:
        return logical_or(input, other)
    return _binary_prim(prims.add, input, _scaled(other, alpha))


@torchsymbol(torch.sub, T.sub, torch.subtract, T.subtract, method_name=("sub", "subtract"),
             operators=("__sub__",))
def sub(input, other, *, alpha=1):
    return _binary_prim(prims.sub, input, _scaled(other, alpha))


@torchsymbol(torch.rsub)
def rsub(input, other, alpha=1):
    return sub(other, input, alpha=alpha)


@torchsymbol(torch.mul, T.mul, torch.multiply, T.multiply, method_name=("mul", "multiply"),
             operators=("__mul__",))
def mul(input, other):
    if is_tensor(input) and input.dtype is torch.bool and is_tensor(other) and other.dtype is torch.bool:
        return logical_and(input, other)
    return _binary_prim(prims.mul, input, other)


def _int_trunc_div(a, b):
    q = _binary_prim(prims.floor_divide, a, b)
    r = _binary_prim(prims.remainder, a, b)
    differ = ne(lt(a, 0), lt(b, 0))
    return where(logical_and(ne(r, 0), differ), add(q, 1), q)


@torchsymbol(torch.div, T.div, torch.divide, T.divide, method_name=("div", "divide"), operators=("__truediv__",))
def div(input, other, *, rounding_mode: str | None = None):
    if rounding_mode is None:
        return _binary_prim(prims.div, input, other, _INT_TO_FLOAT)
    if rounding_mode == "floor":
        return floor_divide(input, other)
    check(rounding_mode == "trunc", lambda: f"div expected rounding_mode to be one of None, 'trunc', or 'floor' "
                                            f"but found '{rounding_mode}'")
    if not dtypes.is_inexact(promote((input, other))[1]):
        return _int_trunc_div(input, other)
    return trunc(_binary_prim(prims.div, input, other))


@torchsymbol(torch.true_divide, T.true_divide, method_name="true_divide")
def true_divide(input, other):
    return div(input, other)


@torchsymbol(torch.floor_divide, T.floor_divide, method_name="floor_divide", operators=("__floordiv__",))
def floor_divide(input, other):
    return _binary_prim(prims.floor_divide, input, other)


@torchsymbol(torch.pow, T.pow, method_name="pow", operators=("__pow__",))
def pow(input, exponent):
    if is_number(exponent) and is_tensor(input) and known_equal(exponent, 2) and not isinstance(exponent, bool):
        return mul(input, input) if input.dtype is not torch.bool else _binary_prim(prims.pow, input, exponent)
    return _binary_prim(prims.pow, input, exponent)


def reflected(sym):
    """``other <op> self`` for a reflected operator: Python asks the right operand
    (``2 * x`` calls ``x.__rmul__(2)``) after the left one declined."""
    def op(self, other):
        return sym(other, self)
    op.__name__ = f"r{sym.name}"
    return op


def rtruediv(self, other):
    """``other / self`` as eager spells it: ``self.reciprocal() * other``
    (two roundings, not one division)."""
    return mul(_g["reciprocal"](self), other)


_register_method("__rtruediv__", rtruediv)
for _op, _sym in [("__radd__", add), ("__rsub__", sub), ("__rmul__", mul),
                  ("__rfloordiv__", floor_divide), ("__rmod__", _g["remainder"]), ("__rpow__", pow),
                  ("__rand__", _g["bitwise_and"]), ("__ror__", _g["bitwise_or"]), ("__rxor__", _g["bitwise_xor"]),
                  ("__rlshift__", _g["bitwise_left_shift"]), ("__rrshift__", _g["bitwise_right_shift"])]:
    _register_method(_op, reflected(_sym))


@torchsymbol(torch.float_power, T.float_power, method_name="float_power")
def float_power(input, exponent):
    dt = torch.complex128 if any(dtypes.is_complex(dtypes.result_type(x)) for x in (input, exponent)) \
        else torch.float64
    input = convert(input, dt) if is_tensor(input) else input
    exponent = convert(exponent, dt) if is_tensor(exponent) else exponent
    return pow(input, exponent)


@torchsymbol(torch.fmax, T.fmax, method_name="fmax")
def fmax(input, other):
    m = maximum(input, other)
    return where(isnan(input), other, where(isnan(other), input, m)) if dtypes.is_float(m.dtype) else m


@torchsymbol(torch.fmin, T.fmin, method_name="fmin")
def fmin(input, other):
    m = minimum(input, other)
    return where(isnan(input), other, where(isnan(other), input, m)) if dtypes.is_float(m.dtype) else m


@torchsymbol(torch.xlogy, T.xlogy, S.xlogy, method_name="xlogy")
def xlogy(input, other):
    _, result = promote((input, other), _INT_TO_FLOAT)
    out = mul(input, log(other))
    out = where(eq(input, 0), 0.0, out)
    return convert(where(isnan(other), math.nan, out), result)


@torchsymbol(S.xlog1py)
def xlog1py(input, other):
    _, result = promote((input, other), _INT_TO_FLOAT)
    out = where(eq(input, 0), 0.0, mul(input, log1p(other)))
    return convert(where(isnan(other), math.nan, out), result)


@torchsymbol(torch.logaddexp, T.logaddexp, method_name="logaddexp")
def logaddexp(input, other):
    m = maximum(input, other)
    mn = minimum(input, other)
    inf_same = logical_and(isinf(m), eq(m, mn))
    return where(inf_same, m, add(m, log1p(exp(sub(mn, m)))))


@torchsymbol(torch.logaddexp2, T.logaddexp2, method_name="logaddexp2")
def logaddexp2(input, other):
    m = maximum(input, other)
    mn = minimum(input, other)
    inf_same = logical_and(isinf(m), eq(m, mn))
    return where(inf_same, m, add(m, div(log1p(exp2(sub(mn, m))), math.log(2.0))))


@torchsymbol(torch.heaviside, T.heaviside, method_name="heaviside")
def heaviside(input, values):
    return where(eq(input, 0), values, convert(gt(input, 0), promote((input, values))[1]))


@torchsymbol(torch.ldexp, T.ldexp, method_name="ldexp")
def ldexp(input, other):
    return mul(input, pow(2.0, other))


@torchsymbol(S.polygamma, torch.polygamma, T.polygamma, method_name="polygamma")
def polygamma(n, input):
    if n == 0:
        return digamma(input)
    a = elementwise(lambda v: v, input, kind=_INT_TO_FLOAT)
    return prims.polygamma(n, a)


@torchsymbol(torch.isclose, T.isclose, method_name="isclose")
def isclose(input, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False):
    close = eq(input, other)
    if dtypes.is_inexact(promote((input, other))[1]) and not (known_equal(rtol, 0) and known_equal(atol, 0)):
        diff = abs(sub(input, other))
        tol = add(mul(abs(other), rtol), atol)
        close = logical_or(close, logical_and(isfinite(diff), le(diff, tol)))
    if equal_nan:
        close = logical_or(close, logical_and(isnan(input), isnan(other)))
    return close


# --- ternary and friends ----------------------------------------------------------------

@torchsymbol(torch.where, T.where, method_name="where")
def where(condition, input=None, other=None):
    check(input is not None and other is not None, lambda: "where(condition) (one argument) is data-dependent "
                                                           "and cannot be traced; use nonzero outside the trace")
    if not is_tensor(condition):
        condition = tensor_of(condition, input if is_tensor(input) else other, torch.bool)
    condition = convert(condition, torch.bool)
    _, result = promote((input, other))
    condition, input, other = broadcast(condition, input, other)
    return prims.where(condition, convert(input, result), convert(other, result))


def _minmax(x, bound, op):
    """clamp against one bound: ``op`` is ge (min bound) or le (max bound); NaN in
    x or in a tensor bound propagates, as in eager."""
    _, result = promote((x, bound))
    keep = op(x, bound)
    if dtypes.is_float(result):
        keep = logical_or(keep, isnan(x))
        if is_tensor(bound):
            keep = logical_and(keep, logical_not(isnan(bound)))
    return where(keep, x, bound)


@torchsymbol(torch.clamp, T.clamp, torch.clip, T.clip, method_name=("clamp", "clip"))
def clamp(input, min=None, max=None):
    check(min is not None or max is not None, lambda: "torch.clamp: At least one of 'min' or 'max' must not be None")
    out = input
    if min is not None:
        out = _minmax(out, min, ge)
    if max is not None:
        out = _minmax(out, max, le)
    _, result = promote((input, min, max))
    return convert(out, result)


@torchsymbol(torch.clamp_min, T.clamp_min, method_name="clamp_min")
def clamp_min(input, min):
    return clamp(input, min, None)


@torchsymbol(torch.clamp_max, T.clamp_max, method_name="clamp_max")
def clamp_max(input, max):
    return clamp(input, None, max)


@torchsymbol(torch.lerp, T.lerp, method_name="lerp")
def lerp(input, end, weight):
    return elementwise(prims.lerp, input, end, weight)


@torchsymbol(torch.addcmul, T.addcmul, method_name="addcmul")
def addcmul(input, tensor1, tensor2, *, value=1):
    return add(input, _scaled(mul(tensor1, tensor2), value))


@torchsymbol(torch.addcdiv, T.addcdiv, method_name="addcdiv")
def addcdiv(input, tensor1, tensor2, *, value=1):
    return add(input, _scaled(div(tensor1, tensor2), value))


@torchsymbol(torch.masked_fill, T.masked_fill, method_name="masked_fill")
def masked_fill(input, mask, value):
    value = convert(value, input.dtype) if is_tensor(value) else value
    return where(mask, value, input) if not is_tensor(value) else \
        prims.where(*broadcast(convert(mask, torch.bool), expand_to(value, input.shape), input))


# --- casts ----------------------------------------------------------------------------------

def _cast_method(name, dtype):
    def decomposition(a, memory_format=None):
        return convert(a, dtype)
    decomposition.__name__ = name
    return torchsymbol(getattr(T, name), name=name, method_name=name)(decomposition)


for _n, _dt in [("float", torch.float32), ("double", torch.float64), ("half", torch.float16),
                ("bfloat16", torch.bfloat16), ("int", torch.int32), ("long", torch.int64),
                ("short", torch.int16), ("char", torch.int8), ("byte", torch.uint8), ("bool", torch.bool),
                ("cfloat", torch.complex64), ("cdouble", torch.complex128), ("chalf", torch.complex32)]:
    _g["to_" + _n] = _cast_method(_n, _dt)


@torchsymbol(T.type_as, method_name="type_as")
def type_as(a, other):
    return convert(a, other.dtype)


def _to_args(a, args, kwargs):
    """(dtype, device) from any of Tensor.to's spellings."""
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    for x in args:
        if isinstance(x, torch.dtype):
            dtype = x
        elif isinstance(x, (str, torch.device, int)) and not isinstance(x, bool):
            device = torch.device(x)
        elif is_tensor(x):
            dtype, device = x.dtype, x.device
    return dtype, device


@torchsymbol(T.to, method_name="to")
def to(a, *args, **kwargs):
    dtype, device = _to_args(a, args, kwargs)
    out = a
    if device is not None and torch.device(device) != a.device:
        out = prims.device_put(out, torch.device(device))
    if dtype is not None:
        out = convert(out, dtype)
    if kwargs.get("copy") and out is a:
        out = prims.clone(a)
    return out

