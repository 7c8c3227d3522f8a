"""The execution transform (docs/architecture.md §7): executors claim the trace.

Priority is the user's list order, for operator and fusion executors alike
(docs/architecture.md §6). Each executor, in order, gets one pass over what is still
unclaimed:

- a fusion executor replaces regions of unclaimed symbols by fusion symbols
  (``ex.fusion_pass(trace, input_alias_groups=...) -> trace``); symbols an
  earlier executor claimed carry ``sym.executor`` and never join a region;
- an operator executor claims each unclaimed symbol it has an implementation
  for (``ex.claim(bsym)`` returns the rebound symbol); a composite it cannot
  run whole but whose decomposition holds a symbol it can run is replaced by
  its subsymbols, so an implementation of ``prims.sin`` runs wherever
  ``ltorch.sin`` does, unless an earlier executor already claimed that.

What is left after the last executor (composites no executor runs whole) is
replaced by its subsymbols, each offered to the executors again in order. A
leaf no executor claims is kept if its symbol carries its own ``impl`` (alias
barriers), otherwise a ``ClaimError`` names the symbol and the user's line.

Decomposed subsymbols inherit their parent's source line, so the printed trace
still says which user line they came from. The executors are passed in: this
module imports no concrete executor (docs/architecture.md §2); any object with ``name``,
``fusion_pass`` and ``claim`` (executors/base.py) will do.
"""
from __future__ import annotations

from collections.abc import Sequence

from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.core.tracectx import tracectx

STAGE = "claim_executors"


class ClaimError(NotImplementedError):
    """No executor can run a leaf symbol."""


@trace_pass(STAGE)
def claim_executors(trace: Trace, executors: Sequence, *, input_alias_groups=None) -> Trace:
    """The trace with every symbol claimed by one of ``executors`` (in priority
    order). ``input_alias_groups`` (inputs sharing storage) goes to fusion passes."""
    # an execution_transform traces new symbols: their names come from this trace's pool
    with tracectx(Trace("claim scratch", names=trace.names)):
        for ex in executors:
            trace = ex.fusion_pass(trace, input_alias_groups=input_alias_groups)
            trace = _operator_pass(trace, ex)
        out: list[BoundSymbol] = []
        for bsym in trace.bound_symbols:
            _claim(bsym, executors, out)
    return trace.with_bound_symbols(STAGE, out)


def _operator_pass(trace: Trace, ex) -> Trace:
    """``ex`` claims what it can of the unclaimed symbols (see the module docstring)."""
    out: list[BoundSymbol] = []
    changed = False
    for bsym in trace.bound_symbols:
        changed |= _offer(bsym, ex, out)
    return trace.with_bound_symbols(trace.stage, out) if changed else trace


def _offer(bsym: BoundSymbol, ex, out: list[BoundSymbol]) -> bool:
    sym = bsym.sym
    if sym.executor is not None or Tag.RETURN in sym.tags:
        out.append(bsym)
        return False
    claimed = ex.claim(bsym)
    if isinstance(claimed, list):       # an execution transform's symbols: later executors claim the rest
        out.extend(claimed)
        return True
    if claimed is not None:
        out.append(claimed)
        return True
    if sym.decomposition is not None and bsym.subsymbols and _claims_inside(ex, bsym):
        for sub in bsym.parts():
            _offer(sub, ex, out)
        return True
    out.append(bsym)
    return False


def _claims_inside(ex, bsym: BoundSymbol) -> bool:
    """Whether ``ex`` can run some symbol of ``bsym``'s decomposition (recursively)."""
    return any(ex.claim(sub) is not None or (sub.subsymbols and _claims_inside(ex, sub))
               for sub in bsym.subsymbols)


def _claim(bsym: BoundSymbol, executors: Sequence, out: list[BoundSymbol]) -> None:
    sym = bsym.sym
    if sym.executor is not None or Tag.RETURN in sym.tags:
        out.append(bsym)
        return
    for ex in executors:
        claimed = ex.claim(bsym)
        if isinstance(claimed, list):
            for b in claimed:
                _claim(b, executors, out)
            return
        if claimed is not None:
            out.append(claimed)
            return
    if sym.impl is not None:
        out.append(bsym)
    elif sym.decomposition is not None and bsym.subsymbols:
        for sub in bsym.parts():
            _claim(sub, executors, out)
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
