"""Automatic dynamic sizes and numbers for values read through paths.

The key (keys.py) covers the arguments; everything else the program reads (an
argument's attributes and containers, a module's buffers, globals, closure
cells) is checked by the entry's prologue against the values seen while
tracing. ``PathDynamic`` is what one jitted callable learned about those paths:

- a tensor whose size changed between calls (the prologue's metadata check
  failed on it) gets those dims symbolic in the next compile, as an argument's
  dims do after a recompile their size caused (``learn_from_miss``);
- a tensor the program reads and writes back grown through the same path (HF's
  ``DynamicCache``: ``self.keys = torch.cat([self.keys, k], -2)``) will have
  another size on the next call: the growing dims become symbolic at once and
  the call is traced again (``learn_from_writes``), so a decode loop compiles
  once for the prompt and once for every later token;
- a float read through a path that changed between calls becomes a trace input
  (``NumberProxy``) instead of a value guarded for equality.

Parameters stay static (a changing weight size is a new model, not a new
token). Sizes 0 and 1 specialize as for arguments: the prologue checks a
symbolic dim only for "0, 1 or more" (``keys.dynamic_shape``), so a symbolic
size is known to be at least 2. What symbolic sizes or numbers cannot trace
(``learned`` after a failed compile) goes back to static for good
(``make_static``).

Example::

    auto = PathDynamic(all_sizes=False)
    auto.learn_from_miss(stale_entry, args, kwargs)   # -> "argument 0.cache.k.shape[2] is"
    auto.dims_of(prov, tensor)                        # -> frozenset({2})
"""
from __future__ import annotations

from typing import Any

import torch

from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symint import SymInt
from thunderlite.frontend.caching.entries import read_path
from thunderlite.frontend.caching.keys import ALL_DIMS
from thunderlite.frontend.provenance import Prov


class PathDynamic:
    """Which paths' sizes and floats are symbolic, for one jitted callable.
    ``all_sizes``: every size of a tensor read through a path is symbolic from
    the first call (``dynamic=True``, ``cache='symbolic values'``), except a
    module's registered buffers, whose sizes are the model's (a rotary table):
    as torch.compile does, they become symbolic only once their size changed."""

    def __init__(self, all_sizes: bool = False):
        self.all_sizes = all_sizes
        self.dims: dict[Prov, frozenset[int]] = {}
        self.floats: set[Prov] = set()
        self.static: set[Prov] = set()      # symbolic failed for these: keyed on their values again
        self.used: set[Prov] = set()        # the paths the compile under way made symbolic

    def active(self) -> bool:
        """Whether a compile needs a ``ShapeEnv`` for these paths."""
        return bool(self.all_sizes or self.dims or self.floats)

    def dims_of(self, prov: Prov, t: torch.Tensor):
        """The symbolic dims of ``t`` read through ``prov`` (None: static)."""
        if isinstance(t, torch.nn.Parameter) or prov in self.static:
            return None
        if self.all_sizes and prov.module_slot != "_buffers":
            return ALL_DIMS
        return self.dims.get(prov)

    def float_symbolic(self, prov: Prov) -> bool:
        return prov in self.floats and prov not in self.static

    def make_static(self) -> set[Prov]:
        """Symbolic sizes or numbers failed for the last compile: the paths it
        made symbolic are static from now on (returned)."""
        used, self.used = self.used, set()
        self.static |= used
        return used

    def _mark(self, prov: Prov, dims: set[int]) -> bool:
        old = self.dims.get(prov, frozenset())
        if prov in self.static or dims <= old:
            return False
        self.dims[prov] = frozenset(old | dims)
        return True

    def learn_from_miss(self, entry, args: tuple, kwargs: dict) -> str | None:
        """``entry`` (same key) refused this call: the dims of its path tensors
        whose size changed, and its floats guarded by path that changed, become
        symbolic. Returns what changed, for the miss reason (None: nothing)."""
        learned: list[str] = []
        for prov, shape, _ in entry.path_shapes:
            try:
                now = read_path(prov, args, kwargs)
            except Exception:  # noqa: BLE001 - a path that no longer reads: nothing to learn from it
                continue
            if not isinstance(now, torch.Tensor) or now.dim() != len(shape) or isinstance(now, torch.nn.Parameter):
                continue
            dims = {d for d, (a, b) in enumerate(zip(shape, now.shape, strict=True)) if a != b}
            if dims and self._mark(prov, dims):
                learned += [f"{prov.describe()}.shape[{d}]" for d in sorted(dims)]
        for g in entry.guards:
            if g.kind != "eq" or type(g.value) is not float or g.prov in self.floats or g.prov in self.static:
                continue
            try:
                now = read_path(g.prov, args, kwargs)
            except Exception:  # noqa: BLE001 - as above
                continue
            if type(now) is float and now != g.value:
                self.floats.add(g.prov)
                learned.append(g.prov.describe())
        if not learned:
            return None
        return f"{' and '.join(learned)} {'is' if len(learned) == 1 else 'are'}"

    def learn_from_writes(self, inputs: list, writes: list) -> str | None:
        """Tensors the program read through a path and writes back, grown, through
        the same path: their growing dims become symbolic (the caller traces
        again). Returns what was learned, or None."""
        read = {inp.prov: inp for inp in inputs
                if inp.prov is not None and isinstance(inp.value, torch.Tensor) and inp.guard_meta}
        if not read:
            return None
        learned: list[str] = []
        for prov, value in _written(writes):
            inp = read.get(prov)
            if inp is None or type(value) is not TensorProxy or isinstance(inp.value, torch.nn.Parameter):
                continue
            before, after = inp.proxy.shape, value.shape
            if len(before) != len(after):
                continue
            dims = {d for d, (a, b) in enumerate(zip(before, after, strict=True))
                    if not _same_size(a, b) and type(a) is not SymInt}
            if dims and self._mark(prov, dims):
                learned += [f"{prov.describe()}.shape[{d}]" for d in sorted(dims)]
        if not learned:
            return None
        return f"{' and '.join(learned)} {'grows' if len(learned) == 1 else 'grow'} on every call"


def _same_size(a: Any, b: Any) -> bool:
    if type(a) is SymInt or type(b) is SymInt:
        return type(a) is type(b) and a.expr == b.expr
    return a == b


def _written(writes: list):
    """(path, value) of each value the epilogue writes through a path."""
    for w in writes:
        if w.kind == "attr" and isinstance(w.target, Prov):
            yield w.target.attr(w.key), w.value
        elif w.kind == "item" and isinstance(w.target, Prov):
            yield w.target.item(w.key), w.value
        elif w.kind == "global":
            yield Prov.global_(w.target, w.key), w.value
        elif w.kind == "cell":
            yield w.target, w.value
        elif w.kind == "replace" and type(w.value) is list:
            yield from ((w.target.item(i), v) for i, v in enumerate(w.value))
        elif w.kind == "replace" and type(w.value) is dict:
            yield from ((w.target.item(k), v) for k, v in w.value.items())
