"""The interpreter's instruction reader (interpreter/instructions.py) gives what
``dis.get_instructions`` gives, on every code object of a sample of the
standard library and of the interpreter's own test programs."""
from __future__ import annotations

import dis
import importlib
import inspect
import types

import pytest

from thunderlite.interpreter.instructions import instructions

MODULES = ["argparse", "asyncio.tasks", "collections", "dataclasses", "enum", "functools", "inspect", "json.decoder",
           "typing", "contextlib", "statistics", "string", "textwrap", "ast", "shutil", "tarfile",
           "thunderlite.tests.interpreter.interp_prog_basic", "thunderlite.tests.interpreter.interp_prog_classes",
           "thunderlite.tests.interpreter.interp_prog_edge", "thunderlite.tests.interpreter.interp_prog_exceptions",
           "thunderlite.tests.interpreter.interp_prog_generators", "thunderlite.tests.interpreter.interp_prog_match",
           "thunderlite.tests.interpreter.interp_prog_stdlib"]


def _codes(code: types.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _same(a, b) -> bool:
    return a is b or a == b or repr(a) == repr(b)      # NaN constants, dis.UNKNOWN


@pytest.mark.parametrize("name", MODULES)
def test_instructions_match_dis(name):
    module = importlib.import_module(name)
    top = compile(inspect.getsource(module), module.__file__, "exec")
    n = 0
    for code in _codes(top):
        want = [(d.offset, d.opcode, d.opname, d.arg, d.argval) for d in dis.get_instructions(code)
                if d.opname != "CACHE"]
        got = instructions(code)
        assert len(got) == len(want), code
        for g, w in zip(got, want, strict=True):
            assert g[:4] == w[:4] and _same(g[4], w[4]), (code, g, w)
        n += len(got)
    assert n > 100
