"""The call protocol: what gets interpreted, what runs natively, and lookasides."""
from __future__ import annotations

import functools
import types

from .loop import call_py

FunctionType = types.FunctionType
MethodType = types.MethodType
BuiltinFunctionType = types.BuiltinFunctionType
HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: only heap types can hold Python dunders

# builtin function or type -> emulator(rt, args, kwargs): builtins that introspect
# frames or take Python callbacks (see emulate.py).
EMULATORS: dict = {}
# type of a native callable object -> emulator(rt, fn, args, kwargs): callables that
# read their argument from C (``operator.attrgetter``), emulated so the hooks see it
CALLABLE_EMULATORS: dict = {}


def lookup(tp, name):
    """The raw attribute ``name`` of type tp along its MRO (no descriptor binding), or None."""
    for klass in tp.__mro__:
        d = klass.__dict__
        if name in d:
            return d[name]
    return None


def py_dunder(tp, name):
    """The Python function implementing tp.name, or None when it is native or missing."""
    if not tp.__flags__ & HEAPTYPE:
        return None
    m = lookup(tp, name)
    return m if type(m) is FunctionType else None


def call(rt, fn, args, kwargs=None):
    """Call fn(*args, **kwargs) on behalf of user code: lookaside, then interpret or run."""
    la = rt.lookaside
    if la is not None:
        alt = la(fn)
        if alt is not None:
            return alt(*args, **kwargs) if kwargs else alt(*args)
    if type(fn) is FunctionType:  # the common case, one Python frame shallower
        return call_py(rt, fn, args, kwargs)
    return call_no_lookaside(rt, fn, args, kwargs)


def call_no_lookaside(rt, fn, args, kwargs):
    t = type(fn)
    if t is FunctionType:
        return call_py(rt, fn, args, kwargs)
    if t is MethodType:
        inner = fn.__func__
        if type(inner) is FunctionType:
            # it may have a lookaside of its own (``super().__setattr__`` is a method
            # bound to ``nn.Module.__setattr__``, whose lookaside records the write)
            return call(rt, inner, (fn.__self__, *args), kwargs)
        return call_no_lookaside(rt, inner, (fn.__self__, *args), kwargs)
    if t is BuiltinFunctionType or t is type:
        em = EMULATORS.get(fn)
        if em is not None:
            return em(rt, args, kwargs)
        if kwargs and kwargs.get("key") is not None:
            kwargs = dict(kwargs, key=wrap_callback(rt, kwargs["key"]))
    if t is functools.partial:
        # its parts are read as attributes, so the hooks see them (a tensor the
        # partial binds keeps its path: ``m.act.keywords['min']``)
        h = rt.load_attr
        func, pargs, pkw = fn.func, fn.args, fn.keywords
        if h is not None:
            func, pargs, pkw = h(fn, "func", func), h(fn, "args", pargs), h(fn, "keywords", pkw)
        kw = {**pkw, **kwargs} if kwargs else pkw
        return call(rt, func, (*pargs, *args), kw)
    if isinstance(fn, type):
        return instantiate(rt, fn, args, kwargs)
    em = CALLABLE_EMULATORS.get(t)
    if em is not None:
        return em(rt, fn, args, kwargs)
    m = py_dunder(t, "__call__")
    if m is not None:
        return call(rt, m, (fn, *args), kwargs)
    return run_native(rt, fn, args, kwargs)


def run_native(rt, fn, args, kwargs=None):
    """``fn(*args, **kwargs)`` run natively, its arguments shown to the
    ``native_use`` hook first (native code may read their identity)."""
    h = rt.native_use
    if h is not None:
        h(fn, (*args, *kwargs.values()) if kwargs else args)
    return fn(*args, **kwargs) if kwargs else fn(*args)


def wrap_callback(rt, cb):
    """A native callable that calls cb as the program's own call would: a Python
    callback interpreted (hooks fire inside), any other callable through the
    lookaside (``map(torch.Tensor.sum, xs)``, ``map(module, xs)``)."""
    if cb is None or not callable(cb):
        return cb

    def interpreted_callback(*args, **kwargs):
        return call(rt, cb, args, kwargs)

    return interpreted_callback


def _unwrap_static(m):
    return m.__func__ if type(m) is staticmethod else m


def instantiate(rt, cls, args, kwargs):
    """type.__call__ emulated so that Python __new__/__init__ are interpreted."""
    meta = type(cls)
    mcall = lookup(meta, "__call__")
    if type(mcall) is FunctionType:
        return call(rt, mcall, (cls, *args), kwargs)
    if mcall is not type.__call__ or not cls.__flags__ & HEAPTYPE:
        return run_native(rt, cls, args, kwargs)
    new = _unwrap_static(lookup(cls, "__new__"))
    init = lookup(cls, "__init__")
    py_new = type(new) is FunctionType
    if not py_new and type(init) is not FunctionType:
        return run_native(rt, cls, args, kwargs)
    if py_new:
        obj = call(rt, new, (cls, *args), kwargs)
    elif new is object.__new__:
        obj = object.__new__(cls)
    else:
        obj = run_native(rt, new, (cls, *args), kwargs)
    if not isinstance(obj, cls):
        return obj
    init = lookup(type(obj), "__init__")
    if type(init) is FunctionType:
        r = call(rt, init, (obj, *args), kwargs)
        if r is not None:
            raise TypeError(f"__init__() should return None, not '{type(r).__name__}'")
    else:
        run_native(rt, init, (obj, *args), kwargs)
    return obj
