"""The hook protocol the jit relies on."""
from __future__ import annotations

import math
import subprocess
import sys
import types

import pytest

from thunderlite.interpreter import (
    MISSING,
    InterpreterError,
    InterpreterHooks,
    current_source_location,
    interpret,
)

GLOBAL_VALUE = 10


def helper(x):
    return x + 1


class Vec:
    def __init__(self, v):
        self.v = v

    def __mul__(self, other):
        return Vec(self.v * other.v)

    def scaled(self, k):
        return self.v * k

    @property
    def double(self):
        return self.v * 2


class Recorder(InterpreterHooks):
    def __init__(self):
        self.events = []

    def load_global(self, globals_dict, name, value):
        self.events.append(("load_global", name, value))
        return value

    def load_attr(self, obj, name, value):
        self.events.append(("load_attr", name, value))
        return value

    def load_subscr(self, container, key, value):
        self.events.append(("load_subscr", key, value))
        return value

    def load_deref(self, cell, value):
        self.events.append(("load_deref", value))
        return value


def test_lookaside_replaces_python_call():
    calls = []

    class H(InterpreterHooks):
        def lookaside(self, fn):
            calls.append(fn)
            if fn is helper:
                return lambda x: x * 100
            return None

    def f(a):
        return helper(a) + len([1, 2])

    assert interpret(f, H())(3) == 302
    assert helper in calls and len in calls


def test_lookaside_sees_builtin_and_bound_methods():
    seen = []

    class H(InterpreterHooks):
        def lookaside(self, fn):
            seen.append(fn)
            if getattr(fn, "__name__", None) == "append":
                return lambda v: None  # swallow appends
            return None

    def f():
        xs = []
        xs.append(1)
        return xs, math.floor(2.5)

    assert interpret(f, H())() == ([], 2)
    assert math.floor in seen


def test_lookaside_on_dunder_of_binary_op():
    seen = []

    class H(InterpreterHooks):
        def lookaside(self, fn):
            seen.append(fn)
            if fn is Vec.__mul__:
                return lambda a, b: "replaced"
            return None

    def f(a, b):
        return a * b

    assert interpret(f, H())(Vec(2), Vec(3)) == "replaced"
    assert Vec.__mul__ in seen


def test_lookaside_python_method_gets_function_and_self():
    seen = []

    class H(InterpreterHooks):
        def lookaside(self, fn):
            seen.append(fn)
            if fn is Vec.scaled:
                return lambda self, k: ("la", self.v, k)
            return None

    def f(v):
        return v.scaled(3)

    assert interpret(f, H())(Vec(4)) == ("la", 4, 3)


def test_load_global_sees_and_overrides():
    class H(Recorder):
        def load_global(self, globals_dict, name, value):
            super().load_global(globals_dict, name, value)
            return 99 if name == "GLOBAL_VALUE" else value

    def f():
        return GLOBAL_VALUE + 1, len("ab")

    h = H()
    assert interpret(f, h)() == (100, 2)
    assert ("load_global", "GLOBAL_VALUE", 10) in h.events
    assert not any(e[1] == "len" for e in h.events if e[0] == "load_global")  # builtins are not globals


def test_store_global_handled():
    stored = {}

    class H(InterpreterHooks):
        def store_global(self, globals_dict, name, value):
            stored[name] = value
            return name == "NEW_GLOBAL_XYZ"

    def f():
        global NEW_GLOBAL_XYZ
        NEW_GLOBAL_XYZ = 5

    interpret(f, H())()
    assert stored == {"NEW_GLOBAL_XYZ": 5}
    assert "NEW_GLOBAL_XYZ" not in globals()


def test_load_attr_native_values_and_override():
    class H(Recorder):
        def load_attr(self, obj, name, value):
            super().load_attr(obj, name, value)
            return 7 if name == "v" else value

    def f(o):
        return o.v, math.pi > 3, o.double

    h = H()
    assert interpret(f, h)(Vec(3)) == (7, True, 14)
    names = [e[1] for e in h.events if e[0] == "load_attr"]
    assert "v" in names and "pi" in names
    assert "double" not in names  # computed by an interpreted property


def test_load_attr_missing():
    class H(InterpreterHooks):
        def load_attr(self, obj, name, value):
            if value is MISSING and name == "ghost":
                return "boo"
            return value

    def f(o):
        return o.ghost

    assert interpret(f, H())(Vec(1)) == "boo"

    def g(o):
        return o.nothing_here

    with pytest.raises(AttributeError, match="nothing_here"):
        interpret(g, H())(Vec(1))


def test_getattr_builtin_goes_through_hooks():
    h = Recorder()

    def f(o):
        return o.v, getattr(o, "zzz", "dflt"), hasattr(o, "v")

    assert interpret(f, h)(Vec(5)) == (5, "dflt", True)
    assert ("load_attr", "v", 5) in h.events


def test_store_and_delete_attr():
    events = []

    class H(InterpreterHooks):
        def store_attr(self, obj, name, value):
            events.append(("store", name, value))
            return name == "skip"

        def delete_attr(self, obj, name):
            events.append(("del", name))
            return False

    def f(o):
        o.a = 1
        o.skip = 2
        o.b = 3
        del o.a
        return sorted(vars(o))

    assert interpret(f, H())(Vec(0)) == ["b", "v"]
    assert ("store", "a", 1) in events and ("store", "skip", 2) in events
    assert ("store", "b", 3) in events and ("del", "a") in events


def test_subscr_hooks():
    events = []

    class H(InterpreterHooks):
        def load_subscr(self, container, key, value):
            events.append(("load", key, value))
            return value * 10 if key == 1 else value

        def store_subscr(self, container, key, value):
            events.append(("store", key, value))
            return key == "handled"

        def delete_subscr(self, container, key):
            events.append(("del", key))
            return False

    def f(d, xs):
        d["x"] = 1
        d["handled"] = 2
        del d["x"]
        return xs[1], xs[0:2], d

    assert interpret(f, H())({}, [1, 2, 3]) == (20, [1, 2], {})
    assert ("store", "x", 1) in events and ("del", "x") in events
    assert ("load", slice(0, 2), [1, 2]) in events or ("load", slice(0, 2, None), [1, 2]) in events


def test_load_deref_hook():
    h = Recorder()

    def f():
        k = 41

        def g():
            return k + 1

        return g()

    assert interpret(f, h)() == 42
    assert ("load_deref", 41) in h.events


def test_store_and_delete_deref_hooks():
    class Overlay(InterpreterHooks):
        """Keeps writes to one outside cell in an overlay; the frame's own cells stay native."""

        def __init__(self, cell):
            self.cell, self.value, self.events = cell, None, []

        def load_deref(self, cell, value):
            return self.value if cell is self.cell and self.value is not None else value

        def store_deref(self, cell, value):
            self.events.append(("store", value))
            if cell is self.cell:
                self.value = value
                return True
            return False

        def delete_deref(self, cell):
            self.events.append(("delete", cell is self.cell))
            return False

    count = 10

    def bump(k):
        nonlocal count
        count += k
        local = 1

        def inner():
            nonlocal local
            local += count
            return local

        r = inner()
        del local
        return r

    h = Overlay(bump.__closure__[0])
    assert interpret(bump, h)(5) == 16
    assert count == 10                        # the store was handled by the hook
    assert h.value == 15
    assert ("store", 15) in h.events and ("store", 16) in h.events
    assert ("delete", False) in h.events      # the frame's own cell, deleted natively


def test_current_source_location_in_hook():
    where = []

    class H(InterpreterHooks):
        def lookaside(self, fn):
            if fn is helper:
                where.append(current_source_location())
            return None

    def f():
        x = 1
        return helper(x)  # the marked line

    interpret(f, H())()
    filename, line = where[0]
    assert filename == __file__
    assert "the marked line" in open(filename).read().splitlines()[line - 1]
    assert current_source_location() is None


def test_interpreter_error_names_file_and_line():
    code = compile("1 + 1\n", "/virtual/prog.py", "single")
    fn = types.FunctionType(code, {})
    with pytest.raises(InterpreterError, match=r"/virtual/prog.py:1"):
        interpret(fn)()


def test_user_exception_escapes_interpret():
    def f():
        raise KeyError("k")

    with pytest.raises(KeyError):
        interpret(f)()


def test_hooks_fire_inside_callbacks_and_generators():
    h = Recorder()

    def gen(n):
        for i in range(n):
            yield GLOBAL_VALUE + i

    def f():
        return list(map(lambda x: x + GLOBAL_VALUE, [1])), sorted([3, 1], key=lambda v: -GLOBAL_VALUE * v), list(gen(2))

    assert interpret(f, h)() == ([11], [3, 1], [10, 11])
    assert sum(1 for e in h.events if e[:2] == ("load_global", "GLOBAL_VALUE")) >= 4


def test_import_does_not_import_torch():
    code = (
        "import sys; import thunderlite.interpreter as I; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert not [m for m in sys.modules if m.startswith('thunderlite.') "
        "and not m.startswith('thunderlite.interpreter')]; "
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=_repo_root())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _repo_root():
    import os

    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_table_registration_validates():
    from thunderlite.interpreter.tables.registry import HandlerTable

    t = HandlerTable("test")
    t.register("NOP", lambda f, ins: None)
    with pytest.raises(ValueError, match="twice"):
        t.register("NOP", lambda f, ins: None)
    with pytest.raises(ValueError, match="not an opcode"):
        t.register("NOT_AN_OPCODE", lambda f, ins: None)


def test_augmented_assignments_fire_load_and_store_hooks():
    events = []

    class H(InterpreterHooks):
        def load_attr(self, obj, name, value):
            events.append(("load_attr", name, value))
            return value

        def store_attr(self, obj, name, value):
            events.append(("store_attr", name, value))
            return False

        def load_subscr(self, container, key, value):
            events.append(("load_subscr", key, value))
            return value

        def store_subscr(self, container, key, value):
            events.append(("store_subscr", key, value))
            return False

    def f(o, d):
        o.v += 1
        d["k"] *= 3
        return o.v, d

    o = Vec(1)
    assert interpret(f, H())(o, {"k": 2}) == (2, {"k": 6})
    assert ("load_attr", "v", 1) in events and ("store_attr", "v", 2) in events
    assert ("load_subscr", "k", 2) in events and ("store_subscr", "k", 6) in events


def test_lookaside_sees_context_manager_and_iteration_dunders():
    seen = []

    class CM:
        def __enter__(self):
            return "entered"

        def __exit__(self, *a):
            return False

    class It:
        def __iter__(self):
            return iter([1, 2])

    class H(InterpreterHooks):
        def lookaside(self, fn):
            seen.append(getattr(fn, "__func__", fn))
            return None

    def f():
        with CM() as v:
            pass
        return v, [x for x in It()]

    assert interpret(f, H())() == ("entered", [1, 2])
    assert CM.__enter__ in seen and CM.__exit__ in seen and It.__iter__ in seen


def test_lookaside_replaces_class_instantiation():
    class H(InterpreterHooks):
        def lookaside(self, fn):
            if fn is Vec:
                return lambda v: ("made", v)
            return None

    def f():
        return Vec(3)

    assert interpret(f, H())() == ("made", 3)


def test_load_attr_missing_on_builtin_type():
    class H(InterpreterHooks):
        def load_attr(self, obj, name, value):
            if value is MISSING:
                return f"virtual {name}"
            return value

    def f(x):
        return x.imag, x.virtual_attr

    assert interpret(f, H())(3) == (0, "virtual virtual_attr")


def test_store_subscr_and_delete_handled_do_not_mutate():
    class H(InterpreterHooks):
        def store_subscr(self, container, key, value):
            return True

        def delete_subscr(self, container, key):
            return True

        def delete_attr(self, obj, name):
            return True

    def f(d, o):
        d["new"] = 1
        del d["old"]
        del o.v
        return d, o.v

    assert interpret(f, H())({"old": 0}, Vec(5)) == ({"old": 0}, 5)


def test_interpret_non_function_callables():
    import functools

    v = Vec(2)
    assert interpret(len)([1, 2, 3]) == 3
    assert interpret(Vec)(4).v == 4
    assert interpret(v.scaled)(5) == 10
    assert interpret(functools.partial(helper, 1))() == 2


def test_interpreter_error_is_not_caught_by_user_code():
    code = compile("1 + 1\n", "/virtual/prog2.py", "single")
    inner = types.FunctionType(code, {})

    def f():
        try:
            inner()
        except Exception:  # noqa: BLE001 - the user code under test swallows everything
            return "swallowed"

    with pytest.raises(InterpreterError, match="prog2.py:1"):
        interpret(f)()


def test_lookaside_sees_partial_inner_and_dunder_call():
    import functools

    seen = []

    class CallMe:
        def __call__(self, x):
            return x * 2

    class H(InterpreterHooks):
        def lookaside(self, fn):
            seen.append(fn)
            if fn is math.floor:
                return lambda x: "floored"
            return None

    def f():
        return functools.partial(math.floor)(2.5), CallMe()(4)

    assert interpret(f, H())() == ("floored", 8)
    assert CallMe.__call__ in seen


def test_hooks_set_on_the_instance_are_used():
    h = InterpreterHooks()
    h.load_global = lambda g, name, value: "patched" if name == "GLOBAL_VALUE" else value

    def f():
        return GLOBAL_VALUE

    assert interpret(f, h)() == "patched"


def test_missing_keys_run_interpreted():
    """A ``defaultdict``'s factory and a dict subclass's Python ``__missing__``
    would run from C inside native subscription, unseen by the hooks: they are
    interpreted, and the factory's value is stored through ``store_subscr``."""
    import collections

    events = []

    class H(InterpreterHooks):
        def load_global(self, globals_dict, name, value):
            events.append(("global", name))
            return value

        def store_subscr(self, container, key, value):
            events.append(("store", key, value))
            return False

    class Cache(dict):
        def __missing__(self, key):
            return GLOBAL_VALUE + len(key)

    def f(d, c):
        d["a"].append(1)
        return d["a"], d["b"], c["xyz"], dict(d)

    d, c = collections.defaultdict(lambda: [GLOBAL_VALUE]), Cache()
    assert interpret(f, H())(d, c) == ([10, 1], [10], 13, {"a": [10, 1], "b": [10]})
    assert ("store", "a", [10, 1]) in events and ("store", "b", [10]) in events
    assert events.count(("global", "GLOBAL_VALUE")) == 3
    assert "xyz" not in c


def test_partial_parts_go_through_load_attr():
    """A partial's ``func``/``args``/``keywords`` are read through ``load_attr``
    (the jit gives the values they bind their paths)."""
    import functools
    names = []

    class H(InterpreterHooks):
        def load_attr(self, obj, name, value):
            if isinstance(obj, functools.partial):
                names.append(name)
            return value

    p = functools.partial(max, 3, key=abs)
    assert interpret(lambda: p(-5), H())() == -5
    assert names == ["func", "args", "keywords"]


def test_builtin_and_object_callbacks_go_through_the_lookaside():
    """A callback handed to ``map``/``sorted``/``functools.reduce`` is called as
    the program's own call: a builtin or an object with a Python ``__call__``
    meets the lookaside and is interpreted, not run natively out of sight."""
    import functools

    class Double:
        def __call__(self, x):
            return helper(x) * 2

    seen = []

    class H(InterpreterHooks):
        def lookaside(self, fn):
            seen.append(fn)
            return (lambda x: -x) if fn is abs else None

        def load_global(self, globals_dict, name, value):
            seen.append(name)
            return value

    def f(xs):
        return list(map(abs, xs)), list(map(Double(), xs)), sorted(xs, key=abs), functools.reduce(max, xs)

    assert interpret(f, H())([1, -3, 2]) == ([-1, 3, -2], [4, -4, 6], [2, 1, -3], 2)
    assert "helper" in seen and max in seen


def test_attrgetter_and_itemgetter_read_through_the_hooks():
    """``operator.attrgetter('a.b')``/``itemgetter`` read from C: emulated, each
    step goes through ``load_attr``/``load_subscr`` as written code would."""
    import operator
    seen = []

    class H(InterpreterHooks):
        def load_attr(self, obj, name, value):
            seen.append(name)
            return value

        def load_subscr(self, container, key, value):
            seen.append(key)
            return value

    v = Vec(Vec(3))
    f = interpret(lambda: (operator.attrgetter("v.v", "v")(v), operator.itemgetter("k", 0)({"k": 1, 0: 2})), H())
    assert f() == ((3, v.v), (1, 2))
    assert [s for s in seen if s not in ("attrgetter", "itemgetter")] == ["v", "v", "v", "k", 0]
