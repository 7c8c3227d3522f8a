"""The execution transform (docs/architecture.md §7): executors claim the trace.

1. Fusion executors get the whole trace first, in list order
   (``ex.fusion_pass(trace, input_alias_groups=...) -> trace``), and replace
   regions by fusion symbols.
2. Every remaining bound symbol goes to the first executor whose
   ``ex.claim(bsym)`` returns a rebound symbol.
3. A symbol no executor claims: kept as is if its symbol carries its own
   ``impl`` (alias barriers, already-claimed symbols); replaced by its subsymbols,
   each offered again, if it is a composite; otherwise a ``ClaimError`` naming
   the symbol and the user's line.

Decomposed subsymbols inherit their parent's source line, so the printed trace
still says which user line they came from. The executors are passed in: this
module imports no concrete executor (docs/architecture.md §2); any object with ``name``,
``fusion_pass`` and ``claim`` (executors/base.py) will do.
"""
from __future__ import annotations

from typing import Sequence

from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass

STAGE = "Transform for execution"


class ClaimError(NotImplementedError):
    """No executor can run a leaf symbol."""


@trace_pass(STAGE)
def claim_executors(trace: Trace, executors: Sequence, *, input_alias_groups=None) -> Trace:
    """The trace with every symbol claimed by one of ``executors`` (in priority
    order). ``input_alias_groups`` (inputs sharing storage) goes to fusion passes."""
    for ex in executors:
        trace = ex.fusion_pass(trace, input_alias_groups=input_alias_groups)
    out: list[BoundSymbol] = []
    for bsym in trace.bound_symbols:
        _claim(bsym, executors, out)
    return trace.with_bound_symbols(STAGE, out)


def _claim(bsym: BoundSymbol, executors: Sequence, out: list[BoundSymbol]) -> None:
    sym = bsym.sym
    if sym.executor is not None or Tag.RETURN in sym.tags:
        out.append(bsym)
        return
    for ex in executors:
        claimed = ex.claim(bsym)
        if claimed is not None:
            out.append(claimed)
            return
    if sym.impl is not None:
        out.append(bsym)
    elif sym.decomposition is not None and bsym.subsymbols:
        for sub in bsym.subsymbols:
            _claim(sub if sub.source is not None else sub.replace(source=bsym.source), executors, out)
    else:
        raise ClaimError(_unclaimed_message(bsym, executors))


def _unclaimed_message(bsym: BoundSymbol, executors: Sequence) -> str:
    names = ", ".join(ex.name for ex in executors) or "none"
    where = ""
    if bsym.source is not None:
        fname, lineno, text = bsym.source
        where = f" (from {fname}:{lineno}: {text.strip()})" if text else f" (from {fname}:{lineno})"
    return (f"no executor can run {bsym.sym.id}{where}; executors tried: {names}. "
            f"It has no decomposition: register an implementation for it on an executor, "
            f"or give the torch-language symbol a torch_fn.\n  at: {bsym!r}")
