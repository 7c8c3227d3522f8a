"""Module and parameter hooks under ``thunderlite.jit(module)``: the forward
hooks (the module's own and the global ones) are traced with the forward;
hooks on parameters fire in autograd's backward, which reaches the real
parameters; module backward hooks, which fire at the module's boundary inside
autograd's backward, are refused by name (the compiled program has no such
boundary), never skipped."""
from __future__ import annotations

import pytest
import torch

import thunderlite


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def _pre(mod, args):
    return (args[0] * 2,)


def _post(mod, args, out):
    return out * 3


def _scale_grad(g):
    return g * 11


def _post_accumulate(p):
    p.grad.mul_(13)


def _global(mod, args, out):
    return out * 2 if isinstance(mod, torch.nn.Tanh) else None


HOOKS = {
    "forward_pre": lambda m: m[0].register_forward_pre_hook(_pre),
    "forward": lambda m: m[0].register_forward_hook(_post),
    "forward_with_kwargs": lambda m: m[2].register_forward_hook(lambda mod, a, kw, o: o - 1, with_kwargs=True),
    "global_forward": lambda m: torch.nn.modules.module.register_module_forward_hook(_global),
    "parameter_grad": lambda m: m[0].weight.register_hook(_scale_grad),
    "post_accumulate_grad": lambda m: m[0].weight.register_post_accumulate_grad_hook(_post_accumulate),
}


def _run(model, call):
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out = call(x)
    out.sum().backward()
    return out.detach(), x.grad, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_hooks_the_trace_runs_match_eager(kind):
    results = []
    for use_jit in (False, True):
        model = _model()
        handle = HOOKS[kind](model)
        try:
            results.append(_run(model, thunderlite.jit(model) if use_jit else model))
        finally:
            handle.remove()
    torch.testing.assert_close(results[1], results[0])


@pytest.mark.parametrize("register", ["register_full_backward_hook", "register_full_backward_pre_hook"])
def test_module_backward_hooks_are_refused_by_name(register):
    model = _model()
    getattr(model[2], register)(lambda mod, *grads: None)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NotImplementedError, match="module backward hooks: Linear.*outside thunderlite.jit"):
        thunderlite.jit(model)(torch.randn(5, 3))
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)


def test_global_backward_hooks_are_refused_by_name():
    handle = torch.nn.modules.module.register_module_full_backward_hook(lambda mod, gi, go: None)
    try:
        with pytest.raises(NotImplementedError, match="module backward hooks"):
            thunderlite.jit(_model())(torch.randn(5, 3))
    finally:
        handle.remove()
