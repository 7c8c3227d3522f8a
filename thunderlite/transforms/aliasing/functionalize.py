"""Functionalize writes into views and program inputs, so autodiff can
differentiate them instead of replaying the program under PyTorch autograd
(what AOTAutograd's functionalization does for Inductor).

After update_aliases a write into a view ``v = y[:, 0]; v.mul_(2)`` is a
``copy_(src, v)`` followed by a barrier that renames ``y`` and ``v``: the trace
says *that* the group changed, not *how*. This pass says how, with functional
prims only:

- the view chain from the group's base to ``v`` (leaf view prims: slice,
  reshape, squeeze, permute) is known from the trace; a ``reshape`` is a view
  or a copy as eager makes it for the strides compiled for (eager_layout.py);
- the write becomes ``y1 = scatter(y, src, chain)``: walking the chain back,
  each view's inverse puts the new value into its base (a slice is padded
  into place and selected with ``where``; reshape/squeeze reshape back;
  permute permutes back);
- every renamed member is the same chain replayed on ``y1``;
- a written program input gets its final value by one ``copy_`` right before
  the return; autodiff takes those off (``take_write_backs``, write_backs.py) and the caller
  copies them in after the differentiated forward, then makes what the program
  returns of written inputs (themselves, views of them) from the inputs;
- inputs sharing storage are gathers from one flat storage (``StorageView`` in view_links.py:
  their strides and offsets at compile time, guarded), a write a scatter;
- an opaque view (``alias``, ``contiguous``, ``as_strided``...) is what eager
  makes of it for the layouts compiled for (eager_layout.py's meta run,
  guarded): fresh memory, the same elements as its input or base, or a
  ``Strided`` gather of storage positions from its dense base; a write whose
  chain has no inverse (through an expanded view) is one ``Strided`` scatter
  when no written element is in two places.

A write autograd does not record (made under ``torch.no_grad()``, or through a
``detach()``/``.data`` alias) changes values, not history: the base's new value
is ``overwrite_values(old, new)``, whose forward is ``new`` and whose VJP sends
the whole gradient to ``old`` (nothing to ``new``); a ``detach``/``.data`` link
replays as itself (no gradient), and values made under ``no_grad`` stay
constants (the pass follows grad-mode switches). An input written only that
way is written back without autograd recording (``quiet``).

A custom op writing its arguments (``Tensor(a!)``) runs on clones of what it
writes, and each clone's new value is written like a ``copy_`` (``custom_write``):
the op stays one opaque call, so the value's gradient is eager's (through the
clone alone for a ``custom_op``, whose write is below autograd).

A write reading another view of the memory it writes is functional where
that view lies apart from the positions written or sits on exactly them, read
elementwise (``check_reads``, view_geometry.py). Where the pass cannot say how
(an alias autograd does not track as a view other than ``detach()``/``.data``,
an overlapping write, a write reading a partially overlapping view of the
memory it writes, a custom op given memory overlapping what it writes, an
opaque in-place op other than a custom op), it raises ``NotFunctionalizable``
with the reason; autodiff then keeps its eager-mode replay and names that
reason.

Example (``v = y[:, 0]; v.mul_(2); return y``)::

    t1 = prims.slice_prim(y, ...); v = prims.squeeze(t1, (1,))
    t3 = prims.mul(v, 2.0)
    t4 = prims.reshape(t3, (3, 1)); ...pad/where...  y1 = prims.where(mask, padded, y)
    return y1
"""
from __future__ import annotations

import torch

from thunderlite.core import prims, pytree
from thunderlite.core.aliasing import output_aliases_input, views, writes
from thunderlite.core.proxies import DataDependentError, Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol, Symbol, free_tensors, walk
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.core.tracectx import tracectx
from thunderlite.torch.custom_ops import overload_of_symbol
from thunderlite.torch.opaque import opaque_symbol_for
from thunderlite.torch.ops.grad_mode import SET_GRAD_ENABLED_ID
from thunderlite.transforms.aliasing import view_geometry
from thunderlite.transforms.aliasing.eager_layout import autograd_view, eager_view, same_storage
from thunderlite.transforms.aliasing.view_links import (
    INVERTIBLE,
    StorageView,
    Strided,
    broadcast_to,
    call_key,
    detaching,
    first_arg,
    inverse,
    invertible,
    overwrite,
    same_layout,
    storage_order,
    within,
)


def _detach_meta(a):
    return a.replace(requires_grad=False)


DETACH = Symbol("detach", meta=_detach_meta, impl=torch.Tensor.detach, module="autodiff")
"""Cuts the graph where the program computed under ``torch.no_grad()``: eager
mode runs the whole trace with autograd on, and this keeps those values out of
it (they share memory with the undetached value, as eager's do)."""


# ``prims.reshape`` is a view only when strides allow it (``x.t().reshape(-1)`` copies in
# eager); recorded by these ops it is always a view (eager raises instead of copying, or,
# for diagonal, makes a strided view of the same elements the decomposition picks)
_ALWAYS_VIEW = frozenset({"view", "view_as", "unsqueeze", "squeeze", "unflatten", "getitem", "select", "diagonal"})
# leaf prims the torch executor always runs as views; anything else that "may alias" (an
# opaque op whose schema cannot tell) is not replayed on a written base
_CERTAIN = INVERTIBLE | frozenset(p.meta for p in (prims.broadcast_in_dim, prims.real, prims.imag))


def _overwrite_values_meta_decomposition(a: TensorProxy, new: TensorProxy) -> TensorProxy:
    everywhere = prims.full(a.shape, True, device=a.device, dtype=torch.bool)
    return prims.where(everywhere, new, a)


def _overwrite_values_torch(a: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    return new.clone()


overwrite_values = Symbol("overwrite_values", decomposition=_overwrite_values_meta_decomposition,
                          module="functionalize", torch_fn=_overwrite_values_torch)
"""``overwrite_values(a, new)``: ``a`` with its values replaced by ``new`` (same
shape and dtype) and its history kept: the value of a tensor after a write
autograd does not record. Its VJP (autodiff.py) sends the whole gradient to
``a`` and none to ``new``. The torch executor runs it as one copy; the
decomposition (``where`` over an all-true mask) lets a fusion executor fuse it."""


class NotFunctionalizable(Exception):
    """Why a write cannot be made functional here (the eager-mode fallback's reason)."""


class EagerRaises(RuntimeError):
    """An error eager raises in the forward that the eager-mode replay would not
    (it detaches the views made under no_grad): raised to the user, with the line."""


def _where(bsym: BoundSymbol) -> str:
    if bsym.source is None:
        return ""
    fname, lineno, text = bsym.source
    return f" at {fname}:{lineno}" + (f" ({text.strip()})" if text else "")


class _Rewriter:
    """The state of one pass (see the module docstring). Bookkeeping is keyed by
    the input trace's names (one per value, renamed members included); what is
    emitted reads ``swap``, their functional replacements."""

    def __init__(self, trace: Trace, keep: set[str], input_alias_groups, aliasing: dict[str, bool],
                 input_layouts: dict | None = None, eager: dict | None = None):
        self.trace = trace
        self.metas: dict = dict(eager or {})   # name -> eager's meta tensor (eager_layout.py), None: unknown
        self.aliasing = aliasing    # eager's view-or-copy of stride-dependent calls (eager_layout.py)
        self.decided: set[BoundSymbol] = set()   # reshapes eager_layout says are views
        self.cut: dict[str, str] = {}            # reshapes it says copy: output name -> input name
        self.used: set[str] = set()              # the decisions a functional write relied on
        self.opaque: set[str] = set()            # renamed by a write this pass leaves as it is
        self.inputs = {a.name: a for a in pytree.leaves(trace.args) if isinstance(a, TensorProxy)}
        self.certain: set = set()   # view leaves that alias their input on every call
        self.why: dict = {}          # opaque view -> why it stays one this pass cannot write through
        self.chain: dict[str, tuple] = {}    # name -> (base name, leaf view bsyms from the base)
        self.storages: dict[str, list[str]] = {}   # root -> the inputs sharing that storage
        self.shared_inputs = set()                 # inputs sharing storage in a way not described here
        for group in input_alias_groups or ():
            if len(group) > 1 and not self.share(group, input_layouts or {}):
                self.shared_inputs.update(group)
        self.keep = keep            # names written by composites that own their writes
        self.swap: dict[str, Proxy] = {}
        self.cur: dict[str, TensorProxy] = {}  # base name -> its current functional value
        self.base_proxy: dict[str, TensorProxy] = {}
        self.out: list[BoundSymbol] = []
        self.changed = False
        self.grad = True                  # grad mode where the pass is (set_grad_enabled switches)
        self.recorded: set[str] = set()   # bases a write autograd records changed
        self.nograd: set[str] = set()     # views made under no_grad: constants wherever replayed
        self.quiet: set[str] = set()      # inputs written only by writes autograd does not record
        self.guarded: set[str] = set()    # views made under no_grad of a tensor requiring grad
        self.stale: set[str] = set()      # such views after a write into their base: eager refuses reading them
        self.tainted: set[str] = set()    # bases whose detach()/.data alias a grad value was written into
        self.unreadable: set[str] = set()  # those aliases: eager gives them that value's history
        self.private: set[str] = set()     # clones a custom op writes (custom_write), read by nothing else
        self.written = _written_memory(trace, input_alias_groups)   # names sharing memory with a write

    def share(self, group: list[str], layouts: dict) -> bool:
        """Describe inputs sharing storage as views of one flat storage (their
        strides and offsets at compile time, guarded): each input is a gather
        from it, a write a scatter into it. False where this cannot."""
        ps = [self.inputs.get(n) for n in group]
        if any(p is None or n not in layouts for p, n in zip(ps, group, strict=True)) or \
                len({(p.dtype, p.device) for p in ps}) != 1 or any(p.numel() == 0 for p in ps):
            return False
        geo = [layouts[n] for n in group]
        if any(st < 0 for strides, _ in geo for st in strides):
            return False
        lo = min(off for _, off in geo)
        root = f"storage of {', '.join(group)}"
        m = self.metas.get(group[0])
        if m is not None and all(n in self.metas and same_storage(self.metas[n], m) for n in group):
            last = max(off + sum((k - 1) * st for k, st in zip(p.shape, strides, strict=True))
                       for p, (strides, off) in zip(ps, geo, strict=True))
            self.metas[root] = m.as_strided((last - lo + 1,), (1,), lo)     # eager's storage, from ``lo``
        for n, p, (strides, off) in zip(group, ps, geo, strict=True):
            link = StorageView(tuple(p.shape), tuple(strides), off - lo, n)
            self.chain[n] = (root, (link,))
            self.certain.add(link)
        self.storages[root] = list(group)
        return True

    def initial(self, base: str, dst: TensorProxy, chain: tuple, source) -> TensorProxy:
        """The value of ``base`` before its first write: a shared storage is
        assembled from the inputs that view it."""
        if base not in self.storages:
            return self.value(dst if not chain else first_arg(chain[0]))
        links = [self.chain[n][1][0] for n in self.storages[base]]
        size = max(v.last for v in links) + 1
        p = self.inputs[self.storages[base][0]]
        value = self.record(source, prims.full, (size,), 0, device=p.device, dtype=p.dtype)
        for n, v in zip(self.storages[base], links, strict=True):
            value = self.record(source, inverse, v, value, self.inputs[n])
        return value

    # --- emitting -------------------------------------------------------------------------------
    def sub(self, bsym: BoundSymbol) -> BoundSymbol:
        if not self.swap:
            return bsym
        f = lambda x: self.swap.get(x.name, x) if isinstance(x, Proxy) else x  # noqa: E731
        return bsym.replace(args=pytree.tree_map(f, bsym.args), kwargs=pytree.tree_map(f, bsym.kwargs),
                            subsymbols=tuple(self.sub(s) for s in bsym.subsymbols))

    def emit(self, bsym: BoundSymbol) -> None:
        """``bsym`` reading the functional values. Where one of them requires grad
        and the value it replaces did not (a write of a value requiring grad into
        a tensor that did not: eager's ``x.mul_(w)``), the symbol is recorded
        again, so its outputs' ``requires_grad`` is what eager gives them
        (not under no_grad: what it makes there is a constant)."""
        new = self.sub(bsym)
        if not self.grad or not any(n.requires_grad and not o.requires_grad
                                    for o, n in zip(bsym.tensor_args(), new.tensor_args(), strict=True)):
            self.out.append(new)
            return
        if Tag.OPAQUE in bsym.sym.tags or bsym.sym.module == "autograd_function":
            raise NotFunctionalizable(f"{bsym.sym.id}{_where(bsym)} reads a value that a write made require grad")
        result = self.record(bsym.source, bsym.sym, *new.args, **new.kwargs)
        for o, r in zip(pytree.leaves(bsym.output), pytree.leaves(result), strict=True):
            if isinstance(o, Proxy):
                self.swap[o.name] = r

    def record(self, source, fn, *args, **kwargs):
        scratch = Trace("scratch", names=self.trace.names)
        scratch.source = source
        with tracectx(scratch):
            result = fn(*args, **kwargs)
        self.out.extend(scratch.bound_symbols)
        return result

    def base_of(self, name: str) -> tuple[str, tuple]:
        return self.chain.get(name, (name, ()))

    def replay(self, chain: tuple, base: TensorProxy, source) -> TensorProxy:
        """The view ``chain`` on ``base``; a view made under no_grad stays a constant."""
        x = base
        for v in chain:
            x = self.record(source, v.sym, x, *v.args[1:], **v.kwargs)
        if any(isinstance(v.output, Proxy) and v.output.name in self.nograd for v in chain):
            x = self.constant(x, source)
        return x

    def made_without_grad(self, chain: tuple) -> bool:
        return any(isinstance(v.output, Proxy) and v.output.name in self.guarded for v in chain)

    def constant(self, p: TensorProxy, source) -> TensorProxy:
        return self.record(source, DETACH, p) if p.requires_grad else p

    # --- the pass ---------------------------------------------------------------------------------
    def top(self, bsym: BoundSymbol, parent: str = "") -> None:
        if self.unreadable and Tag.ALIAS_BARRIER not in bsym.sym.tags and \
                any(p.name in self.unreadable for p in bsym.proxy_args()):
            raise NotFunctionalizable(f"{bsym.sym.id}{_where(bsym)} reads a detach()/.data alias that a write gave "
                                      "a value requiring grad (eager gives the alias that value's history)")
        if self.stale and self.grad and Tag.ALIAS_BARRIER not in bsym.sym.tags and \
                any(p.name in self.stale for p in bsym.proxy_args()):
            raise EagerRaises(f"A view was created in no_grad mode and its base or another view of its base has "
                              f"been modified inplace since: reading it with grad mode enabled{_where(bsym)} is "
                              "forbidden (as in eager). Make the view outside no_grad, or read it under no_grad too.")
        if bsym.sym.id == SET_GRAD_ENABLED_ID:
            self.grad = bool(bsym.args[0])
            self.out.append(bsym)
        elif Tag.RETURN in bsym.sym.tags:
            self.finish(bsym)
        elif Tag.ALIAS_BARRIER in bsym.sym.tags:
            self.barrier(bsym)
        elif bsym.sym.module == "autograd_function":
            self.function_call(bsym)
        elif bsym.subsymbols and self.flattens(bsym) and not _owns_writes(bsym, self.keep):
            self.check_reads(bsym)
            for s in bsym.parts():
                self.top(s, bsym.sym.name)
        elif bsym.subsymbols:
            self.emit(bsym)
        else:
            self.leaf(bsym, parent)

    def flattens(self, bsym: BoundSymbol) -> bool:
        """Whether a composite is taken apart, leaf by leaf: where it writes, or
        returns a view of memory that some write of the program reaches (the
        view must be replayed on the written value). One that only reads
        stays one symbol reading the functional values (attention, a norm, a
        loss), and so does a split of memory no write reaches, so autodiff
        still finds its rule or fused kernel."""
        if any(writes(b) for b in walk(bsym)):
            return True
        return output_aliases_input(bsym) and any(p.name in self.written
                                                  for p in (*bsym.proxy_args(), *bsym.proxy_outs()))

    def function_call(self, bsym: BoundSymbol) -> None:
        """A ``torch.autograd.Function`` call stays one symbol (its backward is
        the user's): it reads the functional values. Its forward's writes into
        tensors it made itself are inside it already (update_aliases renamed
        them); a write into memory it did not make (an input, marked dirty or
        not) would have to leave it, which splits it from its backward."""
        external: dict[str, bool] = {p.name: True for p in free_tensors(bsym.subsymbols)}
        for leaf in walk(bsym):
            for o, b in views(leaf):
                external[o.name] = external.get(b.name, False)
            for dst, new in writes(leaf):
                if external.get(dst.name, False):
                    raise NotFunctionalizable(f"{bsym.sym.id}{_where(bsym)}: its forward writes {dst.name}, "
                                              "memory it did not create")
                if new is not None:
                    external[new.name] = False
        self.emit(bsym)

    def check_reads(self, bsym: BoundSymbol) -> None:
        """A write that reads another view of the memory it writes (``a.sub_(a[:, 0:1])``):
        eager's result depends on the order its kernel visits the elements, unless
        the view read is the one written (``y[1:] += 1`` reads ``y[1:]``), lies apart
        from it, or sits on the same positions and the op is elementwise from it
        (view_geometry.py); the functional form computes from the values before the write."""
        local: dict[str, tuple] = {}
        links: dict[str, tuple] = {}
        for leaf in walk(bsym):
            for o, b in views(leaf):
                root, chain = local.get(b.name) or self.elements(b.name)
                local[o.name] = (root, chain + (() if detaching(leaf) else (call_key(leaf),)))
                if not leaf.subsymbols and not writes(leaf):
                    links[o.name] = (leaf, b)
        for dst in _written_deep(bsym):
            allowed = {self.elements(dst.name), *local.values()}
            root = (local.get(dst.name) or self.elements(dst.name))[0]
            for p in bsym.tensor_args():
                other = self.elements(p.name)
                if other[0] == root and other not in allowed and not self.apart_or_same(bsym, dst, p, links):
                    raise NotFunctionalizable(f"{bsym.sym.id}{_where(bsym)} reads another view of the memory "
                                              "it writes")

    def apart_or_same(self, bsym: BoundSymbol, dst: TensorProxy, p: TensorProxy, links: dict) -> bool:
        """``p`` touches none of the positions ``bsym`` writes into ``dst``, or
        exactly them, each read only by the element written there (see check_reads)."""
        region = view_geometry.written_view(bsym, dst, links)
        try:
            written, read = self.geo(region, links), self.geo(p, links)
            if written is None or read is None:
                return False
            if view_geometry.disjoint(written, read):
                return True
            return view_geometry.same_positions(written, read) and view_geometry.eager_allows(written, read) \
                and view_geometry.elementwise_from(bsym, p, dst, region)
        except DataDependentError:      # a size known only at run time
            return False

    def geo(self, p: TensorProxy, links: dict) -> view_geometry.Geo | None:
        """Where ``p`` lies in its root's memory (view_geometry.py); ``links``:
        views made inside the symbol being checked."""
        if p.name in links:
            leaf, b = links[p.name]
            return view_geometry.apply(self.geo(b, links), leaf)
        base, chain = self.base_of(p.name)
        if base in self.storages:
            _, shape, strides, offset, _ = chain[0].args
            g, chain = view_geometry.placed(shape, strides, offset), chain[1:]
        elif chain and isinstance(chain[0], Strided):
            # eager's strides in a dense base's storage: the stand-in's where the base is contiguous
            _, shape, strides, offset, order = chain[0].args
            contiguous = order == tuple(range(len(order)))
            g = view_geometry.Geo(shape, strides, offset, None, False) if contiguous else None
            chain = chain[1:]
        else:
            g = view_geometry.stand_in(first_arg(chain[0]).shape if chain else p.shape)
        for v in chain:
            g = view_geometry.apply(g, v)
        return g

    def geometry(self, name: str) -> tuple:
        """The root and the view calls from it (equal for two views of the same elements)."""
        base, chain = self.base_of(name)
        return base, tuple(call_key(v) for v in chain)

    def elements(self, name: str) -> tuple:
        """``geometry`` without ``detach()``/``.data`` links: which elements, whatever the alias."""
        base, chain = self.base_of(name)
        return base, tuple(call_key(v) for v in chain if not detaching(v))

    def leaf(self, bsym: BoundSymbol, parent: str = "") -> None:
        pairs = writes(bsym)
        if pairs:
            if bsym.sym.meta is prims.copy_.meta:
                self.write(bsym)
            elif overload_of_symbol(bsym.sym) is not None:
                self.custom_write(bsym, pairs)
            else:
                raise NotFunctionalizable(f"{bsym.sym.id} writes its argument{_where(bsym)}")
            return
        pairs = views(bsym)
        if len(pairs) == 1 and len(bsym.tensor_outs()) == 1 and bsym.sym.meta not in _CERTAIN and \
                bsym.sym.meta is not prims.reshape.meta and not detaching(bsym) and self.settle(bsym, *pairs[0]):
            return
        self.emit(bsym)
        for o, b in pairs:
            if self.copies(bsym, o, parent):
                self.cut[o.name] = b.name       # fresh memory in eager: a root of its own
                continue
            base, chain = self.base_of(b.name)
            self.chain[o.name] = (base, chain + (bsym,))
            if not self.grad:
                self.nograd.add(o.name)
                # a view autograd knows as one (not detach/.data/unsafe_split) of a tensor requiring grad
                if (b.requires_grad or b.name in self.guarded) and not detaching(bsym) and \
                        Tag.HIDDEN_VIEW not in bsym.sym.tags:
                    self.guarded.add(o.name)
            if detaching(bsym) or (bsym.sym.meta in _CERTAIN and
                                    (bsym.sym.meta is not prims.reshape.meta or parent in _ALWAYS_VIEW)):
                self.certain.add(bsym)
            elif bsym.sym.meta is prims.reshape.meta and self.aliasing.get(o.name):
                self.certain.add(bsym)
                self.decided.add(bsym)
            elif bsym.sym.meta is not prims.reshape.meta and not self.tracked(bsym, o, b):
                self.why[bsym] = "makes an alias autograd does not track as a view (a write through it changes " \
                                 "values, not gradients)"

    def custom_write(self, bsym: BoundSymbol, pairs: list) -> None:
        """A custom op writing its arguments (``Tensor(a!)``, torch/custom_ops.py):
        it runs on clones of the tensors it writes, and each clone's new value is
        written into its tensor as a ``copy_`` would be (views, aliases, inputs:
        ``write``). The op stays one opaque call on the gradient path, so the
        new value's gradient is eager's: through the clone alone where the op
        writes below autograd (a ``custom_op``: the written tensor keeps its
        history, and an input written only so is written back quietly),
        through the kernel's recorded ops for a ``Library.define`` op. Its
        fresh returns keep their meaning (no formula: backward raises eager's
        error); a return naming a written argument is that tensor's new value."""
        news = {n.name for _, n in pairs if n is not None}
        if any(o.name not in news for o, _ in views(bsym)):
            raise NotFunctionalizable(f"{bsym.sym.id}{_where(bsym)} writes an argument and returns a view of "
                                      "another")
        written = _written_positions(bsym)
        self.check_custom_reads(bsym, written)
        # one clone per tensor written; where eager passes that same tensor again, the op gets the clone again
        clones = {self.geometry(p.name): None for i in written for p in pytree.leaves(bsym.args[i])
                  if isinstance(p, TensorProxy)}

        def leaf(p):
            if not isinstance(p, TensorProxy):
                return p
            v = self.value(p) if self.grad else self.constant(self.value(p), bsym.source)
            key = self.geometry(p.name)
            if key not in clones:
                return v
            if clones[key] is None:
                clones[key] = self.record(bsym.source, prims.clone, v)
                self.private.add(clones[key].name)
            return clones[key]
        args = pytree.tree_map(leaf, bsym.args)
        result = self.record(bsym.source, bsym.sym, *args, **bsym.kwargs)
        op = self.out[-1]
        assert op.sym is bsym.sym, "a custom op records one leaf symbol"
        below = Tag.WRITES_BELOW_AUTOGRAD in bsym.sym.tags
        for (dst, new), (_, value) in zip(pairs, writes(op), strict=True):
            if new is not None:
                self.write(prims.copy_.bind(value, dst, output=new, source=bsym.source), below_autograd=below)
        for o, r in zip(pytree.leaves(bsym.output[1]), pytree.leaves(result[1]), strict=True):
            if isinstance(o, Proxy) and o.name not in news:
                self.swap[o.name] = r
        self.changed = True

    def check_custom_reads(self, bsym: BoundSymbol, written: set[int]) -> None:
        """A custom op's kernel is opaque: a tensor it writes may share no
        memory with another tensor it is given (written or read), unless the
        two lie apart (view_geometry.py) or are the same view (the op then gets
        one clone for both, as eager gives it one tensor). Otherwise eager's
        result depends on the order the kernel reads and writes."""
        given = [(p, i in written) for i, a in enumerate(bsym.args) for p in pytree.leaves(a)
                 if isinstance(p, TensorProxy)]
        for k, (p, pw) in enumerate(given):
            for q, qw in given[k + 1:]:
                if (pw or qw) and self.elements(p.name)[0] == self.elements(q.name)[0] and \
                        self.geometry(p.name) != self.geometry(q.name) and not self.lie_apart(p, q):
                    raise NotFunctionalizable(f"{bsym.sym.id}{_where(bsym)} writes a tensor sharing memory with "
                                              f"another it is given ({p.name}, {q.name})")

    def lie_apart(self, p: TensorProxy, q: TensorProxy) -> bool:
        try:
            a, b = self.geo(p, {}), self.geo(q, {})
            return a is not None and b is not None and view_geometry.disjoint(a, b)
        except DataDependentError:      # a size known only at run time
            return False

    def settle(self, bsym: BoundSymbol, o: TensorProxy, b: TensorProxy) -> bool:
        """An opaque view (``contiguous``, ``alias``, ``as_strided``, ``sum_to_size``...)
        as eager makes it for the layouts compiled for (eager_layout.py): fresh
        memory where eager copies; where its layout is its input's or the base's,
        the same elements; else a strided view of the base (``Strided``). False
        where that is unknown, or where autograd does not see the alias
        (``unsafe_split``: its writes change values, not histories; autograd's
        view base is not the base's): the view then stays one this pass cannot
        write through (``detach()``/``.data`` never come here: they are links of
        their own, ``detaching``). A view is emitted as the elements
        it names (``b``'s value, a gather), so it reads what writes made of
        them, as eager's view does."""
        m_in, m = self.layout(b.name), eager_view(bsym, o, self.layout)
        if m_in is None or m is None:
            return False
        base, chain = self.base_of(b.name)
        root = self.layout(base)
        now = self.current(base, chain, b, bsym.source)
        if not same_storage(m, m_in):
            self.emit(bsym)
            self.cut[o.name] = b.name
        elif root is not None and same_storage(m, root) and autograd_view(m, root) and not same_layout(m, m_in):
            if same_layout(m, root):
                self.chain[o.name] = (base, ())
                self.swap[o.name] = now
            else:
                if not within(m, m_in):
                    self.why[bsym] = "makes a view reaching past its input's elements (autograd differentiates " \
                                     "it through those only)"
                    return False
                link = self.strided(base, m, first_arg(chain[0]) if chain else b)
                if link is None:
                    return False
                self.chain[o.name] = (base, (link,))
                self.swap[o.name] = self.replay((link,), now, bsym.source)
        elif autograd_view(m, m_in) and same_layout(m, m_in):
            self.chain[o.name] = (base, chain)      # the same elements as its input
            self.swap[o.name] = self.value(b)
        else:
            return False
        self.rely(base, o.name)
        self.metas[o.name] = m
        return True

    def tracked(self, bsym: BoundSymbol, o: TensorProxy, b: TensorProxy) -> bool:
        """False where eager's ``o`` shares ``b``'s memory but autograd does not
        see it as a view (``settle``); True where it does or that is unknown."""
        m_in, m = self.layout(b.name), eager_view(bsym, o, self.layout)
        return m is None or m_in is None or not same_storage(m, m_in) or autograd_view(m, m_in)

    def layout(self, name: str):
        """Eager's meta tensor for ``name`` (its shape, strides, storage offset),
        from the top-level values' (eager_layout.py) through the view chain; None
        where unknown."""
        if name in self.metas:
            return self.metas[name]
        base, chain = self.base_of(name)
        m = self.layout(base) if base != name else None
        if chain:
            v = chain[-1]
            if isinstance(v, Strided):
                m = v.on(self.layout(base))
            elif isinstance(v, StorageView) or len(v.tensor_outs()) != 1:
                m = None
            else:
                m = eager_view(v, v.tensor_outs()[0], self.layout)
        self.metas[name] = m
        return m

    def strided(self, base: str, m, root: TensorProxy):
        """``m`` (a meta view of ``base``'s storage) as a ``Strided`` link from
        ``base`` (the proxy ``root``), or None where ``base`` is not dense (its
        elements are not one block of its storage) or ``m`` reaches outside it."""
        r = self.layout(base)
        if m is None or r is None or m.dtype != r.dtype or not same_storage(m, r) or r.numel() == 0:
            return None
        order = storage_order(r)
        lo = m.storage_offset() - r.storage_offset()
        hi = lo + sum((n - 1) * st for n, st in zip(m.shape, m.stride(), strict=True))
        if order is None or (m.numel() and (lo < 0 or hi >= r.numel())):
            return None
        link = Strided(tuple(m.shape), tuple(m.stride()), lo, order, root)
        self.certain.add(link)
        return link

    def rely(self, base: str, name: str) -> None:
        """A decision read eager's layouts: guard the strides of the inputs behind
        ``name`` and ``base`` and, for an input base, its storage offset
        (``as_strided`` places its view by it)."""
        self.used.update((name, base))
        if base in self.inputs:
            self.used.add(f"layout:{base}")

    def writable(self, base: str, chain: tuple, dst: TensorProxy, at: BoundSymbol) -> tuple:
        """``chain``, or one ``Strided`` link to the written elements where a link
        of it has no inverse (an expanded view written where no element repeats,
        ``as_strided``): the scatter puts each written value in its one place."""
        bad = next((v for v in chain if not invertible(v)), None)
        if bad is None:
            return chain
        link = self.strided(base, self.layout(dst.name), first_arg(chain[0]))
        if link is None or link.overlaps:
            raise NotFunctionalizable(f"the write through a {bad.sym.id} view{_where(at)} has no functional "
                                      "form here")
        self.rely(base, dst.name)
        return (link,)

    def copies(self, bsym: BoundSymbol, o: TensorProxy, parent: str) -> bool:
        """A reshape eager makes as a copy for these inputs' strides."""
        return bsym.sym.meta is prims.reshape.meta and parent not in _ALWAYS_VIEW and \
            self.aliasing.get(o.name) is False

    def write(self, bsym: BoundSymbol, below_autograd: bool = False) -> None:
        src = self.sub(bsym).args[0] if bsym.args else self.sub(bsym).kwargs["src"]
        dst = bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs["dst"]
        base, chain = self.base_of(dst.name)
        if base in self.opaque:
            raise NotFunctionalizable(f"the write{_where(bsym)} lands in a tensor an earlier write left as it is")
        if base in self.shared_inputs:
            raise NotFunctionalizable(f"the written input {base}{_where(bsym)} shares storage with another "
                                      "input of the program")
        self.check_chain(chain, bsym)
        written = self.writable(base, chain, dst, bsym)
        # eager: a write under no_grad or through a detach()/.data alias changes values, not history
        unrecorded = not self.grad or any(detaching(v) for v in chain)
        if unrecorded and self.grad and isinstance(src, TensorProxy) and src.requires_grad:
            # the base takes the values only; the alias, which eager gives src's history, must not be read
            self.tainted.add(base)
            self.unreadable.add(bsym.output.name)
        old = self.current(base, chain, dst, bsym.source)
        if isinstance(src, TensorProxy) and src.dtype != dst.dtype:
            src = self.record(bsym.source, prims.convert_element_type, src, dst.dtype)
        if not isinstance(src, TensorProxy) or src.shape != dst.shape:
            src = self.record(bsym.source, broadcast_to, src, dst)
        self.cur[base] = self.scatter(old, src, written, bsym.source, unrecorded)
        if self.made_without_grad(chain):
            self.stale.add(bsym.output.name)
        if not unrecorded and not below_autograd:
            self.recorded.add(base)
        self.swap[bsym.output.name] = self.replay(chain, self.cur[base], bsym.source) if chain else self.cur[base]
        self.chain[bsym.output.name] = (base, chain)
        self.changed = True

    def current(self, base: str, chain: tuple, p: TensorProxy, source) -> TensorProxy:
        """The functional value of ``base`` now (``p``: a tensor ``chain`` views of it)."""
        if base in self.cur:
            return self.cur[base]
        if base not in self.base_proxy:
            self.base_proxy[base] = self.initial(base, p, chain, source)
        return self.base_proxy[base]

    def value(self, p: Proxy) -> Proxy:
        return self.swap.get(p.name, p)

    def check_chain(self, chain: tuple, at: BoundSymbol) -> None:
        for v in chain:
            if v in self.decided:
                self.used.add(v.output.name)
            if v not in self.certain and v.sym.meta is prims.reshape.meta:
                raise NotFunctionalizable(f"{v.sym.id} may copy instead of viewing (it depends on strides), and "
                                          f"a write{_where(at)} changes its group")
            if v in self.why:
                raise NotFunctionalizable(f"{v.sym.id} {self.why[v]}, and a write{_where(at)} changes its group")
            if v not in self.certain:
                raise NotFunctionalizable(f"{v.sym.id} makes a view this pass cannot scatter into or replay "
                                          f"(an opaque or expanding view), and a write{_where(at)} changes its group")

    def scatter(self, base: TensorProxy, src: TensorProxy, chain: tuple, source,
                unrecorded: bool = False) -> TensorProxy:
        new = src
        if chain:
            values = [base]
            for v in chain[:-1]:
                values.append(self.record(source, v.sym, values[-1], *v.args[1:], **v.kwargs))
            for v, x in zip(reversed(chain), reversed(values), strict=True):
                new = self.record(source, inverse, v, x, new)
        if unrecorded:      # the base keeps its whole history; the written values carry none
            return self.record(source, overwrite_values, base, new) if base.requires_grad else \
                self.constant(new, source)
        # where(mask, new, base) or a scatter: the base keeps its history where not written
        selected = bool(chain) and (isinstance(chain[0], (StorageView, Strided))
                                    or chain[0].sym.meta is prims.slice_prim.meta)
        if base.requires_grad and not selected:
            # eager: the overwritten tensor keeps its history (a zero gradient, still requires grad)
            new = self.record(source, overwrite, base, new)
        return new

    def barrier(self, bsym: BoundSymbol) -> None:
        members, after = bsym.args
        written = {self.base_of(a.name)[0] for a in after} & set(self.cur)
        if not written:                 # a write left as it is (a composite's own): its group is opaque here
            self.out.append(self.sub(bsym))
            self.opaque.update(n.name for n in bsym.output)
            return
        bases = [self.base_of(m.name) for m in members]
        apart = self.apart(written | {b for b, _ in bases if b in self.cur})
        for (base, chain), m, n in zip(bases, members, bsym.output, strict=True):
            if m.name in self.unreadable or (base in self.tainted and any(detaching(v) for v in chain)):
                self.unreadable.add(n.name)
            if base in self.opaque or (base not in self.cur and base not in apart):
                raise NotFunctionalizable("an alias group mixes tensors written functionally and not"
                                          + _where(bsym))
            if base not in self.cur:    # eager copied it: the write did not reach it
                self.swap[n.name] = self.value(m)
                self.chain[n.name] = (base, chain)
                continue
            self.check_chain(chain, bsym)
            if m.name in self.stale or self.made_without_grad(chain):
                self.stale.add(n.name)
            self.swap[n.name] = self.replay(chain, self.cur[base], bsym.source) if chain else self.cur[base]
            self.chain[n.name] = (base, chain)
        self.tainted -= written

    def apart(self, written: set[str]) -> set[str]:
        """Roots joined to the ``written`` roots only through reshapes eager
        copies: their memory is their own (the decisions are recorded as used)."""
        reach, todo = set(written), list(written)
        while todo:
            r = todo.pop()
            for out, src in self.cut.items():
                ends = (out, self.base_of(src)[0])
                if r in ends:
                    other = ends[1] if r == ends[0] else ends[0]
                    self.used.add(out)
                    if other not in reach:
                        reach.add(other)
                        todo.append(other)
        return reach - written

    def finish(self, ret: BoundSymbol) -> None:
        """Write each written input's final value back (``copy_`` right before the
        return: the caller's tensor changes once, with the result of every write),
        and return the input itself where the program returns it."""
        written = {n: self.base_of(n) for n in self.inputs if self.base_of(n)[0] in self.cur}
        finals = {n: self.replay(chain, self.cur[base], ret.source) if chain else self.cur[base]
                  for n, (base, chain) in written.items()}
        self.quiet = {n for n, (base, _) in written.items() if base not in self.recorded}
        for n, final in finals.items():         # the copies last, together (take_write_backs)
            self.record(ret.source, prims.copy_, final, self.inputs[n])
        itself = {self.geometry(n): n for n in written}

        def leaf(x):
            if not isinstance(x, TensorProxy) or self.base_of(x.name)[0] not in self.cur:
                return self.value(x) if isinstance(x, TensorProxy) else x
            same = itself.get(self.geometry(x.name))
            if same is not None:
                return self.inputs[same]
            base, chain = self.base_of(x.name)
            if base not in self.inputs and base not in self.storages:
                return self.value(x)
            if base in self.storages and not isinstance(chain[0], StorageView):
                # a view of the shared storage itself (as_strided over it): no one input to make it from
                raise NotFunctionalizable(f"the program returns a view of the storage of inputs it writes ({base})"
                                          + _where(chain[-1]))
            name, rest = (chain[0].args[4], chain[1:]) if base in self.storages else (base, chain)
            if not rest or any(isinstance(v, StorageView) for v in rest) or \
                    any(isinstance(v, Strided) for v in rest[1:]):
                raise NotFunctionalizable(f"the program returns a view of an input it writes ({base})"
                                          + _where(chain[-1]))
            view = self.inputs[name]
            if isinstance(rest[0], Strided):
                # eager's elements of the input laid out as compiled for (its offset is guarded)
                _, shape, strides, offset, _ = rest[0].args
                start = self.layout(name).storage_offset() + offset
                view = self.record(ret.source, opaque_symbol_for(torch.Tensor.as_strided), view, shape, strides, start)
                rest = rest[1:]
            self.check_chain(rest, ret)
            # a view of the input as it is after the write-back (take_write_backs: the epilogue)
            return self.replay(rest, view, ret.source)
        self.out.append(ret.replace(args=pytree.tree_map(leaf, ret.args)))


def _written_positions(bsym: BoundSymbol) -> set[int]:
    """The positions of a custom op's arguments its schema says it writes."""
    schema = overload_of_symbol(bsym.sym)._schema
    return {i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write}


def _written_memory(trace: Trace, input_alias_groups) -> set[str]:
    """The names of every value that may share memory with a value some write
    of ``trace`` changes (views and writes at every level of decomposition,
    alias barriers' members, inputs sharing storage), or is a program input a
    write reaches: only their composites' views must be taken apart."""
    parent: dict[str, str] = {}

    def find(n: str) -> str:
        while parent.get(n, n) != n:
            parent[n] = parent.get(parent[n], parent[n])
            n = parent[n]
        return n

    def join(names) -> None:
        names = [find(n) for n in names]
        for n in names[1:]:
            parent[n] = names[0]
    written: list[str] = []
    for top in trace.bound_symbols:
        if Tag.ALIAS_BARRIER in top.sym.tags:
            join([p.name for p in (*top.proxy_args(), *top.proxy_outs())])
            written.extend(p.name for p in top.proxy_outs())
            continue
        for b in walk(top):
            for o, base in views(b):
                join([o.name, base.name])
            for dst, new in writes(b):
                join([dst.name] + ([new.name] if isinstance(new, Proxy) else []))
                written.append(dst.name)
    for group in input_alias_groups or ():
        if len(group) > 1:
            join(list(group))
            written.extend(group)
    roots = {find(n) for n in written}
    return {n for n in (*parent, *written) if find(n) in roots}


def _owns_writes(bsym: BoundSymbol, keep: set[str]) -> bool:
    return bool(keep) and any(d.name in keep for d in _written_deep(bsym))


def _written_deep(bsym: BoundSymbol):
    for d, _ in writes(bsym):
        yield d
    for s in bsym.subsymbols:
        yield from _written_deep(s)


FUNCTIONALIZE_STAGE = "functionalize"


@trace_pass(FUNCTIONALIZE_STAGE)
def functionalize(trace: Trace, keep: set[str] = frozenset(), input_alias_groups=None,
                  aliasing: dict[str, bool] | None = None, used: set[str] | None = None,
                  input_layouts: dict | None = None, eager: dict | None = None,
                  quiet: set[str] | None = None, private: set[str] | None = None) -> Trace:
    """The trace with writes into views and inputs made functional, or the
    trace itself when it has none. ``keep``: names whose writes stay as they are
    (the hidden writes of composites that own them, such as batch_norm's
    running statistics). Written inputs get their final value by one ``copy_``
    each right before the return (``take_write_backs`` finds them).
    ``aliasing``: eager's view-or-copy decision for stride-dependent calls
    (eager_layout.py); the names of those the result relies on are added to
    ``used``. ``input_layouts`` (input name -> (strides, storage offset)) lets
    inputs sharing storage be described as views of that storage; the names of
    those inputs are added to ``used`` as ``"layout:<name>"``, and so are inputs
    whose storage offset placed an opaque view. ``eager`` (name -> meta tensor,
    ``eager_layout.eager_tensors``) gives eager's layouts, from which opaque
    views and writes through expanded views are described. ``quiet`` gets the
    names of inputs only writes autograd does not record change (no_grad,
    ``detach()``/``.data``, a ``custom_op``): their write-back is not recorded
    either. ``private`` gets the names of the clones a custom op writes
    (``custom_write``): nothing else reads them. Raises
    ``NotFunctionalizable`` with the reason."""
    rw = _Rewriter(trace, set(keep), input_alias_groups, aliasing or {}, input_layouts, eager)
    for bsym in trace.bound_symbols:
        rw.top(bsym)
    if used is not None:
        used.update(rw.used)
        used.update(f"layout:{n}" for root, names in rw.storages.items() if root in rw.cur for n in names)
    if quiet is not None:
        quiet.update(rw.quiet)
    if private is not None:
        private.update(rw.private)
    if not rw.changed:
        return trace
    return trace.with_bound_symbols("", rw.out)
