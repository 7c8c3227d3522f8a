"""Calls, function creation and class-building opcodes."""
from __future__ import annotations

import types

from ..attrs import load_attr, load_method
from ..calls import call
from ..frame import NULL
from ..loop import call_py
from .build import function_str

FunctionType = types.FunctionType


def _kw_split(args, kwnames):
    k = len(kwnames)
    return args[:-k], dict(zip(kwnames, args[-k:], strict=True))


def pop_method_call(st: list, n: int) -> tuple[object, list]:
    """Pop ``method|NULL callable|self args[n]`` and return the callable and its
    arguments: 3.10's CALL_METHOD and 3.11/3.12's CALL share this layout."""
    base = len(st) - n - 2
    first = st[base]
    if first is NULL:
        fn = st[base + 1]
        args = st[base + 2:]
    else:
        fn = first
        args = st[base + 1:]
    del st[base:]
    return fn, args


def _pop_call_313(st: list, n: int) -> tuple[object, list]:
    """Pop 3.13's ``callable self_or_null args[n]`` (CALL and CALL_KW) and return
    the callable and its arguments (self first when not NULL)."""
    base = len(st) - n - 2
    fn = st[base]
    args = st[base + 2:] if st[base + 1] is NULL else st[base + 1:]
    del st[base:]
    return fn, args


# CALL (3.11/3.12: method|NULL callable|self args[n] -- res)
def op_call(f, ins):
    st = f.stack
    fn, args = pop_method_call(st, ins.arg)
    kwn = f.kw_names
    if kwn:
        f.kw_names = ()
        args, kwargs = _kw_split(args, kwn)
        st.append(call(f.rt, fn, args, kwargs))
    elif type(fn) is FunctionType and f.rt.lookaside is None:
        st.append(call_py(f.rt, fn, args, None))
    else:
        st.append(call(f.rt, fn, args))


# CALL (3.13: callable self_or_null args[n] -- res)
def op_call_313(f, ins):
    st = f.stack
    fn, args = _pop_call_313(st, ins.arg)
    if type(fn) is FunctionType and f.rt.lookaside is None:
        st.append(call_py(f.rt, fn, args, None))
    else:
        st.append(call(f.rt, fn, args))


# CALL_KW (3.13: callable self_or_null args[n] kwnames -- res)
def op_call_kw(f, ins):
    st = f.stack
    kwn = st.pop()
    fn, args = _pop_call_313(st, ins.arg)
    args, kwargs = _kw_split(args, kwn) if kwn else (args, None)
    st.append(call(f.rt, fn, args, kwargs))


# KW_NAMES (--)
def op_kw_names(f, ins):
    f.kw_names = ins.argval


def prepare_kw_names(ins, dec):
    ins.argval = dec.code.co_consts[ins.arg]


def _star_args(fn, args):
    if type(args) is tuple:
        return args
    if not hasattr(type(args), "__iter__") and not hasattr(type(args), "__getitem__"):
        raise TypeError(f"{function_str(fn)} argument after * must be an iterable, not {type(args).__name__}")
    return tuple(args)


def _star_kwargs(fn, kwargs):
    if kwargs is None or type(kwargs) is dict:
        return kwargs
    if not hasattr(type(kwargs), "keys"):
        raise TypeError(f"{function_str(fn)} argument after ** must be a mapping, not {type(kwargs).__name__}")
    return {k: kwargs[k] for k in kwargs.keys()}


def make_call_function_ex(layout):
    """CALL_FUNCTION_EX; layout 'null_fn' (3.11/3.12), 'fn_null' (3.13) or 'fn' (3.10)."""
    below = 1 if layout == "fn" else 2

    # CALL_FUNCTION_EX (null? func null? callargs kwargs? -- result)
    def op_call_function_ex(f, ins):
        st = f.stack
        kwargs = st.pop() if ins.arg & 1 else None
        args = st.pop()
        fn = st[-1] if layout == "null_fn" else st[-below]
        del st[-below:]
        args = _star_args(fn, args)
        kwargs = _star_kwargs(fn, kwargs)
        st.append(call(f.rt, fn, args, kwargs))

    return op_call_function_ex


# PRECALL (--): bound-method unpacking is an optimisation CALL does not need
def op_precall(f, ins):
    return None


op_precall.elidable = True


def _annotations(ann):
    if isinstance(ann, tuple):
        return dict(zip(ann[::2], ann[1::2], strict=True))
    return ann


def new_function(f, code, qualname, flags, pop):
    closure = pop() if flags & 8 else None
    annotations = pop() if flags & 4 else None
    kwdefaults = pop() if flags & 2 else None
    defaults = pop() if flags & 1 else None
    fn = FunctionType(code, f.globals, code.co_name, defaults, closure)
    fn.__qualname__ = qualname
    if kwdefaults is not None:
        fn.__kwdefaults__ = kwdefaults
    if annotations is not None:
        fn.__annotations__ = _annotations(annotations)
    return fn


# MAKE_FUNCTION (3.11/3.12: defaults? kwdefaults? annotations? closure? code -- func)
def op_make_function(f, ins):
    st = f.stack
    code = st.pop()
    st.append(new_function(f, code, code.co_qualname, ins.arg, st.pop))


# MAKE_FUNCTION (3.10: defaults? kwdefaults? annotations? closure? code qualname -- func)
def op_make_function_310(f, ins):
    st = f.stack
    qualname = st.pop()
    code = st.pop()
    st.append(new_function(f, code, qualname, ins.arg, st.pop))


# MAKE_FUNCTION (3.13: code -- func); empty cells until SET_FUNCTION_ATTRIBUTE sets the closure
def op_make_function_313(f, ins):
    st = f.stack
    code = st.pop()
    cells = tuple(types.CellType() for _ in code.co_freevars) or None
    fn = FunctionType(code, f.globals, code.co_name, None, cells)
    fn.__qualname__ = code.co_qualname
    st.append(fn)


# SET_FUNCTION_ATTRIBUTE (attr func -- func)
def op_set_function_attribute(f, ins):
    st = f.stack
    fn = st.pop()
    attr = st.pop()
    which = ins.arg
    if which == 1:
        fn.__defaults__ = attr
    elif which == 2:
        fn.__kwdefaults__ = attr
    elif which == 4:
        fn.__annotations__ = _annotations(attr)
    else:  # __closure__ is read-only: rebuild the function around the real cells
        new = FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, attr)
        new.__qualname__ = fn.__qualname__
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__annotations__ = fn.__annotations__
        fn = new
    st.append(fn)


# LOAD_BUILD_CLASS (-- func)
def op_load_build_class(f, ins):
    bc = f.builtins.get("__build_class__")
    if bc is None:
        raise NameError("__build_class__ not found")
    f.stack.append(bc)


def make_load_super_attr(null_after):
    """3.12+ LOAD_SUPER_ATTR; null_after: the 3.13 order (attr, self_or_null)."""

    # LOAD_SUPER_ATTR (global_super class self -- attr null? | meth self)
    def op_load_super_attr(f, ins):
        st = f.stack
        self_ = st.pop()
        cls = st.pop()
        gsuper = st.pop()
        name = ins.argval
        two_args = ins.arg & 2 or gsuper is super
        sup = call(f.rt, gsuper, (cls, self_) if two_args else ())
        if ins.arg & 1:
            m, obj = load_method(f.rt, sup, name)
            if null_after:
                st.extend((obj, NULL) if m is NULL else (m, obj))
            else:
                st.extend((m, obj))
        else:
            st.append(load_attr(f.rt, sup, name))

    return op_load_super_attr
