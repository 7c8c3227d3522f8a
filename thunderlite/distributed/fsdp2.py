"""``thunderlite.jit(m)`` where torch's FSDP2 (``fully_shard``) sharded ``m``
(docs/architecture.md §15).

FSDP2 keeps each parameter as a ``DTensor`` sharded on dim 0 and gathers it
in module hooks that swap parameters and run collectives on side streams: a
trace sees none of it. So, as for torch's DDP, the jit compiles what the
wrapper stands for: ``from_torch_fsdp2`` builds a *view* of the module tree
(same classes without FSDP's mixin and hooks, same buffers) in which every
FSDP-managed parameter is a leaf sharing storage with the ``DTensor``'s
local shard, and reading ``module.weight`` gathers it (cast to the reduce
dtype, padded to equal rows, ``all_gather_tensor_autograd``, cut to size,
cast to ``param_dtype``). Traced, that is ``dist.all_gather`` + ``dist.wait``
where the forward uses the parameter; autodiff turns it into a
``dist.reduce_scatter`` of the gradient (in the reduce dtype, averaged over
the ranks as FSDP2 does), and a hook on each leaf moves its gradient into
the ``DTensor`` parameter's ``.grad`` (a ``DTensor`` with the same
placements), where torch's optimizers find it. Groups resharded after
forward have their gathers recomputed in the backward
(``fsdp.regather_in_backward``); the root (FSDP2 keeps it gathered) and
``reshard_after_forward=False`` keep them saved. ``MixedPrecisionPolicy``'s
input and output casts run as forward hooks of the view, as FSDP2's do.

Options that change results and are not honoured raise at ``jit()`` naming
the option. Example::

    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    jm = thunderlite.jit(model)
    opt = torch.optim.AdamW(model.parameters())      # the DTensors
    loss_fn(jm(x_local), y_local).backward(); opt.step()
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol

from thunderlite.distributed.fsdp import SHARD_PREFIX, _AverageGrad, regather_in_backward, shown, without_gradient
from thunderlite.distributed.views import ViewModule, link_children, local_leaf, view_class, view_of
from thunderlite.torch.ops import distributed as d
from thunderlite.transforms.user import Transform


def is_fully_shard(module: torch.nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to ``module`` itself (never true before
    a program imported FSDP2, so nothing is imported here)."""
    cls = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    return cls is not None and isinstance(module, cls)


def uses_fsdp2(module: torch.nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to ``module`` or one of its submodules."""
    return any(is_fully_shard(m) for m in module.modules())


def refuse_fsdp1(module: torch.nn.Module) -> None:
    """torch's first FSDP (``FullyShardedDataParallel``) flattens parameters and
    swaps them in its hooks; it is not translated: refuse it by name."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(fsdp, "FullyShardedDataParallel", None)
    if cls is not None and any(isinstance(m, cls) for m in module.modules()):
        raise NotImplementedError(
            "thunderlite.jit does not support torch's FullyShardedDataParallel (FSDP1): it flattens and swaps "
            "parameters in hooks the trace would not run. Shard with fully_shard (FSDP2), which thunderlite.jit "
            "compiles, or with thunderlite.distributed.fsdp.")


@dataclass(frozen=True)
class RowShard:
    """How one FSDP2 parameter is split: rows of dim 0 over ``group``, each
    rank's chunk padded to ``per`` rows for the gather."""
    rows: int
    per: int
    world: int
    group: Any
    gather_dtype: torch.dtype         # the reduce dtype: the gradient's reduce-scatter runs in it
    param_dtype: torch.dtype          # what the forward computes with

    def unshard(self, local: torch.Tensor) -> torch.Tensor:
        x = local if local.dtype == self.gather_dtype else local.to(self.gather_dtype)
        x = _AverageGrad.apply(x, 1.0 / self.world)
        if x.shape[0] < self.per:
            x = torch.nn.functional.pad(x, (0, 0) * (x.ndim - 1) + (0, self.per - x.shape[0]))
        full = funcol.all_gather_tensor_autograd(x, 0, self.group)[:self.rows]
        return full if full.dtype == self.param_dtype else full.to(self.param_dtype)


def _gathered(module: torch.nn.Module, name: str) -> torch.Tensor:
    # read while tracing, so the compiled program is guarded on the group's gradient sync
    # (set_requires_gradient_sync): a backward outside the program refuses it unsynced
    _ = module._fsdp2_groups[name].reduce_grads
    return module._fsdp2_specs[name].unshard(getattr(module, SHARD_PREFIX + name))


def _refuse(option: str, why: str) -> None:
    raise NotImplementedError(
        f"thunderlite.jit of a module sharded by torch's fully_shard does not support {option}: {why}. "
        "Run that model eagerly, or use thunderlite.distributed.fsdp(m) on the unsharded module.")


def _cast_tree(dtype: torch.dtype, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast_tree(dtype, v) for v in value)
    if isinstance(value, dict):
        return {k: _cast_tree(dtype, v) for k, v in value.items()}
    return value


def _mp_hooks(view: torch.nn.Module, policy: Any) -> None:
    """FSDP2's ``MixedPrecisionPolicy`` casts: floating inputs to ``param_dtype``
    before the module's other pre-hooks, outputs to ``output_dtype`` after."""
    if policy.cast_forward_inputs and policy.param_dtype is not None:
        dt = policy.param_dtype
        view.register_forward_pre_hook(lambda m, a, k: (_cast_tree(dt, a), _cast_tree(dt, k)),
                                       prepend=True, with_kwargs=True)
    if policy.output_dtype is not None:
        out_dt = policy.output_dtype
        view.register_forward_hook(lambda m, a, out: _cast_tree(out_dt, out))


def _check_group(pg: Any) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo
    if type(pg.mesh_info) is not FSDPMeshInfo:
        _refuse(f"a {type(pg.mesh_info).__name__} mesh (HSDP or replicate)", "only a 1-D sharding mesh is translated")
    if isinstance(pg.offload_policy, CPUOffloadPolicy):
        _refuse("offload_policy=CPUOffloadPolicy()", "it keeps shards on the CPU and steps there")
    if pg.gradient_divide_factor is not None:
        _refuse("set_gradient_divide_factor()", "it changes how gradients are averaged")
    if pg.post_forward_mesh_info not in (None, pg.mesh_info):
        _refuse("reshard_after_forward=<int>", "it reshards to a smaller mesh after forward")
    if not pg.is_sharded:
        _refuse("parameters left unsharded", "call model.reshard() before compiling")


def from_torch_fsdp2(model: torch.nn.Module) -> ViewModule:
    """The module ``thunderlite.jit`` compiles for an FSDP2 model (see the module
    docstring). ``fully_shard`` must have been applied to ``model`` itself."""
    from torch.distributed.fsdp import FSDPModule
    if not isinstance(model, FSDPModule):
        raise TypeError(f"from_torch_fsdp2 takes a module fully_shard was applied to, not a "
                        f"{type(model).__name__}: a model holding such modules compiles as it is (each is a root)")
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard
    root_state = fully_shard.state(model)
    root_state._lazy_init()                    # what FSDP2's first forward does: the root is known, shards final
    views: dict[int, torch.nn.Module] = {}
    reshard_leaves: list[torch.nn.Parameter] = []
    sharded: dict[int, tuple[Any, Any]] = {}   # id(module) -> (state, {name: (fsdp_param, group, unit)})
    for unit, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        state = fully_shard.state(m)
        if len(state._modules) != 1:
            _refuse("fully_shard([module, ...]) over several modules", "one FSDP group spans several modules")
        for pg in state._fsdp_param_groups:
            _check_group(pg)
            for fp in pg.fsdp_params:
                info = fp._module_info
                if fp.is_dtensor:
                    _refuse(f"the DTensor parameter {info.param_name!r} (FSDP with tensor parallelism)",
                            "it is sharded on a 2-D mesh")
                if fp.fsdp_placement != Shard(0):
                    _refuse(f"shard_placement_fn ({fp.fsdp_placement} for {info.param_name!r})",
                            "only dim-0 sharding is translated")
                if fp.offload_to_cpu:
                    _refuse("offload_policy=CPUOffloadPolicy()", "it keeps shards on the CPU and steps there")
                # a shared parameter (a tied embedding) is gathered where each of its modules reads it
                for owner, name in ((info.module, info.param_name),
                                    *zip(info.shared_modules, info.shared_param_names, strict=True)):
                    sharded.setdefault(id(owner), (state, {}))[1][name] = (fp, pg, unit)
    units: dict[int, str] = {}                 # id(leaf) -> the FSDP module gathering it (its prefetch unit)
    leaves: dict[int, torch.nn.Parameter] = {}  # id(DTensor parameter) -> its leaf, one for shared modules
    for m in model.modules():
        views[id(m)] = _view(m, sharded.get(id(m)), FSDPModule, reshard_leaves, units, leaves)
    link_children(model, views)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            _mp_hooks(views[id(m)], fully_shard.state(m)._mp_policy)
    trained = {id(leaves[id(p)]): n for n, p in model.named_parameters() if id(p) in leaves and p.requires_grad}
    groups = {unit: pg for unit, m in model.named_modules() if isinstance(m, FSDPModule)
              for pg in fully_shard.state(m)._fsdp_param_groups}
    return ViewModule(model, views[id(model)], (FSDP2Transform(reshard_leaves, units, trained, groups),))


def _view(m: torch.nn.Module, entry: tuple | None, fsdp_module: type, reshard_leaves: list,
          units: dict[int, str], leaves: dict[int, torch.nn.Parameter]) -> torch.nn.Module:
    """``m`` without FSDP: its class minus the mixin, no FSDP hooks, and each
    sharded parameter a leaf on the local shard read through a gathering property."""
    params = entry[1] if entry else {}
    if isinstance(m, fsdp_module):
        state_hooks = {id(h) for h in fsdp_state_hooks(m)}
        for hooks in ("_forward_pre_hooks", "_forward_hooks"):
            for h in getattr(m, hooks).values():
                if id(h) not in state_hooks:
                    _refuse(f"a forward hook ({getattr(h, '__qualname__', h)}) on an FSDP module",
                            "its order relative to FSDP's casts is not kept")
    orig = next(c for c in type(m).__mro__ if not issubclass(c, fsdp_module))
    gathers = {n: property(lambda self, n=n: _gathered(self, n)) for n in params}
    v = view_of(m, view_class(orig, gathers), drop_hooks=isinstance(m, fsdp_module))
    specs, groups = {}, {}
    for name, (fp, pg, unit) in params.items():
        if not len(fp._orig_size):
            _refuse(f"the 0-dim parameter {name!r}", "it cannot be sharded on dim 0")
        pd = fp.param_dtype or fp.orig_dtype
        rd = fp.reduce_dtype or pd
        if rd not in (pd, fp.orig_dtype):
            _refuse(f"reduce_dtype={rd} with param_dtype={pd} for {name!r}",
                    "the gradient would be reduced in a third dtype")
        leaf = leaves.get(id(m._parameters[name]))
        if leaf is None:
            leaf = leaves[id(m._parameters[name])] = local_leaf(m, name)
            leaf._fsdp2_group = pg
            units[id(leaf)] = unit
            if pg._reshard_after_forward:
                reshard_leaves.append(leaf)
        del v._parameters[name]
        v._parameters[SHARD_PREFIX + name] = leaf
        mi = pg.mesh_info
        specs[name] = RowShard(rows=fp._orig_size[0], per=fp.padded_sharded_param_size[0],
                               world=mi.shard_mesh_size, group=mi.shard_process_group,
                               gather_dtype=rd, param_dtype=pd)
        groups[name] = pg
    v.__dict__["_fsdp2_specs"] = specs
    v.__dict__["_fsdp2_groups"] = groups
    return v


def fsdp_state_hooks(m: torch.nn.Module) -> list:
    """The hook functions FSDP2 registered on ``m`` (its state's bound methods)."""
    from torch.distributed.fsdp import fully_shard
    state = fully_shard.state(m)
    return [h for hooks in (m._forward_pre_hooks, m._forward_hooks) for h in hooks.values()
            if getattr(h, "__self__", None) is state]


class FSDP2Transform(Transform):
    """Re-gathers, in the backward, the parameters of groups FSDP2 reshards after
    forward; gathers each FSDP module's parameters as one prefetch group. Also
    for a backward inside the program (a whole training step:
    ``after_inline_autodiff``)."""

    def __init__(self, leaves: list[torch.nn.Parameter], units: dict[int, str], trained: dict[int, str],
                 groups: dict[str, Any]):
        self._groups = groups                 # FSDP module name -> its FSDPParamGroup
        self._ids = {id(p) for p in leaves}
        self._unit_of = units
        self._trained = trained               # id(leaf) -> parameter name, for those requiring grad
        self._shards: set[str] = set()
        self._units: dict[str, str] = {}
        self._leaf_ids: dict[str, int] = {}

    def bind_inputs(self, values: dict[str, Any]) -> None:
        self._shards = {name for name, v in values.items() if id(v) in self._ids}
        self._units = {name: self._unit_of[id(v)] for name, v in values.items() if id(v) in self._unit_of}
        self._leaf_ids = {name: id(v) for name, v in values.items() if id(v) in self._trained}

    def prefetch_units(self) -> dict[str, str]:
        return self._units

    def after_autodiff(self, forward, backward):
        """The compiled backward of a program (run after it, through autograd)."""
        unsynced = sorted({u or "the root" for u, pg in self._groups.items() if not pg.reduce_grads})
        if unsynced:
            _refuse(f"set_requires_gradient_sync(False) (on {shown(unsynced)}) with the backward outside the "
                    "jitted function", "its unsharded gradients would have to outlive the compiled backward; put "
                    "the micro-batches' backward() calls and the optimizer step inside one jitted function")
        return self.after_inline_autodiff(forward, backward)

    def after_inline_autodiff(self, forward, backward):
        """Forward and backward of a ``backward()`` inside the program (a whole
        training step): its gradient sync is the program's (``unsynced_gradient``)."""
        self._refuse_unused(forward.args, backward.return_bsym.args[0])
        if not self._shards:
            return forward, backward
        return regather_in_backward(forward, backward, self._shards)

    def _refuse_unused(self, args: list, grads: Any) -> None:
        """FSDP2 gathers and reduce-scatters whole groups, so a parameter some
        ranks leave unused still pairs up; the compiled program gathers each
        parameter where it is read and reduce-scatters the gradients it has: a
        parameter used on one rank and not another would pair different
        parameters' collectives. Refused at the first call of such a backward."""
        unused = without_gradient(args, grads, self._leaf_ids, self._trained)
        if unused:
            _refuse(f"parameters without gradient in this backward ({shown(unused)})",
                    "which parameters are used may differ between ranks, and the compiled program gathers and "
                    "reduce-scatters each parameter where it is used, so the ranks' collectives would not pair up "
                    "(FSDP2 moves whole groups); set requires_grad=False on parameters that are not trained")


# --- gradient sync (set_requires_gradient_sync) inside a whole training step ---------------------------
def is_set_gradient_sync(fn: Any) -> bool:
    """Whether ``fn`` is ``FSDPModule.set_requires_gradient_sync`` (bound or not)."""
    cls = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    return cls is not None and getattr(fn, "__func__", fn) is cls.set_requires_gradient_sync


def sync_groups(module: torch.nn.Module, recurse: bool = True) -> list[Any]:
    """The FSDP parameter groups ``module.set_requires_gradient_sync`` sets."""
    from torch.distributed.fsdp import FSDPModule, fully_shard
    mods = list(module.modules()) if recurse else [module]
    return [pg for m in mods if isinstance(m, FSDPModule) for pg in fully_shard.state(m)._fsdp_param_groups]


def group_of_leaf(leaf: Any) -> Any:
    """The FSDP parameter group of a view leaf (its gradient sync), else None."""
    return getattr(leaf, "_fsdp2_group", None)


def gradient_reduce_scatters(bsyms: list, grad: Any, start: int) -> tuple[list[int], list[int]] | None:
    """Where, among ``bsyms[start:]`` (a backward), a view leaf's gradient ``grad``
    was reduce-scattered: (the reduce-scatters' indices, the indices of every
    symbol from them to ``grad``: waits, the average, casts), or None when the
    gradient is not one chain of one-tensor symbols from one reduce-scatter (a
    parameter shared by several modules adds two)."""
    producer = {p.name: k for k in range(start, len(bsyms)) for p in bsyms[k].proxy_outs()}
    chain: list[int] = []
    name = grad.name
    while True:
        k = producer.get(name)
        if k is None:
            return None
        b = bsyms[k]
        chain.append(k)
        if b.sym.id == d.reduce_scatter.id:
            return [k], chain
        args = b.tensor_args()
        if len(args) != 1:
            return None
        name = args[0].name
