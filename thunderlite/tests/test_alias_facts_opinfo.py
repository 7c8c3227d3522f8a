"""The alias facts cover what eager does, for every op in PyTorch's OpInfo
database (float32, first sample, CPU): where eager returns an output sharing
storage with an input (a view, the input itself, ``contiguous`` of a contiguous
tensor, ``to`` to the same dtype...), the trace recorded for the same call puts
that output in the input's alias group (core/aliasing.py's ``views``, walked by
``AliasGroups``). A fact missing here is a write the alias model would not see.

Ops the torch language cannot record for the sample are left to the OpInfo
suites (test_opinfo.py), which hold them to account."""
from __future__ import annotations

import warnings

import pytest
import torch

from thunderlite.core import pytree
from thunderlite.core.proxies import TensorProxy
from thunderlite.tests.opinfo_harness import _clone, first_sample, is_random, op_db, record, tensors_of
from thunderlite.transforms.aliasing.update_aliases import AliasGroups

pytest.importorskip("expecttest", reason="torch's OpInfo database needs the expecttest package")


def _ops():
    return [op for op in op_db() if not is_random(op) and torch.float32 in op.supported_dtypes("cpu")]


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.numel() > 0 and b.numel() > 0 and \
            a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):     # sparse and other storage-less layouts
        return False


def _eager_aliases(op, sample) -> tuple[list[tuple[int, int]], int] | None:
    args, kwargs = _clone((sample.input, *sample.args)), _clone(sample.kwargs)
    ins = tensors_of(args, kwargs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = op.op(*args, **kwargs)
    except Exception:  # noqa: BLE001 - eager refuses the sample: nothing to compare
        return None
    outs = [o for o in pytree.leaves(out) if isinstance(o, torch.Tensor)]
    return [(i, j) for i, o in enumerate(outs) for j, t in enumerate(ins) if _shares(o, t)], len(outs)


def _name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@pytest.mark.parametrize("op", _ops(), ids=_name)
def test_eager_aliasing_is_in_the_alias_groups(op):
    sample = first_sample(op, torch.float32)
    if sample is None:
        pytest.skip("no sample")
    eager = _eager_aliases(op, sample)
    if eager is None or not eager[0]:
        return                                        # nothing aliases: nothing to cover
    pairs, n_outs = eager
    args, kwargs = _clone((sample.input, *sample.args)), _clone(sample.kwargs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trc = record(op.op, args, kwargs)
    except Exception as e:  # noqa: BLE001 - unsupported for this sample: test_opinfo.py reports it
        pytest.skip(f"not recorded: {type(e).__name__}")
    outs = [o for o in pytree.leaves(trc.output) if type(o) is TensorProxy]
    assert len(outs) == n_outs, f"{len(outs)} tensor outputs traced, eager made {n_outs}"
    groups = AliasGroups.of_trace(trc)
    missing = [(outs[i].name, trc.args[j].name) for i, j in pairs if not groups.same(outs[i].name, trc.args[j].name)]
    assert missing == [], f"eager aliases these (output, input) pairs but the trace does not know it:\n{trc}"
