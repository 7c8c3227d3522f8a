"""Every in-place variant in PyTorch's OpInfo database (``op.inplace_variant``:
``Tensor.add_``, ``Tensor.clamp_``, ``Tensor.index_put_``...) through
``thunderlite.jit``, float32 on CPU: the result and every input afterwards
equal eager PyTorch. The sample is the first of the op's samples that eager
accepts in place (an in-place op cannot broadcast its first argument).

Known failures are xfail-strict with the reason, so a fix shows up as XPASS."""
from __future__ import annotations

import warnings

import pytest
import torch

import thunderlite
from thunderlite.tests.opinfo_harness import _clone, _fill_linecache, compare, is_random, op_db, tensors_of, tolerance

_KNOWN = {
}


def _name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _ops():
    out = []
    for op in op_db():
        if op.inplace_variant is None or is_random(op) or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        name = _name(op)
        marks = [pytest.mark.xfail(strict=True, reason=_KNOWN[name])] if name in _KNOWN else []
        out.append(pytest.param(op, id=name, marks=marks))
    return out


def _usable_sample(op):
    """The first sample eager runs in place (tries a few, in float32, then in
    float64 for ops such as ``float_power_`` that only write double tensors)."""
    for dtype in (torch.float32, torch.float64):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, s in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
                if i > 8:
                    break
                args, kwargs = (s.input, *s.args), dict(s.kwargs)
                try:
                    op.inplace_variant(*_clone(args), **_clone(kwargs))
                except Exception:  # noqa: BLE001 - eager refuses this sample in place; try the next
                    continue
                return args, kwargs, dtype
    return None


def _call_inplace(fn):
    def call(*args, **kwargs):
        return fn(*args, **kwargs)
    return call


@pytest.mark.parametrize("op", _ops())
def test_inplace_variant_matches_eager(op):
    sample = _usable_sample(op)
    assert sample is not None, f"{_name(op)}: no sample eager accepts in place"
    args, kwargs, dtype = sample
    eager_args, eager_kwargs = _clone(args), _clone(kwargs)
    expected = op.inplace_variant(*eager_args, **eager_kwargs)
    _fill_linecache()
    jit_args, jit_kwargs = _clone(args), _clone(kwargs)
    got = thunderlite.jit(_call_inplace(op.inplace_variant))(*jit_args, **jit_kwargs)
    atol, rtol = tolerance(op, dtype)
    compare(got, expected, atol, rtol)
    compare(tensors_of(jit_args, jit_kwargs), tensors_of(eager_args, eager_kwargs), atol, rtol)


def test_sweep_covers_the_in_place_database():
    assert len(_ops()) >= 130
