"""The cache key: one generated function per call signature.

A call's *signature* is the structure of its arguments (containers, lengths,
dict keys, and the kind of each leaf). For each signature we generate a small
Python function that checks the structure with ``type(x) is T`` tests (no
exceptions, no pytree walk) and returns a flat tuple: tensor metadata (shape,
dtype, device, requires_grad), the storage-sharing pattern of the tensors,
the values of Python scalars (when specializing), and the global state that
changes traces (grad mode, autocast, default dtype). It returns None when the
arguments do not have its signature; the slow path then describes them afresh.

Leaf kinds:
  T  a tensor (key: metadata; a symbolic dim keys only "0, 1 or more")       V  a Python scalar keyed by value
  S  a number kept symbolic (key: type only): floats and, as size symbols, ints
  O  any other object (key: its identity; its attributes are guarded in the prologue)

Example::

    sig = describe((a, b, 3), {})
    key_fn = make_key_fn(sig)
    key_fn((a, b, 3), {})   # -> (sig_id, torch.Size([8]), torch.float32, ..., 3, True, False, torch.float32)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core import codegen
from thunderlite.distributed.dtensor import is_dtensor
from thunderlite.frontend.autocast import autocast_state

# hashable scalars keyed by value (slices are unhashable before Python 3.12)
VALUE_TYPES = (int, float, bool, str, type(None), complex, torch.dtype, torch.device, torch.Size,
               type(Ellipsis))
SYMBOLIC_TYPES = (float, int)
_MISSING = object()


def describe(args: tuple, kwargs: dict, symbolic_numbers: bool = False) -> tuple:
    """The signature of a call: a hashable, nested description of its arguments."""
    return ("call", tuple(_describe(a, symbolic_numbers) for a in args),
            tuple((k, _describe(v, symbolic_numbers)) for k, v in sorted(kwargs.items())))


def _describe(x: Any, symbolic: bool) -> tuple:
    t = type(x)
    if t is torch.Tensor or t is torch.nn.Parameter:
        return ("T", t)
    if isinstance(x, torch.Tensor):
        return ("DT", t) if is_dtensor(x) else ("T", t)
    if t in VALUE_TYPES:
        return ("S", t) if symbolic and t in SYMBOLIC_TYPES else ("V", t)
    if t is tuple or t is list:
        return (t.__name__, t, tuple(_describe(y, symbolic) for y in x))
    if t is dict and all(type(k) is str for k in x):
        return ("dict", t, tuple((k, _describe(v, symbolic)) for k, v in x.items()))
    return ("O", t)


def leaves(sig_node: tuple, value: Any, path: str):
    """Yield ``(kind, value, path_expr)`` for each leaf of ``value`` under ``sig_node``."""
    kind = sig_node[0]
    if kind in ("tuple", "list"):
        for i, (child, v) in enumerate(zip(sig_node[2], value, strict=True)):
            yield from leaves(child, v, f"{path}[{i}]")
    elif kind == "dict":
        for k, child in sig_node[2]:
            yield from leaves(child, value[k], f"{path}[{k!r}]")
    else:
        yield kind, value, path


class _TwoOrMore:
    """A symbolic dim's size in a key: distinct from every static size, so an
    entry compiled for size 2 is never found by a symbolic signature's key."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "≥2"


TWO_OR_MORE = _TwoOrMore()


def dynamic_shape(shape: tuple, dims) -> tuple:
    """A shape as the key sees it when ``dims`` (a set of dims, or ``ALL_DIMS``)
    are symbolic: their sizes only say 0, 1 or "2 or more" (sizes 0 and 1
    specialize, as torch.compile's dynamic shapes do)."""
    if dims is ALL_DIMS:
        return tuple([d if d < 2 else TWO_OR_MORE for d in shape])
    return tuple([d if d < 2 or i not in dims else TWO_OR_MORE for i, d in enumerate(shape)])


ALL_DIMS = "all dims"


class KeyGen:
    """Writes the body of one key function (``fail``: what a mismatch returns)."""

    def __init__(self, dynamic: dict | None = None, fail: str = "None"):
        self.dynamic = dynamic or {}       # tensor leaf index -> symbolic dims
        self.fail = fail
        self.values: list[tuple[str, str]] = []   # (variable, kind) of the V and O leaves
        self.reads: list[str] = []      # ``v = expr`` of every leaf and container, in order
        self.tensor_type_checks: set[str] = set()   # the lines checking a tensor leaf's type
        self.shape_parts: dict[int, int] = {}   # key part index -> tensor leaf index
        self.number_parts: dict[int, int] = {}  # key part index -> scalar leaf index (V and S leaves, in order)
        self.scalars = 0
        self.lines: list[str] = []
        self.parts: list[str] = []
        self.labels: list[str] = []
        self.tensors: list[str] = []
        self.consts: dict[str, Any] = {}
        self.n = 0

    def var(self) -> str:
        self.n += 1
        return f"v{self.n}"

    def part(self, expr: str, label: str) -> None:
        self.parts.append(expr)
        self.labels.append(label)

    def _type_name(self, t: type) -> str:
        for name, v in self.consts.items():
            if v is t:
                return name
        name = f"_T{len(self.consts)}"
        self.consts[name] = t
        return name

    def check(self, cond: str) -> None:
        self.lines.append(f"  if {cond}: return {self.fail}")

    def node(self, node: tuple, expr: str, path: str) -> None:
        kind = node[0]
        v = self.var()
        self.reads.append(f"{v} = {expr}")
        self.lines.append(f"  {v} = {expr}")
        self.check(f"type({v}) is not {self._type_name(node[1])}")
        if kind == "T":
            self.tensor_type_checks.add(self.lines[-1])
            dims = self.dynamic.get(len(self.tensors))
            self.shape_parts[len(self.parts)] = len(self.tensors)
            if dims:
                self.part(f"_dynamic_shape({v}.shape, {_const_ref(self, dims)})", f"{path}.shape")
            else:
                self.part(f"{v}.shape", f"{path}.shape")
            for attr in ("dtype", "device", "requires_grad"):
                self.part(f"{v}.{attr}", f"{path}.{attr}")
            self.tensors.append((v, path))
        elif kind == "DT":       # a DTensor: its spec (the prologue guards its local tensor)
            for attr in ("shape", "dtype", "requires_grad", "placements"):
                self.part(f"{v}.{attr}", f"{path}.{attr}")
            self.part(f"id({v}.device_mesh)", f"the device mesh of {path}")
            self.values.append((v, kind))
        elif kind == "V":
            self.number_parts[len(self.parts)] = self.scalars
            self.scalars += 1
            self.part(v, path)
            self.values.append((v, kind))
        elif kind == "S":
            self.scalars += 1
        elif kind == "O":
            self.part(f"id({v})", f"the object passed as {path}")
            self.values.append((v, kind))
        elif kind in ("tuple", "list"):
            self.check(f"len({v}) != {len(node[2])}")
            for i, child in enumerate(node[2]):
                self.node(child, f"{v}[{i}]", f"{path}[{i}]")
        elif kind == "dict":
            keys = tuple(k for k, _ in node[2])
            self.check(f"tuple({v}) != {keys!r}")
            for k, child in node[2]:
                self.node(child, f"{v}[{k!r}]", f"{path}[{k!r}]")


def _const_ref(g: KeyGen, value) -> str:
    name = f"_D{len(g.consts)}"
    g.consts[name] = value
    return name


def make_key_fn(sig: tuple, sig_id: int, names: list[str] | None = None,
                dynamic: dict | None = None) -> Callable[[tuple, dict], tuple | None]:
    """Generate the key function of signature ``sig`` (see module docstring).
    ``names``: the function's parameter names, for readable miss reasons;
    ``fn.labels[i]`` says what element ``i + 1`` of the key stands for.
    ``dynamic``: tensor leaf index (in signature order) -> the dims whose size
    is symbolic (a set, or ``ALL_DIMS``)."""
    g = walk_signature(sig, names, KeyGen(dynamic))
    g.part("_grad()", "grad mode")
    g.part("_autocast()", "autocast")
    g.part("_default_dtype()", "the default dtype")
    body = "\n".join(g.lines)
    src = f"def key_fn(args, kwargs):\n{body}\n  return ({sig_id}, {', '.join(g.parts)})\n"
    globs = dict(g.consts, _MISSING=_MISSING, _alias_pattern=alias_pattern, _dynamic_shape=dynamic_shape,
                 _grad=torch.is_grad_enabled, _autocast=autocast_state, _default_dtype=torch.get_default_dtype,
                 __builtins__=__builtins__)
    fn = codegen.compile_source(src, "key_fn", globs)
    fn.__thunderlite_source__ = src
    fn.labels = g.labels
    fn.shape_parts = g.shape_parts
    fn.number_parts = g.number_parts
    return fn


def with_symbolic_numbers(sig: tuple, leaves: frozenset[int]) -> tuple:
    """``sig`` with its float scalar leaves numbered ``leaves`` (V and S leaves
    counted in order, as ``KeyGen.number_parts`` numbers them) kept symbolic
    (kind S): floats that keep changing become trace inputs."""
    n = 0

    def walk(node):
        nonlocal n
        kind = node[0]
        if kind in ("tuple", "list"):
            return (kind, node[1], tuple(walk(c) for c in node[2]))
        if kind == "dict":
            return (kind, node[1], tuple((k, walk(c)) for k, c in node[2]))
        if kind in ("V", "S"):
            n += 1
            if kind == "V" and node[1] is float and n - 1 in leaves:
                return ("S", float)
        return node
    _, arg_nodes, kw_nodes = sig
    return ("call", tuple(walk(c) for c in arg_nodes), tuple((k, walk(c)) for k, c in kw_nodes))


def walk_signature(sig: tuple, names: list[str] | None, g: KeyGen) -> KeyGen:
    """The structure checks and key parts of every leaf of ``sig``, then the
    storage sharing of its tensors."""
    _, arg_nodes, kw_nodes = sig
    g.check(f"len(args) != {len(arg_nodes)} or len(kwargs) != {len(kw_nodes)}")
    for i, node in enumerate(arg_nodes):
        label = names[i] if names is not None and i < len(names) else f"args[{i}]"
        g.node(node, f"args[{i}]", label)
    for k, node in kw_nodes:
        g.node(node, f"kwargs.get({k!r}, _MISSING)", k)
    if len(g.tensors) == 2:
        (a, pa), (b, pb) = g.tensors
        g.part(f"{a}.untyped_storage().data_ptr() == {b}.untyped_storage().data_ptr()",
               f"whether {pa} and {pb} share storage")
    elif len(g.tensors) > 2:
        ptrs = ", ".join(f"{t}.untyped_storage().data_ptr()" for t, _ in g.tensors)
        g.part(f"_alias_pattern(({ptrs},))", "which tensor arguments share storage")
    return g


def has_symbolic_numbers(sig: tuple) -> bool:
    """Whether a leaf of ``sig`` is a number kept symbolic (kind S)."""
    def walk(node):
        kind = node[0]
        if kind == "S":
            return True
        if kind in ("tuple", "list"):
            return any(walk(c) for c in node[2])
        if kind == "dict":
            return any(walk(c) for _, c in node[2])
        return False
    _, arg_nodes, kw_nodes = sig
    return any(walk(n) for n in arg_nodes) or any(walk(n) for _, n in kw_nodes)


def count_tensors(sig: tuple) -> int:
    """How many tensor leaves a signature has."""
    def walk(node):
        kind = node[0]
        if kind == "T":
            return 1
        if kind in ("tuple", "list"):
            return sum(walk(c) for c in node[2])
        if kind == "dict":
            return sum(walk(c) for _, c in node[2])
        return 0
    _, arg_nodes, kw_nodes = sig
    return sum(walk(n) for n in arg_nodes) + sum(walk(n) for _, n in kw_nodes)


def alias_pattern(ptrs: tuple) -> tuple:
    """For each tensor, the index of the first tensor sharing its storage."""
    first: dict = {}
    return tuple(first.setdefault(p, i) for i, p in enumerate(ptrs))


def storage_groups(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Indexes of ``tensors`` grouped by shared storage (groups of two or more)."""
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.numel() == 0:
            continue
        groups.setdefault(t.untyped_storage().data_ptr(), []).append(i)
    return [g for g in groups.values() if len(g) > 1]
