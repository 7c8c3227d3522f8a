"""OpInfo gradient sweep (CPU, float64): for every OpInfo that supports
autograd, the first sample's input gradients through ``make_differentiable``
against ``torch.autograd.grad`` in eager.

Verdicts per op:
- ``native``: thunderlite's own rules (no opaque op on the gradient path);
- ``fallback``: an opaque op got its gradient from PyTorch's autograd;
- ``both raise``: eager's backward raises and so does ours (as required);
- ``wrong``: outputs or gradients differ from eager's (must never happen);
- ``failing``: we raise where eager does not (the reason is recorded);
- ``skipped``: the sample is unusable (eager's forward fails, or no output is
  differentiable): the test skips with that reason.

CI runs the whole sweep (every OpInfo supporting autograd, ~540): ``wrong``
and ``failing`` fail the test unless the op is in ``XFAIL`` (strict: an op
that starts working must leave the list). Ops in ``EVERY_SAMPLE`` get the
same check on every sample (their first one misses a case). Regenerate the
full table with::

    python thunderlite/tests/test_opinfo_grad.py --write docs/opinfo_grad_coverage.md
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from opinfo_harness import op_db, record, tolerance, values_undefined

from thunderlite.core import pytree
from thunderlite.executors import compile_trace
from thunderlite.executors.autograd_function import make_differentiable

DTYPE = torch.float64

XFAIL: dict[str, str] = {
    "to_sparse": "sparse layouts are not supported (no sparse tensor proxies)",
    "sparse.sampled_addmm": "sparse layouts are not supported (no sparse tensor proxies)",
    "sparse.mm.reduce": "sparse layouts are not supported (no sparse tensor proxies)",
}
"""Ops whose gradient check fails today, each with the reason; strict xfails."""

EVERY_SAMPLE: dict[str, str] = {
    "combinations": "r above the length: eager's empty result is a stack of the input's selections, requiring grad",
}
"""Ops checked on every sample, each with the case only a later sample reaches."""


def grad_ops() -> list:
    return [op for op in op_db() if op.supports_autograd and DTYPE in op.supported_dtypes("cpu")]


def _sample(op):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return next(iter(op.sample_inputs("cpu", DTYPE, requires_grad=True)), None)


def _samples(op) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(op.sample_inputs("cpu", DTYPE, requires_grad=True))


def _fresh(x):
    """A detached copy of every tensor leaf, keeping requires_grad (new leaves)."""
    return pytree.tree_map(lambda t: t.detach().clone().requires_grad_(t.requires_grad)
                           if isinstance(t, torch.Tensor) else t, x)


def _grads(outs, inputs, gouts):
    wanted = [t for t in inputs if t.requires_grad]
    pairs = [(o, g) for o, g in zip(outs, gouts, strict=True) if o.requires_grad]
    return torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)


def _tensor_outs(out) -> list:
    return [o for o in pytree.leaves(out) if isinstance(o, torch.Tensor)]


def _eager(op, args, kwargs):
    args, kwargs = _fresh(args), _fresh(kwargs)
    inputs = [t for t in pytree.leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    torch.manual_seed(0)
    outs = _tensor_outs(op.op(*args, **kwargs))
    return inputs, outs


def _ours(op, args, kwargs):
    trc = record(op.op, args, kwargs)
    inputs = [t for t in pytree.leaves(_fresh((args, kwargs))) if isinstance(t, torch.Tensor)]
    program = make_differentiable(trc, [t.requires_grad for t in inputs], lambda t: compile_trace(t)[0])
    torch.manual_seed(0)
    outs = _tensor_outs(program(*inputs))
    return inputs, outs, program


def _opaque_on_path(program) -> bool:
    if program.split.mode == "eager":
        return True
    return any(b.sym.id == "autodiff.opaque_with_graph" for b in program.split.forward.bound_symbols)


def check(op, sample=None) -> tuple[str, str]:
    """(verdict, reason) for ``sample`` of ``op`` (default: the first float64 one)."""
    sample = _sample(op) if sample is None else sample
    if sample is None:
        return "failing", "no sample input"
    args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)
    try:
        e_in, e_out = _eager(op, args, kwargs)
    except Exception as e:  # noqa: BLE001 - eager's own failure: the sample is unusable
        return "skipped", f"eager forward fails: {type(e).__name__}"
    if not any(o.requires_grad for o in e_out):
        return "skipped", "no differentiable output in eager"
    gouts = [torch.randn(o.shape, dtype=o.dtype, generator=torch.Generator().manual_seed(7))
             if o.dtype.is_floating_point or o.dtype.is_complex else None for o in e_out]
    try:
        want = _grads(e_out, e_in, gouts)
        eager_error = None
    except Exception as e:  # noqa: BLE001
        want, eager_error = None, e
    try:
        o_in, o_out, program = _ours(op, args, kwargs)
        have = _grads(o_out, o_in, gouts) if len(o_out) == len(e_out) else None
    except Exception as e:  # noqa: BLE001 - reported in the table
        if eager_error is not None:
            return "both raise", f"eager: {_short(eager_error)}"
        return "failing", f"{type(e).__name__}: {_short(e)}"
    if eager_error is not None:
        return "wrong", f"eager raises ({_short(eager_error)}) but thunderlite does not"
    return _verdict(op, e_out, o_out, want, have, program)


def _verdict(op, e_out, o_out, want, have, program) -> tuple[str, str]:
    atol, rtol = tolerance(op, DTYPE)
    atol, rtol = max(atol, 1e-7), max(rtol, 1e-7)
    if have is None:
        return "wrong", f"{len(o_out)} outputs vs eager's {len(e_out)}"
    rnd = values_undefined(op) or _seed_dependent(op)
    for e, o in zip(e_out, o_out, strict=True):
        if e.requires_grad != o.requires_grad:
            return "wrong", f"requires_grad {o.requires_grad} where eager has {e.requires_grad}"
        if o.dtype != e.dtype or o.shape != e.shape:
            return "wrong", f"output metadata {o.dtype}{tuple(o.shape)} vs eager {e.dtype}{tuple(e.shape)}"
        if not rnd and not torch.allclose(o.detach(), e.detach(), atol=atol, rtol=rtol, equal_nan=True):
            return "wrong", "forward values differ"
    if not rnd:
        for w, h in zip(want, have, strict=True):
            w = torch.zeros((), dtype=DTYPE) if w is None else w
            h = torch.zeros((), dtype=DTYPE) if h is None else h
            if h.dtype != w.dtype or h.shape != w.shape and h.ndim and w.ndim:
                return "wrong", f"gradient metadata {h.dtype}{tuple(h.shape)} vs eager {w.dtype}{tuple(w.shape)}"
            if not torch.allclose(h, w, atol=atol, rtol=rtol, equal_nan=True):
                return "wrong", "gradients differ"
    return ("fallback", "opaque op differentiated by PyTorch autograd") if _opaque_on_path(program) else ("native", "")


def _seed_dependent(op) -> bool:
    """Random ops whose names do not say so: the OpInfo wraps them in
    ``wrapper_set_seed``, which reseeds at trace time, not at run time."""
    code = getattr(op.op, "__code__", None)
    return code is not None and "wrapper_set_seed" in code.co_names


def _short(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else repr(e))[:140].replace("|", "/")


def op_id(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _params() -> list:
    ops = grad_ops()
    unknown = set(XFAIL) - {op_id(op) for op in ops}
    assert not unknown, f"XFAIL names no grad OpInfo: {sorted(unknown)}"
    return [pytest.param(op, id=op_id(op), marks=pytest.mark.xfail(reason=XFAIL[op_id(op)], strict=True))
            if op_id(op) in XFAIL else pytest.param(op, id=op_id(op)) for op in ops]


@pytest.mark.parametrize("op", _params())
def test_opinfo_grad(op):
    """Gradients equal eager's, or both raise; a crash where eager works fails."""
    verdict, reason = check(op)
    if verdict == "skipped":
        pytest.skip(reason)
    assert verdict in ("native", "fallback", "both raise"), f"{verdict}: {reason}"


def _every_sample_params() -> list:
    ops = {op_id(op): op for op in grad_ops()}
    assert set(EVERY_SAMPLE) <= set(ops), f"EVERY_SAMPLE names no grad OpInfo: {sorted(set(EVERY_SAMPLE) - set(ops))}"
    return [pytest.param(ops[name], id=name) for name in EVERY_SAMPLE]


@pytest.mark.parametrize("op", _every_sample_params())
def test_opinfo_grad_every_sample(op):
    """Outputs (requires_grad, metadata, values) and gradients equal eager's on every sample."""
    checked = 0
    for i, sample in enumerate(_samples(op)):
        verdict, reason = check(op, sample)
        assert verdict in ("native", "fallback", "both raise", "skipped"), \
            f"sample {i} ({tuple(sample.input.shape)}, {sample.kwargs}): {verdict}: {reason}"
        checked += verdict != "skipped"
    assert checked, "no sample has a differentiable output"


def write_table(path: str) -> dict:
    rows, totals = [], {}
    for op in grad_ops():
        verdict, reason = check(op)
        totals[verdict] = totals.get(verdict, 0) + 1
        rows.append(f"| {op_id(op)} | {verdict} | {reason} |")
    ok = totals.get("native", 0) + totals.get("fallback", 0)
    head = [f"# OpInfo gradient coverage (CPU, {DTYPE}, first sample)", "",
            f"Regenerate: `python thunderlite/tests/test_opinfo_grad.py --write {path}`", "",
            f"OpInfos supporting autograd: {len(rows)}; gradients equal eager's: **{ok}** "
            f"(native {totals.get('native', 0)}, fallback {totals.get('fallback', 0)}); "
            f"both raise {totals.get('both raise', 0)}; skipped {totals.get('skipped', 0)}; "
            f"failing {totals.get('failing', 0)}; **wrong {totals.get('wrong', 0)}**", "",
            "| op | verdict | reason |", "| --- | --- | --- |"]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(head + rows) + "\n")
    return totals


if __name__ == "__main__":
    target = sys.argv[sys.argv.index("--write") + 1] if "--write" in sys.argv else "docs/opinfo_grad_coverage.md"
    print(write_table(target))
