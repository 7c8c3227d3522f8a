"""Live tensor memory along a trace, from its shapes, dtypes and ``del`` points.

The trace report charts it; it answers "which symbol holds the most memory,
and what is alive then" without running anything. The model:

- every tensor a symbol outputs is a new buffer of ``numel * itemsize`` bytes,
  except outputs that name memory that already exists: in-place results
  (``core.aliasing.writes``: the new name of the written tensor), results
  written ``out=`` a dying input (transforms/reuse_buffers.py), the renamed
  members of an alias barrier, and views: outputs the alias facts
  (``core.aliasing.views``) pair with exactly one input of the same item size.
  Those facts are conservative ("may alias"); for an estimate, an output that
  may alias several inputs (an op nothing can see into, such as an
  ``autodiff.*`` backward kernel) or whose item size differs (a conversion
  to another dtype) is counted as new memory;
- a buffer is freed when the last name referring to it is deleted (``del``
  statements inserted by ``del_last_used``); names never deleted stay alive to
  the end (the returned tensors, and tensors saved for backward);
- the trace's tensor arguments are held by the caller: they are counted
  separately (``input_bytes``) and deleting them frees nothing.

Memory inside a symbol (a fused region's intermediates, kernel workspaces) is
not visible in the trace and not counted. Example::

    tl = live_memory(thunderlite.last_traces(jfn)[-1])
    tl.peak_bytes, tl.peak_index, tl.live_at_peak   # bytes, symbol, names alive
"""
from __future__ import annotations

from dataclasses import dataclass, field

from thunderlite.core.aliasing import views, writes
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.transforms.del_last_used import is_del
from thunderlite.transforms.reuse_buffers import out_result


def tensor_bytes(p: TensorProxy) -> int:
    """Bytes of a dense tensor of ``p``'s shape and dtype (symbolic sizes: their traced value)."""
    n = 1
    for s in p.shape:
        n *= int(getattr(s, "value", s))
    return n * p.dtype.itemsize


@dataclass
class MemoryPoint:
    """Live bytes right after symbol ``index`` of the trace ran (before its ``del``)."""
    index: int
    live_bytes: int
    label: str


@dataclass
class MemoryTimeline:
    points: list[MemoryPoint] = field(default_factory=list)
    input_bytes: int = 0                  # the trace's tensor arguments (held by the caller)
    peak_bytes: int = 0
    peak_index: int | None = None         # index in trace.bound_symbols of the peak, None if no tensor
    live_at_peak: list[tuple[str, int]] = field(default_factory=list)   # (name, bytes), largest first
    end_bytes: int = 0                    # still alive after the return: outputs and saved tensors


class _Buffers:
    """Which buffer each name refers to, and which names keep each buffer alive."""

    def __init__(self):
        self.buffer_of: dict[str, int] = {}
        self.size: list[int] = []
        self.owned: list[bool] = []        # False: a caller's buffer (never counted, never freed)
        self.names: list[set[str]] = []
        self.live = 0

    def new(self, name: str, nbytes: int, owned: bool) -> None:
        self.buffer_of[name] = len(self.size)
        self.size.append(nbytes)
        self.owned.append(owned)
        self.names.append({name})
        if owned:
            self.live += nbytes

    def alias(self, name: str, of: str) -> None:
        b = self.buffer_of[of]
        self.buffer_of[name] = b
        self.names[b].add(name)

    def drop(self, name: str) -> None:
        b = self.buffer_of.pop(name, None)
        if b is None:
            return
        names = self.names[b]
        names.discard(name)
        if not names and self.owned[b]:
            self.live -= self.size[b]

    def alive(self) -> list[tuple[str, int]]:
        """(a name, bytes) of each live buffer this trace allocated, largest first."""
        out = [(min(names), self.size[b]) for b, names in enumerate(self.names) if names and self.owned[b]]
        return sorted(out, key=lambda x: (-x[1], x[0]))


def _origin(bsym: BoundSymbol, out: TensorProxy, known: dict) -> str | None:
    """The existing name whose buffer ``out`` names, or None for a new buffer."""
    if Tag.ALIAS_BARRIER in bsym.sym.tags:
        members = bsym.args[0] if bsym.args else ()
        for m, o in zip(members, bsym.flat_outs(), strict=True):
            if o is out and isinstance(m, TensorProxy):
                return m.name
        return None
    for dst, new in writes(bsym):
        if new is out:
            return dst.name
    dst = bsym.kwargs.get("out")
    if isinstance(dst, TensorProxy) and dst.name in known and out_result(bsym) is out:
        return dst.name       # reuse_buffers.py's out=: the result is written into a dying input
    bases = {base.name: base for o, base in views(bsym) if o is out and base.name in known}
    if len(bases) != 1:
        return None         # fresh, or an op that may alias any of several inputs: counted as new
    base = next(iter(bases.values()))
    if out.dtype.itemsize != base.dtype.itemsize:
        return None         # a conversion (to float64...), not a view of it
    return base.name


def _label(bsym: BoundSymbol) -> str:
    outs = ", ".join(p.name for p in bsym.tensor_outs()[:3])
    more = "…" if len(bsym.tensor_outs()) > 3 else ""
    return f"{outs}{more} = {bsym.sym.id}" if outs else bsym.sym.id


def live_memory(trace: Trace) -> MemoryTimeline:
    """The live-memory timeline of ``trace`` (one point per symbol that is not a ``del``)."""
    tl = MemoryTimeline()
    bufs = _run(trace, tl)
    tl.end_bytes = bufs.live
    if tl.peak_index is not None:
        tl.live_at_peak = _run(trace, MemoryTimeline(), stop=tl.peak_index).alive()
    return tl


def deaths(trace: Trace, names: dict[str, str]) -> list[tuple[str, str, int]]:
    """Where the buffers of ``names`` (name -> what it is: a gradient's leaf)
    are freed: ``(what, name, index of the del)``, in trace order; a buffer
    never freed (returned, written back as ``.grad``) is not listed. Buffers
    are followed through in-place writes and views, as ``live_memory`` does."""
    bufs = _Buffers()
    watched: dict[int, tuple[str, str]] = {}
    out = []

    def on_free(b: int, i: int) -> None:
        if b in watched:
            out.append((*watched.pop(b), i))
    _run(trace, MemoryTimeline(), bufs=bufs, watch=(names, watched), on_free=on_free)
    return out


def _run(trace: Trace, tl: MemoryTimeline, stop: int | None = None, bufs: _Buffers | None = None,
         watch: tuple | None = None, on_free=None) -> _Buffers:
    """Walk the trace (up to and including symbol ``stop``), filling ``tl``;
    ``watch`` and ``on_free``: see ``deaths``."""
    bufs = bufs if bufs is not None else _Buffers()
    for p in trace.args:
        if isinstance(p, TensorProxy):
            bufs.new(p.name, tensor_bytes(p), owned=False)
            tl.input_bytes += tensor_bytes(p)
    for i, bsym in enumerate(trace.bound_symbols):
        if Tag.RETURN in bsym.sym.tags:
            break
        if is_del(bsym):
            for p in bsym.args:
                b = bufs.buffer_of.get(p.name)
                bufs.drop(p.name)
                if on_free is not None and b is not None and not bufs.names[b]:
                    on_free(b, i)
            continue
        for p in bsym.tensor_args():       # read but never defined here: a caller's buffer
            if p.name not in bufs.buffer_of:
                bufs.new(p.name, tensor_bytes(p), owned=False)
        for out in bsym.tensor_outs():
            if out.name in bufs.buffer_of:
                continue
            origin = _origin(bsym, out, bufs.buffer_of)
            if origin is not None:
                bufs.alias(out.name, origin)
            else:
                bufs.new(out.name, tensor_bytes(out), owned=True)
            if watch is not None and out.name in watch[0]:
                watch[1].setdefault(bufs.buffer_of[out.name], (watch[0][out.name], out.name))
        tl.points.append(MemoryPoint(i, bufs.live, _label(bsym)))
        if tl.peak_index is None or bufs.live > tl.peak_bytes:
            tl.peak_bytes, tl.peak_index = bufs.live, i
        if i == stop:
            break
    return bufs
