"""The epilogue: what the program did to the world outside it, applied after the run.

After tracing, ``collect_writes`` lists every write the program made to objects
that outlive the call (module attributes and buffers, globals, closure cells
of functions defined outside the call, lists/dicts passed in or read from
globals/attributes). Tensor values in those writes are
proxies; the computation returns them as extra outputs, and the generated
entry function writes the real tensors where eager would have.

``Template`` rebuilds the user's return value from the computation's flat
outputs when it holds objects a trace cannot print (an HF ``ModelOutput``, a
``DynamicCache``): objects created during tracing are copied afresh per call,
objects that came from outside are returned as they are.
"""
from __future__ import annotations

import copy
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
            value = dict(m.copy) if isinstance(m.copy, dict) else list(m.copy)
            if isinstance(m.copy, (list, dict)):
                writes.append(Write("replace", m.prov, None, value))
            else:       # a set or a deque: cleared and refilled by its own method
                writes.append(Write("refill", m.prov, "update" if isinstance(m.copy, set) else "extend", value))
    return writes


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


class Template:
    """Rebuilds a traced value with proxies replaced by runtime values."""

    def __init__(self, value: Any, state: TraceState):
        self.value = value
        # objects from outside are returned as they are (ids stay valid: the
        # template itself references every object it will meet)
        self.external = set(state.prov_of)

    def build(self, env: dict) -> Any:
        return self._build(self.value, env, {})

    def _build(self, x: Any, env: dict, memo: dict) -> Any:
        if isinstance(x, Proxy):
            return env[x.name]
        if type(x) is SymInt:
            return evaluate(x.expr, env)
        t = type(x)
        if t in _ATOMS or id(x) in self.external:
            return x
        if t is DTensorProxy:
            return dtensor.materialize(x, env[x.local.name])
        if id(x) in memo:
            return memo[id(x)]
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
        new = memo[id(x)] = copy.copy(x)
        if isinstance(x, dict):
            for k, v in x.items():
                dict.__setitem__(new, k, self._build(v, env, memo))
        elif isinstance(x, list):
            new[:] = [self._build(y, env, memo) for y in x]
        if hasattr(x, "__dict__"):
            for k, v in vars(x).items():
                object.__setattr__(new, k, self._build(v, env, memo))
        return new


class Made:
    """A value written back that holds objects the call made with traced values
    in them (the cache layers HF's ``DynamicCache`` appends on its first update):
    written as a copy built per call from that call's values (``Template``), as
    a returned value is; written as it is, they would hold the trace's proxies."""
    __slots__ = ("template", "names")

    def __init__(self, value: Any, state: TraceState):
        self.template = Template(value, state)
        flat: list = []
        proxies_in(value, flat, set())
        self.names = [p.name for p in flat]


def made_by_call(x: Any, state: TraceState) -> Any:
    """``x``, or a ``Made`` when it holds traced values inside objects the call made."""
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
    return bool(flat)


def value_expr(x: Any, env_names: dict, consts: dict) -> str:
    """Python source for a write-back value: proxies by their output variable."""
    if isinstance(x, Proxy):
        return env_names[x.name]
    t = type(x)
    if t is Made:
        name = f"_W{len(consts)}"
        consts[name] = x.template
        return f"{name}.build({{{', '.join(f'{n!r}: {env_names[n]}' for n in x.names)}}})"
    if t is SymInt:     # a symbolic size (``self.seen = x.shape[0]``): its value on this call
        return f"({x.python(lambda n: env_names[x.env.atoms[n].proxy.name])})"
    if t is tuple:
        inner = ", ".join(value_expr(y, env_names, consts) for y in x)
        return f"({inner},)" if len(x) == 1 else f"({inner})"
    if t is list:
        return "[" + ", ".join(value_expr(y, env_names, consts) for y in x) + "]"
    if t is dict:
        return "{" + ", ".join(f"{value_expr(k, env_names, consts)}: {value_expr(v, env_names, consts)}"
                               for k, v in x.items()) + "}"
    if t in (int, bool, str, type(None)):
        return repr(x)
    if t in _FRESH_CONTAINERS:      # made by the program: a new one per call, as eager makes
        items = "{" + ", ".join(f"{value_expr(k, env_names, consts)}: {value_expr(v, env_names, consts)}"
                                for k, v in x.items()) + "}" if isinstance(x, dict) else \
            "[" + ", ".join(value_expr(y, env_names, consts) for y in x) + "]"
        make = _const_name(t, consts)
        if t is defaultdict:
            return f"{make}({value_expr(x.default_factory, env_names, consts)}, {items})"
        if t is deque:
            return f"{make}({items}, {x.maxlen!r})"
        return f"{make}({items})"
    return _const_name(x, consts)


_FRESH_CONTAINERS = (defaultdict, OrderedDict, deque, set)


def _const_name(x: Any, consts: dict) -> str:
    name = f"_W{len(consts)}"
    consts[name] = x
    return name


def write_source(w: Write, env_names: dict, consts: dict, roots: dict, target: str | None = None) -> list[str]:
    """Source lines applying one write-back; ``target``: a variable already holding
    the object written (read before any write of the call: ``run_and_write``)."""
    if w.kind == "global":
        g = roots.setdefault(id(w.target), (f"_G{len(roots)}", w.target))[0]
        if w.value is DELETED:
            return [f"del {g}[{w.key!r}]"]
        return [f"{g}[{w.key!r}] = {value_expr(w.value, env_names, consts)}"]
    target = target or w.target.expr(roots)
    v = value_expr(w.value, env_names, consts)
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
