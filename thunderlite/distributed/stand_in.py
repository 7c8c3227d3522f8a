"""The module a trace runs in place of one torch's FSDP2 or tensor parallelism
sharded, when a jitted *function* calls it (``jit(loss_fn)`` where ``loss_fn``
calls ``model(x)``), as ``thunderlite.jit(model)`` compiles it whole
(docs/architecture.md §15).

Both wrappers work in forward hooks and ``DTensor`` dispatch a trace does not
see, so the call is redirected to the same view ``from_torch_fsdp2`` or
``from_torch_tp`` builds: gathers and reduce-scatters (or the tensor-parallel
collectives) become symbols of the calling function's trace, and gradients
reach the ``DTensor`` parameters' ``.grad`` by the view's leaf hooks. One view
per module, kept for the module's lifetime, so every trace of every jitted
function reads the same leaves.
"""
from __future__ import annotations

import sys
import weakref

import torch

from thunderlite.distributed.fsdp2 import from_torch_fsdp2, is_fully_shard
from thunderlite.distributed.tp import _tp_hook_parts, from_torch_tp
from thunderlite.distributed.views import ViewModule

# module -> weakref to its view: the view stays alive through the module's
# load_state_dict hook (it re-points the leaves), and dies with the module
_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def sharded_by(module: torch.nn.Module) -> str | None:
    """"fsdp2" for a module ``fully_shard`` was applied to, "tp" for one
    ``parallelize_module`` gave tensor-parallel hooks, else None; cheap, as it
    runs at every module call while tracing."""
    if is_fully_shard(module):
        return "fsdp2"
    if "torch.distributed.tensor" in sys.modules and (module._forward_pre_hooks or module._forward_hooks) \
            and _tp_hook_parts(module)[0]:
        return "tp"
    return None


def stand_in(module: torch.nn.Module) -> ViewModule | None:
    """The view to call instead of ``module``, or None for a module neither
    wrapper sharded. Whatever the view does not translate is refused, by name,
    as ``thunderlite.jit(module)`` refuses it."""
    kind = sharded_by(module)
    if kind is None:
        return None
    ref = _VIEWS.get(module)
    view = ref() if ref is not None else None
    if view is None:
        view = from_torch_fsdp2(module) if kind == "fsdp2" else from_torch_tp(module)
        _VIEWS[module] = weakref.ref(view)
    return view
