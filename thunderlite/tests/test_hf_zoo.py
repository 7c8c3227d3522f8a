"""The HF architectures of ``benchmarks/bench_models.py`` (decoders with and
without grouped-query attention and sliding windows, a mixture of experts,
encoders, encoder-decoders, a vision transformer), tiny random configs: a
jitted model's loss, logits and every gradient equal eager's, over two calls."""
from __future__ import annotations

import copy
import importlib.util
import pathlib

import pytest
import torch

import thunderlite

pytest.importorskip("transformers")

_PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_models.py"
_spec = importlib.util.spec_from_file_location("bench_models", _PATH)
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_model_equals_eager(name):
    torch.manual_seed(0)
    base, make_batch = zoo.MODELS[name](zoo.SIZES["tiny"])
    base.train()
    batch = make_batch(torch)
    ref, model = copy.deepcopy(base), copy.deepcopy(base)
    jm = thunderlite.jit(model)
    want = zoo._results(ref, zoo._step(ref, batch))
    for call in range(2):
        got = zoo._results(model, zoo._step(jm, batch))
        assert zoo._check(f"{name}, call {call}", got, want, atol=1e-4, rtol=1e-4) == ""
