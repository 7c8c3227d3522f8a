"""Assembles the trace report: one self-contained HTML file (inline CSS, script,
SVG and JSON data; nothing is fetched when it is viewed)."""
from __future__ import annotations

import datetime
import json
from html import escape
from pathlib import Path

from thunderlite.core.trace import Trace
from thunderlite.report.chart import human_bytes, memory_svg
from thunderlite.report.memory import deaths, live_memory
from thunderlite.report.stages import DecompTable, SourceTable, stage_data

_ASSETS = Path(__file__).with_name("assets")

# fixed colours for the executors that ship with thunderlite; others get one from the palette
EXECUTOR_COLORS = {"torch": "#5b6b82", "torchcompile": "#d9822b", "nvfuser": "#4a9c5d", "triton": "#8e5bc4"}
_PALETTE = ["#0f9d9a", "#c2410c", "#7c3aed", "#0369a1", "#be185d", "#4d7c0f", "#a16207", "#1d4ed8"]
_REGION_HUES = [28, 200, 130, 280, 350, 55, 170, 240, 310, 90]


def _executor_colors(groups: list[dict]) -> dict[str, str]:
    names = sorted({r["ex"] for g in groups for s in g["stages"] for r in s["rows"] if r["ex"]})
    out, k = {}, 0
    for name in names:
        if name in EXECUTOR_COLORS:
            out[name] = EXECUTOR_COLORS[name]
        else:
            out[name] = _PALETTE[k % len(_PALETTE)]
            k += 1
    return out


def _region_colors(groups: list[dict]) -> dict[str, str]:
    ids: list[str] = []
    for g in groups:
        for s in g["stages"]:
            ids.extend(r for r in s["regions"] if r not in ids)
    return {rid: f"hsl({_REGION_HUES[i % len(_REGION_HUES)]}, 70%, {50 + 8 * (i // len(_REGION_HUES) % 3)}%)"
            for i, rid in enumerate(ids)}


def _memory_summary(group: str, stage_id: str, trace: Trace) -> tuple[dict, object]:
    tl = live_memory(trace)
    return {"stage": stage_id, "peak": tl.peak_bytes, "peak_text": human_bytes(tl.peak_bytes),
            "peak_row": tl.peak_index, "inputs_text": human_bytes(tl.input_bytes),
            "end_text": human_bytes(tl.end_bytes),
            "live_at_peak": [[n, human_bytes(b)] for n, b in tl.live_at_peak[:8]]}, tl


def build_page(title: str, forward: list[Trace], backward: list[Trace], prologue: list[Trace],
               stage_ms: dict | None = None, gradients: dict | None = None, tier: str = "") -> str:
    """The report's HTML for these trace lists (each: every stage, the last one ran).
    ``gradients``: the gradient values a whole step's own backward made (name ->
    its leaf), whose deaths the memory summary lists. ``tier``: which tier
    the entry runs (frontend/caching/tiers.py), in words."""
    sources, decomps = SourceTable(), DecompTable()
    groups = []
    for name, label, traces in (("forward", "Forward", forward), ("backward", "Backward", backward),
                                ("prologue", "Prologue", prologue)):
        if traces:
            groups.append({"name": name, "label": label,
                           "stages": stage_data(name, traces, sources, decomps, stage_ms)})
    memory, series = {}, []
    for g, traces in (("forward", forward), ("backward", backward)):
        if traces:
            stage_id = f"{g}-{len(traces) - 1}"
            memory[g], tl = _memory_summary(g, stage_id, traces[-1])
            series.append((g, stage_id, tl))
            if gradients:
                memory[g]["grad_deaths"] = [list(d) for d in deaths(traces[-1], gradients)]
    data = {"title": title, "groups": groups, "sources": sources.rows, "decomps": decomps.rows,
            "executors": _executor_colors(groups), "regions": _region_colors(groups), "memory": memory}
    # "<" escaped so no string in the data can close the script element
    blob = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    css = (_ASSETS / "report.css").read_text(encoding="utf-8")
    js = (_ASSETS / "report.js").read_text(encoding="utf-8")
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>thunderlite report: {escape(title)}</title>
<style>{css}</style>
</head>
<body>
<header>
  <div class="brand">thunderlite <span>trace report</span></div>
  <h1>{escape(title)}</h1>
  <div class="when">{when}</div>
  {f'<div class="tier">tier: {escape(tier)}</div>' if tier else ''}
  <div id="legend"></div>
</header>
<section id="memory">
  <div class="memhead"><h2>Live tensor memory</h2><div id="memsummary"></div></div>
  {memory_svg(series)}
  <p class="note">Tensors named in the final traces, from their shapes, dtypes and <code>del</code> points;
  views share their base's memory; the call's inputs (held by the caller) are not counted; memory inside
  a fused region or a kernel is not visible. Click the chart to show the symbol.</p>
</section>
<main>
  <nav id="stages"></nav>
  <section id="view"></section>
</main>
<script type="application/json" id="report-data">{blob}</script>
<script>{js}</script>
</body>
</html>
"""
