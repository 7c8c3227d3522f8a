"""Fold views into the torch calls that read them (docs/architecture.md §6, host time).

On a small model every symbol of the final trace costs a Python call and a
view or kernel launch in ATen (a few microseconds), so views that only restate
what the next call does anyway are pure host time. On a claimed trace, before
``del_last_used``, this pass:

- hands an elementwise call the *input* of a broadcast it reads, where its own
  broadcasting gives the same result::

      t128 = torch.Tensor.expand(t127, (2, 16, 32))
      t129 = torch.mul(t4, t128)          ->   t129 = torch.mul(t4, t127)

  (a broadcast into leading-aligned dims becomes the reshape that puts the
  new dims in place, ``torch.reshape(t446, (2, 16, 1))``);
- reads a reshape's input instead of its result in the next reshape when the
  first only splits dims or adds/drops 1s (always a view: both spellings view
  or copy alike), and drops a reshape to its input's own shape.

The executor says which symbols are which (``executors/torchex.py:
ViewFolding``); nothing here knows a concrete executor. A fold is made only
where it cannot change a value, a dtype or what the caller sees:
- the call's output shape is the broadcast of its operands' shapes after the
  fold (two broadcasts into one call may not both go);
- a 0-d operand (which torch's type promotion ranks below dimensioned
  tensors) only where all tensor operands have its dtype and device;
- static sizes only; names the trace returns keep their own symbol.
Symbols whose results no one reads any more are dropped.
"""
from __future__ import annotations

from thunderlite.core import prims
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass


def _static(shape) -> bool:
    return all(type(s) is int for s in shape)


def _broadcast_shapes(shapes: list[tuple]) -> tuple | None:
    n = max(len(s) for s in shapes)
    out = [1] * n
    for s in shapes:
        for i, size in enumerate(s, n - len(s)):
            if size != 1:
                if out[i] not in (1, size):
                    return None
                out[i] = size
    return tuple(out)


def splits_only(src: tuple, dst: tuple) -> bool:
    """Whether ``dst`` is ``src`` with dims split into consecutive factors and
    dims of size 1 added or dropped: a reshape that is a view for any strides."""
    if not (_static(src) and _static(dst)):
        return False
    want = [s for s in dst if s != 1]
    i = 0
    for size in (s for s in src if s != 1):
        prod = 1
        while prod < size and i < len(want):
            prod *= want[i]
            i += 1
        if prod != size:
            return False
    return i == len(want)


class _Folder:
    def __init__(self, trace: Trace, facts):
        self.trace = trace
        self.facts = facts
        self.sub: dict[str, Proxy] = {}                 # a dropped result -> the proxy read instead
        self.split_of: dict[str, TensorProxy] = {}      # result of a splits-only reshape -> its input
        self.broadcasts: dict[str, tuple] = {}          # broadcast result -> (input, aligned shape)
        self.made: dict[str, TensorProxy] = {}          # broadcast result -> its input reshaped to aligned
        self.out: list[BoundSymbol] = []
        ret = trace.return_bsym
        self.returned = {p.name for p in ret.flat_args() if isinstance(p, Proxy)} if ret is not None else set()
        self.changed = False

    def _read(self, x):
        return self.sub.get(x.name, x) if isinstance(x, Proxy) else x

    def _substituted(self, bsym: BoundSymbol) -> BoundSymbol:
        if not any(isinstance(a, Proxy) and a.name in self.sub for a in bsym.flat_args()):
            return bsym
        self.changed = True
        args = tuple(_map(self._read, a) for a in bsym.args)
        kwargs = {k: _map(self._read, v) for k, v in bsym.kwargs.items()}
        return bsym.replace(args=args, kwargs=kwargs)

    def reshape(self, bsym: BoundSymbol, x: TensorProxy, shape: tuple) -> None:
        out = bsym.output
        base = self.split_of.get(x.name)
        if base is not None:            # a reshape of a splits-only reshape reads the first one's input
            x = base
            bsym = bsym.replace(args=(x, shape))
            self.changed = True
        if _static(shape) and shape == tuple(x.shape) and out.name not in self.returned:
            self.sub[out.name] = x
            self.changed = True
            return
        if splits_only(tuple(x.shape), shape):
            self.split_of[out.name] = x
        self.out.append(bsym)

    def aligned_input(self, name: str, trailing: bool = True) -> TensorProxy:
        """A broadcast's input with the broadcast's rank (reshaped once, where first needed).
        ``trailing``: the input itself may serve when only leading 1s are missing (the
        call's other operands give the output its rank)."""
        a, aligned = self.broadcasts[name]
        lead = len(aligned) - a.ndim
        if trailing and aligned[lead:] == tuple(a.shape) and all(s == 1 for s in aligned[:lead]):
            return a                    # torch's broadcasting aligns trailing dims itself
        made = self.made.get(name)
        if made is None:
            made = TensorProxy(shape=aligned, dtype=a.dtype, device=a.device, requires_grad=a.requires_grad,
                               name=self.trace.fresh_name("t"))
            n = len(self.out)
            self.reshape(self.facts.reshape_symbol.bind(a, aligned, output=made), a, aligned)
            if len(self.out) == n:      # the reshape folded away into a name that exists
                made = self.sub.pop(made.name)
            self.made[name] = made
        return made

    def elementwise(self, bsym: BoundSymbol) -> BoundSymbol:
        out = bsym.output
        if type(out) is not TensorProxy or not _static(out.shape):
            return bsym
        args = list(bsym.args)
        folded: list[BoundSymbol] = []
        for i, a in enumerate(args):
            if type(a) is not TensorProxy or a.name not in self.broadcasts:
                continue
            src, aligned = self.broadcasts[a.name]
            tensors = [t for t in args if type(t) is TensorProxy]
            if src.ndim == 0 and any(t.dtype != src.dtype or t.device != src.device for t in tensors):
                continue                # a 0-d tensor promotes differently from a dimensioned one
            shapes = [aligned if j == i else tuple(t.shape) for j, t in enumerate(args) if type(t) is TensorProxy]
            if not all(map(_static, shapes)) or _broadcast_shapes(shapes) != tuple(out.shape):
                continue
            # the input as it is, where the other operands keep the output's rank
            as_is = [tuple(src.shape) if j == i else tuple(t.shape) for j, t in enumerate(args)
                     if type(t) is TensorProxy]
            args[i] = operand = self.aligned_input(a.name, _broadcast_shapes(as_is) == tuple(out.shape))
            n = len(a.shape)
            folded.append(prims.broadcast_in_dim.bind(operand, tuple(a.shape), tuple(range(n - operand.ndim, n)),
                                                      output=a))
            self.changed = True
        if not folded:
            return bsym
        # a torch-language call keeps its decomposition, which now starts with the broadcasts torch does in it
        subsymbols = (*folded, *bsym.subsymbols) if bsym.subsymbols else ()
        return bsym.replace(args=tuple(args), subsymbols=subsymbols)

    def run(self) -> list[BoundSymbol]:
        facts = self.facts
        for bsym in self.trace.bound_symbols:
            bsym = self._substituted(bsym)
            if Tag.RETURN in bsym.sym.tags:
                self.out.append(bsym)
                continue
            r = facts.reshape_of(bsym)
            if r is not None and type(bsym.output) is TensorProxy:
                self.reshape(bsym, *r)
                continue
            b = facts.broadcast_of(bsym)
            if b is not None and type(bsym.output) is TensorProxy and _static(bsym.output.shape):
                self.broadcasts[bsym.output.name] = b
            elif facts.broadcasts_operands(bsym):
                bsym = self.elementwise(bsym)
            self.out.append(bsym)
        return _drop_unread(self.out, set(self.broadcasts) | set(self.split_of))


def _map(fn, x):
    if isinstance(x, (tuple, list)):
        return type(x)(_map(fn, y) for y in x)
    return fn(x)


def _drop_unread(bsyms: list[BoundSymbol], candidates: set[str]) -> list[BoundSymbol]:
    """Drop the views among ``candidates`` that nothing reads any more (and
    then the views only those read)."""
    read: set[str] = set()
    kept: list[BoundSymbol] = []
    for b in reversed(bsyms):
        if type(b.output) is TensorProxy and b.output.name in candidates and b.output.name not in read:
            continue
        read.update(p.name for p in b.flat_args() if isinstance(p, Proxy))
        kept.append(b)
    kept.reverse()
    return kept


@trace_pass("fold_views")
def fold_views(trace: Trace, facts) -> Trace:
    """``trace`` with broadcasts and reshapes folded into their readers where
    that is exact (module docstring); ``facts``: the torch executor's
    ``ViewFolding``. Returns ``trace`` itself when nothing folds."""
    views = facts.view_symbols
    if not any(b.sym in views for b in trace.bound_symbols):
        return trace
    folder = _Folder(trace, facts)
    out = folder.run()
    if not folder.changed and len(out) == len(trace.bound_symbols):
        return trace
    return trace.with_bound_symbols("fold_views", out)
