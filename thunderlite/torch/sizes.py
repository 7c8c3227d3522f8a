"""Sizes known only when the program runs: unbacked symbols and the checks of
what a trace assumed about them.

An *unbacked* int is a trace value with no traced value to decide on
(core/symint.py): the length of ``x[x > 0]`` (``unbacked``, never negative)
or an ``item()`` of an int tensor (``as_unbacked``, of unknown sign). Where
torch itself would check a size (``narrow``'s ``start + length <= size``) or
where the trace assumes one (an ``item()`` used as a size is not negative),
the question cannot be answered while tracing; ``expect_size`` then records
``ltorch.check_size`` (raises when the program runs if the fact is false) and
tells the ShapeEnv the fact, so later questions about it are answered. Both
check symbols carry ``Tag.SIZE_CHECK``: a composite calling one is recorded
as its decomposition, so the check runs even where an executor would run the
composite as one torch call, and after the value it reads is defined.
"""
from __future__ import annotations

import operator

from thunderlite.core import prims
from thunderlite.core.prims import check
from thunderlite.core.proxies import NumberProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.symint import ShapeEnv, SymInt, active_env, assume, hint_of, statically_known
from thunderlite.core.tags import Tag
from thunderlite.core.tracectx import current_trace
from thunderlite.torch.registry import register_leaf

_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
        ">": operator.gt, ">=": operator.ge}


def shape_env() -> ShapeEnv:
    """The active ShapeEnv (every jit compile has one); for a trace built by
    hand, one kept with that trace."""
    env = active_env()
    if env is not None:
        return env
    trc = current_trace()
    check(trc is not None, lambda: "a data-dependent size needs an active trace")
    env = getattr(trc, "shape_env", None)
    if env is None:
        env = trc.shape_env = ShapeEnv()
    return env


def _at() -> str:
    trc = current_trace()
    src = getattr(trc, "source", None)
    return f" at {src[0]}:{src[1]}" if src else ""


def unbacked(what: str, lower: int | None = 0) -> tuple[NumberProxy, SymInt]:
    """A new run-time int (its proxy, named ``u<N>``, and the symbol for it)."""
    proxy = NumberProxy(None, int, name=current_trace().fresh_name("u"))
    return proxy, shape_env().unbacked_symbol(proxy, f"{what}{_at()}", lower)


def as_unbacked(proxy: NumberProxy, what: str) -> SymInt:
    """An int the trace computes (``prims.item``) as a symbol of unknown sign.
    Used as a size (``torch.zeros(n)``, ``x[:n]``), it is assumed non-negative
    and the program checks that when it runs (``check_nonnegative``)."""
    env = shape_env()
    env.assume_hook = _record_size_check
    return env.unbacked_symbol(proxy, f"{what}{_at()}", None)


def item_int(a) -> SymInt:
    """The int in a one-element int tensor (``start`` of ``narrow``), unbacked."""
    return as_unbacked(prims.item(a), f"{a.name}.item()")


def _check_nonnegative_impl(n, what):
    if n < 0:
        raise RuntimeError(f"{what} is {n}, but the program uses it as a size (it was traced assuming it is not "
                           "negative)")


check_nonnegative = register_leaf(Symbol("check_nonnegative", meta=lambda n, what: None, module="ltorch",
                                  tags={Tag.DONT_DCE, Tag.SIZE_CHECK}, torch_fn=_check_nonnegative_impl))
"""``check_nonnegative(n, what)``: raises when ``n`` is negative (an assumption the trace made)."""


def _record_size_check(proxy: NumberProxy, origin: str) -> None:
    check_nonnegative(proxy, origin)


def _check_size_impl(lhs, op, rhs, message, error):
    if not _OPS[op](lhs, rhs):
        raise error(f"{message} (when the program ran: {lhs} {op} {rhs} is false)")


check_size = register_leaf(Symbol("check_size", meta=lambda lhs, op, rhs, message, error: None, module="ltorch",
                                  tags={Tag.DONT_DCE, Tag.SIZE_CHECK}, torch_fn=_check_size_impl))
"""``check_size(lhs, op, rhs, message, error)``: raises ``error`` when ``lhs op rhs``
(ints) is false: a size check of torch's the trace could not make."""


def expect_size(lhs, op: str, rhs, message: str, error: type = RuntimeError) -> None:
    """``lhs op rhs`` of sizes must hold (torch's own check, raising ``error``):
    checked now when tracing can decide it, else when the program runs, and
    known from here on."""
    ok = statically_known(lhs, op, rhs)
    if ok is None and (hint_of(lhs) is None or hint_of(rhs) is None):
        assume(lhs, op, rhs)                # not the item()-as-a-size assumption: torch's own message
        check_size(lhs, op, rhs, message, error)
        return
    check(ok if ok is not None else _OPS[op](lhs, rhs), lambda: message, error)
