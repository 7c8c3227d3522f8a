"""``torch._foreach_*`` while tracing: one op per list element.

The foreach ops (what ``optimizer.step(foreach=True)`` calls) apply one op to
lists of tensors; their schemas write whole lists (``Tensor(a!)[]``). Traced,
each becomes the per-tensor op for every element (``_foreach_mul_(xs, s)`` ->
``x.mul_(s)`` for each ``x``), recorded through the same lookasides as user
code, so writes, aliasing and fusion are those of ordinary in-place ops.

Arguments are broadcast per element: a list gives its i-th item, a 1-D tensor
standing for a list of scalars (``step_size`` of Adam's foreach path, built by
``torch.stack``) its i-th element, anything else is passed as is.

Example::

    run = foreach_lookaside(torch._foreach_add_, hooks.lookaside)
    run([a, b], [ga, gb], alpha=-0.1)   # records a.add_(ga, alpha=-0.1); b.add_(gb, alpha=-0.1)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core.proxies import TensorProxy

PREFIX = "_foreach_"
# ops whose scalar argument may be a tensor of per-element scalars: eager's per-tensor
# method takes a Number there, so ``x + value * (a op b)`` is recorded instead
_SCALED = {"addcdiv": "div", "addcmul": "mul"}


def foreach_functions() -> list[Callable]:
    """Every ``torch._foreach_*`` callable of this torch."""
    return [getattr(torch, n) for n in dir(torch) if n.startswith(PREFIX) and callable(getattr(torch, n))]


def foreach_lookaside(fn: Callable, lookaside: Callable[[Callable], Callable | None]) -> Callable:
    """The per-element recording of foreach op ``fn`` (see the module docstring)."""
    op = fn.__name__[len(PREFIX):]
    inplace = op.endswith("_")
    base = op.rstrip("_")

    def run(*args, **kwargs):
        n = _length(args)
        outs = []
        for i in range(n):
            a = [_at(x, i, n, lookaside) for x in args]
            kw = {k: _at(v, i, n, lookaside) for k, v in kwargs.items()}
            outs.append(_one(base, inplace, a, kw, lookaside))
        return None if inplace else outs
    run.__name__ = fn.__name__
    return run


def _length(args: tuple) -> int:
    for a in args:
        if isinstance(a, (list, tuple)):
            return len(a)
    raise TypeError("a torch._foreach_* op needs a list of tensors")


def _at(x: Any, i: int, n: int, lookaside) -> Any:
    if isinstance(x, (list, tuple)):
        return x[i]
    if type(x) is TensorProxy and len(x.shape) == 1 and x.shape[0] == n and n > 1:
        return _call(torch.Tensor.__getitem__, lookaside, (x, i), {})     # a tensor of per-element scalars
    return x


def _call(fn: Callable, lookaside, args, kwargs) -> Any:
    rec = lookaside(fn)
    if rec is None:
        raise NotImplementedError(f"thunderlite cannot trace {fn.__qualname__}, used by a torch._foreach_* op")
    return rec(*args, **kwargs)


def _one(base: str, inplace: bool, a: list, kw: dict, lookaside) -> Any:
    if base in _SCALED:
        value = kw.pop("value", a[3] if len(a) > 3 else 1)
        if type(value) is TensorProxy:
            x, t1, t2 = a[:3]
            term = _call(getattr(torch.Tensor, _SCALED[base]), lookaside, (t1, t2), {})
            term = _call(torch.Tensor.mul, lookaside, (term, value), {})
            return _call(torch.Tensor.add_ if inplace else torch.Tensor.add, lookaside, (x, term), {})
        a, kw = a[:3], dict(kw, value=value)
    if base == "copy":
        return _call(torch.Tensor.copy_, lookaside, a, kw)
    if inplace:
        method = getattr(torch.Tensor, base + "_", None)
        if method is None and getattr(torch, base, None) is not None:
            # no in-place method (``_foreach_maximum_``, AdamW's amsgrad): the function's result copied in
            return _call(torch.Tensor.copy_, lookaside, (a[0], _call(getattr(torch, base), lookaside, a, kw)), {})
        if method is None:
            raise NotImplementedError(f"torch._foreach_{base}_ has no per-tensor in-place method to trace")
        return _call(method, lookaside, a, kw)
    fn = getattr(torch, base, None)
    if fn is None:
        raise NotImplementedError(f"torch._foreach_{base} has no per-tensor function to trace")
    return _call(fn, lookaside, a, kw)
