"""User-facing tracebacks: an exception leaving interpret(...) names the user's
interpreted frames (a note, 3.11+) and not the interpreter's own frames.

Ground truth: the same function run natively by CPython; the note must list
the frames (function and line) CPython's own traceback lists, in order."""
from __future__ import annotations

import os
import re
import sys
import traceback

import pytest

from thunderlite.interpreter import InterpreterHooks, interpret
from thunderlite.interpreter.tracebacks import NOTE_HEADER

HAS_NOTES = sys.version_info >= (3, 11)
INTERPRETER_DIR = os.path.join("thunderlite", "interpreter") + os.sep
_FRAME_RE = re.compile(r'  File "(.*)", line (\d+), in (.*)')


def inner(x):
    y = x + 1
    raise ValueError(f"bad {y}")


def middle(x):
    return inner(x) * 2


def outer(x):
    z = middle(x)
    return z


def native_error(x):
    return int(x)


def calls_native(x):
    return native_error(x) + 1


class Holder:
    def __init__(self, x):
        self.value = calls_native(x)


def make_holder(x):
    return Holder(x).value


def with_block(x):
    with open(os.devnull) as fh:
        fh.read(0)
        middle(x)


def finally_block(x):
    try:
        middle(x)
    finally:
        x = None


def bare_reraise(x):
    try:
        middle(x)
    except ValueError:
        raise


def not_matching_except(x):
    try:
        middle(x)
    except KeyError as e:
        return e


def raise_from(x):
    try:
        middle(x)
    except ValueError as e:
        raise KeyError("wrapped") from e


def gen(n):
    yield from range(n)
    middle(n)


def iterate_generator(n):
    return sum(gen(n))


def comprehension(x):
    return [inner(v) for v in range(x)]


def lambda_and_nested(x):
    def helper(v):
        return (lambda w: middle(w))(v)
    return helper(x)


def recursive(n):
    if n == 0:
        return middle(n)
    return recursive(n - 1)


def raise_caught_again(x):
    try:
        middle(x)
    except ValueError as e:
        caught = e
    raise caught


def waiting():
    try:
        yield 1
    finally:
        pass


def throw_into_generator(x):
    g = waiting()
    next(g)
    g.throw(ValueError("thrown"))


class Manager:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def with_python_manager(x):
    with Manager():
        return middle(x)


_PROGRAMS = [raise_caught_again, throw_into_generator, with_python_manager, outer, make_holder, with_block,
             finally_block, bare_reraise, not_matching_except, raise_from, iterate_generator, comprehension,
             lambda_and_nested, recursive]
_ARGS = {make_holder: ("x",), iterate_generator: (2,), comprehension: (3,), recursive: (2,)}


def _line(fn, body_line: int) -> int:
    """The line number of the ``body_line``-th line of ``fn``'s body."""
    return fn.__code__.co_firstlineno + body_line


def _raise_natively(fn, args):
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 - compared below
        return e
    raise AssertionError(f"{fn.__name__} did not raise")


def _raise_interpreted(fn, args, hooks=None):
    try:
        interpret(fn, hooks)(*args)
    except BaseException as e:  # noqa: BLE001 - compared below
        return e
    raise AssertionError(f"{fn.__name__} did not raise under the interpreter")


def _native_user_frames(exc):
    """(name, line) of the user frames in CPython's own traceback of ``exc``."""
    frames = traceback.extract_tb(exc.__traceback__)
    return [(fs.name, fs.lineno) for fs in frames if fs.filename == __file__ and fs.name != "_raise_natively"]


def _noted_frames(exc):
    notes = [n for n in getattr(exc, "__notes__", ()) if n.startswith(NOTE_HEADER)]
    assert len(notes) == 1, notes
    return [(m.group(3), int(m.group(2))) for m in _FRAME_RE.finditer(notes[0]) if m.group(1) == __file__]


def _interpreter_entries(exc):
    return [fs for fs in traceback.extract_tb(exc.__traceback__) if INTERPRETER_DIR in fs.filename]


def _chain(exc):
    out = []
    while exc is not None:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


@pytest.mark.parametrize("fn", _PROGRAMS, ids=lambda f: f.__name__)
def test_note_lists_the_frames_cpython_lists(fn):
    args = _ARGS.get(fn, (1,))
    want, got = _raise_natively(fn, args), _raise_interpreted(fn, args)
    assert [type(e) for e in _chain(got)] == [type(e) for e in _chain(want)]
    assert [str(e) for e in _chain(got)] == [str(e) for e in _chain(want)]
    for w, g in zip(_chain(want), _chain(got), strict=True):
        if HAS_NOTES:
            assert _noted_frames(g) == _native_user_frames(w)
            assert not _interpreter_entries(g)
        else:
            assert not hasattr(g, "__notes__")
            assert [fs.name for fs in _interpreter_entries(g)] in ([], ["interpreted"])


def test_three_calls_deep_format_exception():
    exc = _raise_interpreted(outer, (1,))
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert text.startswith("Traceback (most recent call last):")
    assert "ValueError: bad 2" in text
    if HAS_NOTES:
        for name, line, source in (("outer", _line(outer, 1), "z = middle(x)"),
                                   ("middle", _line(middle, 1), "return inner(x) * 2"),
                                   ("inner", _line(inner, 2), 'raise ValueError(f"bad {y}")')):
            assert f'File "{__file__}", line {line}, in {name}\n    {source}' in text
        assert INTERPRETER_DIR not in text
        assert text.index("in outer") < text.index("in middle") < text.index("in inner")
    else:
        assert text.count(INTERPRETER_DIR) == 1  # the entry point, see tracebacks.py
    assert "run_frame" not in text and "call_py" not in text


def test_native_error_keeps_its_type_message_and_the_native_frame():
    want, got = _raise_natively(make_holder, ("x",)), _raise_interpreted(make_holder, ("x",))
    assert type(got) is type(want) and str(got) == str(want) and got.args == want.args
    if HAS_NOTES:
        assert [name for name, _ in _noted_frames(got)] == ["make_holder", "__init__", "calls_native",
                                                             "native_error"]


def caught_inside(x):
    try:
        middle(x)
    except ValueError as e:
        return e


def test_exception_caught_by_user_code_is_left_alone():
    want, got = caught_inside(1), interpret(caught_inside)(1)
    assert type(got) is type(want) and str(got) == str(want)
    assert not hasattr(got, "__notes__")
    assert _interpreter_entries(got)  # its native traceback is untouched


def test_interpreted_twice_gets_one_note_each_time():
    fn = interpret(outer)
    for _ in range(2):
        try:
            fn(1)
        except ValueError as e:
            if HAS_NOTES:
                assert len(e.__notes__) == 1
            continue
        raise AssertionError("outer did not raise")


class _NestedInterpret(InterpreterHooks):
    """Runs ``middle`` through a second, nested interpret(...) called natively."""

    def lookaside(self, fn):
        return interpret(middle) if fn is middle else None


def test_nested_interpret_call_adds_a_single_note():
    exc = _raise_interpreted(outer, (1,), _NestedInterpret())
    assert type(exc) is ValueError and str(exc) == "bad 2"
    if HAS_NOTES:
        assert _noted_frames(exc) == [("outer", _line(outer, 1)), ("middle", _line(middle, 1)),
                                      ("inner", _line(inner, 2))]
        assert len(exc.__notes__) == 1
