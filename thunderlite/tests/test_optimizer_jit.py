"""``thunderlite.jit(optimizer.step)``: SGD with momentum and AdamW, foreach on
and off, against eager over several steps: parameters, every state tensor,
and the state tensors updated in place (the same objects from the second step
on, as eager keeps them), with the default executors and reordering ones."""
from __future__ import annotations

import copy

import pytest
import torch

import thunderlite
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion

STEPS = 4


def _make(kind: str, params, foreach: bool):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=foreach)
    return torch.optim.AdamW(params, lr=0.05, weight_decay=0.1, foreach=foreach)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _backward(model, x):
    model.zero_grad()
    model(x).pow(2).sum().backward()


def _step_both(model, step, ref, ref_opt, x) -> None:
    """One training step of the model the jitted ``step`` updates and of the eager reference."""
    _backward(model, x)
    _backward(ref, x)
    step()
    ref_opt.step()


def _assert_same(model, opt, ref, ref_opt) -> None:
    """The parameters and every optimizer state tensor equal the eager reference's."""
    torch.testing.assert_close(dict(model.named_parameters()), dict(ref.named_parameters()))
    for p, rp in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(opt.state[p], ref_opt.state[rp])


def _jit(fn, exs):
    if exs == "shuffle":
        return thunderlite.jit(fn, executors=[ShuffleFusion(5), "torch"])
    return thunderlite.jit(fn, executors=exs)


def _state_ids(opt) -> list[int]:
    return [id(t) for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]


_CASES = [(k, f, e) for k in ("sgd", "adamw") for f in (False, True) for e in (None, "shuffle")]
_CASES += [("sgd", False, ["torchcompile", "torch"]), ("adamw", True, ["torchcompile", "torch"])]   # slow to compile


@pytest.mark.parametrize("kind,foreach,exs", _CASES,
                         ids=[f"{k}-{'foreach' if f else 'for_loop'}-"
                              f"{e if isinstance(e, str) else 'torchcompile' if e else 'default'}"
                              for k, f, e in _CASES])
def test_jitted_optimizer_step_matches_eager(kind, foreach, exs):
    model, ref = _model(), _model()
    opt, ref_opt = _make(kind, model.parameters(), foreach), _make(kind, ref.parameters(), foreach)
    step = _jit(opt.step, exs)
    x = torch.randn(6, 4)
    ids = None
    for i in range(STEPS):
        _step_both(model, step, ref, ref_opt, x)
        _assert_same(model, opt, ref, ref_opt)
        if i >= 1:                       # state exists: updated in place from now on
            if ids is not None:
                assert _state_ids(opt) == ids
            ids = _state_ids(opt)
    info = thunderlite.cache_info(step)
    assert info["misses"] == 2 and info["hits"] == STEPS - 2     # the first step creates the state


def test_state_is_reloaded_not_stale():
    """Replacing the optimizer's state (load_state_dict) misses the cache:
    the compiled step never keeps updating the tensors it saw first."""
    model, ref = _model(), _model()
    opt, ref_opt = _make("adamw", model.parameters(), False), _make("adamw", ref.parameters(), False)
    step = thunderlite.jit(opt.step)
    x = torch.randn(6, 4)
    for _ in range(3):
        _step_both(model, step, ref, ref_opt, x)
    opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))
    _step_both(model, step, ref, ref_opt, x)
    _assert_same(model, opt, ref, ref_opt)


def test_parameter_without_grad_is_skipped_like_eager():
    model, ref = _model(), _model()
    opt, ref_opt = _make("sgd", model.parameters(), True), _make("sgd", ref.parameters(), True)
    step = thunderlite.jit(opt.step)
    x = torch.randn(6, 4)
    for _ in range(3):
        for m in (model, ref):
            _backward(m, x)
            m[2].bias.grad = None
        step()
        ref_opt.step()
    torch.testing.assert_close(dict(model.named_parameters()), dict(ref.named_parameters()))
    assert len(opt.state) == len(ref_opt.state)


def test_backward_inside_the_jitted_function_runs_the_whole_step():
    """``loss.backward()`` and ``opt.step()`` in one jitted function (test_whole_step.py has the rest)."""
    model, ref = _model(), _model()
    opt, ref_opt = _make("sgd", model.parameters(), False), _make("sgd", ref.parameters(), False)
    x = torch.randn(6, 4)

    def train_step(model, opt, x):
        loss = model(x).pow(2).sum()
        loss.backward()
        opt.step()
        return loss.detach()
    jstep = thunderlite.jit(train_step)
    for _ in range(3):
        model.zero_grad()
        ref.zero_grad()
        torch.testing.assert_close(jstep(model, opt, x), train_step(ref, ref_opt, x))
        _assert_same(model, opt, ref, ref_opt)


def test_train_step_with_backward_outside():
    """The supported pattern: jitted model, eager backward, jitted step."""
    model, ref = _model(), _model()
    opt, ref_opt = _make("adamw", model.parameters(), True), _make("adamw", ref.parameters(), True)
    jmodel, step = thunderlite.jit(model), thunderlite.jit(opt.step)
    x = torch.randn(6, 4)
    for _ in range(3):
        opt.zero_grad()
        jmodel(x).pow(2).sum().backward()
        step()
        ref_opt.zero_grad()
        ref(x).pow(2).sum().backward()
        ref_opt.step()
    torch.testing.assert_close(dict(model.named_parameters()), dict(ref.named_parameters()))
