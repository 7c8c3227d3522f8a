"""Attribute and subscript protocols with hooks; Python descriptors are interpreted."""
from __future__ import annotations

import collections
import weakref

from .calls import HEAPTYPE, FunctionType, call, lookup, py_dunder
from .frame import NULL
from .hooks import MISSING

_object_getattribute = object.__getattribute__
_DEFAULTDICT_MISSING = collections.defaultdict.__missing__
_NATIVE = object()      # _py_item's answer: no Python-level item method applies


def _py_get(descr):
    """The Python __get__ of descriptor descr (property fget included), or None."""
    dt = type(descr)
    if dt is property:
        return descr.fget if type(descr.fget) is FunctionType else None
    if dt is FunctionType or not dt.__flags__ & HEAPTYPE:
        return None
    g = lookup(dt, "__get__")
    return g if type(g) is FunctionType else None


def _is_data(descr):
    dt = type(descr)
    return dt is property or lookup(dt, "__set__") is not None or lookup(dt, "__delete__") is not None


def _scan(tp, name):
    """(tp.__getattribute__, raw tp.name or None) in one walk of the MRO."""
    descr = None
    for klass in tp.__mro__:
        d = klass.__dict__
        if descr is None and name in d:
            descr = d[name]
        if "__getattribute__" in d:
            ga = d["__getattribute__"]
            if descr is None:
                for rest in tp.__mro__[tp.__mro__.index(klass) + 1:]:
                    rd = rest.__dict__
                    if name in rd:
                        descr = rd[name]
                        break
            return ga, descr
    return None, descr


def _interpreted_descriptor(rt, obj, tp, name, descr):
    """(True, value) when obj.name is computed by a Python descriptor, else (False, None)."""
    if isinstance(obj, type):
        for klass in obj.__mro__:
            d = klass.__dict__
            if name in d:
                descr = d[name]
                g = _py_get(descr)
                if g is None or type(descr) is property:
                    return False, None
                return True, call(rt, g, (descr, None, obj))
        return False, None
    if descr is None:
        return False, None
    g = _py_get(descr)
    if g is None:
        return False, None
    if not _is_data(descr):
        d = getattr(obj, "__dict__", None)
        if d is not None and name in d:
            return False, None
    if type(descr) is property:
        return True, call(rt, g, (obj,))
    return True, call(rt, g, (descr, obj, tp))


# type -> names whose lookup on instances involves no Python code at all (no Python
# __getattribute__/__getattr__/descriptor). Only this verdict is cached: if a class later
# gains Python attribute code, native getattr still runs it correctly (hooks just do not
# fire inside it), so the cache can never make a lookup wrong. Keyed by id(type); an
# entry is dropped when its type dies.
_PLAIN: dict = {}


def _mark_plain(tp, name):
    names = _PLAIN.get(id(tp))
    if names is None:
        names = _PLAIN[id(tp)] = set()
        weakref.finalize(tp, _PLAIN.pop, id(tp), None)
    names.add(name)


def load_attr(rt, obj, name):
    """obj.name as CPython computes it; hooks see natively resolved values."""
    tp = type(obj)
    if not tp.__flags__ & HEAPTYPE and tp is not type:
        return _load_native(rt, obj, name)
    plain = _PLAIN.get(id(tp))
    if plain is not None and name in plain:
        return _load_native(rt, obj, name)
    return _load_attr_slow(rt, obj, tp, name)


def _load_native(rt, obj, name):
    try:
        value = getattr(obj, name)
    except AttributeError as e:
        return _missing(rt, obj, name, e)
    h = rt.load_attr
    return value if h is None else h(obj, name, value)


def _load_attr_slow(rt, obj, tp, name):
    ga, descr = _scan(tp, name)
    if type(ga) is FunctionType:
        try:
            return call(rt, ga, (obj, name))
        except AttributeError as e:
            err = e
        gattr = py_dunder(tp, "__getattr__")
        if gattr is None:
            raise err
        del err     # its traceback holds this frame: kept in a local, the two would form a cycle
        return call(rt, gattr, (obj, name))
    gattr = lookup(tp, "__getattr__")
    err = None
    try:
        done, value = _interpreted_descriptor(rt, obj, tp, name, descr)
    except AttributeError as e:  # CPython then tries __getattr__
        if gattr is None:
            raise
        done, err = False, e
    if done:
        return value
    if err is None:
        if gattr is None and not isinstance(obj, type) and (descr is None or _py_get(descr) is None):
            _mark_plain(tp, name)
        try:
            value = ga(obj, name)
        except AttributeError as e:
            err = e
        else:
            h = rt.load_attr
            return value if h is None else h(obj, name, value)
    if gattr is None:
        return _missing(rt, obj, name, err)
    del err     # (as above)
    return call(rt, gattr, (obj, name))


def _missing(rt, obj, name, err):
    h = rt.load_attr
    if h is None:
        raise err
    value = h(obj, name, MISSING)
    if value is MISSING:
        raise err
    return value


def load_method(rt, obj, name):
    """(function, self) for a plain Python method found on the class, else (NULL, obj.name)."""
    tp = type(obj)
    if tp.__flags__ & HEAPTYPE:
        m = lookup(tp, name)
        if type(m) is FunctionType and lookup(tp, "__getattribute__") is _object_getattribute:
            d = getattr(obj, "__dict__", None)
            if d is None or name not in d:
                return m, obj
    return NULL, load_attr(rt, obj, name)


def _py_set(descr, which):
    dt = type(descr)
    if dt is property:
        fn = descr.fset if which == "__set__" else descr.fdel
        return fn if type(fn) is FunctionType else None, True
    if not dt.__flags__ & HEAPTYPE:
        return None, False
    g = lookup(dt, which)
    return (g if type(g) is FunctionType else None), False


def _py_write_attr(rt, obj, name, dunder: str, which: str, extra: tuple) -> bool:
    """Run a Python-level attribute write or delete on an instance of a heap type:
    its type's Python ``__setattr__``/``__delattr__`` (``dunder``), else a Python
    data descriptor's ``__set__``/``__delete__`` (``which``) or a property's
    fset/fdel, interpreted; ``extra`` is ``(value,)`` for a write, ``()`` for a
    delete. False when none applies and the hook and native path run."""
    tp = type(obj)
    hook = lookup(tp, dunder)
    if type(hook) is FunctionType:
        call(rt, hook, (obj, name, *extra))
        return True
    if not isinstance(obj, type):
        descr = lookup(tp, name)
        if descr is not None:
            fn, is_prop = _py_set(descr, which)
            if fn is not None:
                call(rt, fn, (obj, *extra) if is_prop else (descr, obj, *extra))
                return True
    return False


def store_attr(rt, obj, name, value):
    if type(obj).__flags__ & HEAPTYPE and _py_write_attr(rt, obj, name, "__setattr__", "__set__", (value,)):
        return
    h = rt.store_attr
    if h is not None and h(obj, name, value):
        return
    setattr(obj, name, value)


def delete_attr(rt, obj, name):
    if type(obj).__flags__ & HEAPTYPE and _py_write_attr(rt, obj, name, "__delattr__", "__delete__", ()):
        return
    h = rt.delete_attr
    if h is not None and h(obj, name):
        return
    delattr(obj, name)


def _py_item(rt, container, dunder: str, args: tuple):
    """For a container of a heap type: its type's Python ``dunder``
    (``__getitem__``/``__setitem__``/``__delitem__``), interpreted, or the
    lookaside's replacement of a native one, called on ``args``; ``_NATIVE``
    when neither applies and the hook and native path run."""
    m = lookup(type(container), dunder)
    if type(m) is FunctionType:
        return call(rt, m, args)
    if m is not None and rt.lookaside is not None:
        alt = rt.lookaside(m)
        if alt is not None:
            return alt(*args)
    return _NATIVE


def load_subscr(rt, container, key):
    if rt.subscr_key is not None:
        key = rt.subscr_key(container, key)
    if type(container).__flags__ & HEAPTYPE:
        value = _py_item(rt, container, "__getitem__", (container, key))
        if value is not _NATIVE:
            return value
    h = rt.load_subscr
    if isinstance(container, dict) and key not in container:
        if h is not None:   # an item this call stored where the hook keeps it (an overlay) first
            value = h(container, key, MISSING)
            if value is not MISSING:
                return value
        if type(container) is not dict:
            value = _missing_item(rt, container, key)
            if value is not _NATIVE:
                return value
    value = container[key]
    return value if h is None else h(container, key, value)


def _missing_item(rt, container, key):
    """A dict subclass's ``__missing__`` for an absent key, which native
    subscription would run from C: a Python one interpreted; a ``defaultdict``'s
    factory called as the program's code and its result stored as the program
    stores (so it is the program's value, not a value made unseen)."""
    m = lookup(type(container), "__missing__")
    if type(m) is FunctionType:
        return call(rt, m, (container, key))
    if m is not _DEFAULTDICT_MISSING:
        return _NATIVE
    factory = container.default_factory
    if factory is None:
        raise KeyError(key)
    value = call(rt, factory, ())
    store_subscr(rt, container, key, value)
    return value


def store_subscr(rt, container, key, value):
    if rt.subscr_key is not None:
        key = rt.subscr_key(container, key)
    if type(container).__flags__ & HEAPTYPE and \
            _py_item(rt, container, "__setitem__", (container, key, value)) is not _NATIVE:
        return
    h = rt.store_subscr
    if h is not None and h(container, key, value):
        return
    container[key] = value


def delete_subscr(rt, container, key):
    if rt.subscr_key is not None:
        key = rt.subscr_key(container, key)
    if type(container).__flags__ & HEAPTYPE and _py_item(rt, container, "__delitem__", (container, key)) is not _NATIVE:
        return
    h = rt.delete_subscr
    if h is not None and h(container, key):
        return
    del container[key]
