"""Hand a compiled region the inputs that die at it in a list it empties
(docs/architecture.md §6).

A symbol whose callable has Inductor's boxed calling convention
(``_boxed_call``: ``executors/torchcompile.py: BoxedRegion``) drops each input
inside the compiled code after its last use, but only the references it holds:
the generated function's own names and an argument tuple would keep every
input alive until the call returns. On a trace ``del_last_used`` has finished,
such a call with an input that dies there becomes::

    box0 = fusion.box(g0, _3_weight, t24)
    del(g0, t24)                             # _3_weight is read later
    (t46, t47) = torchcompile.fusion1(box0)  # empties box0
    del(box0)

so a dying input's last reference is the compiled code's. Inputs read later
keep their names, so nothing the trace still needs (a later symbol, the
return, a caller's tensor) is freed: ``del`` drops references, never storage.
"""
from __future__ import annotations

from thunderlite.core.proxies import Proxy
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.transforms.del_last_used import del_last_used, is_del


def _box(*tensors) -> list:
    return list(tensors)


BOX = Symbol("box", impl=_box, module="fusion")


def takes_box(bsym: BoundSymbol) -> bool:
    return getattr(bsym.sym.impl, "_boxed_call", False) and not bsym.kwargs


@trace_pass("box_inputs")
def box_inputs(trace: Trace) -> Trace:
    """Box the arguments of each boxed-call symbol that some argument dies at;
    ``trace`` must come from ``del_last_used``."""
    bsyms = trace.bound_symbols
    out: list[BoundSymbol] = []
    changed = False
    for i, bsym in enumerate(bsyms):
        dying = _dying(bsyms, i) if takes_box(bsym) else set()
        if not any(isinstance(a, Proxy) and a.name in dying for a in bsym.args):
            out.append(bsym)
            continue
        holder = Proxy(name=trace.fresh_name("box"))
        out.append(BOX.bind(*bsym.args, output=holder, source=bsym.source))
        out.append(bsym.replace(args=(holder,)))
        changed = True
    if not changed:
        return trace
    return del_last_used(trace.with_bound_symbols("box_inputs", out))


def _dying(bsyms: list[BoundSymbol], i: int) -> set[str]:
    """Names the ``del`` right after symbol ``i`` deletes."""
    if i + 1 < len(bsyms) and is_del(bsyms[i + 1]):
        return {p.name for p in bsyms[i + 1].args}
    return set()
