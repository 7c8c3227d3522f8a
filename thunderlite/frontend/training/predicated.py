"""Blocks traced predicated: run unconditionally, their tensor writes selected by
a tensor flag (transforms/predication.py), where eager reads the flag on the
host only to pick between writing and not writing.

``torch.amp.GradScaler`` is the case that matters: its ``step`` reads
``found_inf.item()`` and runs ``optimizer.step()`` only when no gradient was
inf or nan. Traced, the flag stays a tensor and the step's writes (parameters,
optimizer state) become ``where(keep, new, old)``: one trace, no host sync.

A block can be predicated when everything it does that outlives it is a
tensor write. Python-visible changes (a module attribute, an item of the
optimizer's state made lazily on its first step, a ``.grad`` assigned, a local
of the caller's frame...) cannot be undone by a flag: the block then raises
``PredicationRefused`` naming the site, and the compile traces again with that
site reading the flag as eager does (``TraceState.unpredicated``).
"""
from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core.proxies import TensorProxy
from thunderlite.interpreter import call_past_lookaside, interpret
from thunderlite.transforms.predication import NotPredicable, predicate

NOT_PREDICATED = "not predicated (reads its flag on the host): "


class PredicationRefused(Exception):
    """A block could not be predicated; ``site`` is traced again unpredicated."""

    def __init__(self, site: Any, reason: str):
        super().__init__(reason)
        self.site = site
        self.reason = reason


def run_predicated(hooks, keep: TensorProxy, body: Callable[[], Any], site: Any, what: str) -> Any:
    """``body()`` traced with each tensor write it makes taking effect only where
    ``keep`` is true. ``what`` names the block in refusals."""
    trace = hooks.state.trace
    start = len(trace.bound_symbols)
    before = _visible(hooks)
    result = body()
    if _has_tensor(result):
        raise PredicationRefused(site, f"{what} returns a tensor")
    changed = _changes(hooks, before)
    if changed:
        raise PredicationRefused(site, f"{what} changes {changed}")
    try:
        trace.bound_symbols[start:] = predicate(trace.bound_symbols[start:], keep, trace)
    except NotPredicable as e:
        raise PredicationRefused(site, f"{what}: {e}") from None
    hooks.state.predicated.append((what, keep.name, hooks.locate()))
    return result


def _has_tensor(x: Any) -> bool:
    if isinstance(x, (TensorProxy, torch.Tensor)):
        return True
    if isinstance(x, (tuple, list)):
        return any(_has_tensor(y) for y in x)
    if isinstance(x, dict):
        return any(_has_tensor(y) for y in x.values())
    return False


def _contents(m) -> list:
    return list(m.copy.items()) if isinstance(m.copy, dict) else list(m.copy)


def _visible(hooks) -> tuple:
    st = hooks.state
    return (dict(st.attr_writes), dict(st.global_writes), dict(st.cell_writes),
            {k: _contents(m) for k, m in st.mirror_of.items()}, dict(hooks.autograd.grads),
            len(st.trace.rebound))


def _same_items(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if type(x) is tuple and type(y) is tuple:
            if x[0] is not y[0] and x[0] != y[0] or x[1] is not y[1]:
                return False
        elif x is not y:
            return False
    return True


def _changes(hooks, before: tuple) -> str:
    """What the block changed that a flag cannot select ('' when nothing)."""
    st = hooks.state
    attrs, globs, cells, mirrors, grads, rebound = before
    for now, then, kind in ((st.attr_writes, attrs, "an attribute or item"), (st.global_writes, globs, "a global"),
                            (st.cell_writes, cells, "a closure variable")):
        for key, (_, value) in now.items():
            if key not in then or then[key][1] is not value:
                return kind
    for key, m in st.mirror_of.items():
        if key in mirrors:
            if not _same_items(_contents(m), mirrors[key]):
                return "a list or dict it reads from outside"
        elif m.changed():
            return "a list or dict it reads from outside"
    if any(grads.get(k, _ABSENT) is not v for k, v in hooks.autograd.grads.items()):
        return "a .grad"
    if len(st.trace.rebound) != rebound:
        return "a tensor's shape in place"
    return ""


_ABSENT = object()


class Branch:
    """``if flag:`` (and its ``else``) traced predicated: the interpreter runs both
    blocks (interpreter/predicate.py), this makes their tensor writes take effect
    where ``flag`` picks them (the protocol's ``begin``/``switch``/``end``/``refuse``)."""

    def __init__(self, hooks, flag: TensorProxy, site: Any):
        self.hooks = hooks
        self.flag = flag
        self.site = site
        self.what = f"the block of `if` at {site[1]}:{site[2]}" if site[1] else "a block of `if`"
        self.spans: list = []          # (first symbol, keep flag) of each block
        self.before: tuple = ()

    def begin(self, negated: bool) -> None:
        look = self.hooks.lookaside
        keep = self.flag if self.flag.dtype is torch.bool else look(torch.ne)(self.flag, 0)
        if keep.ndim:
            keep = look(torch.reshape)(keep, ())
        self.keep = keep
        self.other = look(torch.logical_not)(keep)
        if negated:
            self.keep, self.other = self.other, self.keep
        self.before = _visible(self.hooks)
        # The collector is paused while compiling (compile.gc_paused), so every
        # object made from now on stays in its youngest generation: one found
        # there that was not there now was made by the block.
        self.young_before = {id(o) for o in gc.get_objects(0)}
        self.young_now: set[int] = set()
        self.hooks.predicating.append(self)
        self.spans.append((len(self.hooks.state.trace.bound_symbols), self.keep))

    def switch(self) -> None:
        self.spans.append((len(self.hooks.state.trace.bound_symbols), self.other))

    def end(self) -> None:
        self._leave()
        changed = _changes(self.hooks, self.before)
        if changed:
            raise self.refuse(f"it changes {changed}")
        trace = self.hooks.state.trace
        ends = [start for start, _ in self.spans[1:]] + [len(trace.bound_symbols)]
        for (start, keep), end in reversed(list(zip(self.spans, ends, strict=True))):
            try:
                trace.bound_symbols[start:end] = predicate(trace.bound_symbols[start:end], keep, trace)
            except NotPredicable as e:
                raise self.refuse(str(e)) from None
        self.hooks.state.predicated.append((self.what, self.flag.name, self.site))

    def refuse(self, reason: str) -> PredicationRefused:
        self._leave()
        e = PredicationRefused(self.site, f"{self.what}: {reason}")
        e.predication = self
        return e

    def writes_object(self, obj: Any) -> None:
        """The block writes ``obj`` natively: fine for objects the block made,
        refused for one made before it (a flag cannot undo that write), except
        what the trace's overlay records (compared at the end)."""
        st = self.hooks.state
        if id(obj) in st.prov_of or id(obj) in st.mirrors_by_copy:
            return      # the overlay has it: compared at the end
        if id(obj) not in self.young_now:
            self.young_now = {id(o) for o in gc.get_objects(0)}
        # older: in an older generation, untracked (a dict of atoms), or young before the block
        if id(obj) not in self.young_now or id(obj) in self.young_before or gc.isenabled():
            raise self.refuse(f"it changes a {type(obj).__name__} made before the block")

    def _leave(self) -> None:
        if self.hooks.predicating and self.hooks.predicating[-1] is self:
            self.hooks.predicating.pop()
            self.young_before = self.young_now = set()


def branch(hooks, value: Any) -> Branch | None:
    """The predication of ``if value:`` when ``value`` is a tensor of one element
    and no block around is predicated already (None: its truth is read)."""
    if type(value) is not TensorProxy or hooks.predicating:
        return None
    if any(not isinstance(d, int) for d in value.shape) or value.numel() != 1:
        return None
    loc = hooks.locate()
    site = ("if", loc[0], loc[1]) if loc else ("if", None, None)
    if site in hooks.state.unpredicated:
        return None
    return Branch(hooks, value, site)


def grad_scaler_maybe_step(hooks, scaler, optimizer, optimizer_state, *args, **kwargs):
    """``GradScaler._maybe_opt_step``: the optimizer's step predicated on no
    inf or nan having been found, instead of ``found_inf.item()``."""
    site = ("GradScaler.step", id(optimizer))
    found = list(optimizer_state["found_inf_per_device"].values())
    original = type(scaler)._maybe_opt_step
    if site in hooks.state.unpredicated or not found or not all(type(f) is TensorProxy for f in found):
        return call_past_lookaside(original, (scaler, optimizer, optimizer_state, *args), kwargs)
    total = found[0]
    for f in found[1:]:
        total = hooks.lookaside(torch.add)(total, hooks.lookaside(torch.Tensor.to)(f, total.device))
    keep = hooks.lookaside(torch.eq)(total, 0)
    return run_predicated(hooks, keep, lambda: interpret(optimizer.step, hooks)(*args, **kwargs), site,
                          f"{type(optimizer).__name__}.step under GradScaler")


def predication_notes(state) -> list[str]:
    """What was traced predicated and which blocks read their flag instead, and
    why: for the trace's header, ``examine`` and the report."""
    notes = [f"predicated on {flag} (no host read): {what}" for what, flag, _ in state.predicated]
    notes += [f"{NOT_PREDICATED}{why}" for why in state.unpredicated.values()]
    return notes
