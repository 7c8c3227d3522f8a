"""Shared by the whole-step tests: a small model, and a comparison of a jitted
training step against eager over several steps (parameters, ``.grad`` and
optimizer state, within 1e-5 in float32)."""
from __future__ import annotations

import copy

import torch

import thunderlite
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion

TOL = dict(rtol=1e-5, atol=1e-5)


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def train_step(model, opt, x, y):
    """The issue's step: cross entropy, backward, clipping, optimizer step, zero_grad."""
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def jit(fn, exs):
    if exs == "shuffle":
        return thunderlite.jit(fn, executors=[ShuffleFusion(3), "torch"])
    return thunderlite.jit(fn, executors=exs)


def assert_same_state(model, ref, opt=None, ref_opt=None) -> None:
    """Parameters, gradients (None where eager has None), buffers and optimizer state equal eager's."""
    for (n, p), (_, r) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.detach(), r.detach(), **TOL, msg=lambda m, n=n: f"{n}: {m}")
        assert (p.grad is None) == (r.grad is None), n
        if p.grad is not None:
            torch.testing.assert_close(p.grad, r.grad, **TOL, msg=lambda m, n=n: f"{n}.grad: {m}")
    for (n, b), (_, r) in zip(model.named_buffers(), ref.named_buffers(), strict=True):
        torch.testing.assert_close(b, r, **TOL, msg=lambda m, n=n: f"buffer {n}: {m}")
    if opt is not None:
        for p, r in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(opt.state[p], ref_opt.state[r], **TOL)
        for g, rg in zip(opt.param_groups, ref_opt.param_groups, strict=True):
            assert {k: v for k, v in g.items() if k not in ("params", "capturable")} == \
                   {k: v for k, v in rg.items() if k not in ("params", "capturable")}


def run_both(step, make_opt=None, exs=None, steps: int = 3, model=None, args=None, sched=None, make_ref_opt=None):
    """``step(model, opt, *args)`` (and ``sched`` if given) jitted and eager, ``steps`` times;
    ``make_ref_opt``: the eager optimizer where it differs from the jitted one's."""
    model = model if model is not None else small_model()
    ref = copy.deepcopy(model)
    opt = make_opt(model.parameters()) if make_opt else None
    ref_opt = (make_ref_opt or make_opt)(ref.parameters()) if make_opt else None
    extra, ref_extra = (), ()
    if sched is not None:
        extra, ref_extra = (sched(opt),), (sched(ref_opt),)
    torch.manual_seed(1)
    args = args if args is not None else (torch.randn(6, 4), torch.randint(0, 3, (6,)))
    jstep = jit(step, exs)
    outs = []
    for _ in range(steps):
        got = jstep(model, opt, *extra, *args)
        want = step(ref, ref_opt, *ref_extra, *args)
        torch.testing.assert_close(got, want, **TOL)
        assert_same_state(model, ref, opt, ref_opt)
        outs.append(got)
    return jstep, model, opt, outs
