"""Building and unpacking containers, f-string formatting."""
from __future__ import annotations

from ..calls import HEAPTYPE
from ..operators import EXHAUSTED, convert, format_value, get_iter, next_or_exhausted


def iterate_all(rt, v):
    """list(v), with a Python __iter__/__next__ interpreted."""
    t = type(v)
    if t is list or t is tuple:
        return list(v)
    if not t.__flags__ & HEAPTYPE:
        return list(v)
    it = get_iter(rt, v)
    out = []
    while True:
        x = next_or_exhausted(rt, it)
        if x is EXHAUSTED:
            return out
        out.append(x)


def _hashed(f, values) -> None:
    """Keys of a dict or items of a set the program builds, shown to the
    ``native_use`` hook: hashing may read their identity (strings cannot)."""
    h = f.rt.native_use
    if h is not None:
        keys = tuple(v for v in values if type(v) is not str)
        if keys:
            h("hash", keys)


# BUILD_TUPLE (values[n] -- tup)
def op_build_tuple(f, ins):
    st = f.stack
    n = ins.arg
    if n:
        t = tuple(st[-n:])
        del st[-n:]
    else:
        t = ()
    st.append(t)


# BUILD_LIST (values[n] -- list)
def op_build_list(f, ins):
    st = f.stack
    n = ins.arg
    if n:
        v = st[-n:]
        del st[-n:]
    else:
        v = []
    st.append(v)


# BUILD_SET (values[n] -- set)
def op_build_set(f, ins):
    st = f.stack
    n = ins.arg
    v = set()
    if n:
        _hashed(f, st[-n:])
        for x in st[-n:]:
            v.add(x)
        del st[-n:]
    st.append(v)


# BUILD_MAP (keys_and_values[2n] -- map)
def op_build_map(f, ins):
    st = f.stack
    n = ins.arg
    d = {}
    if n:
        items = st[-2 * n:]
        del st[-2 * n:]
        _hashed(f, items[::2])
        for i in range(0, 2 * n, 2):
            d[items[i]] = items[i + 1]
    st.append(d)


# BUILD_CONST_KEY_MAP (values[n] keys -- map)
def op_build_const_key_map(f, ins):
    st = f.stack
    keys = st.pop()
    n = ins.arg
    vals = st[-n:] if n else []
    if n:
        del st[-n:]
    st.append(dict(zip(keys, vals, strict=True)))


# BUILD_STRING (pieces[n] -- str)
def op_build_string(f, ins):
    st = f.stack
    n = ins.arg
    s = "".join(st[-n:]) if n else ""
    if n:
        del st[-n:]
    st.append(s)


# BUILD_SLICE (start stop step? -- slice)
def op_build_slice(f, ins):
    st = f.stack
    if ins.arg == 3:
        step = st.pop()
        stop = st.pop()
        st[-1] = slice(st[-1], stop, step)
    else:
        stop = st.pop()
        st[-1] = slice(st[-1], stop)


# LIST_APPEND (list, unused[n-1] v -- list, unused[n-1])
def op_list_append(f, ins):
    st = f.stack
    v = st.pop()
    st[-ins.arg].append(v)


# SET_ADD (set, unused[n-1] v -- set, unused[n-1])
def op_set_add(f, ins):
    st = f.stack
    v = st.pop()
    _hashed(f, (v,))
    st[-ins.arg].add(v)


# MAP_ADD (dict, unused[n-1] key value -- dict, unused[n-1])
def op_map_add(f, ins):
    st = f.stack
    value = st.pop()
    key = st.pop()
    _hashed(f, (key,))
    st[-ins.arg][key] = value


# LIST_EXTEND (list, unused[n-1] iterable -- list, unused[n-1])
def op_list_extend(f, ins):
    st = f.stack
    v = st.pop()
    t = type(v)
    if t.__flags__ & HEAPTYPE:
        v = iterate_all(f.rt, v)
    elif not hasattr(t, "__iter__") and not hasattr(t, "__getitem__"):
        raise TypeError(f"Value after * must be an iterable, not {t.__name__}")
    st[-ins.arg].extend(v)


# SET_UPDATE (set, unused[n-1] iterable -- set, unused[n-1])
def op_set_update(f, ins):
    st = f.stack
    v = st.pop()
    if type(v).__flags__ & HEAPTYPE:
        v = iterate_all(f.rt, v)
    if f.rt.native_use is not None:
        v = list(v)
        _hashed(f, v)
    st[-ins.arg].update(v)


# DICT_UPDATE (dict, unused[n-1] update -- dict, unused[n-1])
def op_dict_update(f, ins):
    st = f.stack
    v = st.pop()
    if not hasattr(type(v), "keys"):
        raise TypeError(f"'{type(v).__name__}' object is not a mapping")
    st[-ins.arg].update(v)


def function_str(fn):
    """_PyObject_FunctionStr: how CPython names a callable in call errors."""
    qual = getattr(fn, "__qualname__", None)
    if not isinstance(qual, str):
        return str(fn)
    mod = getattr(fn, "__module__", None)
    if isinstance(mod, str) and mod != "builtins":
        return f"{mod}.{qual}()"
    return f"{qual}()"


def make_dict_merge(callable_depth):
    """DICT_MERGE; the callable sits callable_depth slots below the dict."""

    # DICT_MERGE (callable, unused, dict, unused[n-1] update -- callable, unused, dict, unused[n-1])
    def op_dict_merge(f, ins):
        st = f.stack
        v = st.pop()
        d = st[-ins.arg]
        fn = st[-ins.arg - callable_depth]
        if not hasattr(type(v), "keys"):
            raise TypeError(f"{function_str(fn)} argument after ** must be a mapping, not {type(v).__name__}")
        for k in v.keys():
            if k in d:
                if not isinstance(k, str):
                    raise TypeError(f"{function_str(fn)} keywords must be strings")
                raise TypeError(f"{function_str(fn)} got multiple values for keyword argument '{k}'")
            d[k] = v[k]

    return op_dict_merge


# LIST_TO_TUPLE (list -- tuple)
def op_list_to_tuple(f, ins):
    f.stack[-1] = tuple(f.stack[-1])


def _unpack_items(rt, seq, n):
    t = type(seq)
    if t is tuple or t is list:
        items = seq
    else:
        if not t.__flags__ & HEAPTYPE and not hasattr(t, "__iter__") and not hasattr(t, "__getitem__"):
            raise TypeError(f"cannot unpack non-iterable {t.__name__} object")
        items = iterate_all(rt, seq)
    return items


# UNPACK_SEQUENCE (seq -- values[n])
def op_unpack_sequence(f, ins):
    st = f.stack
    n = ins.arg
    items = _unpack_items(f.rt, st.pop(), n)
    if len(items) != n:
        if len(items) < n:
            raise ValueError(f"not enough values to unpack (expected {n}, got {len(items)})")
        raise ValueError(f"too many values to unpack (expected {n})")
    st.extend(items[::-1])


# UNPACK_EX (seq -- values[before] list values[after])
def op_unpack_ex(f, ins):
    st = f.stack
    before = ins.arg & 0xFF
    after = ins.arg >> 8
    items = list(_unpack_items(f.rt, st.pop(), before + after))
    if len(items) < before + after:
        raise ValueError(f"not enough values to unpack (expected at least {before + after}, got {len(items)})")
    mid = items[before:len(items) - after]
    out = items[:before] + [mid] + items[len(items) - after:]
    st.extend(out[::-1])


# FORMAT_VALUE (value fmt_spec? -- result)
def op_format_value(f, ins):
    st = f.stack
    flags = ins.arg
    spec = st.pop() if flags & 4 else ""
    v = st[-1]
    if flags & 3:
        v = convert(f.rt, v, flags & 3)
    st[-1] = format_value(f.rt, v, spec)


# CONVERT_VALUE (value -- result)
def op_convert_value(f, ins):
    f.stack[-1] = convert(f.rt, f.stack[-1], ins.arg)


# FORMAT_SIMPLE (value -- result)
def op_format_simple(f, ins):
    v = f.stack[-1]
    if type(v) is not str:
        f.stack[-1] = format_value(f.rt, v, "")


# FORMAT_WITH_SPEC (value fmt_spec -- result)
def op_format_with_spec(f, ins):
    st = f.stack
    spec = st.pop()
    st[-1] = format_value(f.rt, st[-1], spec)
