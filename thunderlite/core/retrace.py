"""Tracing a function in place of one bound symbol: the symbols it records,
renamed so that they produce exactly that bound symbol's output proxies.

Used by an executor's ``execution_transform`` (executors/base.py) and
``grad_transform`` (transforms/autodiff/executors.py). Example::

    recorded = retrace(bsym, lambda a: prims.mul(a, a), names=trace.names, what="square")
"""
from __future__ import annotations

from collections.abc import Callable

from thunderlite.core import pytree
from thunderlite.core.prims import check
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import active_traces, tracectx


def retrace(bsym: BoundSymbol, fn: Callable, *, names, what: str,
            allow_self: bool = True) -> tuple[list[BoundSymbol], dict]:
    """``(recorded symbols, rename)``: ``fn(*bsym.args, **bsym.kwargs)`` traced with
    fresh names from ``names``; ``rename`` maps the names ``fn`` returned to
    ``bsym``'s output proxies (already applied to the recorded symbols).
    ``allow_self=False``: ``fn`` may not call ``bsym``'s own symbol."""
    scratch = Trace("retrace", names=names)
    with tracectx(scratch):
        out = fn(*bsym.args, **bsym.kwargs)
    rename = match_outputs(out, bsym.output, what)
    recorded = [rename_bsym(b, rename) for b in scratch.bound_symbols]
    check(allow_self or not any(uses_symbol(b, bsym.sym) for b in recorded),
          lambda: f"{what} calls {bsym.sym.id} itself: it would be replaced forever", ValueError)
    return recorded, rename


def match_outputs(got, want, what: str) -> dict:
    """name -> proxy renaming ``got``'s proxies to ``want``'s (same structure)."""
    g, w = list(pytree.leaves(got)), list(pytree.leaves(want))
    check(len(g) == len(w), lambda: f"{what} returned {len(g)} values where the symbol has {len(w)}", ValueError)
    rename = {}
    for x, y in zip(g, w, strict=True):
        if isinstance(y, Proxy):
            check(isinstance(x, Proxy), lambda: f"{what} returned {x!r} where the symbol returns {y!r}", ValueError)
            if x.name != y.name:
                rename[x.name] = y
    return rename


def rename_bsym(b: BoundSymbol, rename: dict) -> BoundSymbol:
    """``b`` with every proxy named in ``rename`` replaced (outputs and subsymbols too)."""
    if not rename:
        return b
    swap = lambda x: rename.get(x.name, x) if isinstance(x, Proxy) else x  # noqa: E731
    return b.replace(args=pytree.tree_map(swap, b.args), kwargs=pytree.tree_map(swap, b.kwargs),
                     output=pytree.tree_map(swap, b.output),
                     subsymbols=tuple(rename_bsym(s, rename) for s in b.subsymbols))


def uses_symbol(b: BoundSymbol, sym: Symbol) -> bool:
    return b.sym is sym or any(uses_symbol(s, sym) for s in b.subsymbols)


def rebind(p: TensorProxy, new: TensorProxy, step: tuple) -> None:
    """The tensor *object* ``p`` stands for the value ``new`` from now on: a
    shape-changing in-place op (``x.t_()``), ``set_``, ``x.data = v``. A trace
    names values, not objects, so what was recorded so far keeps reading ``p``'s
    old value under its old name (a fresh proxy object takes it), and the
    object the program holds takes ``new``'s name and metadata. Every Python
    reference (a module attribute, a list) sees the new value, as eager's
    references see the changed tensor. ``trace.rebound[id(p)]`` keeps
    ``(p, the value p had first, [step, ...])``: the jit replays the steps
    (``(method, args, kwargs, grad_enabled, grew)``) on the caller's tensor when ``p``
    is an input (docs/architecture.md §5). Every trace being recorded into is
    renamed; the record goes to the outermost, the program's."""
    entry = p.replace(name=p.name)
    rename = {p.name: entry, new.name: p}
    traces = active_traces()
    for trc in traces:
        for scope in trc._scopes:
            scope[:] = [rename_bsym(b, rename) for b in scope]
    trace = traces[0]
    p.name, p.shape, p.dtype, p.device = new.name, new.shape, new.dtype, new.device
    p.requires_grad, p.memory = new.requires_grad, new.memory
    record = trace.rebound.setdefault(id(p), (p, entry, []))
    record[2].append(step)
    trace.writes += 1           # memos of what ``p`` held expire
