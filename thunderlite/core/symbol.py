"""Symbols (operations) and bound symbols (one call of an operation in a trace).

A ``Symbol`` is defined once, with its meta function and, for composites, its
decomposition, in one block next to its rules (CONTRIBUTING.md, style 3). Calling a symbol
while a trace is active records a ``BoundSymbol``:

- a *leaf* symbol (a prim, an opaque torch op, an executor's operator) runs its
  meta function on the proxies to produce output proxies;
- a *composite* runs its decomposition, whose symbol calls are recorded as the
  bound symbol's ``subsymbols``.

Example::

    add = Symbol("add", meta=_add_meta, module="prims", tags={Tag.PRIM})
    with tracectx(trace):
        c = add(a, b)        # appends BoundSymbol(add, (a, b), {}, c) to trace
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thunderlite.core import pytree
from thunderlite.core.codegen import bsym_line
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symint import SymInt
from thunderlite.core.tags import Tag
from thunderlite.core.tracectx import current_trace


class Symbol:
    """An operation. ``module`` is the dotted prefix it prints under
    (``prims``, ``ltorch``, ``torch``...). ``executor`` and ``impl`` are set on the
    symbols executors make: the callable that runs the op on real values."""
    __slots__ = ("name", "meta", "decomposition", "module", "tags", "executor", "impl",
                 "torch_fn", "inplace_of", "__weakref__")

    def __init__(self, name: str, *, meta: Callable | None = None, decomposition: Callable | None = None,
                 module: str = "ltorch", tags=(), executor=None, impl: Callable | None = None,
                 torch_fn: Callable | None = None, inplace_of: Symbol | None = None):
        if meta is None and decomposition is None and impl is None:
            raise ValueError(f"symbol {name!r} needs a meta function, a decomposition or an impl")
        self.name = name
        self.meta = meta
        self.decomposition = decomposition
        self.module = module
        self.tags = frozenset(tags)
        self.executor = executor
        self.impl = impl
        self.torch_fn = torch_fn          # the torch callable this symbol mirrors, if any
        self.inplace_of = inplace_of      # for add_: the functional symbol (add)

    @property
    def id(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def is_leaf(self) -> bool:
        return self.decomposition is None

    @property
    def is_prim(self) -> bool:
        return Tag.PRIM in self.tags

    def __repr__(self):
        return f"<Symbol {self.id}>"

    def __call__(self, *args, **kwargs):
        trc = current_trace()
        if trc is None:
            if self.impl is not None:
                return self.impl(*args, **kwargs)
            raise RuntimeError(f"{self.id} was called outside a trace; run traces through an executor")
        return trc.record_call(self, args, kwargs)

    def bind(self, *args, output=None, subsymbols=(), source=None, **kwargs) -> BoundSymbol:
        """A bound symbol built directly, without running meta (for passes)."""
        return BoundSymbol(self, args, kwargs, output, tuple(subsymbols), source)


class SourceLine(tuple):
    """``(filename, lineno, line_text)``: the user's line a symbol came from.

    The jit records the innermost line that is neither thunderlite's nor
    torch's (``frontend/source_map.py: source_line``), so an ``F.linear``
    recorded inside ``nn.Linear.forward`` names the user's ``self.proj(x)``.
    ``callers`` holds ``(filename, lineno)`` of the frames that led to that
    line, outermost first; ``via`` the library frames from it to where the
    symbol was recorded (``nn.Linear.forward``'s line last), empty when the
    user's line recorded it itself. Compares and unpacks as the plain 3-tuple."""

    def __new__(cls, fields, callers: tuple = (), via: tuple = ()):
        self = super().__new__(cls, fields)
        self.callers = tuple(callers)
        self.via = tuple(via)
        return self


class BoundSymbol:
    """One call in a trace: what ran, on what, producing what.

    ``source`` is the user's ``(filename, lineno, line_text)`` it came from (a
    ``SourceLine`` when recorded by the jit), or None.
    ``header`` is an optional comment printed above it."""
    __slots__ = ("sym", "args", "kwargs", "output", "subsymbols", "source", "header", "_flat_args", "_flat_outs",
                 "_deep_tags")

    def __init__(self, sym: Symbol, args: tuple, kwargs: dict, output: Any,
                 subsymbols: tuple = (), source=None, header: str | None = None):
        self.sym = sym
        self.args = args
        self.kwargs = kwargs
        self.output = output
        self.subsymbols = subsymbols
        self.source = source
        self.header = header
        self._flat_args = None      # (args, kwargs, leaves): passes ask for the leaves many times
        self._flat_outs = None
        self._deep_tags = None      # (sym, subsymbols, tags)

    def replace(self, **changes) -> BoundSymbol:
        kw = dict(sym=self.sym, args=self.args, kwargs=self.kwargs, output=self.output,
                  subsymbols=self.subsymbols, source=self.source, header=self.header)
        kw.update(changes)
        return BoundSymbol(**kw)

    # --- dataflow views used by every pass -----------------------------------------
    def flat_args(self) -> list:
        c = self._flat_args
        if c is None or c[0] is not self.args or c[1] is not self.kwargs:
            out = pytree.leaf_list(self.args)
            if self.kwargs:
                pytree.leaf_list(self.kwargs, out)
            if SymInt in map(type, out):
                # a symbolic size reads the trace values (size symbols) it is made of
                out.extend(p for a in out if type(a) is SymInt for p in a.proxies())
            self._flat_args = c = (self.args, self.kwargs, out)
        return list(c[2])

    def flat_outs(self) -> list:
        c = self._flat_outs
        if c is None or c[0] is not self.output:
            self._flat_outs = c = (self.output, pytree.leaf_list(self.output))
        return list(c[1])

    def proxy_args(self) -> list[Proxy]:
        return [a for a in self.flat_args() if isinstance(a, Proxy)]

    def proxy_outs(self) -> list[Proxy]:
        return [o for o in self.flat_outs() if isinstance(o, Proxy)]

    def tensor_args(self) -> list[TensorProxy]:
        return [a for a in self.flat_args() if type(a) is TensorProxy]

    def tensor_outs(self) -> list[TensorProxy]:
        return [o for o in self.flat_outs() if type(o) is TensorProxy]

    def has_tag(self, tag: Tag) -> bool:
        return tag in self.sym.tags

    def parts(self) -> list[BoundSymbol]:
        """The subsymbols, each with this call's user line where it has none:
        a pass that inlines a decomposition keeps where its parts came from."""
        return with_source(self.subsymbols, self.source)

    def deep_tags(self) -> frozenset:
        """The tags of this symbol and of every symbol in its decomposition:
        passes ask "is there a write / a random draw anywhere in it" of every
        symbol, several times per compile."""
        c = self._deep_tags
        if c is None or c[0] is not self.sym or c[1] is not self.subsymbols:
            tags = self.sym.tags        # a frozenset (Symbol.__init__)
            if self.subsymbols:
                tags = tags.union(*[s.deep_tags() for s in self.subsymbols])
            self._deep_tags = c = (self.sym, self.subsymbols, tags)
        return c[2]

    def __repr__(self):
        return bsym_line(self, {})


def with_source(bsyms, source) -> list[BoundSymbol]:
    """``bsyms`` with ``source`` where they have no user line of their own."""
    return [b if b.source is not None else b.replace(source=source) for b in bsyms]


def free_proxies(bsyms) -> list[Proxy]:
    """Proxies (tensors and numbers) ``bsyms`` read without defining them (a
    decomposition's inputs, and values it reads from outside), in first-use order."""
    defined, free = set(), {}
    for bsym in bsyms:
        for p in bsym.proxy_args():
            if p.name not in defined:
                free.setdefault(p.name, p)
        defined.update(p.name for p in bsym.proxy_outs())
    return list(free.values())


def free_tensors(bsyms) -> list[TensorProxy]:
    """The tensors among ``free_proxies(bsyms)``."""
    return [p for p in free_proxies(bsyms) if type(p) is TensorProxy]


def walk(bsym: BoundSymbol):
    """``bsym`` and every bound symbol nested in its decomposition, outermost
    first (pre-order): the one traversal passes use to look inside composites."""
    stack = [bsym]
    while stack:
        b = stack.pop()
        yield b
        if b.subsymbols:
            stack.extend(reversed(b.subsymbols))
