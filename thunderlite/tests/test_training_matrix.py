"""A generated set of whole training steps, jitted whole and checked against eager
over several calls: optimizer x scheduler x GradScaler x gradient accumulation x
clipping x control flow on tensor values x changes between calls.

Every combination is a program a user writes; the set is a fixed sample of
the product (seeded), so each option meets many others. Each program runs four
calls on a jitted copy and on eager (a nan batch among them where the program
skips such a step: GradScaler, a finite check), and after
every call the parameters, gradients, optimizer state, scheduler and scaler
state must equal eager's."""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import thunderlite

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.5),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-2),
}
SCHEDULERS = {
    "none": None,
    "step": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4),
    "plateau": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0),     # steps on loss.item()
}
CLIPS = ("none", "norm", "value", "norm_error_if_nonfinite")
# control flow on a tensor's value: none, a finite check around the update (predicated),
# a value read on the host for a Python decision (a split), a loss logged with .item() (a split),
# a while loop stepping again while the loss is large (a split per iteration)
FLOWS = ("none", "finite_check", "host_threshold", "log_item", "while_large")
# between the second and third call: nothing, a new learning rate, a frozen layer,
# a parameter group added, .grad kept (zero_grad(set_to_none=False)) from the start
CHANGES = ("none", "lr", "freeze", "add_group", "keep_grads")


@dataclass(frozen=True)
class Program:
    opt: str
    sched: str
    scaler: bool
    accum: int
    clip: str
    flow: str
    change: str

    @property
    def id(self) -> str:
        return (f"{self.opt}-{self.sched}-{'scaler' if self.scaler else 'noscaler'}-acc{self.accum}-"
                f"clip_{self.clip}-{self.flow}-{self.change}")


def _sample(n: int, seed: int) -> list[Program]:
    """``n`` programs drawn with a fixed seed, less those eager itself stops in
    (a non-finite gradient clipped with ``error_if_nonfinite``)."""
    every = [Program(*c) for c in itertools.product(OPTIMIZERS, SCHEDULERS, (False, True), (1, 2), CLIPS, FLOWS,
                                                     CHANGES)]
    every = [p for p in every if not (p.clip == "norm_error_if_nonfinite" and _has_nan_batch(p))]
    return random.Random(seed).sample(every, n)


def _has_nan_batch(p: Program) -> bool:
    return p.scaler or p.flow == "finite_check"


PROGRAMS = _sample(32, seed=35)
# Inductor compiles each program's regions: a smaller set with the torchcompile executor
TORCHCOMPILE_PROGRAMS = _sample(6, seed=36)


def make_step(p: Program):
    """The training step of program ``p``: what a user writes, options fixed."""
    def step(model, opt, sched, scaler, batches, log):
        total = None
        for x, y in batches:
            loss = F.cross_entropy(model(x), y) / len(batches)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        if scaler is not None:
            scaler.unscale_(opt)
        if p.clip == "norm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        elif p.clip == "value":
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
        elif p.clip == "norm_error_if_nonfinite":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, error_if_nonfinite=True)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        elif p.flow == "finite_check":
            if torch.isfinite(total):
                opt.step()
        elif p.flow == "host_threshold":
            if total.item() < 1.5:      # a decision on the host: eager reads the value here too
                opt.step()
            else:
                for group in opt.param_groups:
                    for q in group["params"]:
                        if q.grad is not None:
                            q.grad.mul_(0.5)
                opt.step()
        elif p.flow == "while_large":
            opt.step()
            n = 0
            while n < 2 and total > 0.9:
                opt.zero_grad()
                total = sum(F.cross_entropy(model(x), y) / len(batches) for x, y in batches)
                total.backward()
                opt.step()
                total = total.detach()
                n += 1
            log.append(n)
        else:
            opt.step()
        if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            sched.step(total.item())
        elif sched is not None:
            sched.step()
        opt.zero_grad(set_to_none=p.change != "keep_grads")
        if p.flow == "log_item":
            log.append(round(total.item(), 4))
        return total
    return step


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3))


def _batches(call: int, p: Program) -> list:
    g = torch.Generator().manual_seed(100 + call)
    out = []
    for k in range(p.accum):
        x = torch.randn(5, 4, generator=g)
        if call == 2 and k == 0 and _has_nan_batch(p):
            x[1, 2] = float("nan")      # the third call's loss and gradients are not finite: its step is skipped
        out.append((x, torch.randint(0, 3, (5,), generator=g)))
    return out


class Run:
    """One side of the comparison: model, optimizer, scheduler, scaler, log."""

    def __init__(self, p: Program):
        self.model = _model()
        self.opt = OPTIMIZERS[p.opt](list(self.model[0].parameters()) + list(self.model[2].parameters())
                                     if p.change == "add_group" else self.model.parameters())
        self.sched = SCHEDULERS[p.sched](self.opt) if SCHEDULERS[p.sched] else None
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2) if p.scaler else None
        self.log: list = []

    def change(self, p: Program) -> None:
        if p.change == "lr":
            for g in self.opt.param_groups:
                g["lr"] = g["lr"] * 0.3
        elif p.change == "freeze":
            for q in self.model[0].parameters():
                q.requires_grad_(False)
                q.grad = None
        elif p.change == "add_group":
            self.opt.add_param_group({"params": list(self.model[4].parameters()), "lr": 5e-3})

    def args(self, batches):
        return self.model, self.opt, self.sched, self.scaler, batches, self.log


def _assert_same(a: Run, b: Run) -> None:
    # gradients a GradScaler scaled (by up to 2**11, and left scaled on parameters outside the
    # optimizer) keep float32's relative rounding: compared relatively
    grad_tol = dict(rtol=1e-4, atol=1e-4) if a.scaler is not None else dict(rtol=1e-5, atol=1e-5)
    for (n, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
        assert (p.grad is None) == (q.grad is None), n
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, **grad_tol, msg=lambda m, n=n: f"{n}.grad: {m}")
        assert p.requires_grad == q.requires_grad, n
    assert len(a.opt.state) == len(b.opt.state)
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        s1, s2 = a.opt.state.get(p, {}), b.opt.state.get(q, {})
        assert s1.keys() == s2.keys()
        for k in s1:
            torch.testing.assert_close(s1[k], s2[k], rtol=1e-5, atol=1e-5, msg=lambda m, k=k: f"state {k}: {m}")
    for g1, g2 in zip(a.opt.param_groups, b.opt.param_groups, strict=True):
        assert g1["lr"] == pytest.approx(g2["lr"])
    if a.sched is not None:     # ReduceLROnPlateau's best loss: a float the fused step rounds once
        s1, s2 = a.sched.state_dict(), b.sched.state_dict()
        assert s1.keys() == s2.keys()
        for k in s1:
            assert s1[k] == (pytest.approx(s2[k], rel=1e-5) if type(s2[k]) is float else s2[k]), k
    if a.scaler is not None:
        assert a.scaler.get_scale() == b.scaler.get_scale()
        assert a.scaler._growth_tracker.item() == b.scaler._growth_tracker.item()
    assert [repr(v) for v in a.log] == [repr(v) for v in b.log]     # nan logged too


def _check(p: Program, executors) -> None:
    step = make_step(p)
    jitted, eager = Run(p), Run(p)
    jstep = thunderlite.jit(step, executors=executors)
    for call in range(4):
        if call == 2:
            jitted.change(p)
            eager.change(p)
        batches = _batches(call, p)
        got = jstep(*jitted.args(batches))
        want = step(*eager.args(batches))
        torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m, c=call: f"call {c}: {m}")
        _assert_same(jitted, eager)


@pytest.mark.parametrize("p", PROGRAMS, ids=[p.id for p in PROGRAMS])
def test_training_program_matches_eager(p):
    _check(p, None)


@pytest.mark.parametrize("p", TORCHCOMPILE_PROGRAMS, ids=[p.id for p in TORCHCOMPILE_PROGRAMS])
def test_training_program_matches_eager_with_torchcompile(p):
    _check(p, ["torchcompile", "torch"])


def test_the_sample_covers_every_option():
    for field, values in (("opt", OPTIMIZERS), ("sched", SCHEDULERS), ("scaler", (False, True)), ("accum", (1, 2)),
                          ("clip", CLIPS), ("flow", FLOWS), ("change", CHANGES)):
        assert {getattr(p, field) for p in PROGRAMS} == set(values), field
