"""Fixtures shared by the test files: a one-rank process group (gloo over a
file store, no port) for tests that trace collectives in-process. Tiering is
off by default in the suite (``pytest_configure``).

torch is imported inside the fixture: this conftest is also loaded by the
torch-free interpreter suite that CI runs under Python 3.10, 3.12 and 3.13."""
from __future__ import annotations

import contextlib
import datetime
import importlib.util
import os
import tempfile

import pytest


def pytest_configure(config):
    """Tiering (frontend/caching/tiers.py) is off unless a test turns it on
    (``jit(fn, tiering=N)``, test_tiering.py): with the library's default, a
    test calling a jitted function 20 times would compile Inductor regions in
    the background and swap them in halfway through its checks."""
    if importlib.util.find_spec("torch") is None:
        return          # the interpreter's suite, without torch
    from thunderlite.frontend.caching import tiers
    tiers.DEFAULT_POLICY = None


@contextlib.contextmanager
def one_rank(backend: str = "gloo"):
    """A one-rank process group, destroyed after (skips when one is up already)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group(backend, init_method=f"file://{os.path.join(d, 'store')}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=30))
        try:
            yield
        finally:
            dist.destroy_process_group()


@pytest.fixture
def one_rank_group():
    with one_rank():
        yield
