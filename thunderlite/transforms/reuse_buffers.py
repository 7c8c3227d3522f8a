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
    """Which names may share storage: the connected components of the
    ``(view, base)`` pairs of the trace's symbols (each symbol's own alias
    facts and the leaves it is made of), and which names are some pair's view
    (own no storage). Found outward from the names asked about: a pair holds
    names of its own symbol only (its arguments, outputs and the names inside
    its decomposition), so the symbols making or reading a name are all that
    can connect it to another, and the others' facts are never read (a new
    op's facts cost reading its ATen schemas, on the first call of a program)."""

    def __init__(self, bsyms: list[BoundSymbol]):
        self.bsyms = bsyms
        self.touching: dict[str, list[int]] = {}    # name -> the symbols making or reading it
        for k, b in enumerate(bsyms):
            if is_del(b) or Tag.RETURN in b.sym.tags:
                continue
            for p in dict.fromkeys(p.name for p in b.proxy_args() + b.proxy_outs()):
                self.touching.setdefault(p, []).append(k)
        self._pairs: dict[int, list] = {}

    def pairs(self, k: int) -> list:
        got = self._pairs.get(k)
        if got is None:
            b = self.bsyms[k]
            got = self._pairs[k] = views(b) + call_views(b)
        return got

    def is_view(self, name: str) -> bool:
        return any(out.name == name for k in self.touching.get(name, ()) for out, _ in self.pairs(k))

    def sharing(self, name: str) -> list[str]:
        """The other names of ``name``'s component. A top-level name's pairs
        are all among its touching symbols' pairs, a name inside a
        decomposition's among its own symbol's, already read when it is reached."""
        edges: dict[str, set[str]] = {}
        members, todo, read = {name: None}, [name], set()
        while todo:
            n = todo.pop()
            for k in self.touching.get(n, ()):
                if k not in read:
                    read.add(k)
                    for out, base in self.pairs(k):
                        edges.setdefault(out.name, set()).add(base.name)
                        edges.setdefault(base.name, set()).add(out.name)
            for m in edges.get(n, ()):
                if m not in members:
                    members[m] = None
                    todo.append(m)
        return [n for n in members if n != name]


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

    def __init__(self, trace: Trace, bsyms: list[BoundSymbol], recorded: bool, last: dict[str, int]):
        self.recorded = recorded
        self.bsyms = bsyms
        self.last = last
        self.storage = _Storage(bsyms)
        self.inputs = {p.name for p in trace.args if isinstance(p, TensorProxy)}
        self.made_by: dict[str, list[int]] = {}     # name -> the symbols making it (one: names are made once)
        for k, b in enumerate(bsyms):
            for o in b.tensor_outs():
                self.made_by.setdefault(o.name, []).append(k)
        self._owned: dict[str, bool] = {}

    def owned(self, name: str) -> bool:
        """``name`` is fresh memory an executor's symbol made (not a view), or
        a reshape of such a name with all its elements."""
        got = self._owned.get(name)
        if got is None:
            self._owned[name] = False       # (a name is made after what it is made from)
            got = self._owned[name] = any(self._owns(self.bsyms[k], name) for k in self.made_by.get(name, ()))
        return got

    def _owns(self, b: BoundSymbol, name: str) -> bool:
        if b.sym.executor is not None and not b.sym.tags & _NOT_OWNED and not self.storage.is_view(name):
            return True
        return b.sym.name in _RESHAPES and not is_del(b) and any(
            out.name == name and self.owned(base.name) and statically_known(out.numel(), "==", base.numel())
            for out, base in views(b))

    def target(self, bsym: BoundSymbol, i: int) -> TensorProxy | None:
        out = out_result(bsym)
        if out is None:
            return None
        if self.recorded and (out.requires_grad or any(a.requires_grad for a in bsym.tensor_args())):
            return None            # autograd refuses out= where it records (a leaf the program made)
        for a in bsym.tensor_args():
            if (_same_shape(a.shape, out.shape) and a.dtype == out.dtype and a.device == out.device
                    and self.last.get(a.name) == i and self.owned(a.name) and self._alone(a.name, i)):
                return a
        return None

    def _alone(self, name: str, i: int) -> bool:
        """No other name of ``name``'s storage is an input or lives at symbol ``i``
        (names only inside a fused region or a decomposition die with their call)."""
        for n in self.storage.sharing(name):
            if n in self.inputs or (n in self.made_by and self.last.get(n, _ALIVE) >= i):
                return False
        return True


@trace_pass("reuse_buffers")
def reuse_buffers(trace: Trace, write_out: Callable[[BoundSymbol], bool], *, recorded: bool = False) -> Trace:
    """See the module docstring; returns ``trace`` itself when nothing is reused.
    ``recorded``: the trace runs where autograd records (a program outside
    autodiff that makes a leaf requiring grad): no symbol reading or making a
    value that requires grad gets ``out=``."""
    bsyms = trace.bound_symbols
    last = _last_uses(bsyms)
    # an input dying at the symbol first: asking ``write_out`` may read the op's schemas
    candidates = [i for i, b in enumerate(bsyms) if not is_del(b) and "out" not in b.kwargs
                  and any(last.get(a.name) == i for a in b.tensor_args()) and write_out(b)]
    if not candidates or recorded and any(b.kwargs.get("requires_grad") for b in bsyms):
        return trace            # a factory making a leaf: its proxy does not say what requires grad
    plan = _Plan(trace, bsyms, recorded, last)
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
