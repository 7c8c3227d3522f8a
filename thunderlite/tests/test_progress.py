"""Long compiles show progress on stderr (issue 15): the stage and the number of
symbols, only when stderr is a terminal (or forced with ``progress=True``), never
with ``progress=False``. The 2 s threshold is lowered here, never timed."""
from __future__ import annotations

import io
import re
import sys

import pytest
import torch

import thunderlite
from thunderlite.frontend import progress

STAGES = ("interpretation", "update_aliases", "dce", "claim_executors", "del_last_used", "split_forward_backward",
          "reuse_buffers", "box_inputs", "functionalize", "schedule_collectives")


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def long_program(x):
    for _ in range(150):
        x = x.sin() * 2
    return x.sum()


@pytest.fixture
def fast_progress(monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.005)


def _compile_with_stderr(monkeypatch, stream, **jit_options) -> str:
    monkeypatch.setattr(sys, "stderr", stream)
    x = torch.randn(4)
    out = thunderlite.jit(long_program, **jit_options)(x)
    torch.testing.assert_close(out, long_program(x))
    return stream.getvalue()


def test_progress_on_a_terminal_names_stage_and_symbols(monkeypatch, fast_progress):
    text = _compile_with_stderr(monkeypatch, FakeTTY())
    updates = re.findall(r"thunderlite: compiling long_program: ([\w ()]+), (\d+) symbols \(\d+\.\d s\)", text)
    assert updates, text
    assert {stage for stage, _ in updates} <= set(STAGES)
    assert max(int(n) for _, n in updates) > 0
    assert re.search(r"thunderlite: long_program compiled in \d+\.\d s \(\d+ symbols\)\n$", text)


def test_progress_forced_when_stderr_is_not_a_terminal(monkeypatch, fast_progress):
    assert "compiling long_program" in _compile_with_stderr(monkeypatch, io.StringIO(), progress=True)


def test_no_progress_when_stderr_is_not_a_terminal(monkeypatch, fast_progress):
    assert _compile_with_stderr(monkeypatch, io.StringIO()) == ""


def test_no_progress_when_turned_off(monkeypatch, fast_progress):
    assert _compile_with_stderr(monkeypatch, FakeTTY(), progress=False) == ""


def test_no_progress_for_a_short_compile(monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 3600.0)
    assert _compile_with_stderr(monkeypatch, FakeTTY()) == ""


def test_progress_of_a_module_with_grad_names_the_module(monkeypatch, fast_progress):
    monkeypatch.setattr(sys, "stderr", FakeTTY())
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    thunderlite.jit(m)(torch.randn(2, 4)).sum().backward()
    assert "thunderlite: Sequential compiled in" in sys.stderr.getvalue()


def test_a_failing_compile_says_so(monkeypatch, fast_progress):
    def bad(x):
        return x * 2 if x.sum() > 0 else x       # control flow on a tensor's value
    monkeypatch.setattr(sys, "stderr", FakeTTY())
    with pytest.raises(thunderlite.DataDependentError):
        thunderlite.jit(bad, splits=False)(torch.randn(3))
    assert "thunderlite: bad failed after" in sys.stderr.getvalue()
