"""Differentiate a piece of a trace and inline the result: reverse mode for
transforms applied *inside* a traced program (``torch.func.grad``, ``vjp``...,
frontend/functorch/).

``linearize(bsyms, wrt, output, names)`` takes symbols recorded into a scratch
trace (a sub-trace: they read the enclosing trace's values freely) and the
proxies to differentiate with respect to; it returns a ``Linearized`` whose
``forward`` symbols are to be inlined into the enclosing trace (flattened where
differentiation needs it, exactly as ``split_forward_backward`` flattens) and
whose ``backward(cotangents)`` records, into the current trace, the gradients
of ``wrt`` (the VJP rules of rules.py / torch_rules.py, swept in reverse
order, as the program's own backward is built). Nothing is split or saved: the
enclosing trace holds forward and backward in one program, so its own
autodiff can differentiate the gradient again (grad of grad, a loss on a
gradient differentiated by the caller's ``backward()``).

Each level differentiates only from its own ``wrt`` names: values closed over
from outside are constants of this level even where the enclosing level tracks
them (functorch's levels; ``grad(lambda x: grad(lambda y: x * y)(x))(x)`` is 1).
"""
from __future__ import annotations

from dataclasses import dataclass

from thunderlite.core import pytree
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import current_trace, tracectx
from thunderlite.transforms.aliasing.update_aliases import AliasGroups, update_aliases
from thunderlite.transforms.autodiff.split import (
    _accumulate,
    _flatten,
    _needs_eager,
    _opaque_forward,
    _sweep,
    _vjp_pairs,
)


@dataclass
class Linearized:
    """A differentiated sub-trace: ``forward`` to inline, ``backward`` to call."""
    forward: list[BoundSymbol]
    flat: list[BoundSymbol]
    tracked: set[str]
    wrt: list[TensorProxy]
    output: object                             # the output, renamed after the sub-trace's writes
    outputs: list
    handles: dict
    groups: AliasGroups

    def backward(self, cotangents: list) -> list:
        """The gradients of ``wrt`` (None where no path reaches one) given one
        cotangent (or None) per tensor leaf of the output, recorded into the
        current trace."""
        trc = current_trace()
        grads: dict[str, object] = {}
        for o, g in zip(self.outputs, cotangents, strict=True):
            if g is not None and type(o) is TensorProxy and o.name in self.tracked:
                _accumulate(grads, o, g)

        def vjp(bsym: BoundSymbol, g) -> list[tuple]:
            trc.source = bsym.source
            return _vjp_pairs(bsym, g, trc, self.handles, self.groups, None, self.tracked)
        # the rules ask the proxies which inputs want a gradient: this level's
        # values do, and those an enclosing level differentiates keep wanting one
        flags = [(p, p.requires_grad) for p in self._proxies()]
        for p, f in flags:
            p.requires_grad = f or p.name in self.tracked
        source, start = trc.source, len(trc._scopes[-1])
        try:
            _sweep(self.flat, set(self.tracked), grads, vjp)
        finally:
            trc.source = source
            for p, f in flags:
                p.requires_grad = f
        settle_requires_grad(trc._scopes[-1][start:])
        return [grads.get(w.name) for w in self.wrt]

    def _proxies(self) -> list[TensorProxy]:
        seen: dict[int, TensorProxy] = {}
        for bsym in self.flat:
            for b in walk(bsym):
                for p in (*b.tensor_args(), *b.tensor_outs()):
                    seen[id(p)] = p
        return list(seen.values())


def settle_requires_grad(bsyms) -> None:
    """``requires_grad`` as the enclosing level sees it, after recording with
    this level's inputs requiring grad: a value requires grad only where one of
    its inputs does."""
    for bsym in bsyms:
        for b in walk(bsym):
            if not any(a.requires_grad for a in b.tensor_args()):
                for o in b.tensor_outs():
                    o.requires_grad = False


def linearize(bsyms: list[BoundSymbol], wrt: list[TensorProxy], output, names, what: str) -> Linearized:
    """``bsyms`` (computing ``output``) ready to differentiate with respect to
    ``wrt``; ``what`` names the transform and the user's line for errors."""
    scratch = Trace("sub-trace", names=names)
    scratch.args = list(wrt)
    scratch.bound_symbols = list(bsyms)
    scratch._scopes = [scratch.bound_symbols]
    if any(Tag.INPLACE in b.sym.tags for bsym in bsyms for b in walk(bsym)):
        # the sub-trace's own alias barriers: reads after a write name the new value
        with tracectx(scratch):
            scratch.set_return(output)
        renamed = update_aliases(scratch)
        output = renamed.output
        scratch = renamed.with_bound_symbols("", renamed.bound_symbols[:-1])
    tracked = {w.name for w in wrt}
    flat: list[BoundSymbol] = []
    _flatten(scratch.bound_symbols, tracked, flat, None, names)
    groups = AliasGroups.of_trace(scratch)
    reason = _needs_eager(scratch, flat, tracked, groups)
    if reason is not None:
        raise NotImplementedError(f"{what}: thunderlite cannot differentiate {reason} inside the transformed "
                                  "function; compute it out of place")
    forward, handles = _opaque_forward(scratch, flat, tracked)
    return Linearized(forward, flat, tracked, list(wrt), output, list(pytree.leaves(output)), handles, groups)

