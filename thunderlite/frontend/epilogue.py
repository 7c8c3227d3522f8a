"""The epilogue: what the program did to the world outside it, applied after the run.

After tracing, ``collect_writes`` lists every write the program made to objects
that outlive the call (module attributes and buffers, globals, closure cells
of functions defined outside the call, lists/dicts passed in or read from
globals/attributes). Tensor values in those writes are
proxies; the computation returns them as extra outputs, and the generated
entry function writes the real tensors where eager would have.

``Template`` rebuilds the user's return value from the computation's flat
outputs when it holds objects a trace cannot print (an HF ``ModelOutput``, a
``DynamicCache``): objects created during tracing are copied afresh per call;
objects that came from outside are the call's own: an object keyed by type
(an HF cache passed in, ``TraceState.objects``) is read through its path on
each call (``resolvable``: the entry reads it in its prologue and hands it
over), anything else is returned as it is (its identity is guarded). Values
written back resolve such objects the same way.
"""
from __future__ import annotations

import copy
import functools
import types
from collections import OrderedDict, defaultdict, deque
from typing import Any

import torch

from thunderlite.core.proxies import Proxy
from thunderlite.core.symexpr import evaluate
from thunderlite.core.symint import SymInt
from thunderlite.distributed import dtensor
from thunderlite.distributed.dtensor import DTensorProxy
from thunderlite.frontend.provenance import Prov, key_expr
from thunderlite.frontend.state import DELETED, TraceState

_ATOMS = (int, float, bool, str, type(None), complex, torch.dtype, torch.device, slice, bytes, type(Ellipsis))


class Write:
    """One write-back: ``kind`` is attr, item, global, cell (a closure cell), replace
    (a mirrored list or dict), refill (a mirrored set or deque, by its method ``key``), or call
    (``target.key(*value)`` on an input tensor: a hook registered on it, a shape it took in place, its ``.data``
    replaced)."""
    __slots__ = ("kind", "target", "key", "value")

    def __init__(self, kind: str, target: Any, key: Any, value: Any):
        self.kind = kind
        self.target = target       # a Prov (attr/item/replace) or a globals dict
        self.key = key
        self.value = value


def collect_writes(state: TraceState) -> list[Write]:
    writes = []
    for (_, name), (obj, value) in state.attr_writes.items():
        prov = state.prov_of[id(obj)]
        if type(name) is tuple:
            writes.append(Write("item", prov, name[1], value))
        else:
            writes.append(Write("attr", prov, name, value))
    for (_, name), (g, value) in state.global_writes.items():
        writes.append(Write("global", g, name, value))
    for cell, value in state.cell_writes.values():
        writes.append(Write("cell", Prov.cell(cell), None, value))
    for m in state.mirror_of.values():
        if m.prov is not None and m.changed():
            value = {k: _kept(v, state) for k, v in m.copy.items()} if isinstance(m.copy, dict) \
                else [_kept(v, state) for v in m.copy]
            if isinstance(m.copy, (list, dict)):
                writes.append(Write("replace", m.prov, None, value))
            else:       # a set or a deque: cleared and refilled by its own method
                writes.append(Write("refill", m.prov, "update" if isinstance(m.copy, set) else "extend", value))
    return writes


class Kept:
    """A list or dict from outside the call that a mirrored container refilled
    by the epilogue still holds (too big to copy: LBFGS's history): written
    back as the very object, its item writes its own, never as a copy of
    what it held while tracing."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj


def _kept(v: Any, state: TraceState) -> Any:
    if type(v) in (list, dict) and id(v) in state.prov_of and id(v) not in state.mirrors_by_copy:
        return Kept(v)
    return v


def proxies_in(x: Any, out: list, seen: set) -> None:
    """Append every proxy reachable from ``x`` (containers and object attributes)."""
    if isinstance(x, Proxy):
        if x.name not in seen:
            seen.add(x.name)
            out.append(x)
        return
    if type(x) is SymInt:
        for p in x.proxies():
            proxies_in(p, out, seen)
        return
    if type(x) in _ATOMS or id(x) in seen:
        return
    if type(x) is DTensorProxy:
        proxies_in(x.local, out, seen)
        return
    if type(x) is Made:
        proxies_in(x.template.value, out, seen)
        return
    seen.add(id(x))
    if isinstance(x, (tuple, list)):
        for y in x:
            proxies_in(y, out, seen)
    elif isinstance(x, dict):
        for y in x.values():
            proxies_in(y, out, seen)
    if _is_plain_object(x):
        for y in vars(x).values():
            proxies_in(y, out, seen)


def _is_plain_object(x: Any) -> bool:
    return (hasattr(x, "__dict__") and not isinstance(x, (type, types.ModuleType, types.FunctionType,
                                                           types.MethodType, torch.nn.Module)))


def is_simple(x: Any) -> bool:
    """True when a trace can return ``x`` directly (proxies, atoms, plain containers)."""
    t = type(x)
    if isinstance(x, Proxy) or t in _ATOMS or t is SymInt:
        return True
    if t is tuple or t is list:
        return all(is_simple(y) for y in x)
    if t is dict:
        return all(type(k) is str and is_simple(v) for k, v in x.items())
    return False


def resolvable(state: TraceState) -> dict[int, Prov]:
    """id -> path of the objects from outside that the epilogue must read
    through their paths on each call (keyed by type, identity unused)."""
    return {i: prov for i, (_, prov) in state.objects.items() if i not in state.fixed}


class Template:
    """Rebuilds a traced value with proxies replaced by runtime values.
    ``paths``: the paths of the objects from outside it holds that each call
    gives anew (``resolvable``); ``build`` takes their values in that order."""

    def __init__(self, value: Any, state: TraceState):
        self.value = value
        # objects from outside are returned as they are (ids stay valid: the
        # template itself references every object it will meet)
        self.external = set(state.prov_of)
        found: dict[int, Prov] = {}
        _objects_in(value, resolvable(state), found, set())
        self.ids = tuple(found)
        self.paths = tuple(found.values())

    def build(self, env: dict, resolved: tuple = ()) -> Any:
        return self._build(self.value, env, dict(zip(self.ids, resolved, strict=True)))

    def _build(self, x: Any, env: dict, memo: dict) -> Any:
        if isinstance(x, Proxy):
            return env[x.name]
        if type(x) is SymInt:
            return evaluate(x.expr, env)
        t = type(x)
        if t in _ATOMS:
            return x
        if id(x) in memo:       # built already, or an object from outside given anew by this call
            return memo[id(x)]
        if id(x) in self.external:
            return x
        if t is DTensorProxy:
            return dtensor.materialize(x, env[x.local.name])
        if t is types.MethodType and id(x.__self__) in self.external:    # ``cache.update``: of this call's cache
            return types.MethodType(x.__func__, self._build(x.__self__, env, memo))
        if t is tuple:
            return tuple(self._build(y, env, memo) for y in x)
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return t(*(self._build(y, env, memo) for y in x))
        if isinstance(x, tuple) and hasattr(t, "n_fields"):     # torch.return_types structseqs
            return t([self._build(y, env, memo) for y in x])
        if t is list:
            new = memo[id(x)] = []
            new.extend(self._build(y, env, memo) for y in x)
            return new
        if t is dict:
            new = memo[id(x)] = {}
            new.update((k, self._build(v, env, memo)) for k, v in x.items())
            return new
        if isinstance(x, (type, types.ModuleType, types.FunctionType, types.MethodType,
                          types.BuiltinFunctionType, torch.nn.Module)):
            return x
        return self._build_object(x, env, memo)

    def _build_object(self, x: Any, env: dict, memo: dict) -> Any:
        new = memo[id(x)] = _blank(x)
        if isinstance(x, dict):
            # a bare OrderedDict's keys are kept in its own order, which dict's setitem bypasses
            setitem = OrderedDict.__setitem__ if isinstance(x, OrderedDict) else dict.__setitem__
            for k, v in x.items():
                setitem(new, k, self._build(v, env, memo))
        elif isinstance(x, list):
            new[:] = [self._build(y, env, memo) for y in x]
        if hasattr(x, "__dict__"):
            for k, v in vars(x).items():
                object.__setattr__(new, k, self._build(v, env, memo))
        return new


def _blank(x: Any) -> Any:
    """A new object of ``x``'s type for ``Template`` to fill with ``x``'s
    attributes and items: ``copy.copy(x)``, or, where that gives an object
    whose state is only those (``_fills_alike``: an HF ``ModelOutput``, whose
    copy runs its dataclass ``__init__`` and ``__post_init__``, microseconds
    per call), the type's bare instance."""
    t = type(x)
    fills = _FILLS_ALIKE.get(t)
    if fills is None:
        fills = _FILLS_ALIKE[t] = _fills_alike(x)
    if fills:
        return t.__new__(t)
    return copy.copy(x)


_FILLS_ALIKE: dict[type, bool] = {}


def _fills_alike(x: Any) -> bool:
    """Whether ``type(x).__new__`` then ``x``'s attributes and items make what
    ``copy.copy(x)`` then the same make: a type with no slots and no hook of
    its own around copying (``__copy__``, ``__setstate__``), of a plain base
    (object, dict or list; OrderedDict's bare instance is a usable empty one),
    whose copy holds exactly ``x``'s attribute names and item keys, in order."""
    t = type(x)
    if any("__slots__" in vars(c) for c in t.__mro__[:-1]) or hasattr(t, "__copy__") or \
            hasattr(t, "__setstate__"):
        return False
    bases = {b for b in t.__mro__ if b.__module__ == "builtins" or b is OrderedDict}
    if not bases <= {object, dict, list, OrderedDict}:
        return False
    try:
        made = copy.copy(x)
        blank = t.__new__(t)
    except Exception:  # noqa: BLE001 - the copy as it was decides
        return False
    if type(made) is not t or type(blank) is not t or list(vars(made)) != list(vars(x)):
        return False
    if isinstance(x, dict) and list(dict.keys(made)) != list(dict.keys(x)):
        return False
    if isinstance(x, list) and len(made) != len(x):
        return False
    return not vars(blank) and not (isinstance(blank, (dict, list)) and len(blank))


class Made:
    """A value written back that holds objects the call made with traced values
    in them (the cache layers HF's ``DynamicCache`` appends on its first update),
    or holding objects from outside that each call gives anew (``resolvable``):
    written as a copy built per call from that call's values (``Template``), as
    a returned value is; written as it is, they would hold the trace's proxies
    or objects."""
    __slots__ = ("template", "names")

    def __init__(self, value: Any, state: TraceState):
        self.template = Template(value, state)
        flat: list = []
        proxies_in(value, flat, set())
        self.names = [p.name for p in flat]


def _objects_in(x: Any, objects: dict, found: dict, seen: set) -> None:
    """The objects of ``objects`` (id -> path) that ``x`` holds, past containers,
    objects' attributes and bound methods, into ``found``."""
    t = type(x)
    if isinstance(x, Proxy) or t in _ATOMS or t is SymInt or id(x) in seen:
        return
    seen.add(id(x))
    if id(x) in objects:
        found[id(x)] = objects[id(x)]
        return
    if t is Made:
        found.update(zip(x.template.ids, x.template.paths, strict=True))
        return
    if t is types.MethodType:
        _objects_in(x.__self__, objects, found, seen)
    elif isinstance(x, (tuple, list, set, frozenset, deque)):
        for y in x:
            _objects_in(y, objects, found, seen)
    elif isinstance(x, dict):
        for y in (*x, *x.values()):
            _objects_in(y, objects, found, seen)
    if _is_plain_object(x):
        for y in vars(x).values():
            _objects_in(y, objects, found, seen)


def guard_held_by_functions(x: Any, state: TraceState, seen: set | None = None) -> None:
    """A function the call made (a ``lambda``: its closure cells are the
    call's) that leaves it (returned, written back) is made once, while
    tracing, and serves every call: an object keyed by type that its cells
    hold is the one seen while tracing, so the entry holds for that very
    object. (A bound method is rebuilt on this call's object: ``Template``.)"""
    seen = set() if seen is None else seen
    t = type(x)
    if isinstance(x, Proxy) or t in _ATOMS or t is SymInt or id(x) in seen or id(x) in state.prov_of:
        return
    seen.add(id(x))
    if t is types.FunctionType:
        for cell in x.__closure__ or ():
            if id(cell) in state.external_cells or not _filled(cell):
                continue        # a cell from outside the call: read through its path when it runs
            v = cell.cell_contents
            if id(v) in state.objects:
                state.identity_used(v, f"held by {x.__qualname__}, a function the call made that outlives it")
            else:
                guard_held_by_functions(v, state, seen)
    elif t is Made:
        guard_held_by_functions(x.template.value, state, seen)
    elif isinstance(x, (tuple, list, set, frozenset, deque)):
        for y in x:
            guard_held_by_functions(y, state, seen)
    elif isinstance(x, dict):
        for y in x.values():
            guard_held_by_functions(y, state, seen)
    elif _is_plain_object(x):
        for y in vars(x).values():
            guard_held_by_functions(y, state, seen)


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def object_paths(x: Any, objects: dict) -> list[Prov]:
    """The paths of the objects from outside (``objects``: ``resolvable``) that a
    value written back holds: the entry reads them before anything runs."""
    found: dict[int, Prov] = {}
    _objects_in(x, objects, found, set())
    return list(found.values())


def made_by_call(x: Any, state: TraceState) -> Any:
    """``x``, or a ``Made`` when it holds traced values, or objects each call
    gives anew, inside objects the call made."""
    return Made(x, state) if _holds_made(x, state, set()) else x


def _holds_made(x: Any, state: TraceState, seen: set) -> bool:
    """Whether ``x`` holds, past plain containers (``value_expr`` spells those), an
    object the call made with traced values in it."""
    t = type(x)
    if isinstance(x, Proxy) or t in _ATOMS or t is SymInt or id(x) in state.prov_of or id(x) in seen:
        return False
    seen.add(id(x))
    if t is tuple or t is list:
        return any(_holds_made(y, state, seen) for y in x)
    if t is dict:
        return any(_holds_made(y, state, seen) for y in x.values())
    flat: list = []
    proxies_in(x, flat, set())
    return bool(flat) or bool(object_paths(x, resolvable(state)))


def value_expr(x: Any, env_names: dict, consts: dict, objects: dict | None = None) -> str:
    """Python source for a write-back value: proxies by their output variable,
    objects from outside given anew by each call (``objects``: id -> the
    variable the entry read it into) by that variable."""
    if isinstance(x, Proxy):
        return env_names[x.name]
    objects = objects or {}

    def expr(y):
        return value_expr(y, env_names, consts, objects)

    if id(x) in objects:
        return objects[id(x)]
    t = type(x)
    if t is DTensorProxy:   # a DTensor (an optimizer's new state, a .grad): made on the real local result
        name = f"_W{len(consts)}"
        consts[name] = functools.partial(dtensor.materialize, x)
        return f"{name}({env_names[x.local.name]})"
    if t is Made:
        name = f"_W{len(consts)}"
        consts[name] = x.template
        resolved = "".join(f"{objects[i]}, " for i in x.template.ids)
        return f"{name}.build({{{', '.join(f'{n!r}: {env_names[n]}' for n in x.names)}}}, ({resolved}))"
    if t is SymInt:     # a symbolic size (``self.seen = x.shape[0]``): its value on this call
        return f"({x.python(lambda n: env_names[x.env.atoms[n].proxy.name])})"
    if t is tuple:
        inner = ", ".join(expr(y) for y in x)
        return f"({inner},)" if len(x) == 1 else f"({inner})"
    if t is list:
        return "[" + ", ".join(expr(y) for y in x) + "]"
    if t is dict:
        return "{" + ", ".join(f"{expr(k)}: {expr(v)}" for k, v in x.items()) + "}"
    if t in (int, bool, str, type(None)):
        return repr(x)
    if t in _FRESH_CONTAINERS:      # made by the program: a new one per call, as eager makes
        items = "{" + ", ".join(f"{expr(k)}: {expr(v)}" for k, v in x.items()) + "}" if isinstance(x, dict) \
            else "[" + ", ".join(expr(y) for y in x) + "]"
        make = _const_name(t, consts)
        if t is defaultdict:
            return f"{make}({expr(x.default_factory)}, {items})"
        if t is deque:
            return f"{make}({items}, {x.maxlen!r})"
        return f"{make}({items})"
    return _const_name(x, consts)


_FRESH_CONTAINERS = (defaultdict, OrderedDict, deque, set)


def _const_name(x: Any, consts: dict) -> str:
    name = f"_W{len(consts)}"
    consts[name] = x.obj if type(x) is Kept else x
    return name


def write_source(w: Write, env_names: dict, consts: dict, roots: dict, target: str | None = None,
                 objects: dict | None = None) -> list[str]:
    """Source lines applying one write-back; ``target``: a variable already holding
    the object written (read before any write of the call: ``run_and_write``);
    ``objects``: see ``value_expr``."""
    if w.kind == "global":
        g = roots.setdefault(id(w.target), (f"_G{len(roots)}", w.target))[0]
        if w.value is DELETED:
            return [f"del {g}[{w.key!r}]"]
        return [f"{g}[{w.key!r}] = {value_expr(w.value, env_names, consts, objects)}"]
    target = target or w.target.expr(roots)
    v = value_expr(w.value, env_names, consts, objects)
    value = w.value.template.value if type(w.value) is Made else w.value
    if w.kind == "call":
        return [f"with _no_grad(): {target}.{w.key}(*{v})"]
    if w.kind == "attr":
        return [f"delattr({target}, {w.key!r})" if w.value is DELETED else f"setattr({target}, {w.key!r}, {v})"]
    if w.kind == "cell":
        return [f"del {target}" if w.value is DELETED else f"{target} = {v}"]
    if w.kind == "item":
        key = key_expr(w.key, roots)
        return [f"del {target}[{key}]" if w.value is DELETED else f"{target}[{key}] = {v}"]
    if isinstance(value, dict):
        return [f"_d = {target}", "_d.clear()", f"_d.update({v})"]
    if w.kind == "refill":
        return [f"_d = {target}", "_d.clear()", f"_d.{w.key}({v})"]
    return [f"{target}[:] = {v}"]


def write_targets(writes: list[Write]) -> list[Prov]:
    return [w.target for w in writes if isinstance(w.target, Prov)]
