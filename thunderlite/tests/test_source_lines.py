"""Traces name the user's lines: thunderlite's own frames (``jit(module)``
interprets ``api._call_module``) and torch's (``F.linear`` inside
``nn.Linear.forward``) are never the line a symbol is shown under, in the
trace comments or the report (frontend/source_map.py)."""
from __future__ import annotations

import json
import os
import re

import pytest
import torch

import thunderlite
from thunderlite.frontend.source_map import library_kind, source_line

THUNDERLITE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Proj(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.proj(x)                     # the line the linear is shown under
        return y.relu()


class _Soft(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.proj(x)
        return torch.nn.functional.softsign(y)


def _line_of(start: str) -> tuple[str, int, str]:
    """(this file, line number, text) of the line starting with ``start``."""
    with open(__file__, encoding="utf-8") as f:
        return next((__file__, i, line.strip()) for i, line in enumerate(f, 1) if line.strip().startswith(start))


PROJ = _line_of("y = self.proj(x)")

_COMMENT = re.compile(r"^  # (.+):(\d+): (.*)$")


def _shown_line(trace, bsym) -> tuple[str, int, str]:
    """The source comment printed above ``bsym`` in ``str(trace)``."""
    lines = str(trace).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"  {bsym.output.name} = "))
    for line in reversed(lines[:at]):
        m = _COMMENT.match(line)
        if m:
            return m.group(1), int(m.group(2)), m.group(3)
    raise AssertionError(f"no source comment above {bsym.output.name}:\n{trace}")


def _linear(trace):
    return next(b for b in trace.bound_symbols if b.sym.name == "linear")


def _not_thunderlite(fname: str) -> bool:
    return not fname.startswith(THUNDERLITE_DIR + os.sep) or fname.startswith(os.path.join(THUNDERLITE_DIR, "tests"))


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_a_jitted_modules_linear_is_shown_under_the_users_line(grad):
    jm = thunderlite.jit(_Proj())
    x = torch.randn(2, 4)
    with torch.set_grad_enabled(grad):
        jm(x)
    for trace in (thunderlite.last_traces(jm)[0], thunderlite.last_traces(jm)[-1]):
        lin = _linear(trace)
        assert _shown_line(trace, lin) == PROJ, str(trace)
        # the torch frames below the user's line are kept (the report's "via"); no thunderlite frame anywhere
        assert lin.source.via and lin.source.via[-1][0].endswith(os.path.join("nn", "modules", "linear.py"))
        assert all(library_kind(f) == "torch" for f, _ in lin.source.via)
        assert all(_not_thunderlite(f) for f, _ in (*lin.source.callers, *lin.source.via))
    assert "api.py" not in str(thunderlite.last_traces(jm)[-1])


def test_the_reports_rows_name_the_users_line(tmp_path):
    jm = thunderlite.jit(_Proj())
    jm(torch.randn(2, 4)).sum().backward()
    html = open(thunderlite.trace_report(jm, tmp_path / "r.html"), encoding="utf-8").read()
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)[1])
    final = data["groups"][0]["stages"][-1]
    lin = next(data["sources"][r["src"]] for r in final["rows"] if "linear(" in r["code"])
    assert lin["user"] == list(PROJ)                                # the line the row is grouped under
    assert lin["library"] and lin["file"].endswith("linear.py")     # shown "via" torch's line
    assert all(_not_thunderlite(f) for f, _, _ in lin["stack"]), lin["stack"]
    assert all(_not_thunderlite(s["file"]) and _not_thunderlite((s.get("user") or [""])[0]) for s in data["sources"])


def test_library_frames_are_thunderlites_and_torchs_own():
    import thunderlite.api
    import thunderlite.demo
    assert library_kind(thunderlite.api.__file__) == "thunderlite"
    assert library_kind(torch.nn.functional.__file__) == "torch"
    assert library_kind(__file__) is None                   # the tests' programs are the user's
    assert library_kind(thunderlite.demo.__file__) is None  # and so is the demo's model
    assert library_kind("<eval_with_key>.3") is None        # generated code (mapped to the user's when registered)
    user, api = (__file__, 10), (thunderlite.api.__file__, 5)
    module, linear = (torch.nn.modules.module.__file__, 1789), (torch.nn.modules.linear.__file__, 134)
    src = source_line([api, module, user, module, linear])
    assert (src[0], src[1]) == user and src.callers == (module,) and src.via == (module, linear)
    only_torch = source_line([api, module, linear])         # jit(nn.Linear(...)): torch's innermost line
    assert (only_torch[0], only_torch[1]) == linear and only_torch.callers == (module,) and only_torch.via == ()
    assert source_line([api]) is None


def test_parts_of_a_call_autodiff_flattens_keep_its_line():
    """softsign has no rule: autodiff differentiates its parts (abs, add, div),
    which are shown under the user's ``softsign`` line, not the line before it."""
    jm = thunderlite.jit(_Soft())
    jm(torch.randn(2, 4)).sum().backward()
    final = thunderlite.last_traces(jm)[-1]
    soft_line = _line_of("return torch.nn.functional.softsign(y)")
    parts = [b for b in final.bound_symbols if b.sym.name in ("abs", "add", "div")]
    assert len(parts) == 3, final
    for b in parts:
        assert tuple(b.source[:3]) == soft_line, (b, b.source)
