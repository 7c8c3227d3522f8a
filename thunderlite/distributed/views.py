"""Views of modules whose parameters torch's distributed wrappers made
``DTensor`` s (FSDP2's ``fully_shard``, tensor parallelism's
``parallelize_module``), for ``thunderlite.jit`` (docs/architecture.md §15).

Those wrappers do their communication in module hooks and in ``DTensor``'s
dispatcher, which a trace does not see. ``fsdp2.py`` and ``tp.py`` therefore
compile a view of the module tree: each module's view has its class (minus
any wrapper mixin), its ``__dict__``, shares its buffers and reads
``training`` from it, but each ``DTensor`` parameter becomes a plain leaf on
the local shard's storage (``local_leaf``: the optimizer's in-place updates
of the ``DTensor`` are the leaf's, and a hook moves the leaf's gradient into
the ``DTensor``'s ``.grad``). The communication the wrapper would have done
is written as traced collectives by the caller.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from thunderlite.core.tracectx import made_once

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def _training_get(self) -> bool:
    return self._view_source.training


def _training_set(self, mode: bool) -> None:
    self._view_source.training = mode


_VIEW_CLASSES: dict[tuple, type] = {}


def view_class(orig: type, properties: dict[str, Any]) -> type:
    """``orig`` plus ``properties`` (by name; their getters must read per-instance
    state, as the class is shared by every view of that shape) and ``training``
    read from the viewed module."""
    key = (orig, tuple(sorted(properties)))
    ns = dict(properties, training=property(_training_get, _training_set))
    return made_once(_VIEW_CLASSES, key, lambda: type(orig.__name__, (orig,), ns))


def view_of(m: torch.nn.Module, cls: type, drop_hooks: bool) -> torch.nn.Module:
    """A view of ``m`` of class ``cls``: same attributes and buffers, its own
    parameter dict (the same parameters, for the caller to replace), its own
    forward-hook dicts (empty when ``drop_hooks``: the wrapper's hooks)."""
    v = object.__new__(cls)
    v.__dict__.update(m.__dict__)
    v.__dict__.pop("training", None)
    v.__dict__["_view_source"] = m          # not a submodule: the view must not own its source
    for hooks in _HOOK_DICTS:
        v.__dict__[hooks] = OrderedDict() if drop_hooks else getattr(m, hooks).copy()
    v.__dict__["_parameters"] = OrderedDict(m._parameters)
    return v


def link_children(model: torch.nn.Module, views: dict[int, torch.nn.Module]) -> None:
    """Point every view's submodules at the views of its module's submodules."""
    for m in model.modules():
        views[id(m)].__dict__["_modules"] = OrderedDict(
            (n, views[id(c)] if c is not None else None) for n, c in m._modules.items())


def local_leaf(module: torch.nn.Module, name: str) -> torch.nn.Parameter:
    """A leaf on the local shard storage of ``module``'s ``DTensor`` parameter
    ``name``, whose gradient lands in that parameter's ``.grad`` as a
    ``DTensor`` with its placements (the parameter is looked up when the
    gradient arrives: ``load_state_dict(assign=True)`` may have replaced it)."""
    param = module._parameters[name]
    leaf = torch.nn.Parameter(param._local_tensor.detach(), requires_grad=param.requires_grad)
    leaf._view_of = (module, name)
    if param.requires_grad:
        leaf.register_post_accumulate_grad_hook(_grad_into(module, name))
    return leaf


def _grad_into(module: torch.nn.Module, name: str):
    from torch.distributed.tensor import DTensor

    def hook(leaf: torch.Tensor) -> None:
        param = module._parameters[name]
        g, leaf.grad = leaf.grad, None
        gd = DTensor.from_local(g.to(param.dtype), param.device_mesh, param.placements,
                                shape=param.shape, stride=param.stride(), run_check=False)
        with torch.no_grad():
            if param.grad is None:
                param.grad = gd
            else:
                param.grad += gd
    return hook


class ViewModule(torch.nn.Module):
    """What ``thunderlite.jit`` compiles for a model a distributed wrapper
    transformed: its forward runs the view (``module``); parameters, buffers
    and ``state_dict`` are the source model's own (the ``DTensor`` s, for
    optimizers and checkpoints; loading a state dict re-points the leaves).
    ``transforms``: run by the jit."""

    def __init__(self, source: torch.nn.Module, view: torch.nn.Module, transforms: tuple = ()):
        super().__init__()
        self.module = view
        self.__dict__["_source"] = source
        self._thunderlite_transforms = transforms
        source.register_load_state_dict_post_hook(self._repoint)

    def _repoint(self, source: torch.nn.Module, incompatible_keys: Any) -> None:
        """After ``load_state_dict`` (with ``assign=True`` FSDP2 re-pads a shard into new
        storage), every leaf is put back on its ``DTensor``'s local tensor."""
        for leaf in self.module.parameters():
            where = getattr(leaf, "_view_of", None)
            if where is not None:
                local = where[0]._parameters[where[1]]._local_tensor
                if leaf.data_ptr() != local.data_ptr() or leaf.shape != local.shape:
                    leaf.data = local.detach()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def named_parameters(self, *args: Any, **kwargs: Any):
        return self._source.named_parameters(*args, **kwargs)

    def named_buffers(self, *args: Any, **kwargs: Any):
        return self._source.named_buffers(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any):
        return self._source.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any):
        return self._source.load_state_dict(*args, **kwargs)
