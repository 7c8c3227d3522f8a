"""Passes for a program that ran its own backward (a whole training step,
docs/architecture.md §9; frontend/training/): it runs without autograd, and each
parameter's update can run as soon as its gradient is final.

- ``drop_autograd_markers``: grad-mode switches, and ``requires_grad_(False)``
  on values the program made, change nothing when the whole program runs
  under ``no_grad``; dropped, they no longer stop reordering (they are
  ``ORDER_BARRIER``s).
- ``schedule_updates``: every symbol after the program's last backward (the
  optimizer, clipping, ``zero_grad``) moves up to right after the last symbol
  it depends on (data, alias order, effects: ``fusion.dependencies``). An
  update then follows its gradient's last producer (and the last read of the
  parameter it overwrites), so ``del_last_used`` frees each gradient there
  when nothing outside observes it (``zero_grad(set_to_none=True)``): the
  gradients of a step are never all alive at once. What needs every gradient
  (``clip_grad_norm_``'s total norm) keeps the updates after the backward.
- ``batch_scalar_chains``: the same 0-d CPU arithmetic repeated per parameter
  (AdamW's bias corrections from each step count: nine kernels a parameter on
  its compiling path) runs once on the stacked inputs.
"""
from __future__ import annotations

from thunderlite.core import prims, pytree
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.retrace import rename_bsym
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.core.tracectx import tracectx
from thunderlite.torch.ops import shapes as ltorch
from thunderlite.torch.ops.grad_mode import SET_GRAD_ENABLED_ID, requires_grad_marker
from thunderlite.transforms.aliasing.update_aliases import ordering_edges
from thunderlite.transforms.autodiff.rematerialize import is_cheap
from thunderlite.transforms.fusion import dependencies


@trace_pass("drop_autograd_markers")
def drop_autograd_markers(trace: Trace) -> Trace:
    """``trace`` without the symbols that only matter to autograd (see the module docstring)."""
    inputs = {a.name for a in trace.args if isinstance(a, Proxy)}

    def keep(b) -> bool:
        if b.sym.id == SET_GRAD_ENABLED_ID:
            return False
        if b.sym is requires_grad_marker:
            flag = b.args[1] if len(b.args) > 1 else b.kwargs.get("requires_grad", True)
            return bool(flag) or b.args[0].name in inputs
        return True
    kept = [b for b in trace.bound_symbols if keep(b)]
    return trace if len(kept) == len(trace.bound_symbols) else trace.with_bound_symbols("", kept)


@trace_pass("schedule_updates")
def schedule_updates(trace: Trace, backward_names: frozenset[str], input_alias_groups=None) -> Trace:
    """Each symbol after the last one defining a name of ``backward_names``
    (the last backward's values) placed right after its last dependency."""
    bsyms = trace.bound_symbols
    start = max((i for i, b in enumerate(bsyms) if any(p.name in backward_names for p in b.proxy_outs())),
                default=-1) + 1
    if start <= 0 or start >= len(bsyms) - 1:
        return trace
    preds = dependencies(trace, input_alias_groups)
    order = list(range(start))
    where = {i: k for k, i in enumerate(order)}
    for i in range(start, len(bsyms)):
        if Tag.RETURN in bsyms[i].sym.tags:
            order.append(i)
            continue
        at = max((where[j] for j in preds[i]), default=-1) + 1
        order.insert(at, i)
        where = {j: k for k, j in enumerate(order)} if at < len(order) - 1 else {**where, i: at}
    if order == list(range(len(bsyms))):
        return trace
    return trace.with_bound_symbols("", [bsyms[i] for i in order])


def _elementwise(b) -> bool:
    """Elementwise arithmetic, its Python numbers made tensors (``pow(0.9, t)``: a ``full``)."""
    if is_cheap(b):
        return True
    return (not b.sym.tags & {Tag.RANDOM, Tag.INPLACE, Tag.DONT_DCE} and bool(b.subsymbols)
            and all(s.sym is prims.full or _elementwise(s) for s in b.subsymbols))


def _scalar(b) -> bool:
    """Elementwise arithmetic on 0-d CPU tensors only, with one output."""
    outs = b.proxy_outs()
    return (len(outs) == 1 and type(outs[0]) is TensorProxy and outs[0].shape == () and outs[0].is_cpu
            and _elementwise(b) and all(type(a) is TensorProxy and a.shape == () and a.is_cpu
                                        for a in b.proxy_args()))


def _components(bsyms, scalar: list[int]) -> list[list[int]]:
    """The scalar symbols joined by what they read of each other, each in trace order."""
    comp: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    producer: dict[str, int] = {}
    for i in scalar:
        mine = {comp[producer[a.name]] for a in bsyms[i].proxy_args() if a.name in producer}
        root = min(mine) if mine else i
        members.setdefault(root, [])
        for r in mine - {root}:
            for j in members.pop(r):
                comp[j] = root
                members[root].append(j)
        comp[i] = root
        members[root].append(i)
        producer[bsyms[i].output.name] = i
    return [sorted(m) for m in members.values()]


def _signature(bsyms, idx: list[int]):
    """What a chain computes, its inputs by position: equal for the same
    arithmetic on other tensors (one optimizer's bias corrections, per
    parameter). Also each proxy's place: ``("in", k)`` or ``("out", n)``."""
    local: dict[str, tuple] = {}
    inputs: list[TensorProxy] = []
    sig = []

    def key(x):
        if isinstance(x, Proxy):
            if x.name not in local:
                local[x.name] = ("in", len(inputs))
                inputs.append(x)
            return (*local[x.name], str(x.dtype))
        return ("const", type(x).__name__, repr(x))
    for n, i in enumerate(idx):
        b = bsyms[i]
        sig.append((b.sym.id, str(b.output.dtype), tuple(key(a) for a in b.args),
                    tuple(sorted((k, key(v)) for k, v in b.kwargs.items()))))
        local[b.output.name] = ("out", n)
    return tuple(sig), inputs, local


@trace_pass("batch_scalar_chains")
def batch_scalar_chains(trace: Trace, input_alias_groups=None) -> Trace:
    """Chains of 0-d CPU arithmetic that repeat per parameter (an optimizer's
    bias corrections from each step count, on its compiling path) computed
    once on the stacked inputs, each chain's results read back as views of
    the batch (``unbind``): one kernel per step of the chain instead of one
    per parameter, the same arithmetic on the same values (of the same
    dtypes). A group is batched where all its inputs exist before any of its
    results is read and no write into what it reads runs before it
    (``ordering_edges``: two ``opt.step()`` in one program)."""
    bsyms = trace.bound_symbols
    scalar = [i for i, b in enumerate(bsyms) if Tag.RETURN not in b.sym.tags and _scalar(b)]
    groups: dict[tuple, list] = {}
    for idx in _components(bsyms, scalar):
        sig, inputs, local = _signature(bsyms, idx)
        groups.setdefault(sig, []).append((idx, inputs, local))
    read_by: dict[str, list[int]] = {}
    for i, b in enumerate(bsyms):
        for a in b.proxy_args():
            read_by.setdefault(a.name, []).append(i)
    producer = {p.name: i for i, b in enumerate(bsyms) for p in b.proxy_outs()}
    # a chain may not move past a write into what it reads (its inputs' storage)
    later_writes: dict[int, list[int]] = {}
    for reader, writer in ordering_edges(trace, input_alias_groups):
        later_writes.setdefault(reader, []).append(writer)
    insert: dict[int, list] = {}
    drop: set[int] = set()
    for sig, chains in groups.items():
        if len(chains) < 2 or not chains[0][1]:        # alone, or constants only
            continue
        mine = {i for idx, _, _ in chains for i in idx}
        at = max((producer.get(a.name, -1) for _, ins, _ in chains for a in ins), default=-1)
        if any(w <= at for i in mine for w in later_writes.get(i, ())):
            continue
        outside = {bsyms[i].output.name: [r for r in read_by.get(bsyms[i].output.name, ()) if r not in mine]
                   for i in mine}
        if any(r <= at for rs in outside.values() for r in rs):
            continue
        insert.setdefault(at, []).extend(_batched(trace, sig, chains, outside))
        drop |= mine
    if not drop:
        return trace
    out = list(insert.get(-1, []))
    for i, b in enumerate(bsyms):
        if i not in drop:
            out.append(b)
        out.extend(insert.get(i, []))
    return trace.with_bound_symbols("", out)


def _batched(trace: Trace, sig, chains, outside: dict[str, list[int]]) -> list:
    """The symbols computing ``chains`` (of equal ``sig``) on stacked inputs;
    a result read outside its chain is unbound under its own name."""
    bsyms = trace.bound_symbols
    rep, _, local = chains[0]
    scratch = Trace("batch", names=trace.names)
    with tracectx(scratch):
        stacked = [ltorch.stack([ins[k] for _, ins, _ in chains]) for k in range(len(chains[0][1]))]
        values: list = []
        for i in rep:
            b = bsyms[i]
            swap = {}
            for a in b.proxy_args():
                kind, k = local[a.name]
                swap[a.name] = stacked[k] if kind == "in" else values[k]
            values.append(b.sym(*_swap(b.args, swap), **_swap(b.kwargs, swap)))
        for n in range(len(rep)):
            names = [bsyms[idx[n]].output for idx, _, _ in chains]
            if any(outside[o.name] for o in names):
                parts = ltorch.unbind(values[n])
                scratch.bound_symbols[-1] = rename_bsym(
                    scratch.bound_symbols[-1], {p.name: o for p, o in zip(parts, names, strict=True)})
    return scratch.bound_symbols


def _swap(tree, swap: dict):
    return pytree.tree_map(lambda x: swap.get(x.name, x) if isinstance(x, Proxy) else x, tree)
