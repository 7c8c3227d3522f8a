"""What one interpretation learns about the values that entered the program.

``TraceState`` is the bookkeeping the hooks fill while a call is traced and
the prologue/epilogue builders read afterwards:

- ``inputs``: tensors that became trace inputs, each with its provenance;
- ``guards``: Python values the trace depended on (checked on every call);
- ``mirrors``: lists/dicts the program sees as copies (arguments, containers
  read from globals/attributes), compared with the originals after tracing to
  write mutations back;
- ``attr_writes`` / ``global_writes`` / ``cell_writes``: the overlay of
  attribute, global and closure-cell (``nonlocal``) assignments, applied by the
  epilogue after the run.
"""
from __future__ import annotations

import enum
import types
from collections import OrderedDict, defaultdict, deque
from typing import Any

import torch

from thunderlite.core.proxies import NumberProxy, TensorProxy, proxy_of_tensor
from thunderlite.core.symint import SymInt
from thunderlite.distributed import dtensor
from thunderlite.frontend.caching.keys import ALL_DIMS, VALUE_TYPES
from thunderlite.frontend.provenance import Prov, is_atom
from thunderlite.frontend.source_map import defined_by_user

MIRROR_MAX_ITEMS = 64
# items that make a tuple read from outside worth copying (``TraceState.tuple_copy``)
_STATEFUL = (torch.Tensor, torch.nn.Module, list, dict, tuple)
DELETED = type("Deleted", (), {"__repr__": lambda self: "<deleted>", "__slots__": ()})()
"""The overlay value of an attribute or item the program deleted."""


class Input:
    """A tensor that entered the trace: its proxy, where it came from, the value seen."""
    __slots__ = ("proxy", "prov", "value", "guard_meta", "dims")

    def __init__(self, proxy: TensorProxy, prov: Prov | None, value: torch.Tensor, guard_meta: bool,
                 dims=None):
        self.proxy = proxy
        self.prov = prov            # None: a constant captured by reference
        self.value = value
        self.guard_meta = guard_meta  # arguments are covered by the key already
        self.dims = dims            # symbolic dims (a set or ALL_DIMS) of a tensor read through a path


class Guard:
    """``kind`` is 'eq' (value equality), 'is' (identity), 'len', 'keys',
    'same' (the path yields the very object ``value``, another path, yields), or
    'absent' (the path's last attribute does not exist: ``hasattr`` is False),
    or 'type_len' (``value`` is ``(type, length)``: a tuple, a deque)."""
    __slots__ = ("prov", "kind", "value")

    def __init__(self, prov: Prov, kind: str, value: Any):
        self.prov = prov
        self.kind = kind
        self.value = value


class Mirror:
    """A copy of a list/dict the program sees instead of the original."""
    __slots__ = ("original", "copy", "snapshot", "prov")

    def __init__(self, original, copy, prov: Prov | None):
        self.original = original
        self.copy = copy
        self.snapshot = list(copy.items()) if isinstance(copy, dict) else list(copy)
        self.prov = prov

    def changed(self) -> bool:
        now = list(self.copy.items()) if isinstance(self.copy, dict) else list(self.copy)
        if len(now) != len(self.snapshot):
            return True
        if isinstance(self.copy, dict):
            return any(k1 != k2 or v1 is not v2 for (k1, v1), (k2, v2) in zip(now, self.snapshot, strict=True))
        return any(a is not b for a, b in zip(now, self.snapshot, strict=True))


class TraceState:
    """Bookkeeping of one interpretation (see module docstring)."""

    def __init__(self, trace):
        self.trace = trace
        self.inputs: list[Input] = []
        self.guards: list[Guard] = []
        self._guarded: set = set()
        self.prov_of: dict[int, Prov] = {}       # id(object) -> where it came from
        self.proxy_of: dict[int, TensorProxy] = {}  # id(tensor) -> its proxy
        self.input_of: dict[int, Input] = {}       # id(tensor) -> its Input
        self.mirror_of: dict[int, Mirror] = {}    # id(original container) -> mirror
        self.mirrors_by_copy: dict[int, Mirror] = {}
        self.tuple_copies: dict[int, tuple] = {}     # id(tuple holding tensors) -> the program's copy
        self.attr_writes: dict[tuple, tuple] = {}  # (id(obj), name) -> (obj, value)
        self.global_writes: dict[tuple, tuple] = {}  # (id(globals), name) -> (globals, value)
        self.cell_writes: dict[int, tuple] = {}    # id(external cell) -> (cell, value)
        self.unpredicated: dict = {}               # blocks traced reading their flag -> why (training/predicated.py)
        self.predicated: list[tuple] = []          # (block, flag name, user line) of blocks traced predicated
        self.parameters: set[str] = set()          # names of proxies standing for nn.Parameters
        self.external_cells: set[int] = set()      # closure cells that existed before the call
        self._alive: list = []                     # keeps ids above valid while tracing
        self.shape_env = None                      # core.symint.ShapeEnv when sizes are symbolic
        self.auto = None                           # caching.automatic.PathDynamic: paths' symbolic sizes, floats
        self.numbers_of: dict[Prov, NumberProxy] = {}   # floats read through paths as trace inputs
        self.transforms: tuple = ()                # the jit's transforms (a module's own among them)
        self.module_transforms: list = []          # those of sharded models the program called (stand_in)

    # --- registering where things come from ---------------------------------------------
    def note_closure(self, fn: Any) -> None:
        """Cells of a function that exists outside the call: reads from them are
        guarded (cells made during the call are the program's own state)."""
        for cell in getattr(fn, "__closure__", None) or ():
            if id(cell) not in self.external_cells:
                self.external_cells.add(id(cell))
                self._alive.append(cell)

    def note(self, obj: Any, prov: Prov) -> None:
        if id(obj) not in self.prov_of:
            self.prov_of[id(obj)] = prov
            self._alive.append(obj)

    def register_module_tree(self, module: torch.nn.Module, prov: Prov) -> None:
        """Give every submodule, parameter and buffer of ``module`` its path, so
        values reached by iteration (``for layer in self.layers``) keep provenance."""
        self.note(module, prov)
        for name, p in module._parameters.items():
            if p is not None:
                self.note(p, prov.attr(name, "_parameters"))
        for name, b in module._buffers.items():
            if b is not None:
                self.note(b, prov.attr(name, "_buffers"))
        for name, sub in module._modules.items():
            if sub is not None and id(sub) not in self.prov_of:
                self.register_module_tree(sub, prov.attr(name, "_modules"))

    def add_guard(self, prov: Prov, kind: str, value: Any) -> None:
        if prov in self._guarded:
            return
        self._guarded.add(prov)
        self.guards.append(Guard(prov, kind, value))
        self._alive.append(value)

    # --- values entering the program -------------------------------------------------------
    def tensor_input(self, t: torch.Tensor, prov: Prov | None, guard_meta: bool = True,
                     name: str | None = None, symbolic_dims=None) -> TensorProxy:
        """The proxy of a tensor entering the program. ``symbolic_dims`` (a set of
        dims or ``ALL_DIMS``): those of size 2 or more become size symbols, trace
        inputs read from ``t.shape`` on every call."""
        proxy = self.proxy_of.get(id(t))
        if proxy is not None and id(t) not in self.input_of:
            return proxy            # a DTensor met again
        if proxy is not None:
            self._guard_same_tensor(self.input_of[id(t)], prov if prov is not None else self.prov_of.get(id(t)))
            return proxy
        if prov is None:
            prov = self.prov_of.get(id(t))     # reached by iteration: its registered module path
        if dtensor.is_dtensor(t):
            return self._dtensor_input(t, prov, name)
        name = self.trace.claim_name(name) if name else _proxy_name(self.trace, prov)
        proxy = proxy_of_tensor(t, name=name)
        path_dims = None
        if symbolic_dims is None and guard_meta and prov is not None and self.auto is not None:
            symbolic_dims = path_dims = self.auto.dims_of(prov, t)
        if symbolic_dims and prov is not None and self.shape_env is not None:
            proxy.shape = self._symbolic_shape(t, prov, name, symbolic_dims)
            if path_dims is not None and any(type(d) is SymInt for d in proxy.shape):
                self.auto.used.add(prov)
            else:
                path_dims = None
        self.proxy_of[id(t)] = proxy
        self._alive.append(t)
        inp = Input(proxy, prov, t, guard_meta, path_dims)
        self.inputs.append(inp)
        self.input_of[id(t)] = inp
        if isinstance(t, torch.nn.Parameter):
            self.parameters.add(proxy.name)
        return proxy

    def _dtensor_input(self, t: torch.Tensor, prov: Prov | None, name: str | None):
        """A ``DTensor`` entering the program: its local tensor is the trace input
        (unpacked and its metadata guarded on every call), its placements and mesh
        are guarded (distributed/dtensor.py)."""
        if prov is None:
            raise dtensor.DTensorRefused(
                f"thunderlite cannot trace a DTensor (placements {tuple(t.placements)}) the program reached "
                "without a path the next call could take again: pass it as an argument or a module attribute")
        local = self.tensor_input(t._local_tensor, prov.attr("_local_tensor"), guard_meta=True,
                                  name=f"{name}_local" if name else None, symbolic_dims=())   # sizes: the spec's
        self.add_guard(prov.attr("placements"), "eq", tuple(t.placements))
        self.add_guard(prov.attr("device_mesh"), "is", t.device_mesh)
        p = dtensor.of_input(t, local, prov.describe())
        self.proxy_of[id(t)] = p
        self._alive.append(t)
        return p

    def _symbolic_shape(self, t: torch.Tensor, prov: Prov, name: str, dims) -> tuple:
        shape = list(t.shape)
        for d, size in enumerate(t.shape):
            if size < 2 or (dims is not ALL_DIMS and d not in dims):
                continue
            sym = NumberProxy(size, int, name=self.trace.fresh_name("s"))
            self.inputs.append(Input(sym, prov.attr("shape").item(d), size, guard_meta=False))
            shape[d] = self.shape_env.size_symbol(sym, size, f"{name}.shape[{d}]")
        return tuple(shape)

    def number_input(self, prov: Prov, value: float) -> NumberProxy:
        """A float read through a path that keeps changing: a trace input read by
        that path on every call (caching/automatic.py), not a guarded constant."""
        proxy = self.numbers_of.get(prov)
        if proxy is None:
            proxy = self.numbers_of[prov] = NumberProxy(value, float, name=_proxy_name(self.trace, prov))
            self.inputs.append(Input(proxy, prov, value, guard_meta=True))     # its type is checked
            self.auto.used.add(prov)
        return proxy

    def input_by_name(self, name: str) -> Input | None:
        """The input whose proxy is named ``name`` (None for values the trace made)."""
        for inp in self.inputs:
            if inp.proxy.name == name:
                return inp
        return None

    def _guard_same_tensor(self, first: Input, prov: Prov | None) -> None:
        """One tensor reached by a second path: the trace uses one proxy for both,
        so every call must give the same object on both paths (``f(model.weight)``
        in a function that also reads ``model.weight``)."""
        if prov == first.prov:
            return
        if first.prov is None:
            self.add_guard(prov, "is", first.value)
        elif prov is None:
            self.add_guard(first.prov, "is", first.value)
        else:
            self.add_guard(prov, "same", first.prov)

    def enter(self, prov: Prov | None, value: Any) -> Any:
        """The value the program sees for ``value`` read through ``prov``."""
        if isinstance(value, torch.Tensor):
            return self.tensor_input(value, prov)
        if prov is None:
            return value
        t = type(value)
        if t is float and self.auto is not None and self.shape_env is not None and self.auto.float_symbolic(prov):
            return self.number_input(prov, value)
        if t in VALUE_TYPES:
            self.add_guard(prov, "eq", value)
            return value
        if isinstance(value, tuple) and all(type(v) in VALUE_TYPES for v in value):
            self.add_guard(prov, "eq", value)
            return value
        if isinstance(value, enum.Enum):       # compared by identity: ``self.mode is Mode.A``
            self.add_guard(prov, "is", value)
            return value
        if t is frozenset and all(type(v) in VALUE_TYPES for v in value):
            self.add_guard(prov, "eq", value)
            return value
        if isinstance(value, types.ModuleType):
            return value
        if (isinstance(value, types.BuiltinFunctionType)
                and not isinstance(value.__self__, (types.ModuleType, type(None)))):
            # a bound builtin method (``gen.get_state``) is a fresh object on every read:
            # equal (same self, same C function) is what can be guarded
            self.add_guard(prov, "eq", value)
            return value
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
            self.add_guard(prov, "is", value)
            if isinstance(value, types.FunctionType):
                self.note_closure(value)
            if not isinstance(value, types.BuiltinFunctionType) and defined_by_user(value):
                self.note(value, prov)      # its attributes (class-level state, fn.attr) are read and written by path
            return value
        if isinstance(value, types.MethodType):
            if isinstance(value.__func__, types.FunctionType):
                self.note_closure(value.__func__)   # its cells outlive the call
            return value
        if isinstance(value, torch.nn.Module):
            if id(value) not in self.prov_of:
                self.register_module_tree(value, prov)
            self.add_guard(self.prov_of[id(value)], "is", value)
            return value
        if (t is list or t is dict or t is OrderedDict or t is defaultdict and _atom_keys(value) or t is deque
                or t is set and all(type(v) in VALUE_TYPES for v in value)) and len(value) <= MIRROR_MAX_ITEMS:
            return self.mirror(value, prov)
        if t in (list, dict, OrderedDict, defaultdict, deque, set):
            # too big to copy item by item (a vocabulary), or keyed by objects: its
            # length is guarded, reads by key or index get paths, and changing it in
            # place is refused (TracingHooks.lookaside)
            self.add_guard(prov, "type_len", (t, len(value)))
        if (t is tuple or hasattr(t, "_make")) and isinstance(value, tuple) and len(value) <= MIRROR_MAX_ITEMS \
                and any(isinstance(v, _STATEFUL) for v in value):
            return self.tuple_copy(value, prov)
        self.note(value, prov)
        return value

    def tuple_copy(self, value: tuple, prov: Prov) -> tuple:
        """A tuple (or namedtuple) holding tensors, modules or containers, as the
        program sees it: its items entered through their paths, so unpacking and
        iterating it (native code, no hooks) hand over proxies, not real tensors.
        Guarded by type and length; each item by its own guards."""
        copy = self.tuple_copies.get(id(value))
        if copy is not None:
            return copy
        self.add_guard(prov, "type_len", (type(value), len(value)))
        items = [self.enter(prov.item(i), v) for i, v in enumerate(value)]
        copy = tuple(items) if type(value) is tuple else type(value)._make(items)
        self.tuple_copies[id(value)] = copy
        self._alive += [value, copy]
        return copy

    def mirror(self, container, prov: Prov | None, guard: bool = True):
        """The copy the program sees of ``container`` (made once per container)."""
        m = self.mirror_of.get(id(container))
        if m is not None:
            return m.copy
        if prov is not None:
            prov = self.prov_of.get(id(container), prov)
        is_dict = isinstance(container, dict)
        t = type(container)
        if guard and prov is not None:
            if t is set:
                self.add_guard(prov, "eq", set(container))
            elif t is deque:
                self.add_guard(prov, "type_len", (deque, len(container)))
            else:
                self.add_guard(prov, "keys" if is_dict else "len", tuple(container) if is_dict else len(container))
        if t is set:
            copy = set(container)
        elif t is deque:
            copy = deque((self.enter(_item_prov(prov, i), v) for i, v in enumerate(container)), container.maxlen)
        elif t is defaultdict:      # its default_factory with the entered items
            copy = defaultdict(container.default_factory,
                               ((k, self.enter(_item_prov(prov, k), v)) for k, v in container.items()))
        elif is_dict:
            copy = type(container)((k, self.enter(_item_prov(prov, k), v)) for k, v in container.items())
        else:
            copy = [self.enter(_item_prov(prov, i), v) for i, v in enumerate(container)]
        m = Mirror(container, copy, prov)
        self.mirror_of[id(container)] = m
        self.mirrors_by_copy[id(copy)] = m
        self._alive += [container, copy]
        return copy


def _atom_keys(d: dict) -> bool:
    """Keys a path can spell (a defaultdict keyed by tensors, an optimizer's
    ``state``, is read item by item through its identity-keyed paths instead)."""
    return all(is_atom(k) for k in d)


def _item_prov(prov: Prov | None, key) -> Prov | None:
    """The path of a mirrored container's item; a key that is not an atom (a
    tuple, an enum) is bound by identity in the prologue, which the container's
    key guard keeps valid."""
    if prov is None or isinstance(key, (NumberProxy, TensorProxy)):
        return None
    return prov.item(key)


def _proxy_name(trace, prov: Prov | None) -> str:
    """A readable proxy name from the path: ``fc_weight``, ``x``..."""
    if prov is None:
        return trace.fresh_name("const")
    parts = []
    p = prov
    while p is not None and p.kind in ("attr", "item"):
        # a tensor key (``optimizer.state[p]``) would print its values
        parts.append(str(p.key) if not isinstance(p.key, torch.Tensor) else type(p.key).__name__.lower())
        p = p.parent
    if p is not None and p.kind == "global":
        parts.append(str(p.key))
    elif p is not None and p.kind == "kwarg":
        parts.append(str(p.key))
    if not parts:
        return trace.fresh_name("t")
    return trace.claim_name("_".join(reversed(parts)))
