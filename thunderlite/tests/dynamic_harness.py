"""Rerun a thunderlite.jit test module with every size symbolic (issue 14): a
test module does ``from <suite> import *`` and assigns ``dynamic_fixture()``
to a module global; every test of the suite is then collected again with
``thunderlite.jit`` standing for ``thunderlite.jit(..., dynamic=True)``, so
each program is traced with symbolic sizes (or, where symbolic sizes fail,
compiled per size, which the test still checks against eager)."""
from __future__ import annotations

import pytest

import thunderlite

_real_jit = thunderlite.jit


def _dynamic_jit(fn, **options):
    options.setdefault("dynamic", True)
    return _real_jit(fn, **options)


def dynamic_fixture(different_by_design: dict[str, str] | None = None):
    """The autouse fixture a suite module installs (assign it to a module global)."""
    reasons = different_by_design or {}

    @pytest.fixture(autouse=True)
    def _with_symbolic_sizes(monkeypatch, request):
        reason = reasons.get(request.node.originalname)
        if reason:
            request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
        monkeypatch.setattr(thunderlite, "jit", _dynamic_jit)
        yield
    return _with_symbolic_sizes
