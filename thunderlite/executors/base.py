"""The Executor API (docs/architecture.md §6).

An executor turns bound symbols of a trace into something that runs. The
execution transform (transforms/claim.py) talks to executors through two
methods only, so it never imports a concrete executor:

- ``fusion_pass(trace) -> trace``: a fusion executor replaces regions by fusion
  symbols it compiled (operator executors return the trace unchanged);
- ``claim(bsym) -> BoundSymbol | list[BoundSymbol] | None``: an operator
  executor returns the bound symbol rebound to its own executor symbol (same
  args, kwargs, output, subsymbols and source), the symbols its
  ``execution_transform`` traced in its place, or None if it cannot run it.

Autodiff asks one more question (``differentiation(bsym)``): whether this
executor owns the differentiation of a symbol it implements (its
``grad_transform``, or "keep my forward call, differentiate the decomposition").

Example, a user executor that runs ``prims.sin`` ahead of torch::

    myex = OperatorExecutor("myex")
    myex.register_implementation(prims.sin, my_sin)            # prints as myex.sin(...)
    myex.register_implementation(prims.cos, torch.cos)          # prints as torch.cos(...)
    register_executor(myex)
    jit(fn, executors=[myex, "torch"])

Sizes may be symbolic (dynamic shapes, core/symint.py): an implementation then
receives the concrete sizes at run time, but its checker sees ``SymInt``
dimensions. An executor that cannot take them sets ``symbolic_sizes = False``
and is not offered such symbols (the next executor runs them).
"""
from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from thunderlite.core import prims
from thunderlite.core.retrace import retrace
from thunderlite.core.symbol import BoundSymbol, Symbol, with_source
from thunderlite.core.symint import mentions_symbolic
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import current_trace, tables_lock, tracectx
from thunderlite.torch import registry as ltorch_registry


class Executor:
    """Something that can run bound symbols. ``name`` is unique in the registry.
    ``symbolic_sizes``: whether it runs symbols whose sizes are symbolic
    (core/symint.py); one that compiles for static shapes says False and is
    not offered them (they stay for the next executor)."""
    symbolic_sizes = True
    fuses_elementwise = False
    """Whether it fuses elementwise symbols into their neighbours' kernels: then
    autodiff recomputes a cheap value in the backward from fewer saved bytes
    (a widening from its half precision input; transforms/autodiff/rematerialize.py)."""

    def __init__(self, name: str):
        if not name.isidentifier():
            raise ValueError(f"executor name {name!r} must be a Python identifier (it prefixes printed calls)")
        self.name = name
        self._availability: tuple[bool, str] | None = None

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}>"

    def check_availability(self) -> tuple[bool, str]:
        """Override: whether this executor can run here, and why not. Called once."""
        return True, ""

    def is_available(self) -> tuple[bool, str]:
        """``(available, reason)``, computed once (imports and device checks are slow)."""
        if self._availability is None:
            try:
                self._availability = self.check_availability()
            except Exception as e:  # noqa: BLE001 - an executor's probe must never crash the import of thunderlite
                self._availability = (False, f"availability check failed: {type(e).__name__}: {e}")
        return self._availability

    def can_run(self, bsym: BoundSymbol) -> bool:
        return self.claim(bsym) is not None

    def claim(self, bsym: BoundSymbol) -> BoundSymbol | list[BoundSymbol] | None:
        return None

    def differentiation(self, bsym: BoundSymbol) -> Implementation | None:
        """The implementation whose forward must survive autodiff, or None."""
        return None

    def fusion_pass(self, trace: Trace, input_alias_groups=None) -> Trace:
        """``input_alias_groups``: which inputs share storage (see transforms/fusion.py)."""
        return trace


# --- how an executor symbol prints ------------------------------------------------------

_TORCH_NAMESPACES = ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft",
                     "torch.Tensor")
_torch_paths: dict[int, str] | None = None


def _namespace(path: str):
    obj = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def torch_path(fn: Callable) -> str | None:
    """The public dotted name a torch callable is reachable under (``torch.add``,
    ``torch.nn.functional.linear``, ``torch.Tensor.add_``), or None."""
    global _torch_paths
    if _torch_paths is None:
        paths: dict[int, str] = {}
        for ns_path in _TORCH_NAMESPACES:
            ns = _namespace(ns_path)
            for attr in dir(ns):
                if attr.startswith("_"):
                    continue
                try:
                    obj = getattr(ns, attr)
                except Exception:   # noqa: BLE001 - some torch attributes raise on access (deprecated aliases)
                    continue
                if callable(obj) and not isinstance(obj, type):
                    paths.setdefault(id(obj), f"{ns_path}.{attr}")
        _torch_paths = paths
    path = _torch_paths.get(id(fn))
    return path if path is not None and _resolve_path(path) is fn else None


def _resolve_path(path: str):
    try:
        return _namespace(path) if path.startswith("torch.") else None
    except AttributeError:
        return None


class Implementation:
    """One ``register_implementation``: the executor symbol, the optional
    checker, and Thunder's two optional transforms (see OperatorExecutor)."""
    __slots__ = ("of", "symbol", "checker", "grad_transform", "execution_transform")

    def __init__(self, of: Symbol, symbol: Symbol | None, checker: Callable | None,
                 grad_transform: Callable | None, execution_transform: Callable | None):
        self.of = of
        self.symbol = symbol
        self.checker = checker
        self.grad_transform = grad_transform
        self.execution_transform = execution_transform

    def accepts(self, bsym: BoundSymbol) -> bool:
        return self.checker is None or bool(self.checker(*bsym.args, **bsym.kwargs))


class OperatorExecutor(Executor):
    """Runs single symbols with registered implementations.

    ``register_implementation(sym, impl)`` creates an executor symbol that calls
    ``impl(*bsym.args, **bsym.kwargs)`` and prints as the real torch call when
    ``impl`` is a public torch callable (``torch.mul(a, b)``), else as
    ``<print_module>.<symbol name>(...)`` (``print_module`` defaults to the name).
    A ``checker`` is called with the bound symbol's proxies (same args/kwargs)
    and may decline (return False).

    The implementation of a torch-language symbol (``"ltorch.sin"``) or of a
    prim (``prims.sin``) runs wherever that symbol runs: with and without grad,
    inside decompositions (claim.py) and in backward traces. Differentiating a
    composite it implements keeps the forward call and differentiates the
    decomposition in the backward (recomputing what the backward needs), unless
    ``grad_transform`` is given: a function with the symbol's signature that
    computes the forward (usually with this executor's operators, see
    ``register_operator``), reads output gradients with ``get_grad(out)`` and
    gives input gradients with ``put_grad(a, grad)``; what depends on a
    ``get_grad`` becomes the backward. ``execution_transform``: a function with
    the symbol's signature traced in its place at claim time (instead of
    ``impl``), e.g. to express it with several operators; it must not call the
    symbol it replaces."""

    def __init__(self, name: str):
        super().__init__(name)
        self.print_module = name                      # prefix of calls that are not public torch callables
        self._impls: dict[Symbol, Implementation] = {}
        self._printed: dict[str, Callable] = {}      # module.name -> impl, to keep printing unambiguous
        self._operators: dict[str, Symbol] = {}

    def register_implementation(self, sym: Symbol | str, impl: Callable | Symbol | None = None, *,
                                checker: Callable | None = None, grad_transform: Callable | None = None,
                                execution_transform: Callable | None = None, print_as: str | None = None,
                                extra_tags=()) -> Symbol | None:
        """``impl``: a callable, or an operator of this executor (``register_operator``).
        ``extra_tags``: facts about ``impl`` the symbol lacks, e.g. ``Tag.VIEW``
        when it returns a view of its input. Returns the executor symbol."""
        sym = _lookup_symbol(sym)
        if sym in self._impls:
            raise ValueError(f"executor {self.name!r} already has an implementation of {sym.id}")
        prims.check((impl is None) != (execution_transform is None),
                    lambda: f"register_implementation({sym.id}): give exactly one of impl and execution_transform",
                    ValueError)
        if isinstance(impl, Symbol):
            prims.check(impl.executor is self, lambda: f"{impl.id} is not an operator of executor {self.name!r}",
                        ValueError)
            exsym = impl
        else:
            exsym = self.executor_symbol(sym, impl, print_as, extra_tags) if impl is not None else None
        self._impls[sym] = Implementation(sym, exsym, checker, grad_transform, execution_transform)
        return exsym

    def register_operator(self, name: str, *, fn: Callable, like: Symbol | str | None = None,
                          meta: Callable | None = None, tags=()) -> Symbol:
        """A new leaf symbol of this executor, callable while tracing (in a
        ``grad_transform`` or ``execution_transform``) and run as ``fn``. Its
        output metadata comes from ``meta``, or from tracing ``like`` (a symbol
        with the same signature and outputs)."""
        prims.check(name not in self._operators, lambda: f"executor {self.name!r} already has an operator {name!r}",
                    ValueError)
        prims.check((like is None) != (meta is None), lambda: "register_operator: give exactly one of like and meta",
                    ValueError)
        if like is not None:
            like = _lookup_symbol(like)
            meta = like.meta if like.meta is not None else _meta_by_tracing(like)
            tags = (like.tags - {Tag.PRIM}) | frozenset(tags)
        base = Symbol(name, meta=meta, module=self.print_module, tags=tags)
        op = self.executor_symbol(base, fn, None, ())
        self._operators[name] = op
        return op

    def implemented_symbols(self) -> list[Symbol]:
        return list(self._impls)

    def implementations(self) -> list[Implementation]:
        return list(self._impls.values())

    def differentiation(self, bsym: BoundSymbol) -> Implementation | None:
        entry = self._impls.get(bsym.sym)
        if entry is None or not entry.accepts(bsym):
            return None
        if entry.grad_transform is None and bsym.sym.decomposition is None:
            return None                 # a leaf (a prim): its own VJP rule is used, the forward stays anyway
        return entry

    def executor_symbol(self, sym: Symbol, impl: Callable, print_as: str | None = None, extra_tags=()) -> Symbol:
        """A leaf symbol of this executor running ``impl`` in place of ``sym``."""
        if print_as is not None:
            check_print_path(print_as, impl)
            module, _, name = print_as.rpartition(".")
        else:
            path = torch_path(impl)
            module, _, name = path.rpartition(".") if path else (self.print_module, "", sym.name)
        if module == self.print_module:
            name = self._unique_name(name, impl)
        tags = (sym.tags - {Tag.PRIM}) | frozenset(extra_tags)
        return Symbol(name, meta=sym.meta, module=module, tags=tags, executor=self,
                      impl=impl, torch_fn=sym.torch_fn, inplace_of=sym.inplace_of)

    def _unique_name(self, name: str, impl: Callable) -> str:
        with tables_lock:
            candidate, n = name, 0
            while self._printed.get(candidate, impl) is not impl:
                n += 1
                candidate = f"{name}_{n}"
            self._printed[candidate] = impl
        return candidate

    def claim(self, bsym: BoundSymbol) -> BoundSymbol | list[BoundSymbol] | None:
        entry = self._impls.get(bsym.sym)
        if entry is None or not entry.accepts(bsym):
            return None
        if not self.symbolic_sizes and mentions_symbolic(bsym):
            return None
        if entry.execution_transform is not None:
            return traced_in_place(bsym, entry.execution_transform, f"execution_transform of {bsym.sym.id}")
        return bsym.replace(sym=entry.symbol)


def _meta_by_tracing(like: Symbol) -> Callable:
    """A meta function for an operator shaped like the composite ``like``:
    trace ``like`` into a scratch trace and keep only its output."""
    def meta(*args, **kwargs):
        current = current_trace()
        with tracectx(Trace("meta", names=current.names if current is not None else None)):
            return like(*args, **kwargs)
    return meta


def traced_in_place(bsym: BoundSymbol, fn: Callable, what: str) -> list[BoundSymbol]:
    """The symbols ``fn(*bsym.args, **bsym.kwargs)`` records in ``bsym``'s place."""
    trc = current_trace()     # claim_executors makes one sharing the claimed trace's names
    prims.check(trc is not None, lambda: f"{what} can only be traced while claiming a trace", RuntimeError)
    recorded = retrace(bsym, fn, names=trc.names, what=what, allow_self=False)[0]
    return with_source(recorded, bsym.source)


def check_print_path(path: str, impl: Callable) -> None:
    """A symbol printing as ``torch.X`` must really be ``torch.X`` (codegen binds it so)."""
    if not path.startswith("torch.") and "." in path:
        return
    prims.check("." in path, lambda: f"print_as={path!r} needs a module prefix, e.g. 'myex.{path}'", ValueError)
    prims.check(_resolve_path(path) is impl,
                lambda: f"print_as={path!r} names a torch attribute that is not the implementation given", ValueError)


def _lookup_symbol(sym: Symbol | str) -> Symbol:
    """A Symbol, or its id: ``prims.<name>`` or ``ltorch.<name>``."""
    if isinstance(sym, Symbol):
        return sym
    module, _, name = sym.rpartition(".")
    table = {"prims": prims.all_prims, "ltorch": ltorch_registry.all_symbols}.get(module)
    found = table().get(name) if table is not None else None
    prims.check(found is not None, lambda: f"unknown symbol id {sym!r}: pass a prim or torch-language id "
                                           "('prims.sin', 'ltorch.softmax') or the Symbol object", ValueError)
    return found


class FusionExecutor(Executor):
    """Replaces regions of a trace by fusion symbols whose callables it compiled.

    Subclasses implement ``fusion_pass``. Region forming is shared
    (transforms/fusion.py); ``fusion_symbol`` makes the symbol for one region."""
    fuses_elementwise = True

    def fusion_pass(self, trace: Trace, input_alias_groups=None) -> Trace:
        raise NotImplementedError(f"fusion executor {self.name!r} does not implement fusion_pass")

    def fusion_symbol(self, name: str, impl: Callable) -> Symbol:
        """The symbol of one fused region, printed as ``<executor>.<name>``; a
        name already used for another callable gets a numeric suffix (a
        printed trace binds each name to one callable)."""
        with tables_lock:
            names = self.__dict__.setdefault("_fusion_names", weakref.WeakValueDictionary())
            candidate, n = name, 0
            while names.get(candidate, impl) is not impl:
                n += 1
                candidate = f"{name}_{n}"
            try:
                names[candidate] = impl        # weakly: a dropped fusion frees its name
            except TypeError:
                pass                           # not weakly referenceable: not tracked
        return Symbol(candidate, impl=impl, module=self.name, tags={Tag.FUSION}, executor=self)
