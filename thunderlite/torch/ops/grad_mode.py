"""Autograd state inside the program: grad-mode switches and ``requires_grad_``.

- ``set_grad_enabled(mode)``: the jit records one each time the program
  switches grad mode (``with torch.no_grad()``, ``@torch.no_grad()``,
  ``torch.enable_grad()``, ``torch.set_grad_enabled``). Autodiff reads the mode
  from the proxies' ``requires_grad`` (set while tracing) and drops these
  symbols from the functional forward/backward; functionalize.py follows them
  (a write under no_grad keeps the tensor's history); the eager-mode replay
  runs them, so updates made under ``no_grad`` replay with grad mode off, as in
  eager. Tagged ``ORDER_BARRIER``:
  a reordering pass must not move a symbol across a switch.
- ``requires_grad_(a, requires_grad=True)``: flips the proxy's flag while
  tracing and records a symbol with no output (``autodiff.REQUIRES_GRAD_ID``);
  the Python-level method returns ``a`` itself, as torch's does. At run time
  it sets the flag on the real tensor (the eager-mode replay needs it, before
  every later read: also an ``ORDER_BARRIER``; the functional forward drops it).
"""
from __future__ import annotations

import types

import torch
from torch._higher_order_ops.register_hook import register_hook_op

from thunderlite.core.proxies import TensorProxy, register_method
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.torch.registry import _register_symbol, register_torch_callable


def _set_grad_enabled_meta(mode: bool) -> None:
    return None


def _set_grad_enabled_impl(mode: bool) -> None:
    torch._C._set_grad_enabled(mode)


set_grad_enabled = Symbol("set_grad_enabled", meta=_set_grad_enabled_meta, impl=_set_grad_enabled_impl,
                          module="ltorch", tags={Tag.DONT_DCE, Tag.ORDER_BARRIER})
_register_symbol(set_grad_enabled)

SET_GRAD_ENABLED_ID = set_grad_enabled.id


def _requires_grad_meta(a, requires_grad: bool = True) -> None:
    a.requires_grad = bool(requires_grad)


def _requires_grad_impl(a, requires_grad: bool = True) -> None:
    a.requires_grad_(requires_grad)


requires_grad_marker = Symbol("requires_grad_", meta=_requires_grad_meta, impl=_requires_grad_impl,
                              module="ltorch", tags={Tag.DONT_DCE, Tag.ORDER_BARRIER})
_register_symbol(requires_grad_marker)
REQUIRES_GRAD_ID = requires_grad_marker.id


def requires_grad_(a, requires_grad: bool = True):
    """``a.requires_grad_(flag)``: records the marker and returns ``a``; nothing
    where ``a`` already requires grad and the flag is True (eager's no-op), so
    a marker setting the flag always makes a new leaf."""
    if requires_grad and a.requires_grad:
        return a
    requires_grad_marker(a, requires_grad)
    return a


register_torch_callable(torch.Tensor.requires_grad_, requires_grad_)
register_method("requires_grad_", requires_grad_)


# --- tensor hooks (docs/architecture.md §9, "Tensor hooks") -------------------------------------

def _register_hook_meta(a, hook, reads=()) -> None:
    return None


def _register_hook_impl(a, hook, reads=()) -> None:
    a.register_hook(with_values(hook, reads))     # the eager-mode replay: autograd runs it on the real tensor


def with_values(fn, reads: tuple):
    """``fn`` with each traced tensor it closes over (or takes as a default)
    replaced by its value when the program runs, in ``hook_reads``' order."""
    if not reads:
        return fn
    values = iter(reads)
    cells = tuple(types.CellType(_filled_in(c.cell_contents, values)) if _holds_proxy(c) else c
                  for c in fn.__closure__ or ())
    defaults = tuple(_filled_in(d, values) for d in fn.__defaults__ or ()) or None
    new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, defaults, cells or None)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


def _holds_proxy(cell) -> bool:
    try:
        return bool(_proxies(cell.cell_contents))
    except ValueError:
        return False


def _proxies(value) -> tuple:
    """The traced tensors ``value`` is or holds (a tuple of them, one level)."""
    if isinstance(value, TensorProxy):
        return (value,)
    if type(value) is tuple:
        return tuple(v for v in value if isinstance(v, TensorProxy))
    return ()


def _filled_in(value, values):
    if isinstance(value, TensorProxy):
        return next(values)
    if type(value) is tuple:
        return tuple(next(values) if isinstance(v, TensorProxy) else v for v in value)
    return value


register_hook_marker = Symbol("register_hook", meta=_register_hook_meta, impl=_register_hook_impl,
                              module="ltorch", tags={Tag.DONT_DCE, Tag.ORDER_BARRIER})
_register_symbol(register_hook_marker)
REGISTER_HOOK_ID = register_hook_marker.id
"""``t.register_hook(fn)`` inside the program: a fact about ``t`` with no output
(its third argument: the traced tensors ``fn`` closes over, kept alive for it).
Autodiff passes the total gradient of ``t`` through ``fn`` (in order of
registration) before propagating it; on a program input the jit registers
``fn`` on the caller's tensor after the call instead (the hook outlives the
call, as in eager)."""


def _retain_grad_meta(a) -> None:
    return None


def _retain_grad_impl(a) -> None:
    a.retain_grad()


retain_grad_marker = Symbol("retain_grad", meta=_retain_grad_meta, impl=_retain_grad_impl,
                            module="ltorch", tags={Tag.DONT_DCE, Tag.ORDER_BARRIER})
_register_symbol(retain_grad_marker)
RETAIN_GRAD_ID = retain_grad_marker.id
"""``t.retain_grad()`` inside the program: on an input the jit calls it on the
caller's tensor after the call; on a value the program makes, autodiff runs the
program in eager mode, where ``t`` is a real tensor of the graph."""


class TracedHookHandle:
    """What ``register_hook`` returns while tracing (eager: a ``RemovableHandle``)."""
    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def remove(self) -> None:
        raise NotImplementedError(f"removing a tensor hook (of {self.tensor.name}) inside a jitted function is not "
                                  "supported; register it outside, or do not remove it")


def _needs_grad(a, what: str) -> None:
    if not a.requires_grad:
        raise RuntimeError(what)


def register_hook(a, hook):
    """``a.register_hook(hook)``: records the marker (eager's error when ``a``
    does not require grad)."""
    _needs_grad(a, "cannot register a hook on a tensor that doesn't require gradient")
    if not callable(hook):
        raise TypeError(f"register_hook expects a callable, got {type(hook).__name__}")
    register_hook_marker(a, hook, hook_reads(hook))
    return TracedHookHandle(a)


def hook_reads(fn) -> tuple:
    """The traced tensors a hook's function closes over (or takes as defaults)."""
    values = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:      # a cell not filled yet
            continue
    values += list(getattr(fn, "__defaults__", None) or ())
    return tuple(p for v in values for p in _proxies(v))


def retain_grad(a) -> None:
    """``a.retain_grad()``: records the marker (eager's error when ``a`` does not
    require grad)."""
    _needs_grad(a, "can't retain_grad on Tensor that has requires_grad=False")
    retain_grad_marker(a)


def register_hook_hop(tensor, hook_body, *freevars):
    """``torch.ops.higher_order.register_hook(h, body, *freevars)``, dynamo's
    spelling of ``h.register_hook(lambda g: body(g, *freevars))`` in a graph
    (ThunderFX, docs/architecture.md §14): the same marker; returns ``h``."""
    def hook(grad, body=hook_body, free=freevars):
        return body(grad, *free)
    register_hook(tensor, hook)
    return tensor


register_torch_callable(torch.Tensor.register_hook, register_hook)
register_torch_callable(register_hook_op, register_hook_hop)
register_method("register_hook", register_hook)
register_torch_callable(torch.Tensor.retain_grad, retain_grad)
register_method("retain_grad", retain_grad)
