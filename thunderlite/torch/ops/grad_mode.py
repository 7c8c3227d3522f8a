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

import torch

from thunderlite.core.proxies import register_method
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


def requires_grad_(a, requires_grad: bool = True):
    """``a.requires_grad_(flag)``: records the marker and returns ``a``."""
    requires_grad_marker(a, requires_grad)
    return a


register_torch_callable(torch.Tensor.requires_grad_, requires_grad_)
register_method("requires_grad_", requires_grad_)
