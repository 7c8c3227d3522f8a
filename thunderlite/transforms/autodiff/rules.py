"""VJP rules: one table keyed by symbol id (CONTRIBUTING.md, style 2).

A rule receives the gradient of the symbol's output (``g``, shaped like the
output; ``None`` entries for tuple outputs that got no gradient), the output
itself (``out``) and the symbol's own arguments, and returns the gradients of
its parameters: a tuple in parameter order or a dict keyed by parameter name.
``None`` means "no gradient flows there". Rules are written with prims (and
torch-language symbols where that is shorter), so the backward is itself a
trace that executors claim like any other.

Every prim has a rule or is registered as non-differentiable (its outputs never
require grad: comparisons, integer ops, random draws); ``missing_prim_rules``
lists the ones that have neither and a test keeps that list empty. A symbol
with neither a rule nor a decomposition is an error naming it (autodiff.py).

Example::

    @register_vjp(prims.sin)
    def _sin(g, out, a):
        return (prims.mul(g, prims.cos(a)),)
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch

from thunderlite.core import dtypes, prims, pytree
from thunderlite.core.prims import check
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.symint import known_or, sym_max
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.transforms.autodiff.symbols import BACKWARD_ERROR, convolution_backward

_rules: dict[str, Callable] = {}
_signatures: dict[str, inspect.Signature] = {}
_when: dict[str, Callable] = {}
_non_differentiable: set[str] = set()
_forwards: dict[str, tuple[Callable, Callable | None]] = {}
_again: set[str] = set()
_why: dict[str, Callable] = {}
_fused_rules: set[str] = set()


def _sym_id(sym: Symbol | str) -> str:
    return sym if isinstance(sym, str) else sym.id


def register_vjp(*syms: Symbol | str, when: Callable | None = None,
                 fused: bool = False) -> Callable[[Callable], Callable]:
    """Register ``fn(g, out, *args, **kwargs)`` as the VJP of each symbol.
    ``when(bsym) -> bool`` limits the rule to the calls it covers; other calls
    of a composite are differentiated through its decomposition. ``fused``:
    the rule keeps the forward one torch call and its backward is ATen's fused
    kernel (``fused_path`` reports how such calls were taken)."""
    def deco(fn: Callable) -> Callable:
        for sym in syms:
            key = _sym_id(sym)
            if key in _rules or key in _non_differentiable:
                raise ValueError(f"a VJP rule for {key} is already registered")
            _rules[key] = fn
            _signatures[key] = inspect.signature(fn)
            if when is not None:
                _when[key] = when
            if fused:
                _fused_rules.add(key)
        return fn
    return deco


def register_differentiable_again(*syms: Symbol | str) -> None:
    """Symbols whose own rule stays exact when the gradient it records is
    differentiated again (its backward kernel has a rule of its own, as
    PyTorch autograd's double backward): a higher-order gradient keeps them
    whole instead of differentiating their decomposition (autodiff/inline.py)."""
    for sym in syms:
        key = _sym_id(sym)
        check(key in _rules, lambda key=key: f"{key} has no VJP rule to keep", ValueError)
        _again.add(key)


def differentiable_again(bsym) -> bool:
    """Whether ``bsym`` is differentiated by its own rule also where its gradient
    is differentiated again (``register_differentiable_again``)."""
    return bsym.sym.id in _again and has_rule_for(bsym)


def register_non_differentiable(*syms: Symbol | str) -> None:
    """Symbols whose outputs never carry a gradient (bool/int results, draws)."""
    for sym in syms:
        key = _sym_id(sym)
        if key in _rules or key in _non_differentiable:
            raise ValueError(f"{key} already has a VJP rule or is already non-differentiable")
        _non_differentiable.add(key)


def vjp_rule(sym: Symbol) -> Callable | None:
    return _rules.get(sym.id)


def has_rule_for(bsym) -> bool:
    """Whether ``bsym`` is differentiated by its own rule (not its decomposition)."""
    key = bsym.sym.id
    if key not in _rules:
        return False
    when = _when.get(key)
    return when is None or bool(when(bsym))


def is_non_differentiable(sym: Symbol) -> bool:
    return sym.id in _non_differentiable


def missing_prim_rules() -> list[str]:
    """Prims with neither a rule nor a non-differentiable mark (must be empty)."""
    return sorted(s.id for s in prims.all_prims().values()
                  if s.id not in _rules and s.id not in _non_differentiable)


def apply_rule(bsym, g) -> list[tuple]:
    """Run the rule of ``bsym`` and pair each differentiable input value with
    its gradient: ``[(arg, grad), ...]`` where ``arg`` is a proxy (list-valued
    parameters such as ``cat``'s tensors are paired element-wise)."""
    key = bsym.sym.id
    rule = _rules[key]
    bound = _signatures[key].bind(g, bsym.output, *bsym.args, **bsym.kwargs)
    result = rule(g, bsym.output, *bsym.args, **bsym.kwargs)
    names = list(bound.signature.parameters)[2:]
    if not isinstance(result, dict):
        # not strict: a rule's tuple may leave out trailing parameters (no gradient flows there)
        result = dict(zip(names, result, strict=False))
    pairs = []
    for name, grad in result.items():
        if grad is None:
            continue
        arg = bound.arguments.get(name)
        if isinstance(arg, (list, tuple)):
            pairs.extend((a, gr) for a, gr in zip(arg, grad, strict=True) if gr is not None)
        else:
            pairs.append((arg, grad))
    return [(a, gr) for a, gr in pairs if isinstance(a, TensorProxy)]


# --- forwards that save what eager saves ------------------------------------------------------

def register_forward(sym: Symbol | str, when: Callable | None = None,
                     why: Callable | None = None) -> Callable[[Callable], Callable]:
    """Register ``fn(*args, **kwargs)`` that records ``sym``'s forward, on a
    gradient path, as one op returning ``(output, *saved)``: the statistics
    eager's kernel saves for its backward (layer_norm's mean and rstd, sdpa's
    logsumexp). That op has its own VJP rule, which reads them instead of
    recomputing them. ``when(bsym)`` limits it to the calls it covers;
    ``why(bsym)`` says in words why it does or does not cover a call
    (``fused_path``, for ``examine``), else ``when``'s docstring says it."""
    def deco(fn: Callable) -> Callable:
        key = _sym_id(sym)
        check(key not in _forwards, lambda: f"a forward for {key} is already registered", ValueError)
        _forwards[key] = (fn, when)
        if why is not None:
            _why[key] = why
        return fn
    return deco


def fused_path(bsym: BoundSymbol) -> tuple[str, str] | None:
    """How autodiff differentiates a call of a symbol with a fused path, in
    words (for ``examine``): ``("fused kernels", why)`` where its registered
    forward records ATen's statistics-saving kernel (whose VJP is ATen's
    backward kernel), ``("own rule", why)`` where its VJP rule covers the call,
    ``("decomposition", why)`` where neither does; None for a symbol with
    neither a forward nor a rule registered."""
    key = bsym.sym.id
    forward, rule = _forwards.get(key), _rules.get(key)
    if forward is None and key not in _fused_rules:
        return None
    if forward is not None and (forward[1] is None or forward[1](bsym)):
        return "fused kernels", _why[key](bsym) if key in _why else _doc(forward[0])
    ruled = rule is not None and (_when.get(key) is None or _when[key](bsym))
    how = "own rule" if ruled else "decomposition"
    if key in _why:
        return how, _why[key](bsym)
    if ruled:
        return how, _doc(rule)
    limits = [w for w in ((forward or (None, None))[1], _when.get(key)) if w is not None]
    covers = "; ".join(_doc(w) for w in limits if w.__doc__)
    return "decomposition", f"outside what its fused path covers ({covers})" if covers else \
        "outside what its fused path covers"


def _doc(fn: Callable) -> str:
    """The first paragraph of ``fn``'s docstring on one line ("" without one)."""
    return " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())


def substitute_forward(bsym: BoundSymbol, names) -> list[BoundSymbol] | None:
    """``bsym`` recorded by its registered forward (same output proxy, the
    saved statistics as extra outputs that require no grad), or None when no
    forward covers it. The forward may record a few symbols that prepare its
    arguments (sdpa's boolean mask made additive) before the op itself, which
    comes last. ``names`` is the trace's name pool."""
    entry = _forwards.get(bsym.sym.id)
    if entry is None or (entry[1] is not None and not entry[1](bsym)) or type(bsym.output) is not TensorProxy:
        return None
    scratch = Trace("forward", names=names)
    with tracectx(scratch):
        entry[0](*bsym.args, **bsym.kwargs)
    *prep, new = scratch.bound_symbols
    check(isinstance(new.output, tuple) and len(new.output) > 1,
          lambda: f"the forward of {bsym.sym.id} must end with a symbol returning (output, *saved)")
    first, *saved = new.output
    swap = {first.name: bsym.output}
    swap.update((p.name, p.replace(name=p.name, requires_grad=False)) for p in saved if isinstance(p, TensorProxy))
    return [b.replace(source=bsym.source) for b in prep] + [_rename(new, swap).replace(source=bsym.source)]


def _rename(bsym: BoundSymbol, swap: dict) -> BoundSymbol:
    def sub(x):
        return swap.get(x.name, x) if isinstance(x, Proxy) else x
    return bsym.replace(args=pytree.tree_map(sub, bsym.args), kwargs=pytree.tree_map(sub, bsym.kwargs),
                        output=pytree.tree_map(sub, bsym.output),
                        subsymbols=tuple(_rename(s, swap) for s in bsym.subsymbols))


# --- helpers rules share ----------------------------------------------------------------

def is_t(x) -> bool:
    return isinstance(x, TensorProxy)


def zeros_like(a: TensorProxy):
    return prims.full(a.shape, 0, device=a.device, dtype=a.dtype)


def full_like(a: TensorProxy, value):
    return prims.full(a.shape, value, device=a.device, dtype=a.dtype)


def to_dtype(g, dtype: torch.dtype):
    return g if g.dtype == dtype else prims.convert_element_type(g, dtype)


def sum_to(g: TensorProxy, shape: tuple) -> TensorProxy:
    """Reduce ``g`` to ``shape`` (undoing broadcasting)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    dims = list(range(lead))
    dims += [lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1]
    if dims:
        g = prims.sum(g, tuple(dims))
    return g if g.shape == shape else prims.reshape(g, shape)


def expand_reduced(g: TensorProxy, shape: tuple, dims: tuple) -> TensorProxy:
    """Broadcast a reduction's gradient back over the reduced ``dims`` of ``shape``."""
    ndim = len(shape)
    reduced = {d % max(ndim, 1) for d in dims} if ndim else set()
    kept = tuple(i for i in range(ndim) if i not in reduced)
    return prims.broadcast_in_dim(g, tuple(shape), kept)


def reshape_to(x, shape: tuple):
    """``x`` reshaped to ``shape``, without a no-op reshape in the trace."""
    return x if tuple(x.shape) == tuple(shape) else prims.reshape(x, tuple(shape))


def backward_error(like: TensorProxy, message: str):
    """A gradient that raises ``message`` when the backward runs (as eager does)."""
    return BACKWARD_ERROR(message, like.shape, like.dtype, like.device)


def _neg(x):
    return prims.neg(x)


def _mul(a, b):
    return prims.mul(a, b) if is_t(a) or is_t(b) else a * b


def _div(a, b):
    return prims.div(a, b) if is_t(a) or is_t(b) else a / b


def _plus(a, b):
    return prims.add(a, b) if is_t(a) or is_t(b) else a + b


def _tensor_grads(g, args, grads):
    """Drop gradients of non-tensor arguments."""
    return tuple(gr if is_t(a) else None for a, gr in zip(args, grads, strict=True))


# --- elementwise unary ---------------------------------------------------------------

UNARY_RULES: dict[str, Callable] = {     # prim name -> gradient of its argument, from (g, out, a)
    "neg": lambda g, out, a: _neg(g),
    "exp": lambda g, out, a: _mul(g, out),
    "exp2": lambda g, out, a: _mul(g, _mul(out, math.log(2.0))),
    "expm1": lambda g, out, a: _mul(g, prims.add(out, 1)),
    "log": lambda g, out, a: _div(g, a),
    "log1p": lambda g, out, a: _div(g, prims.add(a, 1)),
    "log2": lambda g, out, a: _div(g, _mul(a, math.log(2.0))),
    "log10": lambda g, out, a: _div(g, _mul(a, math.log(10.0))),
    "sqrt": lambda g, out, a: _div(g, _mul(out, 2)),
    "rsqrt": lambda g, out, a: _mul(g, _mul(prims.mul(out, prims.mul(out, out)), -0.5)),
    "sin": lambda g, out, a: _mul(g, prims.cos(a)),
    "cos": lambda g, out, a: _mul(g, _neg(prims.sin(a))),
    "tan": lambda g, out, a: _mul(g, prims.add(_mul(out, out), 1)),
    "asin": lambda g, out, a: _mul(g, prims.rsqrt(prims.sub(1, _mul(a, a)))),
    "acos": lambda g, out, a: _neg(_mul(g, prims.rsqrt(prims.sub(1, _mul(a, a))))),
    "atan": lambda g, out, a: _div(g, prims.add(_mul(a, a), 1)),
    "sinh": lambda g, out, a: _mul(g, prims.cosh(a)),
    "cosh": lambda g, out, a: _mul(g, prims.sinh(a)),
    "tanh": lambda g, out, a: _mul(g, prims.sub(1, _mul(out, out))),
    "asinh": lambda g, out, a: _mul(g, prims.rsqrt(prims.add(_mul(a, a), 1))),
    "acosh": lambda g, out, a: _div(g, prims.sqrt(_mul(prims.sub(a, 1), prims.add(a, 1)))),
    "atanh": lambda g, out, a: _div(g, prims.sub(1, _mul(a, a))),
    "erf": lambda g, out, a: _mul(g, _mul(prims.exp(_neg(_mul(a, a))), 2 / math.sqrt(math.pi))),
    "erfc": lambda g, out, a: _mul(g, _mul(prims.exp(_neg(_mul(a, a))), -2 / math.sqrt(math.pi))),
    "erfinv": lambda g, out, a: _mul(g, _mul(prims.exp(_mul(out, out)), math.sqrt(math.pi) / 2)),
    "lgamma": lambda g, out, a: _mul(g, prims.digamma(a)),
    "digamma": lambda g, out, a: _mul(g, prims.polygamma(1, a)),
    "sigmoid": lambda g, out, a: _mul(g, _mul(out, prims.sub(1, out))),
    "reciprocal": lambda g, out, a: _neg(_mul(g, _mul(out, out))),
    "abs": lambda g, out, a: _mul(g, prims.sign(a)),
}
_ZERO_GRAD_UNARY = ("floor", "ceil", "round", "trunc", "sign")


def _install_unary() -> None:
    for name, fn in UNARY_RULES.items():
        def rule(g, out, a, _fn=fn):
            return (_fn(g, out, a),)
        register_vjp(getattr(prims, name))(rule)
    for name in _ZERO_GRAD_UNARY:
        register_vjp(getattr(prims, name))(lambda g, out, a: (zeros_like(a),))


_install_unary()
register_non_differentiable(*(getattr(prims, n) for n in (
    "signbit", "bitwise_not", "logical_not", "isfinite", "isnan", "isinf", "eq", "ne", "lt", "le",
    "gt", "ge", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
    "bitwise_right_shift", "logical_and", "logical_or", "logical_xor")))


@register_vjp(prims.real, prims.imag, prims.conj)
def _complex_parts(g, out, a):
    return (backward_error(a, "thunderlite does not differentiate through complex tensors yet"),)


# --- elementwise binary --------------------------------------------------------------

@register_vjp(prims.add)
def _add(g, out, a, b):
    return _tensor_grads(g, (a, b), (g, g))


@register_vjp(prims.sub)
def _sub(g, out, a, b):
    return _tensor_grads(g, (a, b), (g, _neg(g) if is_t(b) else None))


@register_vjp(prims.mul)
def _mul_rule(g, out, a, b):
    return _tensor_grads(g, (a, b), (_mul(g, b) if is_t(a) else None, _mul(g, a) if is_t(b) else None))


@register_vjp(prims.div)
def _div_rule(g, out, a, b):
    ga = _div(g, b) if is_t(a) else None
    gb = _neg(_mul(g, _div(out, b))) if is_t(b) else None
    return ga, gb


@register_vjp(prims.floor_divide)
def _floor_divide(g, out, a, b):
    """Zero, as for ``torch.div(rounding_mode="floor")``; ``torch.floor_divide``
    itself has no derivative in eager (its ltorch symbol's rule raises)."""
    return (zeros_like(a) if is_t(a) else None, zeros_like(b) if is_t(b) else None)


@register_vjp(prims.nextafter)
def _nextafter(g, out, a, b):
    return (g if is_t(a) else None, zeros_like(b) if is_t(b) else None)


def _mod_rule(rounding: Callable) -> Callable:
    def rule(g, out, a, b):
        if not is_t(b):
            return g, None
        return (g if is_t(a) else None), _neg(_mul(g, rounding(_div(a, b))))
    return rule


register_vjp(prims.remainder)(_mod_rule(prims.floor))
register_vjp(prims.fmod)(_mod_rule(prims.trunc))


@register_vjp(prims.pow)
def _pow(g, out, a, b):
    ga = gb = None
    if is_t(a):
        dpow = _mul(b, prims.pow(a, prims.sub(b, 1))) if is_t(b) else \
            (_mul(prims.pow(a, b - 1), b) if b != 0 else zeros_like(a))
        if is_t(b):
            dpow = prims.where(prims.eq(b, 0), 0, dpow)
        ga = _mul(g, dpow)
    if is_t(b):
        base = a if is_t(a) else prims.add(zeros_like(b), a)
        dexp = _mul(out, prims.log(base))
        zero_base = prims.logical_and(prims.eq(base, 0), prims.ge(b, 0))
        gb = _mul(g, prims.where(zero_base, 0, dexp))
    return ga, gb


@register_vjp(prims.atan2)
def _atan2(g, out, a, b):
    """0 at (0, 0), as eager (where the plain formula gives 0/0)."""
    denom = _plus(_mul(a, a), _mul(b, b))
    recip = prims.where(prims.eq(denom, 0), 0, _div(1, denom)) if is_t(denom) else \
        (0.0 if denom == 0 else 1 / denom)
    return (_mul(g, _mul(b, recip)) if is_t(a) else None,
            _neg(_mul(g, _mul(a, recip))) if is_t(b) else None)


def _minmax(g, a, b, a_wins):
    half = _mul(g, 0.5)
    ga = prims.where(prims.eq(a, b), half, prims.where(a_wins, g, 0))
    gb = prims.where(prims.eq(a, b), half, prims.where(a_wins, 0, g))
    return (ga if is_t(a) else None, gb if is_t(b) else None)


@register_vjp(prims.maximum)
def _maximum(g, out, a, b):
    return _minmax(g, a, b, prims.gt(a, b))


@register_vjp(prims.minimum)
def _minimum(g, out, a, b):
    return _minmax(g, a, b, prims.lt(a, b))


@register_vjp(prims.copysign)
def _copysign(g, out, a, b):
    ratio = prims.where(prims.eq(a, 0), 0, _div(out, a))
    return (_mul(g, ratio) if is_t(a) else None, zeros_like(b) if is_t(b) else None)


@register_vjp(prims.hypot)
def _hypot(g, out, a, b):
    return (_mul(g, _div(a, out)) if is_t(a) else None, _mul(g, _div(b, out)) if is_t(b) else None)


@register_vjp(prims.polygamma)
def _polygamma(g, out, n, a):
    return None, _mul(g, prims.polygamma(n + 1, a))


@register_vjp(prims.zeta)
def _zeta(g, out, a, b):
    ga = backward_error(a, "derivative for aten::special_zeta is not implemented") if is_t(a) else None
    return ga, (_neg(_mul(g, _mul(prims.zeta(a + 1, b), a))) if is_t(b) else None)


@register_vjp(prims.where)
def _where(g, out, pred, a, b):
    return (None, prims.where(pred, g, 0) if is_t(a) else None,
            prims.where(pred, 0, g) if is_t(b) else None)


@register_vjp(prims.convert_element_type)
def _convert(g, out, a, dtype):
    if not is_t(a) or not dtypes.is_inexact(a.dtype):
        return None, None
    return to_dtype(g, a.dtype), None


# --- shapes and reductions ------------------------------------------------------------

@register_vjp(prims.broadcast_in_dim)
def _broadcast_in_dim(g, out, a, shape, broadcast_dims):
    bdims = tuple(broadcast_dims)
    dims = [i for i in range(len(shape)) if i not in bdims]
    dims += [d for d, s in zip(bdims, a.shape, strict=True) if s == 1 and shape[d] != 1]
    red = prims.sum(g, tuple(sorted(dims))) if dims else g
    return (red if red.shape == a.shape else prims.reshape(red, a.shape)), None, None


@register_vjp(prims.reshape)
def _reshape(g, out, a, shape):
    return reshape_to(g, a.shape), None


@register_vjp(prims.sum)
def _sum(g, out, a, dims, *, output_dtype=None):
    return to_dtype(expand_reduced(g, a.shape, tuple(dims)), a.dtype), None


def _exclusive_cumprod(x, dim: int, reverse: bool = False):
    """``[1, x0, x0*x1, ...]`` along ``dim`` (from the right when ``reverse``):
    the product of the elements strictly before each one, with no division."""
    if reverse:
        return prims.flip(_exclusive_cumprod(prims.flip(x, (dim,)), dim), (dim,))
    config = [(1, -1, 0) if d == dim else (0, 0, 0) for d in range(x.ndim)]
    return prims.pad(prims.cumprod(x, dim), 1, config)


def _prod_of_others(a, dims: tuple):
    """For each element, the product of the other elements of its reduction
    group: exclusive cumprods from the left and the right over the flattened
    reduced dims. Exact with any number of zeros (``out / a`` is not)."""
    reduced = sorted({d % a.ndim for d in dims})
    kept = [d for d in range(a.ndim) if d not in reduced]
    perm = tuple(kept + reduced)
    moved = prims.permute(a, perm) if perm != tuple(range(a.ndim)) else a
    lead = tuple(a.shape[d] for d in kept)
    flat = reshape_to(moved, lead + (math.prod(a.shape[d] for d in reduced),))
    dim = len(lead)
    others = prims.mul(_exclusive_cumprod(flat, dim), _exclusive_cumprod(flat, dim, reverse=True))
    others = reshape_to(others, moved.shape)
    if perm == tuple(range(a.ndim)):
        return others
    return prims.permute(others, tuple(perm.index(d) for d in range(a.ndim)))


@register_vjp(prims.prod)
def _prod(g, out, a, dims, *, output_dtype=None):
    dims = tuple(dims) if a.ndim else ()
    gb = expand_reduced(g, a.shape, dims)
    if not dims or a.numel() == 0:
        return to_dtype(gb if dims == () else zeros_like(a), a.dtype), None
    return to_dtype(prims.mul(gb, _prod_of_others(to_dtype(a, g.dtype), dims)), a.dtype), None


def _amax_like(g, out, a, dims):
    dims = tuple(dims)
    outb = expand_reduced(out, a.shape, dims)
    mask = prims.convert_element_type(prims.eq(a, outb), g.dtype)
    count = expand_reduced(prims.sum(mask, dims), a.shape, dims)
    return _div(_mul(expand_reduced(g, a.shape, dims), mask), count), None


@register_vjp(prims.amax, prims.amin)
def _amax(g, out, a, dims):
    return _amax_like(g, out, a, dims)


@register_vjp(prims.copy_)
def _copy(g, out, src, dst):
    """The tensor's new value is ``src`` (cast and broadcast): all of the
    gradient goes to ``src``; the overwritten ``dst`` gets none."""
    if not is_t(src):
        return None, None
    return sum_to(to_dtype(g, src.dtype), src.shape), None


@register_vjp(prims.lerp)
def _lerp(g, out, a, b, w):
    ga = _mul(g, prims.sub(1, w) if is_t(w) else 1 - w) if is_t(a) else None
    gb = _mul(g, w) if is_t(b) else None
    gw = _mul(g, prims.sub(b, a) if is_t(a) or is_t(b) else b - a) if is_t(w) else None
    return ga, gb, gw


@register_vjp(prims.device_put)
def _device_put(g, out, a, device):
    return prims.device_put(g, a.device), None


@register_vjp(prims.clone)
def _clone(g, out, a):
    return (g,)


@register_vjp(prims.permute)
def _permute(g, out, a, perm):
    perm = [p % a.ndim for p in perm]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return prims.permute(g, tuple(inverse)), None


@register_vjp(prims.slice_prim)
def _slice(g, out, a, start_indices, end_indices, strides=None):
    strides = (1,) * a.ndim if strides is None else tuple(strides)
    if known_or(lambda: 0 in g.shape, False):
        return zeros_like(a), None, None, None
    config = []
    for size, lo, n, st in zip(a.shape, start_indices, g.shape, strides, strict=True):
        # after the last element taken (lo + (n - 1) * st): right for a run-time n that may be 0
        config.append((lo, size - lo - n - sym_max(n - 1, 0) * (st - 1), st - 1))
    return prims.pad(g, 0, tuple(config)), None, None, None


@register_vjp(prims.squeeze)
def _squeeze(g, out, a, dims):
    return prims.reshape(g, a.shape), None


@register_vjp(prims.flip)
def _flip(g, out, a, dims):
    return prims.flip(g, dims), None


@register_vjp(prims.cat)
def _cat(g, out, tensors, dim):
    d = dim % g.ndim
    grads, offset = [], 0
    for t in tensors:
        start = [0] * g.ndim
        end = list(g.shape)
        start[d], end[d] = offset, offset + t.shape[d]
        grads.append(prims.slice_prim(g, tuple(start), tuple(end)))
        offset += t.shape[d]
    return grads, None


@register_vjp(prims.pad)
def _pad(g, out, a, padding_value, padding_config):
    unpad = tuple((-lo, -hi, 0) for lo, hi, _ in padding_config)
    core = prims.pad(g, 0, unpad)
    strides = tuple(interior + 1 for _, _, interior in padding_config)
    if any(s != 1 for s in strides):
        core = prims.slice_prim(core, (0,) * a.ndim, core.shape, strides)
    return core, None, None


# --- indexing ---------------------------------------------------------------------------

@register_vjp(prims.gather)
def _gather(g, out, a, dim, index):
    if index.numel() == 0:         # nothing gathered (eager accepts any dtype and rank here)
        return zeros_like(a), None, None
    return prims.scatter_add(zeros_like(a), dim, index, g), None, None


@register_vjp(prims.take_along_axis)
def _take_along_axis(g, out, a, index, dim):
    # take_along_dim wraps negative indices (gather does not): so must its gradient
    size = a.shape[dim] if a.ndim else 1
    index = prims.where(prims.lt(index, 0), prims.add(index, size), index)
    return prims.scatter_add(zeros_like(a), dim, index, g), None, None


@register_vjp(prims.index_select)
def _index_select(g, out, a, dim, index):
    if a.ndim == 0:
        return prims.reshape(g, ()), None, None
    return prims.index_add(zeros_like(a), dim, index, prims.reshape(g, out.shape)), None, None


@register_vjp(prims.scatter)
def _scatter(g, out, a, dim, index, src):
    ga = prims.scatter(g, dim, index, 0) if is_t(a) else None
    gsrc = prims.gather(g, dim, index) if is_t(src) else None
    return ga, None, None, gsrc


@register_vjp(prims.scatter_add)
def _scatter_add(g, out, a, dim, index, src):
    return g, None, None, (prims.gather(g, dim, index) if is_t(src) else None)


@register_vjp(prims.index_add)
def _index_add(g, out, a, dim, index, source):
    if not is_t(source):
        return g, None, None, None
    picked = prims.index_select(g, dim, index) if g.ndim else g
    return g, None, None, prims.reshape(picked, source.shape)


def _advanced_take(g, indices):
    """``g[indices]`` for integer index tensors applied to g's leading dims."""
    k = len(indices)
    lead = g.shape[:k]
    rest = g.shape[k:]
    bshape = tuple(prims.broadcast_shapes(*(i.shape for i in indices)))
    linear, stride = None, 1
    for size, idx in reversed(list(zip(lead, indices, strict=True))):
        idx = prims.convert_element_type(idx, torch.int64) if idx.dtype != torch.int64 else idx
        idx = prims.where(prims.lt(idx, 0), prims.add(idx, size), idx)
        if idx.shape != bshape:
            idx = prims.broadcast_in_dim(idx, bshape, tuple(range(len(bshape) - idx.ndim, len(bshape))))
        term = _mul(idx, stride) if stride != 1 else idx
        linear = term if linear is None else prims.add(linear, term)
        stride *= size
    flat = prims.reshape(g, (stride, *rest))
    n = 1
    for s in bshape:
        n *= s
    picked = prims.index_select(flat, 0, prims.reshape(linear, (n,)))
    return prims.reshape(picked, (*bshape, *rest))


@register_vjp(prims.index_put)
def _index_put(g, out, a, indices, values, accumulate):
    if any(i.dtype in (torch.bool, torch.uint8) for i in indices):
        raise NotImplementedError("gradients of index_put with boolean masks are not supported "
                                  "(their result shape depends on the data)")
    ga = g if accumulate else prims.index_put(g, indices, zeros_like(values), False)
    gv = sum_to(_advanced_take(g, indices), values.shape) if is_t(values) else None
    return ga, None, gv, None


# --- linear algebra -------------------------------------------------------------------------

def _mT(x):
    perm = list(range(x.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return prims.permute(x, tuple(perm))


@register_vjp(prims.matmul)
def _matmul(g, out, a, b):
    return matmul_vjp(g, a, b)


def matmul_vjp(g, a, b) -> tuple:
    """Gradients of ``torch.matmul(a, b)`` (1-d promotion, batch broadcasting)."""
    a2 = reshape_to(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = reshape_to(b, b.shape + (1,)) if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1:
        g2 = prims.reshape(g2, g2.shape[:-1] + (1,) + g2.shape[-1:]) if b.ndim > 1 else prims.reshape(g2, (1,))
    if b.ndim == 1:
        g2 = prims.reshape(g2, g2.shape + (1,))
    ga = gb = None
    if a.requires_grad:
        ga = reshape_to(sum_to(prims.matmul(g2, _mT(b2)), a2.shape), a.shape)
    if b.requires_grad:
        gb = reshape_to(sum_to(prims.matmul(_mT(a2), g2), b2.shape), b.shape)
    return ga, gb


@register_vjp(prims.convolution)
def _convolution(g, out, a, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    mask = (a.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad)
    ga, gw, gb = convolution_backward(g, a, weight, bias, stride, padding, dilation, transposed,
                                      output_padding, groups, mask)
    return ga, gw, gb, None, None, None, None, None, None


# --- reductions and scans --------------------------------------------------------------------

def _count(shape, dims) -> int:
    n = 1
    for d in dims:
        n *= shape[d % len(shape)] if shape else 1
    return n


def _var_grad(g, a, dims, correction):
    dims = tuple(dims) if dims else tuple(range(a.ndim))
    n = _count(a.shape, dims)
    mean = expand_reduced(_div(prims.sum(a, dims), n), a.shape, dims)
    scale = 2.0 / max(n - correction, 0) if n - correction > 0 else float("inf")
    return _mul(_mul(expand_reduced(g, a.shape, dims), prims.sub(a, mean)), scale)


@register_vjp(prims.var)
def _var(g, out, a, dims, *, correction=1):
    return _var_grad(g, a, dims, correction), None


@register_vjp(prims.var_mean)
def _var_mean(g, out, a, dims, *, correction=1):
    gvar, gmean = g
    dims_t = tuple(dims) if dims else tuple(range(a.ndim))
    total = None
    if gvar is not None:
        total = _var_grad(gvar, a, dims_t, correction)
    if gmean is not None:
        part = _div(expand_reduced(gmean, a.shape, dims_t), _count(a.shape, dims_t))
        total = part if total is None else prims.add(total, part)
    return total, None


def _reverse_cumsum(x, dim):
    return prims.flip(prims.cumsum(prims.flip(x, (dim,)), dim), (dim,))


@register_vjp(prims.cumsum)
def _cumsum(g, out, a, dim, *, dtype=None):
    if a.ndim == 0:
        return to_dtype(g, a.dtype), None
    return to_dtype(_reverse_cumsum(g, dim), a.dtype), None


@register_vjp(prims.cumprod)
def _cumprod(g, out, a, dim, *, dtype=None):
    """PyTorch's O(n) formula made exact at zeros: before the first zero of
    each row ``revcumsum(g * out) / a`` (no zero divides); at the first zero
    the same sum with that zero replaced by 1 (no division); after it, 0."""
    if a.ndim == 0 or a.numel() == 0:
        return to_dtype(g, a.dtype), None
    x = to_dtype(a, g.dtype)
    is_zero = prims.eq(x, 0)
    zeros_so_far = prims.cumsum(prims.convert_element_type(is_zero, torch.int32), dim)
    before = prims.eq(zeros_so_far, 0)
    first = prims.logical_and(is_zero, prims.eq(zeros_so_far, 1))
    safe = prims.where(before, x, 1)
    w = prims.where(before, prims.mul(g, to_dtype(out, g.dtype)), 0)
    g_before = prims.div(_reverse_cumsum(w, dim), safe)
    out_unzeroed = prims.cumprod(prims.where(first, 1, x), dim)
    g_first = _reverse_cumsum(prims.mul(g, out_unzeroed), dim)
    grad = prims.where(before, g_before, prims.where(first, g_first, 0))
    return to_dtype(grad, a.dtype), None


def _select_values_grad(g, a, indices, dim):
    gv = g[0]
    if gv is None:
        return None
    if a.ndim == 0:
        return prims.reshape(gv, ())
    return prims.scatter_add(zeros_like(a), dim, indices, gv)


@register_vjp(prims.topk)
def _topk(g, out, a, k, dim, largest, sorted):
    return _select_values_grad(g, a, out[1], dim), None, None, None, None


@register_vjp(prims.sort)
def _sort(g, out, a, dim, descending, *, stable=False):
    return _select_values_grad(g, a, out[1], dim), None, None


register_non_differentiable(*(getattr(prims, n) for n in (
    "argmax", "argmin", "full", "empty", "iota", "uniform", "normal", "randint", "item")))


@register_vjp(prims.bernoulli)
def _bernoulli(g, out, shape, p, *, device, dtype, generator=None):
    return None, (zeros_like(p) if is_t(p) else None)
