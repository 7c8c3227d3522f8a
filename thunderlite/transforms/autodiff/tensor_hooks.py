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
(its closure or defaults hold proxies: ``lambda g: g * h.detach()``): it is
then pure tensor math on proxies, and what it reads from the forward is saved
like any value a rule reads. Otherwise it is called opaquely when the backward
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

from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.trace import Trace
from thunderlite.torch.ops.grad_mode import REGISTER_HOOK_ID, RETAIN_GRAD_ID

HOOK_MARKERS = frozenset({REGISTER_HOOK_ID, RETAIN_GRAD_ID})


def _call_tensor_hook_meta(fn, g):
    return g.replace()


def _call_tensor_hook_impl(fn, g):
    out = fn(g)
    return g if out is None else out


CALL_TENSOR_HOOK = Symbol("call_tensor_hook", meta=_call_tensor_hook_meta, impl=_call_tensor_hook_impl,
                          module="autodiff")
"""A hook whose function is Python the trace cannot hold: called when the backward runs."""


def hooks_of(trace: Trace) -> dict[str, list[Callable]]:
    """name -> hook functions (in order) of the values ``trace`` makes."""
    args = {a.name for a in trace.args if isinstance(a, Proxy)}
    hooks: dict[str, list[Callable]] = {}
    for bsym in trace.bound_symbols:
        if bsym.sym.id == REGISTER_HOOK_ID and bsym.args[0].name not in args:
            hooks.setdefault(bsym.args[0].name, []).append(bsym.args[1])
    return hooks


def needs_eager(trace: Trace, where: Callable[[BoundSymbol], str]) -> str | None:
    """``retain_grad`` of a value the program makes: the reason eager mode runs it."""
    args = {a.name for a in trace.args if isinstance(a, Proxy)}
    for bsym in trace.bound_symbols:
        if bsym.sym.id == RETAIN_GRAD_ID and bsym.args[0].name not in args:
            return f"retain_grad on {bsym.args[0].name}, a tensor the program makes, at {where(bsym)}"
    return None


def apply_hooks(fns: list[Callable], g: TensorProxy, bwd: Trace) -> TensorProxy:
    """``g`` passed through ``fns`` in order, recorded into ``bwd`` (the current trace)."""
    for fn in fns:
        if _reads_proxies(fn):
            out = fn(g)
            if out is not None and type(out) is not TensorProxy:
                raise TypeError(f"a tensor hook returned {type(out).__name__}; it must return a tensor or None")
            g = g if out is None else out
        else:
            out = g.replace(name=bwd.fresh_name("g"))
            bwd.add_bound_symbol(CALL_TENSOR_HOOK.bind(fn, g, output=out))
            g = out
    return g


def _reads_proxies(fn: Callable) -> bool:
    cells = getattr(fn, "__closure__", None) or ()
    values = [c.cell_contents for c in cells if _filled(c)]
    values += list(getattr(fn, "__defaults__", None) or ())
    return any(isinstance(v, Proxy) for v in values)


def _filled(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True

