"""Optimizers, LR schedulers and gradient clipping inside a whole jitted training
step (backward included), against eager after three steps: parameters, ``.grad``,
optimizer state (tensors and step counts, written in place) and param groups."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import thunderlite
from thunderlite.tests.whole_step_util import run_both, train_step


def step_fn(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


_SGD = {
    "momentum": dict(momentum=0.9),
    "nesterov": dict(momentum=0.9, nesterov=True, weight_decay=0.01),
    "dampening": dict(momentum=0.9, dampening=0.5, weight_decay=0.1),
    "plain_foreach": dict(foreach=True, weight_decay=0.1),
    "maximize": dict(momentum=0.5, maximize=True),
}


@pytest.mark.parametrize("name", list(_SGD))
def test_sgd(name):
    run_both(step_fn, lambda ps: torch.optim.SGD(ps, lr=0.1, **_SGD[name]))


_ADAM = {
    "adam_for_loop": (torch.optim.Adam, dict(foreach=False)),
    "adam_foreach_wd": (torch.optim.Adam, dict(foreach=True, weight_decay=0.1)),
    "adam_amsgrad": (torch.optim.Adam, dict(amsgrad=True, foreach=False)),
    "adam_maximize": (torch.optim.Adam, dict(maximize=True, foreach=True)),
    "adam_capturable": (torch.optim.Adam, dict(capturable=True, foreach=False)),
    "adamw_for_loop": (torch.optim.AdamW, dict(foreach=False, weight_decay=0.1)),
    "adamw_foreach_amsgrad": (torch.optim.AdamW, dict(foreach=True, amsgrad=True)),
    "adamw_capturable_foreach": (torch.optim.AdamW, dict(capturable=True, foreach=True)),
}


@pytest.mark.parametrize("name", list(_ADAM))
def test_adam(name):
    """``capturable=True`` on the CPU: eager refuses the device, but the optimizer skips
    that check while compiling (``torch.compiler.is_compiling()``, as under
    torch.compile): the jitted step computes what the non-capturable eager one does."""
    cls, kw = _ADAM[name]
    ref_kw = dict(kw, capturable=False) if kw.get("capturable") and not torch.cuda.is_available() else kw
    run_both(step_fn, lambda ps: cls(ps, lr=0.01, **kw), make_ref_opt=lambda ps: cls(ps, lr=0.01, **ref_kw))


def test_adamw_whole_step_with_torchcompile():
    run_both(train_step, lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True), ["torchcompile", "torch"])


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_fused_adam_matches(cls):
    """``fused=True`` runs ATen's fused kernel (one opaque op writing every tensor)."""
    run_both(step_fn, lambda ps: cls(ps, lr=0.01, fused=True))


@pytest.mark.parametrize("clip", ["norm", "norm_inf", "value"])
def test_gradient_clipping(clip):
    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y) * 10
        loss.backward()
        if clip == "norm":
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        elif clip == "norm_inf":
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1, norm_type="inf", foreach=False)
        else:
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)
            norm = loss.detach()
        opt.step()
        opt.zero_grad()
        return norm
    run_both(step, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))


_SCHED = {
    "step": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5),
    "lambda": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1.0 / (e + 1)),
    "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4),
}


@pytest.mark.parametrize("name", list(_SCHED))
def test_lr_scheduler_in_the_step(name):
    """The scheduler's Python-number state is written back; the next call reads the new lr
    (a changed lr is a guarded value: the step recompiles for it, as the miss reason says)."""
    def step(model, opt, sched, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        return loss.detach()
    jstep, _, opt, _ = run_both(step, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), steps=3,
                                sched=_SCHED[name])
    assert thunderlite.cache_info(jstep)["misses"] >= 2


def test_optimizer_state_is_written_in_place():
    """From the second step on, the state tensors (moments, step counts) are the same
    objects, updated in place, as eager keeps them."""
    jstep, model, opt, _ = run_both(step_fn, lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False), steps=2)
    ids = [id(t) for s in opt.state.values() for t in s.values()]
    jstep(model, opt, torch.randn(6, 4), torch.randint(0, 3, (6,)))
    assert [id(t) for s in opt.state.values() for t in s.values()] == ids
    assert all(int(s["step"]) == 3 for s in opt.state.values())
