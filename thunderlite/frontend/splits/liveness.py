"""Which traced values the program can still read after a split.

At a split the program is suspended inside the interpreter; the piece that
runs up to the split must hand every value the rest of the program may read
to the pieces after it. What Python can still reach is what its live objects
hold: the interpreted frames (value stacks, locals, cells), the native frames
between them and the split (an emulated builtin's running state), the
overlay of writes the epilogue will make, and whatever those objects hold in
turn. ``reachable_proxies`` walks them (``gc.get_referents``) and returns the
proxies it meets, by name; what nobody reaches is dead at the split, as its
tensor would be in eager.

The walk stops at what cannot hold a proxy of this call (real tensors,
classes, modules and their globals, code) and at the tracing machinery
itself (traces, bound symbols, the hooks), whose proxies are not the
program's. Objects that existed before the call (``stop_ids``: a model, an
optimizer) are not walked either: the program's writes into them are in the
overlay, a root. A walk that grows past ``MAX_OBJECTS`` gives up (None): the
caller then keeps every value.
"""
from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterable

import torch

from thunderlite.core.proxies import Proxy
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.symint import SymInt
from thunderlite.core.trace import Trace

MAX_OBJECTS = 300_000

_LEAVES = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)
_NEVER = (type, types.ModuleType, types.CodeType, types.BuiltinFunctionType, types.BuiltinMethodType,
          types.WrapperDescriptorType, types.MethodDescriptorType, types.GetSetDescriptorType,
          types.MemberDescriptorType, torch.Tensor, BoundSymbol, Symbol, Trace)


def module_dict_ids() -> set[int]:
    """Module globals: reached through every function, never holding a proxy
    of this call (the program's global writes are in the overlay)."""
    return {id(m.__dict__) for m in list(sys.modules.values()) if m is not None and hasattr(m, "__dict__")}


def reachable_proxies(roots: Iterable, stop_ids: set[int], stop_types: tuple = ()) -> dict[str, Proxy] | None:
    """The proxies reachable from ``roots`` (see the module docstring), by name;
    None when the walk grew past ``MAX_OBJECTS``."""
    found: dict[str, Proxy] = {}
    seen: set[int] = set(stop_ids)
    todo = list(roots)
    never = _NEVER + tuple(stop_types)
    n = 0
    while todo:
        obj = todo.pop()
        if isinstance(obj, _LEAVES) or id(obj) in seen:
            continue
        seen.add(id(obj))
        n += 1
        if n > MAX_OBJECTS:
            return None
        if isinstance(obj, Proxy):
            found.setdefault(obj.name, obj)
            todo.extend(gc.get_referents(obj))
        elif type(obj) is SymInt:
            todo.extend(obj.proxies())
        elif isinstance(obj, never):
            continue
        elif isinstance(obj, types.FunctionType):
            # what a function made in the call holds: cells, defaults, attributes (not its globals)
            todo.extend(c for c in (obj.__closure__ or ()))
            todo.extend(obj.__defaults__ or ())
            todo.extend((obj.__kwdefaults__ or {}).values())
            todo.append(obj.__dict__)
        elif isinstance(obj, types.FrameType):
            todo.extend(obj.f_locals.values())
        else:
            todo.extend(gc.get_referents(obj))
    return found


def interpreter_frame_values(frame) -> list:
    """What an interpreted frame holds for the program: its value stack, fast
    locals and cells, a class body's or ``exec``'s locals, a generator's
    delegate, and the function it runs (its defaults and closure)."""
    out = list(frame.stack) + list(frame.fast)
    out += list(frame.closure or ())
    if isinstance(frame.locals, dict) and frame.locals is not frame.globals:
        out += list(frame.locals.values())
    out.append(frame.fn)
    out.append(getattr(frame, "delegate", None))
    return out


def native_frame_values(top, base: int) -> list:
    """The locals of the native Python frames from ``top`` (the caller of the
    split) down to the frame whose ``id`` is ``base`` (the one that started
    the interpretation, running below it): emulated builtins keep their
    running state there."""
    out = []
    f = top
    while f is not None and id(f) != base:
        out += list(f.f_locals.values())
        f = f.f_back
    return out
