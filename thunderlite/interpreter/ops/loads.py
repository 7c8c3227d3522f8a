"""Loads, stores and deletes: fast locals, cells, globals, names, attributes, subscripts."""
from __future__ import annotations

import sys
import types

from ..attrs import delete_attr, delete_subscr, load_attr, load_method, load_subscr, store_attr, store_subscr
from ..frame import NULL, UNBOUND

CellType = types.CellType
_NOTFOUND = object()


def make_load_fast(unbound_msg):
    # LOAD_FAST (-- value)
    def op_load_fast(f, ins):
        v = f.fast[ins.arg]
        if v is UNBOUND:
            raise UnboundLocalError(unbound_msg(ins.argval))
        f.stack.append(v)

    return op_load_fast


# LOAD_FAST (-- value), the 3.12+ form the compiler proved bound
def op_load_fast_nocheck(f, ins):
    f.stack.append(f.fast[ins.arg])


# Inlined comprehensions save the outer value (maybe unbound) and restore it with STORE_FAST.
# LOAD_FAST_AND_CLEAR (-- value)
def op_load_fast_and_clear(f, ins):
    fast = f.fast
    f.stack.append(fast[ins.arg])
    fast[ins.arg] = UNBOUND


# LOAD_FAST_LOAD_FAST (-- value1 value2)
def op_load_fast_load_fast(f, ins):
    fast = f.fast
    f.stack.append(fast[ins.arg >> 4])
    f.stack.append(fast[ins.arg & 15])


# STORE_FAST (value --)
def op_store_fast(f, ins):
    f.fast[ins.arg] = f.stack.pop()


# STORE_FAST_MAYBE_NULL (value --): value may be unbound
def op_store_fast_maybe_null(f, ins):
    f.fast[ins.arg] = f.stack.pop()


# STORE_FAST_STORE_FAST (value2 value1 --)
def op_store_fast_store_fast(f, ins):
    st = f.stack
    f.fast[ins.arg >> 4] = st.pop()
    f.fast[ins.arg & 15] = st.pop()


# STORE_FAST_LOAD_FAST (value -- value2)
def op_store_fast_load_fast(f, ins):
    st = f.stack
    f.fast[ins.arg >> 4] = st.pop()
    st.append(f.fast[ins.arg & 15])


def make_delete_fast(unbound_msg):
    # DELETE_FAST (--)
    def op_delete_fast(f, ins):
        if f.fast[ins.arg] is UNBOUND:
            raise UnboundLocalError(unbound_msg(ins.argval))
        f.fast[ins.arg] = UNBOUND

    return op_delete_fast


# MAKE_CELL (--)
def op_make_cell(f, ins):
    v = f.fast[ins.arg]
    f.fast[ins.arg] = CellType() if v is UNBOUND else CellType(v)


# COPY_FREE_VARS (--)
def op_copy_free_vars(f, ins):
    n = ins.arg
    f.fast[len(f.fast) - n:] = f.closure


# LOAD_CLOSURE (-- cell)
def op_load_closure(f, ins):
    f.stack.append(f.fast[ins.arg])


def cell_value(f, cell, name, index, msgs):
    try:
        v = cell.cell_contents
    except ValueError:
        v = UNBOUND
    if v is UNBOUND:
        if index < len(f.fast) - len(f.code.co_freevars):
            raise UnboundLocalError(msgs[0](name))
        raise NameError(msgs[1](name))
    h = f.rt.load_deref
    return v if h is None else h(cell, v)


def make_deref_ops(msgs, offset_of):
    """LOAD/STORE/DELETE_DEREF; offset_of(frame) maps the oparg to a localsplus index."""

    # LOAD_DEREF (-- value)
    def op_load_deref(f, ins):
        i = ins.arg + offset_of(f)
        f.stack.append(cell_value(f, f.fast[i], ins.argval, i, msgs))

    # STORE_DEREF (value --)
    def op_store_deref(f, ins):
        cell = f.fast[ins.arg + offset_of(f)]
        v = f.stack.pop()
        h = f.rt.store_deref
        if h is None or not h(cell, v):
            cell.cell_contents = v

    # DELETE_DEREF (--)
    def op_delete_deref(f, ins):
        i = ins.arg + offset_of(f)
        cell = f.fast[i]
        cell_value(f, cell, ins.argval, i, msgs)
        h = f.rt.delete_deref
        if h is None or not h(cell):
            del cell.cell_contents

    # LOAD_CLASSDEREF (-- value)
    def op_load_classderef(f, ins):
        v = f.locals.get(ins.argval, _NOTFOUND)
        if v is _NOTFOUND:
            i = ins.arg + offset_of(f)
            v = cell_value(f, f.fast[i], ins.argval, i, msgs)
        f.stack.append(v)

    return op_load_deref, op_store_deref, op_delete_deref, op_load_classderef


def make_load_from_dict_or_deref(msgs):
    # LOAD_FROM_DICT_OR_DEREF (mapping -- value)
    def op_load_from_dict_or_deref(f, ins):
        m = f.stack.pop()
        v = m.get(ins.argval, _NOTFOUND) if isinstance(m, dict) else _mapping_get(m, ins.argval)
        if v is _NOTFOUND:
            v = cell_value(f, f.fast[ins.arg], ins.argval, ins.arg, msgs)
        f.stack.append(v)

    return op_load_from_dict_or_deref


def _mapping_get(m, name):
    try:
        return m[name]
    except KeyError:
        return _NOTFOUND


def global_value(f, name):
    g = f.globals
    v = g.get(name, _NOTFOUND)
    if v is not _NOTFOUND:
        h = f.rt.load_global
        return v if h is None else h(g, name, v)
    v = f.builtins.get(name, _NOTFOUND)
    if v is _NOTFOUND:
        raise NameError(f"name '{name}' is not defined")
    return v


# LOAD_GLOBAL (3.11+: -- null? value); prepared argval is (name, push_null)
def op_load_global_null(f, ins):
    name, push_null = ins.argval
    v = global_value(f, name)
    if push_null:
        f.stack.append(NULL)
    f.stack.append(v)


# LOAD_GLOBAL (3.13: -- value null?)
def op_load_global_null_after(f, ins):
    name, push_null = ins.argval
    f.stack.append(global_value(f, name))
    if push_null:
        f.stack.append(NULL)


# LOAD_GLOBAL (3.10: -- value)
def op_load_global(f, ins):
    f.stack.append(global_value(f, ins.argval))


def prepare_load_global(ins, dec):
    ins.argval = (ins.argval, bool(ins.arg & 1))


# STORE_GLOBAL (value --)
def op_store_global(f, ins):
    v = f.stack.pop()
    h = f.rt.store_global
    if h is not None and h(f.globals, ins.argval, v):
        return
    f.globals[ins.argval] = v


def _delete_name(namespace, name: str) -> None:
    """``del name`` in a globals or locals mapping: a missing name is CPython's NameError."""
    if name not in namespace:
        raise NameError(f"name '{name}' is not defined")
    del namespace[name]


# DELETE_GLOBAL (--)
def op_delete_global(f, ins):
    _delete_name(f.globals, ins.argval)


# LOAD_NAME (-- value)
def op_load_name(f, ins):
    name = ins.argval
    loc = f.locals
    v = loc.get(name, _NOTFOUND) if type(loc) is dict else _mapping_get(loc, name)
    if v is _NOTFOUND:
        v = global_value(f, name)
    f.stack.append(v)


# LOAD_LOCALS (-- locals)
def op_load_locals(f, ins):
    f.stack.append(f.locals)


# LOAD_FROM_DICT_OR_GLOBALS (mapping -- value)
def op_load_from_dict_or_globals(f, ins):
    m = f.stack.pop()
    v = m.get(ins.argval, _NOTFOUND) if type(m) is dict else _mapping_get(m, ins.argval)
    f.stack.append(global_value(f, ins.argval) if v is _NOTFOUND else v)


# STORE_NAME (value --)
def op_store_name(f, ins):
    f.locals[ins.argval] = f.stack.pop()


# DELETE_NAME (--)
def op_delete_name(f, ins):
    _delete_name(f.locals, ins.argval)


# LOAD_ATTR (owner -- attr)
def op_load_attr(f, ins):
    st = f.stack
    st[-1] = load_attr(f.rt, st[-1], ins.argval)


# LOAD_METHOD (owner -- meth self | NULL attr)
def op_load_method(f, ins):
    st = f.stack
    m, obj = load_method(f.rt, st[-1], ins.argval)
    st[-1] = m
    st.append(obj)


# LOAD_ATTR (3.12: owner -- meth self | NULL attr, or -- attr); prepared argval (name, is_method)
def op_load_attr_312(f, ins):
    st = f.stack
    name, is_method = ins.argval
    if is_method:
        m, obj = load_method(f.rt, st[-1], name)
        st[-1] = m
        st.append(obj)
    else:
        st[-1] = load_attr(f.rt, st[-1], name)


# LOAD_ATTR (3.13: owner -- attr self_or_null, or -- attr)
def op_load_attr_313(f, ins):
    st = f.stack
    name, is_method = ins.argval
    if is_method:
        m, obj = load_method(f.rt, st[-1], name)
        if m is NULL:
            st[-1] = obj
            st.append(NULL)
        else:
            st[-1] = m
            st.append(obj)
    else:
        st[-1] = load_attr(f.rt, st[-1], name)


def prepare_load_attr(ins, dec):
    ins.argval = (ins.argval, bool(ins.arg & 1))


# STORE_ATTR (value owner --)
def op_store_attr(f, ins):
    st = f.stack
    owner = st.pop()
    store_attr(f.rt, owner, ins.argval, st.pop())


# DELETE_ATTR (owner --)
def op_delete_attr(f, ins):
    delete_attr(f.rt, f.stack.pop(), ins.argval)


# BINARY_SUBSCR (container key -- res)
def op_binary_subscr(f, ins):
    st = f.stack
    key = st.pop()
    st[-1] = load_subscr(f.rt, st[-1], key)


# STORE_SUBSCR (value container key --)
def op_store_subscr(f, ins):
    st = f.stack
    key = st.pop()
    container = st.pop()
    store_subscr(f.rt, container, key, st.pop())


# DELETE_SUBSCR (container key --)
def op_delete_subscr(f, ins):
    st = f.stack
    key = st.pop()
    delete_subscr(f.rt, st.pop(), key)


# BINARY_SLICE (container start stop -- res)
def op_binary_slice(f, ins):
    st = f.stack
    stop = st.pop()
    start = st.pop()
    st[-1] = load_subscr(f.rt, st[-1], slice(start, stop))


# STORE_SLICE (value container start stop --)
def op_store_slice(f, ins):
    st = f.stack
    stop = st.pop()
    start = st.pop()
    container = st.pop()
    store_subscr(f.rt, container, slice(start, stop), st.pop())


# IMPORT_NAME (level fromlist -- module)
def op_import_name(f, ins):
    st = f.stack
    fromlist = st.pop()
    level = st[-1]
    imp = f.builtins.get("__import__")
    if imp is None:
        raise ImportError("__import__ not found")
    st[-1] = imp(ins.argval, f.globals, f.locals, fromlist, level)


# IMPORT_FROM (module -- module attr)
def op_import_from(f, ins):
    mod = f.stack[-1]
    name = ins.argval
    try:
        v = getattr(mod, name)
    except AttributeError:
        v = _NOTFOUND
    if v is _NOTFOUND:
        v = _import_from_fallback(mod, name)
    f.stack.append(v)


def _import_from_fallback(mod, name):
    pkg = getattr(mod, "__name__", None)
    if isinstance(pkg, str):
        v = sys.modules.get(f"{pkg}.{name}")
        if v is not None:
            return v
    origin = getattr(mod, "__file__", None)
    where = f" ({origin})" if origin else " (unknown location)"
    raise ImportError(f"cannot import name '{name}' from '{pkg}'{where}", name=pkg, path=origin)


# SETUP_ANNOTATIONS (--)
def op_setup_annotations(f, ins):
    loc = f.locals
    if type(loc) is dict:
        if "__annotations__" not in loc:
            loc["__annotations__"] = {}
    elif _mapping_get(loc, "__annotations__") is _NOTFOUND:
        loc["__annotations__"] = {}


# IMPORT_STAR (module --)
def op_import_star(f, ins):
    import_star(f, f.stack.pop())


def import_star(f, module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    for n in names:
        f.locals[n] = getattr(module, n)
