"""Proxy-aware replacements for the builtins and torch helpers a program may call
on proxies. A ``TensorProxy`` stands for a ``torch.Tensor`` (or an
``nn.Parameter`` when it is one), so ``isinstance``/``type``/``torch.is_tensor``
must answer as they would for the real tensor."""
from __future__ import annotations

import builtins
from typing import Any, Callable

import torch

from thunderlite.core.proxies import TensorProxy
from thunderlite.torch import opaque_symbol_for

_CREATION_NAMES = frozenset({
    "zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye", "rand", "randn",
    "randint", "randperm", "tensor", "as_tensor", "zeros_like", "ones_like", "empty_like",
    "full_like", "rand_like", "randn_like", "randint_like", "normal", "scalar_tensor",
    "empty_strided", "tril_indices", "triu_indices", "bernoulli", "multinomial",
})


def is_creation_fn(fn: Callable) -> bool:
    """Creation functions make tensors without tensor inputs; recorded, never run natively."""
    return getattr(fn, "__name__", None) in _CREATION_NAMES


def proxy_type(p: TensorProxy, parameters: set) -> type:
    return torch.nn.Parameter if p.name in parameters else torch.Tensor


def _matches(t: type, cls) -> bool:
    if isinstance(cls, tuple):
        return any(_matches(t, c) for c in cls)
    return isinstance(cls, type) and issubclass(t, cls)


def proxy_aware_builtins(hooks) -> dict:
    """fn -> replacement, for one traced call (``hooks`` gives the state)."""
    params = hooks.state.parameters

    def isinstance_(obj: Any, cls) -> bool:
        if type(obj) is TensorProxy:
            return _matches(proxy_type(obj, params), cls) or _matches(TensorProxy, cls)
        return isinstance(obj, cls)

    def type_(*args):
        if len(args) == 1 and type(args[0]) is TensorProxy:
            return proxy_type(args[0], params)
        return type(*args)

    def is_tensor(obj: Any) -> bool:
        return type(obj) is TensorProxy or torch.is_tensor(obj)

    def set_grad_enabled(mode: bool) -> None:
        hooks.set_grad_enabled(bool(mode))

    def set_autocast_enabled(*args):
        # ``with torch.autocast(..., enabled=False)`` (HF rotary embeddings) is a no-op
        # here because the jit refuses calls under autocast; enabling it is not supported.
        if args and args[-1]:
            raise NotImplementedError("torch.autocast inside a jitted function is not supported by "
                                      "thunderlite yet; cast explicitly with .to(dtype)")
        torch.set_autocast_enabled(*args)

    def vmap(func, *vmap_args, **vmap_kwargs):
        # vmap's machinery is not traceable: the vmapped function is one opaque
        # call whose output metadata comes from a meta-tensor run.
        mapped = torch.vmap(func, *vmap_args, **vmap_kwargs)
        return hooks.recording(opaque_symbol_for(mapped))

    def module_getattr(module, name: str):
        # nn.Module.__getattr__ natively (parameters, buffers, submodules), then the
        # load_attr hook gives the value its provenance (module_slot path).
        return hooks.load_attr(module, name, torch.nn.Module.__getattr__(module, name))

    def module_setattr(module, name: str, value) -> None:
        if not hooks.store_attr(module, name, value):
            torch.nn.Module.__setattr__(module, name, value)

    def object_setattr(obj, name: str, value) -> None:
        if not hooks.store_attr(obj, name, value):
            object.__setattr__(obj, name, value)

    def is_compiling() -> bool:
        # Libraries (HF transformers) skip data-dependent Python checks when compiling.
        return True

    table = {
        torch.compiler.is_compiling: is_compiling,
        torch.nn.Module.__getattr__: module_getattr,
        torch.nn.Module.__setattr__: module_setattr,
        object.__setattr__: object_setattr,
        torch.vmap: vmap,
        torch.func.vmap: vmap,
        builtins.isinstance: isinstance_,
        builtins.type: type_,
        torch.is_tensor: is_tensor,
        torch._C._set_grad_enabled: set_grad_enabled,
        torch.set_autocast_enabled: set_autocast_enabled,
    }
    return table
