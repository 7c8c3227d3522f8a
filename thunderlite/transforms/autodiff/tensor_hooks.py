"""Tensor hooks and ``retain_grad`` in the backward (docs/architecture.md §9).

``t.register_hook(fn)`` inside the program is recorded as a marker symbol
(``ltorch.register_hook``, no output) that the functional forward drops.
``hooks_of(trace)`` reads the markers of values the program makes; the reverse
sweep (split.py ``_sweep``) calls ``apply_hooks`` on the *total* gradient of
such a value, when the symbol producing it takes its output gradient, so each
hook fires once, in order of registration, with what eager's would get, and
what it returns replaces the gradient (None keeps it). Differentiation
inside a trace (inline.py: a backward called inside the program, a torch.func
transform) uses the same two calls.

A hook that is tensor math (``is_tensor_math``: ``lambda g: g * 3``,
``lambda g: g * h.detach()``) is traced into the backward, where it fuses
with the rest. Any other is called when the backward runs
(``autodiff.call_tensor_hook``), so Python state it closes over (a list it
appends to, a counter, ``print``) changes at each backward, as in eager; the
traced tensors it closes over (listed on the marker, so DCE keeps them) are
saved like any value a rule reads and put in its place for the call
(``grad_mode.with_values``).

Markers on program *inputs* are not autodiff's: the jit registers the hook on
(or calls ``retain_grad`` of) the caller's tensor after the call
(frontend/compile.py ``_input_hooks``). ``retain_grad`` of a value the program
makes needs the real tensor the caller sees: ``needs_eager`` asks for eager
mode, where that tensor is the one the graph holds.
"""
from __future__ import annotations

import dis
import math
import types
from collections.abc import Callable

import torch

from thunderlite.core import pytree
from thunderlite.core.aliasing import writes
from thunderlite.core.proxies import Proxy, TensorProxy, method_table, property_table
from thunderlite.core.symbol import BoundSymbol, Symbol, walk
from thunderlite.core.trace import Trace
from thunderlite.torch.ops.grad_mode import REGISTER_HOOK_ID, REQUIRES_GRAD_ID, RETAIN_GRAD_ID, with_values
from thunderlite.transforms.aliasing.update_aliases import AliasGroups

HOOK_MARKERS = frozenset({REGISTER_HOOK_ID, RETAIN_GRAD_ID})


def _call_tensor_hook_meta(fn, g, reads=()):
    return g.replace()


def _call_tensor_hook_impl(fn, g, reads=()):
    out = with_values(fn, reads)(g)
    return g if out is None else out


CALL_TENSOR_HOOK = Symbol("call_tensor_hook", meta=_call_tensor_hook_meta, impl=_call_tensor_hook_impl,
                          module="autodiff")
"""A hook that is more than tensor math, called when the backward runs, as
eager calls it; ``reads``: the values of the traced tensors it closes over."""


def hooks_of(trace: Trace, groups: AliasGroups, where: Callable[[BoundSymbol], str], *,
             of_args: bool = False) -> dict[str, list[tuple]]:
    """name -> the hooks (in order) of the values ``trace`` makes, each
    ``(function, traced tensors it reads)``; ``of_args``: of its arguments too
    (a torch.func level's own inputs, not the caller's tensors). A traced hook
    reads the tensors it closes over as they are when the forward ends
    (eager's backward sees the objects then): one written after the hook was
    registered is refused."""
    args = set() if of_args else {a.name for a in trace.args if isinstance(a, Proxy)}
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
    reads)``) in order, recorded into ``bwd`` (the current trace): traced where
    the hook is tensor math (``is_tensor_math``), else called at run time."""
    for fn, reads in fns:
        if is_tensor_math(fn):
            out = fn(g)
            if out is not None and type(out) is not TensorProxy:
                raise TypeError(f"a tensor hook returned {type(out).__name__}; it must return a tensor or None")
            g = g if out is None else out
        else:
            out = g.replace(name=bwd.fresh_name("g"))
            bwd.add_bound_symbol(CALL_TENSOR_HOOK.bind(fn, g, tuple(reads), output=out))
            g = out
    return g


_MODULES = (torch, torch.nn.functional, math)
_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_ATTR", "DELETE_ATTR", "STORE_SUBSCR",
                     "DELETE_SUBSCR", "STORE_DEREF", "DELETE_DEREF", "IMPORT_NAME", "YIELD_VALUE",
                     "RETURN_GENERATOR", "SEND"})


def is_tensor_math(fn) -> bool:
    """Whether a hook is pure tensor math that tracing reproduces exactly: a
    plain function holding only traced tensors and constants, that reads no
    global but ``torch``/``F``/``math``, names only tensor methods and torch
    functions, writes nothing and makes no nested function. Anything else
    (``print``, a list it appends to, a counter) runs at each backward."""
    code = getattr(fn, "__code__", None)
    if type(fn) is not types.FunctionType or code is None or fn.__kwdefaults__:
        return False
    if any(isinstance(c, types.CodeType) for c in code.co_consts):
        return False
    held = [c.cell_contents for c in fn.__closure__ or () if _filled(c)] + list(fn.__defaults__ or ())
    if not all(isinstance(v, TensorProxy) or type(v) in (int, float, bool, type(None)) for v in held):
        return False
    for ins in dis.get_instructions(code):
        if ins.opname in _WRITES:
            return False
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            if not any(fn.__globals__.get(ins.argval) is m for m in _MODULES):
                return False
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and not _tensor_or_torch_name(ins.argval):
            return False
    return True


def _tensor_or_torch_name(name: str) -> bool:
    return name in method_table or name in property_table or any(hasattr(m, name) for m in _MODULES)


def _filled(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True
