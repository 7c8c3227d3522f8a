"""OpInfo failures that were bugs (issue 15), every sample of each op in float32
and float64, through ``thunderlite.jit`` with gradients, against eager:
outputs, their ``requires_grad``, and input gradients. The grad sweep's own
harness (record + make_differentiable) is also run for the ops it failed on."""
from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("expecttest", reason="torch's OpInfo database needs the expecttest package")

import thunderlite
from thunderlite.core import pytree
from thunderlite.tests.opinfo_harness import op_db, tolerance

# (op name, variant) -> which samples (None: all)
FIXED = {
    ("mean", ""): None,                                   # 0-d input with dim=0 / -1: IndexError
    ("nn.functional.batch_norm", ""): None,               # 1-d empty input in training: IndexError
    ("take_along_dim", ""): None,                         # broadcasting outside dim; negative indices' grad
    ("tensordot", ""): None,                              # contracted dims of size 1 broadcast
    ("gather", ""): None,                                 # empty uint8 index (eager accepts any dtype)
    ("nn.functional.linear", ""): None,                   # zero-size batch: gradient
    ("nn.functional.pad", "replicate_negative"): None,    # crops larger than the input
    ("norm", ""): lambda s: 0 in s.args,                  # p=0: result requires grad as in eager
    ("linalg.norm", ""): lambda s: 0 in s.args,
}


def _fresh(x):
    return pytree.tree_map(lambda t: t.detach().clone().requires_grad_(t.requires_grad)
                           if isinstance(t, torch.Tensor) else t, x)


def _run(fn, args, kwargs):
    args, kwargs = _fresh(args), _fresh(kwargs)
    inputs = [t for t in pytree.leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    outs = [t for t in pytree.leaves(fn(*args, **kwargs)) if isinstance(t, torch.Tensor)]
    return inputs, outs


def _check_sample(op, dtype, sample):
    args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)
    try:
        e_in, e_out = _run(op.op, args, kwargs)
    except Exception:  # noqa: BLE001 - eager refuses this sample: nothing to compare
        return
    j_in, j_out = _run(thunderlite.jit(op.op), args, kwargs)
    atol, rtol = tolerance(op, dtype)
    assert len(j_out) == len(e_out)
    for e, j in zip(e_out, j_out, strict=True):
        assert j.requires_grad == e.requires_grad
        torch.testing.assert_close(j.detach(), e.detach(), atol=atol, rtol=rtol, equal_nan=True)
    pairs = [(e, j) for e, j in zip(e_out, j_out, strict=True) if e.requires_grad]
    if not pairs or not e_in:
        return
    gouts = [torch.randn(e.shape, dtype=e.dtype, generator=torch.Generator().manual_seed(3)) for e, _ in pairs]
    want = torch.autograd.grad([e for e, _ in pairs], e_in, gouts, allow_unused=True)
    have = torch.autograd.grad([j for _, j in pairs], j_in, gouts, allow_unused=True)
    for w, h in zip(want, have, strict=True):
        if w is None:       # eager's graph gives no gradient; ours may give zeros
            assert h is None or not h.any()
            continue
        torch.testing.assert_close(h, w, atol=10 * atol, rtol=10 * rtol, equal_nan=True)


def _params():
    for op in op_db():
        key = (op.name, op.variant_test_name)
        if key in FIXED:
            for dtype in (torch.float32, torch.float64):
                test_id = f"{op.name}.{op.variant_test_name}-{dtype}".replace(".-", "-")
                yield pytest.param(op, dtype, FIXED[key], id=test_id)


@pytest.mark.parametrize("op, dtype, keep", _params())
def test_fixed_op_every_sample_with_grad(op, dtype, keep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = [s for s in op.sample_inputs("cpu", dtype, requires_grad=True) if keep is None or keep(s)]
    assert samples
    for s in samples:
        _check_sample(op, dtype, s)


def test_polygamma_inplace_matches_eager():
    x = torch.rand(6, dtype=torch.float64) + 0.5
    for n in (0, 1, 3):
        a, b = x.clone(), x.clone()
        thunderlite.jit(lambda t: t.polygamma_(n))(a)
        b.polygamma_(n)
        torch.testing.assert_close(a, b)
    w = (torch.rand(4, dtype=torch.float64) + 0.5).requires_grad_()

    def f(t):
        y = t * 2
        y.polygamma_(1)
        return y.sum()
    f(w).backward()
    want, w.grad = w.grad, None
    thunderlite.jit(f)(w).backward()
    torch.testing.assert_close(w.grad, want)


def test_norm_p0_counts_like_eager_with_nan_and_inf():
    x = torch.tensor([0.0, 1.0, math.nan, math.inf, -2.0], requires_grad=True)
    for fn in (lambda t: torch.linalg.vector_norm(t, 0), lambda t: torch.norm(t, 0)):
        out = thunderlite.jit(fn)(x)
        assert out.requires_grad and out.item() == fn(x).item() == 4.0


def test_masked_reductions_in_the_grad_sweep_harness():
    sys.path.insert(0, str(Path(__file__).parent))
    import test_opinfo_grad as grad_sweep
    ops = [op for op in grad_sweep.grad_ops() if op.name in ("masked.mean", "masked.var", "masked.std")]
    assert len(ops) == 3
    assert [grad_sweep.check(op)[0] for op in ops] == ["native"] * 3
