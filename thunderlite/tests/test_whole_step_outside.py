"""Training steps written the way PyTorch users write them, each checked against
eager PyTorch (docs/architecture.md §9, "Backward inside the trace"): the same
program is built twice from the same seed, one copy jitted, and after every call
the returned values, parameters, ``.grad``, buffers, ``training`` flags,
optimizer and LR-scheduler ``state_dict``s and the arguments (values, shapes,
strides) must equal eager's within 1e-5, with the default executors and with
torchcompile (a representative set; ``THUNDERLITE_OUTSIDE_ALL=1``: every
program), and a set through ThunderFX. These programs were written without
looking at the other whole-step tests' shapes; a refusal is asserted only
where the feature refuses on purpose (said at the test). A program whose
docstring says "Regression" failed before the fix its commit made."""
from __future__ import annotations

import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, grad_and_value, hessian, jacfwd, jacrev, jvp, vjp, vmap
from torch.utils.checkpoint import checkpoint

import thunderlite
from thunderlite.core.proxies import DataDependentError
from thunderlite.tests.whole_step_util import TOL

CASES: dict = {}


def case(fn):
    """``fn() -> (step, objects, calls)``: ``step(*objects, *call)`` for each call in ``calls``
    (a callable in ``calls`` is run on the objects between two calls, on both copies)."""
    CASES[fn.__name__] = fn
    return fn


def _same(got, want, where: str, strides: bool = True) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert got.shape == want.shape, where
        assert not strides or got.stride() == want.stride(), where
        assert got.requires_grad == want.requires_grad, where
        torch.testing.assert_close(got.detach(), want.detach(), **TOL, msg=lambda m: f"{where}: {m}")
        assert (got.grad is None) == (want.grad is None), f"{where}.grad"
        if want.grad is not None and want.is_leaf:
            _same(got.grad, want.grad, f"{where}.grad")
    elif isinstance(want, nn.Module):
        assert got.training == want.training, where
        for (n, p), (_, r) in zip(got.named_parameters(), want.named_parameters(), strict=True):
            _same(p, r, f"{where}.{n}")
        for (n, b), (_, r) in zip(got.named_buffers(), want.named_buffers(), strict=True):
            _same(b, r, f"{where}.{n}")
        for g, w in zip(got.modules(), want.modules(), strict=True):
            assert g.training == w.training, where
    elif isinstance(want, torch.optim.Optimizer):
        sg, sw = got.state_dict(), want.state_dict()
        for g in sg["param_groups"] + sw["param_groups"]:
            g.pop("capturable", None)
        _same(sg, sw, f"{where}.state_dict()")
    elif isinstance(want, torch.optim.lr_scheduler.LRScheduler):
        _same(got.state_dict(), want.state_dict(), f"{where}.state_dict()")
    elif isinstance(want, dict):
        assert sorted(got, key=str) == sorted(want, key=str), where
        for k in want:
            _same(got[k], want[k], f"{where}[{k!r}]", strides)
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]", strides)
    elif isinstance(want, float):
        assert isinstance(got, float) and math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-5), (where, got, want)
    else:
        assert got == want, (where, got, want)


EXECUTORS = {"default": None, "torchcompile": ["torchcompile", "torch"]}


def _check(name: str, executors: str) -> None:
    torch.manual_seed(0)
    step, objs, calls = CASES[name]()
    torch.manual_seed(0)
    _, ref_objs, _ = CASES[name]()
    if executors == "thunderfx":
        jstep = torch.compile(step, backend="thunderlite")
    else:
        jstep = thunderlite.jit(step, executors=EXECUTORS[executors])
    for i, call in enumerate(calls):
        if callable(call):          # a change made by the caller between two calls
            call(*objs)
            call(*ref_objs)
            continue
        args, ref_args = copy.deepcopy(call), copy.deepcopy(call)
        got = jstep(*objs, *args)
        want = step(*ref_objs, *ref_args)
        _same(got, want, f"call {i}: result", strides=False)
        _same(list(objs), list(ref_objs), f"call {i}: objects")
        _same(list(args), list(ref_args), f"call {i}: arguments")


def _data(n=6, d=4, k=3, calls=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, d, generator=g), torch.randint(0, k, (n,), generator=g)) for _ in range(calls)]


def _mlp(d=4, h=8, k=3):
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, k))


# --- models with optimizers and schedulers ------------------------------------------------------

@case
def cnn_batchnorm_sgd_momentum_steplr():
    model = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(3 * 4 * 4, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    def step(model, opt, sched, x, y):
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        return loss.item()
    g = torch.Generator().manual_seed(2)
    calls = [(torch.randn(4, 1, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)) for _ in range(3)]
    return step, (model, opt, sched), calls


class TinyLM(nn.Module):
    def __init__(self, vocab=11, d=8, tie=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(self.norm(self.emb(idx)))


def _lm_calls(vocab=11, calls=3):
    g = torch.Generator().manual_seed(3)
    return [(torch.randint(0, vocab, (2, 5), generator=g), torch.randint(0, vocab, (2, 5), generator=g))
            for _ in range(calls)]


def _lm_step(model, opt, sched, idx, tgt):
    logits = model(idx)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()
    return loss.detach()


@case
def lm_adamw_cosine():
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5)
    return _lm_step, (model, opt, sched), _lm_calls()


@case
def lm_adamw_onecycle():
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10)
    return _lm_step, (model, opt, sched), _lm_calls()


@case
def lm_sgd_nesterov_lambdalr():
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.8, nesterov=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.9 ** epoch)
    return _lm_step, (model, opt, sched), _lm_calls()


@case
def lm_adam_linear_then_exponential():
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2)
    decay = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, decay], milestones=[2])
    return _lm_step, (model, opt, sched), _lm_calls(calls=4)


@case
def lm_tied_weights_adamw():
    model = TinyLM(tie=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95), eps=1e-6)
    sched = torch.optim.lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2)
    return _lm_step, (model, opt, sched), _lm_calls()


@case
def frozen_layer_and_param_groups():
    model = _mlp()
    model[0].weight.requires_grad_(False)
    opt = torch.optim.Adam([
        {"params": [model[0].bias], "lr": 0.05, "weight_decay": 0.01},
        {"params": model[2].parameters()},
    ], lr=1e-2)

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach(), model[0].weight.grad is None
    return step, (model, opt), _data()


@case
def add_param_group_later():
    model = _mlp()
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    opt.add_param_group({"params": model[2].parameters(), "lr": 0.01, "momentum": 0.5})

    def step(model, opt, x, y):
        loss = F.mse_loss(model(x), F.one_hot(y, 3).float())
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        return loss.detach()
    return step, (model, opt), _data()


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


@case
def eval_then_train_inside():
    model = BNNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        model.eval()
        with torch.no_grad():
            val = F.cross_entropy(model(x[:2]), y[:2])
        model.train()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return val, loss.detach()
    return step, (model, opt), _data()


@case
def grad_accumulation_micro_batches():
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(model, opt, x, y):
        accum = 3
        total = 0.0
        for xb, yb in zip(x.chunk(accum), y.chunk(accum), strict=True):
            loss = F.cross_entropy(model(xb), yb) / accum
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        return total
    return step, (model, opt), _data()


@case
def clip_norm_returned():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, dampening=0.1)

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.3)
        opt.step()
        return loss.detach(), norm
    return step, (model, opt), _data()


@case
def clip_value_and_inf_norm():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)

    def step(model, opt, x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        nn.utils.clip_grad_value_(model.parameters(), clip_value=0.05)
        n = nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type=float("inf"))
        opt.step()
        return n
    return step, (model, opt), _data()


@case
def autograd_grad_then_backward():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        params = list(model.parameters())
        grads = torch.autograd.grad(loss, params, retain_graph=True)
        gnorm = torch.sqrt(sum((g ** 2).sum() for g in grads))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return gnorm
    return step, (model, opt), _data()


@case
def input_requires_grad_returns_x_grad():
    """Regression: ``x.requires_grad_()`` on an input, then a backward, was refused."""
    model = _mlp()

    def step(model, x, y):
        x.requires_grad_()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return x.grad, loss.detach()
    return step, (model,), _data()


@case
def hooks_scale_and_clamp_intermediates():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        h = model[0](x)
        h.register_hook(lambda g: g * 0.5)
        a = model[1](h)
        a.register_hook(lambda g: g.clamp(-0.01, 0.01))
        loss = F.cross_entropy(model[2](a), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return step, (model, opt), _data()


@case
def hooks_on_parameters_before_and_inside():
    """Regression: tensor hooks on the leaves (registered on the caller's
    tensors before the call, or inside it) were ignored by the backward inside
    the function (a silent wrong gradient)."""
    model = _mlp()
    model[0].weight.register_hook(lambda g: g.clamp(-0.05, 0.05))
    seen = []
    model[2].bias.register_hook(lambda g: seen.append(1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        model[2].weight.register_hook(lambda g: g * 0.5)      # one more each call, as in eager
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        (gw,) = torch.autograd.grad(model(x).sum(), [model[0].weight])
        opt.step()
        return gw
    return step, (model, opt), _data()


@case
def retain_grad_on_logits():
    """Regression: ``retain_grad()`` with a backward inside the function was refused."""
    model = _mlp()

    def step(model, x, y):
        model.zero_grad()
        logits = model(x)
        logits.retain_grad()
        F.cross_entropy(logits, y).backward()
        return logits.grad
    return step, (model,), _data()


@case
def retain_grad_accumulates_over_two_backwards():
    model = _mlp()

    def step(model, x, y):
        h = model[0](x)
        h.retain_grad()
        unused = model[2].weight * 2
        unused.retain_grad()
        out = model[2](model[1](h))
        F.cross_entropy(out, y).backward(retain_graph=True)
        first = h.grad.clone()
        out.pow(2).mean().backward()
        return first, h.grad, unused.grad is None
    return step, (model,), _data()


@case
def manual_sgd_under_no_grad():
    model = _mlp()

    def step(model, x, y, lr=0.1):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-lr)
                p.grad = None
        return loss.item()
    return step, (model,), _data()


@case
def manual_grad_zero_in_place():
    model = _mlp()

    def step(model, x, y):
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        return loss.detach()
    return step, (model,), _data()


@case
def func_grad_functional_call():
    model = _mlp()

    def step(model, x, y):
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss_fn(params, x, y):
            return F.cross_entropy(functional_call(model, params, (x,)), y)
        grads = grad(loss_fn)(params, x, y)
        with torch.no_grad():
            for k, p in model.named_parameters():
                p.sub_(0.1 * grads[k])
        return grads
    return step, (model,), _data()


@case
def per_sample_grads_vmap():
    model = _mlp()

    def step(model, x, y):
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss_fn(params, xi, yi):
            out = functional_call(model, params, (xi.unsqueeze(0),))
            return F.cross_entropy(out, yi.unsqueeze(0))
        per = vmap(grad(loss_fn), in_dims=(None, 0, 0))(params, x, y)
        return {k: v.norm(dim=tuple(range(1, v.dim()))) for k, v in per.items()}
    return step, (model,), _data()


@case
def ema_of_parameters():
    model, ema = _mlp(), _mlp()
    ema.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, ema, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), model.parameters(), strict=True):
                pe.mul_(0.9).add_(p, alpha=0.1)
        return F.cross_entropy(ema(x), y)
    return step, (model, ema, opt), _data()


@case
def two_losses_autograd_backward():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, maximize=True, weight_decay=0.01)

    def step(model, opt, x, y):
        out = model(x)
        l1 = F.cross_entropy(out, y)
        l2 = out.pow(2).mean()
        opt.zero_grad()
        torch.autograd.backward([l1, l2], [torch.tensor(1.0), torch.tensor(0.1)])
        opt.step()
        return l1.detach(), l2.detach()
    return step, (model, opt), _data()


@case
def lr_changed_by_hand_inside():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        for g in opt.param_groups:
            g["lr"] = g["lr"] * 0.5
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        return opt.param_groups[0]["lr"]
    return step, (model, opt), _data()


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = _mlp()
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.seen += x.shape[0]
        return self.net(x)


@case
def buffer_counter_adamw_foreach_false():
    model = Counter()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = F.nll_loss(F.log_softmax(model(x), -1), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step, (model, opt), _data()


@case
def adam_fused_with_label_smoothing():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        opt.step()
        return loss.detach()
    return step, (model, opt), _data()


@case
def adamw_amsgrad_maximize_foreach():
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, amsgrad=True, maximize=True, foreach=True)

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = -F.binary_cross_entropy_with_logits(model(x), F.one_hot(y, 3).float())
        loss.backward()
        opt.step()
        return loss.detach()
    return step, (model, opt), _data()


@case
def post_accumulate_hook_scales_grad():
    model = _mlp()
    def halve(p):
        p.grad.mul_(0.5)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(halve)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(model, opt, x, y):
        opt.zero_grad()
        F.smooth_l1_loss(model(x), F.one_hot(y, 3).float()).backward()
        opt.step()
        return model[0].weight.grad.sum()
    return step, (model, opt), _data()


@case
def backward_inputs_only_head():
    model = _mlp()

    def step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward(inputs=list(model[2].parameters()))
        return loss.detach()
    return step, (model,), _data()


@case
def retain_graph_two_heads():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        opt.zero_grad()
        h = model[1](model[0](x))
        out = model[2](h)
        loss = F.cross_entropy(out, y)
        loss.backward(retain_graph=True)
        aux = h.abs().mean()
        aux.backward()
        opt.step()
        return loss.detach(), aux.detach()
    return step, (model, opt), _data()


class Attn(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d, bias=False)     # a key bias's exact gradient is 0: Adam would scale noise
        self.proj = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, 2)

    def forward(self, x):
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(x + self.proj(a)).mean(1)


@case
def attention_adamw_gelu():
    model = Attn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    g = torch.Generator().manual_seed(4)
    calls = [(torch.randn(2, 5, 8, generator=g), torch.randint(0, 2, (2,), generator=g)) for _ in range(3)]
    return step, (model, opt), calls


@case
def groupnorm_conv1d_rmsprop_free_sgd():
    model = nn.Sequential(nn.Conv1d(2, 4, 3), nn.GroupNorm(2, 4), nn.SiLU(), nn.AdaptiveAvgPool1d(1),
                          nn.Flatten(), nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5, weight_decay=1e-3)

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    g = torch.Generator().manual_seed(5)
    calls = [(torch.randn(3, 2, 7, generator=g), torch.randint(0, 3, (3,), generator=g)) for _ in range(3)]
    return step, (model, opt), calls


@case
def different_batch_sizes_recompile():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    calls = _data(n=6, calls=2) + _data(n=3, calls=2, seed=7) + _data(n=6, calls=1, seed=8)
    return step, (model, opt), calls


@case
def parameter_replaced_between_calls():
    model = _mlp()

    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return model[2].weight.grad

    def replace(model, opt):
        with torch.no_grad():
            model[2].weight = nn.Parameter(model[2].weight * 0.5)
            model[0].bias.copy_(torch.linspace(-1, 1, 8))
        opt.param_groups[0]["params"][2] = model[2].weight
    calls = _data(calls=1) + [replace] + _data(calls=2, seed=4)
    return step, (model, opt), calls


# --- torch.func inside -------------------------------------------------------------------------

@case
def func_jvp_jacrev_jacfwd_hessian():
    w = torch.randn(3, 3)

    def f(x):
        return torch.tanh(w @ x).sum()

    def step(w_unused, x):
        v = torch.ones_like(x)
        _, t = jvp(lambda x: torch.sin(x) * x, (x,), (v,))
        return t, jacrev(lambda x: torch.tanh(w @ x))(x), jacfwd(torch.sin)(x), hessian(f)(x)
    return step, (w,), [(torch.randn(3),), (torch.randn(3),)]


@case
def func_grad_of_grad_and_value_aux():
    """Regression: grad of grad through ``y.detach()`` raised MissingGradRuleError."""
    def step(x):
        def f(x):
            y = (x ** 3).sum()
            return y, {"y": y.detach()}
        g2 = grad(lambda x: grad(lambda x: f(x)[0])(x).sum())(x)
        gg, aux = grad(f, has_aux=True)(x)
        gv, v = grad_and_value(lambda x: x.exp().sum())(x)
        return g2, gg, aux, gv, v
    return step, (), [(torch.randn(4),), (torch.randn(4),)]


@case
def func_argnums_aux_chunk_and_jvp_aux():
    """Regression: ``jvp(..., has_aux=True)`` raised a ValueError (the aux outputs got no cotangent)."""

    def step(x, w):
        def f(x, w):
            y = (x * w).sin().sum()
            return y, y.detach() * 2
        (gx, gw), aux = grad(f, argnums=(0, 1), has_aux=True)(x, w)
        vm = vmap(lambda r: (r * w).sum(), chunk_size=2)(x.unsqueeze(0).expand(5, 3))
        jr = jacrev(lambda a, b: a * b, argnums=1)(x, w)
        o, t, a2 = jvp(lambda a: (a.exp(), a.sum()), (x,), (w,), has_aux=True)
        jf, a3 = jacfwd(lambda a: (a.sin() * w, a.sum()), has_aux=True)(x)
        nested = vmap(vmap(lambda a: a * 2))(x.unsqueeze(0).expand(2, 3))
        return gx, gw, aux, vm, jr, o, t, a2, jf, a3, nested
    return step, (), [(torch.randn(3), torch.randn(3))]


@case
def func_vjp_called_twice():
    def step(x, u):
        out, fn = vjp(lambda x: x.sin() * x.cos(), x)
        (a,) = fn(u)
        (b,) = fn(u * 2)
        return out, a, b
    return step, (), [(torch.randn(5), torch.randn(5))]


@case
def func_vmap_module_ensemble():
    model = _mlp()

    def step(model, x):
        params = {k: v.detach() for k, v in model.named_parameters()}
        stacked = {k: torch.stack([v, v * 2]) for k, v in params.items()}
        return vmap(lambda p, x: functional_call(model, p, (x,)), in_dims=(0, None))(stacked, x)
    return step, (model,), [(torch.randn(4, 4),)]


# --- shape-changing in-place ops, .data and .grad assignment -----------------------------------

@case
def shape_inplace_on_input_then_train():
    model = _mlp()

    def step(model, x, y):
        x.unsqueeze_(0)
        x.mul_(2)
        x.squeeze_(0)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()
    return step, (model,), _data()


@case
def transpose_swapdims_locals():
    def step(x, w):
        t = x.clone()
        t.t_()
        t.add_(1)
        u = t.clone().swapdims_(0, 1)
        u.transpose_(1, 0).transpose_(0, 1)
        u.mul_(3)
        w.t_()
        return t * 2, u + w
    g = torch.Generator().manual_seed(9)
    return step, (), [(torch.randn(3, 4, generator=g), torch.randn(4, 3, generator=g))]


@case
def resize_as_strided_set_locals():
    def step(x, y):
        a = torch.zeros(6)
        a.resize_(2, 3)
        a.copy_(x)
        b = x.clone()
        b.as_strided_((3, 2), (1, 3))
        c = torch.empty(0)
        c.set_(b)
        d = torch.zeros(1)
        d.resize_as_(y)
        d.copy_(y)
        return a + 1, b * 2, c.sum(), d
    return step, (), [(torch.randn(2, 3), torch.randn(4))]


@case
def data_assignment_and_grad_assignment():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        model[0].weight.data = model[0].weight.data * 0.9
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        model[2].bias.grad = torch.zeros_like(model[2].bias)
        opt.step()
        return loss.detach()
    return step, (model, opt), _data()


@case
def x_data_swap_on_input():
    def step(x, y):
        x.data = y * 2
        return x + 1
    return step, (), [(torch.randn(3), torch.randn(3))]


# --- more steps ------------------------------------------------------------------------------

@case
def multistep_lr_sgd_foreach_false_returns_lr():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5, foreach=False)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1, 2], gamma=0.1)

    def step(model, opt, sched, x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
        return sched.get_last_lr()
    return step, (model, opt, sched), _data()


@case
def rmsprop_centered():
    model = _mlp()
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-2, momentum=0.5, centered=True)

    def step(model, opt, x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        return [p.detach().abs().sum() for p in model.parameters()]
    return step, (model, opt), _data()


@case
def gru_cell_unrolled_adam():
    cell, head = nn.GRUCell(3, 5), nn.Linear(5, 2)
    opt = torch.optim.Adam(list(cell.parameters()) + list(head.parameters()), lr=1e-2)

    def step(cell, head, opt, seq, y):
        h = torch.zeros(seq.shape[1], 5)
        for t in range(seq.shape[0]):
            h = cell(seq[t], h)
        loss = F.cross_entropy(head(h), y)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(list(cell.parameters()) + list(head.parameters()), 1.0)
        opt.step()
        return loss.detach()
    g = torch.Generator().manual_seed(6)
    calls = [(torch.randn(4, 2, 3, generator=g), torch.randint(0, 2, (2,), generator=g)) for _ in range(3)]
    return step, (cell, head, opt), calls


@case
def lstm_module_sgd():
    lstm, head = nn.LSTM(3, 4, batch_first=True), nn.Linear(4, 2)
    params = list(lstm.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=0.1)

    def step(lstm, head, opt, seq, y):
        out, (h, c) = lstm(seq)
        loss = F.mse_loss(head(out[:, -1]), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach(), c.detach()
    g = torch.Generator().manual_seed(6)
    calls = [(torch.randn(2, 4, 3, generator=g), torch.randn(2, 2, generator=g)) for _ in range(3)]
    return step, (lstm, head, opt), calls


@case
def model_zero_grad_and_unused_param():
    model = nn.ModuleDict({"a": nn.Linear(4, 3), "unused": nn.Linear(4, 3)})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(model, opt, x, y):
        model.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model["a"](x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step, (model, opt), _data()


@case
def grad_of_input_for_penalty_without_create_graph():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        x = x.clone().requires_grad_()
        out = model(x)
        (gx,) = torch.autograd.grad(out.sum(), x, retain_graph=True)
        loss = F.cross_entropy(out, y) + 0.1 * gx.detach().pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return gx
    return step, (model, opt), _data()


@case
def gradient_penalty_with_create_graph():
    """The penalty's gradient is differentiated by the loss's backward (double backward)."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        x = x.clone().requires_grad_()
        out = model(x)
        (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        loss = F.cross_entropy(out, y) + 0.1 * gx.pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach(), gx.detach()
    return step, (model, opt), _data()


@case
def leaves_made_inside_with_requires_grad():
    """Regression: ``x.clone().requires_grad_()`` reached by a backward was refused."""

    def step(w, x):
        t = x.clone().requires_grad_()
        (g,) = torch.autograd.grad((t * w).sum(), t, retain_graph=True)
        ((t * w) ** 2).sum().backward()
        u = x.clone()
        v = u * 2                      # made before u requires grad: no history through it
        u.requires_grad_()
        (u * v * w).sum().backward()
        return g, t.grad, u.grad
    return step, (torch.randn(3, requires_grad=True),), [(torch.randn(3),), (torch.randn(3),)]


@case
def pgd_adversarial_examples_then_train():
    """Regression: a leaf made by a factory (``zeros_like(x, requires_grad=True)``)
    or by ``detach().requires_grad_()`` was refused / "does not require grad"."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(model, opt, x, y):
        delta = torch.zeros_like(x, requires_grad=True)
        for _ in range(2):
            loss = F.cross_entropy(model(x + delta), y)
            (g,) = torch.autograd.grad(loss, [delta])
            delta = (delta + 0.1 * g.sign()).clamp(-0.3, 0.3).detach().requires_grad_()
        opt.zero_grad()
        adv = F.cross_entropy(model(x + delta), y)
        adv.backward()
        opt.step()
        return adv.detach(), delta.grad
    return step, (model, opt), _data()


@case
def input_grad_assigned_and_accumulated():
    def step(w, x):
        w.grad = torch.full_like(w, 0.5)
        (w * x).sum().backward()
        g = w.grad.clone()
        w.grad.zero_()
        (w * x * 2).sum().backward()
        return g
    return step, (torch.randn(3, requires_grad=True),), [(torch.randn(3),), (torch.randn(3),)]


@case
def jacrev_of_model_wrt_params_and_hessian_of_loss():
    model = nn.Linear(3, 2)

    def step(model, x):
        params = {k: v.detach() for k, v in model.named_parameters()}
        jac = jacrev(lambda p: functional_call(model, p, (x,)).sum(0))(params)
        h = hessian(lambda w: (functional_call(model, {"weight": w, "bias": params["bias"]}, (x,)) ** 2).sum())(
            params["weight"])
        return jac, h
    return step, (model,), [(torch.randn(4, 3),)]


@case
def vmap_out_dims_and_jvp_module():
    model = nn.Linear(3, 3)

    def step(model, x, t):
        f = lambda x: torch.tanh(model(x))  # noqa: E731
        out, tangent = jvp(f, (x,), (t,))
        batched = vmap(lambda r: r.sum() * r, in_dims=1, out_dims=1)(x)
        return out.detach(), tangent.detach(), batched.detach()
    return step, (model,), [(torch.randn(2, 3), torch.randn(2, 3))]


@case
def func_grad_training_loop_in_place_update():
    model = _mlp()

    def step(model, x, y):
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())

        def compute_loss(p, x, y):
            return F.cross_entropy(functional_call(model, (p, buffers), (x,)), y)
        grads, loss = grad_and_value(compute_loss)(params, x, y)
        with torch.no_grad():
            for k in params:
                params[k].add_(grads[k], alpha=-0.05)
        return loss
    return step, (model,), _data()


@case
def resize_and_set_on_inputs():
    def step(a, b, c):
        a.resize_(2, 2)
        a.mul_(3)
        b.set_(c)
        b.add_(1)
        return a.sum(), b * 1
    g = torch.Generator().manual_seed(10)
    return step, (), [(torch.randn(2, 3, generator=g), torch.randn(4, generator=g), torch.randn(2, 2, generator=g))]


@case
def as_strided_on_input_then_math():
    def step(x, w):
        x.as_strided_((2, 2), (1, 2))
        x.add_(w)
        return (x @ w).sum()
    return step, (), [(torch.randn(6), torch.randn(2, 2))]


@case
def called_with_new_shapes_and_seq_lengths():
    """SGD's weight decay after a matmul came out wrong from Inductor with
    torchcompile (THUNDERLITE_OUTSIDE_ALL=1; test_executors.py has the regression test)."""
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2)

    def step(model, opt, idx, tgt):
        loss = F.cross_entropy(model(idx).flatten(0, 1), tgt.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    g = torch.Generator().manual_seed(11)
    calls = [(torch.randint(0, 11, (b, t), generator=g), torch.randint(0, 11, (b, t), generator=g))
             for b, t in [(2, 5), (2, 5), (3, 4), (1, 7), (2, 5)]]
    return step, (model, opt), calls


@case
def warmup_lambda_and_manual_loss_scale():
    model = _mlp()
    opt = torch.optim.AdamW([{"params": [p for n, p in model.named_parameters() if "bias" not in n]},
                             {"params": [p for n, p in model.named_parameters() if "bias" in n],
                              "weight_decay": 0.0}], lr=1e-2, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: min(1.0, (s + 1) / 3), lambda s: 1.0])

    def step(model, opt, sched, x, y, scale=64.0):
        loss = F.cross_entropy(model(x), y)
        (loss * scale).backward()
        for p in model.parameters():
            p.grad.div_(scale)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step, (model, opt, sched), _data()


@case
def gan_two_optimizers():
    """Regression: the generator's backward after the discriminator's step was refused."""
    gen, disc = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 3)), nn.Sequential(nn.Linear(3, 4),
                                                                                          nn.LeakyReLU(0.2),
                                                                                          nn.Linear(4, 1))
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-2, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-2, betas=(0.5, 0.999))

    def step(gen, disc, opt_g, opt_d, z, real):
        fake = gen(z)
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
        opt_d.zero_grad()
        d_loss = F.binary_cross_entropy_with_logits(disc(real), ones) + \
            F.binary_cross_entropy_with_logits(disc(fake.detach()), zeros)
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(disc(fake), ones)
        g_loss.backward()
        opt_g.step()
        with torch.no_grad():
            for p in disc.parameters():
                p.data.clamp_(-0.5, 0.5)
        return d_loss.item(), g_loss.item()
    g = torch.Generator().manual_seed(12)
    calls = [(torch.randn(4, 2, generator=g), torch.randn(4, 3, generator=g)) for _ in range(3)]
    return step, (gen, disc, opt_g, opt_d), calls


@case
def several_optimizer_steps_in_one_call():
    """Regression: an optimizer step between two backwards wrote the leaves the
    next forward reads, and that backward was refused ("a write into a tensor
    that requires grad on the gradient path")."""
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)

    def step(model, opt, sched, x, y):
        losses = []
        for xb, yb in zip(x.split(2), y.split(2), strict=True):
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.99)
        sched.step()
        return torch.stack(losses)
    return step, (model, opt, sched), _data()


@case
def fused_adamw_head_and_sgd_body():
    """Regression: ``torch._fused_adamw_``'s meta kernel writes nothing, so the
    opaque op's writes into the head's parameters were unknown and the update
    was scheduled before the backward's last read of them (a silent wrong
    gradient of the body)."""
    model = _mlp()
    body = torch.optim.SGD(model[0].parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                           maximize=True)
    head = torch.optim.AdamW(model[2].parameters(), lr=1e-2, fused=True, amsgrad=True, weight_decay=0.1)

    def step(model, body, head, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        body.step()
        head.step()
        body.zero_grad()
        head.zero_grad()
        return loss.detach()
    return step, (model, body, head), _data()


@case
def activation_checkpointing():
    """Regression: ``torch.utils.checkpoint`` raised (a SavedTensor the trace
    cannot hold; an AttributeError in the reentrant form)."""
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(model, opt, x, y):
        h = checkpoint(lambda x: model[1](model[0](x)), x, use_reentrant=False)
        h = checkpoint(model[2], h, use_reentrant=True)          # h requires grad: gradients flow as in eager
        frozen = checkpoint(model[0], x, use_reentrant=True)     # no input requires grad: eager records nothing
        loss = F.cross_entropy(model[4](model[3](h)), y) + frozen.sum() * 0
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach(), frozen.requires_grad
    return step, (model, opt), _data()


@case
def explicit_l2_penalty_and_gradient_argument():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, maximize=False, momentum=0.9)

    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss = loss + 1e-3 * sum(p.pow(2).sum() for p in model.parameters())
        opt.zero_grad()
        loss.backward(torch.tensor(0.5))
        opt.step()
        return loss.detach()
    return step, (model, opt), _data()


@case
def freeze_and_unfreeze_inside():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        model[0].requires_grad_(False)
        F.cross_entropy(model(x), y).backward()
        model[0].requires_grad_(True)
        opt.step()
        opt.zero_grad()
        return model[0].weight.requires_grad
    return step, (model, opt), _data()


@case
def weight_renorm_before_forward_and_vector_utils():
    """Regression: a no_grad write into a parameter before the forward was refused."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        with torch.no_grad():
            w = model[0].weight
            w.div_(w.norm(dim=1, keepdim=True).clamp_min(1.0))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return nn.utils.parameters_to_vector(model.parameters()).detach()
    return step, (model, opt), _data()


@case
def conditional_step_every_other_call():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(model, opt, x, y, i):
        (F.cross_entropy(model(x), y) / 2).backward()
        if (i + 1) % 2 == 0:
            opt.step()
            opt.zero_grad()
        return [p.grad is None for p in model.parameters()]
    data = _data(calls=4)
    return step, (model, opt), [(x, y, i) for i, (x, y) in enumerate(data)]


@case
def tensor_lr_adam():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01))

    def step(model, opt, x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        return model[2].bias.detach()
    return step, (model, opt), _data()


@case
def grads_read_after_zero_grad_and_first_call():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        had = [p.grad is not None for p in model.parameters()]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        total = sum(p.grad.norm() for p in model.parameters())
        opt.step()
        return had, total
    return step, (model, opt), _data()


@case
def cyclic_lr_sgd_momentum():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    s1 = torch.optim.lr_scheduler.CyclicLR(opt, 0.01, 0.1, step_size_up=2)

    def step(model, opt, s1, x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        s1.step()
        return loss.detach()
    return step, (model, opt, s1), _data()


@case
def chained_polynomial_and_warm_restarts():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    s = torch.optim.lr_scheduler.ChainedScheduler([
        torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=4, power=2.0),
        torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2)])

    def step(model, opt, s, x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        s.step()
        return loss.detach()
    return step, (model, opt, s), _data()


@case
def forward_hook_captures_activation():
    model = _mlp()
    acts = {}
    model[1].register_forward_hook(lambda m, i, o: acts.__setitem__("relu", o.detach()))

    def step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return acts["relu"].sum()
    return step, (model,), _data()


@case
def forward_pre_hook_scales_input():
    model = _mlp()
    model[2].register_forward_pre_hook(lambda m, args: (args[0] * 0.5,))

    def step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()
    return step, (model,), _data()


@case
def grad_assigned_before_and_after_backward():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(model, opt, x, y):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        F.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            p.grad = p.grad * 2
        model[0].weight.grad += 1.0
        opt.step()
        return model[0].weight.grad.sum()
    return step, (model, opt), _data()


@case
def functional_call_tied_weights():
    class M(nn.Module):
        def __init__(s):
            super().__init__()
            s.a = nn.Linear(3, 3, bias=False)
            s.b = nn.Linear(3, 3, bias=False)
            s.b.weight = s.a.weight
        def forward(s, x): return s.b(s.a(x))
    m = M()

    def step(m, x, w):
        out = functional_call(m, {"a.weight": w}, (x,), tie_weights=True, strict=False)
        g = grad(lambda w: functional_call(m, {"a.weight": w}, (x,)).sum())(w)
        return out, g
    return step, (m,), [(torch.randn(2, 3), torch.randn(3, 3))]


@case
def backward_inputs_naming_an_input():
    model = _mlp()

    def step(model, x, y):
        x.grad = None
        loss = F.cross_entropy(model(x), y)
        loss.backward(inputs=[x, model[0].weight])
        return x.grad * 1
    data = [(x.requires_grad_(), y) for x, y in _data()]
    return step, (model,), data


@case
def nonscalar_backward_and_grad_reset():
    model = _mlp()

    def step(model, x, y):
        out = model(x)
        out.backward(torch.ones_like(out))
        g = model[2].bias.grad.clone()
        for p in model.parameters():
            p.grad = None
        model(x).sum().backward()
        return g
    return step, (model,), _data()


@case
def new_optimizer_each_call():
    model = _mlp()

    def step(model, x, y):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach(), len(opt.state)
    return step, (model,), _data()


@case
def param_data_transposed_and_input_grad():
    model = nn.Linear(4, 4)

    def step(model, x, y):
        with torch.no_grad():
            model.weight.data = model.weight.data.t().contiguous()
        x.grad = torch.ones_like(x)
        loss = F.cross_entropy(model(x)[:, :3], y)
        loss.backward()
        return x.grad * 1, model.weight.grad.sum()
    return step, (model,), _data()


@case
def unsqueeze_input_for_conv_then_restore():
    conv = nn.Conv1d(1, 2, 3)
    opt = torch.optim.SGD(conv.parameters(), lr=0.1)

    def step(conv, opt, x):
        x.unsqueeze_(1)
        loss = conv(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        x.squeeze_(1).mul_(0.5)
        return loss.detach()
    return step, (conv, opt), [(torch.randn(2, 6),) for _ in range(3)]


@case
def adam_skips_params_without_grad():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-2)

    def step(model, opt, x, y):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model[2](torch.relu(x @ torch.ones(4, 8))), y).backward()   # model[0] gets no grad
        opt.step()
        return [p.grad is None for p in model.parameters()]
    return step, (model, opt), _data()


@case
def shape_op_on_a_grad():
    model = nn.Linear(3, 3, bias=False)

    def step(model, x):
        model(x).sum().backward()
        g = model.weight.grad
        g.t_()                       # in-place shape op on a .grad
        g.mul_(2)
        return g.sum()
    return step, (model,), [(torch.randn(2, 3),), (torch.randn(2, 3),)]


@case
def embedding_padding_idx():
    emb = nn.Embedding(7, 4, padding_idx=0)
    opt = torch.optim.SGD(emb.parameters(), lr=0.5)

    def step(emb, opt, idx):
        loss = emb(idx).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()
    return step, (emb, opt), [(torch.tensor([[0, 1, 2], [3, 0, 6]]),) for _ in range(3)]


@case
def metrics_and_inference_mode_eval():
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Dropout(0.0), nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

    def step(model, opt, x, y):
        model.train()
        out = model(x)
        loss = F.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        acc = (out.argmax(1) == y).float().mean()
        model.eval()
        with torch.inference_mode():
            val = F.cross_entropy(model(x), y)
        return loss.item(), acc.item(), val.item()
    return step, (model, opt), _data()


@case
def shape_ops_on_a_value_in_the_graph():
    w = torch.randn(4, 3, requires_grad=True)

    def step(w, x):
        h = x @ w            # (6,3)
        h.t_()               # (3,6)
        h.unsqueeze_(0)      # (1,3,6)
        h.squeeze_(0)
        loss = (h * h).sum()
        loss.backward()
        return w.grad * 1, h.shape[0]
    return step, (w,), [(torch.randn(6, 4),), (torch.randn(6, 4),)]


@case
def data_assigned_between_backward_and_step():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)

    def step(model, opt, x, y):
        F.cross_entropy(model(x), y).backward()
        model[0].weight.data = model[0].weight.data.clamp(-0.2, 0.2)
        opt.step()
        opt.zero_grad()
        return model[0].weight.sum().detach()
    return step, (model, opt), _data()


@case
def resize_and_swapdims_on_locals_then_backward():
    model = nn.Linear(3, 2)

    def step(model, x):
        z = torch.zeros(6)
        z.resize_(2, 3)
        z.copy_(x)
        z.swapdims_(0, 1)
        out = model(z.t()).sum()
        out.backward()
        return model.weight.grad * 1
    return step, (model,), [(torch.randn(2, 3),), (torch.randn(2, 3),)]


@case
def two_models_clipped_separately():
    a, b = _mlp(), _mlp()
    oa = torch.optim.Adam(list(a.parameters()) + list(b.parameters()), lr=1e-2)

    def step(a, b, oa, x, y):
        loss = F.cross_entropy(a(x) + b(x), y)
        loss.backward()
        na = nn.utils.clip_grad_norm_(a.parameters(), 0.1)
        nb = nn.utils.clip_grad_norm_(b.parameters(), 10.0)
        oa.step()
        oa.zero_grad()
        return na, nb
    return step, (a, b, oa), _data()


@case
def hook_then_retain_grad_on_one_intermediate():
    """Regression: the retained (and ``autograd.grad``'s) gradient of an
    intermediate was taken before its hooks; eager's is after them."""
    model = _mlp()
    model[2].bias.register_hook(lambda g: g * 10)

    def step(model, x, y):
        h = model[0](x)
        h.register_hook(lambda g: g.clamp(-0.01, 0.01))
        h.retain_grad()
        F.cross_entropy(model[2](model[1](h)), y).backward()
        r = h.grad.clone()
        model.zero_grad()
        return r
    return step, (model,), _data()


@case
def hook_on_intermediate_across_a_retained_graph():
    """Regression: a hook on an intermediate was lost for the second
    differentiation of a graph kept by ``retain_graph=True``."""

    def step(w):
        h = w * 1
        h.register_hook(lambda g: g * 2)
        (gh,) = torch.autograd.grad((h * 3).sum(), h, retain_graph=True)
        (gw,) = torch.autograd.grad((h * 3).sum(), w)
        return gh, gw
    return step, (torch.randn(3, requires_grad=True),), [(), ()]


# Inductor compiles each region of each program: a representative set runs with torchcompile on
# every test run (the file stays fast); THUNDERLITE_OUTSIDE_ALL=1 runs every program with it.
TORCHCOMPILE_CASES = ["cnn_batchnorm_sgd_momentum_steplr", "fused_adamw_head_and_sgd_body", "lm_adamw_cosine",
                      "lm_tied_weights_adamw", "frozen_layer_and_param_groups", "grad_accumulation_micro_batches",
                      "clip_norm_returned", "gan_two_optimizers", "hooks_on_parameters_before_and_inside",
                      "leaves_made_inside_with_requires_grad", "per_sample_grads_vmap",
                      "shape_inplace_on_input_then_train"]
_RUNS = [(n, "default") for n in CASES] + [(n, "torchcompile") for n in CASES
                                           if n in TORCHCOMPILE_CASES or os.environ.get("THUNDERLITE_OUTSIDE_ALL")]


@pytest.mark.parametrize("name,executors", _RUNS, ids=[f"{n}-{e}" for n, e in _RUNS])
def test_matches_eager(name, executors):
    _check(name, executors)


# Tensor hooks, retain_grad and requires_grad_ inside, through ThunderFX (dynamo splits the step
# at each backward; the pieces run through thunderlite or, with hooks, dynamo's fallback).
FX_CASES = ["hooks_scale_and_clamp_intermediates", "hooks_on_parameters_before_and_inside", "retain_grad_on_logits",
            "retain_grad_accumulates_over_two_backwards", "input_requires_grad_returns_x_grad",
            "leaves_made_inside_with_requires_grad"]


@pytest.mark.parametrize("name", FX_CASES)
def test_thunderfx_matches_eager(name):
    torch._dynamo.reset()
    try:
        _check(name, "thunderfx")
    finally:
        torch._dynamo.reset()


# --- refusals and eager's errors ---------------------------------------------------------------

def test_retained_grad_of_a_returned_tensor_is_refused():
    """Eager's returned ``h`` carries ``h.grad``; the compiled program returns a
    new tensor, so a retained ``.grad`` on a returned value is refused."""

    def step(w, x):
        h = x * w
        h.retain_grad()
        h.sum().backward()
        return h
    with pytest.raises(NotImplementedError, match=r"gives a \.grad \(retain_grad\(\).*is returned or stored"):
        thunderlite.jit(step)(torch.randn(3, requires_grad=True), torch.randn(3))


def test_leaf_made_inside_with_grad_returned_is_refused():
    def step(w, x):
        t = x.clone().requires_grad_()
        (t * w).sum().backward()
        return t
    with pytest.raises(NotImplementedError, match=r"is returned or stored after a backward"):
        thunderlite.jit(step)(torch.randn(3, requires_grad=True), torch.randn(3))


def test_requires_grad_on_input_after_reading_it_is_refused():
    """Eager gives ``x.grad == y`` here (``y = x * 2`` has no history): the
    trace's leaves are its inputs from the start, so this order is refused."""

    def step(x):
        y = x * 2
        x.requires_grad_()
        (x * y).sum().backward()
        return x.grad
    with pytest.raises(NotImplementedError, match=r"made a leaf by requires_grad_\(\) after the function read it"):
        thunderlite.jit(step)(torch.randn(3))


def test_batchnorm_cumulative_average_is_refused_with_the_line():
    """``BatchNorm1d(momentum=None)`` computes ``1 / float(num_batches_tracked)``:
    a Python number from a tensor's value, which thunderlite does not follow
    (data-dependent); refused with the user's line."""
    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5, momentum=None), nn.ReLU(), nn.Linear(5, 3))

    def step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()
    with pytest.raises(DataDependentError, match=r"float\(tensor\).*loss = F\.cross_entropy\(model\(x\), y\)"):
        thunderlite.jit(step)(model, *_data(calls=1)[0])


def test_two_heads_without_retain_graph_raise_eagers_error():
    def step(model, x, y):
        h = model[1](model[0](x))
        F.cross_entropy(model[2](h), y).backward()
        h.pow(2).mean().backward()
    args = (_mlp(), *_data(calls=1)[0])
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        step(*copy.deepcopy(args))
    with pytest.raises(RuntimeError, match=r"a second time.*h\.pow\(2\)\.mean\(\)\.backward\(\)"):
        thunderlite.jit(step)(*args)


def test_data_dependent_python_in_a_step_is_refused_with_the_line():
    """``ReduceLROnPlateau.step(loss)`` compares ``float(loss)`` with its best
    value, ``clip_grad_norm_(error_if_nonfinite=True)`` raises on the norm's
    value: Python control flow on a tensor's value, which a trace cannot
    follow (DataDependentError with the user's line)."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)

    def plateau(model, opt, sched, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step(loss)

    def clip(model, x, y):
        F.cross_entropy(model(x), y).backward()
        return nn.utils.clip_grad_norm_(model.parameters(), 0.4, error_if_nonfinite=True)
    with pytest.raises(DataDependentError, match=r"sched\.step\(loss\)"):
        thunderlite.jit(plateau)(model, opt, sched, *_data(calls=1)[0])
    with pytest.raises(DataDependentError, match=r"error_if_nonfinite=True"):
        thunderlite.jit(clip)(model, *_data(calls=1)[0])


def test_new_parameter_inside_is_refused_clearly():
    """A new ``nn.Parameter`` made inside the program (before: a TypeError from
    ``_make_subclass``); replacing one between calls works (parameter_replaced_between_calls)."""

    def step(model, x):
        model[2].weight = nn.Parameter(model[2].weight.detach() * 0.5)
        return model(x)
    with pytest.raises(NotImplementedError, match=r"making a Parameter of a traced tensor.*nn\.Parameter\("):
        thunderlite.jit(step)(_mlp(), torch.randn(2, 4))
