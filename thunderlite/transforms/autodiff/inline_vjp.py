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
Where an enclosing level may differentiate the gradient again, composites on
the gradient path are differentiated through their decompositions (the
prims' rules give gradients made of prims); the backward kernels that have no
decomposition get VJP rules below that run PyTorch's autograd on them.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from thunderlite.core import dtypes, pytree
from thunderlite.core.aliasing import views, writes
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, free_tensors, walk
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import current_trace, tracectx
from thunderlite.torch import opaque_symbol_for
from thunderlite.transforms.aliasing.update_aliases import AliasGroups, update_aliases
from thunderlite.transforms.autodiff import rules, symbols
from thunderlite.transforms.autodiff.function import is_function_symbol
from thunderlite.transforms.autodiff.split import (
    _accumulate,
    _flatten,
    _needs_eager,
    _opaque_forward,
    _sweep,
    _vjp_pairs,
    _where,
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
        _exact_requires_grad(trc._scopes[-1][start:])
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


def _exact_requires_grad(bsyms) -> None:
    """The gradient's symbols require grad where an input does (a backward
    kernel's meta says it never does: in the program's own backward nothing
    differentiates it; here an enclosing level may)."""
    for bsym in bsyms:
        for b in walk(bsym):
            if rules.is_non_differentiable(b.sym):
                continue
            need = any(a.requires_grad for a in b.tensor_args())
            for o in b.tensor_outs():
                o.requires_grad = need and dtypes.is_inexact(o.dtype)


def linearize(bsyms: list[BoundSymbol], wrt: list[TensorProxy], output, names, what: str,
              higher_order: bool = False) -> Linearized:
    """``bsyms`` (computing ``output``) ready to differentiate with respect to
    ``wrt``; ``what`` names the transform and the user's line for errors.
    ``higher_order``: the gradient may be differentiated again (the values
    given for ``wrt`` require grad in the enclosing level)."""
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
    captured = _captured_write(scratch.bound_symbols, wrt)
    if captured is not None:
        top, leaf = captured
        line = f" at {_where(top)}" if top.source is not None else ""
        raise RuntimeError(f"During a grad (vjp, jvp, grad, etc) transform, the function provided attempted to call "
                           f"in-place operation ({leaf.sym.id}{line}) that would mutate a captured Tensor. This "
                           "is not supported; please rewrite the function being transformed to explicitly accept "
                           f"the mutated Tensor(s) as inputs. ({what})")
    tracked = {w.name for w in wrt}
    flat: list[BoundSymbol] = []
    nested = higher_order or any(p.requires_grad and p.name not in tracked
                                 for p in free_tensors(scratch.bound_symbols))
    if nested:
        # an enclosing level may differentiate (or batch) this gradient again: the prims' rules,
        # whose gradients are prims, rather than torch-level rules emitting fused kernels and
        # registered forwards returning statistics no rule differentiates
        _flatten(_decomposed_on_path(scratch.bound_symbols, set(tracked)), tracked, flat, None, None)
    else:
        _flatten(scratch.bound_symbols, tracked, flat, None, names)
    groups = AliasGroups.of_trace(scratch)
    reason = _needs_eager(scratch, flat, tracked, groups)
    if reason is not None:
        raise NotImplementedError(f"{what}: thunderlite cannot differentiate {reason} inside the transformed "
                                  "function; compute it out of place")
    forward, handles = _opaque_forward(scratch, flat, tracked)
    return Linearized(forward, flat, tracked, list(wrt), output, list(pytree.leaves(output)), handles, groups)



def _decomposed_on_path(bsyms, tracked: set[str]) -> list[BoundSymbol]:
    """``bsyms`` with every composite reading a ``tracked`` value replaced by its
    decomposition (recursively); user Functions and opaque ops stay whole."""
    out = []
    for bsym in bsyms:
        on_path = any(p.name in tracked for p in bsym.tensor_args())
        if on_path and bsym.subsymbols and not is_function_symbol(bsym.sym) and Tag.OPAQUE not in bsym.sym.tags:
            subs = [s if s.source is not None else s.replace(source=bsym.source) for s in bsym.subsymbols]
            out.extend(_decomposed_on_path(subs, tracked))
            continue
        if on_path:
            tracked.update(o.name for o in bsym.tensor_outs())
        out.append(bsym)
    return out


def _captured_write(bsyms, wrt) -> tuple[BoundSymbol, BoundSymbol] | None:
    """The first leaf writing memory the function did not make (a tensor it
    closed over, a view of one), with its top-level symbol: eager's transforms
    refuse those writes."""
    made = {w.name for w in wrt}
    outside: set[str] = set()
    for bsym in bsyms:
        for b in walk(bsym):
            if b.subsymbols:
                continue
            for out, base in views(b):
                if base.name in outside or base.name not in made:
                    outside.add(out.name)
            if any(dst.name in outside or dst.name not in made for dst, _ in writes(b)):
                return bsym, b
            made.update(p.name for p in b.proxy_outs() if p.name not in outside)
    return None


# --- the VJPs of backward kernels without a decomposition ------------------------------------
# Differentiated only when a gradient is differentiated again (grad of grad, a loss on a
# gradient): PyTorch's autograd differentiates the kernel (its double-backward formulas),
# recomputing it at run time, as one opaque call.

def _autograd_vjp(impl: Callable, diff: tuple[int, ...]) -> Callable:
    """``run(grads, *args)``: the gradients of ``impl(*args)``'s outputs,
    weighted by ``grads``, with respect to the arguments at positions ``diff``."""
    def run(grads, *args):
        with torch.enable_grad():
            ins = list(args)
            for i in diff:
                ins[i] = args[i].detach().requires_grad_()
            outs = impl(*ins)
            outs = outs if isinstance(outs, tuple) else (outs,)
            pairs = [(o, g) for o, g in zip(outs, grads, strict=True)
                     if g is not None and o is not None and o.requires_grad]
            if not pairs:
                return tuple(torch.zeros_like(args[i]) for i in diff)
            res = torch.autograd.grad([o for o, _ in pairs], [ins[i] for i in diff], [g for _, g in pairs],
                                      allow_unused=True)
        return tuple(torch.zeros_like(args[i]) if r is None else r for i, r in zip(diff, res, strict=True))
    run.__name__ = f"{getattr(impl, '__name__', 'kernel').lstrip('_')}_vjp"
    return run


def cross_entropy_backward_reference(g, a, target, ignore_index, reduction):
    """``symbols.cross_entropy_backward`` out of place, so autograd can differentiate it."""
    c_dim = 1 if a.ndim > 1 else 0
    valid = (target != ignore_index).unsqueeze(c_dim)
    safe = target.unsqueeze(c_dim).masked_fill(~valid, 0)
    onehot = torch.zeros_like(a).scatter_add(c_dim, safe, valid.to(a.dtype))
    grad = (torch.softmax(a, c_dim) - onehot) * valid
    if reduction == "mean":
        return grad * (g / valid.sum())
    return grad * (g if reduction == "sum" else g.unsqueeze(c_dim))


def _register_autograd_vjp(sym, diff: tuple[int, ...], impl: Callable | None = None) -> None:
    run = _autograd_vjp(impl or sym.impl, diff)

    def rule(g, out, *args):
        grads = tuple(g) if isinstance(out, tuple) else (g,)
        res = opaque_symbol_for(run)(grads, *args)
        by_pos = dict(zip(diff, res, strict=True))
        return tuple(by_pos.get(i) if isinstance(a, TensorProxy) else None for i, a in enumerate(args))
    # the rule table pairs results with the kernel's parameters by name
    params = list(inspect.signature(sym.meta).parameters.values())
    rule.__signature__ = inspect.Signature([inspect.Parameter("grad_", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                            inspect.Parameter("out_", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                            *params])
    rules.register_vjp(sym)(rule)


_register_autograd_vjp(symbols.convolution_backward, (0, 1, 2))      # g, input, weight
_register_autograd_vjp(symbols.batch_norm_backward, (0, 1, 2))       # g, input, weight
_register_autograd_vjp(symbols.cross_entropy_backward, (0, 1), cross_entropy_backward_reference)     # g, logits
