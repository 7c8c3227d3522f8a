"""The public spelling of a torch callable, for messages and reports.

C functions carry their implementation's home (``torch._VariableFunctionsClass.nonzero``,
``TensorBase.tolist``, ``torch._C._nn.gelu``); users know them as ``torch.nonzero``,
``Tensor.tolist``, ``torch.nn.functional.gelu``. The public namespaces are
searched once, by identity, so the name is the one the user could have typed.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

# most specific first: F.gelu beats torch._C._nn.gelu, torch.linalg.norm beats nothing
_NAMESPACES = ("torch.nn.functional", "torch.linalg", "torch.fft", "torch.special", "torch")
_table: dict[int, str] | None = None


def _build() -> dict[int, str]:
    table: dict[int, str] = {}
    for name in dir(torch.Tensor):
        obj = getattr(torch.Tensor, name, None)
        if callable(obj):
            table.setdefault(id(obj), f"Tensor.{name}")
    for private in (False, True):            # torch._unique2 only when nothing public names it
        for ns in _NAMESPACES:
            mod = importlib.import_module(ns)
            for name in dir(mod):
                if name.startswith("_") != private or name.startswith("__"):
                    continue
                obj = getattr(mod, name, None)
                if callable(obj) and not isinstance(obj, type):
                    table.setdefault(id(obj), f"{ns}.{name}")
    return table


def public_name(fn: Callable) -> str:
    """``torch.nonzero``, ``Tensor.tolist``...; the qualified name when not public."""
    global _table
    if _table is None:
        _table = _build()
    target = getattr(fn, "__func__", fn)
    self_ = getattr(fn, "__self__", None)
    if isinstance(self_, torch.Tensor) or type(self_).__name__ == "TensorProxy":
        name = getattr(fn, "__name__", "")
        if callable(getattr(torch.Tensor, name, None)):
            return f"Tensor.{name}"           # a bound Tensor method
    found = _table.get(id(target))
    if found is not None:
        return found
    if isinstance(fn, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return f"torch.ops.{fn}"
    objclass = getattr(fn, "__objclass__", None)
    if objclass is not None and issubclass(objclass, torch._C.TensorBase):
        return f"Tensor.{fn.__name__}"
    qualname = getattr(fn, "__qualname__", "") or ""
    if qualname.startswith("_VariableFunctionsClass."):    # a C function behind a Python wrapper
        return f"torch.{fn.__name__}"
    mod = getattr(fn, "__module__", None) or ""
    return f"{mod}.{getattr(fn, '__qualname__', getattr(fn, '__name__', repr(fn)))}".lstrip(".")
