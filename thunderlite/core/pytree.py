"""Flattening nested Python containers of values (args, kwargs, outputs).

Only the containers that appear in traces: tuple, list, dict, torch.Size and
slice. Kept tiny and fast because passes call it on every bound symbol."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def leaves(x: Any) -> Iterator[Any]:
    """Yield the leaves of ``x`` depth-first, in order (tuples and their subclasses
    such as namedtuples and torch.Size, lists, dicts, slices are containers)."""
    out: list = []
    _collect(x, out)
    return iter(out)


def leaf_list(x: Any, out: list | None = None) -> list:
    """The leaves of ``x`` (as ``leaves``) appended to ``out`` (a new list by default)."""
    out = [] if out is None else out
    _collect(x, out)
    return out


def _collect(x: Any, out: list) -> None:
    # exact type checks first and no hasattr: a leaf is usually a proxy, whose
    # missing-attribute lookup goes through the (slow) torch attribute fallback
    t = type(x)
    if t is tuple or t is list:
        for y in x:
            ty = type(y)
            if ty is tuple or ty is list or ty is dict or ty is slice or isinstance(y, (tuple, list)):
                _collect(y, out)
            else:
                out.append(y)
    elif t is dict:
        for y in x.values():
            _collect(y, out)
    elif t is slice:
        _collect(x.start, out)
        _collect(x.stop, out)
        _collect(x.step, out)
    elif isinstance(x, (tuple, list)):
        for y in x:
            _collect(y, out)
    else:
        out.append(x)


def tree_map(fn, x: Any) -> Any:
    """Rebuild ``x`` with every leaf replaced by ``fn(leaf)``."""
    t = type(x)
    if t is tuple:
        return tuple(tree_map(fn, y) for y in x)
    if t is list:
        return [tree_map(fn, y) for y in x]
    if t is dict:
        return {k: tree_map(fn, v) for k, v in x.items()}
    if t is slice:
        return slice(tree_map(fn, x.start), tree_map(fn, x.stop), tree_map(fn, x.step))
    if isinstance(x, tuple):
        if hasattr(x, "_fields"):
            return t(*(tree_map(fn, y) for y in x))
        return t(tree_map(fn, y) for y in x)
    return fn(x)
