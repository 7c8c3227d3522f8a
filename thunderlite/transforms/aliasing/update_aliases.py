"""Alias barriers (docs/architecture.md §5): after every write into an alias group, give
each member of the group that is read later a new name, so that the order
between a write and the reads it affects is an ordinary data dependency.

Before::

    t1 = ltorch.view(a, (4,))          # t1 aliases a
    t2 = prims.copy_(x, t1)            # writes a's storage
    t3 = ltorch.sin(a)                 # must see the write: but nothing says so

After::

    t1 = ltorch.view(a, (4,))
    t2 = prims.copy_(x, t1)
    (a1,) = prims.update_aliases((a,), (t2,))
    t3 = ltorch.sin(a1)

Properties (each tested): no write, no barrier; only members of a written group
that are read afterwards are renamed; idempotent (a second run finds no stale
read and returns its input); writes hidden inside composites (batch_norm's
running stats) are found by looking through subsymbols, and the pass is re-run
once a decomposition exposes them at top level.

Order that renaming cannot express: a read of the *old* value that produces an
unrelated result (``t0 = sin(a)`` before ``copy_(x, a)``) must stay before the
write. ``ordering_edges`` lists these write-after-read edges for the one pass
that reorders (transforms/fusion.py)."""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from thunderlite.core import prims, pytree
from thunderlite.core.aliasing import BARRIER, views, writes
from thunderlite.core.prims import check
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.torch.function_ctx import context_of


class AliasGroups:
    """Union-find over proxy names: tensors that may share storage. ``members``
    lists, per group, the top-level tensor proxies (trace arguments and outputs
    of top-level symbols); names inside decompositions only connect groups.

    Example::

        g = AliasGroups.of_trace(trace, [["a", "b"]])   # a and b share storage
        g.same("a", "t1")                               # True if t1 views a
    """
    __slots__ = ("parent", "_members")

    def __init__(self):
        self.parent: dict[str, str] = {}
        self._members: dict[str, list[TensorProxy]] = {}

    @classmethod
    def of_trace(cls, trace: Trace, input_alias_groups=None) -> AliasGroups:
        g = cls()
        g.add_inputs(trace.args, input_alias_groups)
        for bsym in trace.bound_symbols:
            g.add_bsym(bsym)
        return g

    def find(self, name: str) -> str:
        parent = self.parent
        root = name
        while parent.get(root, root) != root:
            root = parent[root]
        while name != root:
            name, parent[name] = parent[name], root
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        self.parent[rb] = ra
        moved = self._members.pop(rb, None)
        if moved:
            self._members.setdefault(ra, []).extend(moved)

    def same(self, a: str, b: str) -> bool:
        return self.find(a) == self.find(b)

    def members(self, name: str) -> list[TensorProxy]:
        return self._members.get(self.find(name), [])

    def add_member(self, p: TensorProxy) -> None:
        self._members.setdefault(self.find(p.name), []).append(p)

    def add_inputs(self, args, input_alias_groups=None) -> None:
        for a in pytree.leaves(args):
            if type(a) is TensorProxy:
                self.add_member(a)
        for names in input_alias_groups or ():
            for n in names[1:]:
                self.union(names[0], n)

    def add_bsym(self, bsym: BoundSymbol) -> None:
        """Record what ``bsym`` (and its decomposition) makes alias what."""
        self._link(bsym)
        for o in bsym.tensor_outs():
            self.add_member(o)

    def _link(self, bsym: BoundSymbol) -> None:
        for b in walk(bsym):
            if Tag.ALIAS_BARRIER in b.sym.tags:
                # members share storage by construction: a trace that went through
                # update_aliases carries that even where a pass is not told the input groups
                members = b.args[0]
                for m, n in zip(members, b.output, strict=True):
                    self.union(members[0].name, m.name)
                    self.union(m.name, n.name)
                continue
            for out, base in views(b):
                self.union(base.name, out.name)
            for dst, new in writes(b):
                if new is not None:
                    self.union(dst.name, new.name)


def written(bsym: BoundSymbol) -> list[TensorProxy]:
    """Every tensor ``bsym`` writes, looking through its decomposition (a write
    into a name internal to the decomposition is listed too: the caller decides,
    through alias groups, whether anything outside can see it)."""
    return [dst for b in walk(bsym) for dst, _ in writes(b)]


def writes_memory(trace: Trace) -> bool:
    """Whether any symbol of ``trace`` (decompositions included) writes a tensor:
    without writes, alias groups decide nothing. (Only ``Tag.INPLACE`` symbols write.)"""
    return any(Tag.INPLACE in top.deep_tags() and any(writes(b) for b in walk(top))
               for top in trace.bound_symbols)


def has_tag_deep(bsym: BoundSymbol, tag: Tag) -> bool:
    """``tag`` on ``bsym`` or anywhere in its decomposition."""
    return tag in bsym.deep_tags()


def _substitute(bsym: BoundSymbol, swap: dict[str, Proxy]) -> BoundSymbol:
    """``bsym`` reading ``swap[name]`` wherever it read ``name`` (decomposition
    included, so a later decomposition still refers to the renamed values)."""
    def sub(x):
        return swap.get(x.name, x) if isinstance(x, Proxy) else x
    if not any(isinstance(a, Proxy) and a.name in swap for a in _all_reads(bsym)):
        return bsym
    return bsym.replace(args=pytree.tree_map(sub, bsym.args), kwargs=pytree.tree_map(sub, bsym.kwargs),
                        subsymbols=tuple(_substitute(s, swap) for s in bsym.subsymbols))


def _all_reads(bsym: BoundSymbol):
    for b in walk(bsym):
        yield from b.flat_args()


def _last_reads(trace: Trace) -> dict[str, int]:
    """name -> index of its last reader that is not a barrier."""
    last: dict[str, int] = {}
    for i, bsym in enumerate(trace.bound_symbols):
        if Tag.ALIAS_BARRIER in bsym.sym.tags:
            continue
        for p in bsym.proxy_args():
            last[p.name] = i
    return last


@trace_pass("update_aliases")
def update_aliases(trace: Trace, input_alias_groups: list[list[str]] | None = None, *,
                   leaf_inputs: Collection[str] = (), inference_inputs: Collection[str] = (),
                   refused_view_inputs: Mapping[str, str] | None = None) -> Trace:
    """Insert a barrier after each write whose alias group is read afterwards.

    ``input_alias_groups`` lists groups of argument names that share storage at
    call time (the jit reads it off ``untyped_storage().data_ptr()`` and keys its
    cache on it). ``leaf_inputs`` / ``inference_inputs`` name the arguments that
    are leaves requiring grad / inference tensors, ``refused_view_inputs`` maps
    arguments that are views eager refuses to write in grad mode to eager's
    message: writes into them raise eager's errors (``check_writes``). Returns
    ``trace`` itself when nothing needs renaming (at once when nothing writes)."""
    if not writes_memory(trace):
        return trace
    check_writes(trace, leaf_inputs=leaf_inputs, inference_inputs=inference_inputs,
                 refused_view_inputs=refused_view_inputs)
    groups = AliasGroups()
    groups.add_inputs(trace.args, input_alias_groups)
    last_read = _last_reads(trace)
    origin: dict[str, str] = {}           # new name -> the name it replaces in ``trace``
    swap: dict[str, Proxy] = {}           # stale name -> its newest name
    out: list[BoundSymbol] = []
    for i, bsym in enumerate(trace.bound_symbols):
        if swap:
            bsym = _substitute(bsym, swap)
        groups.add_bsym(bsym)
        out.append(bsym)
        dsts = written(bsym)
        if not dsts:
            continue
        own = {p.name for p in bsym.proxy_outs()}
        for stale in _stale_members(groups, dsts, own, lambda n: last_read.get(origin.get(n, n), -1) > i):
            out.append(_barrier(trace, groups, stale, bsym, swap, origin))
    if len(out) == len(trace.bound_symbols):
        return trace
    return trace.with_bound_symbols("update_aliases", out)


def _stale_members(groups: AliasGroups, dsts, own: set, read_later) -> list[list[TensorProxy]]:
    """Per written group (one barrier each, so groups stay apart), the members
    defined before the write and read after it. Members nobody reads after
    this point are dropped from the group for good (they never go stale again),
    which keeps the scan short in programs that write one buffer many times."""
    out, seen_roots = [], set()
    for d in dsts:
        root = groups.find(d.name)
        if root in seen_roots:
            continue
        seen_roots.add(root)
        members = groups.members(root)
        members[:] = [m for m in members if read_later(m.name)]
        stale = [m for m in members if m.name not in own]
        if stale:
            out.append(stale)
    return out


def _barrier(trace: Trace, groups: AliasGroups, stale, writer: BoundSymbol, swap, origin) -> BoundSymbol:
    """The barrier renaming ``stale`` after ``writer``; updates the maps. Later
    symbols read names of the input trace, so ``swap`` is keyed by those."""
    after = _write_results(writer)
    new = tuple(m.replace(name=trace.fresh_name("t")) for m in stale)
    bsym = BARRIER.bind(tuple(stale), after, output=new)
    for m, n in zip(stale, new, strict=True):
        first = origin.get(m.name, m.name)
        swap[first] = n
        origin[n.name] = first
    groups.add_bsym(bsym)
    _retire(groups, stale)
    return bsym


def _write_results(writer: BoundSymbol) -> tuple:
    """The writer's outputs that name written tensors (``t2`` of
    ``t2 = copy_(x, a)``), else all its tensor outputs: what the barrier reads so
    that it comes after the write without keeping unrelated results alive."""
    outs = writer.tensor_outs()
    names = {new.name for new in _written_pairs(writer) if new is not None}
    named = tuple(o for o in outs if o.name in names)
    return named if named else tuple(outs)


def _written_pairs(bsym: BoundSymbol):
    for b in walk(bsym):
        for _, new in writes(b):
            yield new


def _retire(groups: AliasGroups, stale) -> None:
    """Stale names are never read again: drop them from their group's members."""
    names = {m.name for m in stale}
    members = groups.members(stale[0].name)
    members[:] = [m for m in members if m.name not in names]


def ordering_edges(trace: Trace, input_alias_groups=None) -> list[tuple[int, int]]:
    """Write-after-read edges ``(reader, writer)`` (indices into the trace): a
    symbol reading the value a later write overwrites must stay before it; and
    ``(writer, barrier)`` for each barrier. Together with data dependencies
    these fully order a renamed trace.

    Only the values current at a write need edges: in a renamed trace every
    earlier write of the group is already ordered before it (the write reads a
    renamed member, or a view of one), and so are the readers of the values
    that earlier write replaced. So each group keeps the members defined since
    its last write, and each read gets at most one edge per write."""
    groups = AliasGroups.of_trace(trace, input_alias_groups)
    bsyms = trace.bound_symbols
    readers: dict[str, list[int]] = {}
    for i, bsym in enumerate(bsyms):
        for p in bsym.proxy_args():
            readers.setdefault(p.name, []).append(i)
    current: dict[str, list[str]] = {}
    for a in pytree.leaves(trace.args):
        if type(a) is TensorProxy:
            current.setdefault(groups.find(a.name), []).append(a.name)
    edges: list[tuple[int, int]] = []
    last_writer: dict[str, int] = {}
    for i, bsym in enumerate(bsyms):
        if Tag.ALIAS_BARRIER in bsym.sym.tags and bsym.args[0]:
            j = last_writer.get(groups.find(bsym.args[0][0].name))
            if j is not None:
                edges.append((j, i))        # also carried by data unless the writer has no outputs
        dsts = written(bsym)
        outs = [o.name for o in bsym.tensor_outs()]
        for root in {groups.find(d.name) for d in dsts}:
            for m in current.pop(root, ()):
                edges.extend((j, i) for j in readers.get(m, ()) if j < i)
            last_writer[root] = i
        for o in outs:
            current.setdefault(groups.find(o), []).append(o)
    return edges


# --- eager's errors for writes it refuses -------------------------------------------------------

_LEAF = "a leaf Variable that requires grad is being used in an in-place operation."
_VIEW_OF_LEAF = "a view of a leaf Variable that requires grad is being used in an in-place operation."
_OVERLAP = ("unsupported operation: more than one element of the written-to tensor refers to a single "
            "memory location. Please clone() the tensor before performing the operation.")
_INFERENCE = ("Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone "
              "to get a normal tensor before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 "
              "for more details.")


def check_writes(trace: Trace, *, leaf_inputs: Collection[str] = (), inference_inputs: Collection[str] = (),
                 refused_view_inputs: Mapping[str, str] | None = None,
                 copies: Callable[[], Collection[str]] | None = None) -> set[str]:
    """Raise the RuntimeError eager PyTorch raises for a write into a leaf that
    requires grad (while grad mode was on: the write's result requires grad;
    not where autograd does not check it, see ``_all_writes``),
    into a view of one, into an inference tensor (or a view of one), or through
    an expanded view. The message names the user's line.

    ``copies()`` names the results of reshapes eager makes as copies for the
    strides compiled for (eager_layout.py ``eager_copies``): a write into one
    is into fresh memory. It is asked only where a write would be refused
    (reading layouts specializes symbolic sizes). Returns the copies a write's
    view chain crossed: the decisions the program relies on (their inputs'
    strides are guarded)."""
    if not writes_memory(trace):
        return set()
    args = (trace, leaf_inputs, inference_inputs, refused_view_inputs or {})
    try:
        return _check_writes(*args, ())
    except RuntimeError:
        cut = copies() if copies is not None else ()
        if not cut:
            raise
    return _check_writes(*args, cut)


def _check_writes(trace: Trace, leaf_inputs, inference_inputs, refused_views, copies) -> set[str]:
    base_of: dict[str, tuple[str, BoundSymbol, bool]] = {}
    fills: set[str] = set()
    cut: dict[str, tuple[str, BoundSymbol, bool]] = {}
    relied: set[str] = set()
    for bsym in trace.bound_symbols:
        _note_views(bsym, base_of, fills)
        for name in copies:
            if name in base_of:
                cut[name] = base_of.pop(name)
        for w, (dst, new), autograd_checks in _all_writes(bsym):
            relied.update(_cuts_crossed(dst.name, base_of, cut))
            root, _ = _view_root(dst.name, base_of)
            grad_root, hops = _view_root(dst.name, base_of, autograd=True)
            grad_mode = new is not None and new.requires_grad and autograd_checks
            check(not (grad_mode and grad_root in leaf_inputs),
                  lambda: _at(bsym, _VIEW_OF_LEAF if hops else _LEAF))
            check(not (grad_mode and grad_root in refused_views), lambda: _at(bsym, refused_views[grad_root]))
            check(root not in inference_inputs, lambda: _at(bsym, _INFERENCE))
            link = base_of.get(dst.name)
            src = w.args[0] if w.args and isinstance(w.args[0], Proxy) else None
            filled = src is not None and (src.name in fills or src.name == dst.name)   # x.copy_(x) is a no-op
            overlap_ok = filled or not _refuses_overlap(bsym)
            check(link is None or overlap_ok or not _expands(link[1]), lambda: _at(bsym, _OVERLAP))
    return relied


def _cuts_crossed(name: str, base_of: dict, cut: dict) -> list[str]:
    """The copies (``cut``) the view chain of ``name`` would cross but for them."""
    crossed = []
    while True:
        name, _ = _view_root(name, base_of)
        if name not in cut:
            return crossed
        crossed.append(name)
        name = cut[name][0]


def _all_writes(bsym: BoundSymbol, dirty: set | None = None):
    """``(write, (dst, new), checked)`` for every write in ``bsym``, pre-order;
    ``checked``: autograd checks it. It does not check a ``custom_op``'s writes
    (they run below autograd), nor writes a ``torch.autograd.Function``'s forward
    makes into tensors it does not mark dirty (forward runs without grad)."""
    if bsym.sym.module == "autograd_function":
        ctx = context_of(bsym)
        dirty = ctx.dirty if ctx is not None else set()
    for pair in writes(bsym):
        checked = Tag.WRITES_BELOW_AUTOGRAD not in bsym.sym.tags and (dirty is None or pair[0].name in dirty)
        yield bsym, pair, checked
    for sub in bsym.subsymbols:
        yield from _all_writes(sub, dirty)


def _note_views(bsym: BoundSymbol, base_of: dict, fills: set) -> None:
    """Record view links, and the values made by ``prims.full``: eager allows
    filling an expanded view (``fill_``, ``zero_``, ``x[i] = 0.0``)."""
    for b in walk(bsym):
        for out, base in ([] if b.subsymbols else views(b)):     # as the call ran: see call_views
            base_of[out.name] = (base.name, b, Tag.HIDDEN_VIEW in b.sym.tags)
        if b.sym.meta is prims.full.meta:
            fills.add(b.output.name)


def _view_root(name: str, base_of: dict, autograd: bool = False) -> tuple[str, int]:
    """The base ``name`` views, and through how many views; with ``autograd``,
    only through views autograd knows of (not ``Tag.HIDDEN_VIEW`` links)."""
    hops = 0
    while name in base_of and not (autograd and base_of[name][2]):
        name = base_of[name][0]
        hops += 1
    return name, hops


_FILLS = frozenset({"fill", "masked_fill", "index_fill"})


def _refuses_overlap(bsym: BoundSymbol) -> bool:
    """Whether eager refuses this write into a tensor whose elements overlap:
    elementwise in-place ops and ``copy_`` do; fills (``fill_``, ``zero_``,
    ``masked_fill_``, ``x[i] = v``) do not."""
    sym = bsym.sym
    if sym.inplace_of is not None:
        return sym.inplace_of.name not in _FILLS
    return sym.name == "copy_"


def _expands(view: BoundSymbol) -> bool:
    """A view whose output has more elements covering more bytes than its input
    (expand, broadcast; not ``view_as_real``, whose output has twice the elements
    of half the size, nor a ``to`` that may return its input)."""
    outs, ins = view.tensor_outs(), view.tensor_args()
    grows = bool(outs and ins) and outs[0].numel() > ins[0].numel() and \
        outs[0].nbytes > ins[0].nbytes
    if grows and getattr(view.sym.torch_fn, "__name__", None) == "as_strided":
        # eager refuses only zero strides; as_strided may reach past its input without overlapping
        stride = view.args[2] if len(view.args) > 2 else view.kwargs.get("stride", ())
        return 0 in tuple(stride)
    return grows


def _at(bsym: BoundSymbol, msg: str) -> str:
    if bsym.source is None:
        return msg
    fname, lineno, text = bsym.source
    return f"{msg}\n  at {fname}:{lineno}: {text}" if text else f"{msg}\n  at {fname}:{lineno}"
