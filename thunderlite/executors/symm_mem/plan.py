"""Which arguments must live in symmetric memory, and the pass that puts them
there (docs/architecture.md §15).

Declarations come from two places, both keyed by the op's qualified name
(``ns::op`` or ``ns::op.overload``, as ``OpOverload.name()`` spells it):

- ``torch.library.Library.register_symm_mem_args(op, [names])`` (torch >= 2.13),
  stored by torch in ``torch._library.simple_registry.singleton`` per op
  (``entry.symm_mem_args.get()``), the registry Inductor reads;
- thunderlite's own ``declare_symm_mem_args``: for PyTorch's ``symm_mem::``
  ops (torch does not declare them) and for symbols an executor defines.

A declared argument needs the op's ``group_name`` argument to say which group
the buffer is rendezvoused with; an op without one is left alone (Inductor
does the same).

``plan_symm_mem(trace, ...)`` rewrites a trace so every declared argument is a
symmetric buffer (``TensorProxy.memory == "symm_mem:<group>"``):

- the producer writes into the buffer itself when it can (a torch function
  with an ATen ``out=`` overload, one tensor output, not requiring grad):
  ``buf = symm_mem.buffer(...)`` then ``t = symm_mem.<fn>_into(buf, ...)``;
- otherwise (a program input, a view, a fused region, an op without ``out=``)
  the value is copied: ``buf = symm_mem.buffer(...)``,
  ``t' = prims.copy_(t, buf)``; when the op writes that argument the result is
  copied back into ``t`` right after the op, so the caller's tensor changes as
  in eager;
- buffers are cached by the executor across calls (per shape, dtype, device,
  group and allocation site), so a value still aliasing one when the trace
  returns is cloned first: a returned tensor never changes under the caller.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core import prims
from thunderlite.core.aliasing import call_views, views, writes
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.retrace import rename_bsym
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.torch import custom_ops

_own: dict[Any, tuple[str, ...]] = {}


def _key(op: Any) -> Any:
    if isinstance(op, torch._ops.OpOverload):
        return op.name()
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op._qualified_op_name
    return op                       # a qualified name, or a Symbol an executor defines


def declare_symm_mem_args(op: Any, arg_names: list[str] | tuple[str, ...]) -> None:
    """thunderlite's own declaration: ``op`` (an OpOverload, ``"ns::op"`` or an
    executor's Symbol) wants ``arg_names`` in symmetric memory."""
    if not arg_names:
        raise ValueError(f"declare_symm_mem_args({op!r}): no argument names")
    _own[_key(op)] = tuple(arg_names)


def symm_mem_args(op: Any) -> tuple[str, ...]:
    """The declared symmetric-memory arguments of ``op`` (OpOverload, name or
    Symbol): torch's ``register_symm_mem_args`` registry first, then thunderlite's."""
    key = _key(op)
    if isinstance(key, str):
        from torch._library.simple_registry import singleton
        names = [key]
        if key.endswith(".default"):
            names.append(key[: -len(".default")])
        get = getattr(singleton, "get", None)          # a torch without the registry (before PyTorch #173513)
        for name in names if get is not None else ():
            entry = get(name)
            if entry is not None and getattr(entry, "symm_mem_args", None) is not None \
                    and entry.symm_mem_args.is_registered():
                return tuple(entry.symm_mem_args.get())
    return _own.get(key, ())


def _declared(bsym: BoundSymbol, own_names: Callable[[Symbol], list[str] | None]):
    """(declared arg positions, group name) of a call, or None."""
    sym = bsym.sym
    overload = custom_ops.overload_of_symbol(sym)
    if overload is not None:
        declared, names = symm_mem_args(overload), custom_ops.schema_argument_names(sym)
    else:
        names = own_names(sym)
        declared = symm_mem_args(sym) if names is not None else ()
    if not declared:
        return None
    if "group_name" not in names or names.index("group_name") >= len(bsym.args):
        return None
    group = bsym.args[names.index("group_name")]
    if not isinstance(group, str):
        return None
    return [i for i, n in enumerate(names) if n in declared and i < len(bsym.args)], group


def memory_tag(group: str) -> str:
    return f"symm_mem:{group}"


def plan_symm_mem(trace: Trace, *, buffer_symbol: Symbol, into_symbol: Callable[[BoundSymbol], Symbol | None],
                  own_names: Callable[[Symbol], list[str] | None], clone_symbol: Symbol) -> Trace:
    """The trace with declared arguments produced into symmetric buffers (see the
    module docstring). ``buffer_symbol(shape, dtype, device, group, site)``
    returns a cached buffer; ``into_symbol(producer)`` gives the symbol running a
    producer into a buffer (``None``: it cannot); ``own_names(sym)`` the argument
    names of an executor's symbol."""
    bsyms = list(trace.bound_symbols)
    if not any(_declared(b, own_names) for b in bsyms):
        return trace
    producer: dict[str, int] = {}
    for i, b in enumerate(bsyms):
        for o in b.flat_outs():
            if isinstance(o, Proxy):
                producer.setdefault(o.name, i)
    before: dict[int, list[BoundSymbol]] = {}
    after: dict[int, list[BoundSymbol]] = {}
    replaced: dict[int, BoundSymbol] = {}
    in_buffer: dict[str, TensorProxy] = {}       # name -> the proxy now living in a buffer
    later: dict[int, dict[str, TensorProxy]] = {i: {} for i in range(len(bsyms))}
    site = 0
    for i, b in enumerate(bsyms):
        found = _declared(b, own_names)
        if found is None:
            continue
        positions, group = found
        tag = memory_tag(group)
        args = list(b.args)
        written = {d.name: new for d, new in writes(b)}
        for pos in positions:
            p = args[pos]
            if not isinstance(p, TensorProxy) or p.memory == tag:
                continue
            if p.name in in_buffer:
                p = in_buffer[p.name]
                if p.memory == tag:
                    args[pos] = p
                    continue                 # produced into a buffer of another group: copied below
            buf = TensorProxy(shape=p.shape, dtype=p.dtype, device=p.device, memory=tag)
            alloc = buffer_symbol.bind(p.shape, p.dtype, p.device, group, site, output=buf, source=b.source)
            site += 1
            j = producer.get(p.name)
            prod = replaced.get(j, bsyms[j]) if j is not None else None
            into = into_symbol(prod) if prod is not None and not p.requires_grad else None
            if into is not None and prod.output is p:
                placed = p.replace(name=p.name, memory=tag)
                replaced[j] = into.bind(buf, *prod.args, output=placed, source=prod.source, **prod.kwargs)
                before.setdefault(j, []).append(alloc)
                in_buffer[p.name] = placed
                args[pos] = placed
                continue
            copied = TensorProxy(shape=p.shape, dtype=p.dtype, device=p.device, memory=tag)
            before.setdefault(i, []).extend([alloc, prims.copy_.bind(p, buf, output=copied, source=b.source)])
            args[pos] = copied
            if p.name in written:            # the op writes the caller's tensor: write it back
                back = p.replace()
                new = written[p.name]
                after.setdefault(i, []).append(prims.copy_.bind(new if new is not None else copied, p,
                                                                output=back, source=b.source))
                if new is not None:          # later readers (alias barriers included) read the caller's tensor
                    later[i][new.name] = back
        replaced[i] = (replaced.get(i, b)).replace(args=tuple(args))
    out: list[BoundSymbol] = []
    rename: dict[str, TensorProxy] = {}
    for i, b in enumerate(bsyms):
        out.extend(before.get(i, ()))
        out.append(rename_bsym(replaced.get(i, b), rename))
        out.extend(after.get(i, ()))
        rename.update(later[i])
    out = [rename_bsym(b, in_buffer) for b in out]      # every reader sees the placed proxy
    return trace.with_bound_symbols(trace.stage, _clone_escaping(out, clone_symbol))


def _clone_escaping(bsyms: list[BoundSymbol], clone_symbol: Symbol) -> list[BoundSymbol]:
    """Values that may alias a (cached) symmetric buffer are cloned before the return."""
    aliasing: set[str] = set()
    for b in bsyms:
        outs = b.flat_outs()
        if any(isinstance(o, TensorProxy) and o.memory is not None and o.memory.startswith("symm_mem:")
               for o in outs):
            aliasing.update(o.name for o in outs if isinstance(o, TensorProxy))
        if Tag.ALIAS_BARRIER in b.sym.tags:        # members renamed after a write: same storage
            for m, n in zip(b.args[0], b.output, strict=True):
                if m.name in aliasing:
                    aliasing.add(n.name)
        for out, base in views(b) + call_views(b):      # a fused region: what its leaves say
            if base.name in aliasing:
                aliasing.add(out.name)
        for dst, new in writes(b):
            if new is not None and dst.name in aliasing:
                aliasing.add(new.name)
    if not bsyms or Tag.RETURN not in bsyms[-1].sym.tags:
        return bsyms
    ret = bsyms[-1]
    clones: dict[str, TensorProxy] = {}
    extra: list[BoundSymbol] = []
    for a in ret.flat_args():
        if isinstance(a, TensorProxy) and a.name in aliasing and a.name not in clones:
            c = TensorProxy(shape=a.shape, dtype=a.dtype, device=a.device, requires_grad=a.requires_grad)
            extra.append(clone_symbol.bind(a, output=c, source=ret.source))
            clones[a.name] = c
    if not clones:
        return bsyms
    return bsyms[:-1] + extra + [rename_bsym(ret, clones)]
