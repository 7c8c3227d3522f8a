"""Traces: an ordered list of bound symbols with a signature, printable as Python.

Example::

    trc = Trace(name="computation")
    with tracectx(trc):
        a = TensorProxy(shape=(8,), name="a")
        b = TensorProxy(shape=(8,), name="b")
        trc.args = [a, b]
        out = ltorch.sum(ltorch.sin(a * b + 1))
        trc.set_return(out)
    print(trc)                      # runnable Python
    fn = trc.python_callable(resolve=torch_executor.resolve)

A pass derives a new trace with ``from_trace`` (sharing the name space, so names
stay unique across the family) and never mutates its input (CONTRIBUTING.md, style 6).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core import codegen
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.tags import Tag


class _Names:
    """Names taken in a family of traces, and the next counter per prefix."""
    __slots__ = ("taken", "counters")

    def __init__(self):
        self.taken: set[str] = set(codegen.RESERVED_NAMES)
        self.counters: dict[str, int] = {}

    def fresh(self, prefix: str) -> str:
        n = self.counters.get(prefix, 0)
        while True:
            name = f"{prefix}{n}"
            n += 1
            if name not in self.taken:
                break
        self.counters[prefix] = n
        self.taken.add(name)
        return name

    def claim(self, wanted: str) -> str:
        """``wanted`` if it is a free identifier, else a fresh variant of it."""
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in wanted) or "v"
        if base[0].isdigit():
            base = "_" + base
        if base not in self.taken:
            self.taken.add(base)
            return base
        return self.fresh(base + "_")


def _return_impl(x):
    return x


RETURN = Symbol("return", impl=_return_impl, module="", tags={Tag.RETURN, Tag.DONT_DCE})


class Trace:
    """A program: ``args`` (the signature, proxies), ``bound_symbols`` (ending
    with a return), and printing/compiling. ``stage`` names the pass that made it."""

    def __init__(self, name: str = "computation", stage: str = "", names: _Names | None = None):
        self.name = name
        self.stage = stage
        self.args: list = []
        self.bound_symbols: list[BoundSymbol] = []
        self.names = names if names is not None else _Names()
        self.header_comments: list[str] = []
        self.source = None                    # the user line symbols are recorded from
        self.pass_time_ms: float | None = None
        self._scopes: list[list[BoundSymbol]] = [self.bound_symbols]
        self.writes = 0                        # in-place symbols recorded so far (memos of values expire)
        self.rebound: dict[int, tuple] = {}    # id(proxy) -> tensor objects that changed value (retrace.rebind)

    # --- naming ------------------------------------------------------------------
    def fresh_name(self, prefix: str = "t") -> str:
        return self.names.fresh(prefix)

    def claim_name(self, wanted: str) -> str:
        return self.names.claim(wanted)

    # --- recording -----------------------------------------------------------------
    def record_call(self, sym: Symbol, args: tuple, kwargs: dict) -> Any:
        """Run ``sym`` on proxies and record it (see core/symbol.py)."""
        try:
            return self._record_call(sym, args, kwargs)
        finally:
            if Tag.INPLACE in sym.tags:     # counted once written (what it reads came before)
                self.writes += 1

    def _record_call(self, sym: Symbol, args: tuple, kwargs: dict) -> Any:
        if sym.decomposition is None:
            out = sym.meta(*args, **kwargs)
            subsymbols = ()
        else:
            self._scopes.append([])
            try:
                out = sym.decomposition(*args, **kwargs)
            finally:
                subsymbols = tuple(self._scopes.pop())
            if not subsymbols:
                return out              # a no-op composite: returns its input or constants
            if any(Tag.UNBACKED in s.sym.tags or Tag.SIZE_CHECK in s.sym.tags for s in subsymbols):
                # a size made at run time (``u0`` of nonzero) must be defined where its
                # readers can see it, and a check of one must run even where an executor
                # runs the composite as one call: it is recorded as its decomposition
                self._inline(subsymbols)
                return out
        scope = self._scopes[-1]
        source = self.source if len(self._scopes) == 1 else None
        scope.append(BoundSymbol(sym, args, kwargs, out, subsymbols, source))
        return out

    def _inline(self, bsyms: tuple) -> None:
        top = len(self._scopes) == 1
        self._scopes[-1].extend(b.replace(source=self.source) if top and b.source is None else b for b in bsyms)

    def add_top_level(self, bsym: BoundSymbol) -> None:
        """Append to the trace itself, also while a composite is being recorded
        (it lands before that composite, after everything recorded so far)."""
        self.bound_symbols.append(bsym.replace(source=self.source) if bsym.source is None else bsym)

    def set_return(self, value: Any) -> None:
        self.bound_symbols.append(BoundSymbol(RETURN, (value,), {}, None))

    def add_bound_symbol(self, bsym: BoundSymbol) -> None:
        self._scopes[-1].append(bsym)

    # --- deriving --------------------------------------------------------------------
    def from_trace(self, stage: str) -> Trace:
        """An empty trace of the same family and signature, for a pass to fill."""
        t = Trace(self.name, stage, self.names)
        t.args = list(self.args)
        return t

    def with_bound_symbols(self, stage: str, bound_symbols: list[BoundSymbol]) -> Trace:
        t = self.from_trace(stage)
        t.bound_symbols = list(bound_symbols)
        t._scopes = [t.bound_symbols]
        return t

    @property
    def return_bsym(self) -> BoundSymbol | None:
        if self.bound_symbols and Tag.RETURN in self.bound_symbols[-1].sym.tags:
            return self.bound_symbols[-1]
        return None

    @property
    def output(self) -> Any:
        r = self.return_bsym
        return r.args[0] if r is not None else None

    # --- printing and compiling ----------------------------------------------------
    def python(self, *, subsymbols: bool = True) -> str:
        return codegen.trace_source(self, subsymbols=subsymbols)

    def __str__(self):
        return self.python()

    def __repr__(self):
        return f"<Trace {self.name!r} ({self.stage}): {len(self.bound_symbols)} symbols>"

    def python_callable(self, resolve: Callable[[Symbol], Callable] | None = None,
                        extra_globals: dict | None = None) -> Callable:
        """Compile the trace. ``resolve(sym)`` gives the callable each top-level
        symbol runs; by default the symbol's own ``impl`` (executor symbols)."""
        consts: dict = {}
        src, code_text = codegen.trace_sources(self, consts)
        globs: dict = {"torch": torch, "__builtins__": __builtins__}
        globs.update(consts)
        if extra_globals:
            globs.update(extra_globals)
        for bsym in self.bound_symbols:
            sym = bsym.sym
            if Tag.RETURN in sym.tags:
                continue
            fn = resolve(sym) if resolve is not None else sym.impl
            if fn is None:
                raise NotImplementedError(
                    f"no implementation to run {sym.id}: this trace has not been claimed by an executor")
            codegen.bind_path(globs, f"{sym.module}.{sym.name}" if sym.module else sym.name, fn)
        fn = codegen.compile_source(src, self.name, globs, code_text)
        fn.__thunderlite_source__ = src
        return fn


class TracePass:
    """Shared wrapper for ``trace -> trace`` passes: times the pass and stamps the
    stage name on the result, so no pass repeats that code (CONTRIBUTING.md, style 6)."""

    def __init__(self, stage: str, fn: Callable[..., Trace]):
        self.stage = stage
        self.fn = fn

    def __call__(self, trace: Trace, *args, **kwargs) -> Trace:
        start = time.perf_counter()
        out = self.fn(trace, *args, **kwargs)
        if out is not trace:
            out.stage = self.stage
            out.pass_time_ms = (time.perf_counter() - start) * 1e3
            if not any(c.startswith("pass time") for c in out.header_comments):
                out.header_comments.append(f"pass time: {out.pass_time_ms:.3f} ms")
        return out


def trace_pass(stage: str) -> Callable[[Callable[..., Trace]], TracePass]:
    """Decorator form of ``TracePass``."""
    return lambda fn: TracePass(stage, fn)
