"""The whole training step in one trace (docs/architecture.md §9): ``loss.backward()``,
``torch.autograd.backward`` and ``torch.autograd.grad`` inside the jitted
function, differentiated by thunderlite's autodiff, ``.grad`` of leaves with
eager's semantics, against eager after several steps."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import thunderlite
from thunderlite.tests.whole_step_util import TOL, assert_same_state, jit, run_both, small_model, train_step


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


@pytest.mark.parametrize("exs", [None, "shuffle", ["torchcompile", "torch"]],
                         ids=["default", "shuffle", "torchcompile"])
def test_train_step_matches_eager(exs):
    jstep, model, _, _ = run_both(train_step, _sgd, exs)
    info = thunderlite.cache_info(jstep)
    assert info["misses"] == 2     # the first step creates the momentum buffers
    assert all(p.grad is None for p in model.parameters())


def test_no_autograd_at_run_time():
    """The backward is part of the trace: nothing of PyTorch's autograd runs."""
    model = small_model()
    opt = _sgd(model.parameters())
    jstep = thunderlite.jit(train_step)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    jstep(model, opt, x, y)
    src = str(thunderlite.last_traces(jstep)[-1])
    assert "loss.backward()" in src and "autograd_function" not in src
    assert thunderlite.last_backward_traces(jstep) == []


def test_grad_accumulates_into_existing_grad():
    """No zero_grad: each call's gradient adds into ``.grad`` in place (the same tensor), as eager's."""
    def step(model, opt, x, y):
        F.cross_entropy(model(x), y).backward()
        return model[0].weight.grad.sum()
    jstep, model, _, _ = run_both(step)
    g = model[0].weight.grad
    jstep(model, None, torch.randn(6, 4), torch.randint(0, 3, (6,)))
    assert model[0].weight.grad is g


def test_autograd_backward_with_grad_tensors():
    def step(model, opt, x, y):
        out = model(x)
        torch.autograd.backward([out], [y])
        return out.detach()
    run_both(step, args=(torch.randn(6, 4), torch.randn(6, 3)))


def test_autograd_grad_of_parameter_and_intermediate():
    """``torch.autograd.grad`` returns gradients (also of an intermediate) and leaves ``.grad`` alone."""
    def step(model, opt, x, y):
        h = model[0](x)
        out = model[2](model[1](h))
        gw, gh = torch.autograd.grad((out * y).sum(), [model[2].weight, h])
        return gw, gh
    jstep, model, _, _ = run_both(step, args=(torch.randn(6, 4), torch.randn(6, 3)))
    assert all(p.grad is None for p in model.parameters())


def test_autograd_grad_with_grad_outputs_and_unused():
    def step(model, opt, x, y):
        out = model(x)
        (gx, gb) = torch.autograd.grad([out], [x, model[0].bias], grad_outputs=[y], retain_graph=True)
        (none,) = torch.autograd.grad(out.sum(), [model[2].weight * 1], allow_unused=True)
        return gx, gb, none
    x = torch.randn(6, 4, requires_grad=True)
    run_both(step, args=(x, torch.randn(6, 3)))

    def unused(model, opt, x, y):
        return torch.autograd.grad(model(x).sum(), [x, y])
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        thunderlite.jit(unused)(small_model(), None, x, torch.randn(3, requires_grad=True))


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_input_requiring_grad_gets_grad_and_non_leaf_grad_is_none():
    def step(model, opt, x, y):
        h = model(x)
        loss = (h * y).sum()
        loss.backward()
        return h.grad is None, x.grad * 2
    x = torch.randn(6, 4, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    model, ref = small_model(), small_model()
    got = thunderlite.jit(step)(model, None, x, torch.ones(6, 3))
    want = step(ref, None, x2, torch.ones(6, 3))
    assert got[0] is True and want[0] is True
    torch.testing.assert_close(got[1], want[1], **TOL)
    torch.testing.assert_close(x.grad, x2.grad, **TOL)
    assert_same_state(model, ref)


def test_non_leaf_input_is_refused_clearly():
    def step(x):
        x.sum().backward()
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"not a leaf.*x\.sum\(\)\.backward\(\)"):
        thunderlite.jit(step)(w * 2)


def test_second_backward_without_retain_graph_is_eagers_error():
    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        loss.backward()
    args = (small_model(), None, torch.randn(6, 4), torch.randint(0, 3, (6,)))
    with pytest.raises(RuntimeError, match=r"backward through the graph a second time"):
        step(*copy.deepcopy(args))
    with pytest.raises(RuntimeError, match=r"backward through the graph a second time.*loss\.backward\(\)"):
        thunderlite.jit(step)(*args)


def test_retain_graph_backward_twice():
    def step(model, opt, x, y):
        h = model[1](model[0](x))
        loss = F.cross_entropy(model[2](h), y)
        loss.backward(retain_graph=True)
        loss.backward()
        (h.sum() * 0.5).backward()        # shares the first layers with the retained graph: freed now
    with pytest.raises(RuntimeError, match="a second time"):
        thunderlite.jit(step)(small_model(), None, torch.randn(6, 4), torch.randint(0, 3, (6,)))

    def step2(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward(retain_graph=True)
        (loss * 2).backward()
        return loss.detach()
    run_both(step2)


def test_backward_inputs_restricts_accumulation():
    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward(inputs=[model[2].weight, model[0].bias])
        return loss.detach()
    _, model, _, _ = run_both(step)
    assert model[0].weight.grad is None and model[0].bias.grad is not None


def test_create_graph_leaves_grads_with_a_graph_as_eager():
    """``backward(create_graph=True)`` as the last backward: each ``.grad`` is
    eager's value and, as in eager, requires grad (accumulated out of place
    across calls); differentiating it outside raises, naming the cause (the
    program keeps no graph after the call)."""
    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward(create_graph=True)
        return loss.detach()
    _, model, _, _ = run_both(step)
    assert all(p.grad.requires_grad for p in model.parameters())
    with pytest.raises(NotImplementedError, match="keeps no autograd graph"):
        model[0].weight.grad.sum().backward()


def test_post_accumulate_grad_hooks_run_traced():
    """An optimizer step in a post-accumulate hook (the "optimizer in backward" pattern)."""
    def make(model):
        opts = {p: torch.optim.SGD([p], lr=0.1) for p in model.parameters()}

        def hook(p):
            opts[p].step()
            opts[p].zero_grad()
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(hook)

    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()
    model = small_model()
    ref = copy.deepcopy(model)
    make(model)
    make(ref)
    jstep = thunderlite.jit(step)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    for _ in range(3):
        torch.testing.assert_close(jstep(model, None, x, y), step(ref, None, x, y), **TOL)
        assert_same_state(model, ref)
    assert all(p.grad is None for p in model.parameters())


def test_grad_assignment_and_zero_grad():
    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        model[0].weight.grad = torch.ones_like(model[0].weight)
        model[0].bias.grad = None
        out = model[2].weight.grad.clone()
        model.zero_grad(set_to_none=False)
        return out
    run_both(step)


def test_zero_grad_in_place_keeps_the_grad_tensors():
    def step(model, opt, x, y):
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    jstep, model, _, _ = run_both(step, _sgd, steps=4)
    g = model[0].weight.grad
    jstep(model, _sgd(model.parameters()), torch.randn(6, 4), torch.randint(0, 3, (6,)))
    assert model[0].weight.grad is g


def test_returned_loss_requiring_grad_behaves_like_eager():
    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss
    model = small_model()
    ref = copy.deepcopy(model)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    got, want = thunderlite.jit(step)(model, None, x, y), step(ref, None, x, y)
    torch.testing.assert_close(got, want)
    assert got.requires_grad and want.requires_grad
    assert_same_state(model, ref)
    for t in (got, want):
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            t.backward()


def test_micro_batch_accumulation_in_a_loop():
    def step(model, opt, x, y):
        total = 0.0
        for i in range(3):
            loss = F.cross_entropy(model(x[2 * i:2 * i + 2]), y[2 * i:2 * i + 2]) / 3
            loss.backward()
            total = total + loss.detach()
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.05)
        opt.step()
        opt.zero_grad()
        return total
    run_both(step, lambda ps: torch.optim.AdamW(ps, lr=0.01))


def test_module_method_with_backward():
    class Trainer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = small_model()

        def training_step(self, x, y):
            loss = F.cross_entropy(self.net(x), y)
            loss.backward()
            with torch.no_grad():
                for p in self.parameters():
                    p.sub_(0.1 * p.grad)
                    p.grad = None
            return loss.detach()
    t, ref = Trainer(), None
    ref = copy.deepcopy(t)
    jstep = thunderlite.jit(t.training_step)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    for _ in range(3):
        torch.testing.assert_close(jstep(x, y), ref.training_step(x, y), **TOL)
        assert_same_state(t, ref)


def test_jit_of_the_model_still_uses_the_autograd_bridge():
    """A jitted forward keeps PyTorch's autograd for a backward outside (unchanged)."""
    model = small_model()
    ref = copy.deepcopy(model)
    x = torch.randn(6, 4)
    jit(model, None)(x).sum().backward()
    ref(x).sum().backward()
    assert_same_state(model, ref)


def test_updates_follow_their_gradients_and_the_report_shows_where_they_die(tmp_path):
    """``schedule_updates``: without clipping, each update runs inside the backward, right
    after its gradient, which is freed there (``zero_grad(set_to_none=True)``: nothing
    outside sees it); the trace report lists each gradient's death."""
    from thunderlite.report import trace_report
    from thunderlite.report.memory import deaths

    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    jstep, _, _, _ = run_both(step, lambda ps: torch.optim.SGD(ps, lr=0.1))
    final = thunderlite.last_traces(jstep)[-1]
    assert "schedule_updates" in [t.stage for t in thunderlite.last_traces(jstep)]
    names = [b.sym.name for b in final.bound_symbols]
    first_update = names.index("add_")
    last_matmul = max(i for i, n in enumerate(names) if n == "matmul")
    assert first_update < last_matmul            # an update runs before the backward ends
    grads = thunderlite.last_gradients(jstep)
    died = deaths(final, grads)
    assert len(died) == 4 and all(i < len(final.bound_symbols) - 1 for _, _, i in died)
    assert {d[0] for d in died} == {f"argument 0.{n}" for n in ("0.weight", "0.bias", "2.weight", "2.bias")}
    html = open(trace_report(jstep, tmp_path / "r.html")).read()
    assert "grad_deaths" in html and "argument 0.2.weight" in html


def test_leaf_made_inside_the_function_gets_its_grad():
    """A factory's ``requires_grad=True`` makes a leaf whose ``.grad`` the program reads (it was refused)."""
    def step(x):
        w = torch.ones(4, requires_grad=True)
        (w * x).sum().backward()
        return w.grad
    x = torch.randn(4)
    torch.testing.assert_close(thunderlite.jit(step)(x), step(x))


def test_batch_norm_running_statistics_in_the_step():
    """The forward's own writes (running statistics, off the gradient path) stay in the step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    run_both(train_step, _sgd, model=model)


def test_in_place_write_on_the_gradient_path_before_backward():
    """The recorded symbols get their own alias barriers before they are
    differentiated (as a torch.func sub-trace does): the backward reads the
    written value, and so does the program afterwards."""
    def step(w, x):
        y = x @ w
        y.mul_(2)
        y.add_(x.sum(1, keepdim=True))
        y.pow(2).sum().backward()
        return w.grad.clone(), y.detach() * 3
    w, x = torch.randn(3, 2), torch.randn(4, 3)
    ew, jw = w.clone().requires_grad_(), w.clone().requires_grad_()
    for e, g in zip(step(ew, x), thunderlite.jit(step)(jw, x), strict=True):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(jw.grad, ew.grad)


def test_retained_graph_with_an_in_place_write_and_grad_of_the_written_tensor():
    def step(w, x):
        y = x @ w
        y.mul_(2)
        loss = y.pow(2).sum()
        g, = torch.autograd.grad(loss, y, retain_graph=True)     # the written tensor's gradient
        loss.backward()
        return w.grad.clone(), g, y.detach() + 0
    w, x = torch.randn(3, 2), torch.randn(4, 3)
    ew, jw = w.clone().requires_grad_(), w.clone().requires_grad_()
    for e, g in zip(step(ew, x), thunderlite.jit(step)(jw, x), strict=True):
        torch.testing.assert_close(g, e)


def test_write_into_a_view_on_the_gradient_path_before_backward_is_refused_with_its_line():
    def step(w, x):
        y = x @ w
        y[:, 0].mul_(2)
        y.pow(2).sum().backward()
        return w.grad, y.detach()
    with pytest.raises(NotImplementedError, match=r"rewrites functionally.*y\[:, 0\]\.mul_\(2\).*backward\(\)"):
        thunderlite.jit(step)(torch.randn(3, 2, requires_grad=True), torch.randn(4, 3))

    def no_grad_write(w, x):
        y = x @ w
        with torch.no_grad():
            y.mul_(2)
        y.pow(2).sum().backward()
        return w.grad
    with pytest.raises(NotImplementedError, match=r"rewrites functionally.*y\.mul_\(2\)"):
        thunderlite.jit(no_grad_write)(torch.randn(3, 2, requires_grad=True), torch.randn(4, 3))


def test_a_big_library_cache_written_while_tracing_is_not_refused():
    """``opt.zero_grad`` adds to dynamo's ``cached_backends``, a torch global
    every ``torch.compile`` in the process grows: past the size thunderlite copies,
    it was refused as a change to the program's state (and its length guarded).
    A library's own bookkeeping is not the program's state."""
    from torch._dynamo import eval_frame

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    ref = copy.deepcopy(model)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref))

    def step(model, opt, x):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    filler = {-i: None for i in range(1, 100)}      # ids are never negative
    eval_frame.cached_backends.update(filler)
    try:
        jstep = thunderlite.jit(step)
        misses = []
        for _ in range(4):
            x = torch.randn(5, 4)
            torch.testing.assert_close(jstep(model, opt, x), step(ref, ref_opt, x))
            misses.append(thunderlite.cache_info(jstep)["misses"])
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p, q)
        # the second call meets the momentum buffers the first made; then it stays cached
        assert misses[1:] == [2, 2, 2]
    finally:
        for k in filler:
            eval_frame.cached_backends.pop(k, None)
