"""The places a program needs a traced value in Python, and how to get it.

The interpreter reaches them as calls into thunderlite's proxies (recorded by
``TracingHooks.recording``) that raise ``DataDependentError``: the truth
value, ``int()``, ``float()``, ``operator.index`` of a tensor or of a traced
number, a traced number's text (``str``, ``format``, f-strings), and as the
key of a list item (``lst[i]``, the interpreter's ``subscr_key``). For each,
``request`` says which trace values the split reads and the Python operation
that turns their run-time values into what the program gets (the same
operation eager runs, with eager's errors).
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core.proxies import NumberProxy, Proxy, TensorProxy
from thunderlite.core.symexpr import evaluate
from thunderlite.core.symint import SymInt
from thunderlite.torch.ops import numbers

# dunder -> what it is, for the split's reason
VALUE_METHODS = {
    "__bool__": "its truth value (if, while, and/or/not, bool())",
    "__int__": "int()",
    "__float__": "float()",
    "__complex__": "complex()",
    "__index__": "its use as an int (an index, a count)",
    "is_integer": ".is_integer()",
    "as_integer_ratio": ".as_integer_ratio()",
    "hex": ".hex()",
}
# a tensor's text, which the program's str()/repr()/format()/f-strings read (they do not raise)
TEXT_METHODS = {"__format__": "formatting", "__str__": "str()", "__repr__": "repr()"}
_OWNERS = (TensorProxy, NumberProxy, SymInt)

Request = tuple[list, Callable[[list], Any], str]
NOT_SPLIT = object()
"""What a split that cannot happen gives (the strict option, inside a composite or torch.func)."""


def request(fn: Callable, args: tuple, kwargs: dict) -> Request | None:
    """(values read, their run-time values -> the Python value, why) for a call
    that needs a traced value, or None for any other call."""
    if fn is numbers.as_text and args and not kwargs:
        x, spec = args[0], (args[1] if len(args) > 1 else "")
        asked, value = _reader(x)
        return asked, lambda vals: format(value(vals), spec), f"formatting {_name(x)} as text"
    name = getattr(fn, "__name__", None)
    if name in TEXT_METHODS and args and type(args[0]) is TensorProxy and not kwargs:
        x, rest = args[0], args[1:]
        return [x], lambda vals: getattr(vals[0], name)(*rest), f"{TEXT_METHODS[name]} of the tensor {x.name}"
    if name not in VALUE_METHODS or not args or kwargs or not isinstance(args[0], _OWNERS):
        return None
    owner = getattr(fn, "__qualname__", "").split(".")[0]
    if owner not in ("TensorProxy", "NumberProxy", "SymInt"):
        return None
    x, rest = args[0], args[1:]
    asked, value = _reader(x)
    return asked, lambda vals: getattr(value(vals), name)(*rest), f"{VALUE_METHODS[name]} of {_name(x)}"


def index_request(key: Any) -> Request | None:
    """``container[key]`` of a list, tuple, string or range with a traced key."""
    if not isinstance(key, _OWNERS) or (type(key) is SymInt and key.hint is not None):
        return None
    asked, value = _reader(key)
    return asked, lambda vals: operator.index(value(vals)), f"its use as an index of {_name(key)}"


def native_request(fn: Callable, args: tuple, kwargs: dict) -> Request | None:
    """A pure native function (``math.isclose``, ``range``) that needs the
    values of the traced numbers or tensors among its arguments: it runs on
    their run-time values, and its result is what the program gets."""
    flat = list(args) + list(kwargs.values())
    if not any(isinstance(a, _OWNERS) for a in flat):
        return None
    readers, asked = [], []
    for a in flat:
        if isinstance(a, _OWNERS) and not (type(a) is SymInt and a.hint is not None):
            got, value = _reader(a)
            readers.append((len(asked), len(got), value))
            asked += got
        else:
            readers.append(None)

    def compute(vals: list) -> Any:
        real = [a if r is None else r[2](vals[r[0]:r[0] + r[1]]) for a, r in zip(flat, readers, strict=True)]
        return fn(*real[:len(args)], **dict(zip(kwargs, real[len(args):], strict=True)))
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    return asked, compute, f"{getattr(fn, '__module__', None) or 'builtins'}.{name}() of traced values"


def size_request(e: Exception) -> Request | None:
    """An op that decides on sizes known only when the program runs
    (``x[i]`` of an ``item()``, broadcasting ``x[mask]`` against another
    size): the values of those sizes, which the program is then specialized
    to (``ShapeEnv.pin``)."""
    asked = list(getattr(e, "unbacked", None) or ())
    if not asked:
        return None
    names = ", ".join(p.name for p in asked)
    return asked, lambda vals: tuple(int(_number(v)) for v in vals), f"the sizes {names}, decided on in an op"


def _reader(x: Any) -> tuple[list[Proxy], Callable[[list], Any]]:
    """The trace values ``x`` is made of, and its run-time value from theirs."""
    if type(x) is SymInt:
        atoms = x.proxies()
        names = [p.name for p in atoms]
        expr = x.expr
        return atoms, lambda vals: evaluate(expr, {n: int(_number(v)) for n, v in zip(names, vals, strict=True)})
    if type(x) is NumberProxy:
        return [x], lambda vals: _number(vals[0])
    return [x], lambda vals: vals[0]


def _number(v: Any) -> Any:
    """A traced number's run-time value as the Python number it stands for."""
    return v.item() if isinstance(v, torch.Tensor) else v


def _name(x: Any) -> str:
    if type(x) is TensorProxy:
        return f"the tensor {x.name}"
    if type(x) is SymInt:
        return f"the traced int {x}"
    return f"the traced number {numbers.describe(x)}"
