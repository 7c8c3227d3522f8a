"""Double backward (docs/architecture.md §9, "Double backward"): gradients of
gradients, against eager over several calls, with the default executors and
``["torchcompile", "torch"]``.

- *Inside* a jitted function: ``torch.autograd.grad(..., create_graph=True)``
  and ``backward(create_graph=True)`` in a whole training step (the outer
  backward and the optimizer step in the same trace): a WGAN-GP gradient
  penalty, a MAML inner step, Hessian-vector products, a PINN's second
  derivatives with respect to its inputs, ``.grad`` read after
  ``backward(create_graph=True)`` and differentiated.
- *Through* a jitted function called from outside: its outputs
  differentiated with ``create_graph=True`` by eager code, and the gradients
  differentiated again (third order for the PINN).

float64 is compared tightly; one float32 case uses eager's tolerance.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunderlite

F64 = torch.float64
TIGHT = dict(rtol=1e-10, atol=1e-12)
EXECUTORS = [None, ["torchcompile", "torch"]]
EX_IDS = ["default", "torchcompile"]


def _jit(fn, exs):
    return thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=exs)


def _mlp(d_in=4, hidden=8, d_out=1, dtype=F64, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, d_out)).to(dtype)


def _same(got, want, tol, where):
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, tol, f"{where}[{i}]")
        return
    if want is None:
        assert got is None, where
        return
    assert got.requires_grad == want.requires_grad, where
    torch.testing.assert_close(got.detach(), want.detach(), **tol, msg=lambda m: f"{where}: {m}")


def _same_state(model, ref, opt, ref_opt, tol):
    for (n, p), r in zip(model.named_parameters(), ref.parameters(), strict=True):
        _same(p, r, tol, n)
        assert (p.grad is None) == (r.grad is None), f"{n}.grad"
        if r.grad is not None:
            _same(p.grad, r.grad, tol, f"{n}.grad")
    for (n, b), r in zip(model.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(b, r, **tol, msg=lambda m, n=n: f"buffer {n}: {m}")
    if opt is not None:
        for p, r in zip(model.parameters(), ref.parameters(), strict=True):
            for k, v in ref_opt.state[r].items():
                torch.testing.assert_close(opt.state[p][k], v, **tol)


def _run_steps(step, make, data, exs, calls=3, tol=TIGHT):
    """``step(model, opt, *data(i))`` jitted and eager, ``calls`` times: results and state equal."""
    model, make_opt = make()
    ref = copy.deepcopy(model)
    opt = make_opt(model.parameters()) if make_opt else None
    ref_opt = make_opt(ref.parameters()) if make_opt else None
    jstep = _jit(step, exs)
    for i in range(calls):
        args = data(i)
        got = jstep(model, opt, *args)
        want = step(ref, ref_opt, *args)
        _same(got, want, tol, f"call {i}")
        _same_state(model, ref, opt, ref_opt, tol)
    return jstep


def _gen(i):
    return torch.Generator().manual_seed(100 + i)


def _sgd(momentum=0.9):
    return lambda params: torch.optim.SGD(params, lr=0.05, momentum=momentum)


# --- programs: each a whole step, written as people write them ------------------------------------

def wgan_gp_step(critic, opt, real, fake, eps):
    xhat = (eps * real + (1 - eps) * fake).requires_grad_()
    g = torch.autograd.grad(critic(xhat).sum(), xhat, create_graph=True)[0]
    penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach(), penalty.detach()


def _gp_data(i, dtype=F64):
    g = _gen(i)
    return (torch.randn(6, 4, generator=g, dtype=dtype), torch.randn(6, 4, generator=g, dtype=dtype),
            torch.rand(6, 1, generator=g, dtype=dtype))


def maml_step(model, opt, x, y, xq, yq):
    params = dict(model.named_parameters())
    inner = F.mse_loss(torch.func.functional_call(model, params, (x,)), y)
    grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
    fast = {n: p - 0.1 * g for (n, p), g in zip(params.items(), grads, strict=True)}
    outer = F.mse_loss(torch.func.functional_call(model, fast, (xq,)), yq)
    opt.zero_grad()
    outer.backward()
    opt.step()
    return outer.detach()


def _maml_data(i):
    g = _gen(i)
    return tuple(torch.randn(5, d, generator=g, dtype=F64) for d in (4, 1, 4, 1))


def hvp_step(model, opt, x, v):
    params = list(model.parameters())
    loss = model(x).pow(2).mean()
    grads = torch.autograd.grad(loss, params, create_graph=True)
    dot = sum((g * v).sum() for g in grads)
    return torch.autograd.grad(dot, params)


def hvp_input_step(model, opt, x, v):
    x = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(model(x).pow(2).sum(), x, create_graph=True)
    return torch.autograd.grad(g, x, v * torch.ones_like(g))


def _hvp_data(i):
    g = _gen(i)
    return torch.randn(5, 4, generator=g, dtype=F64), torch.randn((), generator=g, dtype=F64)


def pinn_step(model, opt, x):
    """u'' + sin(x) = 0 with u(0) = 0: the residual needs u_xx of the MLP."""
    x = x.clone().requires_grad_()
    u = model(x)
    (u_x,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    (u_xx,) = torch.autograd.grad(u_x.sum(), x, create_graph=True)
    boundary = model(torch.zeros(1, 1, dtype=x.dtype))
    loss = ((u_xx + torch.sin(x)) ** 2).mean() + boundary.pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach(), u_xx.detach()


def grad_norm_step(model, opt, x, y):
    """backward(create_graph=True), then the gradients' norm read from ``.grad`` and
    differentiated: accumulated into the same ``.grad`` in place, as in eager."""
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward(create_graph=True)
    norm = sum(p.grad.pow(2).sum() for p in model.parameters())
    norm.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach(), norm.detach()


def grad_norm_penalty_step(model, opt, x, y):
    """The ``.grad`` left by backward(create_graph=True) used in a penalty, then reset."""
    loss = F.mse_loss(model(x), y)
    loss.backward(create_graph=True)
    penalty = sum(p.grad.pow(2).sum() for p in model.parameters())
    for p in model.parameters():
        p.grad = None
    (loss + 0.1 * penalty).backward()
    opt.step()
    opt.zero_grad()
    return penalty.detach()


def _xy(i):
    g = _gen(i)
    return torch.randn(6, 4, generator=g, dtype=F64), torch.randn(6, 1, generator=g, dtype=F64)


# --- inside the jitted function -------------------------------------------------------------------

@pytest.mark.parametrize("exs", EXECUTORS, ids=EX_IDS)
def test_wgan_gp_step(exs):
    _run_steps(wgan_gp_step, lambda: (_mlp(), _sgd()), _gp_data, exs)


def test_mismatched_grad_outputs_raise_eagers_error():
    def step(model, opt, x, v):
        x = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(model(x).pow(2).sum(), x, create_graph=True)
        return torch.autograd.grad(g, x, v)
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of torch.Size\(\[\]\)"):
        step(_mlp(), None, *_hvp_data(0))
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of torch.Size\(\[\]\)"):
        thunderlite.jit(step)(_mlp(), None, *_hvp_data(0))


@pytest.mark.parametrize("exs", EXECUTORS, ids=EX_IDS)
def test_maml_inner_step(exs):
    _run_steps(maml_step, lambda: (_mlp(), _sgd()), _maml_data, exs)


@pytest.mark.parametrize("exs", EXECUTORS, ids=EX_IDS)
@pytest.mark.parametrize("step", [hvp_step, hvp_input_step], ids=["params", "input"])
def test_hessian_vector_product(step, exs):
    _run_steps(step, lambda: (_mlp(), None), _hvp_data, exs)


@pytest.mark.parametrize("exs", EXECUTORS, ids=EX_IDS)
def test_pinn_second_derivative(exs):
    _run_steps(pinn_step, lambda: (_mlp(1, 16, 1), _sgd(0.0)),
               lambda i: (torch.linspace(-2, 2, 9, dtype=F64).unsqueeze(1) + 0.1 * i,), exs)


@pytest.mark.parametrize("exs", EXECUTORS, ids=EX_IDS)
@pytest.mark.parametrize("step", [grad_norm_step, grad_norm_penalty_step], ids=["accumulated", "reset"])
def test_grad_read_after_create_graph(step, exs):
    _run_steps(step, lambda: (_mlp(), _sgd()), _xy, exs)


def test_wgan_gp_step_float32_within_eagers_tolerance():
    _run_steps(wgan_gp_step, lambda: (_mlp(dtype=torch.float32), _sgd()),
               lambda i: _gp_data(i, torch.float32), None, tol=dict(rtol=1.3e-6, atol=1e-5))


def test_penalty_through_norms_softmax_and_attention():
    """Fused kernels (layer_norm, softmax, attention, cross_entropy) in a
    differentiable backward: differentiated through their decompositions."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.qkv = nn.Linear(8, 24)
            self.out = nn.Linear(8, 3)

        def forward(self, x):
            q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(F.gelu(a)).mean(1)

    def step(model, opt, x, y):
        x = x.clone().requires_grad_()
        logits = model(x)
        (gx,) = torch.autograd.grad(logits.logsumexp(-1).sum(), x, create_graph=True)
        loss = F.cross_entropy(logits, y) + gx.pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    def make():
        torch.manual_seed(0)
        return Block().to(F64), _sgd()
    _run_steps(step, make, lambda i: (torch.randn(2, 5, 8, generator=_gen(i), dtype=F64),
                                      torch.randint(0, 3, (2,), generator=_gen(i))), None)


def test_penalty_on_a_batchnorm_conv_critic():
    """A DCGAN-style critic (conv, BatchNorm in training mode, LeakyReLU) called
    on three batches in one step: batch_norm's kernel differentiated again by
    PyTorch's double backward; running statistics as eager's."""
    def step(critic, opt, real, fake, eps):
        xhat = (eps * real + (1 - eps) * fake).requires_grad_()
        (g,) = torch.autograd.grad(critic(xhat).sum(), xhat, create_graph=True)
        penalty = ((g.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
        loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.LeakyReLU(0.2), nn.Flatten(),
                             nn.Linear(4 * 4 * 4, 1)).to(F64), _sgd()

    def data(i):
        g = _gen(i)
        return (torch.randn(3, 2, 6, 6, generator=g, dtype=F64), torch.randn(3, 2, 6, 6, generator=g, dtype=F64),
                torch.rand(3, 1, 1, 1, generator=g, dtype=F64))
    _run_steps(step, make, data, None)


def _opaque_program(x, w):
    # i0 and matrix_exp are opaque ops: recorded as one torch call each
    return torch.i0(x @ w).pow(2).sum() + (torch.linalg.matrix_exp(w) * (x.T @ x)).sum()


def test_opaque_ops_differentiated_to_third_order_inside():
    def step(x, w):
        x = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(_opaque_program(x, w), x, create_graph=True)
        (gw,) = torch.autograd.grad(g.pow(2).sum(), w, create_graph=True)
        return gw, torch.autograd.grad(gw.sum(), w)[0]
    torch.manual_seed(0)
    x, w = torch.randn(5, 3, dtype=F64), torch.randn(3, 3, dtype=F64, requires_grad=True)
    jstep = thunderlite.jit(step)
    for _ in range(2):
        _same(jstep(x, w), step(x, w), TIGHT, "gradients")
    assert any("i0" in b.sym.name for b in thunderlite.last_traces(jstep)[0].bound_symbols)


def test_opaque_ops_differentiated_to_third_order_through():
    jf = thunderlite.jit(_opaque_program)
    torch.manual_seed(0)
    x, w = torch.randn(5, 3, dtype=F64), torch.randn(3, 3, dtype=F64, requires_grad=True)
    results = []
    for fn in (_opaque_program, jf):
        xx = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(fn(xx, w), xx, create_graph=True)
        (gw,) = torch.autograd.grad(g.pow(2).sum(), w, create_graph=True)
        results.append((gw, torch.autograd.grad(gw.sum(), xx)[0]))
    _same([r.detach() for r in results[1]], [r.detach() for r in results[0]], TIGHT, "gradients")


def test_third_order_through_convolution_backward():
    """convolution_backward's rule (PyTorch's double backward) is itself differentiable."""
    torch.manual_seed(0)
    x = torch.randn(2, 1, 6, dtype=F64)
    w = torch.randn(3, 1, 3, dtype=F64, requires_grad=True)

    def f(x, w):
        return torch.tanh(F.conv1d(x, w)).sum()
    jf = thunderlite.jit(f)
    results = []
    for fn in (f, jf):
        xx = x.clone().requires_grad_()
        (gx,) = torch.autograd.grad(fn(xx, w), xx, create_graph=True)
        (gw,) = torch.autograd.grad(gx.pow(2).sum(), w, create_graph=True)
        results.append(torch.autograd.grad(gw.pow(2).sum(), [xx, w]))
    _same(results[1], results[0], TIGHT, "third order")


# --- through a jitted function called from outside -----------------------------------------------

def _outside(program, exs, make=_mlp, calls=3, tol=TIGHT):
    """``program(model)`` with the eager model and with the jitted copy: results and ``.grad`` equal."""
    model = make()
    ref = copy.deepcopy(model)
    jmodel = _jit(model, exs)
    for i in range(calls):
        torch.manual_seed(10 + i)
        want = program(ref, i)
        torch.manual_seed(10 + i)
        got = program(jmodel, i)
        _same(got, want, tol, f"call {i}")
        for (n, p), r in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert (p.grad is None) == (r.grad is None), f"{n}.grad"
            if r.grad is not None:
                _same(p.grad, r.grad, tol, f"{n}.grad")
    return jmodel


def _gp_outside(critic, i):
    real, fake, eps = _gp_data(i)
    xhat = (eps * real + (1 - eps) * fake).requires_grad_()
    (g,) = torch.autograd.grad(critic(xhat).sum(), xhat, create_graph=True)
    loss = critic(fake).mean() - critic(real).mean() + 10 * ((g.norm(2, dim=1) - 1) ** 2).mean()
    loss.backward()
    return loss.detach(), g.detach()


def _maml_outside(model, i):
    x, y, xq, yq = _maml_data(i)
    params = list(model.parameters())
    for p in params:
        p.grad = None
    inner = F.mse_loss(model(x), y)
    grads = torch.autograd.grad(inner, params, create_graph=True)
    w1, b1, w2, b2 = (p - 0.1 * g for p, g in zip(params, grads, strict=True))
    outer = F.mse_loss(F.linear(torch.tanh(F.linear(xq, w1, b1)), w2, b2), yq)
    outer.backward()
    return outer.detach()


def _hvp_outside(model, i):
    x, v = _hvp_data(i)
    params = list(model.parameters())
    grads = torch.autograd.grad(model(x).pow(2).mean(), params, create_graph=True)
    return torch.autograd.grad(grads, params, [torch.full_like(g, float(v)) for g in grads])


def _pinn_outside(model, i):
    """Third order through the jitted function: u_xx's graph is differentiated by the loss."""
    x = (torch.linspace(-2, 2, 9, dtype=F64).unsqueeze(1) + 0.1 * i).requires_grad_()
    u = model(x)
    (u_x,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    (u_xx,) = torch.autograd.grad(u_x.sum(), x, create_graph=True)
    loss = ((u_xx + torch.sin(x)) ** 2).mean()
    for p in model.parameters():
        p.grad = None
    loss.backward()
    return loss.detach(), u_xx.detach(), x.grad


def _grad_norm_outside(model, i):
    x, y = _xy(i)
    for p in model.parameters():
        p.grad = None
    F.mse_loss(model(x), y).backward(create_graph=True)
    norm = sum(p.grad.pow(2).sum() for p in model.parameters())
    for p in model.parameters():
        p.grad = None
    norm.backward()
    return norm.detach()


@pytest.mark.parametrize("exs", EXECUTORS, ids=EX_IDS)
@pytest.mark.parametrize("program", [_gp_outside, _maml_outside, _hvp_outside, _pinn_outside, _grad_norm_outside],
                         ids=["wgan_gp", "maml", "hvp", "pinn_third_order", "grad_norm"])
def test_through_a_jitted_module(program, exs):
    make = (lambda: _mlp(1, 16, 1)) if program is _pinn_outside else _mlp
    _outside(program, exs, make)


def test_through_a_jitted_function_of_several_outputs():
    """Two outputs, the first gradient taken of one only (the other's
    cotangent is zeros, as the first-order backward takes it), the second
    backward through both."""
    def f(x, w):
        h = torch.tanh(x @ w)
        return h.sum(), (h * h).mean(0)
    jf = thunderlite.jit(f)
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    w = torch.randn(3, 3, dtype=F64, requires_grad=True)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    for fn, a, b in ((f, x, w), (jf, x2, w2)):
        s, m = fn(a, b)
        (gx,) = torch.autograd.grad(s, a, create_graph=True)
        (gx.pow(3).sum() + m.sum()).backward()
    _same(x2.grad, x.grad, TIGHT, "x.grad")
    _same(w2.grad, w.grad, TIGHT, "w.grad")


def test_first_order_backward_after_create_graph_reuses_the_graph():
    """create_graph keeps the graph (as eager's retain_graph default): a
    first-order backward through the same outputs afterwards works, a third raises."""
    model = _mlp()
    jmodel = thunderlite.jit(copy.deepcopy(model))
    x = torch.randn(5, 4, dtype=F64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    for m, a in ((model, x), (jmodel, x2)):
        out = m(a).sum()
        (g,) = torch.autograd.grad(out, a, create_graph=True)
        (out + g.sum()).backward()
    _same(x2.grad, x.grad, TIGHT, "x.grad")
    with pytest.raises(RuntimeError, match="second time"):
        out.backward()


# --- refusals, named ------------------------------------------------------------------------------

def test_refused_through_a_function_drawing_random_numbers():
    jf = thunderlite.jit(lambda x: F.dropout(torch.tanh(x), 0.5).sum())
    x = torch.randn(4, dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(jf(x), x)           # first order: as before
    assert g.shape == x.shape
    with pytest.raises(NotImplementedError, match="random numbers.*dropout"):
        torch.autograd.grad(jf(x), x, create_graph=True)


def test_refused_through_a_function_writing_its_input():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Tanh()).to(F64)
    jmodel = thunderlite.jit(model)
    x = torch.randn(6, 4, dtype=F64, requires_grad=True)
    with pytest.raises(NotImplementedError, match="writes an input"):
        torch.autograd.grad(jmodel(x).sum(), x, create_graph=True)


def test_argument_written_after_the_call_raises_eagers_error():
    """The double backward recomputes from the arguments: one written since the
    call (and not saved, so eager's own check does not see it) raises."""
    jf = thunderlite.jit(lambda x, b: torch.tanh(x + b).sum())
    x = torch.randn(4, dtype=F64, requires_grad=True)
    b = torch.randn(4, dtype=F64)
    out = jf(x, b)
    b.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, x, create_graph=True)


def test_retained_graph_reuses_the_draws_of_its_forward():
    """A second backward through a graph kept with ``retain_graph=True`` reads
    the dropout mask (and layer_norm's statistics) the forward made, not a
    recomputation: a redraw would differentiate another function."""
    def step(model, opt, x):
        loss = model(x).pow(2).sum()
        loss.backward(retain_graph=True)
        (2 * loss).backward()
        return loss.detach()

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Dropout(0.5), nn.Tanh(),
                             nn.Linear(8, 1)).to(F64), None
    model, _ = make()
    ref = copy.deepcopy(model)
    jstep = thunderlite.jit(step)
    for i in range(2):
        x = torch.randn(6, 4, generator=_gen(i), dtype=F64)
        torch.manual_seed(3 + i)
        got = jstep(model, None, x)
        torch.manual_seed(3 + i)
        want = step(ref, None, x)
        _same(got, want, TIGHT, f"call {i}")
        _same_state(model, ref, None, None, TIGHT)
    trace = str(thunderlite.last_traces(jstep)[-1])
    assert trace.count("native_dropout(") == 1, trace


@pytest.mark.parametrize("exs", EXECUTORS, ids=EX_IDS)
def test_maml_through_a_jitted_functional_model(exs):
    """The jitted function called at the parameters and again at the fast
    weights (non-leaf inputs whose graph runs through its own double backward)."""
    def f(x, w1, b1, w2, b2):
        return F.linear(torch.tanh(F.linear(x, w1, b1)), w2, b2)
    jf = _jit(f, exs)
    model = _mlp()
    params = [p.detach().clone().requires_grad_() for p in model.parameters()]
    ref = [p.detach().clone().requires_grad_() for p in model.parameters()]
    for i in range(3):
        x, y, xq, yq = _maml_data(i)
        for fn, ps in ((f, ref), (jf, params)):
            inner = F.mse_loss(fn(x, *ps), y)
            grads = torch.autograd.grad(inner, ps, create_graph=True)
            outer = F.mse_loss(fn(xq, *(p - 0.1 * g for p, g in zip(ps, grads, strict=True))), yq)
            outer.backward()
            with torch.no_grad():
                for p in ps:
                    p -= 0.05 * p.grad
                    p.grad = None
        _same(params, ref, TIGHT, f"call {i}")
