"""Registry of test programs and the comparison of interpreted against native runs."""
from __future__ import annotations

import copy

from thunderlite.interpreter import interpret

PROGRAMS = []


def program(*args, **kwargs):
    """Register fn to be run as fn(*args, **kwargs) natively and interpreted."""

    def register(fn):
        PROGRAMS.append((fn, args, kwargs))
        return fn

    return register


def cases(*arg_tuples):
    """Register fn once per argument tuple."""

    def register(fn):
        for a in arg_tuples:
            PROGRAMS.append((fn, a, {}))
        return fn

    return register


def outcome(fn, args, kwargs):
    args = copy.deepcopy(args)
    kwargs = copy.deepcopy(kwargs)
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 - compare type and message
        return ("raise", type(e), str(e))


def check(fn, args=(), kwargs=None, hooks=None):
    kwargs = kwargs or {}
    expected = outcome(fn, args, kwargs)
    actual = outcome(interpret(fn, hooks), args, kwargs)
    assert actual == expected, f"{fn.__qualname__}: interpreted {actual!r} != native {expected!r}"
    return actual


def program_ids(entries):
    """Stable ids (the same in every xdist worker): module.name-k."""
    seen = {}
    out = []
    for fn, _, _ in entries:
        key = f"{fn.__module__.replace('interp_prog_', '')}.{fn.__name__}"
        k = seen.get(key, 0)
        seen[key] = k + 1
        out.append(f"{key}-{k}")
    return out
