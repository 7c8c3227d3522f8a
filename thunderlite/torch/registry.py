"""The torch language's tables: torch callable -> Symbol, and the Tensor
methods/operators/properties proxies resolve through.

Adding an op is one block (CONTRIBUTING.md, style 3)::

    @torchsymbol(torch.neg, torch.Tensor.neg, method_name="neg", operators=("__neg__",))
    def neg(a):
        return prims.neg(a)

The decorator makes a composite ``Symbol`` (module ``ltorch``) whose
decomposition is the function, whose ``torch_fn`` is the first torch callable
(the executor may run it directly with the symbol's own args), and registers
every listed torch callable in the table ``symbol_for`` reads. Registration
validates: a torch callable, a symbol name or a method name registered twice
is an error, never a silent overwrite (CONTRIBUTING.md, style 4).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from thunderlite.core import prims, pytree
from thunderlite.core.prims import check
from thunderlite.core.proxies import register_method, register_property
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.torch.custom_ops import custom_op_callable, is_custom_op
from thunderlite.torch.opaque import opaque_symbol_for

# torch callable -> Symbol. Keyed by the callable object itself: the jit's
# lookaside asks for every call the user program makes, so this must be one
# dict lookup.
_torch_to_symbol: dict = {}
# ltorch name -> Symbol (names are what traces print; they must be unique).
_by_name: dict[str, Symbol] = {}


def symbol_for(fn) -> Symbol | None:
    """The ltorch symbol for a torch callable, or None (a plain dict lookup).
    A ``torch.library`` op (custom or ``torch.ops.*``) gets its schema-driven
    recorder from torch/custom_ops.py, a callable standing in for a symbol."""
    try:
        sym = _torch_to_symbol.get(fn)
    except TypeError:  # unhashable callables are never torch callables
        return None
    if sym is None and is_custom_op(fn):
        return custom_op_callable(fn, _torch_to_symbol.get)
    return sym


def all_symbols() -> dict[str, Symbol]:
    return dict(_by_name)


class NotDecomposed(NotImplementedError):
    """A decomposition does not cover these arguments; the call is recorded
    through the opaque fallback (one torch call) instead of failing."""


def decomposable(cond: bool, msg: Callable[[], str]) -> None:
    """Like ``check``, but the way out is the opaque fallback, not an error."""
    if not cond:
        raise NotDecomposed(msg())


def _with_fallback(fn: Callable, run: Callable | None) -> Callable:
    if run is None:
        return fn

    def decomposition(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NotDecomposed:
            return opaque_symbol_for(run)(*args, **kwargs)
    decomposition.__name__ = fn.__name__
    decomposition.__doc__ = fn.__doc__
    decomposition.__wrapped__ = fn
    return decomposition


def _named_result(fn: Callable, name: str) -> Callable:
    """PyTorch returns some tuples as ``torch.return_types`` structseqs
    (``x.max(0).values``); the decomposition's plain tuple becomes one."""
    rtype = getattr(torch.return_types, name, None)
    if not isinstance(rtype, type) or not issubclass(rtype, tuple):
        return fn

    def decomposition(*args, **kwargs):
        out = fn(*args, **kwargs)
        return rtype(out) if type(out) is tuple and len(out) == rtype.n_fields else out
    decomposition.__name__ = fn.__name__
    decomposition.__doc__ = fn.__doc__
    decomposition.__wrapped__ = fn
    return decomposition


def _write_out(result, out):
    """``out=`` semantics of eager for a tensor or a tuple of tensors: the result
    is copied into ``out`` (same shape; eager's resize of a differently shaped
    ``out`` is not supported) and the copies' results are returned."""
    if isinstance(out, (tuple, list)):
        check(isinstance(result, tuple) and len(result) == len(out),
              lambda: f"out= got {len(out)} tensors for {_count(result)} outputs", TypeError)
        return type(result)(_write_out(r, o) for r, o in zip(result, out, strict=True))
    check(not isinstance(result, tuple),
          lambda: f"out= needs a tuple of {len(result)} tensors for this op", TypeError)
    check(tuple(out.shape) == tuple(result.shape),
          lambda: f"out= tensor has shape {list(out.shape)} but the result has shape {list(result.shape)}: "
                  "thunderlite does not resize out= tensors; pass an out tensor of the result's shape")
    check(torch.can_cast(result.dtype, out.dtype),
          lambda: f"result type {result.dtype} can't be cast to the desired output type {out.dtype}")
    if result.dtype != out.dtype:
        result = prims.convert_element_type(result, out.dtype)
    return prims.copy_(result, out)


def _count(result) -> int:
    return len(result) if isinstance(result, tuple) else 1


def _with_out(fn: Callable) -> Callable:
    """Every ltorch symbol accepts ``out=``: the functional op, then ``copy_``
    into ``out`` (docs/architecture.md §5)."""
    def decomposition(*args, out=None, **kwargs):
        if out is not None and torch.is_grad_enabled():
            check(not any(getattr(x, "requires_grad", False) for x in pytree.leaves((args, kwargs))),
                  lambda: f"{fn.__name__}(): functions with out=... arguments don't support automatic "
                          "differentiation, but one of the arguments requires grad.")
        result = fn(*args, **kwargs)
        return result if out is None else _write_out(result, out)
    decomposition.__name__ = fn.__name__
    decomposition.__doc__ = fn.__doc__
    decomposition.__wrapped__ = fn
    return decomposition


def register_torch_callable(fn, sym: Symbol) -> None:
    """Map one more torch callable to ``sym`` (refuses a second mapping)."""
    if fn in _torch_to_symbol:
        raise ValueError(f"torch callable {fn!r} is already mapped to {_torch_to_symbol[fn]!r}")
    _torch_to_symbol[fn] = sym


def _register_symbol(sym: Symbol) -> None:
    if sym.name in _by_name:
        raise ValueError(f"ltorch symbol {sym.name!r} is defined twice")
    _by_name[sym.name] = sym


def register_leaf(sym: Symbol) -> Symbol:
    """Register a leaf symbol of the language (no torch callable maps to it: a
    torch-level symbol records it), refusing a second one of the same name."""
    _register_symbol(sym)
    return sym


def torchsymbol(*torch_fns, name: str | None = None, method_name: str | Iterable[str] | None = None,
                operators: Iterable[str] = (), properties: Iterable[str] = (), tags=(),
                torch_fn: Callable | None = None, inplace_of: Symbol | None = None,
                no_torch_fn: bool = False) -> Callable[[Callable], Symbol]:
    """Decorator turning a decomposition into an ltorch ``Symbol`` and registering it.

    ``torch_fns``: the torch callables that mean this op (``torch.add``,
    ``torch.Tensor.add``...). ``torch_fn``: what the executor runs directly
    (defaults to the first of ``torch_fns``); it must accept exactly the
    symbol's args. ``no_torch_fn``: the op has no direct torch equivalent and
    executors must decompose it. ``method_name``/``operators``/``properties``:
    names installed on proxies."""
    def deco(fn: Callable) -> Symbol:
        run = None if no_torch_fn else (torch_fn if torch_fn is not None else (torch_fns[0] if torch_fns else None))
        sym_name = name or fn.__name__
        decomposition = _with_out(_named_result(_with_fallback(fn, run), sym_name))
        sym = Symbol(sym_name, decomposition=decomposition, module="ltorch", tags=tags, torch_fn=run,
                     inplace_of=inplace_of)
        _register_symbol(sym)
        for f in dict.fromkeys(torch_fns):     # torch spells some ops twice (F.conv1d is torch.conv1d)
            register_torch_callable(f, sym)
        names = [method_name] if isinstance(method_name, str) else list(method_name or ())
        for m in [*names, *operators]:
            register_method(m, sym)
        for p in properties:
            register_property(p, sym)
        return sym
    return deco


def is_ltorch(sym: Symbol) -> bool:
    return sym.module == "ltorch"


def is_opaque(sym: Symbol) -> bool:
    return Tag.OPAQUE in sym.tags
