"""Structural pattern matching (match statements)."""
from __future__ import annotations

from ..attrs import load_attr

_TPFLAGS_SEQUENCE = 1 << 5
_TPFLAGS_MAPPING = 1 << 6
_MATCH_SELF = (bool, bytearray, bytes, dict, float, frozenset, int, list, set, str, tuple)
_NO_MATCH = object()


def _attr(rt, subject, name):
    try:
        return load_attr(rt, subject, name)
    except AttributeError:
        return _NO_MATCH


def match_class(rt, subject, cls, nargs, kwnames, not_a_type_msg):
    """The attributes a class pattern extracts, or None when it does not match."""
    if not isinstance(cls, type):
        raise TypeError(not_a_type_msg)
    if not isinstance(subject, cls):
        return None
    attrs = []
    seen = set()
    if nargs:
        match_args = getattr(cls, "__match_args__", _NO_MATCH)
        match_self = match_args is _NO_MATCH and issubclass(cls, _MATCH_SELF)
        if match_args is _NO_MATCH:
            match_args = ()
        elif type(match_args) is not tuple:
            raise TypeError(f"{cls.__name__}.__match_args__ must be a tuple (got {type(match_args).__name__})")
        allowed = 1 if match_self else len(match_args)
        if nargs > allowed:
            s = "" if allowed == 1 else "s"
            raise TypeError(f"{cls.__name__}() accepts {allowed} positional sub-pattern{s} ({nargs} given)")
        if match_self:
            attrs.append(subject)
        names = () if match_self else match_args[:nargs]
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"__match_args__ elements must be strings (got {type(name).__name__})")
            if not _take_attr(rt, cls, subject, name, seen, attrs):
                return None
    for name in kwnames:
        if not _take_attr(rt, cls, subject, name, seen, attrs):
            return None
    return tuple(attrs)


def _take_attr(rt, cls, subject, name: str, seen: set, attrs: list) -> bool:
    """Append ``subject.name`` to ``attrs`` (noting the name in ``seen``), for a
    positional and a keyword sub-pattern alike; False when the attribute is
    missing. A name taken twice (``__match_args__`` repeating one, or a keyword
    repeating a positional) is CPython's TypeError."""
    if name in seen:
        raise TypeError(f"{cls.__name__}() got multiple sub-patterns for attribute '{name}'")
    seen.add(name)
    v = _attr(rt, subject, name)
    if v is _NO_MATCH:
        return False
    attrs.append(v)
    return True


def make_match_class(not_a_type_msg, push_success):
    """MATCH_CLASS; push_success: the 3.10 form that also pushes a bool."""

    # MATCH_CLASS (subject type names -- attrs_or_none [success])
    def op_match_class(f, ins):
        st = f.stack
        names = st.pop()
        cls = st.pop()
        r = match_class(f.rt, st[-1], cls, ins.arg, names, not_a_type_msg)
        if push_success:
            if r is not None:
                st[-1] = r
            st.append(r is not None)
        else:
            st[-1] = r

    return op_match_class


# MATCH_MAPPING (subject -- subject res)
def op_match_mapping(f, ins):
    f.stack.append(bool(type(f.stack[-1]).__flags__ & _TPFLAGS_MAPPING))


# MATCH_SEQUENCE (subject -- subject res)
def op_match_sequence(f, ins):
    f.stack.append(bool(type(f.stack[-1]).__flags__ & _TPFLAGS_SEQUENCE))


def match_keys(subject, keys):
    seen = set()
    values = []
    get = subject.get
    for k in keys:
        if k in seen:
            raise ValueError(f"mapping pattern checks duplicate key ({k!r})")
        seen.add(k)
        v = get(k, _NO_MATCH)
        if v is _NO_MATCH:
            return None
        values.append(v)
    return tuple(values)


# MATCH_KEYS (subject keys -- subject keys values_or_none)
def op_match_keys(f, ins):
    st = f.stack
    st.append(match_keys(st[-2], st[-1]))


# MATCH_KEYS (3.10: subject keys -- subject keys values_or_none success)
def op_match_keys_310(f, ins):
    st = f.stack
    r = match_keys(st[-2], st[-1])
    st.append(r)
    st.append(r is not None)


# GET_LEN (obj -- obj len)
def op_get_len(f, ins):
    f.stack.append(len(f.stack[-1]))
