"""Executors that own the differentiation of symbols they implement (issue 10).

An operator executor implementing a symbol that is on a gradient path keeps
its forward call in the forward trace (``Executor.differentiation(bsym)``
names the implementation), in one of two ways:

- with a ``grad_transform``: the function is traced on the symbol's arguments;
  ``get_grad(out)`` stands for the gradient of one of its outputs and
  ``put_grad(a, grad)`` gives an input's gradient. Symbols that depend on a
  ``get_grad`` form the backward part, the others the forward part
  (``GradTransformSplit``);
- without one (a composite only): the forward is the symbol itself; the
  backward re-traces its decomposition from the saved inputs and applies the
  ordinary rules (autodiff.py, ``_decomposition_vjp``). Only decompositions
  that are safe to recompute qualify: no random draws, no writes, no opaque
  ops (``recomputable``); others are differentiated as usual (flattened) and
  the implementation is not used with grad (``examine`` says so).

Example::

    def sin_grad(a):
        out = my_sin_op(a)                       # an operator of the executor
        put_grad(a, get_grad(out) * my_cos_op(a))
        return out

    myex.register_implementation("ltorch.sin", my_sin_op, grad_transform=sin_grad)
"""
from __future__ import annotations

from collections.abc import Sequence

from thunderlite.core import pytree
from thunderlite.core.prims import check
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.retrace import rename_bsym, retrace
from thunderlite.core.symbol import BoundSymbol, with_source
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import ThreadStack, current_trace

_recording = ThreadStack()     # this thread's grad_transform records, innermost last


class _Record:
    def __init__(self):
        self.grads_in: dict[str, TensorProxy] = {}     # forward output name -> its gradient's proxy
        self.puts: list[tuple[Proxy, Proxy]] = []


def get_grad(x: TensorProxy) -> TensorProxy:
    """Inside a ``grad_transform``: the gradient of the output ``x``."""
    check(bool(_recording.items), lambda: "get_grad is only meaningful inside a grad_transform", RuntimeError)
    rec = _recording.items[-1]
    g = rec.grads_in.get(x.name)
    if g is None:
        g = rec.grads_in[x.name] = x.replace(name=current_trace().fresh_name("g"), requires_grad=False)
    return g


def put_grad(x: TensorProxy, grad: TensorProxy) -> None:
    """Inside a ``grad_transform``: ``grad`` is the gradient of the input ``x``."""
    check(bool(_recording.items), lambda: "put_grad is only meaningful inside a grad_transform", RuntimeError)
    _recording.items[-1].puts.append((x, grad))


def owner(bsym: BoundSymbol, executors: Sequence | None):
    """The implementation (of the first executor in priority order that has one)
    owning ``bsym``'s differentiation, or None."""
    for ex in executors or ():
        impl = ex.differentiation(bsym)
        if impl is not None:
            return impl
    return None


def recomputable(bsym: BoundSymbol) -> bool:
    """The decomposition can be re-traced in the backward with the same result."""
    if bsym.sym.tags & _NOT_RECOMPUTABLE:
        return False
    return all(recomputable(sub) for sub in bsym.subsymbols)


_NOT_RECOMPUTABLE = frozenset({Tag.RANDOM, Tag.INPLACE, Tag.OPAQUE, Tag.DONT_DCE, Tag.ALIAS_BARRIER})


class GradTransformSplit:
    """A traced ``grad_transform``: ``forward`` symbols (producing the symbol's
    own output proxies), ``backward`` symbols, the gradient placeholders they
    read (output name -> proxy) and the ``(input, grad)`` pairs they give."""

    def __init__(self, forward, backward, grads_in, puts):
        self.forward: list[BoundSymbol] = forward
        self.backward: list[BoundSymbol] = backward
        self.grads_in: dict[str, TensorProxy] = grads_in
        self.puts: list[tuple[Proxy, Proxy]] = puts


def split_grad_transform(bsym: BoundSymbol, grad_transform, trace: Trace) -> GradTransformSplit:
    """Trace ``grad_transform`` on ``bsym``'s arguments and split it (module docstring)."""
    what = f"grad_transform of {bsym.sym.id}"
    rec = _Record()
    _recording.items.append(rec)
    try:
        recorded, rename = retrace(bsym, grad_transform, names=trace.names, what=what)
    finally:
        _recording.items.pop()
    grads_in = {rename[n].name if n in rename else n: g for n, g in rec.grads_in.items()}
    outs = {p.name for p in bsym.proxy_outs()}
    stray = [n for n in grads_in if n not in outs]
    check(not stray, lambda: f"{what}: get_grad of {stray}, which are not outputs of the symbol", ValueError)
    recorded = with_source(recorded, bsym.source)
    backward_names = {g.name for g in grads_in.values()}
    forward, backward = [], []
    for b in recorded:
        if any(p.name in backward_names for p in b.proxy_args()):
            backward.append(b)
            backward_names.update(p.name for p in b.proxy_outs())
        else:
            forward.append(b)
    args = {p.name for p in bsym.proxy_args()}
    puts = [(rename.get(x.name, x), rename.get(g.name, g)) for x, g in rec.puts]
    bad = [x.name for x, _ in puts if x.name not in args]
    check(not bad, lambda: f"{what}: put_grad on {bad}, which are not arguments of the symbol", ValueError)
    return GradTransformSplit(forward, backward, grads_in, puts)


def emit_grad_transform_backward(split: GradTransformSplit, g, bsym: BoundSymbol, zeros) -> list[tuple]:
    """Record the backward part into the current trace, reading the actual
    output gradients ``g`` (shaped like ``bsym.output``; None leaves become
    ``zeros(out)``). Returns the ``(input, grad)`` pairs."""
    subst: dict[str, Proxy] = {}
    for o, go in zip(pytree.leaves(bsym.output), pytree.leaves(g), strict=True):
        if isinstance(o, Proxy) and o.name in split.grads_in:
            subst[split.grads_in[o.name].name] = go if go is not None else zeros(o)
    trc = current_trace()
    for b in split.backward:
        trc.add_bound_symbol(rename_bsym(b, subst))
    return [(x, subst.get(gx.name, gx)) for x, gx in split.puts if gx is not None]
