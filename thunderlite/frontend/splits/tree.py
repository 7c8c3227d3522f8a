"""The compiled form of a split program: a tree of pieces, and its runner.

Each ``Node`` is one compiled piece (a ``CompiledEntry`` whose function is
``entry(args, kwargs, env)``). A piece that ends at a split returns the values
the split reads (``decide`` turns them into the Python value the program got:
a bool, an int, a string) and the values later pieces read (``exports``); its
children are the pieces compiled for each value seen there. The last piece of
a path ends the program: it runs the epilogue and returns the user's value.

``SplitTree.run`` is the entry function of the whole program::

    out = root(args, kwargs, {})          # guards, then the first piece
    while the piece ended at a split:
        value = node.decide(values read)  # what bool()/int()/format() gives the program
        env = values the rest may read    # node.keep, node.exports
        node = child compiled for value   # its guards; none: compile it (``resume``)
        out = node(args, kwargs, env)

A value never seen at a split resumes the program: the caller's ``resume``
re-interprets it with the values of the splits this call passed pinned and
compiles the rest, which runs at once (the pieces before it ran already).
Paths are counted per jitted callable (``SplitBudget``); past the bound the
callable warns once and runs eagerly from the next call on.
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.frontend.caching.entries import CompiledEntry, user_stacklevel

MAX_PATHS = 16
"""Paths (sequences of values seen at splits) compiled per jitted callable by default."""


class SplitBudget:
    """The paths of one jitted callable, its bound, and why it now runs eagerly
    (``cache_info()["splits"]``). The first path of each cache entry comes
    with its compile (bounded as recompiles are); the bound counts the paths
    calls added by resuming."""

    def __init__(self, max_paths: int = MAX_PATHS):
        self.max_paths = max_paths
        self.paths = 0
        self.resumed = 0
        self.eager: str | None = None
        self.lock = threading.Lock()
        # calls that resume run one at a time (as a callable's misses do, api.py): a thread
        # racing another to the same new value finds the pieces the first one compiled
        self.resuming = threading.RLock()

    def as_dict(self) -> dict:
        return {"paths": self.paths, "resumed": self.resumed, "max_paths": self.max_paths, "eager": self.eager}

    def add_path(self, site: str, resumed: bool) -> None:
        with self.lock:
            self.paths += 1
            self.resumed += resumed
            if self.resumed >= self.max_paths and self.eager is None:
                self.eager = (f"{self.paths} paths through its splits compiled (the bound is {self.max_paths}); "
                              f"the last one at {site}: running eagerly from now on")
                warnings.warn(f"thunderlite: {self.eager}. Values read at a split (an if on a tensor, .item(), "
                              "formatting a number) that keep changing make a new path each; compute the branch "
                              "with torch.where, or raise the bound with jit(..., splits=N)",
                              stacklevel=user_stacklevel())


class Site:
    """Where a split happened and why: the user's line and what needed a value."""
    __slots__ = ("file", "line", "code", "what")

    def __init__(self, file: str, line: int, code: str, what: str):
        self.file, self.line, self.code, self.what = file, line, code, what

    def __str__(self):
        return f"{self.file}:{self.line} ({self.code.strip()}): {self.what}"


class Node:
    """One compiled piece of a split program (see the module docstring)."""
    __slots__ = ("entry", "site", "decide", "exports", "keep", "children", "grad_enabled", "cut", "asked",
                 "parent", "value")

    def __init__(self, entry: CompiledEntry, grad_enabled: bool, parent: Node | None, value: Any):
        self.entry = entry
        self.grad_enabled = grad_enabled      # grad mode when the piece starts
        self.parent = parent
        self.value = value                    # the value seen at the parent's split that leads here
        self.site: Site | None = None          # the split it ends at (None: it ends the program)
        self.decide: Callable | None = None    # values read -> the Python value the program got
        self.exports: tuple[str, ...] = ()     # values it computes that later pieces may read
        self.keep: frozenset[str] = frozenset()  # values (its own and earlier ones) kept after it
        self.asked: tuple[str, ...] = ()       # the trace values the split reads (checked on replay)
        self.cut = 0                           # symbols recorded before its split (checked on replay)
        self.children: dict[Any, list[Node]] = {}

    @property
    def leaf(self) -> bool:
        return self.site is None

    def advance(self, env: dict, exported: tuple) -> dict:
        new = {n: v for n, v in env.items() if n in self.keep}
        new.update(zip(self.exports, exported, strict=True))
        return new


def value_key(v: Any) -> Any:
    """The dict key of a value seen at a split: floats by their exact bits
    (``0.0`` and ``-0.0`` differ, every nan is one key)."""
    if type(v) is float or type(v) is complex:
        return (type(v), repr(v))
    try:
        hash(v)
    except TypeError:
        return (type(v), repr(v))
    return (type(v), v)


class SplitTree:
    """The pieces of one cache entry's program (see the module docstring).
    ``resume(tree, path, values, args, kwargs, env)`` compiles and runs the
    rest of a call whose path left the tree; ``fn`` is the user's function,
    run as it is once the budget sent the callable to eager mode."""

    def __init__(self, root: Node, budget: SplitBudget, resume: Callable, fn: Callable):
        self.root = root
        self.budget = budget
        self.resume = resume
        self.fn = fn
        self.last_path: list[Node] = [root]

    def run(self, args: tuple, kwargs: dict, miss: object) -> Any:
        if self.budget.eager is not None:
            return self.fn(*args, **kwargs)
        node = self.root
        out = node.entry.fn(args, kwargs, {})
        if out is miss:
            return miss
        path, values, env = [node], [], {}
        grad = torch.is_grad_enabled()
        try:
            while node.site is not None:
                asked, exported = out
                value = node.decide(asked)
                env = node.advance(env, exported)
                values.append(value)
                child, out = self._child(node, value, args, kwargs, env, miss)
                if child is None:
                    with self.budget.resuming:
                        child, out = self._child(node, value, args, kwargs, env, miss)
                        if child is None:       # re-interpreted from the start: in the call's grad mode
                            torch._C._set_grad_enabled(grad)
                            return self.resume(self, path, values, args, kwargs, env)
                node = child
                path.append(node)
        finally:
            if torch.is_grad_enabled() is not grad:
                torch._C._set_grad_enabled(grad)
        self.last_path = path
        return out

    @staticmethod
    def _child(node: Node, value: Any, args: tuple, kwargs: dict, env: dict, miss: object):
        for child in node.children.get(value_key(value), ()):
            if torch.is_grad_enabled() is not child.grad_enabled:
                torch._C._set_grad_enabled(child.grad_enabled)
            out = child.entry.fn(args, kwargs, env)
            if out is not miss:
                return child, out
        return None, None

    def attach(self, parent: Node, value: Any, child: Node) -> None:
        """``child`` runs after ``parent`` where its split gave ``value`` (the most
        recent alternative first: a guard of an older one failed)."""
        alts = parent.children.setdefault(value_key(value), [])
        alts.insert(0, child)
        del alts[8:]


class SplitEntry(CompiledEntry):
    """The cache entry of a split program: ``fn`` runs its tree; the trace
    accessors show the pieces of the path the last call took, in order."""
    __slots__ = ("tree", "_first")

    def __init__(self, tree: SplitTree, root: CompiledEntry, miss: object):
        def run(args, kwargs):
            return tree.run(args, kwargs, miss)
        for name in ("stage_ms", "total_ms", "guards", "alias_guard", "inputs", "sym_guards", "input_names",
                     "path_shapes"):
            setattr(self, name, getattr(root, name))
        self.learned = None
        self.calls = 1
        self.key = None
        self.lowering = None         # its pieces are lowered each on its own: no hot tier of the whole
        self.tier = None
        self.fn = run
        self.raises = None
        self.tree = tree
        self._first: list = []

    @property
    def traces(self) -> list:
        return [t for n in self.tree.last_path for t in n.entry.traces]

    @property
    def backward_traces(self) -> list:
        return [t for n in self.tree.last_path for t in n.entry.backward_traces]

    @property
    def prologue_traces(self) -> list:
        return [t for n in self.tree.last_path for t in n.entry.prologue_traces]

    @property
    def predication(self) -> list[str]:
        return list(dict.fromkeys(n for p in self.pieces() for n in p.predication))

    @property
    def gradients(self) -> dict:
        return {k: v for n in self.tree.last_path for k, v in n.entry.gradients.items()}

    def pieces(self) -> list[CompiledEntry]:
        """The compiled pieces the last call ran, in order."""
        return [n.entry for n in self.tree.last_path]

    def splits(self) -> list[tuple[Site, Any]]:
        """The splits of the last call's path: where, why, and the value seen."""
        path = self.tree.last_path
        return [(n.site, nxt.value) for n, nxt in zip(path, path[1:], strict=False)]

    def set_first_output(self, out: Any) -> None:
        self._first[:] = [out]

    def run_first(self, args: tuple, kwargs: dict) -> Any:
        """The output of the call that compiled this entry: its pieces ran while
        it was traced (each split needed the values before it)."""
        return self._first.pop()
