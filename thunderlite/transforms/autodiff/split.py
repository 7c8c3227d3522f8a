"""Reverse-mode autodiff over traces: a forward trace and a backward trace
(docs/architecture.md §9).

``split_forward_backward(trace, requires_grad_mask)`` takes the computation
trace (after update_aliases and DCE) and says which of its arguments require
grad. It returns a ``GradSplit``:

- ``forward``: the program, flattened where differentiation needed it, that
  returns ``(output, saved_tensors, saved_other)``;
- ``backward``: ``backward(*saved_tensors, saved_other, *grads)`` returning one
  gradient (or None) per argument of the computation trace. ``grads`` are the
  gradients of the distinct differentiable output proxies; ``grad_positions``
  gives, for each, its first position among the output's tensor leaves
  (``differentiable_outputs`` marks every such position).

How it works: every top-level symbol on a gradient path either has a VJP rule
(autodiff/rules.py, one table keyed by symbol id), is opaque (``Tag.OPAQUE``:
its VJP comes from PyTorch's own autograd, see below) or is a composite that is
replaced by its subsymbols, recursively. A leaf without a rule is an error that
names it. The backward is recorded by calling the rules, in reverse order, into
a new trace; every forward value a rule reads becomes a *saved* value.

Saved values are split so that memory can be freed early without losing
PyTorch's safety checks: arguments and outputs of the program go to
``ctx.save_for_backward`` (eager's "modified by an inplace operation" check
applies to them, and saving an output there creates no reference cycle);
intermediates nobody else can see travel in a plain list that the backward
empties on entry (``autodiff.unpack_saved``), so each is freed right after its
last use in the backward. ``rematerialize.py`` then replaces saved outputs of
cheap elementwise chains by their recomputation in the backward.

Opaque ops: the forward runs the real op with autograd enabled on detached
inputs and keeps the small autograd graph it builds (what eager would keep for
that op, no more) as a saved handle; the backward calls ``torch.autograd.grad``
on it and drops it. Re-running the op in the backward instead would save the
same inputs but pay the op twice and be wrong for random ops.

In-place ops: after update_aliases an in-place op is a functional op plus
``copy_(src, dst)``, whose VJP treats the result as "the tensor's new value is
src" (all the gradient to src, none to the overwritten value). A saved value
whose memory a later write overwrites is saved as a clone taken right before
that write, so where eager raises "modified by an inplace operation" the
gradient is the mathematically correct one. Writes into tensors that alias
others (views, viewed bases, arguments) on a gradient path have no functional
form in the trace: the barriers say *that* a group changed, not *how*;
functionalize.py rewrites them functionally (written arguments become extra
outputs, ``GradSplit.write_backs``, that the caller copies in; writes autograd
does not record, under no_grad or through ``detach()``/``.data``, become
``overwrite_values``: new values, the old history). For the programs
it cannot rewrite ``GradSplit.mode`` is ``"eager"``: the caller runs the ordinary
trace with autograd on, so outputs, gradients and errors are exactly eager's. A
symbol with its own rule owns the writes hidden in its decomposition
(batch_norm's running statistics carry no gradient, as in eager).

Which arguments get a gradient (None vs zeros) follows eager's graph: an
in-place op keeps the overwritten tensor's history connected, so an argument
reached only through overwritten values gets zeros (``GradSplit.grad_reach``).
An opaque op's graph (``opaque_with_graph``) whose outputs no gradient reaches
is not differentiated, as eager's backward never visits its node: a mutating
custom op with no autograd formula raises only when it is reached.

Also here: user ``torch.autograd.Function`` subclasses (autodiff/function.py:
their forward is inlined, their backward is the VJP) and ``requires_grad_``
inside the program (``REQUIRES_GRAD_ID``: a new leaf).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from thunderlite.core import dtypes, prims, pytree
from thunderlite.core.aliasing import views, writes
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol, free_proxies, walk
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.core.tracectx import current_trace, tracectx
from thunderlite.torch import opaque_symbol_for
from thunderlite.torch.ops.grad_mode import requires_grad_marker
from thunderlite.transforms.aliasing.eager_layout import eager_aliasing, eager_tensors, inputs_behind
from thunderlite.transforms.aliasing.functionalize import (
    DETACH,
    EagerRaises,
    NotFunctionalizable,
    functionalize,
    overwrite_values,
)
from thunderlite.transforms.aliasing.update_aliases import AliasGroups, update_aliases
from thunderlite.transforms.aliasing.write_backs import take_write_backs
from thunderlite.transforms.autodiff import (
    attention,  # noqa: F401  (registers attention's kernels and rules)
    collective_rules,  # noqa: F401  (registers the collectives' rules)
    rules,
    torch_rules,  # noqa: F401  (registers the torch-level rules)
)
from thunderlite.transforms.autodiff import executors as ad_executors
from thunderlite.transforms.autodiff.function import differentiable_outputs as fn_differentiable_outputs
from thunderlite.transforms.autodiff.function import function_vjp, is_function_symbol
from thunderlite.transforms.autodiff.rematerialize import rematerialize
from thunderlite.transforms.autodiff.symbols import OPAQUE_BACKWARD, OPAQUE_WITH_GRAPH, UNPACK_SAVED, autograd_vjp
from thunderlite.transforms.autodiff.tensor_hooks import HOOK_MARKERS, apply_hooks, hooks_of
from thunderlite.transforms.autodiff.tensor_hooks import needs_eager as hooks_need_eager
from thunderlite.transforms.dce import dce


class MissingGradRuleError(NotImplementedError):
    """A symbol on a gradient path has no VJP rule and no decomposition."""


@dataclass
class GradSplit:
    """The result of ``split_forward_backward``; see the module docstring."""
    mode: str                                  # "functional" or "eager"
    forward: Trace | None = None
    backward: Trace | None = None
    differentiable_outputs: list[bool] = field(default_factory=list)
    saved_tensors: list = field(default_factory=list)
    saved_other: list = field(default_factory=list)
    grad_args: list = field(default_factory=list)
    grad_positions: list[int] = field(default_factory=list)   # tensor-leaf index of each grad arg
    grad_reach: list[frozenset] = field(default_factory=list)  # argument indices each grad arg reaches,
    #                                                            and the names of the opaque graphs it crosses
    graphs: frozenset = frozenset()            # names of the opaque graph handles (in saved_other)
    eager_trace: Trace | None = None           # eager mode: the trace to run with autograd on
    eager_reason: str = ""                     # eager mode: why the program could not be differentiated here
    functionalized: Trace | None = None        # functional mode reached by functionalize.py
    write_backs: tuple = ()                    # argument indices the caller copies the extra outputs into
    quiet_write_backs: tuple = ()              # those copied without autograd recording (no_grad/detach writes)
    epilogue: tuple | None = None              # (trace, output positions): written inputs and views returned
    stride_inputs: tuple = ()                  # arguments whose strides decided a reshape's view-or-copy
    placed_inputs: tuple = ()                  # arguments sharing storage whose strides and offsets were used


def _is_diff_tensor(p) -> bool:
    return type(p) is TensorProxy and dtypes.is_inexact(p.dtype) and p.requires_grad


def _on_path(bsym: BoundSymbol, tracked: set[str]) -> bool:
    return any(p.name in tracked for p in bsym.tensor_args())


def _track_outputs(bsym: BoundSymbol, tracked: set[str]) -> None:
    """Outputs on a gradient path require grad as their proxies say; a write
    makes its destination require grad when the written value does (eager).
    A write autograd does not see (its value is not tracked: into a
    ``detach()``/``.data`` alias) leaves every member's flag as it was."""
    if Tag.ALIAS_BARRIER in bsym.sym.tags and not any(a.name in tracked for a in bsym.args[1]):
        for m, o in zip(bsym.args[0], bsym.output, strict=True):
            if m.name in tracked:
                tracked.add(o.name)
        return
    writer = bsym.sym is prims.copy_ or Tag.ALIAS_BARRIER in bsym.sym.tags
    for o in bsym.tensor_outs():
        if _is_diff_tensor(o) or (writer and dtypes.is_inexact(o.dtype)):
            tracked.add(o.name)


REQUIRES_GRAD_ID = requires_grad_marker.id
"""``x.requires_grad_(flag)`` inside the program: a symbol with this id and no
output (the torch language sets the proxy's flag at trace time) makes ``x`` a
new leaf of the differentiated program, or stops tracking it."""


GRAD_MODE_ID = "ltorch.set_grad_enabled"
"""A grad-mode switch (``torch.no_grad()``...) recorded by the jit: the functional
forward/backward drop it; the eager-mode replay runs it."""


def _new_leaf_needs_eager(trace: Trace, mask, new_leaves: bool = False) -> str | None:
    """``requires_grad_`` on an argument (it changes the caller's tensor), or
    ``requires_grad_(True)`` in a program none of whose arguments requires grad:
    the autograd.Function bridge cannot express these, so eager mode runs the
    program and PyTorch records the graph. Returns the reason, or None.
    ``new_leaves``: the caller differentiates with respect to values
    (``wrt_values``: a backward inside the program), so new leaves need no bridge."""
    args = {a.name for a in trace.args if isinstance(a, Proxy)}
    for bsym in trace.bound_symbols:
        if bsym.sym.id != REQUIRES_GRAD_ID:
            continue
        flag = bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs.get("requires_grad", True)
        if bsym.args[0].name in args:
            return f"requires_grad_ on the program input {bsym.args[0].name} at {_where(bsym)}"
        if flag and not any(mask) and not new_leaves:
            return f"requires_grad_(True) starts a graph no input requires grad for, at {_where(bsym)}"
    return None


@rules.register_vjp(overwrite_values)
def _overwrite_values_vjp(g, out, a, new):
    return g, None


rules.register_non_differentiable(DETACH)     # functionalize.py: a value made under no_grad


def _no_grad_write_on_path(trace: Trace, tracked: set[str], groups: AliasGroups) -> str | None:
    """A write made with grad mode off into storage a tracked value lives in:
    eager keeps the destination's history as it was (the write is invisible to
    autograd); functionalize.py expresses it (``overwrite_values``), and eager
    mode replays it where it cannot. Returns the reason, or None."""
    roots = {groups.find(n) for n in tracked}
    grad = True
    for bsym in trace.bound_symbols:
        if bsym.sym.id == GRAD_MODE_ID:
            grad = bool(bsym.args[0])
        elif not grad and any(groups.find(dst.name) in roots
                              for leaf in _leaves_of(bsym) for dst, _ in writes(leaf)):
            return (f"a write under no_grad into storage a gradient path reads, at {_where(bsym)} (eager keeps "
                    "the tensor's history as it was)")
    return None


def _mark_leaf(bsym: BoundSymbol, tracked: set[str]) -> None:
    a = bsym.args[0]
    flag = bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs.get("requires_grad", True)
    if flag and dtypes.is_inexact(a.dtype):
        tracked.add(a.name)
    else:
        tracked.discard(a.name)


def _meta_tensor(p, tracked: set[str]):
    if type(p) is not TensorProxy:
        return p
    t = torch.empty(p.shape, dtype=p.dtype, device="meta")
    return t.requires_grad_(p.name in tracked)


def _track_opaque_outputs(bsym: BoundSymbol, tracked: set[str]) -> None:
    """Which outputs of an opaque op require grad is PyTorch's call (detach,
    integer outputs, the saved statistics of native_layer_norm...): ask it,
    by running the op on meta tensors with autograd on."""
    try:
        with torch.enable_grad():
            margs = pytree.tree_map(lambda x: _meta_tensor(x, tracked), (bsym.args, bsym.kwargs))
            if "device" in margs[1] and margs[1]["device"] is not None:
                margs[1]["device"] = "meta"
            mout = bsym.sym.torch_fn(*margs[0], **margs[1])
        flags = [o.requires_grad for o in pytree.leaves(mout) if isinstance(o, torch.Tensor)]
    except Exception:  # noqa: BLE001 - an op meta tensors cannot run: trust the proxies' flags
        _track_outputs(bsym, tracked)
        return
    outs = bsym.tensor_outs()
    if len(flags) != len(outs):
        _track_outputs(bsym, tracked)
        return
    for o, f in zip(outs, flags, strict=True):
        if (f or _is_diff_tensor(o)) and dtypes.is_inexact(o.dtype):   # the symbol's meta may know better
            tracked.add(o.name)


class _Owned:
    """Symbols whose differentiation an executor owns (autodiff/executors.py):
    id(bsym) -> its traced grad_transform, or DECOMPOSITION (keep the forward
    call, differentiate the decomposition in the backward)."""
    DECOMPOSITION = "decomposition"

    def __init__(self, executors, trace: Trace):
        self.executors = executors
        self.trace = trace
        self.specs: dict[int, object] = {}

    def take(self, bsym: BoundSymbol) -> bool:
        impl = ad_executors.owner(bsym, self.executors) if self.executors else None
        if impl is None:
            return False
        if impl.grad_transform is not None:
            self.specs[id(bsym)] = ad_executors.split_grad_transform(bsym, impl.grad_transform, self.trace)
            return True
        if rules.has_rule_for(bsym) or not bsym.subsymbols or not ad_executors.recomputable(bsym):
            return False
        self.specs[id(bsym)] = self.DECOMPOSITION
        return True


def _flatten(bsyms, tracked: set[str], out: list, owned: _Owned | None = None, names=None) -> None:
    """Append ``bsyms`` to ``out``, replacing composites on a gradient path that
    have no rule (and no executor owning them) by their subsymbols (recursively),
    and symbols with a registered forward by that forward (it returns what their
    rule reads; ``names``: the trace's name pool)."""
    for bsym in bsyms:
        sym = bsym.sym
        if Tag.RETURN in sym.tags:
            continue
        if sym.id == REQUIRES_GRAD_ID:
            _mark_leaf(bsym, tracked)
            continue
        if sym.id == GRAD_MODE_ID or sym.id in HOOK_MARKERS:     # only the eager replay runs them
            continue
        if not _on_path(bsym, tracked) or rules.is_non_differentiable(sym):
            out.append(bsym)
            continue
        if is_function_symbol(sym):
            out.append(bsym)
            tracked.update(o.name for o in fn_differentiable_outputs(bsym))
            continue
        if Tag.OPAQUE in sym.tags and sym.torch_fn is not None:
            out.append(bsym)
            _track_opaque_outputs(bsym, tracked)
            continue
        if owned is not None and owned.take(bsym):
            out.append(bsym)
            _track_outputs(bsym, tracked)
            continue
        substitute = rules.substitute_forward(bsym, names) if names is not None else None
        if substitute is not None:
            for sub in substitute:
                out.append(sub)
                _track_outputs(sub, tracked)
            continue
        if Tag.ALIAS_BARRIER in sym.tags and _after_owned_write(bsym, out, tracked):
            out.append(bsym)        # the members keep their history, as after a write autograd does not see
            tracked.update(o.name for m, o in zip(bsym.args[0], bsym.output, strict=True) if m.name in tracked)
            continue
        if rules.has_rule_for(bsym) or Tag.ALIAS_BARRIER in sym.tags:
            out.append(bsym)
            _track_outputs(bsym, tracked)
            continue
        if bsym.subsymbols:
            subs = bsym.parts()
            _flatten(subs, tracked, out, owned, names)
            continue
        raise MissingGradRuleError(
            f"no differentiation rule for {sym.id} (a leaf symbol with no decomposition), used at "
            f"{_where(bsym)}; register one with thunderlite.transforms.autodiff.rules.register_vjp")


def _after_owned_write(barrier: BoundSymbol, out: list, tracked: set[str]) -> bool:
    """The barrier follows writes hidden in a composite whose own rule owns them
    (batch_norm's running statistics): they carry no gradient, so the written
    tensor is not made to require grad by the composite's differentiable output."""
    after = {a.name for a in barrier.args[1]}
    for b in reversed(out):
        if any(o.name in after for o in b.tensor_outs()):
            return (bool(b.subsymbols) and rules.has_rule_for(b)
                    and all(dst.name not in tracked for leaf in _leaves_of(b) for dst, _ in writes(leaf)))
    return False


def _where(bsym: BoundSymbol) -> str:
    if bsym.source is None:
        return repr(bsym)
    fname, lineno, text = bsym.source
    return f"{fname}:{lineno} ({text.strip()})" if text else f"{fname}:{lineno}"


def _shared_roots(bsyms, groups: AliasGroups, roots: set[str]) -> None:
    """Add the alias groups that hold a view (looking through decompositions)."""
    for bsym in bsyms:
        for b in walk(bsym):
            if Tag.INPLACE not in b.sym.tags and not b.subsymbols:   # leaves: the views this call made
                roots.update(groups.find(out.name) for out, _ in views(b))


def _needs_eager(trace: Trace, flat, tracked: set[str], groups: AliasGroups,
                 private: frozenset[str] = frozenset()) -> str | None:
    """The reason (or None) when a write on a gradient path lands in a tensor that
    shares storage with another tensor of the program (a view, a viewed base, an
    argument). ``private``: tensors functionalize.py cloned for a custom op to
    write, read by nothing else (what views them later views the new value)."""
    shared = {groups.find(a.name) for a in trace.args if type(a) is TensorProxy}
    _shared_roots(trace.bound_symbols, groups, shared)
    for bsym in flat:
        owned = bsym.subsymbols and rules.has_rule_for(bsym)   # a rule owns its hidden writes (batch_norm stats)
        for dst, _ in (w for leaf in _leaves_of(bsym) for w in writes(leaf)):
            if (owned and dst.name not in tracked) or dst.name in private:
                continue
            on_path = dst.name in tracked or _on_path(bsym, tracked)
            if on_path and groups.find(dst.name) in shared:
                line = f" at {_where(bsym)}" if bsym.source is not None else ""
                return (f"a write on a gradient path into {dst.name}, which shares storage with another tensor "
                        f"of the program (a view, its base, or an input){line}")
    return None


def _owned_writes(flat, tracked: set[str]) -> set[str]:
    """Names written inside composites whose own rule owns those writes
    (batch_norm's running statistics): functionalize leaves them as they are."""
    out = set()
    for bsym in flat:
        if bsym.subsymbols and rules.has_rule_for(bsym):
            out.update(dst.name for leaf in _leaves_of(bsym) for dst, _ in writes(leaf) if dst.name not in tracked)
    return out


def _stale_requires_grad(trace: Trace, tracked: set[str]) -> str | None:
    """After functionalization, a value computed (with grad mode on) from one that
    now requires grad but whose proxy says it does not: its flag was recorded
    before the write made its input require grad (eager's ``x.fill_(1); x.tanh()``
    where ``x`` did not require grad before). Functional autodiff reads those
    flags, so such programs keep the eager-mode replay."""
    grad = True
    for bsym in trace.bound_symbols:
        sym = bsym.sym
        if sym.id == GRAD_MODE_ID:
            grad = bool(bsym.args[0])
            continue
        if (not grad or Tag.RETURN in sym.tags or Tag.ALIAS_BARRIER in sym.tags or Tag.OPAQUE in sym.tags
                or rules.is_non_differentiable(sym) or is_function_symbol(sym) or sym is DETACH):
            continue
        if any(p.name in tracked for p in bsym.tensor_args()):
            for o in bsym.tensor_outs():
                if dtypes.is_inexact(o.dtype) and o.name not in tracked:
                    return (f"{o.name} (at {_where(bsym)}) reads a value that a write made require grad, and its "
                            "requires_grad was recorded before that write")
    return None


def _saved_by_eager(bsym: BoundSymbol, tracked: set[str]) -> list[str] | None:
    """The names of the arguments and outputs of ``bsym`` (a torch call on a
    gradient path) that eager's autograd saves for the backward, asked of
    PyTorch: the call runs on meta tensors with autograd on, and a saved tensor
    is one whose version counter moves with that value's. None where it cannot
    tell (no torch callable, an op meta tensors cannot run)."""
    fn = bsym.sym.torch_fn
    if fn is None or bsym.sym.module == "autograd_function":
        return None
    metas: dict[str, torch.Tensor] = {}

    def meta(p):
        if type(p) is not TensorProxy:
            return torch.device("meta") if isinstance(p, torch.device) else p
        if p.name not in metas:
            t = torch.empty(p.shape, dtype=p.dtype, device="meta")
            metas[p.name] = t.requires_grad_().clone() if p.name in tracked and dtypes.is_inexact(p.dtype) else t
        return metas[p.name]
    saved: list[torch.Tensor] = []
    try:
        margs, mkwargs = pytree.tree_map(meta, (bsym.args, bsym.kwargs))
        if mkwargs.get("device") is not None:
            mkwargs["device"] = "meta"
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t,
                                                                           lambda t: t):
            mout = fn(*margs, **mkwargs)
    except Exception:  # noqa: BLE001 - PyTorch cannot tell here: the caller assumes everything is saved
        return None
    outs = [o for o in pytree.leaves(mout) if isinstance(o, torch.Tensor)]
    if len(outs) != len(bsym.tensor_outs()):
        return None
    metas.update((p.name, o) for p, o in zip(bsym.tensor_outs(), outs, strict=True))
    hit = []
    for name, t in metas.items():
        before = [s._version for s in saved]
        torch.autograd.graph.increment_version(t)
        if any(s._version != v for s, v in zip(saved, before, strict=True)):
            hit.append(name)
    return hit


def _saved_then_unrecorded_write(trace: Trace, tracked: set[str], groups: AliasGroups,
                                 owned: set[str]) -> str | None:
    """A write autograd does not record (under no_grad, through a ``detach()``
    or ``.data`` alias, into a tensor that does not require grad, by a
    ``torch.library.custom_op`` whose kernel writes below autograd) into memory
    that eager's autograd saved earlier for a backward: eager raises "modified
    by an inplace operation" when that backward runs (through ``.data``, whose
    version counter is its own, it differentiates with the new values). A
    functional trace would give the gradient of the old values, so eager mode
    replays the program. Returns the reason, or None."""
    steps, grad = [], True
    for bsym in trace.bound_symbols:
        if bsym.sym.id == GRAD_MODE_ID:
            grad = bool(bsym.args[0])
        elif Tag.RETURN not in bsym.sym.tags and Tag.ALIAS_BARRIER not in bsym.sym.tags:
            steps.append((bsym, grad and _on_path(bsym, tracked)))
    unrecorded = [(i, d) for i, (bsym, on_path) in enumerate(steps)
                  if not on_path or Tag.WRITES_BELOW_AUTOGRAD in bsym.sym.tags
                  for leaf in _leaves_of(bsym) for d, _ in writes(leaf) if d.name not in owned]
    for i, (bsym, on_path) in enumerate(steps):
        later = [(j, d) for j, d in unrecorded if j > i]
        if not later or not on_path or rules.is_non_differentiable(bsym.sym):
            continue
        touched = [p.name for p in (*bsym.tensor_args(), *bsym.tensor_outs())]
        if not any(groups.same(n, d.name) for n in touched for _, d in later):
            continue
        names = _saved_by_eager(bsym, tracked)
        for j, dst in later:
            if any(groups.same(n, dst.name) for n in (touched if names is None else names)):
                return (f"a write autograd does not record (under no_grad, through a detach()/.data alias, or by "
                        f"a custom op) "
                        f"at {_where(steps[j][0])} changes {dst.name}, which eager saved for the backward of "
                        f"{_where(bsym)} (eager's backward raises 'modified by an inplace operation', or "
                        "reads the new values)")
    return None


def _eager_reason(trace: Trace, flat, tracked: set[str], groups: AliasGroups, mask,
                  private: frozenset[str] = frozenset(), new_leaves: bool = False) -> str | None:
    return (_needs_eager(trace, flat, tracked, groups, private) or _new_leaf_needs_eager(trace, mask, new_leaves)
            or _no_grad_write_on_path(trace, tracked, groups) or _stale_reads(flat, tracked)
            or hooks_need_eager(trace, _where))


# in-place ops whose kernel reads an operand other than ``self`` across elements
# (a row, a column, an index): where that operand shares the written memory,
# eager's result depends on the order its kernel visits the elements
_READS_ACROSS = frozenset({"addmm", "baddbmm", "addbmm", "addmv", "addr", "index_add", "index_put", "scatter",
                           "scatter_add"})


def _reads_own_memory(trace: Trace, tracked: set[str], groups: AliasGroups) -> str | None:
    """``v.addmm_(v, w)`` on a gradient path: a functional form would read
    ``v`` before the write, eager's kernel reads it while writing; eager mode
    runs the kernel itself. Returns the reason, or None."""
    for bsym in trace.bound_symbols:
        inplace_of = bsym.sym.inplace_of
        if inplace_of is None or inplace_of.name not in _READS_ACROSS or not bsym.args:
            continue
        dst = bsym.args[0]
        if (type(dst) is TensorProxy and _on_path(bsym, tracked)
                and any(groups.same(p.name, dst.name) for p in bsym.tensor_args()[1:])):
            return (f"{bsym.sym.name} at {_where(bsym)} reads an operand sharing the memory it writes (eager's "
                    "result depends on its kernel's order)")
    return None


def _stale_reads(flat, tracked: set[str]) -> str | None:
    """An op whose only inputs on a gradient path are values a write made
    require grad after their proxies were recorded (``r = torch.zeros(3);
    r += b; r *= 2``: ``r``'s proxies say it requires no grad), so its output's
    proxy says no grad either. Tracking follows those flags, which would drop
    the path; such programs keep the eager-mode replay. (An op under no_grad
    reads a tracked input whose proxy requires grad, and is not one of these.)"""
    for bsym in flat:
        sym = bsym.sym
        if (Tag.RETURN in sym.tags or Tag.ALIAS_BARRIER in sym.tags or Tag.OPAQUE in sym.tags
                or sym is prims.copy_ or rules.is_non_differentiable(sym) or is_function_symbol(sym)
                or sym is DETACH):
            continue
        on_path = [p for p in bsym.tensor_args() if p.name in tracked]
        if not on_path or any(p.requires_grad for p in on_path):
            continue
        for o in bsym.tensor_outs():
            if dtypes.is_inexact(o.dtype) and o.name not in tracked:
                return (f"{o.name} (at {_where(bsym)}) reads only values a write made require grad after "
                        "their requires_grad was recorded")
    return None


def _accumulate(grads: dict, p: TensorProxy, g) -> None:
    if g.dtype != p.dtype and dtypes.is_inexact(p.dtype):
        g = prims.convert_element_type(g, p.dtype)
    if g.shape != p.shape:
        g = rules.sum_to(g, p.shape) if len(g.shape) >= len(p.shape) else \
            prims.broadcast_in_dim(g, p.shape, tuple(range(len(p.shape) - g.ndim, len(p.shape))))
    prev = grads.get(p.name)
    grads[p.name] = g if prev is None else prims.add(prev, g)


def _output_grad(bsym: BoundSymbol, grads: dict, hooks: dict | None = None):
    """The gradient pytree of ``bsym``'s output (None where no gradient), or None;
    each output's total gradient passed through its tensor hooks (tensor_hooks.py)."""
    found = False

    def pick(x):
        nonlocal found
        if type(x) is TensorProxy and x.name in grads:
            found = True
            g = grads.pop(x.name)
            return apply_hooks(hooks[x.name], g, current_trace()) if hooks and x.name in hooks else g
        return None
    g = pytree.tree_map(pick, bsym.output)
    return g if found else None


def _sweep(flat: list, tracked: set[str], grads: dict, vjp: Callable[[BoundSymbol, Any], list[tuple]],
           captured: dict | None = None, *, hooks: dict | None = None) -> None:
    """The reverse sweep of the program's backward and of a decomposition's
    alike: each symbol of ``flat`` on a gradient path, last first, takes its
    output gradients out of ``grads`` and adds in the input gradients ``vjp``
    gives it (those of ``tracked`` values). ``captured`` (name -> None): the
    values whose gradient is kept there, complete once their producer is
    reached (every reader came later in the program), after the value's
    tensor hooks, as eager's ``autograd.grad`` and ``retain_grad`` see it."""
    hooks = dict(hooks) if hooks and captured else hooks
    for bsym in reversed(flat):
        if captured:
            for o in bsym.tensor_outs():
                if o.name in captured and o.name in grads:
                    if o.name in (hooks or {}):
                        grads[o.name] = apply_hooks(hooks.pop(o.name), grads[o.name], current_trace())
                    captured[o.name] = grads[o.name]
        if not _on_path(bsym, tracked) or rules.is_non_differentiable(bsym.sym):
            continue
        g = _output_grad(bsym, grads, hooks)
        if g is None:
            continue
        for arg, ga in vjp(bsym, g):
            if arg.name in tracked:
                _accumulate(grads, arg, ga)


def _opaque_vjp(bsym: BoundSymbol, g, bwd: Trace, handles: dict, tracked=frozenset()) -> list[tuple]:
    if id(bsym) not in handles:      # a differentiable backward: one call PyTorch differentiates again
        return _opaque_vjp_again(bsym, g, tracked)
    handle, inputs = handles[id(bsym)]
    gouts = tuple(gx for o, gx in zip(pytree.leaves(bsym.output), pytree.leaves(g), strict=True)
                  if type(o) is TensorProxy)
    in_grads = tuple(p.replace(name=bwd.fresh_name("t"), requires_grad=False) for p in inputs)
    bwd.add_bound_symbol(OPAQUE_BACKWARD.bind(handle, gouts, output=in_grads))
    return list(zip(inputs, in_grads, strict=True))


def _opaque_vjp_again(bsym: BoundSymbol, g, tracked) -> list[tuple]:
    """The VJP of an opaque op as one opaque call of ``symbols.autograd_vjp``
    (the op recomputed under PyTorch's autograd), itself an opaque op a later
    differentiation takes through PyTorch's autograd again."""
    leaves = [p for p in pytree.leaves((bsym.args, bsym.kwargs)) if type(p) is TensorProxy]
    mask = tuple(p.name in tracked and dtypes.is_inexact(p.dtype) for p in leaves)
    gouts = tuple(gx for o, gx in zip(pytree.leaves(bsym.output), pytree.leaves(g), strict=True)
                  if type(o) is TensorProxy)
    res = opaque_symbol_for(autograd_vjp(bsym.sym.torch_fn, mask))(gouts, bsym.args, bsym.kwargs)
    return list(zip([p for p, m in zip(leaves, mask, strict=True) if m], res, strict=True))


def _barrier_vjp(bsym: BoundSymbol, g, groups: AliasGroups, tracked: set[str]) -> list[tuple]:
    """In a group without views every member is the written tensor itself, so a
    renamed member's value is the write's result (``after``), not its old value.
    A write autograd does not see (into a ``detach()``/``.data`` alias: its
    result is not tracked) leaves every member's history as it was: the
    renamed member's gradient is its old name's, as in eager. So does a write
    whose result is not among ``after`` at all: one made inside a user
    ``autograd.Function``'s forward into an input it did not return (PyTorch
    runs that forward without recording)."""
    members, after = bsym.args
    unseen = not any(a.name in tracked for a in after)
    pairs = []
    for m, gm in zip(members, g, strict=True):
        if gm is None:
            continue
        if unseen:
            pairs.append((m, gm))
            continue
        target = next((a for a in after if groups.same(a.name, m.name)), None)
        pairs.append((target if target is not None else m, gm))
    return pairs


def _build_backward(trace: Trace, flat, tracked: set[str], mask, handles, groups, owned: _Owned,
                    wrt_values=()) -> GradSplit:
    bwd = Trace("backward", names=trace.names)
    grads: dict[str, object] = {}
    user_backwards: list[tuple] = []      # (function bsym, first, end) of each user backward recorded
    diff_outputs, grad_args, grad_positions = [], [], []
    with tracectx(bwd):
        outs = [o for o in pytree.leaves(trace.output) if type(o) is TensorProxy]
        for pos, o in enumerate(outs):
            diff_outputs.append(o.name in tracked)
            if o.name in tracked and o.name not in grads:
                g = o.replace(name=bwd.fresh_name("g"), requires_grad=False)
                grad_args.append(g)
                grad_positions.append(pos)
                _accumulate(grads, o, g)

        def vjp(bsym: BoundSymbol, g) -> list[tuple]:
            bwd.source = bsym.source        # a gradient's symbols name the line of the op they differentiate
            start = len(bwd.bound_symbols)
            pairs = _vjp_pairs(bsym, g, bwd, handles, groups, owned, tracked)
            if is_function_symbol(bsym.sym):
                user_backwards.append((bsym, start, len(bwd.bound_symbols)))
            return pairs
        captured = dict.fromkeys(v.name for v in wrt_values)
        _sweep(flat, tracked, grads, vjp, captured, hooks=hooks_of(trace, groups, _where))
        bwd.source = None
        _check_user_backward_writes(bwd, user_backwards, groups)
        result = tuple(grads.get(a.name) if (m and type(a) is TensorProxy and a.name in tracked) else None
                       for a, m in zip(trace.args, mask, strict=True))
        if wrt_values:      # an output among them was never swept past: its gradient is what reached it
            result += tuple(captured[v.name] if captured[v.name] is not None else grads.get(v.name)
                            for v in wrt_values)
        bwd.set_return(result)
    return GradSplit("functional", backward=bwd, differentiable_outputs=diff_outputs, grad_args=grad_args,
                     grad_positions=grad_positions)


def _check_user_backward_writes(bwd: Trace, segments: list[tuple], groups: AliasGroups) -> None:
    """A user's ``backward`` that writes in place into a forward value (a tensor
    it saved) while a later part of the backward still reads that value: eager
    raises "modified by an inplace operation" when the later reader unpacks
    it; renaming would hand the reader the written value, a wrong gradient, so
    raise the same kind of error here."""
    bsyms = bwd.bound_symbols
    made = {p.name for b in bsyms for p in b.proxy_outs()} | {a.name for a in bwd.args if isinstance(a, Proxy)}
    for fn_bsym, start, end in segments:
        written = [dst for b in bsyms[start:end] for leaf in _leaves_of(b) for dst, _ in writes(leaf)
                   if dst.name not in made]
        for dst in written:
            later = next((b for b in bsyms[end:] for leaf in _leaves_of(b) for p in leaf.proxy_args()
                          if groups.same(p.name, dst.name)), None)
            if later is not None:
                raise RuntimeError(
                    f"one of the variables needed for gradient computation has been modified by an inplace "
                    f"operation: {fn_bsym.sym.name.rsplit('_', 1)[0]}.backward (applied at {_where(fn_bsym)}) "
                    f"writes in place into the tensor {dst.name} it saved, which the backward of an earlier "
                    f"operation still reads; write into a copy (e.g. {dst.name}.clone()) instead")


def _vjp_pairs(bsym, g, bwd: Trace, handles, groups, owned: _Owned | None = None, tracked=frozenset()) -> list[tuple]:
    spec = owned.specs.get(id(bsym)) if owned is not None else None
    if spec == _Owned.DECOMPOSITION:
        return _decomposition_vjp(bsym, g, bwd, handles, groups, tracked)
    if spec is not None:
        return ad_executors.emit_grad_transform_backward(spec, g, bsym, rules.zeros_like)
    if is_function_symbol(bsym.sym):
        return function_vjp(bsym, g)
    if Tag.ALIAS_BARRIER in bsym.sym.tags:
        return _barrier_vjp(bsym, g, groups, tracked)
    if Tag.OPAQUE in bsym.sym.tags:
        return _opaque_vjp(bsym, g, bwd, handles, tracked)
    return rules.apply_rule(bsym, g)


def _decomposition_vjp(bsym, g, bwd: Trace, handles, groups, tracked) -> list[tuple]:
    """The VJP of a composite whose forward an executor runs whole: re-trace its
    decomposition into the backward (fresh names; DCE drops what the rules do
    not read) and differentiate that."""
    scratch = Trace("recompute", names=bwd.names)
    with tracectx(scratch):
        out = bsym.sym.decomposition(*bsym.args, **bsym.kwargs)
    local_tracked = {p.name for p in bsym.tensor_args() if p.name in tracked}
    flat: list[BoundSymbol] = []
    _flatten(scratch.bound_symbols, local_tracked, flat)
    for b in scratch.bound_symbols:
        bwd.add_bound_symbol(b)
    local: dict[str, object] = {}
    for o, go in zip(pytree.leaves(out), pytree.leaves(g), strict=True):
        if go is not None and type(o) is TensorProxy:
            _accumulate(local, o, go)
    _sweep(flat, local_tracked, local, lambda b, gb: _vjp_pairs(b, gb, bwd, handles, groups, tracked=local_tracked))
    return [(a, local[a.name]) for a in bsym.tensor_args() if a.name in local]


def _opaque_forward(trace: Trace, flat, tracked: set[str], owned: _Owned | None = None,
                    differentiable: bool = False) -> tuple[list, dict]:
    """Replace opaque symbols on a gradient path by ``opaque_with_graph`` calls
    that also return the autograd graph handle their backward needs; an
    executor's grad_transform contributes its forward part. ``differentiable``
    (the backward is differentiated again): an op that writes nothing stays as
    it is, its VJP one call recomputing it (``_opaque_vjp_again``)."""
    out, handles = [], {}
    for bsym in flat:
        spec = owned.specs.get(id(bsym)) if owned is not None else None
        if spec is not None and spec != _Owned.DECOMPOSITION:
            out.extend(spec.forward)
            continue
        if is_function_symbol(bsym.sym):
            out.extend(bsym.subsymbols)      # the values the user's backward reads must exist
            continue
        if Tag.OPAQUE not in bsym.sym.tags or not _on_path(bsym, tracked):
            out.append(bsym)
            continue
        # a tensor a mutating custom op writes: see opaque_with_graph; it joins the
        # graph when it needs a gradient before the write or carries one after it
        written = {dst.name for dst, new in writes(bsym) if dst.name in tracked or (new is not None and
                                                                                     new.name in tracked)}
        if not written and not any(o.name in tracked for o in bsym.tensor_outs()):
            out.append(bsym)        # no gradient leaves it (``detach()``): no graph to keep, none to differentiate
            continue
        if differentiable and not any(True for _ in writes(bsym)):
            out.append(bsym)
            continue
        mask = tuple(2 if p.name in written else int(p.name in tracked) for p in bsym.tensor_args())
        inputs = [p for p, m in zip(bsym.tensor_args(), mask, strict=True) if m]
        handle = Proxy(name=trace.fresh_name("graph"))
        handles[id(bsym)] = (handle, inputs)
        out.append(BoundSymbol(OPAQUE_WITH_GRAPH, (bsym.sym.torch_fn, bsym.args, bsym.kwargs, mask), {},
                               (bsym.output, handle), (), bsym.source))
    return out, handles


def _free_names(bwd: Trace) -> list[Proxy]:
    """Proxies the backward reads but does not define: forward values to save."""
    args = {p.name for p in bwd.args if isinstance(p, Proxy)}
    return [p for p in free_proxies(bwd.bound_symbols) if p.name not in args]


def _first_write_after(fwd_bsyms, groups: AliasGroups, args=()) -> dict[str, int]:
    """For each value defined in the forward (or an argument), the index of the
    first symbol that later writes into its memory, if any."""
    defined_at: dict[str, int] = {a.name: -1 for a in args if type(a) is TensorProxy}
    writers: list[tuple[int, list]] = []
    for i, bsym in enumerate(fwd_bsyms):
        dsts = [d for sub in _leaves_of(bsym) for d, _ in writes(sub)]
        if dsts:
            writers.append((i, dsts))
        for p in bsym.proxy_outs():
            defined_at[p.name] = i
    first: dict[str, int] = {}
    for name in list(defined_at) + [n for n in groups.parent if n not in defined_at]:
        start = defined_at.get(name, -1)
        for i, dsts in writers:
            if i > start and any(groups.same(d.name, name) for d in dsts):
                first[name] = i
                break
    return first


def _leaves_of(bsym: BoundSymbol):
    return (b for b in walk(bsym) if not b.subsymbols)


def _protect_overwritten(fwd_bsyms, bwd_bsyms, saved, groups: AliasGroups, names_of: Trace,
                         differentiable: bool = False):
    """A saved value whose memory a later forward symbol overwrites is saved as
    a clone taken just before that write, so the backward sees the value the
    forward used (eager raises "modified by an inplace operation" here; the
    functional trace can give the correct gradient instead). ``differentiable``:
    the backward is differentiated again, so the clone keeps the value's history."""
    first = _first_write_after(fwd_bsyms, groups, names_of.args)
    clones: dict[int, list] = {}
    rename: dict[str, Proxy] = {}
    for p in saved:
        at = first.get(p.name)
        if at is None or type(p) is not TensorProxy:
            continue
        copy = p.replace(name=names_of.fresh_name(p.name + "_saved"),
                         requires_grad=differentiable and p.requires_grad)
        clones.setdefault(at, []).append(prims.clone.bind(p, output=copy))
        rename[p.name] = copy
    if not rename:
        return fwd_bsyms, bwd_bsyms, saved
    fwd = []
    for i, bsym in enumerate(fwd_bsyms):
        fwd.extend(clones.get(i, ()))
        fwd.append(bsym)
    swap = lambda x: rename.get(x.name, x) if isinstance(x, Proxy) else x  # noqa: E731
    bwd = [b.replace(args=pytree.tree_map(swap, b.args), kwargs=pytree.tree_map(swap, b.kwargs))
           for b in bwd_bsyms]
    return fwd, bwd, [rename.get(p.name, p) for p in saved]


def _reach(trace: Trace, flat, tracked: set[str], grad_positions, handles: dict) -> list[frozenset]:
    """Which arguments (their indices) and opaque graphs (their handles' names,
    ``handles`` as ``_opaque_forward`` made them) each differentiable output is
    connected to in eager's autograd graph. An in-place op keeps the
    overwritten tensor's history in that graph (with a zero gradient), so
    writes connect their destination too: an argument reached only that way
    gets a zero gradient, not None, as in eager."""
    deps: dict[str, frozenset] = {a.name: frozenset({i}) for i, a in enumerate(trace.args)
                                  if isinstance(a, Proxy) and a.name in tracked}
    for bsym in flat:
        if not _on_path(bsym, tracked):
            continue
        reads = bsym.args[:1] if bsym.sym is overwrite_values else bsym.proxy_args()   # the new values carry none
        d = frozenset().union(*(deps.get(p.name, frozenset()) for p in reads))
        if id(bsym) in handles:
            d = d | {handles[id(bsym)][0].name}
        # a custom_op's write is below autograd: the written tensor keeps its own history
        below = {new.name: dst.name for dst, new in writes(bsym) if new is not None} \
            if Tag.WRITES_BELOW_AUTOGRAD in bsym.sym.tags else {}
        for o in bsym.tensor_outs():
            if o.name in tracked:
                deps[o.name] = deps.get(below[o.name], frozenset()) if o.name in below else d
    outs = [o for o in pytree.leaves(trace.output) if type(o) is TensorProxy]
    return [deps.get(outs[pos].name, frozenset()) for pos in grad_positions]


@trace_pass("split_forward_backward (eager mode: no-grad values detached)")
def _detach_cuts(trace: Trace, tracked: set[str]) -> Trace:
    """Eager mode runs every symbol with autograd on; values the program made
    under ``torch.no_grad()`` (inexact outputs of symbols reading tracked values,
    recorded while the program had grad mode off) are detached right after they
    are made. Writes keep their history, as eager's in-place ops under no_grad do.
    (A value whose inputs' flags said "no grad" when it was recorded is not one:
    they were recorded before a write made them require grad, as in eager's
    ``x.mul_(w); x.sum()`` for an ``x`` that did not require grad.)"""
    swap: dict[str, Proxy] = {}
    out: list[BoundSymbol] = []
    grad = True
    for bsym in trace.bound_symbols:
        if bsym.sym.id == GRAD_MODE_ID:
            grad = bool(bsym.args[0])
        if swap:
            bsym = bsym.replace(args=pytree.tree_map(lambda x: swap.get(x.name, x) if isinstance(x, Proxy) else x,
                                                     bsym.args),
                                kwargs=pytree.tree_map(lambda x: swap.get(x.name, x) if isinstance(x, Proxy) else x,
                                                       bsym.kwargs))
        out.append(bsym)
        if Tag.RETURN in bsym.sym.tags or any(True for leaf in _leaves_of(bsym) for _ in writes(leaf)):
            continue
        if Tag.ALIAS_BARRIER in bsym.sym.tags or not _on_path(bsym, tracked):
            continue
        if grad and not any(a.requires_grad for a in bsym.tensor_args()):
            continue        # flags recorded before a write made an input require grad: not a no-grad value
        for o in bsym.tensor_outs():
            if not o.requires_grad and dtypes.is_inexact(o.dtype):
                cut = o.replace(name=trace.fresh_name(o.name + "_nograd"))
                out.append(DETACH.bind(o, output=cut))
                swap[o.name] = cut
    return trace.with_bound_symbols("", out) if swap else trace


def _visible_names(trace: Trace) -> set[str]:
    names = {a.name for a in trace.args if isinstance(a, Proxy)}
    names.update(o.name for o in pytree.leaves(trace.output) if isinstance(o, Proxy))
    return names


@trace_pass("split_forward_backward (forward)")
def _forward_trace(trace: Trace, bsyms, saved_tensors, saved_other) -> Trace:
    fwd = trace.with_bound_symbols("", bsyms)
    fwd.name = "forward"
    with tracectx(fwd):
        fwd.set_return((trace.output, tuple(saved_tensors), tuple(saved_other)))
    return fwd


@trace_pass("split_forward_backward (backward)")
def _backward_trace(bwd: Trace, saved_tensors, saved_other, grad_args) -> Trace:
    out = Trace("backward", names=bwd.names)
    holder = Proxy(name=bwd.fresh_name("saved"))
    out.args = [*saved_tensors, holder, *grad_args]
    body = []
    if saved_other:
        body.append(BoundSymbol(UNPACK_SAVED, (holder,), {}, tuple(saved_other)))
    out.bound_symbols = body + list(bwd.bound_symbols)
    out._scopes = [out.bound_symbols]
    # a user's autograd.Function backward may write in place: its later reads
    # (and the gradient it returns) must name the written value
    return update_aliases(out)


def split_forward_backward(trace: Trace, requires_grad_mask, input_alias_groups=None, *,
                           executors=None, input_strides: dict | None = None, wrt_values=(),
                           recompute_norms: bool = False, differentiable: bool = False) -> GradSplit:
    """Differentiate ``trace`` with respect to the arguments ``requires_grad_mask``
    selects; see the module docstring for what comes back. ``executors``
    (priority order) may own the differentiation of symbols they implement
    (autodiff/executors.py). ``input_strides`` (argument name -> (strides,
    storage offset) of the tensor compiled for) lets functionalization decide
    eager's view-or-copy of reshapes and place arguments sharing storage in it;
    ``GradSplit.stride_inputs`` / ``placed_inputs`` name the arguments whose
    strides / strides and offsets it relied on. ``wrt_values``: values of the
    trace (intermediates) whose gradients the backward also returns, after the
    arguments' (``torch.autograd.grad`` with respect to them, autodiff/inline.py).
    ``recompute_norms``: the backward recomputes the norms' outputs it reads
    (autodiff/rematerialize.py; for forward and backward in one program).
    ``differentiable``: the backward will be differentiated again (double
    backward): values it reads keep their history."""
    mask = list(requires_grad_mask)
    trace_in = trace
    tracked, flat, owned, groups = _analyse(trace, mask, executors, input_alias_groups)
    own = _reads_own_memory(trace, tracked, groups)
    reason = own or _eager_reason(trace, flat, tracked, groups, mask, new_leaves=bool(wrt_values))
    functional = rewritten = None
    tail, epilogue, used = [], None, set()
    late = _saved_then_unrecorded_write(trace, tracked, groups, _owned_writes(flat, tracked))
    quiet: set[str] = set()
    private: set[str] = set()
    if own is None and late is not None:
        reason = late
    elif own is None and reason is not None and (_needs_eager(trace, flat, tracked, groups)
                                                 or _no_grad_write_on_path(trace, tracked, groups)):
        try:
            layouts = eager_tensors(trace, input_strides or {}, input_alias_groups)
            rewritten = functionalize(trace, _owned_writes(flat, tracked), input_alias_groups,
                                      eager_aliasing(trace, layouts), used, input_strides, layouts, quiet, private)
            functional, tail, epilogue = take_write_backs(dce(rewritten, input_alias_groups), input_alias_groups)
        except NotFunctionalizable as e:
            reason = f"{reason}; it was not functionalized: {e}"
        except EagerRaises:
            raise
        except Exception as e:  # noqa: BLE001 - eager mode stays correct; the reason says what failed
            reason = f"{reason}; functionalizing it failed ({type(e).__name__}: {e})"
        else:
            analysis = _analyse(functional, mask, executors, input_alias_groups)
            reason = (_eager_reason(functional, analysis[1], analysis[0], analysis[3], mask, frozenset(private),
                                    bool(wrt_values))
                      or _stale_requires_grad(functional, analysis[0]))
            if reason is None:
                trace = functional
                tracked, flat, owned, groups = analysis
    if reason is not None:
        return GradSplit("eager", eager_trace=_detach_cuts(trace, tracked), differentiable_outputs=[
            o.name in tracked for o in pytree.leaves(trace.output) if type(o) is TensorProxy],
            eager_reason=reason)
    if trace is not functional:
        tail, epilogue = [], None
    fwd_bsyms, handles = _opaque_forward(trace, flat, tracked, owned, differentiable)
    split = _build_backward(trace, flat, tracked, mask, handles, groups, owned, wrt_values)
    # a rule's gradients for arguments that need none (rotary embedding's cos and sin) are dead: what
    # only they read must not be saved
    split.backward = dce(split.backward, keep_writes=True)
    split.grad_reach = _reach(trace, flat, tracked, split.grad_positions, handles)
    split.graphs = frozenset(h.name for h, _ in handles.values())
    fwd_values = {p.name for b in fwd_bsyms for p in b.proxy_outs()} | _visible_names(trace)
    saved = [p for p in _free_names(split.backward) if p.name in fwd_values]
    # the write-backs run after the forward: what they overwrite is saved as it was before them
    overwritten = set(_first_write_after(fwd_bsyms + tail, groups, trace.args))
    fusing = any(getattr(ex, "fuses_elementwise", False) for ex in executors or ())
    bwd_bsyms, saved = rematerialize(fwd_bsyms, split.backward.bound_symbols, saved, _visible_names(trace),
                                     overwritten, fusing, recompute_norms)
    fwd_bsyms, bwd_bsyms, saved = _protect_overwritten(fwd_bsyms + tail, bwd_bsyms, saved, groups, trace,
                                                       differentiable)
    fwd_bsyms = [b for b in fwd_bsyms if not any(b is t for t in tail)]
    split.backward = split.backward.with_bound_symbols("", bwd_bsyms)
    visible = _visible_names(trace)
    split.saved_tensors = [p for p in saved if type(p) is TensorProxy and p.name in visible]
    split.saved_other = [p for p in saved if not (type(p) is TensorProxy and p.name in visible)]
    split.forward = _forward_trace(trace, fwd_bsyms, split.saved_tensors, split.saved_other)
    split.backward = _backward_trace(split.backward, split.saved_tensors, split.saved_other, split.grad_args)
    split.functionalized = rewritten if trace is functional else None
    index = {a.name: i for i, a in enumerate(trace.args) if isinstance(a, Proxy)}
    split.write_backs = tuple(index[b.args[1].name] for b in tail)
    split.quiet_write_backs = tuple(index[b.args[1].name] for b in tail if b.args[1].name in quiet)
    split.epilogue = epilogue
    placed = {n.split(":", 1)[1] for n in used if n.startswith("layout:")}
    decided = {n for n in used if not n.startswith("layout:")}
    split.stride_inputs = tuple(sorted(inputs_behind(trace_in, decided) - placed))
    split.placed_inputs = tuple(sorted(placed))
    return split


def _analyse(trace: Trace, mask, executors, input_alias_groups):
    """What differentiation needs to know: tracked names, the flattened program,
    symbols owned by executors, alias groups."""
    tracked = {a.name for a, m in zip(trace.args, mask, strict=True) if m and _is_diff_tensor(a)}
    flat: list[BoundSymbol] = []
    owned = _Owned(executors, trace)
    _flatten(trace.bound_symbols, tracked, flat, owned, trace.names)
    return tracked, flat, owned, AliasGroups.of_trace(trace, input_alias_groups)
