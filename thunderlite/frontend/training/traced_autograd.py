"""The program's own autograd: ``loss.backward()``, ``torch.autograd.backward``
and ``torch.autograd.grad`` inside a jitted function: a training step is one
program (docs/architecture.md §3, and §9 "Backward inside the trace").

A backward is autodiff applied to what the trace computed so far
(``transforms/autodiff/inline.py``): the symbols recorded since the last
backward (and those of graphs kept with ``retain_graph=True``) are
differentiated and replaced by their forward followed by the backward. The
``.grad`` of each leaf is then a trace value with eager's semantics: created
when None (fresh memory), accumulated in place into an existing one, set by
``p.grad = t`` / ``p.grad = None``, read by the optimizer code that follows;
the epilogue writes the final value back. Once a backward ran, the program
needs no autograd: it runs under ``no_grad``, and a returned tensor that
requires grad is eager's tensor whose graph was used (``autodiff.graph_used``).

Eager's errors keep eager's words and name the user's line: a second backward
through a graph freed by the first, ``element 0 of tensors does not require
grad``, ``grad can be implicitly created only for scalar outputs``, an unused
input of ``autograd.grad`` without ``allow_unused``. Tensor hooks of the
leaves run before accumulation; ``retain_grad()`` of a value the program
makes and leaves it makes with ``requires_grad_()`` get a ``.grad`` the
program reads. ``create_graph=True`` records a differentiable backward
(``inline_backward(create_graph=True)``) and keeps forward and backward as the
graph a later backward differentiates (a gradient penalty, a MAML inner step,
Hessian-vector products, second derivatives with respect to inputs); a
``.grad`` it leaves requiring grad is added to out of place by the next
``create_graph`` backward, in place otherwise, as eager's AccumulateGrad.
Refused with the line: a backward
reaching an input that is not a leaf (its graph lies outside the program),
``.grad`` of a tensor made inside the program assigned, such a value with a
``.grad`` returned or stored, writes on the gradient path before the backward
that functionalization cannot express (autodiff/inline.py ``NotInlinable``).
"""
from __future__ import annotations

from typing import Any

import torch

from thunderlite.core import dtypes, pytree
from thunderlite.core.aliasing import may_view, writes
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, free_proxies, walk
from thunderlite.frontend.epilogue import Write
from thunderlite.interpreter import interpret
from thunderlite.torch.ops.grad_mode import REGISTER_HOOK_ID, RETAIN_GRAD_ID
from thunderlite.transforms.aliasing.update_aliases import AliasGroups, written
from thunderlite.transforms.autodiff.inline import GRAPH_USED, NotInlinable, graph_of, inline_backward
from thunderlite.transforms.autodiff.split import REQUIRES_GRAD_ID
from thunderlite.transforms.autodiff.tensor_hooks import apply_hooks

_SECOND_BACKWARD = (
    "Trying to backward through the graph a second time (or directly access saved tensors after they have "
    "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
    "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or "
    "if you need to access saved tensors after calling backward.")


def _as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _retains(retain_graph: bool | None, create_graph: bool) -> bool:
    """Eager's default: a differentiable backward keeps its graph."""
    return bool(create_graph) if retain_graph is None else bool(retain_graph)


def _with_markers(bsyms: list[BoundSymbol], recorded: list[BoundSymbol]) -> list[BoundSymbol]:
    """``bsyms`` (a forward and backward as inlined) with the leaf and hook
    markers of ``recorded`` each placed after the symbol making its tensor."""
    markers = [b for b in recorded if b.sym.id in (REQUIRES_GRAD_ID, REGISTER_HOOK_ID)]
    made = {o.name for b in bsyms for o in b.proxy_outs()}
    out = [m for m in markers if m.args[0].name not in made]
    after: dict[str, list[BoundSymbol]] = {}
    for m in markers:
        if m.args[0].name in made:
            after.setdefault(m.args[0].name, []).append(m)
    for b in bsyms:
        out.append(b)
        for o in b.proxy_outs():
            out.extend(after.pop(o.name, ()))
    return out


class TracedAutograd:
    """Backward calls and ``.grad`` of one traced call (see the module docstring)."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.state = hooks.state
        self.trace = hooks.state.trace
        self.start = 0                           # first symbol no backward differentiated yet
        self.retained: list[BoundSymbol] = []    # recorded symbols of graphs still alive
        self.freed: set[str] = set()             # values of graphs a backward used without retain_graph
        self.grads: dict[str, Any] = {}          # leaf input name -> its .grad now (proxy or None)
        self.entry_grads: dict[str, Any] = {}    # leaf input name -> its .grad when the call began
        self.used = False                        # a backward ran: the program runs without autograd
        self.retain_last = False
        self.last_backward: list[BoundSymbol] = []
        self.gradient_of: dict[str, str] = {}   # gradient value name -> its leaf (the trace report)
        self.retains: dict[str, TensorProxy] = {}  # values the program made that called retain_grad()
        self.input_hooks: dict[str, list] = {}   # input name -> (hook, reads) the program registered on it
        self.made: dict[str, TensorProxy] = {}    # leaves the program made with requires_grad_()
        self.value_grads: dict[str, TensorProxy] = {}  # the .grad now of those and the retained (absent: None)
        self._written: tuple[int, dict[str, TensorProxy]] = (-1, {})  # (trace length, write result -> written)

    # --- .grad ------------------------------------------------------------------------------
    def tensor_of(self, proxy: TensorProxy) -> TensorProxy:
        """The tensor object ``proxy`` stands for: an in-place op's result names the
        tensor it wrote (``p -= x`` rebinds ``p`` to the write's value, where eager's
        ``__isub__`` returns ``p`` itself), so its ``.grad`` is that tensor's."""
        n = len(self.trace.bound_symbols)
        if self._written[0] != n:
            found = {}
            for top in self.trace.bound_symbols:
                for b in walk(top):
                    for dst, new in writes(b):
                        if new is not None and new.shape == dst.shape and new.dtype == dst.dtype:
                            found[new.name] = dst
            self._written = (n, found)
        found = self._written[1]
        seen = set()
        while proxy.name in found and proxy.name not in seen and proxy.name not in self.grads \
                and proxy.name not in self.value_grads and self.state.input_by_name(proxy.name) is None:
            seen.add(proxy.name)
            proxy = found[proxy.name]
        return proxy

    def grad_of(self, proxy: TensorProxy) -> Any:
        """``proxy.grad``: the program's value for an input, None for a value the
        program made (a non-leaf's ``.grad`` is None in eager)."""
        proxy = self.tensor_of(proxy)
        if proxy.name in self.grads:
            return self.grads[proxy.name]
        inp = self.state.input_by_name(proxy.name)
        if inp is None:
            return self.value_grads.get(proxy.name)
        return self._entry_grad(inp)

    def _entry_grad(self, inp) -> Any:
        name = inp.proxy.name
        if name not in self.entry_grads:
            prov = inp.prov.attr("grad") if inp.prov is not None else None
            grad = inp.value.grad
            if grad is None:
                if prov is not None:
                    self.state.add_guard(prov, "eq", None)
                self.entry_grads[name] = None
            else:
                self.entry_grads[name] = self.state.enter(prov, grad)
        return self.entry_grads[name]

    def set_grad(self, proxy: TensorProxy, value: Any) -> None:
        """``proxy.grad = value`` inside the program."""
        proxy = self.tensor_of(proxy)
        inp = self.state.input_by_name(proxy.name)
        if inp is None or inp.prov is None:
            raise NotImplementedError(f"thunderlite: assigning .grad of {proxy.name}, a tensor made inside the "
                                      f"jitted function, is not supported{self._where()}")
        if value is not None:
            if type(value) is not TensorProxy:
                raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of type "
                                f"{type(value).__name__}")
            if tuple(value.shape) != tuple(proxy.shape):
                raise RuntimeError("assigned grad has data of a different size")
            if value.dtype != proxy.dtype:
                raise RuntimeError("assigned grad has data of a different type")
        self._entry_grad(inp)
        self.grads[proxy.name] = value

    def writes(self) -> list[Write]:
        """The ``.grad`` write-backs: each leaf whose ``.grad`` is not the tensor it
        began with. A ``.grad`` a ``backward(create_graph=True)`` left requiring
        grad is eager's tensor whose graph the program kept (``graph_used``)."""
        out = []
        for name, value in self.grads.items():
            if name in self.entry_grads and value is self.entry_grads[name]:
                continue
            inp = self.state.input_by_name(name)
            if type(value) is TensorProxy and value.requires_grad and self.used:
                kept = value.replace(name=self.trace.fresh_name("t"))
                self.trace.add_top_level(GRAPH_USED.bind(value, True, output=kept))
                value = kept
            out.append(Write("attr", inp.prov, "grad", value))
        return out

    # --- backward ---------------------------------------------------------------------------
    def backward(self, tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None,
                 grad_variables=None) -> None:
        """``torch.autograd.backward`` (and ``Tensor.backward``) inside the program."""
        outs = _as_list(tensors)
        cots = self._cotangents(outs, _as_list(grad_tensors if grad_tensors is not None else grad_variables))
        only = None if inputs is None else {p.name for p in _as_list(inputs)}
        if only and any(self.state.input_by_name(n) is None for n in only):
            raise NotImplementedError(f"thunderlite: backward(inputs=...) naming a tensor made inside the jitted "
                                      f"function (not a leaf) is not supported{self._where()}")
        args, grads, _ = self._differentiate(outs, cots, _retains(retain_graph, create_graph), (),
                                             leaves=only is None, create_graph=bool(create_graph))
        grads = self._leaf_hooks(args, grads, only)
        reached = [(a, g) for a, g in zip(args, grads, strict=True) if g is not None
                   and (only is None or a.name in only)]
        fresh = self._fresh(grads)
        for a, g in reached:
            self._accumulate(a, g, fresh, bool(create_graph))
        for a, _ in reversed(reached):
            self._post_accumulate_hooks(a)

    def grad(self, outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
             only_inputs=True, allow_unused=None, is_grads_batched=False, materialize_grads=False):
        """``torch.autograd.grad`` inside the program: gradients as trace values, no ``.grad`` touched."""
        wanted = _as_list(inputs)
        outs = _as_list(outputs)
        cots = self._cotangents(outs, _as_list(grad_outputs))
        if is_grads_batched:
            raise NotImplementedError(f"thunderlite: torch.autograd.grad(is_grads_batched=True) inside a jitted "
                                      f"function is not supported{self._where()}")
        for w in wanted:
            if type(w) is not TensorProxy or not w.requires_grad:
                raise RuntimeError("One of the differentiated Tensors does not require grad")
        args, grads, value_grads = self._differentiate(outs, cots, _retains(retain_graph, create_graph), wanted,
                                                       create_graph=bool(create_graph))
        grads = self._leaf_hooks(args, grads, {w.name for w in wanted})
        by_arg = {a.name: g for a, g in zip(args, grads, strict=True)}
        result = []
        for w, vg in zip(wanted, value_grads, strict=True):
            g = by_arg.get(w.name, vg)
            if g is None:
                if materialize_grads:
                    g = self._call(torch.zeros_like, w)
                elif not allow_unused:
                    raise RuntimeError("One of the differentiated Tensors appears to not have been used in the "
                                       "graph. Set allow_unused=True if this is the desired behavior.")
            result.append(g)
        fresh = self._fresh(result)
        result = [g if g is None or g.name in fresh else self._call(torch.Tensor.clone, g) for g in result]
        return tuple(result)

    # --- the differentiation ------------------------------------------------------------------
    def _differentiate(self, outs: list, cots: list, retain: bool, wrt, leaves: bool = False,
                       create_graph: bool = False) -> tuple[list, list, list]:
        """Replace the recorded symbols by their forward and backward; ``leaves``:
        the leaves the program made get their ``.grad`` (a backward, not ``autograd.grad``).
        ``create_graph``: the backward is differentiable, and a later backward
        differentiates the forward and backward as they now stand in the trace."""
        segment = self.trace.bound_symbols[self.start:]
        self.made.update(self._made_leaves(self.retained + segment))
        graph = graph_of(self.retained + segment, outs, frozenset(self.made))
        segment = self._take_retain_grads(segment)
        kept = [self.retains[n] for n in self.retains if n in graph and n not in {w.name for w in wrt}]
        flags, prefix, rest = self._partition(segment, graph)
        bsyms = self.retained + rest
        if graph & self.freed:
            raise RuntimeError(f"{_SECOND_BACKWARD}{self._where()}")
        made = {n: p for n, p in self.made.items() if n in graph}
        self._refuse_made_leaves(bsyms, graph, made)
        if leaves:
            kept += [p for n, p in made.items() if n not in {w.name for w in wrt} and all(n != k.name for k in kept)]
        free = free_proxies(bsyms)
        free_names = {p.name for p in free}
        args = list(free) + [o for o in outs if o.name not in free_names and not self._defined_in(bsyms, o)]
        mask = []
        for a in args:
            inp = self.state.input_by_name(a.name) if type(a) is TensorProxy else None
            diff = (inp is not None or a.name in made) and a.requires_grad and dtypes.is_inexact(a.dtype) \
                and a.name in graph
            if diff and inp is not None:
                self._check_leaf(inp)
            mask.append(diff)
        arg_names = {a.name for a in args}
        defined = {p.name: b for b in self.trace.bound_symbols[:self.start] for p in b.proxy_outs()}
        try:
            inl = inline_backward(bsyms, args, mask, outs, cots, names=self.trace.names, defined=defined,
                                  wrt_values=[w for w in list(wrt) + kept if w.name not in arg_names],
                                  create_graph=create_graph)
        except NotInlinable as e:
            raise NotImplementedError(f"thunderlite cannot differentiate inside the jitted function here: "
                                      f"{e}{self._where()}") from None
        self.trace.bound_symbols[self.start:] = flags + prefix + inl.forward + inl.backward
        self.trace.writes += 1
        self.start = len(self.trace.bound_symbols)
        if not retain:      # the leaves stay: a later graph starts from them anew
            inputs = {inp.proxy.name for inp in self.state.inputs}
            self.freed |= graph - inputs - set(self.made)
        if create_graph:    # a later backward goes through the backward too, so through what it read
            bsyms = bsyms[:len(bsyms) - len(rest)] + _with_markers(inl.forward + inl.backward, rest)
        alive = {o.name for b in bsyms for o in b.tensor_outs() if o.requires_grad and o.name not in self.freed}
        self.retained = [b for b in bsyms if any(o.name in alive for o in b.tensor_outs())   # and their markers
                         or (b.sym.id in (REQUIRES_GRAD_ID, REGISTER_HOOK_ID) and b.args[0].name in alive)]
        self.used = True
        self.retain_last = retain
        self.last_backward = inl.backward
        value_grads = iter(inl.value_grads)
        result = [None if w.name in arg_names else next(value_grads) for w in wrt]
        by_arg = {a.name: g for a, g in zip(args, inl.grads, strict=True)}
        for v in kept:
            self._retain(v, by_arg[v.name] if v.name in arg_names else next(value_grads))
        return args, inl.grads, result

    def _partition(self, segment: list[BoundSymbol], graph: set[str]) -> tuple[list, list, list]:
        """``segment`` as (markers that stay as they are, the leaf updates before
        the graph, what is differentiated). Markers: ``requires_grad_`` off the
        graph (``zero_grad``'s on ``p.grad``) changes no gradient, on a program
        input read by nothing before it makes that input a leaf like any other;
        hooks and ``retain_grad`` on inputs are the caller's tensor's (noted in
        ``input_hooks`` for the leaves' gradients, registered by the epilogue)."""
        flags = [b for b in segment if b.sym.id == REQUIRES_GRAD_ID
                 and (b.args[0].name not in graph or self._input_made_leaf(b, self.retained + segment))]
        flags += [b for b in segment if b.sym.id in (REGISTER_HOOK_ID, RETAIN_GRAD_ID)
                  and self.state.input_by_name(b.args[0].name) is not None]
        for b in flags:
            if b.sym.id == REGISTER_HOOK_ID:
                self.input_hooks.setdefault(b.args[0].name, []).append(
                    (b.args[1], b.args[2] if len(b.args) > 2 else ()))
        rest = [b for b in segment if not any(b is f for f in flags)]
        prefix = self._leaf_updates_before(rest, graph)
        return flags, prefix, rest[len(prefix):]

    def _leaf_hooks(self, args: list, grads: list, only: set[str] | None) -> list:
        """Each input leaf's gradient through its tensor hooks, as eager runs them
        before accumulating it (or returning it from ``autograd.grad``): those
        the caller's tensor had at the call (their set is guarded), then those
        the program registered on it before this backward; ``only``: the
        leaves the backward is restricted to."""
        out = []
        for a, g in zip(args, grads, strict=True):
            inp = self.state.input_by_name(a.name) if g is not None else None
            if inp is not None and (only is None or a.name in only):
                fns = [(fn, ()) for fn in self._guarded_hooks(inp, "_backward_hooks")]
                fns += self.input_hooks.get(a.name, [])
                g = apply_hooks(fns, g, self.trace) if fns else g
            out.append(g)
        return out

    def _guarded_hooks(self, inp, slot: str) -> list:
        """The hooks in the caller's tensor's ``slot`` dict, guarded by their keys:
        registering or removing one outside the call recompiles."""
        hooks = getattr(inp.value, slot, None)
        if inp.prov is not None:
            path = inp.prov.attr(slot)
            if hooks is None:
                self.state.add_guard(path, "eq", None)
            else:
                self.state.add_guard(path, "keys", tuple(hooks))
        return list((hooks or {}).values())

    def _take_retain_grads(self, segment: list[BoundSymbol]) -> list[BoundSymbol]:
        """``segment`` less the ``retain_grad()`` markers of values the program
        makes, which it notes: each backward reaching such a value accumulates
        its gradient into the value's ``.grad``, a trace value (the markers are
        the eager-mode replay's; the program runs without autograd)."""
        out = []
        for b in segment:
            if b.sym.id == RETAIN_GRAD_ID and self.state.input_by_name(b.args[0].name) is None:
                self.retains[b.args[0].name] = b.args[0]
            else:
                out.append(b)
        return out

    def _retain(self, value: TensorProxy, g: TensorProxy | None) -> None:
        """Eager's retain_grad hook: the first gradient is copied, a later one added out of place."""
        if g is None:
            return
        cur = self.value_grads.get(value.name)
        self.value_grads[value.name] = (self._call(torch.Tensor.clone, g) if cur is None
                                        else self._call(torch.add, cur, g))

    def _made_leaves(self, bsyms) -> dict[str, TensorProxy]:
        """Values the program made and then made leaves with ``requires_grad_()``
        (``x.clone().requires_grad_()``, ``zeros_like(x, requires_grad=True)``,
        a gradient penalty's or an adversarial example's input; the marker is
        recorded only where the value had no history): their ``.grad`` is a
        trace value like a retained gradient's (``value_grads``), seen by the
        program only."""
        made: dict[str, TensorProxy] = {}
        for b in bsyms:
            if b.sym.id == REQUIRES_GRAD_ID and self.state.input_by_name(b.args[0].name) is None:
                flag = b.args[1] if len(b.args) > 1 else b.kwargs.get("requires_grad", True)
                if flag:
                    made[b.args[0].name] = b.args[0]
        return made

    def _refuse_made_leaves(self, bsyms, graph: set[str], made: dict) -> None:
        """A graph value without history that is no leaf the program made
        (``made``) nor an input, and ``requires_grad_()`` on an input after a
        read: refused, named."""
        for b in bsyms:
            outs = [o for o in b.tensor_outs() if o.name in graph and o.name not in made]
            if outs and not any(a.name in graph for a in b.tensor_args()):
                raise NotImplementedError(
                    f"thunderlite: backward() inside the jitted function reaches {outs[0].name}, a leaf tensor "
                    f"made inside the function{self._where()}; pass it in as an argument instead")
            if b.sym.id == REQUIRES_GRAD_ID and b.args[0].name in graph and b.args[0].name not in made:
                raise NotImplementedError(
                    f"thunderlite: backward() inside the jitted function reaches the input {b.args[0].name}, "
                    f"made a leaf by requires_grad_() after the function read it{self._where()}; call "
                    "requires_grad_() before its first use, or before calling the function")

    def _leaf_updates_before(self, seg: list[BoundSymbol], graph: set[str]) -> list[BoundSymbol]:
        """The symbols of ``seg`` before the first that computes a value of the
        graph, where they write: an optimizer step or a ``no_grad`` update of the
        parameters between two backwards, a renormalization before the forward.
        They change the leaves' values, not their history: they stay before the
        differentiated program, whose reads see the new values, as eager's
        forward does. Not where the graph holds a value made before the write
        (a retained graph's saved value: eager raises there), which
        differentiation must see (empty list)."""
        inputs = {inp.proxy.name for inp in self.state.inputs}
        first = next((i for i, b in enumerate(seg)
                      if any(o.name in graph and o.name not in inputs for o in b.tensor_outs())), len(seg))
        prefix = seg[:first]
        dsts = [d for b in prefix for d in written(b)]
        if not dsts:
            return []
        groups = AliasGroups()
        for b in self.trace.bound_symbols:
            groups.add_bsym(b)
        roots = {groups.find(d.name) for d in dsts}
        if any(groups.find(p.name) in roots for b in self.retained for p in b.tensor_args() + b.tensor_outs()):
            return []
        return prefix

    def _input_made_leaf(self, marker: BoundSymbol, bsyms) -> bool:
        """``x.requires_grad_()`` on a program input before anything reads it
        (``x.requires_grad_(); loss(x).backward()``): ``x`` is then a leaf of the
        caller's that requires grad from the start, its ``.grad`` a program
        value. One read before the marker would be a value without history."""
        name = marker.args[0].name
        if self.state.input_by_name(name) is None or not marker.args[0].requires_grad:
            return False
        for b in bsyms:
            if b is marker:
                return True
            if any(a.name == name for a in b.tensor_args()):
                return False
        return False

    @staticmethod
    def _defined_in(bsyms, p) -> bool:
        return any(o.name == p.name for b in bsyms for o in b.proxy_outs())

    def _check_leaf(self, inp) -> None:
        if not inp.value.is_leaf:
            what = inp.prov.describe() if inp.prov is not None else inp.proxy.name
            raise NotImplementedError(
                f"thunderlite: backward() inside the jitted function reaches {what}, a tensor that is not a leaf "
                f"(its graph lies outside the program){self._where()}; pass it detached, or call backward "
                "outside the jitted function")
        if inp.prov is not None and not isinstance(inp.value, torch.nn.Parameter):
            self.state.add_guard(inp.prov.attr("is_leaf"), "eq", True)

    def _cotangents(self, outs: list, given: list) -> list:
        if given and len(given) != len(outs):
            raise RuntimeError(f"grad can be implicitly created only for scalar outputs: got {len(given)} "
                               f"gradients for {len(outs)} tensors")
        cots = []
        for i, o in enumerate(outs):
            if type(o) is not TensorProxy or not o.requires_grad:
                if any(b.kwargs.get("requires_grad") for b in self.trace.bound_symbols):
                    # a factory's proxy does not say that its tensor requires grad
                    raise NotImplementedError(
                        f"thunderlite: backward() inside the jitted function of a program that makes a leaf "
                        f"tensor made inside the function (requires_grad=True){self._where()}; pass it in as an "
                        "argument instead")
                raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
            g = given[i] if given else None
            if type(g) is TensorProxy and tuple(g.shape) != tuple(o.shape):
                raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of {torch.Size(g.shape)} and "
                                   f"output[{i}] has a shape of {torch.Size(o.shape)}.{self._where()}")
            if g is None:
                if o.numel() != 1:
                    raise RuntimeError("grad can be implicitly created only for scalar outputs")
                g = self._call(torch.ones_like, o)
            cots.append(g)
        return cots

    # --- .grad of the leaves --------------------------------------------------------------------
    def _fresh(self, grads) -> set[str]:
        """Names of gradients made by the backward in memory of their own: one
        that is a view, a value the forward made, or given to two leaves is
        copied first (eager's AccumulateGrad never lets two ``.grad`` share memory)."""
        made = {o.name: b for b in self.last_backward for o in b.tensor_outs()}
        seen: dict[str, int] = {}
        for g in grads:
            if g is not None:
                seen[g.name] = seen.get(g.name, 0) + 1
        return {n for n, k in seen.items() if k == 1 and n in made and not may_view(made[n])}

    def _accumulate(self, leaf: TensorProxy, g: TensorProxy, fresh: set[str], create_graph: bool) -> None:
        """Eager's AccumulateGrad: the first gradient taken (a copy where it is not
        fresh), a later one added in place, with grad mode off; under
        ``create_graph`` added out of place, so ``.grad`` keeps both histories."""
        inp = self.state.input_by_name(leaf.name)
        self.gradient_of[g.name] = inp.prov.describe() if inp.prov is not None else leaf.name
        cur = self.grad_of(leaf)
        if cur is None:
            self.grads[leaf.name] = g if g.name in fresh else self._call(torch.Tensor.clone, g)
            return
        if create_graph:
            self.grads[leaf.name] = self._call(torch.add, cur, g)
            return
        if not cur.requires_grad:
            self._call(torch.Tensor.add_, cur, g)
            self.grads[leaf.name] = cur
            return
        grad_mode = self.hooks.grad_enabled    # a .grad a create_graph backward left: eager adds under no_grad
        self.hooks.set_grad_enabled(False)
        try:
            self._call(torch.Tensor.add_, cur, g)
        finally:
            self.hooks.set_grad_enabled(grad_mode)
        self.grads[leaf.name] = cur

    def _post_accumulate_hooks(self, leaf: TensorProxy) -> None:
        inp = self.state.input_by_name(leaf.name)
        for hook in self._guarded_hooks(inp, "_post_accumulate_grad_hooks"):
            interpret(hook, self.hooks)(leaf)

    def _refuse_escaping_retained(self, result: Any) -> None:
        """A value the program made with a ``.grad`` that the caller sees (returned or
        stored) would need that ``.grad`` on the tensor the caller gets."""
        if not self.value_grads:
            return
        seen = [result] + [v for _, v in self.state.attr_writes.values()] + \
               [v for _, v in self.state.global_writes.values()] + [v for _, v in self.state.cell_writes.values()]
        for leaf in pytree.leaves(seen):
            if type(leaf) is TensorProxy and leaf.name in self.value_grads:
                raise NotImplementedError(
                    f"thunderlite: {leaf.name}, a tensor the jitted function makes and gives a .grad (retain_grad(), "
                    "or a leaf made with requires_grad_()), is returned or stored after a backward inside the "
                    "function: its .grad would not reach the caller's tensor; return its .grad instead")

    # --- helpers ----------------------------------------------------------------------------------
    def _call(self, fn, *args):
        return self.hooks.lookaside(fn)(*args)

    def _where(self) -> str:
        loc = self.hooks.locate()
        return f" (at {loc[0]}:{loc[1]}: {loc[2].strip()})" if loc and loc[2] else ""

    def backward_names(self) -> frozenset[str] | None:
        """The names the program's last backward made (None: it ran none)."""
        if not self.used:
            return None
        return frozenset(p.name for b in self.last_backward for p in b.proxy_outs())

    def returned(self, result: Any) -> Any:
        """The program's result with each tensor that still requires grad made
        eager's tensor whose graph the program's backward used (graph_used)."""
        if not self.used:
            return result
        self._refuse_escaping_retained(result)

        def wrap(x):
            if type(x) is TensorProxy and x.requires_grad:
                out = x.replace(name=self.trace.fresh_name("t"))
                self.trace.add_top_level(GRAPH_USED.bind(x, self.retain_last, output=out))
                return out
            return x
        if type(result) in (tuple, list):
            return type(result)(self.returned(r) for r in result)
        if type(result) is dict:
            return {k: self.returned(v) for k, v in result.items()}
        return wrap(result)
