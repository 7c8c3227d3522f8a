"""Builtins that consume iterables, run through the interpreter's iteration protocol.

Natively, ``zip(obj, ...)``, ``list(obj)``, ``sum(obj)`` or ``itertools.chain(obj)``
call ``type(obj).__iter__`` and ``__next__`` from C: a Python ``__iter__`` (a
container class's, a generator's body) would then run without the hooks, and
the items it reads (a module list's entries) would reach the program as the
hooks never saw them. Emulated, each iterable argument is wrapped in an
``InterpretedIterator``, whose steps are the interpreter's ``GET_ITER`` and
``FOR_ITER`` (Python code interpreted, hooks firing), and each callback is
interpreted (``wrap_callback``). Built-in containers iterate natively: no user
code runs there.

Example::

    for a, b in zip(obj.items, other):   # obj.items.__iter__ is interpreted
        ...
"""
from __future__ import annotations

import builtins
import functools
import itertools

from .calls import EMULATORS, call, wrap_callback
from .operators import EXHAUSTED, get_iter, next_or_exhausted

_NATIVE = (list, tuple, dict, set, frozenset, str, bytes, bytearray, range, type({}.keys()), type({}.values()),
           type({}.items()))


class InterpretedIterator:
    """A native iterator stepping ``iterable`` the way interpreted code would."""

    __slots__ = ("rt", "it")

    def __init__(self, rt, iterable):
        self.rt = rt
        self.it = get_iter(rt, iterable)

    def __iter__(self):
        return self

    def __next__(self):
        v = next_or_exhausted(self.rt, self.it)
        if v is EXHAUSTED:
            raise StopIteration
        return v


def iterated(rt, x):
    """``x`` as native code should iterate it: itself for built-in containers."""
    return x if type(x) in _NATIVE else InterpretedIterator(rt, x)


def _emulate(fn, em):
    if fn in EMULATORS:
        raise ValueError(f"{fn!r} is emulated twice")
    EMULATORS[fn] = em


def _all_iterables(fn):
    """``fn(*iterables, **kwargs)``: zip, itertools.chain, product, zip_longest."""
    def em(rt, args, kwargs):
        return fn(*(iterated(rt, a) for a in args), **(kwargs or {}))
    return em


def _first_iterable(fn):
    """``fn(iterable, *rest, **kwargs)``: enumerate, list(), sum(), islice, ..."""
    def em(rt, args, kwargs):
        if args:
            args = (iterated(rt, args[0]), *args[1:])
        return fn(*args, **(kwargs or {}))
    return em


def _callback_then_iterables(fn):
    """``fn(callback, *iterables)``: map, filter, starmap, takewhile, ..."""
    def em(rt, args, kwargs):
        if args:
            args = (wrap_callback(rt, args[0]), *(iterated(rt, a) for a in args[1:]))
        return fn(*args, **(kwargs or {}))
    return em


def _keyed(fn, names):
    """``fn(iterable, ..., key=callback)``: sorted, min, max, groupby, accumulate."""
    def em(rt, args, kwargs):
        if kwargs:
            kwargs = {k: (wrap_callback(rt, v) if k in names else v) for k, v in kwargs.items()}
        if fn is itertools.accumulate and len(args) > 1:
            args = (args[0], wrap_callback(rt, args[1]), *args[2:])
        if args and (len(args) == 1 or fn not in (min, max)):     # min(a, b) compares its arguments
            args = (iterated(rt, args[0]), *args[1:])
        return fn(*args, **(kwargs or {}))
    return em


def _reduce(rt, args, kwargs):
    if len(args) >= 2:
        args = (wrap_callback(rt, args[0]), iterated(rt, args[1]), *args[2:])
    return functools.reduce(*args, **(kwargs or {}))


def _reversed(rt, args, kwargs):
    """``reversed(x)``: a Python ``__reversed__``, or ``__len__`` and ``__getitem__``,
    interpreted (a module list has no ``__reversed__``)."""
    if kwargs or len(args) != 1 or type(args[0]) in _NATIVE:
        return reversed(*args, **(kwargs or {}))
    x = args[0]
    t = type(x)
    rev = getattr(t, "__reversed__", None)
    if rev is not None:
        return call(rt, rev, (x,))
    if getattr(t, "__len__", None) is None or getattr(t, "__getitem__", None) is None:
        return reversed(x)           # raises TypeError as the builtin does
    n = call(rt, t.__len__, (x,))
    getitem = t.__getitem__
    return (call(rt, getitem, (x, i)) for i in range(n - 1, -1, -1))


def _chain_from_iterable(rt, args, kwargs):
    if kwargs or len(args) != 1:
        return itertools.chain.from_iterable(*args, **(kwargs or {}))
    return itertools.chain.from_iterable(iterated(rt, sub) for sub in iterated(rt, args[0]))


for _fn in (zip, itertools.chain, itertools.product, itertools.zip_longest):
    _emulate(_fn, _all_iterables(_fn))
for _fn in (enumerate, list, tuple, set, frozenset, builtins.sum, builtins.any, builtins.all, itertools.islice,
            itertools.combinations, itertools.combinations_with_replacement, itertools.permutations,
            itertools.cycle, itertools.tee, itertools.compress, itertools.pairwise):
    _emulate(_fn, _first_iterable(_fn))
for _fn in (map, filter, itertools.starmap, itertools.filterfalse, itertools.takewhile, itertools.dropwhile):
    _emulate(_fn, _callback_then_iterables(_fn))
_emulate(sorted, _keyed(sorted, ("key",)))
_emulate(min, _keyed(min, ("key",)))
_emulate(max, _keyed(max, ("key",)))
_emulate(itertools.groupby, _keyed(itertools.groupby, ("key",)))
_emulate(itertools.accumulate, _keyed(itertools.accumulate, ("func",)))
_emulate(functools.reduce, _reduce)
_emulate(reversed, _reversed)
_emulate(itertools.chain.from_iterable, _chain_from_iterable)
