"""The ``ctx`` a traced ``torch.autograd.Function`` sees, and which call's
outputs it belongs to.

It lives below the passes because two of them ask it: autodiff (the saved
tensors, non-differentiable outputs, ``materialize_grads``) and the alias
model (writes into tensors the forward did not ``mark_dirty`` are not checked
by autograd). The symbol and its VJP are ``transforms/autodiff/function.py``.
"""
from __future__ import annotations

import weakref

from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol

# id(output proxy) -> (weak reference to it, ctx). Keyed by id: proxies define
# ``__eq__`` as a traced op, so they cannot be dictionary keys themselves.
_contexts: dict[int, tuple] = {}


def remember_context(proxy: TensorProxy, ctx: TracingCtx) -> None:
    """``proxy`` is an output of the traced call whose ctx is ``ctx``."""
    key = id(proxy)
    _contexts[key] = (weakref.ref(proxy, lambda _r, k=key, table=_contexts: table.pop(k, None)), ctx)


class TracingCtx:
    """The ``ctx`` a traced ``forward``/``backward`` sees."""

    def __init__(self, args: tuple):
        object.__setattr__(self, "_saved", ())
        object.__setattr__(self, "non_differentiable", set())
        object.__setattr__(self, "dirty", set())
        object.__setattr__(self, "materialize_grads", True)
        object.__setattr__(self, "needs_input_grad",
                           tuple(isinstance(a, TensorProxy) and a.requires_grad for a in args))

    def save_for_backward(self, *tensors) -> None:
        object.__setattr__(self, "_saved", tuple(tensors))

    save_for_forward = save_for_backward

    @property
    def saved_tensors(self) -> tuple:
        return self._saved

    def mark_non_differentiable(self, *tensors) -> None:
        self.non_differentiable.update(t.name for t in tensors if isinstance(t, TensorProxy))

    def mark_dirty(self, *tensors) -> None:
        self.dirty.update(t.name for t in tensors if isinstance(t, TensorProxy))

    def set_materialize_grads(self, value: bool) -> None:
        object.__setattr__(self, "materialize_grads", bool(value))


def context_of(bsym: BoundSymbol) -> TracingCtx | None:
    """The ctx of the traced Function call ``bsym``, None if it is not one."""
    for o in bsym.tensor_outs():
        entry = _contexts.get(id(o))
        if entry is not None and entry[0]() is o:
            return entry[1]
    return None
