"""The entry function of one cache entry: prologue, computation, epilogue in one
generated Python function, so a cache hit costs one call.

    def entry(args, kwargs):
        try:                                   # prologue: re-read every input path
            v1 = args[0]._modules['fc']
            if v1 is not _C0: return _MISS     # guards the key cannot see
            v2 = v1._parameters['weight']
            if v2.shape != _C1 or ...: return _MISS
        except (AttributeError, KeyError, IndexError, TypeError):
            return _MISS
        out = _comp(args[1], v2)               # the computation
        ...                                    # epilogue: write-backs, output rebuild
        return out

A guard that fails returns the ``MISS`` sentinel (no exception on the hot path).
The same guards are also printed as the prologue trace (``last_prologue_traces``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core import codegen
from thunderlite.core.symbol import Symbol
from thunderlite.core.trace import Trace
from thunderlite.frontend.caching.alias_guard import AliasGuard, write_verdict
from thunderlite.frontend.caching.entries import TORCH_GUARDS
from thunderlite.frontend.caching.keys import alias_pattern, dynamic_shape
from thunderlite.frontend.epilogue import Write, object_paths, write_source
from thunderlite.frontend.provenance import Prov
from thunderlite.frontend.state import Guard, Input

MISS = object()
_LOOKUP_ERRORS = (AttributeError, KeyError, IndexError, TypeError)


class _Paths:
    """Assigns a local variable to each provenance path read (shared prefixes
    once). ``uses``: how often each path is read, directly or as the parent of
    another; a path read once by a check that names it once is read inside
    that check instead (no variable: a cache hit runs every check)."""

    def __init__(self, lines: list[str], roots: dict, uses: dict[Prov, int] | None = None):
        self.lines = lines
        self.roots = roots
        self.uses = uses or {}
        self.var: dict[Prov, str] = {}

    def read(self, prov: Prov, once: bool = False) -> str:
        v = self.var.get(prov)
        if v is not None:
            return v
        if prov.parent is None:
            expr = prov.expr(self.roots)
            if prov.kind in ("arg", "kwarg", "split"):
                return expr
        else:
            base = self.read(prov.parent)
            expr = prov.child_expr(base, self.roots)
        if once and self.uses.get(prov, 0) <= 1:
            return expr
        v = f"v{len(self.var)}"
        self.var[prov] = v
        self.lines.append(f"    {v} = {expr}")
        return v


def _count_uses(provs) -> dict[Prov, int]:
    uses: dict[Prov, int] = {}

    def count(p: Prov) -> None:
        n = uses.get(p, 0)
        uses[p] = n + 1
        if n == 0 and p.parent is not None:
            count(p.parent)          # each path read once makes its parent read once more
    for p in provs:
        count(p)
    return uses


def _guard_provs(guards: list[Guard], inputs: list[Input]):
    for g in guards:
        if g.kind == "absent":
            yield g.prov.parent
            continue
        yield g.prov
        if g.kind == "same":
            yield g.value
        elif g.kind == "distinct":
            yield from g.value
    for inp in inputs:
        if inp.prov is not None:
            yield inp.prov


_MODULE_HOOK_DICTS = frozenset({"_backward_hooks", "_backward_pre_hooks", "_forward_hooks", "_forward_pre_hooks",
                                "_global_backward_hooks", "_global_backward_pre_hooks", "_global_forward_hooks",
                                "_global_forward_pre_hooks"})
"""A module's hook dicts (and torch's global ones): ``Module._call_impl`` reads
them by truthiness only, so a guard that they stay empty checks just that."""


def _const(consts: dict, value: Any) -> str:
    name = f"_K{len(consts)}"
    consts[name] = value
    return name


def guard_source(g: Guard, paths: _Paths, consts: dict) -> str:
    if g.kind == "absent":
        return f"hasattr({paths.read(g.prov.parent)}, {g.prov.key!r})"
    if g.kind == "distinct":
        ids = ", ".join(f"id({paths.read(p)})" for p in g.value)
        return f"len({{{ids}}}) != {len(g.value)}"
    if g.kind == "type":
        return f"type({paths.read(g.prov, once=True)}) is not {_const(consts, g.value)}"
    if g.kind == "is":
        return f"{paths.read(g.prov, once=True)} is not {_const(consts, g.value)}"
    if g.kind == "same":
        return f"{paths.read(g.prov, once=True)} is not {paths.read(g.value, once=True)}"
    if g.kind == "keys" and not g.value and g.prov.key in _MODULE_HOOK_DICTS:
        return paths.read(g.prov, once=True)
    if g.kind not in ("len", "type_len", "keys") and (g.value is None or type(g.value) is bool):
        return f"{paths.read(g.prov, once=True)} is not {g.value!r}"
    v = paths.read(g.prov)
    if g.kind == "len":
        return f"type({v}) is not list or len({v}) != {g.value}"
    if g.kind == "type_len":
        return f"type({v}) is not {_const(consts, g.value[0])} or len({v}) != {g.value[1]}"
    if g.kind == "keys":
        if not g.value:
            return f"not isinstance({v}, dict) or {v}"
        return f"not isinstance({v}, dict) or tuple({v}) != {_const(consts, g.value)}"
    return f"type({v}) is not {_const(consts, type(g.value))} or {v} != {_const(consts, g.value)}"



def tensor_guard_source(inp: Input, v: str, consts: dict) -> str:
    t = inp.value
    if type(t) is float:    # a float read through a path as a trace input (caching/automatic.py)
        return f"type({v}) is not float"
    if inp.dims:    # symbolic dims (caching/automatic.py): "0, 1 or more", as the key has them for arguments
        shape = (f"_dynamic_shape({v}.shape, {_const(consts, inp.dims)}) != "
                 f"{_const(consts, dynamic_shape(t.shape, inp.dims))}")
    else:
        shape = f"{v}.shape != {_const(consts, t.shape)}"
    return (f"not isinstance({v}, _Tensor) or {shape} or "
            f"{v}.dtype is not {_const(consts, t.dtype)} or {v}.device != {_const(consts, t.device)} or "
            f"{v}.requires_grad is not {t.requires_grad}")


def build_entry(inputs: list[Input], guards: list[Guard], writes: list[Write], comp: Callable,
                output: str, rebuild: Callable | None, extra_names: list[str],
                alias_guard: AliasGuard | None = None, sym_guards: list | None = None,
                env: bool = False, objects: dict | None = None) -> Callable:
    """Generate the entry function. ``output``: 'direct' (the computation returns
    the user value), 'extras' (it returns ``(user_value, extras)``), or 'rebuild'
    (``(flat_values, extras)``, turned into the user value by
    ``rebuild(flat_values, objects_read)``, where ``rebuild.paths`` says which
    objects to read). ``alias_guard``: storage-sharing and write-verdict checks
    (alias_guard.py). ``sym_guards``: what the trace assumed of its symbolic
    sizes (core/symint.py), checked once the size symbols are read. ``env``: a
    piece of a split program (frontend/splits/), ``entry(args, kwargs, env)``,
    reading values earlier pieces computed from ``env`` (``Prov.split``).
    ``objects``: id -> path of the objects from outside each call gives anew
    (``epilogue.resolvable``): read in the prologue, before anything runs, where
    the output or a value written back holds them."""
    consts: dict = {}
    roots: dict = {}
    pro: list[str] = []
    objects = objects or {}
    rebuild_paths = list(getattr(rebuild, "paths", ()) if output == "rebuild" else ())
    written_objects = [ip for w in writes for ip in _ids_of(object_paths(w.value, objects), objects)]
    paths = _Paths(pro, roots, _count_uses([*_guard_provs(guards, inputs), *rebuild_paths,
                                            *(p for _, p in written_objects)]))
    for g in guards:
        pro.append(f"    if {guard_source(g, paths, consts)}: return _MISS")
    obj_vars = {i: paths.read(p) for i, p in written_objects}
    rebuild_vars = [paths.read(p) for p in rebuild_paths]
    call_args = []
    meta: list[tuple[str, str, torch.Tensor]] = []
    for inp in inputs:
        if inp.prov is None:
            call_args.append(_const(consts, inp.value))
            continue
        v = paths.read(inp.prov)
        call_args.append(v)
        if inp.guard_meta:
            pro.append(f"    if {tensor_guard_source(inp, v, consts)}: return _MISS")
            if not inp.dims:        # symbolic dims keep their own check ("0, 1 or more")
                meta.append((pro[-1], v, inp.value))
    if sym_guards:
        var = {inp.proxy.name: a for inp, a in zip(inputs, call_args, strict=True)}
        for g in sym_guards:
            pro.append(f"    if not ({g.python(var.__getitem__)}): return _MISS")
    if alias_guard is not None:
        pro += ["    " + line for line in alias_guard.lines(call_args.__getitem__, lambda v: _const(consts, v))]
    lines = ["def entry(args, kwargs, env):" if env else "def entry(args, kwargs):"]
    if pro:
        lines += ["  try:", *pro, "  except _LOOKUP_ERRORS:", "    return _MISS"]
    lines += _run_and_write(call_args, writes, output, extra_names, consts, roots, obj_vars, rebuild_vars)
    src = "\n".join(lines) + "\n"
    globs = dict(consts, _MISS=MISS, _LOOKUP_ERRORS=_LOOKUP_ERRORS, _Tensor=torch.Tensor, _comp=comp,
                 _rebuild=rebuild, _alias_pattern=alias_pattern, _dynamic_shape=dynamic_shape,
                 _write_verdict=write_verdict, _inference_mode=torch.is_inference_mode_enabled, _no_grad=torch.no_grad,
                 __builtins__=__builtins__)
    globs.update({name: obj for name, obj in roots.values()})
    fn = codegen.compile_source(src, "entry", globs)
    fn.__thunderlite_source__ = src
    fn.__thunderlite_tensor_guard__ = _tensor_guard(meta)
    return fn


def _ids_of(provs: list[Prov], objects: dict):
    """(id, path) of ``objects`` whose path is among ``provs``."""
    wanted = set(provs)
    return [(i, p) for i, p in objects.items() if p in wanted]


def _tensor_guard(meta: list[tuple[str, str, torch.Tensor]]) -> tuple | None:
    """For the fast guard (caching/entries.py: ``FastGuard``): the lines checking
    the metadata of tensors read through paths (a module's parameters), and one
    line checking them all at once with torch's C++ ``TensorGuards`` built from
    the tensors this entry was compiled for, with the function it calls. That
    check is stricter (exact type, dispatch keys), which only a fast guard may
    be: a call it refuses takes the key path, whose entry checks each tensor as
    before. None with fewer than two such tensors or without torch's guards."""
    meta = [(line, v, t) for line, v, t in meta if type(t) in (torch.Tensor, torch.nn.Parameter)
            and t.layout == torch.strided]
    if len(meta) < 2 or TORCH_GUARDS is None:
        return None
    tensors = [t for _, _, t in meta]
    check = TORCH_GUARDS[0](*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                            dynamic_dims_strides=[[None] * t.dim() for t in tensors]).check
    names = ", ".join(v for _, v, _ in meta)
    return [line for line, _, _ in meta], f"    if not _tensor_meta({names}): return _MISS", check


def _run_and_write(call_args: list[str], writes: list[Write], output: str, extra_names: list[str],
                   consts: dict, roots: dict, obj_vars: dict, rebuild_vars: list[str]) -> list[str]:
    call = f"_comp({', '.join(call_args)})"
    if output == "direct" and not writes:
        return [f"  return {call}"]
    lines = [f"  out, extras = {call}" if output != "direct" else f"  out = {call}"]
    env_names = {name: f"extras[{i}]" for i, name in enumerate(extra_names)}
    # every object written is found before the first write: a write replacing an
    # attribute (``self._state = {}``) must not redirect another write reaching
    # the old value through that attribute (the old dict's items, as in eager)
    targets = {}
    if len(writes) > 1:
        for w in writes:
            if isinstance(w.target, Prov) and w.target.kind not in ("global", "cell") and w.target not in targets:
                targets[w.target] = f"_w{len(targets)}"
                lines.append(f"  {targets[w.target]} = {w.target.expr(roots)}")
    for w in writes:
        target = targets.get(w.target) if isinstance(w.target, Prov) else None
        lines += ["  " + s for s in write_source(w, env_names, consts, roots, target, obj_vars)]
    resolved = "".join(f"{v}, " for v in rebuild_vars)
    lines.append(f"  return _rebuild(out, ({resolved}))" if output == "rebuild" else "  return out")
    return lines


# --- the prologue as a printable trace ---------------------------------------------------------

def _print_only(*args, **kwargs):
    raise RuntimeError("prologue trace symbols are for reading; the prologue runs as generated code")


_UNPACK = Symbol("unpack", impl=_print_only, module="prologue")
_CHECK_TENSOR = Symbol("check_tensor", impl=_print_only, module="prologue")
_CHECK = {kind: Symbol(f"check_{kind}", impl=_print_only, module="prologue")
          for kind in ("eq", "is", "len", "keys", "same", "absent", "type_len", "storage_sharing", "write_verdict",
                       "strides", "size", "type", "distinct")}


def prologue_trace(inputs: list[Input], guards: list[Guard], computation: Trace,
                   alias_guard: AliasGuard | None = None, sym_guards: list | None = None) -> Trace:
    """The prologue as a trace: which paths are read, which values are checked."""
    trc = Trace("prologue", stage="prologue", names=computation.names)
    trc.args = []
    for g in guards:
        value = (g.value.describe() if g.kind == "same" else tuple(p.describe() for p in g.value)
                 if g.kind == "distinct" else g.value.__qualname__ if g.kind == "type" else _printable(g.value))
        trc.bound_symbols.append(_CHECK[g.kind].bind(g.prov.describe(), value, output=None))
    for inp in inputs:
        where = inp.prov.describe() if inp.prov is not None else "a constant captured by reference"
        trc.bound_symbols.append(_UNPACK.bind(where, output=inp.proxy))
        if inp.guard_meta and type(inp.value) is float:
            trc.bound_symbols.append(_CHECK["type"].bind(inp.proxy, "float", output=None))
        elif inp.guard_meta:
            t = inp.value
            shape = tuple(inp.proxy.shape if inp.dims else t.shape)
            trc.bound_symbols.append(_CHECK_TENSOR.bind(inp.proxy, shape, t.dtype, t.device,
                                                        t.requires_grad, output=None))
    for g in sym_guards or ():
        trc.bound_symbols.append(_CHECK["size"].bind(g.python(), output=None))
    if alias_guard is not None:
        if alias_guard.shared:
            members = tuple(inputs[i].proxy for i in alias_guard.shared)
            trc.bound_symbols.append(_CHECK["storage_sharing"].bind(members, alias_guard.pattern, output=None))
        for i, v in alias_guard.verdicts:
            trc.bound_symbols.append(_CHECK["write_verdict"].bind(inputs[i].proxy, v, output=None))
        for i, st, off in alias_guard.strides:
            trc.bound_symbols.append(_CHECK["strides"].bind(inputs[i].proxy, st, off, output=None))
    trc.set_return(tuple(inp.proxy for inp in inputs))
    return trc


def _printable(v: Any) -> Any:
    if type(v) in (int, float, bool, str, type(None), tuple):
        return v
    return f"<{type(v).__name__} object>"
