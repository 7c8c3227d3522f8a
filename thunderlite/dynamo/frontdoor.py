"""The user-facing entry points of ThunderFX: ``thunderfx`` and the
``"thunderlite"`` backend name, and the accessors that find the compiler
behind a compiled callable."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from thunderlite.dynamo.compiler import ThunderCompiler


def thunderlite_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """The ``backend="thunderlite"`` entry point: a default ``ThunderCompiler`` per graph."""
    return ThunderCompiler()(gm, example_inputs)


class ThunderFXFunction:
    """A function compiled by ``thunderfx``: call it as the function."""

    def __init__(self, fn: Callable, compiled: Callable, compiler: ThunderCompiler):
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)
        self._compiled = compiled
        self.thunder_compiler = compiler

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled(*args, **kwargs)

    def last_traces(self) -> list[list]:
        return self.thunder_compiler.last_traces()

    def last_backward_traces(self) -> list[list]:
        return self.thunder_compiler.last_backward_traces()

    def report(self) -> str:
        return self.thunder_compiler.report()


def thunderfx(fn: Callable | torch.nn.Module, *, fallback: str = "inductor",
              torch_compile_options: dict | None = None, **jit_options: Any):
    """``torch.compile(fn, backend=ThunderCompiler(fallback=..., **jit_options))``.

    A module comes back as torch.compile's ``OptimizedModule`` (an ``nn.Module``)
    and a function as a ``ThunderFXFunction``; both carry ``thunder_compiler``,
    so ``thunderlite.dynamo.last_traces(compiled)`` / ``report(compiled)`` work."""
    compiler = ThunderCompiler(fallback=fallback, **jit_options)
    compiled = torch.compile(fn, backend=compiler, **(torch_compile_options or {}))
    if isinstance(fn, torch.nn.Module):
        compiled.thunder_compiler = compiler
        return compiled
    return ThunderFXFunction(fn, compiled, compiler)


def _compiler(obj: Any) -> ThunderCompiler:
    if isinstance(obj, ThunderCompiler):
        return obj
    compiler = getattr(obj, "thunder_compiler", None)
    if not isinstance(compiler, ThunderCompiler):
        raise TypeError(f"expected a ThunderCompiler or a callable returned by thunderlite.thunderfx, "
                        f"got {type(obj).__name__}")
    return compiler


def last_traces(obj: Any) -> list[list]:
    """Per thunderlite piece: the stages of its last call (``obj``: compiled callable or compiler)."""
    return _compiler(obj).last_traces()


def last_backward_traces(obj: Any) -> list[list]:
    return _compiler(obj).last_backward_traces()


def report(obj: Any) -> str:
    """Every graph, every piece, who ran it and why each split happened, with the user's line."""
    return _compiler(obj).report()
