"""Rerun a thunderlite.jit test module through the ThunderFX backend
(issue 12): a test module does ``from <suite> import *`` and
``backend_fixture(DIFFERENT_BY_DESIGN)``; every test of the suite is then
collected again with ``thunderlite.jit`` standing for ``thunderfx``
(torch.compile with a ThunderCompiler), so each program goes dynamo -> FX
graph -> thunderlite.

A test passes only if thunderlite really ran: after each test every compiled
callable that dynamo compiled must have run a piece through thunderlite, and
no piece may have been handed to the fallback because thunderlite failed to
trace it (pieces split out up front, such as ``.item()``, are fine: that is
the backend's design), so a fallback cannot make a test pass vacuously. Tests
that check what only the ``thunderlite.jit`` front door does are listed by
each module with the reason and run as strict xfails."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo

import thunderlite
from thunderlite.dynamo import thunderfx

_real_last_traces = thunderlite.last_traces


class _Tracker:
    def __init__(self):
        self.compiled: list = []

    def jit(self, fn, **options):
        compiled = thunderfx(fn, fallback="eager", **options)
        self.compiled.append(compiled)
        return compiled


def _last_traces(obj):
    compiler = getattr(obj, "thunder_compiler", None)
    if compiler is None:
        return _real_last_traces(obj)
    per_piece = compiler.last_traces()
    if not per_piece:
        raise RuntimeError("no thunderlite piece has run")
    return per_piece[-1]


def backend_fixture(different_by_design: dict[str, str]):
    """The autouse fixture a suite module installs (assign it to a module global)."""
    @pytest.fixture(autouse=True)
    def _through_backend(monkeypatch, request):
        reason = different_by_design.get(request.node.originalname)
        if reason:
            request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
        torch._dynamo.reset()
        tracker = _Tracker()
        monkeypatch.setattr(thunderlite, "jit", tracker.jit)
        monkeypatch.setattr(thunderlite, "last_traces", _last_traces)
        yield tracker
        torch._dynamo.reset()
        for compiled in tracker.compiled:
            compiler = compiled.thunder_compiler
            if not compiler.graphs:
                continue                # never called, or dynamo ran it all eagerly before any graph
            assert any(p.thunder for g in compiler.graphs for p in g.pieces), compiler.report()
            refused = [p.name for g in compiler.graphs for p in g.pieces
                       if any(r.startswith("thunderlite could not trace") for r, _ in p.reasons)]
            assert not refused, compiler.report()
    return _through_backend
