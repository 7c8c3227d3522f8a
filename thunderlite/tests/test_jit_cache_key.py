"""The generated key functions: one per call signature, None for other
signatures, and every key element labelled for miss reasons."""
from __future__ import annotations

import torch

from thunderlite.frontend.caching.keys import alias_pattern, describe, make_key_fn, storage_groups


def _key_fn(args, kwargs=None, names=None):
    kwargs = kwargs or {}
    return make_key_fn(describe(args, kwargs), 0, names)


def test_key_covers_metadata_values_and_global_state():
    a, b = torch.randn(3), torch.randn(3)
    fn = _key_fn((a, b, 2), names=["a", "b", "k"])
    k1 = fn((a, b, 2), {})
    assert fn((torch.randn(3), torch.randn(3), 2), {}) == k1
    assert fn((a, b, 3), {}) != k1
    assert fn((torch.randn(4), b, 2), {}) != k1
    assert fn((a.double(), b, 2), {}) != k1
    with torch.no_grad():
        assert fn((a, b, 2), {}) != k1
    assert len(fn.labels) == len(k1) - 1
    assert "a.shape" in fn.labels and "k" in fn.labels and "grad mode" in fn.labels


def test_other_signature_gives_none_without_raising():
    a = torch.randn(3)
    fn = _key_fn((a, [a, 1]), {"flag": True})
    assert fn((a, [a, 1]), {"flag": True}) is not None
    assert fn((a, [a]), {"flag": True}) is None
    assert fn((a, (a, 1)), {"flag": True}) is None
    assert fn((a, [a, 1]), {}) is None
    assert fn((a, [a, 1]), {"other": True}) is None
    assert fn((1.0, [a, 1]), {"flag": True}) is None
    assert fn((a, [a, 1]), {"flag": 1}) is None


def test_storage_sharing_is_in_the_key():
    x = torch.randn(4)
    fn = _key_fn((x, x))
    assert fn((x, x), {}) != fn((x, torch.randn(4)), {})
    z = torch.randn(8)
    assert fn((z[:4], z[4:]), {}) == fn((x, x), {})
    y = torch.randn(6)
    fn3 = _key_fn((y, y, y))
    assert fn3((y, y[2:], torch.randn(6)), {}) != fn3((y, y, y), {})
    assert alias_pattern((5, 7, 5)) == (0, 1, 0)
    assert storage_groups([y, torch.randn(1), y[1:]]) == [[0, 2]]
