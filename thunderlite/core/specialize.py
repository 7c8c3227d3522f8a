"""Bound symbols with their symbolic sizes replaced by numbers.

An executor that compiles for static shapes (executors/triton/executor.py) takes a
region of a trace whose sizes are symbolic (core/symint.py) and, at run time,
compiles it once per set of concrete sizes: ``specialize`` gives it the region
as it would have been traced for those sizes (same names, concrete shapes)."""
from __future__ import annotations

from thunderlite.core.proxies import TensorProxy
from thunderlite.core.pytree import tree_map
from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.symexpr import evaluate
from thunderlite.core.symint import SymInt, has_symbolic


class MissingSize(KeyError):
    """A size the values given do not determine."""


def specialize(bsyms: list[BoundSymbol], values: dict[str, int]) -> tuple[list[BoundSymbol], callable]:
    """``bsyms`` with every SymInt evaluated under ``values`` (atom -> int).
    Returns the new symbols and the converter (for the region's inputs/outputs)."""
    memo: dict[str, TensorProxy] = {}

    def number(s: SymInt) -> int:
        v = evaluate(s.expr, values)
        if v is None:
            v = evaluate(s.env.canon(s.expr), values)
        if v is None:
            raise MissingSize(str(s))
        return v

    def conv(x):
        t = type(x)
        if t is SymInt:
            return number(x)
        if t is TensorProxy and has_symbolic(x.shape):
            p = memo.get(x.name)
            if p is None:
                p = memo[x.name] = x.replace(shape=tuple(number(s) if type(s) is SymInt else s for s in x.shape),
                                             name=x.name)
            return p
        return x

    def one(b: BoundSymbol) -> BoundSymbol:
        return b.replace(args=tree_map(conv, b.args), kwargs=tree_map(conv, b.kwargs),
                         output=tree_map(conv, b.output), subsymbols=tuple(one(s) for s in b.subsymbols))
    return [one(b) for b in bsyms], conv


def hint_values(bsyms: list[BoundSymbol]) -> dict[str, int]:
    """The traced value of every size symbol the symbols can read."""
    for b in bsyms:
        for p in b.flat_args() + b.flat_outs():
            env = p.env if type(p) is SymInt else None
            if env is None and type(p) is TensorProxy:
                env = next((s.env for s in p.shape if type(s) is SymInt), None)
            if env is not None:
                return env.hints()
    return {}


def sizes_of(inputs: list, values: list) -> dict[str, int]:
    """Atom -> value, read from a region's runtime inputs: its int inputs, and
    the dims of its tensor inputs whose size is one symbol."""
    out: dict[str, int] = {}
    for p, v in zip(inputs, values, strict=True):
        if type(p) is TensorProxy:
            for s, n in zip(p.shape, v.shape, strict=True):
                if type(s) is SymInt:
                    e = s.env.canon(s.expr)
                    for expr in (e, s.expr):
                        if len(expr) == 1 and expr[0][1] == 1 and len(expr[0][0]) == 1 and type(expr[0][0][0]) is str:
                            out[expr[0][0][0]] = n
        elif type(v) is int:
            out[p.name] = v
    return out


def size_atoms(bsyms: list[BoundSymbol]) -> list:
    """The size symbols (NumberProxy trace values) that the shapes of every
    tensor the symbols read or make are expressions of."""
    out: dict[str, object] = {}
    for top in bsyms:
        for b in walk(top):
            for p in b.flat_args() + b.flat_outs():
                if type(p) is TensorProxy:
                    for s in p.shape:
                        if type(s) is SymInt:
                            for a in s.proxies():
                                out.setdefault(a.name, a)
    return list(out.values())


def size_inputs(trace, bsyms: list[BoundSymbol], inputs: list) -> list:
    """The size atoms of ``bsyms`` a fused region takes besides ``inputs``:
    those ``trace`` can read (its arguments, what its symbols define). A
    backward has no size symbols of its own: the region reads them off its
    tensors' shapes (``sizes_of``)."""
    have = {p.name for p in trace.args if hasattr(p, "name")}
    have.update(o.name for b in trace.bound_symbols for o in b.proxy_outs())
    taken = {p.name for p in inputs}
    return [a for a in size_atoms(bsyms) if a.name not in taken and a.name in have]
