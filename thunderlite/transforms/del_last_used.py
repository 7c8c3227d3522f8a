"""Free each value right after its last use (docs/architecture.md §7).

The pass inserts ``del(t3, t4)`` statements (valid Python: ``del (a, b)``
deletes both names) after the symbol that last reads or defines those names.
An output nobody reads is deleted right after the symbol that makes it: this is
what frees a custom op's result tuple as soon as it is unpacked (PyTorch
#163227), and what lets the name of a written argument (``x1`` in
``(x1, o) = custom.op(x)``) stop keeping ``x`` alive.

Aliases: ``del`` drops one reference, never storage, so a view keeps its base
alive by itself and nothing can be freed early; the pass only has to never
delete a name before its last reader, and never a returned one."""
from __future__ import annotations

from thunderlite.core.proxies import Proxy
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass


def _never_called(*names):
    raise RuntimeError("del(...) is a statement in generated code; it is never called")


DEL = Symbol("del", impl=_never_called, module="", tags={Tag.DONT_DCE})


def is_del(bsym: BoundSymbol) -> bool:
    return bsym.sym is DEL


@trace_pass("del_last_used")
def del_last_used(trace: Trace) -> Trace:
    """Insert ``del`` after the last use of every name; idempotent (existing
    ``del`` statements are recomputed, not doubled)."""
    bsyms = [b for b in trace.bound_symbols if not is_del(b)]
    ret = trace.return_bsym
    seen: set[str] = set()
    if ret is not None:
        seen.update(p.name for p in ret.proxy_args())
    out: list[BoundSymbol] = []
    for bsym in reversed(bsyms):
        if Tag.RETURN in bsym.sym.tags:
            out.append(bsym)
            continue
        dead: list[Proxy] = []
        for p in bsym.proxy_outs() + bsym.proxy_args():
            if p.name not in seen:
                seen.add(p.name)
                dead.append(p)
        if dead:
            out.append(DEL.bind(*dead))
        out.append(bsym)
    out.reverse()
    if _same(out, trace.bound_symbols):
        return trace
    return trace.with_bound_symbols("del_last_used", out)


def _same(a: list[BoundSymbol], b: list[BoundSymbol]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x is y:
            continue
        if not (is_del(x) and is_del(y) and [p.name for p in x.args] == [p.name for p in y.args]):
            return False
    return True
