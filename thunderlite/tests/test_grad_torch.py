"""Direct VJP rules of torch-level symbols (and their decomposition fallback)
against eager autograd, at trace level."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_grad_prims import check_grad

from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.ops import linalg, shapes
from thunderlite.torch.ops import nn as lnn

F64 = torch.float64


def _t(*shape, seed=0, grad=True, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=dtype).requires_grad_(grad)


def _uses_rule(program, name: str) -> bool:
    """The forward kept the symbol whole (its own rule ran, not its decomposition)."""
    return any(b.sym.id == name for b in program.split.forward.bound_symbols)


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((4,), (4, 5)), ((2, 3, 4), (4,)), ((2, 1, 3, 4), (5, 4, 2))])
def test_matmul(sa, sb):
    prog = check_grad(linalg.matmul, _t(*sa), _t(*sb, seed=1))
    assert _uses_rule(prog, "ltorch.matmul")


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (4,)])
def test_linear(shape):
    prog = check_grad(linalg.linear, _t(*shape), _t(5, 4, seed=1), _t(5, seed=2))
    assert _uses_rule(prog, "ltorch.linear")
    check_grad(linalg.linear, _t(*shape), _t(5, 4, seed=1, grad=False), _t(5, seed=2))
    check_grad(lambda x, w: linalg.linear(x, w), _t(*shape, grad=False), _t(5, 4, seed=1))


@pytest.mark.parametrize("sym", [lnn.softmax, lnn.log_softmax])
def test_softmax_family(sym):
    prog = check_grad(lambda x: sym(x, -1), _t(3, 5))
    assert _uses_rule(prog, sym.id)
    check_grad(lambda x: sym(x, 0), _t(4, 2, 3))
    check_grad(lambda x: sym(x, 1, dtype=torch.float32), _t(3, 5))


def test_layer_norm_and_rms_norm():
    x, w, b = _t(2, 3, 8), _t(8, seed=1), _t(8, seed=2)
    prog = check_grad(lambda x, w, b: lnn.layer_norm(x, (8,), w, b), x, w, b)
    assert _uses_rule(prog, "aten.native_layer_norm")
    check_grad(lambda x: lnn.layer_norm(x, (3, 8)), _t(2, 3, 8))
    prog = check_grad(lambda x, w: lnn.rms_norm(x, (8,), w, 1e-6), x, w)
    assert _uses_rule(prog, "aten.fused_rms_norm")
    check_grad(lambda x: lnn.rms_norm(x, (3, 8)), _t(2, 3, 8))
    check_grad(lambda x, w: lnn.rms_norm(x, (3, 8), w), _t(2, 3, 8), _t(3, 8, seed=1))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
    target = torch.tensor([1, 0, 4, -100])
    prog = check_grad(lambda x, t: lnn.cross_entropy(x, t, reduction=reduction), _t(4, 5), target)
    assert _uses_rule(prog, "aten.cross_entropy_forward")      # log_softmax + nll_loss, saving log-probs
    t3 = torch.tensor([[1, 2], [0, 3]])
    prog = check_grad(lambda x, t: lnn.cross_entropy(x, t, reduction=reduction), _t(2, 5, 2), t3)
    assert _uses_rule(prog, "ltorch.cross_entropy")
    check_grad(lambda x, t: lnn.cross_entropy(x, t, reduction=reduction, label_smoothing=0.1), _t(4, 5),
               torch.tensor([1, 0, 4, 2]))


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa(causal):
    q, k, v = _t(2, 3, 4, 8), _t(2, 3, 5 if not causal else 4, 8, seed=1), _t(2, 3, 5 if not causal else 4, 8, seed=2)
    prog = check_grad(lambda q, k, v: lnn.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v)
    assert _uses_rule(prog, "aten.sdpa_flash_cpu")
    prog = check_grad(lambda q, k, v: lnn.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3),
                      q, k, _t(2, 3, k.shape[2], 8, seed=2, grad=False))
    assert _uses_rule(prog, "aten.sdpa_flash_cpu")
    prog = check_grad(lambda q, k, v: lnn.scaled_dot_product_attention(q, k, v, is_causal=causal), q[0], k[0], v[0])
    assert _uses_rule(prog, "ltorch.scaled_dot_product_attention")     # 3-d: not the flash kernel


def test_sdpa_masks():
    q, k, v = _t(2, 4, 8), _t(2, 5, 8, seed=1), _t(2, 5, 8, seed=2)
    bool_mask = torch.rand(4, 5, generator=torch.Generator().manual_seed(4)) > 0.3
    bool_mask[:, 0] = True
    check_grad(lambda q, k, v, m: lnn.scaled_dot_product_attention(q, k, v, m), q, k, v, bool_mask)
    check_grad(lambda q, k, v, m: lnn.scaled_dot_product_attention(q, k, v, m), q, k, v, _t(4, 5, seed=5))
    q4, k4, v4 = (t.detach().unsqueeze(0).requires_grad_() for t in (q, k, v))
    for causal in (False, True):
        prog = check_grad(lambda q, k, v, m: lnn.scaled_dot_product_attention(q, k, v, m, is_causal=causal),
                          q4, k4, v4, _t(1, 2, 4, 5, seed=5, grad=False))
        assert _uses_rule(prog, "aten.sdpa_flash_cpu")


@pytest.mark.parametrize("kw", [{}, {"padding_idx": 2}, {"padding_idx": -1, "scale_grad_by_freq": True}])
def test_embedding(kw):
    idx = torch.tensor([[0, 2, 2], [5, 1, 0]])
    prog = check_grad(lambda i, w: lnn.embedding(i, w, **kw), idx, _t(6, 4),
                      ref_fn=lambda i, w: F.embedding(i, w, **kw))
    assert _uses_rule(prog, "ltorch.embedding")


def test_conv2d_through_the_convolution_prim():
    check_grad(lambda x, w, b: lnn.conv2d(x, w, b, stride=2, padding=1), _t(2, 3, 7, 7), _t(4, 3, 3, 3, seed=1),
               _t(4, seed=2))
    check_grad(lambda x, w: lnn.conv1d(x, w, groups=2), _t(3, 4, 9), _t(4, 2, 3, seed=1))


def test_rule_saves_what_eager_saves():
    """layer_norm saves its inputs and the (small) mean and rstd, as eager does,
    never the normalized tensor."""
    x, w, b = _t(4, 8), _t(8, seed=1), _t(8, seed=2)
    prog = check_grad(lambda x, w, b: lnn.layer_norm(x, (8,), w, b), x, w, b)
    assert {p.name for p in prog.split.saved_tensors} <= {"a0", "a1", "a2"}
    assert [p.shape for p in prog.split.saved_other] == [(4, 1), (4, 1)]


@pytest.mark.parametrize("sym,kw", [(lnn.gelu, {}), (lnn.gelu, {"approximate": "tanh"}), (lnn.silu, {}),
                                    (ew.tanh, {}), (ew.sigmoid, {})])
def test_activation_kernels(sym, kw):
    prog = check_grad(lambda x: sym(x, **kw), _t(3, 5))
    assert _uses_rule(prog, sym.id)


def test_layer_norm_partial_grads():
    check_grad(lambda x, w, b: lnn.layer_norm(x, (8,), w, b), _t(2, 8), _t(8, seed=1, grad=False), _t(8, seed=2))
    check_grad(lambda x, w, b: lnn.layer_norm(x, (8,), w, b), _t(2, 8, grad=False), _t(8, seed=1), _t(8, seed=2))


@pytest.mark.parametrize("sizes,dim", [(2, 1), ([1, 3], 0), (3, -1)])
def test_split_is_one_cat(sizes, dim):
    prog = check_grad(lambda x: shapes.split(x, sizes, dim), _t(4, 6))
    assert _uses_rule(prog, "ltorch.split")
    prog = check_grad(lambda x: shapes.split(x, sizes, dim)[0], _t(4, 6))     # unused pieces get zeros
