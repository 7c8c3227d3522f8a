"""Backward inside a trace: differentiate symbols already recorded and inline
their backward after them (docs/architecture.md §9, "Backward inside the trace").

``inline_backward`` is the routine a trace uses when the program itself asks
for gradients (``loss.backward()``, ``torch.autograd.grad`` inside a jitted
step; docs/architecture.md §9): the symbols recorded so far become a small
program of their own, ``split_forward_backward`` differentiates it, and the
host trace gets the forward (flattened where differentiation needed it, with
the forwards that return what the rules read) followed by the backward, its
incoming gradients bound to the host's values. Nothing of PyTorch's autograd
runs: the gradients are trace values like any other. Example::

    inl = inline_backward(segment, free, mask, [loss], [ones], names=trace.names)
    trace.bound_symbols[start:] = inl.forward + inl.backward
    grads = inl.grads            # one per free value: a proxy or None

Symbols whose every output the host already defines (a retained graph
differentiated again) are not repeated; a forward whose rule needs more than
the host kept (``native_layer_norm``'s statistics) is recomputed under fresh
names for the outputs the host has.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from thunderlite.core import pytree
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.retrace import rename_bsym
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.transforms.autodiff.split import split_forward_backward
from thunderlite.transforms.autodiff.symbols import UNPACK_SAVED


class NotInlinable(NotImplementedError):
    """The recorded symbols cannot be differentiated functionally here (the
    reason names the construct and its line)."""


@dataclass
class InlinedBackward:
    """What ``inline_backward`` gives the host trace (see the module docstring)."""
    forward: list[BoundSymbol]      # replaces the differentiated symbols
    backward: list[BoundSymbol]     # appended after them
    grads: list                     # per argument: its gradient proxy, or None where none reaches it
    value_grads: list               # per ``wrt_values`` entry: its gradient, or None


def free_proxies(bsyms) -> list[Proxy]:
    """Proxies (tensors and numbers) ``bsyms`` read without defining them, in first-use order."""
    defined: set[str] = set()
    free: dict[str, Proxy] = {}
    for bsym in bsyms:
        for p in bsym.proxy_args():
            if p.name not in defined:
                free.setdefault(p.name, p)
        defined.update(p.name for p in bsym.proxy_outs())
    return list(free.values())


def graph_of(bsyms, outputs) -> set[str]:
    """The names of the values requiring grad that ``outputs`` were computed from
    through ``bsyms`` (their autograd graph, the outputs included)."""
    want = {o.name for o in outputs if type(o) is TensorProxy and o.requires_grad}
    seen = set(want)
    for bsym in reversed(bsyms):
        if not any(o.name in want for o in bsym.proxy_outs()):
            continue
        for a in bsym.tensor_args():
            if a.requires_grad:
                want.add(a.name)
                seen.add(a.name)
    return seen


def inline_backward(bsyms: list[BoundSymbol], args: list, mask: list[bool], outputs: list[TensorProxy],
                    cotangents: list[TensorProxy], *, names, defined: set[str] | frozenset = frozenset(),
                    wrt_values=()) -> InlinedBackward:
    """Differentiate ``outputs`` (computed by ``bsyms`` from ``args``) against
    ``cotangents`` with respect to the ``args`` that ``mask`` selects and to
    ``wrt_values`` (values ``bsyms`` compute). ``names``: the host trace's name
    pool; ``defined``: names the host defines before ``bsyms`` (see the module
    docstring). The backward's values do not require grad (it is not itself
    differentiated: ``create_graph=False``)."""
    program = Trace("computation", names=names)
    program.args = list(args)
    program.bound_symbols = list(bsyms)
    program._scopes = [program.bound_symbols]
    with tracectx(program):
        program.set_return(tuple(outputs))
    split = split_forward_backward(program, mask, wrt_values=tuple(wrt_values), recompute_norms=True)
    if split.mode != "functional":
        raise NotInlinable(split.eager_reason)
    if split.write_backs or split.epilogue is not None:
        raise NotInlinable("a write into a tensor that requires grad on the gradient path")
    forward = _new_symbols([b for b in split.forward.bound_symbols if Tag.RETURN not in b.sym.tags],
                           defined, names)
    bind = {g.name: cotangents[pos] for g, pos in zip(split.grad_args, split.grad_positions, strict=True)}
    taken = set(defined) | {a.name for a in args if isinstance(a, Proxy)}
    taken.update(p.name for b in forward for p in b.proxy_outs())
    backward = _distinct_names([rename_bsym(b, bind) for b in split.backward.bound_symbols
                                if b.sym is not UNPACK_SAVED and Tag.RETURN not in b.sym.tags], taken, names, bind)
    for b in backward:
        for p in b.tensor_outs():
            p.requires_grad = False
    swap = lambda x: bind.get(x.name, x) if isinstance(x, Proxy) else x  # noqa: E731
    result = list(pytree.tree_map(swap, split.backward.output))
    n = len(args)
    return InlinedBackward(forward, backward, result[:n], result[n:])


def _distinct_names(bsyms: list[BoundSymbol], taken: set[str], names, swap: dict) -> list[BoundSymbol]:
    """``bsyms`` with every output named like a value of the host (a forward
    value the backward recomputes, ``rematerialize``'s ``gelu``) renamed, and
    their readers with them: one trace, so the forward's value may die where
    its last forward reader is, not where the backward recomputes it. ``swap``
    gets the renamings."""
    out = []
    for b in bsyms:
        b = rename_bsym(b, swap)
        clash = {p.name: p.replace(name=names.fresh("t")) for p in b.proxy_outs() if p.name in taken}
        if clash:
            b = rename_bsym(b, clash)
            swap.update(clash)
        taken.update(p.name for p in b.proxy_outs())
        out.append(b)
    return out


def _new_symbols(bsyms: list[BoundSymbol], defined, names) -> list[BoundSymbol]:
    """``bsyms`` less those whose outputs the host already has; the outputs a
    kept symbol shares with the host get fresh names (a recomputation)."""
    if not defined:
        return bsyms
    out = []
    for b in bsyms:
        outs = b.proxy_outs()
        known = [p for p in outs if p.name in defined]
        if outs and len(known) == len(outs) or (not outs and _writes(b)):
            continue
        if known and _writes(b):
            raise NotInlinable(f"differentiating again through {b.sym.id}, which writes memory")
        out.append(rename_bsym(b, {p.name: p.replace(name=names.fresh("t")) for p in known}))
    return out


def _writes(b: BoundSymbol) -> bool:
    return Tag.INPLACE in b.deep_tags()


class _GraphUsed(torch.autograd.Function):
    """Eager's answer to a backward through a graph a backward already used."""

    @staticmethod
    def forward(ctx, t, retained, anchor):
        ctx.retained = retained
        return t.detach().clone() if t.requires_grad else t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        if ctx.retained:
            raise NotImplementedError(
                "thunderlite: this tensor's graph was differentiated inside the jitted function with "
                "retain_graph=True; the compiled program keeps no autograd graph after the call. Call backward "
                "inside the jitted function, or return the tensor and differentiate outside instead")
        raise RuntimeError(
            "Trying to backward through the graph a second time (or directly access saved tensors after they "
            "have already been freed). Saved intermediate values of the graph are freed when you call "
            ".backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the "
            "graph a second time or if you need to access saved tensors after calling backward.")


def _graph_used_impl(t, retained: bool):
    with torch.enable_grad():
        return _GraphUsed.apply(t, retained, torch.empty(0, requires_grad=True))


def _no_meta(*args, **kwargs):
    raise RuntimeError("graph_used is bound by the jit (inline.py), never traced")


GRAPH_USED = Symbol("graph_used", meta=_no_meta, impl=_graph_used_impl, module="autodiff")
"""A returned tensor whose graph the program's own backward used: it requires
grad (as in eager) and a backward through it raises eager's error."""
