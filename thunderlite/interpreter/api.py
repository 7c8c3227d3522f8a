"""The public entry point: interpret(fn, hooks)(*args, **kwargs)."""
from __future__ import annotations

import functools

from . import emulate, iteration  # noqa: F401  (register the builtin emulators)
from .calls import call_no_lookaside
from .frame import Runtime, thread_state
from .hooks import InterpreterHooks
from .tables import current_table
from .tracebacks import make_user_facing

_DEFAULT_HOOKS = InterpreterHooks()


def interpret(fn, hooks=None):
    """A callable that runs ``fn`` in the interpreter and returns exactly what fn returns.

    Python functions, methods, ``__call__`` objects and partials are interpreted
    recursively; builtins run natively. ``hooks`` (an InterpreterHooks) sees calls,
    globals, attributes, subscripts and cells along the way.

    Example::

        def f(x):
            return [i * x for i in range(3)]

        assert interpret(f)(2) == [0, 2, 4]
    """
    rt = Runtime(hooks if hooks is not None else _DEFAULT_HOOKS, current_table())

    @functools.wraps(fn)
    def interpreted(*args, **kwargs):
        try:
            return call_no_lookaside(rt, fn, args, kwargs)
        except BaseException as e:
            if not thread_state().frames:  # leaving the outermost interpreted call
                make_user_facing(e)
            raise

    return interpreted


def call_past_lookaside(fn, args: tuple, kwargs: dict | None = None):
    """``fn(*args, **kwargs)`` as the innermost interpreted frame calls it, minus
    the lookaside: for a lookaside that takes only some calls of ``fn`` (the
    jit's ``max`` on traced numbers) and hands the others back, so they still
    get the interpreter's emulation (``max(xs, key=f)`` with ``f`` interpreted)."""
    frames = thread_state().frames
    if not frames:
        return fn(*args, **(kwargs or {}))
    return call_no_lookaside(frames[-1].rt, fn, args, kwargs)
