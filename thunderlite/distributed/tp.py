"""``thunderlite.jit(m)`` where torch's tensor parallelism
(``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel``)
sharded ``m``'s ``nn.Linear`` layers (docs/architecture.md §15).

``parallelize_module`` makes the layers' parameters ``DTensor`` s and adds
hooks that wrap inputs and unwrap outputs; every op in between is a
``DTensor`` op whose collectives torch's dispatcher adds. Under ``jit`` the
model is compiled as a view (``views.py``) on the local shards, with the
collectives those styles imply written as traced symbols (Megatron's
pairing, the one ``DTensor``'s propagation arrives at for these layouts):

- ``ColwiseParallel()`` (input ``Replicate``, output ``Shard(-1)`` as a local
  tensor): the layer computes its output columns from its weight rows; the
  input's gradient is a partial sum on each rank, so it is all-reduced in the
  backward (identity forward).
- ``RowwiseParallel()`` (input ``Shard(-1)`` local, output ``Replicate``): the
  layer's product is a partial sum, all-reduced in the forward (identity
  backward); the replicated bias is added after it.

Parameter gradients land in the ``DTensor`` parameters' ``.grad`` with their
placements. Any other style, layout option, module type or ``DTensor`` not
made by these styles is refused at ``jit()``, naming it.
"""
from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol

from thunderlite.distributed.views import ViewModule, link_children, local_leaf, view_class, view_of


class _ReplicatedInput(torch.autograd.Function):
    """Identity forward; each rank's gradient is a partial sum: all-reduced."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return funcol.wait_tensor(funcol.all_reduce(g, "sum", ctx.group)), None


class _PartialOutput(torch.autograd.Function):
    """All-reduce forward (the partial sums); the replicated gradient passes through."""

    @staticmethod
    def forward(ctx, x, group):
        return funcol.wait_tensor(funcol.all_reduce(x, "sum", group))

    @staticmethod
    def backward(ctx, g):
        return g, None


def _tp_hook_parts(m: torch.nn.Module) -> tuple[list, list]:
    """(tensor-parallel hooks, other hooks) among ``m``'s forward hooks; a hook
    is tensor-parallel when torch.distributed.tensor defined it."""
    tp, other = [], []
    for hooks in (m._forward_pre_hooks, m._forward_hooks):
        for h in hooks.values():
            code = getattr(h, "__code__", None)
            path = code.co_filename.replace("\\", "/") if code is not None else ""
            (tp if "torch/distributed/tensor/" in path else other).append(h)
    return tp, other


def _is_dtensor(t: Any) -> bool:
    cls = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)     # None while being imported
    return cls is not None and isinstance(t, cls)


def uses_tensor_parallel(module: torch.nn.Module) -> bool:
    """Whether ``module`` has ``DTensor`` parameters or tensor-parallel hooks
    (never true before a program imported ``torch.distributed.tensor``)."""
    if "torch.distributed.tensor" not in sys.modules:
        return False
    return any(_is_dtensor(p) for p in module.parameters()) or any(
        _tp_hook_parts(m)[0] for m in module.modules())


def _refuse(what: str) -> None:
    raise NotImplementedError(
        f"thunderlite.jit of a tensor-parallel model does not support {what}: only nn.Linear layers under "
        "ColwiseParallel() and RowwiseParallel() with their default layouts, on a 1-D mesh, are compiled. "
        "Run that model eagerly, or jit the code between its parallel layers.")


def _closure(fn: Any, name: str) -> Any:
    names = fn.__code__.co_freevars
    return fn.__closure__[names.index(name)].cell_contents if name in names else None


def _hook_style(hooks: list) -> str | None:
    """The class name of the ``ParallelStyle`` that registered ``hooks``, for the
    refusal: ``PrepareModuleInput``/``PrepareModuleOutput`` register lambdas
    closing over the style, ``distribute_module`` closures over its bound methods."""
    for h in hooks:
        owner = _closure(h, "self")
        if owner is not None:
            return type(owner).__name__
        for key in ("input_fn", "output_fn"):
            fn = getattr(_closure(h, key), "func", _closure(h, key))
            if fn is not None:
                return getattr(fn, "__qualname__", repr(fn)).split(".")[0]
    return None


def _style(m: torch.nn.Module, name: str, hooks: list) -> tuple[str, Any]:
    """``("colwise" | "rowwise", mesh)`` for a layer ``parallelize_module`` sharded."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    fns = {k: _closure(h, k) for h in hooks for k in ("input_fn", "output_fn") if _closure(h, k) is not None}
    meshes = {id(_closure(h, "device_mesh")): _closure(h, "device_mesh") for h in hooks}
    inp, out = fns.get("input_fn"), fns.get("output_fn")
    where = f"module {name!r} ({type(m).__name__})"
    if len(hooks) != 2 or inp is None or out is None or len(meshes) != 1:
        _refuse(f"{_hook_style(hooks) or 'the tensor-parallel hooks'} on {where} "
                "(a style other than ColwiseParallel/RowwiseParallel)")
    mesh = next(iter(meshes.values()))
    styles = {
        "colwise": (ColwiseParallel, ((Replicate(),), (Replicate(),)), ((Shard(-1),), True)),
        "rowwise": (RowwiseParallel, ((Shard(-1),), (Shard(-1),)), ((Replicate(),), True)),
    }
    for kind, (cls, in_args, out_args) in styles.items():
        if getattr(inp, "func", None) is cls._prepare_input_fn and getattr(out, "func", None) is cls._prepare_output_fn:
            if not isinstance(m, torch.nn.Linear):
                _refuse(f"{cls.__name__} on {where}: only nn.Linear layers")
            if tuple(inp.args) != in_args or tuple(out.args) != out_args:
                _refuse(f"{cls.__name__}(input_layouts={inp.args[0]}, output_layouts={out.args[0]}, "
                        f"use_local_output={out.args[1]}) on {where}")
            if mesh.ndim != 1:
                _refuse(f"the {mesh.ndim}-D mesh of {where}")
            return kind, mesh
    fn = getattr(inp, "func", inp)
    _refuse(f"{getattr(fn, '__qualname__', repr(fn)).split('.')[0]} on {where}")
    raise AssertionError("unreachable")


def _colwise_in(mod: torch.nn.Module, inputs: tuple) -> tuple:
    return (_ReplicatedInput.apply(inputs[0], mod._tp_group),)


def _rowwise_out(mod: torch.nn.Module, inputs: tuple, out: torch.Tensor) -> torch.Tensor:
    out = _PartialOutput.apply(out, mod._tp_group)
    return out if mod._tp_bias is None else out + mod._tp_bias


def from_torch_tp(model: torch.nn.Module) -> ViewModule:
    """The module ``thunderlite.jit`` compiles for a tensor-parallel model (see
    the module docstring); refuses, naming it, whatever it does not translate."""
    from torch.distributed.tensor import Replicate, Shard
    views: dict[int, torch.nn.Module] = {}
    for name, m in model.named_modules():
        tp, other = _tp_hook_parts(m)
        dparams = {n for n, p in m._parameters.items() if _is_dtensor(p)}
        if not tp:
            if dparams:
                _refuse(f"the DTensor parameter {name + '.' if name else ''}{sorted(dparams)[0]} "
                        "(not made by ColwiseParallel/RowwiseParallel)")
            views[id(m)] = view_of(m, view_class(type(m), {}), drop_hooks=False)
            continue
        if other:
            _refuse(f"another forward hook ({getattr(other[0], '__qualname__', other[0])}) on tensor-parallel "
                    f"module {name!r}")
        kind, mesh = _style(m, name, tp)
        want_w, want_b = (Shard(0), Shard(0)) if kind == "colwise" else (Shard(1), Replicate())
        for pname, want in (("weight", want_w), ("bias", want_b)):
            p = m._parameters.get(pname)
            if p is not None and (not _is_dtensor(p) or tuple(p.placements) != (want,)):
                _refuse(f"{name}.{pname} with placements {getattr(p, 'placements', 'none')} (expected {want})")
        v = view_of(m, view_class(type(m), {}), drop_hooks=True)
        v.__dict__["_tp_group"] = mesh.get_group()
        v._parameters["weight"] = local_leaf(m, "weight")
        bias = local_leaf(m, "bias") if m.bias is not None else None
        if kind == "colwise":
            v._parameters["bias"] = bias
            v.register_forward_pre_hook(_colwise_in)
        else:
            v._parameters["bias"] = None                 # added after the all-reduce
            v._parameters["_tp_bias"] = bias
            v.register_forward_hook(_rowwise_out)
        views[id(m)] = v
    link_children(model, views)
    return ViewModule(model, views[id(model)])
