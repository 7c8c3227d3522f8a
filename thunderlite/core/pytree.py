"""Flattening nested Python containers of values (args, kwargs, outputs).

Only the containers that appear in traces: tuple, list, dict, torch.Size and
slice. Kept tiny and fast because passes call it on every bound symbol."""
from __future__ import annotations

from typing import Any, Iterator


def leaves(x: Any) -> Iterator[Any]:
    """Yield the leaves of ``x`` depth-first, in order."""
    t = type(x)
    if t is tuple or t is list or (isinstance(x, tuple) and not hasattr(x, "_fields")) or isinstance(x, list):
        for y in x:
            yield from leaves(y)
    elif t is dict:
        for y in x.values():
            yield from leaves(y)
    elif t is slice:
        yield from leaves(x.start)
        yield from leaves(x.stop)
        yield from leaves(x.step)
    elif hasattr(x, "_fields") and isinstance(x, tuple):
        for y in x:
            yield from leaves(y)
    else:
        yield x


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
