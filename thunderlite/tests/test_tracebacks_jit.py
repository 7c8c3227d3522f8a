"""Tracebacks of errors raised while thunderlite.jit traces user code (issue 3):
the user's frames in one note, none of the interpreter's frames."""
from __future__ import annotations

import os
import sys
import traceback

import pytest
import torch

import thunderlite

INTERPRETER_DIR = os.path.join("thunderlite", "interpreter") + os.sep
needs_notes = pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11+")


def inner(x):
    if x.shape[0] == 3:
        raise ValueError(f"bad batch {x.shape[0]}")
    return x


def middle(x):
    return inner(x * 2) + 1


def outer(x):
    return middle(x).sum()


def bad_matmul(x):
    return middle(x) @ torch.ones(5, 5)


def _error(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - compared by the callers
        return e
    raise AssertionError(f"{fn.__name__} did not raise")


@needs_notes
def test_user_error_three_calls_deep_names_the_user_frames():
    x = torch.ones(3, 4)
    want, got = _error(outer, x), _error(thunderlite.jit(outer), x)
    assert type(got) is type(want) and str(got) == str(want)
    text = "".join(traceback.format_exception(type(got), got, got.__traceback__))
    assert INTERPRETER_DIR not in text
    for fn, source in ((outer, "return middle(x).sum()"), (middle, "return inner(x * 2) + 1"),
                       (inner, 'raise ValueError(f"bad batch {x.shape[0]}")')):
        line = next(i for i, s in enumerate(open(__file__).read().splitlines(), 1)
                    if s.strip() == source)
        assert f'File "{__file__}", line {line}, in {fn.__name__}\n    {source}' in text
    assert len(got.__notes__) == 1


@needs_notes
def test_tracing_error_gets_one_note_naming_the_line():
    got = _error(thunderlite.jit(bad_matmul), torch.ones(2, 4))
    assert isinstance(got, RuntimeError) and "cannot be multiplied" in str(got)
    assert len(got.__notes__) == 1
    note = got.__notes__[0]
    assert "in bad_matmul\n    return middle(x) @ torch.ones(5, 5)" in note
    assert not any(INTERPRETER_DIR in fs.filename for fs in traceback.extract_tb(got.__traceback__))
