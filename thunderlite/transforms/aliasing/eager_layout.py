"""Which stride-dependent views eager makes: ``reshape``/``flatten`` return a
view when the strides of their input allow it and a copy otherwise, so whether
a write through the result reaches the input depends on eager's strides of
that input, which follow the program's inputs' strides (an elementwise op's
output takes its inputs' layout).

``eager_tensors(trace, layouts)`` runs the trace's top-level symbols as the
torch calls they were recorded from on meta tensors made with the inputs'
strides and storage offsets (no data, no autograd); ``eager_aliasing`` says,
for each top-level call whose result eager may or may not make a view, whether
it shares storage with its first tensor argument. ``eager_view`` runs one leaf
view on such a meta tensor: functionalize.py reads eager's layout of opaque
views (``contiguous``, ``as_strided``, ``alias``...) and of written views from
it. functionalize.py then treats each call as a view or as fresh memory; the
decisions hold only for inputs with these strides, so the program is guarded
on them (``inputs_behind``: which inputs the decisions read).

A symbol that cannot run on meta tensors leaves its results unknown, and so
everything computed from them: unknown decisions stay "may copy" (eager mode).

Example::

    y = (x * w).t(); z = y.reshape(-1)
    eager_aliasing(trace, eager_tensors(trace, {"x": ((3, 1), 0), "w": ((3, 1), 0)}))  # {"z": True}: a view
    eager_aliasing(trace, eager_tensors(trace, {"x": ((1, 3), 0), "w": ((3, 1), 0)}))  # {"z": False}: a copy
"""
from __future__ import annotations

import torch

from thunderlite.core import prims, pytree
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace


def stride_dependent(bsym: BoundSymbol) -> bool:
    """A top-level call with a ``prims.reshape`` leaf making its output (eager's
    reshape/flatten/ravel: a view or a copy, depending on strides)."""
    out = bsym.output
    return (isinstance(out, TensorProxy) and bool(bsym.subsymbols)
            and any(b.sym is prims.reshape and b.output is not None and b.output.name == out.name
                    for b in walk(bsym)))


def eager_tensors(trace: Trace, layouts: dict[str, tuple], input_alias_groups=None) -> dict[str, torch.Tensor]:
    """Name -> a meta tensor with eager's shape, strides and storage offset, for
    each top-level value the trace's torch calls give from inputs laid out as
    ``layouts`` says (input name -> (strides, storage offset)); the inputs of
    one of ``input_alias_groups`` share one meta storage. Views share their
    base's meta storage, as in eager; values nothing can run are left out."""
    env: dict[str, torch.Tensor] = {}
    args = {a.name: a for a in trace.args if isinstance(a, TensorProxy) and a.name in layouts}
    for group in [g for g in input_alias_groups or () if all(n in args for n in g)] + [[n] for n in args]:
        if any(n in env for n in group) or len({args[n].dtype for n in group}) != 1:
            continue
        extent = max(_extent(args[n].shape, *layouts[n]) for n in group)
        storage = torch.empty((extent,), dtype=args[group[0]].dtype, device="meta")
        for n in group:
            strides, offset = layouts[n]
            env[n] = storage.as_strided(tuple(args[n].shape), tuple(strides), offset)
    with torch.no_grad():
        for bsym in trace.bound_symbols:
            if Tag.RETURN in bsym.sym.tags:
                break
            _run(bsym, env)
    return env


def eager_aliasing(trace: Trace, env: dict[str, torch.Tensor]) -> dict[str, bool]:
    """Output name -> whether eager's result shares storage with the call's
    first tensor argument, for each stride-dependent top-level call whose
    input layout ``env`` (``eager_tensors``) knows (see the module docstring)."""
    decided: dict[str, bool] = {}
    for bsym in trace.bound_symbols:
        if Tag.RETURN in bsym.sym.tags:
            break
        if stride_dependent(bsym) and bsym.output.name in env and bsym.tensor_args()[0].name in env:
            decided[bsym.output.name] = same_storage(env[bsym.output.name], env[bsym.tensor_args()[0].name])
    return decided


def eager_copies(trace: Trace, input_strides: dict[str, tuple], input_alias_groups=None) -> set[str]:
    """The outputs of the stride-dependent top-level calls (reshape/flatten...)
    eager makes as copies for inputs laid out as ``input_strides`` says: what
    they return is fresh memory, not a view (empty when the trace has none).
    Each decision holds for these strides only: guard ``inputs_behind`` them."""
    if not any(stride_dependent(b) for b in trace.bound_symbols):
        return set()
    decided = eager_aliasing(trace, eager_tensors(trace, input_strides, input_alias_groups))
    return {name for name, shares in decided.items() if not shares}


def _extent(shape, strides, offset: int) -> int:
    """The storage size a strided tensor needs."""
    if not all(shape):
        return offset
    return offset + 1 + sum((n - 1) * st for n, st in zip(shape, strides, strict=True))


def _broadcast(a: torch.Tensor, shape, broadcast_dims) -> torch.Tensor:
    view = [1] * len(shape)
    for d, s in zip(broadcast_dims, a.shape, strict=True):
        view[d] = s
    return a.view(view).expand(shape)


def _squeeze(a: torch.Tensor, dims) -> torch.Tensor:
    for d in sorted((d % a.ndim for d in dims), reverse=True):
        a = a.squeeze(d)
    return a


# the view prims as the torch executor runs them (views of their input; ``reshape``
# only where it is a view: a copy is not the view a chain describes)
_VIEW_PRIMS = {
    prims.slice_prim.meta: lambda a, lo, hi, st=None: a[tuple(
        slice(x, y, z) for x, y, z in zip(lo, hi, st or (1,) * a.ndim, strict=True))],
    prims.reshape.meta: lambda a, shape: a.view(tuple(shape)),
    prims.squeeze.meta: _squeeze,
    prims.permute.meta: lambda a, perm: a.permute(tuple(perm)),
    prims.broadcast_in_dim.meta: _broadcast,
    prims.real.meta: torch.real,
    prims.imag.meta: torch.imag,
}


def eager_view(bsym: BoundSymbol, out: TensorProxy, lookup) -> torch.Tensor | None:
    """The meta tensor eager's leaf view ``bsym`` gives as its output ``out``
    (``lookup(name)``: the meta tensor of each tensor argument), or None when
    it cannot run on them."""
    def meta(x):
        if not isinstance(x, TensorProxy):
            return x
        m = lookup(x.name)
        if m is None:
            raise LookupError(x.name)
        return m
    fn = _VIEW_PRIMS.get(bsym.sym.meta) or bsym.sym.torch_fn
    if fn is None:
        return None
    try:
        args, kwargs = pytree.tree_map(meta, bsym.args), pytree.tree_map(meta, bsym.kwargs)
        with torch.no_grad():
            result = fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - no meta kernel, a copy where a view was asked: unknown
        return None
    outs, got = list(pytree.leaves(bsym.output)), list(pytree.leaves(result))
    if len(outs) != len(got):
        return None
    found = next((t for o, t in zip(outs, got, strict=True) if o is out), None)
    return found if isinstance(found, torch.Tensor) and tuple(found.shape) == tuple(out.shape) else None


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two (meta) tensors share storage."""
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def autograd_view(out: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether autograd sees ``out`` as ``base`` itself or a view of its memory:
    a write into it then changes ``base``'s history, as a scatter would. Not so
    for ``detach()``, ``.data`` and ``unsafe_split``'s pieces: their writes
    change values autograd does not see."""
    root = lambda t: t._base if t._is_view() else t  # noqa: E731
    return out is base or (out._is_view() and root(out) is root(base))


def _run(bsym: BoundSymbol, env: dict) -> None:
    """Put ``bsym``'s outputs, as eager makes them, into ``env`` (or nothing)."""
    if Tag.ALIAS_BARRIER in bsym.sym.tags:        # renamed members: the same memory
        members, _ = bsym.args
        for m, o in zip(members, bsym.output, strict=True):
            if m.name in env:
                env[o.name] = env[m.name]
        return
    fn = bsym.sym.torch_fn
    if fn is None or any(p.name not in env for p in bsym.tensor_args()):
        return
    to_meta = lambda x: env[x.name] if isinstance(x, TensorProxy) else x  # noqa: E731
    args, kwargs = pytree.tree_map(to_meta, bsym.args), pytree.tree_map(to_meta, bsym.kwargs)
    if kwargs.get("device") is not None:
        kwargs["device"] = "meta"
    try:
        result = fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - no meta kernel (or not a torch call): its results stay unknown
        return
    outs = [o for o in pytree.leaves(bsym.output)]
    got = list(pytree.leaves(result))
    if len(outs) != len(got):
        return
    for o, t in zip(outs, got, strict=True):
        if isinstance(o, TensorProxy) and isinstance(t, torch.Tensor) and t.device.type == "meta" \
                and tuple(t.shape) == tuple(o.shape):
            env[o.name] = t




def inputs_behind(trace: Trace, names: set[str]) -> set[str]:
    """The trace arguments the values ``names`` are computed from."""
    if not names:
        return set()
    need = set(names)
    for bsym in reversed(trace.bound_symbols):
        if any(o.name in need for o in bsym.tensor_outs()) or (
                Tag.ALIAS_BARRIER in bsym.sym.tags and any(o.name in need for o in bsym.output)):
            need.update(p.name for p in bsym.tensor_args())
            if Tag.ALIAS_BARRIER in bsym.sym.tags:
                need.update(m.name for m in bsym.args[0])
    return {a.name for a in trace.args if isinstance(a, TensorProxy) and a.name in need}
