"""Guards on what the cache key cannot see about tensors the program writes.

The key function covers the *arguments*: their metadata and which of them
share storage. Two facts about writes are outside it and are checked here,
in the entry's prologue, only for the few tensors they concern:

- **storage sharing with state**: a tensor read from a global, a closure cell
  or a module (parameter, buffer) may share storage with an argument or with
  another such tensor. The trace was compiled with the sharing it saw (it is
  part of the trace's alias groups); when the program writes one of its inputs,
  a different sharing at call time means a different program, so the prologue
  compares the sharing pattern of the tensors involved and misses on a change
  (the recompile then sees the alias). Programs that write no input pay nothing.
- **eager's verdict on a write** (``write_verdict``): in-place on a leaf that
  requires grad, on a view of one, on a view made under no_grad, on an
  inference tensor outside inference mode. The key sees ``requires_grad`` but
  not these, so each written input's verdict is checked; the compiled trace
  raised eager's error (update_aliases' ``check_writes``) when it was refused.
- **strides** the compiled program relies on (``strides``): autodiff's
  functionalization decided whether a ``reshape`` is a view or a copy, as eager
  does, from the strides of the inputs it is computed from, or placed inputs
  sharing storage in it by their strides and storage offsets; other strides
  (offsets) recompile.

Example (the generated prologue lines)::

    if v0.untyped_storage().data_ptr() == args[0].untyped_storage().data_ptr(): return _MISS
    if args[0].is_inference() and not _inference_mode(): return _MISS
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from thunderlite.core.trace import Trace
from thunderlite.frontend.caching.keys import alias_pattern
from thunderlite.frontend.state import Input
from thunderlite.transforms.aliasing.update_aliases import AliasGroups, writes_memory, written

PLAIN, INFERENCE, LEAF, VIEW_OF_LEAF, NO_GRAD_VIEW = range(5)

_NO_GRAD_VIEW_MSG = (
    "A view was created in no_grad mode and is being modified inplace with grad mode enabled. Given that "
    "this use case is ambiguous and error-prone, it is forbidden. You can clarify your code by moving both "
    "the view and the inplace either both inside the no_grad block (if you don't want the inplace to be "
    "tracked) or both outside (if you want the inplace to be tracked).")
_VIEW_OF_LEAF_MSG = "a view of a leaf Variable that requires grad is being used in an in-place operation."


def write_verdict(t: torch.Tensor) -> int:
    """What eager says to an in-place write into ``t`` (see the module docstring)."""
    if t.is_inference() and not torch.is_inference_mode_enabled():
        return INFERENCE
    if not t.requires_grad:
        return PLAIN
    if t.is_leaf:
        return NO_GRAD_VIEW if t._is_view() else LEAF
    base = t._base
    if base is not None and base.is_leaf and base.requires_grad:
        return VIEW_OF_LEAF
    return PLAIN


def refused_writes(inputs: list[Input]) -> dict:
    """``update_aliases`` keyword arguments naming the inputs eager refuses to
    write: leaves requiring grad, inference tensors, and views it refuses
    (mapped to eager's message)."""
    leaf, inference, views = set(), set(), {}
    for inp in inputs:
        t = inp.value
        if not isinstance(t, torch.Tensor):
            continue
        v = write_verdict(t)
        if v == LEAF:
            leaf.add(inp.proxy.name)
        elif v == INFERENCE:
            inference.add(inp.proxy.name)
        elif v == VIEW_OF_LEAF:
            views[inp.proxy.name] = _VIEW_OF_LEAF_MSG
        elif v == NO_GRAD_VIEW:
            views[inp.proxy.name] = _NO_GRAD_VIEW_MSG
    return {"leaf_inputs": leaf, "inference_inputs": inference, "refused_view_inputs": views}


def written_inputs(trace: Trace, input_alias_groups) -> set[str]:
    """Names of the trace arguments whose storage some symbol writes (through a
    view, an alias, or a write hidden in a decomposition)."""
    if not writes_memory(trace):
        return set()
    groups = AliasGroups.of_trace(trace, input_alias_groups)
    roots = set()
    for bsym in trace.bound_symbols:
        roots.update(groups.find(d.name) for d in written(bsym))
    if not roots:
        return set()
    return {a.name for a in trace.args if hasattr(a, "name") and groups.find(a.name) in roots}


class AliasGuard:
    """The prologue checks of one entry: ``shared`` are input indexes whose
    storage-sharing pattern must stay ``pattern``; ``verdicts`` pairs written
    input indexes with the verdict they were compiled with."""
    __slots__ = ("shared", "pattern", "verdicts", "names", "requires_grad", "strides")

    def __init__(self, shared: list[int], pattern: tuple, verdicts: list[tuple[int, int]], names: list[str],
                 requires_grad: list[bool], strides: list[tuple[int, tuple]] = ()):
        self.strides = list(strides)    # (input index, strides, storage offset or None) compiled for
        self.shared = shared
        self.pattern = pattern
        self.verdicts = verdicts
        self.names = names          # per input: how messages name it
        self.requires_grad = requires_grad

    def explain(self, values: list) -> str | None:
        """Why the checks reject the input tensors ``values`` (None: they pass)."""
        now = alias_pattern(tuple(values[i].untyped_storage().data_ptr() for i in self.shared))
        if now != self.pattern:
            k = next(k for k, (a, b) in enumerate(zip(now, self.pattern, strict=True)) if a != b)
            i, j = self.shared[k], self.shared[now[k] if now[k] != k else self.pattern[k]]
            how = "share storage now" if now[k] != k else "no longer share storage"
            return f"{self.names[i]} and {self.names[j]} {how} (the program writes one of them)"
        for i, v in self.verdicts:
            if write_verdict(values[i]) != v:
                return (f"whether eager allows writing {self.names[i]} changed (a leaf requiring grad, a view of "
                        "one, or an inference tensor)")
        for i, st, off in self.strides:
            if tuple(values[i].stride()) != st:
                return (f"the strides of {self.names[i]} changed from {st} to {tuple(values[i].stride())} (whether "
                        "a reshape of it is a view or a copy, or where it lies in storage it shares, depends on them)")
            if off is not None and values[i].storage_offset() != off:
                return (f"the storage offset of {self.names[i]} changed from {off} to {values[i].storage_offset()} "
                        "(it shares storage with another input)")
        return None

    def lines(self, var_of: Callable[[int], str], const: Callable[[object], str]) -> list[str]:
        """Prologue source lines (each returns ``_MISS`` on a change)."""
        out = []
        ptrs = [f"{var_of(i)}.untyped_storage().data_ptr()" for i in self.shared]
        if len(ptrs) == 2:
            op = "!=" if self.pattern[1] == 0 else "=="
            out.append(f"if {ptrs[0]} {op} {ptrs[1]}: return _MISS")
        elif ptrs and self.pattern == tuple(range(len(ptrs))):     # the usual case: nothing shared
            out.append(f"if len({{{', '.join(ptrs)}}}) != {len(ptrs)}: return _MISS")
        elif ptrs:
            out.append(f"if _alias_pattern(({', '.join(ptrs)},)) != {const(self.pattern)}: return _MISS")
        for i, v in self.verdicts:
            if v == PLAIN and not self.requires_grad[i]:
                # requires_grad is checked by the key / the metadata guard: only inference can change
                out.append(f"if {var_of(i)}.is_inference() and not _inference_mode(): return _MISS")
            else:
                out.append(f"if _write_verdict({var_of(i)}) != {v}: return _MISS")
        for i, st, off in self.strides:
            out.append(f"if {var_of(i)}.stride() != {st!r}: return _MISS")
            if off is not None:
                out.append(f"if {var_of(i)}.storage_offset() != {off!r}: return _MISS")
        return out


def plan_alias_guard(inputs: list[Input], written_names: set[str], strided: tuple = (),
                     placed: tuple = ()) -> AliasGuard | None:
    """The checks an entry needs: none when the program writes no input and
    relies on no input's strides (``strided``: their names; ``placed``: also
    their storage offsets).

    Sharing that involves only arguments is in the cache key already; the
    pattern covers every written input plus, when an argument is written, the
    tensors not passed as arguments, and when such a tensor is written, all
    tensor inputs (a write can only be misordered against a tensor that shares
    its storage; storage on another device never does)."""
    if not written_names and not strided and not placed:
        return None
    tensors = [(i, inp) for i, inp in enumerate(inputs) if isinstance(inp.value, torch.Tensor)]
    written_idx = [i for i, inp in tensors if inp.proxy.name in written_names]
    state_written = any(not is_argument(inputs[i].prov) for i in written_idx)
    devices = {inputs[i].value.device for i in written_idx}
    shared = [i for i, inp in tensors if inp.value.device in devices
              and (i in written_idx or state_written or not is_argument(inp.prov))]
    if all(is_argument(inputs[i].prov) for i in shared):
        shared = []                 # only arguments: the key covers their sharing
    pattern = alias_pattern(tuple(inputs[i].value.untyped_storage().data_ptr() for i in shared))
    verdicts = [(i, write_verdict(inputs[i].value)) for i in written_idx]
    names = [inp.prov.describe() if inp.prov is not None else f"the constant tensor {inp.proxy.name}"
             for inp in inputs]
    requires_grad = [isinstance(inp.value, torch.Tensor) and inp.value.requires_grad for inp in inputs]
    strides = [(i, tuple(inp.value.stride()), inp.value.storage_offset() if inp.proxy.name in placed else None)
               for i, inp in tensors if inp.proxy.name in strided or inp.proxy.name in placed]
    return AliasGuard(shared, pattern, verdicts, names, requires_grad, strides)


def is_argument(prov) -> bool:
    """A tensor passed as an argument (or inside a list/tuple/dict argument)."""
    while prov is not None and prov.kind == "item":
        prov = prov.parent
    return prov is not None and prov.kind in ("arg", "kwarg")
