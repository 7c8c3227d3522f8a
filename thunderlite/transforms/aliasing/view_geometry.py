"""Where views of one tensor lie in its memory, at compile time: whether a
write that reads another view of the memory it writes depends on the order
eager's kernel visits the elements (functionalize.py's ``check_reads``).

A view is a ``Geo``: its shape, its strides and storage offset in the
coordinates of its root, and, for strides eager computes the same way for any
strides of the root, each stride as (root dim, multiplier). The root is one of

- a flat storage that inputs sharing memory are placed in (their strides and
  offsets as compiled for, guarded): coordinates are storage positions;
- any other tensor: coordinates of a contiguous stand-in of it. Eager's root
  maps distinct elements to distinct positions (a fresh result; an input that
  is written), so two views touch the same positions in eager exactly when
  they do in the stand-in.

Two views are *disjoint* (no position in common: reading one while writing
the other is order-independent for any op) or have the *same positions*
element for element (order-independent when each written element reads only
its own position: elementwise ops), decided exactly: intervals, else the
positions enumerated up to ``_LIMIT``; beyond it nothing is claimed. Sizes may
be symbolic: each comparison on them is a guard (core/symint.py), and
enumerating specializes them.

Which view an op writes (``written_view``: setitem writes ``a[key]``, not the
``a`` its decomposition copies into) and whether it reads a value elementwise
(``elementwise_from``: only through elementwise prims of one shape) are read
from the op's decomposition.

Example: the root (4, 3); ``x[0:2]`` is ``Geo((2, 3), (3, 1), 0)``,
``x[2:4]`` is ``Geo((2, 3), (3, 1), 6)``: disjoint.
"""
from __future__ import annotations

import math
import operator
from typing import NamedTuple

from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.symint import is_int

_LIMIT = 1 << 14   # positions enumerated when intervals cannot tell


class Geo(NamedTuple):
    shape: tuple
    strides: tuple
    offset: int
    sym: tuple | None   # per dim (root dim, multiplier), or None where eager's strides may differ
    real: bool          # coordinates are storage positions (not a stand-in's)


def stand_in(shape: tuple) -> Geo | None:
    """A contiguous stand-in of a root tensor of ``shape``."""
    if not _ints(shape):
        return None
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return Geo(tuple(shape), tuple(reversed(strides)), 0, tuple((d, 1) for d in range(len(shape))), False)


def placed(shape: tuple, strides: tuple, offset: int) -> Geo | None:
    """An input placed in a flat storage at its strides and offset."""
    if not _ints(shape) or not _ints(strides) or not is_int(offset):
        return None
    return Geo(tuple(shape), tuple(strides), offset, tuple((0, st) for st in strides), True)


def apply(g: Geo | None, view) -> Geo | None:
    """The geometry of ``view``'s output (a leaf view prim reading ``g``), or
    None where this cannot say."""
    out = getattr(view, "output", None)
    if g is None or out is None or not _ints(getattr(out, "shape", (None,))):
        return None
    meta, shape = view.sym.meta, tuple(out.shape)
    if meta is prims.slice_prim.meta:
        return _slice(g, view, shape)
    if meta is prims.squeeze.meta:
        dims = view.args[1] if isinstance(view.args[1], (tuple, list)) else (view.args[1],)
        keep = [d for d in range(len(g.shape)) if d not in {x % len(g.shape) for x in dims}]
        return _pick(g, keep, shape)
    if meta is prims.permute.meta:
        return _pick(g, [p % len(g.shape) for p in view.args[1]], shape)
    if meta is prims.reshape.meta:
        strides = _reshape_strides(g.shape, g.strides, shape)
        return None if strides is None else Geo(shape, strides, g.offset, None, g.real)
    if meta is prims.broadcast_in_dim.meta:
        strides = [0] * len(shape)
        for src, d in enumerate(view.args[2]):
            strides[d] = g.strides[src] if g.shape[src] == shape[d] else 0
        return Geo(shape, tuple(strides), g.offset, None, g.real)
    return None


def _slice(g: Geo, view, shape: tuple) -> Geo | None:
    start = view.args[1]
    steps = view.args[3] if len(view.args) > 3 else view.kwargs.get("strides")
    steps = (1,) * len(g.shape) if steps is None else tuple(steps)
    if not _ints(start) or not _ints(steps):
        return None
    offset = g.offset + sum(lo * st for lo, st in zip(start, g.strides, strict=True))
    strides = tuple(st * k for st, k in zip(g.strides, steps, strict=True))
    sym = None if g.sym is None else tuple((d, m * k) for (d, m), k in zip(g.sym, steps, strict=True))
    return Geo(shape, strides, offset, sym, g.real)


def _pick(g: Geo, dims: list, shape: tuple) -> Geo:
    sym = None if g.sym is None else tuple(g.sym[d] for d in dims)
    return Geo(shape, tuple(g.strides[d] for d in dims), g.offset, sym, g.real)


def _reshape_strides(shape: tuple, strides: tuple, new: tuple) -> tuple | None:
    """Strides making ``new`` a view of a (shape, strides) tensor in row-major
    element order, or None when no strides can: each run of old dims that
    merge (stride = next stride * next size) must be split exactly by new dims."""
    if math.prod(shape) == 0:
        return stand_in(new).strides
    old = [(n, st) for n, st in zip(shape, strides, strict=True) if n != 1]
    out, j, k = [1] * len(new), len(new) - 1, len(old) - 1
    while k >= 0:
        first = k
        while first > 0 and old[first - 1][1] == old[first][1] * old[first][0]:
            first -= 1
        run, acc = math.prod([n for n, _ in old[first:k + 1]]), 1
        while j >= 0 and (acc < run or new[j] == 1):
            out[j] = acc * old[k][1]
            acc *= new[j]
            j -= 1
        if acc != run:
            return None
        k = first - 1
    if any(new[i] != 1 for i in range(j + 1)):
        return None
    return tuple(out)


def disjoint(a: Geo, b: Geo) -> bool:
    """No storage position in common (exact; False when it cannot tell)."""
    if math.prod(a.shape) == 0 or math.prod(b.shape) == 0:
        return True
    (alo, ahi), (blo, bhi) = _span(a), _span(b)
    if ahi < blo or bhi < alo:
        return True
    if math.prod(a.shape) + math.prod(b.shape) > _LIMIT:
        return False
    return not (_positions(a) & _positions(b))


def same_positions(a: Geo, b: Geo) -> bool:
    """Element i (row-major) of ``a`` and of ``b`` sit at one position, for every i."""
    if math.prod(a.shape) != math.prod(b.shape):
        return False
    if math.prod(a.shape) == 0:
        return True
    big = lambda g: [(n, st) for n, st in zip(g.shape, g.strides, strict=True) if n != 1]  # noqa: E731
    return a.offset == b.offset and big(a) == big(b)


def eager_allows(written: Geo, read: Geo) -> bool:
    """Eager runs a kernel writing ``written`` and reading ``read``, two views
    of the same positions: it refuses the pair when both are dense and their
    shapes or strides differ ("some elements of the input tensor and the
    written-to tensor refer to a single memory location"). True only where
    that refusal is sure not to happen."""
    if written.shape == read.shape and written.sym is not None and written.sym == read.sym:
        return True
    return written.real and read.real and not (_dense(written) and _dense(read))


# prims computing each output element from the input elements at its own index
_ELEMENTWISE = frozenset(getattr(prims, n).meta for n in prims.UNARY + prims.BINARY + prims.TERNARY
                         if n not in ("real", "imag")) | {prims.where.meta, prims.convert_element_type.meta}


def written_view(bsym: BoundSymbol, dst: TensorProxy, links: dict) -> TensorProxy:
    """The view of ``dst`` eager's kernel writes: ``a[key] = v`` (basic indexing,
    recorded as ``where(mask, padded v, a)`` written into ``a``) writes ``a[key]``,
    the last view of ``a`` its decomposition makes; any other op writes ``dst``."""
    if not _basic_setitem(bsym, dst):
        return dst
    region, made = dst, {dst.name}
    for name, (leaf, base) in links.items():
        if base.name in made:
            made.add(name)
            region = leaf.output
    return region


def _basic_setitem(bsym: BoundSymbol, dst: TensorProxy) -> bool:
    """``a[key] = v`` with basic indexing (no tensor index): a ``where`` into ``a``."""
    return bsym.sym.id == "ltorch.setitem" and any(
        b.sym is prims.where and _named(b.args[2], dst) for b in walk(bsym) if not b.subsymbols)


def elementwise_from(bsym: BoundSymbol, p: TensorProxy, dst: TensorProxy, region: TensorProxy) -> bool:
    """Each element ``bsym`` writes into ``region`` reads ``p`` only at its own
    index: setitem's value of the view's size, or ``p`` flowing to the write
    through elementwise prims of one shape (no reduction, matmul or view of it)."""
    if math.prod(p.shape) != math.prod(region.shape):
        return False
    if _basic_setitem(bsym, dst):
        return _named(bsym.args[2], p)
    if tuple(p.shape) != tuple(dst.shape):
        return False
    reach, wrote = {p.name}, False
    for leaf in walk(bsym):
        if leaf.subsymbols or not any(a.name in reach for a in leaf.tensor_args()):
            continue
        if leaf.sym is prims.copy_:
            src = leaf.args[0] if leaf.args else leaf.kwargs.get("src")
            to = leaf.args[1] if len(leaf.args) > 1 else leaf.kwargs.get("dst")
            wrote = _named(to, dst) and _named(src, *reach)
            if not wrote:
                return False
        elif leaf.sym.meta in _ELEMENTWISE and all(tuple(o.shape) == tuple(dst.shape) for o in leaf.tensor_outs()):
            reach.update(o.name for o in leaf.tensor_outs())
        else:
            return False
    return wrote


def _named(x, *names) -> bool:
    return isinstance(x, TensorProxy) and x.name in {n if isinstance(n, str) else n.name for n in names}


def _dense(g: Geo) -> bool:
    """Eager's non-overlapping-and-dense: a permutation of a contiguous block."""
    expected = 1
    for n, st in sorted(((n, st) for n, st in zip(g.shape, g.strides, strict=True) if n != 1),
                        key=lambda x: x[1]):
        if st != expected:
            return False
        expected *= n
    return True


def _span(g: Geo) -> tuple[int, int]:
    lo = g.offset + sum(min(0, (n - 1) * st) for n, st in zip(g.shape, g.strides, strict=True))
    hi = g.offset + sum(max(0, (n - 1) * st) for n, st in zip(g.shape, g.strides, strict=True))
    return lo, hi


def _positions(g: Geo) -> set[int]:
    """Concrete positions: symbolic sizes are specialized (guarded) here."""
    pos = [operator.index(g.offset)]
    for n, st in zip(g.shape, g.strides, strict=True):
        n, st = operator.index(n), operator.index(st)
        pos = [p + i * st for p in pos for i in range(n)]
    return set(pos)


def _ints(xs) -> bool:
    return all(is_int(x) for x in xs)
