"""Training programs that change between calls or leave the call early, against
eager: parameter groups added or removed and optimizer state reset between
calls, a hand-written update rebinding its loop variable (``p -= lr * p.grad``),
and a program's own exception after it wrote its inputs (eager's writes before
the raise stay done)."""
import copy

import pytest
import torch
import torch.nn.functional as F

import thunderlite

EXECUTORS = [None, ["torchcompile", "torch"]]


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def _assert_same(m1, m2, o1=None, o2=None):
    for (name, p), q in zip(m1.named_parameters(), m2.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=name)
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    if o1 is not None:
        assert len(o1.state) == len(o2.state)
        assert [len(g["params"]) for g in o1.param_groups] == [len(g["params"]) for g in o2.param_groups]
        for p, q in zip(m1.parameters(), m2.parameters(), strict=True):
            s1, s2 = o1.state.get(p, {}), o2.state.get(q, {})
            assert s1.keys() == s2.keys()
            for k in s1:
                torch.testing.assert_close(s1[k], s2[k], msg=k)


@pytest.mark.parametrize("executors", EXECUTORS)
@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    lambda ps: torch.optim.SGD(ps, lr=1e-1, momentum=0.9),
], ids=["adamw", "sgd_momentum"])
def test_param_group_added_between_calls(make_opt, executors):
    m1 = _net()
    m2 = copy.deepcopy(m1)
    o1, o2 = make_opt(m1[0].parameters()), make_opt(m2[0].parameters())
    jstep = thunderlite.jit(_step, executors=executors)
    torch.manual_seed(1)
    for i in range(5):
        x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
        if i == 2:      # the optimizer's lazily made state for the new parameters is made in the call
            o1.add_param_group({"params": list(m1[2].parameters()), "lr": 1e-3})
            o2.add_param_group({"params": list(m2[2].parameters()), "lr": 1e-3})
        torch.testing.assert_close(jstep(m1, o1, x, y), _step(m2, o2, x, y))
        _assert_same(m1, m2, o1, o2)


def test_param_group_removed_and_state_reset_between_calls():
    m1 = _net()
    m2 = copy.deepcopy(m1)
    o1 = torch.optim.AdamW([{"params": m1[0].parameters()}, {"params": m1[2].parameters(), "lr": 1e-3}])
    o2 = torch.optim.AdamW([{"params": m2[0].parameters()}, {"params": m2[2].parameters(), "lr": 1e-3}])
    jstep = thunderlite.jit(_step)
    torch.manual_seed(2)
    for i in range(6):
        x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
        if i == 2:
            o1.param_groups.pop()
            o2.param_groups.pop()
        if i == 4:
            o1.state.clear()
            o2.state.clear()
        torch.testing.assert_close(jstep(m1, o1, x, y), _step(m2, o2, x, y))
        _assert_same(m1, m2, o1, o2)


def _manual_sgd(model, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad        # rebinds p to the in-place result: still the parameter
            p.grad.mul_(0.5)         # its .grad is the parameter's
            seen = p.grad.sum()
            p.grad = None
    return loss.detach(), seen


@pytest.mark.parametrize("executors", EXECUTORS)
def test_update_rebinding_the_parameter_after_an_inplace_operator(executors):
    m1 = _net()
    m2 = copy.deepcopy(m1)
    jf = thunderlite.jit(_manual_sgd, executors=executors)
    torch.manual_seed(3)
    for _ in range(3):
        x = torch.randn(5, 4)
        got, want = jf(m1, x), _manual_sgd(m2, x)
        torch.testing.assert_close(got, want)
        _assert_same(m1, m2)
        assert all(p.grad is None for p in m1.parameters())


def _grad_kept(model, x):
    loss = model(x).sum()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p *= 0.5
            if p.grad is not None:    # read through the rebound name: the parameter's gradient
                p.grad.zero_()
    return loss.detach()


def test_grad_read_through_the_rebound_name():
    m1 = _net()
    m2 = copy.deepcopy(m1)
    jf = thunderlite.jit(_grad_kept)
    for _ in range(3):
        x = torch.randn(5, 4)
        torch.testing.assert_close(jf(m1, x), _grad_kept(m2, x))
        _assert_same(m1, m2)
        assert all(p.grad is not None and not p.grad.any() for p in m1.parameters())


def _writes_then_raises(buf, x):
    buf.add_(1)
    if x.shape[0] > 3:
        raise ValueError(f"too long: {x.shape[0]}")
    return x + buf


class _Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(3))
        self.calls = 0

    def forward(self, x):
        self.seen.add_(x.sum(0))
        self.calls += 1
        if x.shape[0] > 3:
            raise ValueError("batch too big")
        return x * 2


def test_program_exception_after_writes_leaves_them_done():
    jf = thunderlite.jit(_writes_then_raises)
    buf, ref = torch.zeros(3), torch.zeros(3)
    for n in (2, 4, 4, 3, 5):
        x = torch.ones(n, 3)
        try:
            want = _writes_then_raises(ref, x)
        except ValueError as e:
            with pytest.raises(ValueError, match=str(e)):
                jf(buf, x)
        else:
            torch.testing.assert_close(jf(buf, x), want)
        torch.testing.assert_close(buf, ref)

    m1, m2 = _Counting(), _Counting()
    jm = thunderlite.jit(m1)
    for n in (2, 4, 4, 2):
        x = torch.randn(n, 3)
        try:
            want = m2(x)
        except ValueError:
            with pytest.raises(ValueError, match="batch too big"):
                jm(x)
        else:
            torch.testing.assert_close(jm(x), want)
        torch.testing.assert_close(m1.seen, m2.seen)
        assert m1.calls == m2.calls


def _write_then_bad_matmul(buf, x, w):
    buf.mul_(2)
    return x @ w       # torch's own error, which eager raises after the write


def test_torch_error_after_a_write_leaves_it_done():
    buf, ref = torch.ones(3), torch.ones(3)
    x, w = torch.randn(2, 3), torch.randn(4, 5)
    with pytest.raises(RuntimeError) as eager:
        _write_then_bad_matmul(ref, x, w)
    with pytest.raises(RuntimeError) as jitted:
        thunderlite.jit(_write_then_bad_matmul)(buf, x, w)
    assert type(jitted.value) is type(eager.value)
    torch.testing.assert_close(buf, ref)


def _unsupported_after_write(buf, x):
    buf.add_(1)
    import numpy as np
    return x + torch.from_numpy(np.ones(3, dtype="float32"))


def test_thunderlite_refusal_leaves_inputs_untouched():
    buf = torch.zeros(3)
    with pytest.raises(Exception, match="numpy"):
        thunderlite.jit(_unsupported_after_write)(buf, torch.ones(3))
    assert not buf.any()
