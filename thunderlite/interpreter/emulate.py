"""Builtins that need the interpreted frame (super, locals, ...); those consuming
iterables or taking callbacks (map, zip, sorted, ...) are in iteration.py."""
from __future__ import annotations

import builtins
import operator
import os
import sys
import types
import typing

from .attrs import delete_attr, load_attr, load_subscr, store_attr
from .calls import CALLABLE_EMULATORS, EMULATORS, call
from .frame import UNBOUND, thread_state
from .loop import run_code
from .operators import EXHAUSTED, format_value, get_iter, length, next_or_exhausted, to_repr, to_str, truth

_NOTGIVEN = object()


def emulates(*fns):
    def register(em):
        for fn in fns:
            if fn in EMULATORS:
                raise ValueError(f"{fn!r} is emulated twice")
            EMULATORS[fn] = em
        return em

    return register


def _frame():
    return thread_state().frames[-1]


def frame_locals(f):
    """locals() of an interpreted frame: its namespace, or a snapshot of its fast locals."""
    if f.locals is not None:
        return f.locals
    out = {}
    nfree_start = len(f.fast) - len(f.code.co_freevars)
    cells = set(f.code.co_cellvars)
    for i, name in enumerate(f.dec.names):
        v = f.fast[i] if i < len(f.fast) else UNBOUND
        if v is UNBOUND:
            continue
        if (i >= nfree_start or name in cells) and isinstance(v, types.CellType):
            try:
                v = v.cell_contents
            except ValueError:
                continue
        out[name] = v
    return out


def _emulate_no_argument(native, of_frame) -> None:
    """Emulate ``native`` by ``of_frame(frame)`` of the innermost interpreted
    frame when called without arguments (natively it would see the
    interpreter's own frame), natively otherwise."""

    @emulates(native)
    def em(rt, args, kwargs):
        if args or kwargs:
            return native(*args, **(kwargs or {}))
        return of_frame(_frame())


for _native, _of_frame in ((builtins.locals, frame_locals), (builtins.globals, lambda f: f.globals),
                           (builtins.dir, lambda f: sorted(frame_locals(f)))):
    _emulate_no_argument(_native, _of_frame)


@emulates(builtins.vars)
def em_vars(rt, args, kwargs):
    # ``vars(obj)`` is ``obj.__dict__`` read through the attribute hooks, so what
    # the program finds in it keeps obj's provenance
    if kwargs or len(args) > 1:
        return vars(*args, **(kwargs or {}))
    if not args:
        return frame_locals(_frame())
    try:
        return load_attr(rt, args[0], "__dict__")
    except AttributeError:
        raise TypeError("vars() argument must have __dict__ attribute") from None


@emulates(builtins.super)
def em_super(rt, args, kwargs):
    if args or kwargs:
        return super(*args, **(kwargs or {}))
    f = _frame()
    code = f.code
    if code.co_argcount == 0 and not code.co_flags & 0x04:
        raise RuntimeError("super(): no arguments")
    if "__class__" not in code.co_freevars:
        raise RuntimeError("super(): __class__ cell not found")
    first = _first_argument(f)
    cell = f.fast[len(f.fast) - len(code.co_freevars) + code.co_freevars.index("__class__")]
    try:
        cls = cell.cell_contents
    except ValueError:
        cls = None
    if cls is None:
        raise RuntimeError("super(): empty __class__ cell")
    return super(cls, first)


def _first_argument(f):
    """The first argument of f, looking through its cell when it is one (3.10 keeps both slots)."""
    name = f.code.co_varnames[0]
    value = UNBOUND
    for i, n in enumerate(f.dec.names):
        if n == name and f.fast[i] is not UNBOUND:
            value = f.fast[i]
    if name in f.code.co_cellvars and isinstance(value, types.CellType):
        value = value.cell_contents
    if value is UNBOUND:
        raise RuntimeError("super(): arg[0] deleted")
    return value


@emulates(builtins.getattr)
def em_getattr(rt, args, kwargs):
    if kwargs or not 2 <= len(args) <= 3 or type(args[1]) is not str:
        return getattr(*args, **(kwargs or {}))
    if len(args) == 2:
        return load_attr(rt, args[0], args[1])
    try:
        return load_attr(rt, args[0], args[1])
    except AttributeError:
        return args[2]


def _getter(rt, fn, args, kwargs):
    """An ``operator.attrgetter``/``itemgetter`` call: each attribute or item read
    through the interpreter's protocols (natively, C would read them unseen)."""
    if kwargs or len(args) != 1:
        return fn(*args, **(kwargs or {}))
    keys, obj = fn.__reduce__()[1], args[0]
    if type(fn) is operator.itemgetter:
        values = [load_subscr(rt, obj, k) for k in keys]
    else:
        values = []
        for dotted in keys:
            v = obj
            for name in dotted.split("."):
                v = load_attr(rt, v, name)
            values.append(v)
    return values[0] if len(keys) == 1 else tuple(values)


CALLABLE_EMULATORS[operator.attrgetter] = CALLABLE_EMULATORS[operator.itemgetter] = _getter


@emulates(builtins.hasattr)
def em_hasattr(rt, args, kwargs):
    if kwargs or len(args) != 2 or type(args[1]) is not str:
        return hasattr(*args, **(kwargs or {}))
    try:
        load_attr(rt, args[0], args[1])
    except AttributeError:
        return False
    return True


@emulates(builtins.setattr)
def em_setattr(rt, args, kwargs):
    if kwargs or len(args) != 3 or type(args[1]) is not str:
        return setattr(*args, **(kwargs or {}))
    store_attr(rt, args[0], args[1], args[2])


@emulates(builtins.delattr)
def em_delattr(rt, args, kwargs):
    if kwargs or len(args) != 2 or type(args[1]) is not str:
        return delattr(*args, **(kwargs or {}))
    delete_attr(rt, args[0], args[1])


@emulates(sys.exc_info)
def em_exc_info(rt, args, kwargs):
    e = thread_state().handled
    return (None, None, None) if e is None else (type(e), e, e.__traceback__)


if hasattr(sys, "exception"):

    @emulates(sys.exception)
    def em_exception(rt, args, kwargs):
        return thread_state().handled


def _namespaces(args, kwargs, name):
    if kwargs:
        raise TypeError(f"{name}() takes no keyword arguments")
    f = _frame()
    src = args[0]
    g = args[1] if len(args) > 1 and args[1] is not None else None
    loc = args[2] if len(args) > 2 else None
    if g is None:
        g = f.globals
        if loc is None:
            loc = frame_locals(f)
    elif loc is None:
        loc = g
    return src, g, loc


@emulates(builtins.exec)
def em_exec(rt, args, kwargs):
    src, g, loc = _namespaces(args, kwargs, "exec")
    code = compile(src, "<string>", "exec") if isinstance(src, (str, bytes)) else src
    if not isinstance(code, types.CodeType) or code.co_freevars:
        return exec(src, g, loc)
    g.setdefault("__builtins__", builtins)
    run_code(rt, code, g, loc)


@emulates(builtins.eval)
def em_eval(rt, args, kwargs):
    src, g, loc = _namespaces(args, kwargs, "eval")
    if isinstance(src, str):
        src = src.lstrip(" \t")
    code = compile(src, "<string>", "eval") if isinstance(src, (str, bytes)) else src
    if not isinstance(code, types.CodeType) or code.co_freevars:
        return eval(src, g, loc)
    g.setdefault("__builtins__", builtins)
    return run_code(rt, code, g, loc)


@emulates(builtins.__build_class__)
def em_build_class(rt, args, kwargs):
    """__build_class__ with the class body and a Python metaclass interpreted."""
    if len(args) < 2:
        raise TypeError("__build_class__: not enough arguments")
    func, name, *bases = args
    if not isinstance(func, types.FunctionType):
        raise TypeError("__build_class__: func must be a function")
    if not isinstance(name, str):
        raise TypeError("__build_class__: name is not a string")
    kwds = dict(kwargs or {})
    orig_bases = tuple(bases)
    bases = types.resolve_bases(orig_bases)
    meta, ns, kwds = types.prepare_class(name, bases, kwds)
    if bases is not orig_bases and bases != orig_bases:
        ns["__orig_bases__"] = orig_bases
    cell = run_code(rt, func.__code__, func.__globals__, ns, func.__closure__, func.__builtins__)
    cls = call(rt, meta, (name, bases, ns), kwds)
    if isinstance(cell, types.CellType) and isinstance(cls, type):
        try:
            cell_cls = cell.cell_contents
        except ValueError:
            cell_cls = None
        if cell_cls is not cls:
            raise TypeError(f"__class__ set to {cell_cls!r} defining {name!r} as {cls!r}")
    return cls


def _emulate_one_argument(native, interpreted) -> None:
    """Emulate ``native`` by ``interpreted(rt, x)`` when called with one
    argument ``x`` (whose Python dunders then run interpreted), natively otherwise."""

    @emulates(native)
    def em(rt, args, kwargs):
        if len(args) == 1 and not kwargs:
            return interpreted(rt, args[0])
        return native(*args, **(kwargs or {}))


# One-argument conversions, iteration and len run their Python dunders interpreted.
for _native, _interpreted in ((str, to_str), (builtins.repr, to_repr), (bool, truth), (builtins.iter, get_iter),
                              (builtins.len, length)):
    _emulate_one_argument(_native, _interpreted)


@emulates(builtins.format)
def em_format(rt, args, kwargs):
    if 1 <= len(args) <= 2 and not kwargs and (len(args) == 1 or type(args[1]) is str):
        return format_value(rt, args[0], args[1] if len(args) == 2 else "")
    return format(*args, **(kwargs or {}))


@emulates(builtins.next)
def em_next(rt, args, kwargs):
    if kwargs or not 1 <= len(args) <= 2:
        return next(*args, **(kwargs or {}))
    it = args[0]
    if not hasattr(type(it), "__next__"):
        return next(*args)
    v = next_or_exhausted(rt, it, keep_stop=len(args) == 1)
    return args[1] if v is EXHAUSTED else v


# sys._getframe: interpreted frames have no real frame objects, so introspecting code
# (namedtuple's __module__, logging's caller, warnings' stacklevel, inspect.currentframe)
# gets a FrameProxy for them and real frames beyond the outermost interpreted one.

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class FrameProxy:
    """What sys._getframe() returns for an interpreted frame (the common f_* attributes)."""

    __slots__ = ("_frames", "_index")
    f_trace = None

    def __init__(self, frames, index):
        self._frames = frames
        self._index = index

    @property
    def _f(self):
        return self._frames[self._index]

    f_code = property(lambda self: self._f.code)
    f_globals = property(lambda self: self._f.globals)
    f_builtins = property(lambda self: self._f.builtins)
    f_locals = property(lambda self: frame_locals(self._f))
    f_lineno = property(lambda self: self._f.lineno)
    f_lasti = property(lambda self: self._f.dec.instrs[max(self._f.pc - 1, 0)].offset)

    @property
    def f_back(self):
        if self._index > 0:
            return FrameProxy(self._frames, self._index - 1)
        return _real_frame_outside()

    def clear(self):
        pass

    def __repr__(self):
        return f"<interpreted frame of {self.f_code.co_name} at line {self.f_lineno}>"


def _real_frame_outside():
    """The innermost real frame that is not the interpreter's own machinery."""
    real = sys._getframe(1)
    while real is not None and real.f_code.co_filename.startswith(_PACKAGE_DIR):
        real = real.f_back
    return real


def frame_at(depth):
    frames = list(thread_state().frames)
    if depth < len(frames):
        return FrameProxy(frames, len(frames) - 1 - depth)
    real = _real_frame_outside()
    for _ in range(depth - len(frames)):
        if real is None:
            break
        real = real.f_back
    if real is None:
        raise ValueError("call stack is not deep enough")
    return real


@emulates(sys._getframe)
def em_getframe(rt, args, kwargs):
    if kwargs or len(args) > 1:
        return sys._getframe(*args, **(kwargs or {}))
    return frame_at(args[0] if args else 0)


if hasattr(sys, "_getframemodulename"):

    @emulates(sys._getframemodulename)
    def em_getframemodulename(rt, args, kwargs):
        depth = args[0] if args else (kwargs or {}).get("depth", 0)
        frame = frame_at(depth)
        if isinstance(frame, FrameProxy):
            fn = frame._f.fn
            return getattr(fn, "__module__", None) if fn is not None else frame.f_globals.get("__name__")
        return frame.f_globals.get("__name__")


def _with_caller_module(cls):
    """cls(...) natively, then __module__ from the interpreted caller (C typing objects
    read the real caller frame, which is the interpreter's)."""

    def em(rt, args, kwargs):
        obj = cls(*args, **(kwargs or {}))
        frames = thread_state().frames
        if frames:
            try:
                obj.__module__ = frames[-1].globals.get("__name__", obj.__module__)
            except (AttributeError, TypeError):
                pass
        return obj

    return em


for _name in ("TypeVar", "ParamSpec", "TypeVarTuple"):
    _cls = getattr(typing, _name, None)
    if _cls is None or type(vars(_cls).get("__init__")) is types.FunctionType:
        continue  # pure-Python typing (3.10/3.11) is interpreted and reads our emulated frames
    emulates(_cls)(_with_caller_module(_cls))
