"""Every registered program returns (or raises) the same interpreted as natively."""
from __future__ import annotations

import sys

import interp_prog_basic  # noqa: F401  (registers programs)
import pytest
from interp_harness import PROGRAMS, check, program_ids

from thunderlite.interpreter import InterpreterHooks

for _name in ("interp_prog_calls", "interp_prog_classes", "interp_prog_edge", "interp_prog_exceptions",
              "interp_prog_generators", "interp_prog_stdlib", "interp_prog_match"):
    try:
        __import__(_name)
    except ModuleNotFoundError as e:  # a program module not written yet
        if e.name != _name:
            raise
if sys.version_info >= (3, 11):
    import interp_prog_py311  # noqa: F401  (except*, exception groups)
if sys.version_info >= (3, 12):
    import interp_prog_py312  # noqa: F401  (type parameter syntax)


@pytest.mark.parametrize("entry", PROGRAMS, ids=program_ids(PROGRAMS))
def test_program(entry):
    fn, args, kwargs = entry
    check(fn, args, kwargs)


class PassThrough(InterpreterHooks):
    """Every hook overridden but transparent: forces the lookaside/hook paths everywhere."""

    def lookaside(self, fn):
        return None

    def load_global(self, globals_dict, name, value):
        return value

    def store_global(self, globals_dict, name, value):
        return False

    def load_attr(self, obj, name, value):
        return value

    def store_attr(self, obj, name, value):
        return False

    def delete_attr(self, obj, name):
        return False

    def load_subscr(self, container, key, value):
        return value

    def store_subscr(self, container, key, value):
        return False

    def delete_subscr(self, container, key):
        return False

    def load_deref(self, cell, value):
        return value


@pytest.mark.parametrize("entry", PROGRAMS, ids=program_ids(PROGRAMS))
def test_program_with_transparent_hooks(entry):
    fn, args, kwargs = entry
    check(fn, args, kwargs, hooks=PassThrough())


def test_enough_programs():
    assert len(PROGRAMS) >= 300, len(PROGRAMS)
