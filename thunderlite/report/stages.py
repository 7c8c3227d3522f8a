"""The trace report's data: every stage of a call's traces as rows, with the diff
to the previous stage, executor claims, fusion regions and source lines.

Everything here is plain data (lists, dicts, strings) that ``page.py`` embeds
as JSON; the page's script lays it out. A row is one top-level bound symbol:

    {"code": "t4 = torch.add(t0, t1)", "meta": 't4: "cpu f32[8]"', "kind": "sym",
     "ex": "torch", "region": None, "src": 3, "decomp": 12}

``ex`` is the claiming executor (None before claiming); a symbol no executor
claims that runs its own implementation (``autodiff.*`` rules, alias
barriers) says so in ``own``.

``src`` indexes the source table (the line the symbol was recorded from, and
the user's own line when that one is library code); ``decomp`` indexes the
table of decompositions (printed subsymbols, shared by the stages that keep
the same symbol); ``region`` names the fusion region the symbol belongs to
(``torchcompile.fusion3``) in every stage of the trace family: the fusion
symbol itself, and its members in the stages before fusion.
"""
from __future__ import annotations

import difflib
import linecache
from typing import Any

from thunderlite.core.codegen import bsym_parts
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.transforms.del_last_used import is_del


class SourceTable:
    """Source table: one entry per distinct (line, callers, via), referenced by index.

    Which line is the user's was decided when the symbol was recorded
    (``frontend/source_map.py``; a ``SourceLine``): an entry names the line the
    symbol was recorded from (``file``, ``line``, ``text``), and when that one is
    library code (``library``: torch's ``nn.Linear.forward``) also the user's
    line that led there (``user``). ``stack`` is every frame, outermost first."""

    def __init__(self):
        self.rows: list[dict] = []
        self._index: dict[tuple, int] = {}
        self._lines: dict[tuple[str, int], str] = {}

    def _text(self, fname: str, lineno: int) -> str:
        key = (fname, lineno)
        if key not in self._lines:
            self._lines[key] = linecache.getline(fname, lineno).strip()
        return self._lines[key]

    def index(self, source) -> int:
        if source is None:
            return -1
        callers = tuple(getattr(source, "callers", ()))
        via = tuple(getattr(source, "via", ()))
        key = (tuple(source), callers, via)
        i = self._index.get(key)
        if i is not None:
            return i
        fname, lineno, text = source
        user = [fname, lineno, text or self._text(fname, lineno)]
        stack = [[f, n, self._text(f, n)] for f, n in callers] + [user] + [[f, n, self._text(f, n)] for f, n in via]
        inner = stack[-1]
        entry = {"file": inner[0], "line": inner[1], "text": inner[2], "library": bool(via), "stack": stack}
        if via:
            entry["user"] = user
        self._index[key] = i = len(self.rows)
        self.rows.append(entry)
        return i


class DecompTable:
    """Printed subsymbols ([depth, code, meta] lines), shared between stages."""

    def __init__(self):
        self.rows: list[list] = []
        self._index: dict[int, int] = {}
        self._keep: list = []           # keeps the keyed tuples alive so ids stay unique

    def index(self, bsym: BoundSymbol, consts: dict) -> int:
        if not bsym.subsymbols or Tag.FUSION in bsym.sym.tags:
            return -1
        key = id(bsym.subsymbols)
        i = self._index.get(key)
        if i is None:
            lines: list = []
            _flatten(bsym.subsymbols, 0, consts, lines)
            self._index[key] = i = len(self.rows)
            self.rows.append(lines)
            self._keep.append(bsym.subsymbols)
        return i


def _flatten(bsyms, depth: int, consts: dict, out: list) -> None:
    for b in bsyms:
        code, meta = bsym_parts(b, consts)
        out.append([depth, code, meta])
        _flatten(b.subsymbols, depth + 1, consts, out)


def _outs(bsym: BoundSymbol) -> list[str]:
    return [p.name for p in bsym.proxy_outs()]


def region_members(traces: list[Trace]) -> dict[str, str]:
    """Output name -> fusion region id, for every fusion symbol in ``traces``
    (a region's id is its printed name, e.g. ``torchcompile.fusion3``)."""
    member_of: dict[str, str] = {}
    for trc in traces:
        for bsym in trc.bound_symbols:
            if Tag.FUSION in bsym.sym.tags:
                rid = bsym.sym.id
                for sub in bsym.subsymbols:
                    for name in _outs(sub):
                        member_of.setdefault(name, rid)
    return member_of


def _kind(bsym: BoundSymbol) -> str:
    if is_del(bsym):
        return "del"
    if Tag.RETURN in bsym.sym.tags:
        return "return"
    if Tag.FUSION in bsym.sym.tags:
        return "fusion"
    return "sym"


def _row(bsym: BoundSymbol, consts: dict, member_of: dict, sources: SourceTable, decomps: DecompTable) -> dict:
    code, meta = bsym_parts(bsym, consts)
    kind = _kind(bsym)
    ex = bsym.sym.executor
    outs = _outs(bsym)
    if kind == "fusion":
        region = bsym.sym.id
    else:
        region = next((member_of[n] for n in outs if n in member_of), None)
    row: dict[str, Any] = {"code": code, "meta": meta, "kind": kind,
                           "ex": ex.name if ex is not None else None, "region": region,
                           "src": sources.index(bsym.source), "decomp": decomps.index(bsym, consts)}
    if ex is None and kind == "sym" and bsym.sym.impl is not None:
        row["own"] = bsym.sym.module or bsym.sym.name     # runs its own implementation (autodiff.*, barriers)
    if kind == "fusion":
        row["members"] = [_row(sub, consts, {n: region for n in _outs(sub)}, sources, decomps)
                          for sub in bsym.subsymbols]
    return row


def _diff(prev: list[dict] | None, cur: list[dict]) -> list[list]:
    """difflib opcodes turning ``prev``'s rows into ``cur``'s, compared by statement."""
    if prev is None:
        return [["insert", 0, 0, 0, len(cur)]]
    a = [r["code"] for r in prev]
    b = [r["code"] for r in cur]
    return [list(op) for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()]


# a split program's pieces (frontend/splits/) head their traces with where they split and why
PIECE_NOTE = "piece "


def stage_data(group: str, traces: list[Trace], sources: SourceTable, decomps: DecompTable,
               stage_ms: dict | None = None) -> list[dict]:
    """One dict per stage of ``traces``: its rows, and the diff to the stage before."""
    member_of = region_members(traces)
    out: list[dict] = []
    prev_rows = None
    for i, trc in enumerate(traces):
        consts: dict = {}
        rows = [_row(b, consts, member_of, sources, decomps) for b in trc.bound_symbols]
        args = [f"{p.name}: {p.type_string()}" for p in trc.args if hasattr(p, "type_string")]
        ms = trc.pass_time_ms
        if ms is None and stage_ms:
            ms = stage_ms.get(trc.stage)
        piece = next((c for c in trc.header_comments if c.startswith(PIECE_NOTE)), "")
        stage = trc.stage or trc.name
        out.append({"id": f"{group}-{i}", "group": group, "index": i,
                    "stage": f"{piece.split(':', 1)[0]} · {stage}" if piece else stage, "note": piece,
                    "name": trc.name, "args": args, "ms": ms, "rows": rows, "diff": _diff(prev_rows, rows),
                    "regions": list(dict.fromkeys(r["region"] for r in rows if r["region"]))})
        prev_rows = rows
    return out
