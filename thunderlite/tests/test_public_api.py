"""The public names of ``thunderlite`` stay what they are, whatever order they
are imported or touched in: no submodule may shadow a public function (issue 15:
``thunderlite/jit.py`` once made ``thunderlite.jit`` a module)."""
from __future__ import annotations

import itertools
import subprocess
import sys
import types

import pytest

import thunderlite

PUBLIC = [n for n in thunderlite.__all__ if n != "__version__"]
FIRSTS = PUBLIC + ["import thunderlite.api", "import thunderlite.frontend.compile", "import thunderlite.report"]


def _program(first: str) -> str:
    touch = first if first.startswith("import ") else f"from thunderlite import {first}"
    return "\n".join([
        "import types, torch",
        touch,
        "import thunderlite",
        f"names = {PUBLIC!r}",
        "for n in names:",
        "    v = getattr(thunderlite, n)",
        "    assert not isinstance(v, types.ModuleType), (n, v)",
        "from thunderlite import jit, last_traces",
        "jf = thunderlite.jit(lambda a: a * 2)",
        "assert torch.equal(jf(torch.ones(2)), torch.full((2,), 2.0))",
        "assert last_traces(jf)",
    ])


@pytest.mark.parametrize("first", FIRSTS)
def test_public_names_survive_any_first_import(first):
    r = subprocess.run([sys.executable, "-c", _program(first)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_no_submodule_is_named_like_a_public_name():
    import pkgutil
    subs = {m.name for m in pkgutil.iter_modules(thunderlite.__path__)}
    assert not subs & set(PUBLIC), subs & set(PUBLIC)


def test_public_names_in_pairs_in_process():
    for a, b in itertools.permutations(["jit", "last_traces", "examine", "cache_info", "CACHE_MODES"], 2):
        va, vb = getattr(thunderlite, a), getattr(thunderlite, b)
        assert not isinstance(va, types.ModuleType) and not isinstance(vb, types.ModuleType)
    assert callable(thunderlite.jit)


def test_first_trace_does_not_import_sympy():
    """torch's symbolic-shape machinery (and sympy) cost seconds to import; a plain
    jitted model must not pull them in (torch.broadcast_shapes did)."""
    prog = ("import sys, torch, thunderlite\n"
            "m = thunderlite.jit(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.GELU(), torch.nn.LayerNorm(4)))\n"
            "m(torch.randn(2, 3)).sum().backward()\n"
            "assert 'sympy' not in sys.modules, [k for k in sys.modules if 'symbolic' in k]\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
