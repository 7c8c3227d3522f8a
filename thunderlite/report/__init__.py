"""The trace report (docs/architecture.md §13): one self-contained HTML page about a jitted function's last call.

``thunderlite.trace_report(jfn, path)`` writes every stage of the forward,
backward and prologue traces side by side with the diff to the stage before
(the tier the entry runs in the header: fast, or hot once its regions were
compiled off the calling thread),
fusion regions and executor claims in colour, each symbol's source line (and
the user's own line when that one is library code), and a chart of live tensor
memory along the final forward and backward traces. The page needs no network:
styles, script, chart and data are all inline. Example::

    jm = thunderlite.jit(model)
    loss = jm(x, y); loss.backward()
    thunderlite.trace_report(jm, "report.html")     # open it in a browser

Modules: ``memory`` (live memory from shapes and ``del`` points), ``stages``
(traces -> rows, diffs, regions, sources), ``chart`` (the SVG), ``page`` (the
HTML); ``assets/`` holds the page's CSS and script. A reader above ``api``:
it may import it and every layer below.
"""
from __future__ import annotations

import os

from thunderlite.api import (
    compile_stats,
    last_backward_traces,
    last_gradients,
    last_prologue_traces,
    last_tier,
    last_traces,
)
from thunderlite.report.page import build_page


def trace_report(jfn, path: str | os.PathLike = "thunderlite_report.html") -> str:
    """Write the report of ``jfn``'s last call (a function or module returned by
    ``thunderlite.jit``) to ``path``; returns the path written."""
    forward = last_traces(jfn)          # raises a clear error when jfn is not jitted or never ran
    model = getattr(jfn, "_model", None)
    if model is not None:
        title = type(model).__name__
    else:
        fn = getattr(jfn, "fn", None)
        title = getattr(fn, "__qualname__", None) or getattr(jfn, "__name__", "function")
    html = build_page(title, forward, last_backward_traces(jfn), last_prologue_traces(jfn),
                      compile_stats(jfn)["stage_ms"], last_gradients(jfn), last_tier(jfn))
    path = os.fspath(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(html)
    return path
