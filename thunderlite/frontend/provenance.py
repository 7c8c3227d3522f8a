"""Provenance: where a value that entered the traced program came from.

Every value the trace depends on but did not compute (an argument, a module
parameter, a global, a closure cell, an item of a list passed in) gets a
``Prov`` naming its path from the call's arguments or from a fixed root object
(a globals dict, a cell). The prologue re-reads each path on every call (to
unpack tensors and check guards); the epilogue writes through paths.

Example::

    self_ = Prov.arg(0)                      # args[0]
    w = self_.attr("fc").attr("weight")      # args[0].fc.weight
    w.expr(roots)  ->  "args[0].fc._parameters['weight']"
"""
from __future__ import annotations

from typing import Any


class Prov:
    """A path: ``kind`` is one of arg, kwarg, attr, item, global, cell, object, split.

    ``root`` objects (globals dicts, cells) are bound by name in the generated
    prologue; ``module_slot`` names the ``nn.Module`` dict (``_parameters``,
    ``_buffers``, ``_modules``) an attribute lives in, for a faster read."""
    __slots__ = ("kind", "parent", "key", "root", "module_slot", "_hash")

    def __init__(self, kind: str, parent: Prov | None, key: Any, root: Any = None, module_slot: str | None = None):
        self.kind = kind
        self.parent = parent
        self.key = key
        self.root = root
        self.module_slot = module_slot
        self._hash = hash((kind, parent, _hashable(key), id(root)))

    @staticmethod
    def arg(i: int) -> Prov:
        return Prov("arg", None, i)

    @staticmethod
    def kwarg(name: str) -> Prov:
        return Prov("kwarg", None, name)

    @staticmethod
    def global_(globals_dict: dict, name: str) -> Prov:
        return Prov("global", None, name, root=globals_dict)

    @staticmethod
    def cell(cell) -> Prov:
        return Prov("cell", None, None, root=cell)

    @staticmethod
    def object(obj) -> Prov:
        """An object held by the jitted callable itself (the ``self`` of a bound method)."""
        return Prov("object", None, None, root=obj)

    @staticmethod
    def split(name: str) -> Prov:
        """A value an earlier piece of a split program computed (frontend/splits/):
        the entry of the next piece reads it from ``env``, by its trace name."""
        return Prov("split", None, name)

    def attr(self, name: str, module_slot: str | None = None) -> Prov:
        return Prov("attr", self, name, module_slot=module_slot)

    def item(self, key: Any) -> Prov:
        return Prov("item", self, key)

    def __eq__(self, other):
        return (type(other) is Prov and self.kind == other.kind and self.parent == other.parent
                and _hashable(self.key) == _hashable(other.key) and self.root is other.root)

    def __hash__(self):
        return self._hash

    def expr(self, roots: dict) -> str:
        """Python source reading this path, given ``args``/``kwargs`` in scope and
        root objects bound by the names recorded in ``roots`` (id -> name)."""
        k = self.kind
        if k == "arg":
            return f"args[{self.key}]"
        if k == "kwarg":
            return f"kwargs[{self.key!r}]"
        if k == "global":
            return f"{_root_name(self.root, roots, 'G')}[{self.key!r}]"
        if k == "cell":
            return f"{_root_name(self.root, roots, 'C')}.cell_contents"
        if k == "object":
            return _root_name(self.root, roots, "O")
        if k == "split":
            return f"env[{self.key!r}]"
        return self.child_expr(self.parent.expr(roots), roots)

    def child_expr(self, base: str, roots: dict) -> str:
        """Source reading this attribute or item of the value ``base`` evaluates to."""
        if self.kind == "attr":
            if self.module_slot is not None:
                return f"{base}.{self.module_slot}[{self.key!r}]"
            if self.key.isidentifier() and not self.key.startswith("__"):
                return f"{base}.{self.key}"
            return f"getattr({base}, {self.key!r})"
        return f"{base}[{key_expr(self.key, roots)}]"

    def describe(self) -> str:
        """A readable name for messages: ``args[0].fc.weight``, ``global SCALE``."""
        k = self.kind
        if k == "arg":
            return f"argument {self.key}"
        if k == "kwarg":
            return f"keyword argument {self.key!r}"
        if k == "global":
            mod = self.root.get("__name__", "?") if isinstance(self.root, dict) else "?"
            return f"global {mod}.{self.key}"
        if k == "cell":
            return "a closure variable"
        if k == "object":
            return f"the bound {type(self.root).__name__}"
        if k == "split":
            return f"{self.key}, computed before a split"
        base = self.parent.describe()
        if k == "attr":
            return f"{base}.{self.key}"
        return f"{base}[{self.key!r}]" if is_atom(self.key) else f"{base}[<{type(self.key).__name__}>]"

    def __repr__(self):
        return f"<Prov {self.describe()}>"


def is_atom(key: Any) -> bool:
    """Keys a path spells out by value; any other key (a tensor keying an
    optimizer's ``state``, a tuple) is the very object, bound in the prologue."""
    return type(key) in (int, str, bytes)


def key_expr(key: Any, roots: dict) -> str:
    return repr(key) if is_atom(key) else _root_name(key, roots, "R")


def _hashable(key: Any) -> Any:
    if is_atom(key) or key is None:
        return key
    return ("object", id(key))


def _root_name(obj: Any, roots: dict, prefix: str) -> str:
    entry = roots.get(id(obj))
    if entry is None:
        entry = roots[id(obj)] = (f"_{prefix}{len(roots)}", obj)
    return entry[0]
