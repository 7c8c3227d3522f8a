"""The view links functionalize.py records and replays, and how a write goes
back through each: a gather of an input from the flat storage inputs share
(``StorageView``), a strided gather of a dense base (``Strided``, for opaque
views eager makes by strides), and each invertible view prim's inverse
(``inverse``: a slice is padded into place and selected with ``where``,
reshape/squeeze reshape back, permute permutes back)."""
from __future__ import annotations

import math

import torch

from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag

INVERTIBLE = frozenset(p.meta for p in (prims.reshape, prims.squeeze, prims.permute, prims.slice_prim))

class _Gather:
    """The ``sym`` of a ``StorageView``: replaying it gathers the view's elements."""
    id = "functionalize.storage_view"
    meta = None

    def __call__(self, storage, shape, strides, offset, name):
        return prims.reshape(prims.gather(storage, 0, _flat_positions(shape, strides, offset, storage.device)), shape)


class StorageView:
    """A chain link from a flat storage shared by inputs to one of them."""
    __slots__ = ("args", "kwargs", "last", "output", "source")
    sym = _Gather()

    def __init__(self, shape: tuple, strides: tuple, offset: int, name: str):
        self.args = (None, shape, strides, offset, name)
        self.kwargs = {}
        self.last = offset + sum((n - 1) * st for n, st in zip(shape, strides, strict=True))
        self.output = None
        self.source = None


class _StridedGather:
    """The ``sym`` of a ``Strided`` link: replaying it gathers the view's elements
    from its base read in storage order."""
    id = "functionalize.strided_view"
    meta = None

    def __call__(self, base, shape, strides, offset, order):
        return prims.reshape(prims.gather(_storage_flat(base, order), 0, _flat_positions(shape, strides, offset,
                                                                                     base.device)), shape)


class Strided:
    """A chain link from a base to a view of it described by eager's strides and
    storage offset (relative to the base's) for the layouts compiled for: an
    ``as_strided`` view, a written part of an expanded view. The base is dense
    (``order``: its dims from outermost in memory), so the view's elements are
    positions in it read in storage order; a write scatters into them, which
    needs each written element in one place (``overlaps`` False)."""
    __slots__ = ("args", "kwargs", "output", "source", "overlaps", "root")
    sym = _StridedGather()

    def __init__(self, shape: tuple, strides: tuple, offset: int, order: tuple, root: TensorProxy):
        self.args = (None, shape, strides, offset, order)
        self.kwargs = {}
        self.output = None
        self.source = None
        self.root = root
        self.overlaps = _overlaps(shape, strides)

    def on(self, base):
        """The meta view this link makes of ``base``'s meta tensor."""
        if base is None:
            return None
        _, shape, strides, offset, _ = self.args
        return base.as_strided(shape, strides, base.storage_offset() + offset)


def storage_order(t) -> tuple | None:
    """The dims of a dense meta tensor from outermost in memory, or None where its
    elements are not one block of its storage."""
    order = tuple(sorted(range(t.ndim), key=lambda d: -t.stride(d)))
    expected = 1
    for d in reversed(order):
        if t.shape[d] != 1 and t.stride(d) != expected:
            return None
        expected *= t.shape[d]
    return order


_POSITIONS_LIMIT = 1 << 20


def within(m, m_in) -> bool:
    """Whether every element of the meta view ``m`` lies in the elements of
    ``m_in`` (same storage, bytes compared): eager's autograd differentiates a
    view (``as_strided``) through its input's elements only, so one reaching
    past them is not a scatter into the base that autograd agrees with. False
    where too large to tell."""
    if not m.numel():
        return True
    if not m_in.numel():
        return False
    size = max(t.element_size() * (t.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(
        t.shape, t.stride(), strict=True))) for t in (m, m_in))
    if size > _POSITIONS_LIMIT:
        return False

    def held(t):
        pos = torch.arange(size // t.element_size()).as_strided(t.shape, t.stride(), t.storage_offset())
        return (pos.reshape(-1, 1) * t.element_size() + torch.arange(t.element_size())).reshape(-1)
    return bool(torch.isin(held(m), held(m_in)).all())


def _overlaps(shape, strides) -> bool:
    """Whether two elements of a strided view may share a storage position."""
    reach = 0
    for st, n in sorted((st, n) for n, st in zip(shape, strides, strict=True) if n > 1):
        if st <= reach:
            return True
        reach += (n - 1) * st
    return False


def same_layout(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and \
        a.storage_offset() == b.storage_offset()


def _storage_flat(base: TensorProxy, order: tuple) -> TensorProxy:
    x = base if order == tuple(range(base.ndim)) else prims.permute(base, order)
    return prims.reshape(x, (base.numel(),))


def _flat_positions(shape, strides, offset, device) -> TensorProxy:
    return prims.reshape(_positions(shape, strides, offset, device), (math.prod(shape),))


def invertible(v) -> bool:
    if isinstance(v, Strided):
        return not v.overlaps
    return isinstance(v, StorageView) or v.sym.meta in INVERTIBLE or detaching(v)


def _inverse_perm(perm) -> tuple:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p % len(perm)] = i
    return tuple(inv)


def _positions(shape, strides, offset, device) -> TensorProxy:
    """The flat storage positions of a strided tensor's elements (int64, its shape)."""
    idx = prims.full(tuple(shape), offset, device=device, dtype=torch.int64)
    for d, (n, st) in enumerate(zip(shape, strides, strict=True)):
        if n == 1 or st == 0:
            continue
        step = prims.iota(n, start=0, step=st, device=device, dtype=torch.int64)
        idx = prims.add(idx, prims.broadcast_in_dim(step, tuple(shape), (d,)))
    return idx


def call_key(view: BoundSymbol) -> tuple:
    return view.sym.id, repr(view.args[1:]), repr(view.kwargs)


def first_arg(link) -> TensorProxy | None:
    if isinstance(link, StorageView):
        return None
    return link.root if isinstance(link, Strided) else link.tensor_args()[0]


def broadcast_to(src, like: TensorProxy):
    if not isinstance(src, TensorProxy):
        return prims.full(like.shape, src, device=like.device, dtype=like.dtype)
    lead = len(like.shape) - len(src.shape)
    return prims.broadcast_in_dim(src, like.shape, tuple(range(lead, len(like.shape))))


def inverse(view: BoundSymbol, base: TensorProxy, new: TensorProxy) -> TensorProxy:
    """``base`` with ``new`` written where ``view`` (a leaf view prim of ``base``) looks."""
    if isinstance(view, StorageView):
        _, shape, strides, offset, _ = view.args
        return prims.scatter(base, 0, _flat_positions(shape, strides, offset, base.device),
                             prims.reshape(new, (math.prod(shape),)))
    if isinstance(view, Strided):
        _, shape, strides, offset, order = view.args
        flat = prims.scatter(_storage_flat(base, order), 0, _flat_positions(shape, strides, offset, base.device),
                             prims.reshape(new, (math.prod(shape),)))
        out = prims.reshape(flat, tuple(base.shape[d] for d in order))
        return out if order == tuple(range(base.ndim)) else prims.permute(out, _inverse_perm(order))
    if detaching(view):
        return new
    meta = view.sym.meta
    if meta is prims.reshape.meta or meta is prims.squeeze.meta:
        return prims.reshape(new, base.shape)
    if meta is prims.permute.meta:
        return prims.permute(new, _inverse_perm(view.args[1]))
    start = view.args[1]
    strides = view.args[3] if len(view.args) > 3 else view.kwargs.get("strides")
    strides = (1,) * base.ndim if strides is None else strides
    config = []
    for size, lo, n, st in zip(base.shape, start, new.shape, strides, strict=True):
        last = lo + (n - 1) * st if n else lo - 1
        config.append((lo, size - 1 - last, st - 1))
    padded = prims.pad(new, 0, config)
    mask = prims.pad(prims.full(new.shape, True, device=new.device, dtype=torch.bool), False, config)
    return prims.where(mask, padded, base)


def overwrite(base: TensorProxy, src: TensorProxy) -> TensorProxy:
    everywhere = prims.full(base.shape, True, device=base.device, dtype=torch.bool)
    return prims.where(everywhere, src, base)


def detaching(view) -> bool:
    """A ``detach()``/``.data`` alias: the same elements, no gradient."""
    if isinstance(view, (StorageView, Strided)) or Tag.OPAQUE not in view.sym.tags:
        return False
    fn = view.sym.torch_fn
    return fn is torch.Tensor.detach or fn is torch.detach or getattr(fn, "__name__", None) == "data"
