"""Training through ``thunderlite.jit``: gradients, requires_grad, grad modes,
accumulation, the backward traces, and whole models against eager."""
from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunderlite

F64 = torch.float64


def _pair(*shapes, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    a = [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
    return [t.clone().requires_grad_() for t in a], [t.clone().requires_grad_() for t in a]


def _same_grads(ours, theirs):
    for a, b in zip(ours, theirs, strict=True):
        if b.grad is None:
            assert a.grad is None
        else:
            torch.testing.assert_close(a.grad, b.grad)


def test_function_grads_and_accumulation():
    def f(x, w, b):
        return F.gelu(F.linear(x, w, b)).sum()
    ours, ref = _pair((4, 8), (5, 8), (5,))
    jf = thunderlite.jit(f)
    for _ in range(2):
        jf(*ours).backward()
        f(*ref).backward()
    _same_grads(ours, ref)


def test_requires_grad_of_outputs_as_eager():
    def f(x, y):
        return x * 2, y + 1, x.argmax(), (x > 0), x.detach() * 3, x.sum()
    (x, y), _ = _pair((3, 4), (3, 4))
    y.requires_grad_(False)
    got = thunderlite.jit(f)(x, y)
    want = f(x, y)
    for g, w in zip(got, want, strict=True):
        assert g.requires_grad == w.requires_grad
        torch.testing.assert_close(g, w)


def test_no_grad_and_enable_grad_regions():
    def f(x):
        with torch.no_grad():
            a = x * 2
            with torch.enable_grad():
                b = x * 3
        return a + b, a
    ours, ref = _pair((3,))
    got, want = thunderlite.jit(f)(*ours), f(*ref)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want]
    got[0].sum().backward()
    want[0].sum().backward()
    _same_grads(ours, ref)


def test_outside_grad_mode_no_graph():
    ours, _ = _pair((3,))
    with torch.no_grad():
        out = thunderlite.jit(lambda x: x.sin())(*ours)
    assert not out.requires_grad


def test_views_and_inplace_on_non_leaf():
    def f(x, w):
        h = x * w
        h[0].add_(1)
        h.t().clamp_(-0.5, 0.5)
        return h.tanh()
    ours, ref = _pair((3, 4), (3, 4))
    got, want = thunderlite.jit(f)(*ours), f(*ref)
    torch.testing.assert_close(got, want)
    (got * got).sum().backward()
    (want * want).sum().backward()
    _same_grads(ours, ref)


def test_inplace_on_saved_tensor_gradient_is_exact_or_raises():
    def f(x):
        y = x.exp()
        z = y * 2
        y.add_(1)
        return z + y
    ours, ref = _pair((4,))
    out = thunderlite.jit(f)(*ours)
    out.sum().backward()
    x = ref[0]
    torch.testing.assert_close(ours[0].grad, 3 * x.detach().exp())


def test_last_backward_traces():
    jf = thunderlite.jit(lambda x: (x.sin() * 2).sum())
    (x,), _ = _pair((3,))
    jf(x).backward()
    bwd = thunderlite.last_backward_traces(jf)
    assert bwd and "def backward" in str(bwd[-1])
    fwd = thunderlite.last_traces(jf)
    assert "def forward" in str(fwd[-1])


def test_opaque_op_gradient_from_pytorch():
    def f(x):
        return torch.special.i1(x).sum()  # an op without a decomposition
    ours, ref = _pair((5,))
    thunderlite.jit(f)(*ours).backward()
    f(*ref).backward()
    _same_grads(ours, ref)


def test_integer_and_bool_outputs_do_not_require_grad():
    def f(x):
        return x.round().long(), x.sum()
    (x,), _ = _pair((4,))
    a, b = thunderlite.jit(f)(x)
    assert not a.requires_grad and b.requires_grad


# --- models -------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, layers=2, ctx=16):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def nanogpt_and_copy(steps: int) -> tuple[NanoGPT, NanoGPT, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A float64 NanoGPT, an identical copy to train another way, and ``steps``
    batches: the training comparisons here and in test_thunderfx.py."""
    torch.manual_seed(0)
    ref = NanoGPT().to(F64)
    ours = copy.deepcopy(ref)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g))
               for _ in range(steps)]
    return ref, ours, batches


def train(model: nn.Module, fn: Callable, opt_cls: type, batches: list, **opt_kw) -> torch.Tensor:
    """The losses of one optimizer step per batch on ``model``, each computed by
    ``fn``: the model itself, or it jitted or compiled."""
    opt = opt_cls(model.parameters(), **opt_kw)
    losses = []
    for args in batches:
        opt.zero_grad()
        loss = fn(*args)
        loss.backward()
        losses.append(loss.detach())
        opt.step()
    return torch.stack(losses)


def assert_same_parameters(ours: nn.Module, ref: nn.Module, **tolerances: float) -> None:
    """Every parameter of ``ours`` equals ``ref``'s (``atol``/``rtol`` as given),
    a mismatch named."""
    for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, **tolerances, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.parametrize("opt_cls,kw", [(torch.optim.SGD, {"lr": 0.1}), (torch.optim.AdamW, {"lr": 1e-2})])
def test_nanogpt_training_matches_eager(opt_cls, kw):
    ref, ours, batches = nanogpt_and_copy(5)
    want = train(ref, ref, opt_cls, batches, **kw)
    got = train(ours, thunderlite.jit(ours), opt_cls, batches, **kw)
    torch.testing.assert_close(got, want)
    assert_same_parameters(ours, ref)


def test_nanogpt_every_parameter_gradient():
    torch.manual_seed(0)
    ref = NanoGPT().to(F64)
    ours = copy.deepcopy(ref)
    idx, tgt = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    thunderlite.jit(ours)(idx, tgt).backward()
    ref(idx, tgt).backward()
    for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=lambda m, n=n: f"{n}: {m}")


def test_llama_loss_and_gradients_match_eager():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(cfg).to(F64)
    ours = copy.deepcopy(ref)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))

    def loss_of(model):
        def loss(i):
            logits = model(input_ids=i).logits
            return F.cross_entropy(logits[:, :-1].reshape(-1, 64), i[:, 1:].reshape(-1))
        return loss

    opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    jf = thunderlite.jit(loss_of(ours))
    for step in range(5):
        opt_r.zero_grad()
        opt_o.zero_grad()
        lr_, lo = loss_of(ref)(ids), jf(ids)
        lr_.backward()
        lo.backward()
        torch.testing.assert_close(lo, lr_)
        if step == 0:
            for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
                torch.testing.assert_close(a.grad, b.grad, msg=lambda m, n=n: f"{n}: {m}")
        opt_r.step()
        opt_o.step()
    # AdamW divides by the root of tiny second moments: float64 rounding
    # differences of 1e-16 in a gradient become ~1e-7 in a parameter.
    for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, n=n: f"{n}: {m}")


# --- user torch.autograd.Function subclasses ------------------------------------------------------

class StraightThrough(torch.autograd.Function):
    """round() forward, identity backward: its gradient is not round's derivative."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        ctx.save_for_backward(x)
        return torch.round(x * scale) / scale

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        assert ctx.needs_input_grad == (True, False)
        return g * torch.cos(x) + g, None


class SortWithIndex(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        values, idx = torch.sort(x)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(idx)
        return values, idx

    @staticmethod
    def backward(ctx, gv, gi):
        (idx,) = ctx.saved_tensors
        return torch.zeros_like(gv).scatter(0, idx, gv)


class ScaleInPlace(torch.autograd.Function):
    """In-place code on an intermediate inside the user's forward and backward."""

    @staticmethod
    def forward(ctx, x):
        y = x * 2
        y.add_(1)
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        out = g.clone()
        out.mul_(2)
        return out


def test_autograd_function_user_backward_is_traced():
    def f(x):
        return StraightThrough.apply(x.sin(), 4.0).sum()
    ours, ref = _pair((5,))
    jf = thunderlite.jit(f)
    jf(*ours).backward()
    f(*ref).backward()
    _same_grads(ours, ref)
    first = thunderlite.last_traces(jf)[0]
    assert "autograd_function.StraightThrough" in str(first)
    assert any("cos" in str(t) for t in thunderlite.last_backward_traces(jf))


def test_autograd_function_non_differentiable_output():
    def f(x):
        v, i = SortWithIndex.apply(x * 3)
        return v, i
    ours, ref = _pair((6,))
    (v, i), (rv, ri) = thunderlite.jit(f)(*ours), f(*ref)
    assert v.requires_grad and not i.requires_grad and not ri.requires_grad
    torch.testing.assert_close(i, ri)
    (v * torch.arange(6.0, dtype=F64)).sum().backward()
    (rv * torch.arange(6.0, dtype=F64)).sum().backward()
    _same_grads(ours, ref)


def test_autograd_function_with_inplace_code():
    def f(x):
        return ScaleInPlace.apply(x.exp()).sum()
    ours, ref = _pair((4,))
    out, want = thunderlite.jit(f)(*ours), f(*ref)
    torch.testing.assert_close(out, want)
    out.backward()
    want.backward()
    _same_grads(ours, ref)


def test_second_backward_raises_clearly_and_double_backward_equals_eager():
    (x,), _ = _pair((3,))
    out = thunderlite.jit(lambda x: (x.sin() * x).sum())(x)
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second time"):
        out.backward()
    (y,), (r,) = _pair((3,))
    f = lambda x: (x.sin() * x).sum()  # noqa: E731
    (g,) = torch.autograd.grad(thunderlite.jit(f)(y), y, create_graph=True)
    (want,) = torch.autograd.grad(f(r), r, create_graph=True)
    torch.testing.assert_close(g, want)
    torch.testing.assert_close(torch.autograd.grad(g.sum(), y), torch.autograd.grad(want.sum(), r))


@pytest.mark.parametrize("affine,train", [(True, True), (False, True), (True, False)])
def test_batch_norm_model_functional_backward(affine, train):
    """Training batch norm updates its running stats in place without a
    gradient; the model keeps a functional backward (not eager mode)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=affine), nn.ReLU(), nn.Flatten(),
                        nn.Linear(4 * 6 * 6, 2)).to(F64).train(train)
    ours = copy.deepcopy(ref)
    x = torch.randn(5, 3, 8, 8, dtype=F64)
    jm = thunderlite.jit(ours)
    for _ in range(2):
        jm(x).square().sum().backward()
        ref(x).square().sum().backward()
    for (n, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=lambda m, n=n: f"{n}: {m}")
    for (n, a), b in zip(ours.named_buffers(), ref.buffers(), strict=True):
        torch.testing.assert_close(a, b, msg=lambda m, n=n: f"{n}: {m}")
    assert thunderlite.last_backward_traces(jm)


def test_no_grad_region_in_a_program_with_views_and_inplace():
    """Eager mode (a write into a view on the gradient path) keeps no_grad values out of the graph."""
    def f(x, w):
        h = x * w
        v = h[0]
        with torch.no_grad():
            s = h * 10
        v.add_(1)
        return h * s, s
    ours, ref = _pair((3, 4), (3, 4))
    got, want = thunderlite.jit(f)(*ours), f(*ref)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want]
    got[0].sum().backward()
    want[0].sum().backward()
    _same_grads(ours, ref)


# --- requires_grad_ inside the program ---------------------------------------------------------

def _requires_grad_case(fn, x_grad: bool):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(3, 4, generator=g, dtype=F64), torch.randn(3, 4, generator=g, dtype=F64)
    xs = (x.clone().requires_grad_(x_grad), w.clone()), (x.clone().requires_grad_(x_grad), w.clone())
    got, want = thunderlite.jit(fn)(*xs[0]), fn(*xs[1])
    torch.testing.assert_close(got, want)
    assert [o.requires_grad for o in got] == [o.requires_grad for o in want]
    assert [t.requires_grad for t in xs[0]] == [t.requires_grad for t in xs[1]]
    if any(o.requires_grad for o in want):
        sum(o.sum() for o in got if o.requires_grad).backward()
        sum(o.sum() for o in want if o.requires_grad).backward()
    _same_grads(xs[0], xs[1])


def test_requires_grad_on_an_argument_makes_it_a_leaf():
    def f(x, w):
        w.requires_grad_()
        return (x * w).sin(), w.cos()
    _requires_grad_case(f, x_grad=False)
    _requires_grad_case(f, x_grad=True)


def test_requires_grad_false_on_an_argument():
    def f(x, w):
        x.requires_grad_(False)
        return x * w, w * 2
    _requires_grad_case(f, x_grad=True)


def test_requires_grad_on_an_intermediate_starts_a_path():
    def f(x, w):                       # functional autodiff: y is a new leaf of the graph
        y = (w * 2).requires_grad_()
        return y * x, (y * 3).exp()
    _requires_grad_case(f, x_grad=True)


def test_opaque_outputs_require_grad_as_pytorch_says():
    """Opaque ops (no ltorch symbol) ask PyTorch which outputs require grad, so
    Python code reading ``.requires_grad`` sees eager's answer."""
    def f(x):
        d = torch.detach(x)
        v, i = torch.kthvalue(x, 2, 0)
        return d * 2, v * 3, i, (d.requires_grad, v.requires_grad, i.requires_grad)
    (x,), _ = _pair((3, 4))
    got, want = thunderlite.jit(f)(x), f(x)
    assert got[3] == want[3] == (False, True, False)
    assert [o.requires_grad for o in got[:3]] == [o.requires_grad for o in want[:3]]
    torch.testing.assert_close(got[:3], want[:3])


def test_enable_grad_inside_a_call_made_under_no_grad():
    def f(x):
        with torch.enable_grad():
            y = x * 2
        return y, x + 1
    (x,), (xr,) = _pair((3,))
    with torch.no_grad():
        got, want = thunderlite.jit(f)(x), f(xr)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want] == [True, False]
    torch.testing.assert_close(got, want)
    got[0].sum().backward()
    want[0].sum().backward()
    _same_grads([x], [xr])


@pytest.mark.parametrize("input_grad", [False, True])
def test_convolution_backward_computes_only_the_gradients_wanted(input_grad):
    """A patch embedding's pixels need no gradient: the backward's kernel is
    asked for the weight's and bias's only (the input's cost four times as
    much); where the input requires grad it gets one. Both equal eager's."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, kernel_size=4, stride=4).double()
    ref = copy.deepcopy(conv)
    x = torch.randn(2, 3, 16, 16, dtype=F64, requires_grad=input_grad)
    xr = x.detach().clone().requires_grad_(input_grad)
    jm = thunderlite.jit(conv)
    jm(x).square().sum().backward()
    ref(xr).square().sum().backward()
    for p, q in zip(conv.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    if input_grad:
        torch.testing.assert_close(x.grad, xr.grad)
    (bwd,) = [b for b in thunderlite.last_backward_traces(jm)[-1].bound_symbols
              if b.sym.name == "convolution_backward"]
    assert tuple(bwd.args[-1]) == (input_grad, True, True)
    assert (bwd.output[0] is None) is not input_grad
