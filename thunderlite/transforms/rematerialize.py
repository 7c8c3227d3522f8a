"""Rematerialization: recompute cheap values in the backward instead of saving them.

A value the backward reads is normally saved by the forward and kept alive
between the two. When it comes out of a cheap elementwise symbol (or a chain of
them) whose own inputs are saved anyway or are program arguments/outputs (which
the caller keeps alive regardless), recomputing it in the backward costs a
memory-bound kernel and saves its whole buffer for the time between forward and
backward. Recomputed symbols are placed right before their first use in the
backward, so their results live as briefly as possible.

Never recomputed: random draws (the backward would see different numbers),
anything with a side effect, and non-elementwise work (matmuls, reductions).

Example: for ``y = sin(x * 2)`` the backward of ``sin`` needs ``x * 2``; since
``x`` is an argument, ``t0 = prims.mul(x, 2)`` is recomputed in the backward and
only ``x`` is saved.
"""
from __future__ import annotations

from thunderlite.core import prims
from thunderlite.core.proxies import Proxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag

_CHEAP = frozenset(prims.all_prims()[n] for n in (
    *prims.UNARY, *prims.BINARY, *prims.TERNARY, "where", "convert_element_type",
    "broadcast_in_dim", "reshape", "permute", "squeeze"))


def is_cheap(bsym: BoundSymbol) -> bool:
    """An elementwise/shape symbol, or a composite made only of them."""
    sym = bsym.sym
    if Tag.RANDOM in sym.tags or Tag.INPLACE in sym.tags or Tag.DONT_DCE in sym.tags:
        return False
    if sym in _CHEAP:
        return True
    return bool(bsym.subsymbols) and all(is_cheap(s) for s in bsym.subsymbols)


def rematerialize(fwd_bsyms: list[BoundSymbol], bwd_bsyms: list[BoundSymbol], saved: list[Proxy],
                  visible: set[str]) -> tuple[list[BoundSymbol], list[Proxy]]:
    """Return the backward's symbols with recomputations inserted, and the new
    list of values to save. ``visible`` names the program's arguments and
    outputs (always alive, so always fine to read)."""
    producer = {p.name: b for b in fwd_bsyms for p in b.proxy_outs()}
    available = set(visible) | {p.name for p in saved}
    recompute: dict[str, BoundSymbol] = {}
    for p in saved:
        bsym = producer.get(p.name)
        if p.name in visible or bsym is None or not is_cheap(bsym) or len(bsym.proxy_outs()) != 1:
            continue
        if all(a.name in available for a in bsym.proxy_args()):
            recompute[p.name] = bsym
    if not recompute:
        return bwd_bsyms, saved
    new_saved = [p for p in saved if p.name not in recompute]
    kept = {p.name for p in new_saved}
    for bsym in recompute.values():
        for a in bsym.proxy_args():
            if a.name not in kept and a.name not in recompute:
                kept.add(a.name)
                new_saved.append(a)
    return _place(bwd_bsyms, recompute), new_saved


def _place(bwd_bsyms: list[BoundSymbol], recompute: dict[str, BoundSymbol]) -> list[BoundSymbol]:
    """Insert each recomputation right before the first symbol that reads it."""
    out: list[BoundSymbol] = []
    emitted: set[str] = set()

    def need(bsym: BoundSymbol) -> None:
        for a in bsym.proxy_args():
            src = recompute.get(a.name)
            if src is not None and a.name not in emitted:
                emitted.add(a.name)
                need(src)
                out.append(src.replace(source=None))
    for bsym in bwd_bsyms:
        need(bsym)
        out.append(bsym)
    return out
