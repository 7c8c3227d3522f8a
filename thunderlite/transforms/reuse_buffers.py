"""Write an elementwise result into an input buffer that dies there (``out=``).

Eager's autograd accumulates a gradient in place when nothing else holds the
buffer; a functional backward trace instead allocates a fresh tensor for every
sum and every elementwise step. On a trace that ``del_last_used`` has
finished, this pass gives such a symbol its dying input as ``out``::

    t370 = torch.add(t339, t368)            # t339 is deleted right after
    t370 = torch.add(t339, t368, out=t339)  # after this pass

so the step allocates nothing and the buffer's pages stay warm.

An input ``a`` of a symbol ``s`` is reused only when all of these hold:
- ``write_out(s)``: the executor says ``s`` runs as an elementwise function
  that accepts ``out=`` (so writing over ``a`` while reading it is the
  in-place form of the same op); a kernel with several outputs names the
  one ``out=`` holds (``out_output``: cross entropy's log-probabilities);
- ``a`` has ``s``'s output shape, dtype and device (never broadcast into it);
- ``a`` dies at ``s`` (a ``del`` of it follows ``s``);
- ``a`` was computed in this trace by an executor's symbol into fresh memory
  (``core.aliasing``), or is a reshape of such a value with all its elements
  (``_RESHAPES``): not a trace input, nor a value unpacked from one (a
  saved-for-backward list), whose storage the caller may still hold, nor an
  output of an opaque call or a compiled region;
- every other name that may share ``a``'s storage (its views, found through
  each symbol's own alias facts and the leaves it is made of) died before
  ``s``; none is a trace input;
- where autograd records the trace (``recorded``), nothing ``s`` reads or
  makes requires grad.

Differentiable programs run it on both sides of autodiff (neither records);
programs without grad run it on their one trace.
"""
from __future__ import annotations

from collections.abc import Callable

from thunderlite.core.aliasing import call_views, views
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.symint import statically_known
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.transforms.del_last_used import is_del

_ALIVE = float("inf")
_NOT_OWNED = frozenset({Tag.OPAQUE, Tag.FUSION})
"""Outputs that may share storage in ways no alias fact states: an opaque
call's, and a compiled region's (a compiler may return one buffer for two
equal outputs)."""


_RESHAPES = frozenset({"reshape", "view"})
"""A reshape of a buffer the trace made holds all of it, in order: once every
other name of the buffer has died, writing into it is writing into the buffer
(the logits, reshaped to rows for cross entropy)."""


class _Storage:
    """Names that may share storage (union-find over every ``(view, base)``
    pair), and the names that are some pair's view, so own no storage."""

    def __init__(self, bsyms: list[BoundSymbol]):
        self.parent: dict[str, str] = {}
        self.is_view: set[str] = set()
        for b in bsyms:
            if is_del(b) or Tag.RETURN in b.sym.tags:
                continue
            for out, base in views(b) + call_views(b):
                self.is_view.add(out.name)
                self.parent[self._find(out.name)] = self._find(base.name)
        self.groups: dict[str, list[str]] = {}
        for n in list(self.parent):
            self.groups.setdefault(self._find(n), []).append(n)

    def _find(self, name: str) -> str:
        while self.parent.get(name, name) != name:
            name = self.parent[name]
        return name

    def sharing(self, name: str) -> list[str]:
        return [n for n in self.groups.get(self._find(name), ()) if n != name]


def out_result(bsym: BoundSymbol) -> TensorProxy | None:
    """The output an ``out=`` argument of ``bsym`` holds: its one tensor output,
    or the one a kernel with several names (``out_output``), else None."""
    outs = bsym.tensor_outs()
    k = 0 if len(outs) == 1 else getattr(bsym.sym.torch_fn, "out_output", None)
    return None if k is None else outs[k]


def _last_uses(bsyms: list[BoundSymbol]) -> dict[str, int]:
    """Index of the symbol each deleted name dies at (the one its ``del`` follows)."""
    last: dict[str, int] = {}
    for i, b in enumerate(bsyms):
        if is_del(b):
            for p in b.args:
                last[p.name] = i - 1
    return last


class _Plan:
    """What one trace allows; ``target(s, i)`` is the input ``s`` may write into."""

    def __init__(self, trace: Trace, bsyms: list[BoundSymbol], recorded: bool):
        self.recorded = recorded
        self.last = _last_uses(bsyms)
        self.storage = _Storage(bsyms)
        self.inputs = {p.name for p in trace.args if isinstance(p, TensorProxy)}
        self.made: set[str] = set()
        self.owned: set[str] = set()
        for b in bsyms:
            outs = [o.name for o in b.tensor_outs()]
            self.made.update(outs)
            if b.sym.executor is not None and not b.sym.tags & _NOT_OWNED:
                self.owned.update(n for n in outs if n not in self.storage.is_view)
            if b.sym.name in _RESHAPES and not is_del(b):
                self.owned.update(out.name for out, base in views(b)
                                  if base.name in self.owned and statically_known(out.numel(), "==", base.numel()))

    def target(self, bsym: BoundSymbol, i: int) -> TensorProxy | None:
        out = out_result(bsym)
        if out is None:
            return None
        if self.recorded and (out.requires_grad or any(a.requires_grad for a in bsym.tensor_args())):
            return None            # autograd refuses out= where it records (a leaf the program made)
        for a in bsym.tensor_args():
            if (_same_shape(a.shape, out.shape) and a.dtype == out.dtype and a.device == out.device
                    and a.name in self.owned and self.last.get(a.name) == i and self._alone(a.name, i)):
                return a
        return None

    def _alone(self, name: str, i: int) -> bool:
        """No other name of ``name``'s storage is an input or lives at symbol ``i``
        (names only inside a fused region or a decomposition die with their call)."""
        for n in self.storage.sharing(name):
            if n in self.inputs or (n in self.made and self.last.get(n, _ALIVE) >= i):
                return False
        return True


@trace_pass("reuse_buffers")
def reuse_buffers(trace: Trace, write_out: Callable[[BoundSymbol], bool], *, recorded: bool = False) -> Trace:
    """See the module docstring; returns ``trace`` itself when nothing is reused.
    ``recorded``: the trace runs where autograd records (a program outside
    autodiff that makes a leaf requiring grad): no symbol reading or making a
    value that requires grad gets ``out=``."""
    bsyms = trace.bound_symbols
    candidates = [i for i, b in enumerate(bsyms) if not is_del(b) and "out" not in b.kwargs and write_out(b)]
    if not candidates or recorded and any(b.kwargs.get("requires_grad") for b in bsyms):
        return trace            # a factory making a leaf: its proxy does not say what requires grad
    plan = _Plan(trace, bsyms, recorded)
    out = list(bsyms)
    changed = False
    for i in candidates:
        a = plan.target(bsyms[i], i)
        if a is not None:
            out[i] = bsyms[i].replace(kwargs={**bsyms[i].kwargs, "out": a})
            changed = True
    return trace.with_bound_symbols("reuse_buffers", out) if changed else trace


def _same_shape(a: tuple, b: tuple) -> bool:
    """Shapes known equal from the sizes alone: a question that only picks a
    shortcut, so asking it must not guard a symbolic size (a broadcast operand's
    ``32`` against the batch's ``s0``)."""
    return len(a) == len(b) and all(x is y or statically_known(x, "==", y) is True for x, y in zip(a, b, strict=True))
