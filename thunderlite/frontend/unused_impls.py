"""Which registered implementations a call did not use, and why (``examine``).

For every operator executor of the call (the torch executor aside: it
implements everything), each ``register_implementation`` whose symbol no
bound symbol of the call ran through that executor is reported with the
first reason that applies:

- ``checker declined``: the symbol reached the execution transform but the
  checker said no to every call;
- ``claimed by an earlier executor 'X'``: the symbol reached the execution
  transform and an executor ahead in the list took it (alone, or inside a
  composite or a fusion region);
- ``decomposed away before claiming``: the traced program called it, but
  autodiff replaced it by its decomposition (it has no grad_transform and
  its decomposition cannot be recomputed safely, or a VJP rule differentiates
  the composite while an executor implements a part of it);
- ``not called by this program``.
"""
from __future__ import annotations

from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.trace import Trace
from thunderlite.transforms.claim import STAGE as CLAIM_STAGE


def _walk_all(bsyms):
    return (b for top in bsyms for b in walk(top))


def _before_and_after_claim(traces: list[Trace]) -> tuple[Trace | None, Trace | None]:
    for i, t in enumerate(traces):
        if t.stage == CLAIM_STAGE and i > 0:
            return traces[i - 1], traces[-1]
    return None, None


def _owners(final: Trace) -> dict[str, str]:
    """proxy name -> name of the executor whose top-level symbol produced it
    (looking through subsymbols: a fusion region, a claimed composite)."""
    owner: dict[str, str] = {}
    for top in final.bound_symbols:
        ex = top.sym.executor
        name = getattr(ex, "name", None) if ex is not None else None
        if name is None:
            continue
        for b in walk(top):
            for p in b.proxy_outs():
                owner.setdefault(p.name, name)
    return owner


def _first_out(b: BoundSymbol) -> str | None:
    outs = b.proxy_outs()
    return outs[0].name if outs else None


def unused_implementations(entry, executors: list) -> list[tuple[str, str, str]]:
    """``[(executor name, symbol id, reason)]`` for the call that made ``entry``."""
    pairs = [_before_and_after_claim(list(entry.traces)), _before_and_after_claim(list(entry.backward_traces))]
    pairs = [(b, a) for b, a in pairs if b is not None]
    traced = {b.sym for b in _walk_all(entry.traces[0].bound_symbols)} if entry.traces else set()
    owners = [_owners(after) for _, after in pairs]
    final_syms = {b.sym for _, after in pairs for b in after.bound_symbols}
    report = []
    for ex in executors:
        if ex.name == "torch" or not hasattr(ex, "implementations"):
            continue
        for impl in ex.implementations():
            if impl.symbol is not None and impl.symbol in final_syms:
                continue
            reason = _reason(ex, impl, pairs, owners, traced)
            if reason is not None:
                report.append((ex.name, impl.of.id, reason))
    return report


def _reason(ex, impl, pairs, owners, traced) -> str | None:
    declined = taken = 0
    other = None
    for (before, _), owner in zip(pairs, owners, strict=True):
        for b in _walk_all(before.bound_symbols):
            if b.sym is not impl.of:
                continue
            if not impl.accepts(b):
                declined += 1
                continue
            who = owner.get(_first_out(b))
            if who == ex.name:
                return None              # used (through an execution or grad transform)
            taken += 1
            other = other or who
    if taken:
        return f"claimed by an earlier executor {other!r}" if other else "claimed by an earlier executor"
    if declined:
        return f"checker declined ({declined} call{'s' if declined > 1 else ''})"
    if impl.of in traced:
        return "decomposed away before claiming (autodiff differentiated it through its decomposition)"
    return "not called by this program"
