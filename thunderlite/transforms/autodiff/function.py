"""User ``torch.autograd.Function`` subclasses, traced: their ``forward`` becomes
the decomposition of a symbol, their own ``backward`` its VJP rule.

``function_symbol(cls)`` gives (and caches) the symbol for ``cls.apply``; the
jit's lookaside records calls of ``SomeFunction.apply`` through it. Calling it
runs ``cls.forward(ctx, *args)`` on proxies with a tracing ``ctx`` that records
what PyTorch's ctx records (``save_for_backward``, ``mark_non_differentiable``,
``mark_dirty``, ``set_materialize_grads``, plain attributes) and answers
``needs_input_grad`` from the proxies. The rule runs ``cls.backward(ctx, *grads)``
into the backward trace, so the saved tensors are ordinary forward values
(saved, rematerialized or freed like any other) and in-place code inside either
method is recorded as functional op + ``copy_`` like everywhere else.

The symbol has no ``torch_fn``: executors run its decomposition, so the values
the backward reads exist in the forward trace. The forward and backward run
natively on proxies (torch calls dispatch to the torch language through
``__torch_function__``); data-dependent Python inside them is refused as
anywhere in tracing.

Example::

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * g * x

    thunderlite.jit(lambda x: Square.apply(x).sum())   # traced, not opaque
"""
from __future__ import annotations

import copy

import torch

from thunderlite.core import prims, pytree
from thunderlite.core.aliasing import views, writes
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, Symbol, free_tensors, walk
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import current_trace, made_once, tracectx
from thunderlite.torch.function_ctx import TracingCtx, context_of, remember_context
from thunderlite.transforms.aliasing.update_aliases import update_aliases
from thunderlite.transforms.autodiff.rules import zeros_like

_symbols: dict[type, Symbol] = {}
_by_id: dict[str, type] = {}
def function_symbol(cls: type) -> Symbol:
    """The symbol recording ``cls.apply`` (one per Function subclass)."""
    return made_once(_symbols, cls, lambda: _new_function_symbol(cls))


def _new_function_symbol(cls: type) -> Symbol:
    def decomposition(*args):
        ctx = TracingCtx(args)
        trc = current_trace()
        scope = trc._scopes[-1]             # the decomposition's own scope, opened by record_call
        out = cls.forward(ctx, *args)
        out = _rename_after_writes(trc, scope, out, ctx)
        out = _outputs_are_new_tensors(out, args)
        object.__setattr__(ctx, "_recorded_inputs", (args, free_tensors(scope)))
        for o in pytree.leaves(out):
            if isinstance(o, TensorProxy):
                remember_context(o, ctx)
                if o.name in ctx.non_differentiable:
                    o.requires_grad = False
        return out

    sym = Symbol(f"{cls.__name__}_{len(_symbols)}", decomposition=decomposition, module="autograd_function",
                 torch_fn=_as_called_by_eager_mode(cls).apply)
    _by_id[sym.id] = cls
    return sym


def _as_called_by_eager_mode(cls: type) -> type:
    """``cls`` as the eager-mode replay calls it (PyTorch autograd records it):
    its backward gets a gradient it can write in place where the one PyTorch's
    engine hands it overlaps itself (an expanded sum gradient). Eager's VJPs
    between a sum and the Function may have made it fresh memory (the slice
    ``v = y[0:n]``), while the trace records no op for a view of every element."""
    def backward(ctx, *grads):
        return cls.backward(ctx, *(_writable(g) for g in grads))
    return type(cls.__name__, (cls,), {"backward": staticmethod(backward), "__module__": cls.__module__})


def _writable(g):
    if isinstance(g, torch.Tensor) and any(st == 0 and n > 1 for st, n in zip(g.stride(), g.shape, strict=True)):
        return g.clone(memory_format=torch.contiguous_format)
    return g


def _outputs_are_new_tensors(out, args):
    """An input returned as it is (``return x``, ``x.view_as(x)``) comes out of
    ``apply`` as a new tensor aliasing it, as in PyTorch: without its own proxy
    the Function would record nothing and its backward would be lost."""
    inputs = {id(a) for a in pytree.leaves(args) if type(a) is TensorProxy}

    def fresh(o):
        if type(o) is TensorProxy and id(o) in inputs:
            return prims.reshape(o, tuple(o.shape))
        return o
    return pytree.tree_map(fresh, out)


def _rename_after_writes(trc: Trace, scope: list, out, ctx: TracingCtx):
    """Give the recorded forward its alias barriers (``update_aliases`` on the
    decomposition alone), so that every read inside it, the values it returns
    and the tensors it saves name the memory as it is when ``forward`` returns:
    PyTorch takes the saved tensors' versions at that point, so a ``backward``
    sees writes the forward made after ``save_for_backward``, and an input
    written in place (``ctx.mark_dirty``) comes back under a new name."""
    attrs = {k: v for k, v in vars(ctx).items() if type(v) is TensorProxy}
    inner = Trace("forward", names=trc.names)
    inner.args = free_tensors(scope)
    inner.bound_symbols = list(scope)
    inner._scopes = [inner.bound_symbols]
    with tracectx(inner):
        inner.set_return((out, ctx.saved_tensors, attrs))
    renamed = update_aliases(inner)
    if renamed is inner:
        return out
    scope[:] = renamed.bound_symbols[:-1]
    out, saved, attrs = renamed.output
    object.__setattr__(ctx, "_saved", tuple(saved))
    for k, v in attrs.items():
        object.__setattr__(ctx, k, v)
    return out


def is_function_symbol(sym: Symbol) -> bool:
    return sym.id in _by_id


def differentiable_outputs(bsym: BoundSymbol) -> list[TensorProxy]:
    """The outputs the forward did not mark non-differentiable (inexact ones)."""
    ctx = context_of(bsym)
    skip = ctx.non_differentiable if ctx is not None else set()
    return [o for o in bsym.tensor_outs() if o.name not in skip and (o.dtype.is_floating_point or o.dtype.is_complex)]


def function_vjp(bsym: BoundSymbol, g) -> list[tuple]:
    """Record the user's ``backward`` on proxies; ``(input, grad)`` pairs. Output
    gradients that are None become zeros unless the forward called
    ``ctx.set_materialize_grads(False)``, as in PyTorch."""
    cls = _by_id[bsym.sym.id]
    ctx = _with_current_inputs(context_of(bsym), bsym)
    outs = bsym.output if isinstance(bsym.output, tuple) else (bsym.output,)
    grads = g if isinstance(bsym.output, tuple) else (g,)
    if ctx.materialize_grads:
        grads = tuple(zeros_like(o) if gr is None and isinstance(o, TensorProxy) else gr
                      for o, gr in zip(outs, grads, strict=True))
    result = _run_backward(cls, ctx, grads)
    result = result if isinstance(result, tuple) else (result,)
    # not strict: like PyTorch, a backward may return extra trailing Nones beyond the inputs
    return [(a, r) for a, r in zip(bsym.args, result, strict=False)
            if isinstance(a, TensorProxy) and isinstance(r, TensorProxy)]


def _run_backward(cls: type, ctx: TracingCtx, grads: tuple):
    """``cls.backward`` recorded into the current trace. A backward that writes
    into an incoming gradient gets a copy of it: which gradients eager hands it
    as fresh memory depends on the VJPs before it (a slice's is fresh, a sum's
    is an expanded scalar), and the trace's may differ (a full slice is none)."""
    trc = current_trace()
    scratch = Trace("backward", names=trc.names)
    scratch.source = trc.source
    with tracectx(scratch):
        result = cls.backward(ctx, *grads)
    if not _writes_into(scratch.bound_symbols, grads):
        trc._inline(tuple(scratch.bound_symbols))
        return result
    grads = tuple(prims.clone(gr) if type(gr) is TensorProxy else gr for gr in grads)
    return cls.backward(ctx, *grads)


def _writes_into(bsyms, tensors) -> bool:
    """Whether ``bsyms`` write into one of ``tensors`` or a view of one."""
    memory = {t.name for t in tensors if type(t) is TensorProxy}
    for bsym in bsyms:
        for b in walk(bsym):
            for out, base in views(b):
                if base.name in memory:
                    memory.add(out.name)
            if any(dst.name in memory for dst, _ in writes(b)):
                return True
    return False


def _with_current_inputs(ctx: TracingCtx, bsym: BoundSymbol) -> TracingCtx:
    """``ctx`` naming the values ``bsym`` reads now: a pass that replaced the
    forward's inputs (functionalize reads a written argument's functional value)
    renames the call and its decomposition, not the tensors the ``ctx`` saved."""
    recorded = getattr(ctx, "_recorded_inputs", None)
    if recorded is None:            # no traced forward recorded what to rename
        return ctx
    args, free = recorded
    swap = {a.name: b for a, b in zip(args, bsym.args, strict=True)
            if type(a) is TensorProxy and type(b) is TensorProxy}
    now = free_tensors(bsym.subsymbols)
    if len(now) == len(free):
        swap.update((a.name, b) for a, b in zip(free, now, strict=True))
    swap = {k: v for k, v in swap.items() if v.name != k}
    if not swap:
        return ctx
    renamed = copy.copy(ctx)
    rename = lambda x: swap.get(x.name, x) if type(x) is TensorProxy else x  # noqa: E731
    object.__setattr__(renamed, "_saved", tuple(pytree.tree_map(rename, ctx._saved)))
    for k, v in vars(ctx).items():
        if type(v) is TensorProxy:
            object.__setattr__(renamed, k, rename(v))
    return renamed
