"""Differentiation inside a trace: the symbols a program recorded are
differentiated and their forward and backward inlined into the trace that
recorded them, so the gradient is an ordinary part of the program
(docs/architecture.md §9, "torch.func inside a trace" and "Backward inside
the trace"). Nothing of PyTorch's autograd runs; both callers start from
one sub-trace builder (``_sub_trace``: its own alias barriers, so reads after
a write name the new value) and reuse the flattening, the VJP rules, the
reverse sweep and the protection of overwritten values of split.py, tensor
hooks (tensor_hooks.py) included.

Two front doors, one per caller:

- ``linearize(bsyms, wrt, output, names, what)`` (torch.func, frontend/functorch/):
  a sub-trace differentiated with respect to *fresh names* (each level of a
  nested transform tracks only its own). It returns a ``Linearized`` whose
  ``forward`` is inlined, and whose ``backward(cotangents)`` records the
  sweep into the current trace (and may be called again: ``vjp_fn``, ``jvp``,
  ``jacrev`` record it into scratch traces). Where an enclosing level may
  differentiate the gradient again, composites on the gradient path are
  differentiated through their decompositions (the prims' rules give
  gradients made of prims); the backward kernels that have no decomposition
  get VJP rules below that run PyTorch's autograd on them. Eager's error for
  a write into a captured tensor.
- ``inline_backward(bsyms, args, mask, outputs, cotangents, names=...)``
  (``loss.backward()`` / ``torch.autograd.grad`` inside a jitted step,
  frontend/training/traced_autograd.py): the symbols recorded so far,
  differentiated with respect to the *leaves* ``mask`` selects (and captured
  intermediates, ``wrt_values``) by ``split_forward_backward`` (its checks,
  saved values a later write overwrites protected, cheap values recomputed;
  a write on the gradient path that needs a functional rewrite, into a view
  or under no_grad, is refused: the rewrite would leave the memory the host
  reads afterwards unwritten), its
  backward bound to the host's cotangents::

    inl = inline_backward(segment, free, mask, [loss], [ones], names=trace.names)
    trace.bound_symbols[start:] = inl.forward + inl.backward
    grads = inl.grads            # one per free value: a proxy or None

  Symbols whose every output the host already defines (a retained graph
  differentiated again) are not repeated, nor is a registered forward the
  host ran as the same call (its statistics, dropout's mask: the host's
  names); another forward whose rule needs more than the host kept is
  recomputed under fresh names for the outputs the host has.
  ``create_graph=True`` makes the backward differentiable again (docs §9,
  "Double backward").
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from thunderlite.core import dtypes, pytree
from thunderlite.core.aliasing import views, writes
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.retrace import rename_bsym
from thunderlite.core.symbol import BoundSymbol, Symbol, free_tensors, walk
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import current_trace, tracectx
from thunderlite.torch import opaque_symbol_for
from thunderlite.torch.ops.grad_mode import REGISTER_HOOK_ID
from thunderlite.transforms.aliasing.update_aliases import AliasGroups, update_aliases
from thunderlite.transforms.autodiff import rules, symbols
from thunderlite.transforms.autodiff.function import is_function_symbol
from thunderlite.transforms.autodiff.split import (
    REQUIRES_GRAD_ID,
    _accumulate,
    _flatten,
    _needs_eager,
    _opaque_forward,
    _protect_overwritten,
    _sweep,
    _vjp_pairs,
    _where,
    split_forward_backward,
)
from thunderlite.transforms.autodiff.symbols import UNPACK_SAVED
from thunderlite.transforms.autodiff.tensor_hooks import apply_hooks, hooks_of


def _sub_trace(bsyms, args, output, names, name: str) -> Trace:
    """``bsyms`` (reading ``args`` and values of the host freely) as a program
    of their own returning ``output``, sharing the host's name pool, with its
    own alias barriers where it writes (reads after a write name the new
    value, as differentiation needs; the host's own come later)."""
    trc = Trace(name, names=names)
    trc.args = list(args)
    trc.bound_symbols = list(bsyms)
    trc._scopes = [trc.bound_symbols]
    with tracectx(trc):
        trc.set_return(output)
    return update_aliases(trc)


# --- torch.func: a sub-trace with respect to fresh names -------------------------------------

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
    hooks: dict                                # tensor hooks of the values the sub-trace makes or receives
    #                                            (tensor_hooks.py); a marker of a tensor it closed over stays
    #                                            in ``forward``: the enclosing level's backward runs that hook
    kept: dict                                 # name -> the clone of a value a later write of the forward overwrites

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
            _sweep(self.flat, set(self.tracked), grads, vjp, hooks=self.hooks)
            for w in self.wrt:      # an input's hooks see its total gradient, as autograd.grad's captured one
                if w.name in self.hooks and w.name in grads:
                    grads[w.name] = apply_hooks(self.hooks[w.name], grads[w.name], trc)
        finally:
            trc.source = source
            for p, f in flags:
                p.requires_grad = f
        scope = trc._scopes[-1]
        if self.kept:       # a value the forward overwrote: its clone holds what the rules read
            scope[start:] = [rename_bsym(b, self.kept) for b in scope[start:]]
        _exact_requires_grad(scope[start:])
        out = [grads.get(w.name) for w in self.wrt]
        return [self.kept.get(g.name, g) if g is not None else None for g in out]

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
    scratch = _sub_trace(bsyms, wrt, output, names, "sub-trace")
    output = scratch.output                 # renamed after the sub-trace's writes
    scratch = scratch.with_bound_symbols("", scratch.bound_symbols[:-1])
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
    forward, kept = _keep_overwritten(forward, groups, scratch, nested)
    own = {w.name for w in wrt} | {p.name for b in scratch.bound_symbols for p in b.proxy_outs()}
    hooks = hooks_of(scratch, groups, _where, of_args=True)
    forward += [b for b in scratch.bound_symbols if b.sym.id == REGISTER_HOOK_ID and b.args[0].name not in own]
    return Linearized(forward, flat, tracked, list(wrt), output, list(pytree.leaves(output)), handles, groups,
                      {n: h for n, h in hooks.items() if n in own}, kept)


def _keep_overwritten(forward: list[BoundSymbol], groups: AliasGroups, scratch: Trace,
                      differentiable: bool) -> tuple[list, dict]:
    """``forward`` with a clone, taken right before the write, of each value a
    later write overwrites (split.py's ``_protect_overwritten``: where eager
    raises "modified by an inplace operation" the gradient is the correct
    one), and name -> clone for the backward's reads. A clone the backward
    does not read is dead code."""
    outs = [p for b in forward for p in b.tensor_outs()]
    values = [p for p in (*free_tensors(forward), *outs) if type(p) is TensorProxy]
    forward, _, kept = _protect_overwritten(forward, [], values, groups, scratch, differentiable)
    return forward, {p.name: k for p, k in zip(values, kept, strict=True) if k is not p}


def _decomposed_on_path(bsyms, tracked: set[str]) -> list[BoundSymbol]:
    """``bsyms`` with every composite reading a ``tracked`` value replaced by its
    decomposition (recursively); user Functions, opaque ops and symbols whose
    rule is exact again (``rules.register_differentiable_again``) stay whole."""
    out = []
    for bsym in bsyms:
        on_path = any(p.name in tracked for p in bsym.tensor_args())
        if (on_path and bsym.subsymbols and not is_function_symbol(bsym.sym) and Tag.OPAQUE not in bsym.sym.tags
                and not rules.differentiable_again(bsym)):
            subs = bsym.parts()
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


# --- a backward inside the program: recorded symbols with respect to leaves --------------------

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


def graph_of(bsyms, outputs, leaves=frozenset()) -> set[str]:
    """The names of the values requiring grad that ``outputs`` were computed from
    through ``bsyms`` (their autograd graph, the outputs included); ``leaves``:
    values made leaves after they were computed, whose history is not followed."""
    want = {o.name for o in outputs if type(o) is TensorProxy and o.requires_grad}
    seen = set(want)
    for bsym in reversed(bsyms):
        if not any(o.name in want and o.name not in leaves for o in bsym.proxy_outs()):
            continue
        for a in bsym.tensor_args():
            if a.requires_grad:
                want.add(a.name)
                seen.add(a.name)
    return seen


def inline_backward(bsyms: list[BoundSymbol], args: list, mask: list[bool], outputs: list[TensorProxy],
                    cotangents: list[TensorProxy], *, names,
                    defined: Mapping[str, BoundSymbol] | frozenset = frozenset(), wrt_values=(),
                    create_graph: bool = False) -> InlinedBackward:
    """Differentiate ``outputs`` (computed by ``bsyms`` from ``args``) against
    ``cotangents`` with respect to the ``args`` that ``mask`` selects and to
    ``wrt_values`` (values ``bsyms`` compute). ``names``: the host trace's name
    pool; ``defined``: names the host defines before ``bsyms``, each mapped to
    the host symbol making it (see the module docstring). Without ``create_graph`` the backward's values do not require
    grad; with it the backward is differentiable again (``create_graph=True``,
    double backward): composites on the gradient path are differentiated
    through their decompositions, as ``linearize`` does for a nested
    transform, and the backward's values require grad where their inputs do."""
    program = _sub_trace(bsyms, args, (tuple(outputs), tuple(wrt_values)), names, "computation")
    outs, wrt_values = program.output       # the values' newest names after the program's writes
    body = program.bound_symbols[:-1]
    if create_graph:
        body = _decomposed_on_path(body, _leaves(args, mask, body))
    program = program.with_bound_symbols("", body)
    with tracectx(program):
        program.set_return(outs)
    split = split_forward_backward(program, mask, wrt_values=tuple(wrt_values), recompute_norms=not create_graph,
                                   differentiable=create_graph)
    if split.mode != "functional":
        raise NotInlinable(split.eager_reason)
    if split.write_backs or split.epilogue is not None:
        raise NotInlinable("a write into a tensor that requires grad on the gradient path")
    if split.functionalized is not None:     # the host's later reads see the memory, which the rewrite leaves as it was
        at = next((f" at {_where(b)}" for b in bsyms if _writes(b) and b.source is not None
                   and any(a.requires_grad for a in b.tensor_args())), "")
        raise NotInlinable(f"a write on the gradient path that differentiation rewrites functionally (into a "
                           f"view or its base, or one autograd does not record: under no_grad, through .data){at}")
    same: dict[str, Proxy] = {}
    forward = _new_symbols([b for b in split.forward.bound_symbols if Tag.RETURN not in b.sym.tags],
                           defined, names, same)
    bind = {g.name: cotangents[pos] for g, pos in zip(split.grad_args, split.grad_positions, strict=True)}
    bind.update(same)
    taken = set(defined) | {a.name for a in args if isinstance(a, Proxy)}
    taken.update(p.name for b in forward for p in b.proxy_outs())
    backward = _distinct_names([rename_bsym(b, bind) for b in split.backward.bound_symbols
                                if b.sym is not UNPACK_SAVED and Tag.RETURN not in b.sym.tags], taken, names, bind)
    if create_graph:
        _exact_requires_grad(backward)
    else:
        for b in backward:
            for p in b.tensor_outs():
                p.requires_grad = False
    swap = lambda x: bind.get(x.name, x) if isinstance(x, Proxy) else x  # noqa: E731
    result = list(pytree.tree_map(swap, split.backward.output))
    n = len(args)
    return InlinedBackward(forward, backward, result[:n], result[n:])


def _leaves(args, mask, bsyms) -> set[str]:
    """The names a differentiation starts from: the selected arguments and the
    leaves the program makes (``requires_grad_()``)."""
    out = {a.name for a, m in zip(args, mask, strict=True) if m}
    out.update(b.args[0].name for b in bsyms if b.sym.id == REQUIRES_GRAD_ID)
    return out


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


def _new_symbols(bsyms: list[BoundSymbol], defined, names, same: dict) -> list[BoundSymbol]:
    """``bsyms`` less those whose outputs the host already has; the outputs a
    kept symbol shares with the host get fresh names (a recomputation). A
    symbol the host ran as the same call (``defined`` maps each name to the
    host symbol making it: a registered forward's statistics, dropout's mask,
    which the host made under other names) is not run again: ``same`` maps its
    outputs to the host's, for the symbols reading them."""
    if not defined:
        return bsyms
    out = []
    for b in bsyms:
        b = rename_bsym(b, same) if same else b
        outs = b.proxy_outs()
        known = [p for p in outs if p.name in defined]
        if known and len(known) < len(outs) and isinstance(defined, dict):
            host = _same_call(b, defined[known[0].name])
            if host is not None:
                same.update((p.name, h) for p, h in zip(outs, host, strict=True) if p.name != h.name)
                continue
        if outs and len(known) == len(outs) or (not outs and _writes(b)):
            continue
        if known and _writes(b):
            raise NotInlinable(f"differentiating again through {b.sym.id}, which writes memory")
        out.append(rename_bsym(b, {p.name: p.replace(name=names.fresh("t")) for p in known}))
    return out


def _same_call(b: BoundSymbol, host: BoundSymbol) -> list | None:
    """``host``'s outputs where it is the call ``b`` makes (same symbol, same
    arguments, the outputs ``b`` shares with it in the same places), else None."""
    outs, theirs = b.proxy_outs(), host.proxy_outs()
    if host.sym.id != b.sym.id or len(outs) != len(theirs):
        return None
    if [a.name for a in b.proxy_args()] != [a.name for a in host.proxy_args()]:
        return None
    if any(p.name != h.name and p.name in {q.name for q in theirs} for p, h in zip(outs, theirs, strict=True)):
        return None
    return theirs


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


# --- the VJPs of backward kernels without a decomposition ------------------------------------
# Differentiated only when a gradient is differentiated again (grad of grad, a loss on a
# gradient): PyTorch's autograd differentiates the kernel (its double-backward formulas),
# recomputing it at run time, as one opaque call.

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
    impl = impl or sym.impl

    def rule(g, out, *args):
        outs, grads = (out, tuple(g)) if isinstance(out, tuple) else ((out,), (g,))
        grads = tuple(gx for o, gx in zip(outs, grads, strict=True) if isinstance(o, TensorProxy))
        mask = tuple(i in diff for i, a in enumerate(args) if isinstance(a, TensorProxy))
        res = iter(opaque_symbol_for(symbols.autograd_vjp(impl, mask))(grads, args, {}))
        return tuple(next(res) if i in diff and isinstance(a, TensorProxy) else None for i, a in enumerate(args))
    # the rule table pairs results with the kernel's parameters by name
    params = list(inspect.signature(sym.meta).parameters.values())
    rule.__signature__ = inspect.Signature([inspect.Parameter("grad_", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                            inspect.Parameter("out_", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                            *params])
    rules.register_vjp(sym)(rule)


_register_autograd_vjp(symbols.convolution_backward, (0, 1, 2))      # g, input, weight
_register_autograd_vjp(symbols.batch_norm_backward, (0, 1, 2))       # g, input, weight
_register_autograd_vjp(symbols.cross_entropy_backward, (0, 1), cross_entropy_backward_reference)     # g, logits
