"""Tensor hooks and ``retain_grad`` in the backward (docs/architecture.md §9).

``t.register_hook(fn)`` inside the program is recorded as a marker symbol
(``ltorch.register_hook``, no output) that the functional forward drops.
``hooks_of(trace)`` reads the markers of values the program makes; the reverse
sweep (split.py ``_sweep``) calls ``apply_hooks`` on the *total* gradient of
such a value, when the symbol producing it takes its output gradient, so each
hook fires once, in order of registration, with what eager's would get, and
what it returns replaces the gradient (None keeps it). A backward traced
inside the program can reuse the same two calls.

A hook is traced into the backward when its function reads traced tensors
(its closure or defaults hold proxies: ``lambda g: g * h.detach()``; the
marker lists them, so DCE keeps them): it is then pure tensor math on
proxies, and what it reads from the forward is saved like any value a rule
reads. Otherwise it is called opaquely when the backward
runs (``autodiff.call_tensor_hook``), so Python state it closes over (a list
it appends to, a counter) changes at each backward, as in eager.

Markers on program *inputs* are not autodiff's: the jit registers the hook on
(or calls ``retain_grad`` of) the caller's tensor after the call
(frontend/compile.py ``_input_hooks``). ``retain_grad`` of a value the program
makes needs the real tensor the caller sees: ``needs_eager`` asks for eager
mode, where that tensor is the one the graph holds.
"""
from __future__ import annotations

from collections.abc import Callable

from thunderlite.core import pytree
from thunderlite.core.aliasing import writes
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol, Symbol, walk
from thunderlite.core.trace import Trace
from thunderlite.torch.ops.grad_mode import REGISTER_HOOK_ID, REQUIRES_GRAD_ID, RETAIN_GRAD_ID
from thunderlite.transforms.aliasing.update_aliases import AliasGroups

HOOK_MARKERS = frozenset({REGISTER_HOOK_ID, RETAIN_GRAD_ID})


def _call_tensor_hook_meta(fn, g):
    return g.replace()


def _call_tensor_hook_impl(fn, g):
    out = fn(g)
    return g if out is None else out


CALL_TENSOR_HOOK = Symbol("call_tensor_hook", meta=_call_tensor_hook_meta, impl=_call_tensor_hook_impl,
                          module="autodiff")
"""A hook whose function is Python the trace cannot hold: called when the backward runs."""


def hooks_of(trace: Trace, groups: AliasGroups, where: Callable[[BoundSymbol], str]) -> dict[str, list[tuple]]:
    """name -> the hooks (in order) of the values ``trace`` makes, each
    ``(function, traced tensors it reads)``. A traced hook reads the tensors
    it closes over as they are when the forward ends (eager's backward sees
    the objects then): one written after the hook was registered is refused."""
    args = {a.name for a in trace.args if isinstance(a, Proxy)}
    hooks: dict[str, list[tuple]] = {}
    for i, bsym in enumerate(trace.bound_symbols):
        if bsym.sym.id == REGISTER_HOOK_ID and bsym.args[0].name not in args:
            reads = bsym.args[2] if len(bsym.args) > 2 else ()
            _check_not_written(bsym, reads, trace.bound_symbols[i + 1:], groups, where)
            hooks.setdefault(bsym.args[0].name, []).append((bsym.args[1], reads))
    return hooks


def _check_not_written(marker: BoundSymbol, reads, later, groups: AliasGroups,
                       where: Callable[[BoundSymbol], str]) -> None:
    roots = {groups.find(p.name) for p in reads}
    if not roots:
        return
    for b in later:
        for leaf in walk(b):
            for dst, _ in writes(leaf):
                if groups.find(dst.name) in roots:
                    raise NotImplementedError(
                        f"the tensor hook registered at {where(marker)} reads a tensor written afterwards, at "
                        f"{where(b)}; "
                        "thunderlite traces such a hook with the values it reads when it is registered, eager reads "
                        "them when the backward runs: register the hook after the write, or pass a clone")


def needs_eager(trace: Trace, where: Callable[[BoundSymbol], str]) -> str | None:
    """``retain_grad`` of a value the program makes, or ``requires_grad_()`` making
    a leaf the caller sees (returned or stored; its ``.grad`` is the caller's):
    the reason eager mode runs the program, where that tensor is the one the
    graph holds."""
    args = {a.name for a in trace.args if isinstance(a, Proxy)}
    visible = {p.name for p in pytree.leaves(trace.output) if isinstance(p, Proxy)}
    for bsym in trace.bound_symbols:
        name = bsym.args[0].name if bsym.args and isinstance(bsym.args[0], Proxy) else None
        if name is None or name in args:
            continue
        if bsym.sym.id == RETAIN_GRAD_ID:
            return f"retain_grad on {name}, a tensor the program makes, at {where(bsym)}"
        if bsym.sym.id == REQUIRES_GRAD_ID and name in visible and _flag(bsym):
            return f"requires_grad_ makes {name} a leaf the caller sees, at {where(bsym)}"
    return None


def _flag(bsym: BoundSymbol) -> bool:
    return bool(bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs.get("requires_grad", True))


def apply_hooks(fns: list[tuple], g: TensorProxy, bwd: Trace) -> TensorProxy:
    """``g`` passed through the hooks ``fns`` (``(function, traced tensors it
    reads)``) in order, recorded into ``bwd`` (the current trace)."""
    for fn, reads in fns:
        if reads:
            out = fn(g)
            if out is not None and type(out) is not TensorProxy:
                raise TypeError(f"a tensor hook returned {type(out).__name__}; it must return a tensor or None")
            g = g if out is None else out
        else:
            out = g.replace(name=bwd.fresh_name("g"))
            bwd.add_bound_symbol(CALL_TENSOR_HOOK.bind(fn, g, output=out))
            g = out
    return g
