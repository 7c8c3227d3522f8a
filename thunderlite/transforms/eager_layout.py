"""Which stride-dependent views eager makes: ``reshape``/``flatten`` return a
view when the strides of their input allow it and a copy otherwise, so whether
a write through the result reaches the input depends on eager's strides of
that input, which follow the program's inputs' strides (an elementwise op's
output takes its inputs' layout).

``eager_aliasing(trace, strides)`` runs the trace's top-level symbols as the
torch calls they were recorded from on meta tensors made with the inputs'
strides (no data, no autograd), and says, for each top-level call whose result
eager may or may not make a view, whether it shares storage with its first
tensor argument. functionalize.py then treats the call as a view or as fresh
memory; the decision holds only for inputs with these strides, so the program
is guarded on them (``inputs_behind``: which inputs the decision read).

A symbol that cannot run on meta tensors leaves its results unknown, and so
everything computed from them: unknown decisions stay "may copy" (eager mode).

Example::

    y = (x * w).t(); z = y.reshape(-1)
    eager_aliasing(trace, {"x": (3, 1), "w": (3, 1)})   # {"z": True}: a view (y is x*w's transpose)
    eager_aliasing(trace, {"x": (1, 3), "w": (3, 1)})   # {"z": False}: x*w takes x's layout, z copies
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


def eager_aliasing(trace: Trace, strides: dict[str, tuple]) -> dict[str, bool]:
    """Output name -> whether eager's result shares storage with the call's
    first tensor argument, for each stride-dependent top-level call whose
    input layout is known (see the module docstring)."""
    env: dict[str, torch.Tensor] = {}
    for a in trace.args:
        if isinstance(a, TensorProxy) and a.name in strides:
            env[a.name] = torch.empty_strided(a.shape, strides[a.name], dtype=a.dtype, device="meta")
    decided: dict[str, bool] = {}
    with torch.no_grad():
        for bsym in trace.bound_symbols:
            if Tag.RETURN in bsym.sym.tags:
                break
            _run(bsym, env)
            if stride_dependent(bsym) and bsym.output.name in env and bsym.tensor_args()[0].name in env:
                decided[bsym.output.name] = _same_storage(env[bsym.output.name], env[bsym.tensor_args()[0].name])
    return decided


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


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def inputs_behind(trace: Trace, names: set[str]) -> set[str]:
    """The trace arguments the values ``names`` are computed from."""
    need = set(names)
    for bsym in reversed(trace.bound_symbols):
        if any(o.name in need for o in bsym.tensor_outs()) or (
                Tag.ALIAS_BARRIER in bsym.sym.tags and any(o.name in need for o in bsym.output)):
            need.update(p.name for p in bsym.tensor_args())
            if Tag.ALIAS_BARRIER in bsym.sym.tags:
                need.update(m.name for m in bsym.args[0])
    return {a.name for a in trace.args if isinstance(a, TensorProxy) and a.name in need}
