"""``last_traces`` / ``last_backward_traces`` list each stage once, named for
the pass that made it (issue 15): a pass that returned its input unchanged is
not listed again, with or without grad, fusion executors, or in-place code."""
from __future__ import annotations

import pytest
import torch

import thunderlite

PASSES = {"interpretation", "update_aliases", "dce", "claim_executors", "schedule_collectives", "del_last_used",
          "box_inputs", "reuse_buffers", "fold_views",
          "functionalize",
          "split_forward_backward (forward)", "split_forward_backward (backward)",
          "split_forward_backward (eager mode: no-grad values detached)"}


def _inplace(a):
    b = a * 2
    b.add_(1)
    return b.sin().sum()


def _plain(a):
    return a.sin().cos().sum()


def _view_write(a):
    b = a * 1
    b[0:2].mul_(2)
    return b.sum()


def _check(traces):
    stages = [t.stage for t in traces]
    assert len(stages) == len(set(stages)), stages
    assert len({id(t) for t in traces}) == len(traces)
    assert set(stages) <= PASSES, set(stages) - PASSES
    for t in traces:
        assert str(t).startswith(f"# Constructed by {t.stage}")


_CASES = [(fn, None) for fn in (_inplace, _plain, _view_write)] + [(_plain, ["torchcompile"])]


@pytest.mark.parametrize("fn, executors", _CASES, ids=["inplace", "plain", "view_write", "plain-torchcompile"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_each_stage_once_named_for_its_pass(fn, executors, grad):
    jf = thunderlite.jit(fn, executors=executors)
    x = torch.randn(4, requires_grad=grad)
    out = jf(x)
    _check(thunderlite.last_traces(jf))
    if grad:
        _check(thunderlite.last_backward_traces(jf))
        out.backward()
        want = torch.autograd.grad(fn(x), x)[0]
        torch.testing.assert_close(x.grad, want)
    assert thunderlite.last_traces(jf)[0].stage == "interpretation"


def test_stages_of_a_module_with_buffers_in_training():
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    jm = thunderlite.jit(m)
    jm(torch.randn(4, 3)).sum().backward()
    _check(thunderlite.last_traces(jm))
    _check(thunderlite.last_backward_traces(jm))
