"""``fsdp(module)``: fully sharded data parallelism (ZeRO-3) under
``thunderlite.jit`` (docs/architecture.md §15).

Every parameter is flattened, padded to a multiple of the group size and
split: each rank keeps one 1-D shard as the module's real parameter
(``_fsdp_shard_<name>``; optimizers step on shards). Reading the parameter
(``module.weight``) gives the full tensor through a property whose getter,
traced by the jit, records an all-gather of the shards: so the forward
trace gathers each parameter where it is used, autodiff turns that gather
into a reduce-scatter of its gradient (the collectives' VJP rules), and a
gradient-scaling identity makes it the average over ranks (data-parallel
semantics: the same update as one process training on the whole batch).

``reshard_after_forward=True`` (the default) frees gathered parameters after
the forward: ``FSDPTransform`` rewrites the saved-for-backward values that
are computed from shards alone (the gather and the views of its result) so
the backward gathers them again from the shard. ``False`` keeps them saved.
``full_state_dict(model)`` gathers the whole parameters (original names).

Example::

    model = thunderlite.jit(fsdp(Net()))
    opt = torch.optim.AdamW(model.parameters())      # shards
    loss_fn(model(x_local), y_local).backward(); opt.step()
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from thunderlite.core import pytree
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.trace import Trace
from thunderlite.torch.ops import distributed as d
from thunderlite.transforms.autodiff.symbols import UNPACK_SAVED
from thunderlite.transforms.user import Transform

SHARD_PREFIX = "_fsdp_shard_"


@dataclass(frozen=True)
class ShardSpec:
    name: str                  # the parameter's name on its module
    shape: tuple
    numel: int
    world: int
    group: Any


class _AverageGrad(torch.autograd.Function):
    """Identity forward; the gradient is scaled (1 / group size): the gather's
    reduce-scatter sums the ranks' gradients, data parallelism averages them."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.factor, None


def unshard(shard: torch.Tensor, spec: ShardSpec) -> torch.Tensor:
    """The full parameter from this rank's shard (differentiable: gather forward,
    averaged reduce-scatter backward)."""
    scaled = _AverageGrad.apply(shard, 1.0 / spec.world)
    flat = funcol.all_gather_tensor_autograd(scaled, 0, spec.group)
    return flat[:spec.numel].view(spec.shape)


def _full_param(module: torch.nn.Module, name: str) -> torch.Tensor:
    spec = module._fsdp_specs[name]
    return unshard(getattr(module, SHARD_PREFIX + name), spec)


def _shard_module(m: torch.nn.Module, group: Any, rank: int, world: int, done: dict[int, tuple]) -> list[str]:
    """Replace ``m``'s parameters by shards; ``done``: id(parameter) -> (shard,
    spec) of those already sharded, so a parameter shared by several modules
    (a tied embedding) stays one shard."""
    names = [n for n, p in m._parameters.items() if p is not None]
    if not names:
        return []
    specs = {}
    for n in names:
        p = m._parameters.pop(n)
        if id(p) not in done:
            per = -(-p.numel() // world)
            flat = torch.zeros(per * world, dtype=p.dtype, device=p.device)
            flat[:p.numel()] = p.detach().reshape(-1)
            shard = torch.nn.Parameter(flat[rank * per:(rank + 1) * per].clone(), requires_grad=p.requires_grad)
            done[id(p)] = (p, shard, ShardSpec(n, tuple(p.shape), p.numel(), world, group))
        _, shard, spec = done[id(p)]
        m.register_parameter(SHARD_PREFIX + n, shard)
        specs[n] = spec
    m._fsdp_specs = specs
    props = {n: property(lambda self, n=n: _full_param(self, n)) for n in names}
    m.__class__ = type(f"FSDP{type(m).__name__}", (type(m),), props)
    return names


def without_gradient(args: list, grads: Any, ids: dict[str, int], trained: dict[int, str]) -> list[str]:
    """Names of the ``trained`` parameters (id -> name) a backward leaves without
    gradient: ``args`` the forward's inputs, ``grads`` the backward's results slot
    for slot, ``ids`` the inputs standing for trained parameters (name -> id).
    Data-parallel transforms refuse them: another rank may use them, and the
    collectives made from this rank's gradients would not pair up."""
    reached = {ids[a.name] for a, g in zip(args, grads, strict=True)
               if getattr(a, "name", None) in ids and type(g) is TensorProxy}
    return [n for i, n in trained.items() if i not in reached]


def shown(names: list[str], most: int = 4) -> str:
    """The first ``most`` of ``names`` for an error message, and ``...`` past them."""
    return f"{names[:most]}{' ...' if len(names) > most else ''}"


class FSDPTransform(Transform):
    """Re-gathers, in the backward, the saved values that come from shards alone."""

    def __init__(self, module: FSDPModule):
        self.module = module
        self._shards: set[str] = set()
        self._units: dict[str, str] = {}
        self._trained: dict[int, str] = {}
        self._ids: dict[str, int] = {}

    def bind_inputs(self, values: dict[str, Any]) -> None:
        unit = {id(p): mname for mname, m in self.module.module.named_modules()
                for n, p in m._parameters.items() if n.startswith(SHARD_PREFIX)}
        self._units = {name: unit[id(v)] for name, v in values.items() if id(v) in unit}
        self._shards = set(self._units)
        self._trained = {id(getattr(m, SHARD_PREFIX + n)): full for full, m, n in self.module._sharded
                         if getattr(m, SHARD_PREFIX + n).requires_grad}
        self._ids = {name: id(v) for name, v in values.items() if id(v) in self._trained}

    def prefetch_units(self) -> dict[str, str]:
        """A module's parameters are gathered together (its shards' unit: the module)."""
        return self._units

    def after_autodiff(self, forward: Trace, backward: Trace) -> tuple[Trace, Trace]:
        unused = without_gradient(forward.args, backward.return_bsym.args[0], self._ids, self._trained)
        if unused:
            raise NotImplementedError(
                f"thunderlite.distributed.fsdp: the parameters {shown(unused)} get "
                "no gradient in this backward. Which parameters are used may differ between ranks, and each "
                "parameter is gathered and reduce-scattered where it is used, so the ranks' collectives would not "
                "pair up. Set requires_grad=False on parameters that are not trained.")
        if not self.module.reshard_after_forward or not self._shards:
            return forward, backward
        return regather_in_backward(forward, backward, self._shards)


def _chain(forward_bsyms: list[BoundSymbol], target: str, shards: set[str], producer: dict) -> list[int] | None:
    """Indices of the forward symbols computing ``target`` from shard inputs
    alone, through an all-gather (None when it needs anything else)."""
    needed, stack, gathered = set(), [target], False
    while stack:
        name = stack.pop()
        if name in shards:
            continue
        k = producer.get(name)
        if k is None:
            return None                          # another input: not recomputable from shards
        if k in needed:
            continue
        needed.add(k)
        b = forward_bsyms[k]
        if b.sym.id == d.all_gather.id:
            gathered = True
        stack.extend(p.name for p in b.proxy_args())
    return sorted(needed) if gathered else None


def regather_in_backward(forward: Trace, backward: Trace, shards: set[str]) -> tuple[Trace, Trace]:
    """Saved values computed from shards only (gathered parameters and their
    views) are replaced, in the forward's return, by the shard, and recomputed
    at the top of the backward, so the forward frees the gathered memory.
    Saved values reach the backward two ways (autodiff.py): tensors as its
    leading arguments, the rest through ``autodiff.unpack_saved``; both are
    rewritten slot for slot, so the interface keeps its shape."""
    out, saved, other = forward.output
    body = forward.bound_symbols[:-1]
    producer = {p.name: k for k, b in enumerate(body) for p in b.proxy_outs()}
    shard_of = {a.name: a for a in forward.args if type(a) is TensorProxy and a.name in shards}
    taken = {p.name for p in pytree.leaves((saved, other)) if isinstance(p, Proxy)}
    recompute: set[int] = set()

    def swap(values: tuple) -> tuple[list, list]:
        """(what the forward returns, what the backward receives), slot for slot: a
        shard saved in several slots (a module called several times) is returned
        in each; the backward names the repeats apart, as unused arguments."""
        fwd, bwd = list(values), list(values)
        for k, v in enumerate(values):
            chain = _chain(body, v.name, set(shard_of), producer) if type(v) is TensorProxy else None
            if chain is None:
                continue
            root = next(n for i in chain for n in (p.name for p in body[i].proxy_args()) if n in shard_of)
            shard = shard_of[root]
            recompute.update(chain)
            fwd[k] = shard
            bwd[k] = shard if shard.name not in taken else TensorProxy(
                shape=shard.shape, dtype=shard.dtype, device=shard.device, name=backward.fresh_name("unused"))
            taken.add(bwd[k].name)
        return fwd, bwd
    (fwd_saved, bwd_saved), (fwd_other, bwd_other) = swap(saved), swap(other)
    if not recompute:
        return forward, backward
    defined = {p.name for i in recompute for p in body[i].proxy_outs()}
    if defined & {p.name for p in pytree.leaves((fwd_saved, fwd_other)) if isinstance(p, Proxy)}:
        return forward, backward                  # a chain value is also saved directly: keep as is
    fwd = forward.with_bound_symbols("FSDP reshard after forward", body)
    fwd.set_return((out, tuple(fwd_saved), tuple(fwd_other)))
    bsyms = list(backward.bound_symbols)
    lead = 0
    if bsyms and bsyms[0].sym is UNPACK_SAVED:
        bsyms[0] = bsyms[0].replace(output=tuple(bwd_other))
        lead = 1
    chain_bsyms = [body[i] for i in sorted(recompute)]
    bwd = backward.with_bound_symbols("FSDP re-gather in backward", bsyms[:lead] + chain_bsyms + bsyms[lead:])
    bwd.args = [*bwd_saved, *backward.args[len(saved):]]
    return fwd, bwd


class FSDPModule(torch.nn.Module):
    """``module`` with its parameters sharded across ``group``; run it under
    ``thunderlite.jit`` (eagerly it also works, gathering through
    ``torch.distributed``'s functional collectives)."""

    def __init__(self, module: torch.nn.Module, *, group: Any = None, reshard_after_forward: bool = True,
                 broadcast_from: int = 0):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("thunderlite.distributed.fsdp needs an initialized process group "
                               "(torch.distributed.init_process_group)")
        self.group = group if group is not None else dist.group.WORLD
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, dist.get_global_rank(self.group, broadcast_from), group=self.group)
        self.module = module
        self.reshard_after_forward = reshard_after_forward
        self._sharded: list[tuple[str, torch.nn.Module, str]] = []
        done: dict[int, tuple] = {}
        for mname, m in list(module.named_modules()):
            for n in _shard_module(m, self.group, rank, world, done):
                self._sharded.append((f"{mname}.{n}" if mname else n, m, n))
        self._thunderlite_transforms = (FSDPTransform(self),)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


@torch.no_grad()
def full_state_dict(model: torch.nn.Module) -> OrderedDict[str, torch.Tensor]:
    """The unsharded parameters and the buffers of an ``fsdp`` module (or a jitted
    one), under the original module's names. Every rank must call it."""
    inner = getattr(model, "_model", model)        # thunderlite.jit(fsdp(...)) keeps it as _model
    if not isinstance(inner, FSDPModule):
        raise TypeError(f"full_state_dict expects a module returned by thunderlite.distributed.fsdp, "
                        f"got {type(inner).__name__}")
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for full_name, m, n in inner._sharded:
        spec = m._fsdp_specs[n]
        shard = getattr(m, SHARD_PREFIX + n)
        flat = torch.empty(shard.numel() * spec.world, dtype=shard.dtype, device=shard.device)
        dist.all_gather_into_tensor(flat, shard.detach().contiguous(), group=spec.group)
        out[full_name] = flat[:spec.numel].view(spec.shape).clone()
    for name, b in inner.module.named_buffers():
        out[name] = b.detach().clone()
    return out


def fsdp(module: torch.nn.Module, *, group: Any = None, reshard_after_forward: bool = True,
         broadcast_from: int = 0) -> FSDPModule:
    """Shard ``module``'s parameters across ``group`` (default: the whole world)."""
    return FSDPModule(module, group=group, reshard_after_forward=reshard_after_forward,
                      broadcast_from=broadcast_from)
