"""The torch language: torch-level symbols decomposed into prims, the table
torch callable -> symbol, and the opaque fallback for everything else.

- ``symbol_for(fn)``: the ltorch Symbol for a torch callable, or None (one dict lookup).
- ``opaque_symbol_for(fn)``: the recorder for a torch callable without a symbol.
- ``get_factory_defaults()``: the (dtype, device) factories read at trace time.

Importing this package fills ``core.proxies.method_table``/``property_table``
(Tensor methods and operators on proxies) and sets the torch-function handler,
so torch functions applied to proxies record into the active trace.

May import ``core`` and ``interpreter``; the symbols live in ``ops/``.
"""
from __future__ import annotations

import torch

from thunderlite.core.proxies import DataDependentError, set_attribute_fallback, set_torch_function_handler
from thunderlite.core.tracectx import made_once
from thunderlite.torch.opaque import OpaqueDataDependentError, opaque_symbol_for, opaque_symbols
from thunderlite.torch.ops import (  # noqa: F401 - each registers its symbols
    composites,
    creation,
    data_dependent,
    distributed,
    elementwise,
    grad_mode,
    indexing,
    inplace,
    linalg,
    nn,
    numbers,
    pooling,
    reductions,
    rng,
    shapes,
)
from thunderlite.torch.ops.creation import get_factory_defaults
from thunderlite.torch.registry import all_symbols, is_opaque, symbol_for, torchsymbol


def record_torch_call(func, args, kwargs):
    """Record ``func(*args, **kwargs)``: its symbol if it has one, else opaque."""
    sym = symbol_for(func)
    if sym is None:
        sym = opaque_symbol_for(func)
    return sym(*args, **kwargs)


set_torch_function_handler(record_torch_call)

__all__ = ["symbol_for", "opaque_symbol_for", "opaque_symbols", "get_factory_defaults", "all_symbols",
           "is_opaque", "torchsymbol", "record_torch_call", "OpaqueDataDependentError"]


def _getter(name: str):
    def get(a):
        return getattr(a, name)
    get.__name__ = name
    return get


_getters: dict = {}


def tensor_attribute_fallback(proxy, name: str):
    """A torch.Tensor method or property with no ltorch symbol: an opaque op
    (a bound method for methods, the recorded value for properties)."""
    attr = getattr(torch.Tensor, name, None)
    if attr is None:
        return None
    if name == "numpy":
        raise DataDependentError("numpy arrays are not traced: Tensor.numpy() reads the tensor's values, "
                                 "which are not known while tracing. Keep the computation in torch, or "
                                 "call .numpy() on the jitted function's result.")
    if callable(attr):
        op = opaque_symbol_for(attr)
        return lambda *args, **kwargs: op(proxy, *args, **kwargs)
    return opaque_symbol_for(made_once(_getters, name, lambda: _getter(name)))(proxy)


set_attribute_fallback(tensor_attribute_fallback)
