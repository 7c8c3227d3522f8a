"""What a jitted module shows of the model it wraps (``api.ThunderliteModule``).

Libraries read a model's signature and call the model from its own methods:
HF ``Trainer`` keeps only the dataset columns named by ``model.forward``'s
parameters, and HF ``generate`` calls ``self(...)`` once per token. So:

- the jitted module's ``forward``, and the jitted module itself, carry the
  model's forward signature (``inspect.signature(jm.forward)`` and
  ``inspect.signature(jm)`` are ``inspect.signature(model.forward)``);
- a method of the model reached through the jitted module (``jm.generate``)
  runs with the model's calls routed to the compiled program: while it runs,
  the model's ``_compiled_call_impl`` (the hook ``nn.Module.compile`` uses,
  which ``nn.Module.__call__`` calls instead of ``_call_impl`` when set) is the
  jitted call. The compiled program calls ``module._call_impl`` itself, below
  that hook, so it never meets its own route. Where torch.compile is loaded
  the route is ``torch.compiler.disable``d: a method that compiles the model's
  ``__call__`` (HF ``generate`` does for static caches on GPUs) gets a graph
  break there, and the jitted call runs as it is instead of being traced by
  dynamo.

Example::

    jm = thunderlite.jit(model)
    inspect.signature(jm.forward) == inspect.signature(model.forward)    # True
    jm.generate(ids, max_new_tokens=20)     # each step runs the compiled forward
"""
from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import torch


def forward_signature(model: torch.nn.Module) -> inspect.Signature | None:
    """``inspect.signature(model.forward)``, or None when it has none."""
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None


def signed_forward(jitted_module: torch.nn.Module, model: torch.nn.Module, run: Callable) -> Callable:
    """``jitted_module.forward``: ``run(*args, **kwargs)`` as a method of the
    jitted module whose signature is the model's forward's. A bound method (of a
    function made per jitted module), so code that unwraps ``forward.__func__``
    (accelerate's mixed precision) and ``copy.deepcopy`` keep working."""
    def forward(self, *args, **kwargs):
        return run(*args, **kwargs)
    sig = forward_signature(model)
    if sig is not None and "self" not in sig.parameters:
        first = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
        forward.__signature__ = sig.replace(parameters=[first, *sig.parameters.values()])
    forward.__doc__ = getattr(model.forward, "__doc__", None)
    return types.MethodType(forward, jitted_module)


class CompiledCalls:
    """Routes the model's calls to ``call`` while one of its methods, reached
    through the jitted module, runs. Threads share the route: it is set by the
    first method call to start and removed by the last to end (a call of the
    model made meanwhile from elsewhere runs compiled too, with eager's answer)."""

    def __init__(self, model: torch.nn.Module, call: Callable):
        self._model = model
        self._call = call
        self._lock = threading.Lock()
        self._running = 0
        self._saved: Any = None

    def method(self, bound: Callable) -> Callable:
        """``bound`` (a method of the model) running with the route set."""
        @functools.wraps(bound)
        def routed(*args, **kwargs):
            self._enter()
            try:
                return bound(*args, **kwargs)
            finally:
                self._exit()
        return routed

    def _enter(self) -> None:
        with self._lock:
            if self._running == 0:
                state = self._model.__dict__
                self._saved = state.get("_compiled_call_impl")
                state["_compiled_call_impl"] = self._route()
            self._running += 1

    def _route(self) -> Callable:
        # once torch._dynamo is loaded (transformers loads it), a disabled call costs ~2 µs more
        if "torch._dynamo" in sys.modules and not getattr(self._call, "_torchdynamo_disable", False):
            self._call = torch.compiler.disable(self._call, reason="a thunderlite-jitted call")
        return self._call

    def _exit(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self._model.__dict__["_compiled_call_impl"] = self._saved
                self._saved = None


def is_method_of(value: Any, model: torch.nn.Module) -> bool:
    return isinstance(value, types.MethodType) and value.__self__ is model
