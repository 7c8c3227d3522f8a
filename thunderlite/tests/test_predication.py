"""Predication (transforms/predication.py, frontend/training/predicated.py): a
block eager runs or skips on a tensor's value, traced once with its tensor
writes selected by the flag, no host read. GradScaler's skipped step, and
``if flag:`` blocks that only write tensors, against eager over several calls
with and without inf/nan; blocks that do more read their flag instead."""
import copy

import pytest
import torch
import torch.nn.functional as F

import thunderlite
from thunderlite.core.proxies import DataDependentError

EXECUTORS = [None, ["torchcompile", "torch"]]


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches(n, bad=(), seed=1, value=None):
    """Batches, those at ``bad`` with an inf or nan input (``value``: always that)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = torch.randn(6, 4, generator=g)
        if i in bad:
            x[0, 0] = value if value is not None else float("inf") if i % 2 else float("nan")
        out.append((x, torch.randint(0, 3, (6,), generator=g)))
    return out


def _same_training_state(m1, m2, o1, o2):
    for p, q in zip(m1.parameters(), m2.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    assert len(o1.state) == len(o2.state)
    for p, q in zip(m1.parameters(), m2.parameters(), strict=True):
        s1, s2 = o1.state[p], o2.state[q]
        assert s1.keys() == s2.keys()
        for k in s1:
            torch.testing.assert_close(s1[k], s2[k])


def _scaled_step(model, opt, scaler, x, y):
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    return loss.detach()


@pytest.mark.parametrize("executors", EXECUTORS)
@pytest.mark.parametrize("make_opt", [lambda ps: torch.optim.AdamW(ps, lr=1e-2),
                                      lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)],
                         ids=["adamw", "sgd_momentum"])
def test_grad_scaler_step_is_predicated(make_opt, executors):
    m1 = _net()
    m2 = copy.deepcopy(m1)
    o1, o2 = make_opt(m1.parameters()), make_opt(m2.parameters())
    s1, s2 = (torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2) for _ in range(2))
    batches = _batches(7, bad=(3, 4))
    # the optimizer's state is made on its first step, which a flag cannot undo: that step runs eagerly here
    _scaled_step(m1, o1, s1, *batches[0])
    _scaled_step(m2, o2, s2, *batches[0])
    jstep = thunderlite.jit(_scaled_step, executors=executors)
    for x, y in batches[1:]:
        torch.testing.assert_close(jstep(m1, o1, s1, x, y), _scaled_step(m2, o2, s2, x, y), equal_nan=True)
        _same_training_state(m1, m2, o1, o2)
        assert s1.get_scale() == s2.get_scale()
        assert s1._growth_tracker.item() == s2._growth_tracker.item()
    assert thunderlite.cache_info(jstep)["misses"] == 1
    first = thunderlite.last_traces(jstep)[0]
    assert any(c.startswith("predicated on") and "GradScaler" in c for c in first.header_comments)
    assert "item" not in str(thunderlite.last_traces(jstep)[-1])      # no host read of found_inf


def _finite_step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    if torch.isfinite(loss):
        opt.step()
    opt.zero_grad()
    return loss.detach()


@pytest.mark.parametrize("executors", EXECUTORS)
def test_finite_check_guarding_the_update_is_predicated(executors):
    m1 = _net()
    m2 = copy.deepcopy(m1)
    o1 = torch.optim.SGD(m1.parameters(), lr=0.1, momentum=0.9)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
    batches = _batches(6, bad=(2, 3), value=float("nan"))      # a nan loss (an inf input can give a finite one)
    _finite_step(m1, o1, *batches[0])
    _finite_step(m2, o2, *batches[0])
    jstep = thunderlite.jit(_finite_step, executors=executors)
    for x, y in batches[1:]:
        torch.testing.assert_close(jstep(m1, o1, x, y), _finite_step(m2, o2, x, y), equal_nan=True)
        _same_training_state(m1, m2, o1, o2)
    assert thunderlite.cache_info(jstep)["misses"] == 1
    assert "predicated on" in str(thunderlite.examine(_finite_step, m1, o1, *batches[1]))


def _if_else(x, buf, acc):
    if x.sum() > 0:
        buf.add_(x)
        acc.mul_(2)
    else:
        buf.sub_(1)
    if not (x < 5).all():
        acc.zero_()
    return buf * 2 + acc


def test_if_and_else_blocks_writing_inputs():
    jf = thunderlite.jit(_if_else)
    for v in (1.0, -1.0, 7.0, -2.0):
        x = torch.full((3,), v)
        b1, a1 = torch.zeros(3), torch.ones(3)
        b2, a2 = torch.zeros(3), torch.ones(3)
        torch.testing.assert_close(jf(x, b1, a1), _if_else(x, b2, a2))
        torch.testing.assert_close(b1, b2)
        torch.testing.assert_close(a1, a2)
    assert thunderlite.cache_info(jf)["misses"] == 1


def _write_under_grad(w, x):
    h = x * w
    if h.sum() > 0:
        h.mul_(3)       # differentiable write: the gradient follows the branch taken
    return h.sum()


def test_predicated_write_is_differentiated_as_the_branch_taken():
    jf = thunderlite.jit(_write_under_grad)
    for v in (1.0, -1.0):
        w1 = torch.full((3,), 0.5, requires_grad=True)
        w2 = w1.detach().clone().requires_grad_()
        x = torch.full((3,), v)
        jf(w1, x).backward()
        _write_under_grad(w2, x).backward()
        torch.testing.assert_close(w1.grad, w2.grad)


def _local_read_after(x, buf):
    n = 0
    if x.sum() > 0:
        buf.add_(1)
        n = 1
    return buf * n


def _list_made_before(x, buf):
    seen = []
    if x.sum() > 0:
        seen.append(1)      # a Python object older than the block: no flag can undo the append
        buf.add_(1)
    return buf + len(seen)


def _random_inside(x, buf):
    if x.sum() > 0:
        buf.add_(torch.rand(3))
    return buf


@pytest.mark.parametrize("fn, why", [(_local_read_after, "the local 'n'"),
                                     (_list_made_before, "a list made before the block"),
                                     (_random_inside, "draws random numbers")])
def test_blocks_doing_more_than_writing_tensors_read_their_flag(fn, why):
    x, buf = torch.ones(3), torch.zeros(3)
    with pytest.raises(DataDependentError):      # the flag is read, as eager does
        thunderlite.jit(fn, ).__call__(x, buf)
    assert not buf.any()
    report = str(thunderlite.examine(fn, x, torch.zeros(3)))
    assert "not predicated" in report and why in report
