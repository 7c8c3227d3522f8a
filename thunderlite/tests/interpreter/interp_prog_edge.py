"""Programs: corner cases of scoping, unwinding, protocols and call binding."""
# ruff: noqa
from __future__ import annotations

import sys

from interp_harness import cases, program

MODULE_LEVEL = []


@program()
def nested_comprehension_cells():
    fs = [[lambda: x + y for y in range(2)] for x in range(2)]
    return [[f() for f in row] for row in fs]


@program()
def comprehension_captures_param():
    def f(k):
        return [lambda: k * i for i in range(3)]

    return [g() for g in f(2)]


@program()
def class_body_comprehension_name_error():
    class K:
        v = 3
        items = [v for _ in range(2)]

    return K.items


@program()
def super_in_comprehension():
    class A:
        def f(self):
            return 1

    class B(A):
        def f(self):
            return [super().f() for _ in range(2)]

    return B().f()


@program()
def generator_recursive_tree():
    tree = (1, ((2, ()), (3, ((4, ()),))))

    def walk(node):
        value, children = node
        yield value
        for c in children:
            yield from walk(c)

    return list(walk(tree))


@program()
def yield_inside_with_closed():
    log = []

    class CM:
        def __enter__(self):
            log.append("enter")

        def __exit__(self, *a):
            log.append(("exit", a[0].__name__ if a[0] else None))

    def gen():
        with CM():
            yield 1
            yield 2

    g = gen()
    next(g)
    g.close()
    return log


@program()
def continue_in_except_loop():
    out = []
    for i in range(5):
        try:
            if i % 2:
                raise ValueError(i)
            out.append(i)
        except ValueError:
            continue
        finally:
            out.append("f")
    return out


@program()
def break_in_with_in_loop():
    log = []

    class CM:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            log.append("exit")

    for i in range(3):
        with CM():
            if i == 1:
                break
            log.append(i)
    return log


@program()
def return_in_nested_finally():
    log = []

    def f():
        try:
            try:
                return "inner"
            finally:
                log.append("a")
        finally:
            log.append("b")

    return f(), log


@program()
def exception_in_exit():
    class CM:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            raise KeyError("exit failed")

    try:
        with CM():
            raise ValueError("body")
    except KeyError as e:
        return repr(e), type(e.__context__).__name__


@program()
def finally_swallows_with_return():
    def f():
        for i in range(3):
            try:
                raise ValueError
            finally:
                return i

    return f()


@program()
def unpack_into_targets():
    class O:
        pass

    o = O()
    d = {}
    lst = [0, 0]
    o.x, d["k"], lst[1] = 1, 2, 3
    (a, b), *c = [(4, 5), 6, 7]
    for p, *q in [(1, 2, 3), (4,)]:
        MODULE_LEVEL.append((p, q))
    res = (o.x, d, lst, a, b, c, MODULE_LEVEL[-2:])
    del MODULE_LEVEL[:]
    return res


@program()
def chained_compare_single_eval():
    calls = []

    def v(x):
        calls.append(x)
        return x

    r = v(1) < v(2) < v(3) > v(0)
    r2 = v(5) < v(4) < v(99)
    return r, r2, calls


@program()
def decorators_with_args():
    def repeat(n):
        def deco(fn):
            def wrapper(*a, **k):
                return [fn(*a, **k) for _ in range(n)]

            return wrapper

        return deco

    @repeat(3)
    def hi(name):
        return "hi " + name

    def add_attr(cls):
        cls.extra = "added"
        return cls

    @add_attr
    class K:
        pass

    return hi("x"), K.extra


@program()
def prepare_custom_namespace():
    class Recording(dict):
        def __init__(self):
            super().__init__()
            self.order = []

        def __setitem__(self, k, v):
            if not k.startswith("__"):
                self.order.append(k)
            super().__setitem__(k, v)

    class Meta(type):
        @classmethod
        def __prepare__(mcls, name, bases):
            return Recording()

        def __new__(mcls, name, bases, ns):
            cls = super().__new__(mcls, name, bases, dict(ns))
            cls.order = ns.order
            return cls

    class K(metaclass=Meta):
        b = 1
        a = 2

        def m(self):
            pass

    return K.order


@program()
def partial_of_method_and_class():
    import functools

    class P:
        def __init__(self, a, b):
            self.s = a + b

        def add(self, x, y):
            return self.s + x + y

    mk = functools.partial(P, 10)
    p = mk(5)
    adder = functools.partial(p.add, 1)
    return p.s, adder(2)


@program()
def iter_raises_non_stop():
    class It:
        def __iter__(self):
            return self

        def __next__(self):
            raise ValueError("iter broke")

    try:
        for _ in It():
            pass
    except ValueError as e:
        return str(e)


@program()
def iter_callable_sentinel():
    data = [1, 2, 3, 0, 5]
    it = iter(data)
    return list(iter(lambda: next(it), 0))


@program()
def dynamic_type_creation():
    K = type("K", (object,), {"v": 5, "get": lambda self: self.v * 2})
    return K().get(), K.__name__


@program()
def kwargs_non_string_keys():
    def f(**kw):
        return kw

    return f(**{1: 2})


@program()
def builtin_kwargs():
    return int("101", base=2), sorted([3, 1], reverse=True), dict(a=1, **{"b": 2}), "x".join(map(str, range(3)))


@program()
def name_mangling():
    class K:
        def __init__(self):
            self.__secret = 1

        def get(self):
            return self.__secret

    k = K()
    return k.get(), hasattr(k, "_K__secret"), hasattr(k, "__secret")


@program()
def global_in_nested():
    def outer():
        def inner():
            global MODULE_LEVEL
            MODULE_LEVEL = MODULE_LEVEL + ["inner"]

        inner()
        return list(MODULE_LEVEL)

    r = outer()
    del MODULE_LEVEL[:]
    return r


@program()
def nonlocal_in_generator():
    def make():
        count = 0

        def gen():
            nonlocal count
            while count < 3:
                count += 1
                yield count

        return gen, lambda: count

    gen, get = make()
    return list(gen()), get()


@program()
def del_cell_variable():
    def f():
        x = 1

        def g():
            return x

        del x
        try:
            return g()
        except NameError as e:
            return type(e).__name__, str(e)

    return f()


@program()
def locals_in_class_body():
    class K:
        a = 1
        names = sorted(k for k in locals() if not k.startswith("__"))

    return K.names


@program()
def exception_context_in_generator_consumer():
    def gen():
        try:
            yield 1
        except KeyError:
            raise ValueError("from gen")

    g = gen()
    next(g)
    try:
        g.throw(KeyError("k"))
    except ValueError as e:
        return repr(e.__context__)


@program()
def string_percent_dict():
    return "%(a)s-%(b)05.1f" % {"a": "x", "b": 2.25}, "%c%%" % 65


@program()
def sys_exc_info_in_finally():
    out = []
    try:
        try:
            raise KeyError("k")
        finally:
            out.append(sys.exc_info()[0])
    except KeyError:
        pass
    return out


@program()
def reraise_preserves_identity():
    err = ValueError("same")
    try:
        try:
            raise err
        except ValueError:
            raise
    except ValueError as e:
        return e is err


@program()
def exception_group_naked_in_3_10_style():
    try:
        raise ValueError("plain")
    except (TypeError, ValueError) as e:
        return type(e).__name__


@program()
def with_multiple_targets():
    import contextlib

    @contextlib.contextmanager
    def cm(v):
        yield v

    with cm(1) as a, cm(2) as b:
        return a + b


@program()
def lambda_default_and_closure_mix():
    x = 10
    fs = [lambda y, x=x: x + y, lambda y: x * y]
    x = 20
    return fs[0](1), fs[1](2)


@program()
def star_call_with_mapping_subclass():
    from collections import OrderedDict, UserDict

    def f(**kw):
        return sorted(kw.items())

    return f(**OrderedDict(a=1)), f(**UserDict(b=2))


@program()
def property_getter_raising_attribute_error_uses_getattr():
    class K:
        @property
        def p(self):
            raise AttributeError("inner")

        def __getattr__(self, name):
            return "fallback " + name

    return K().p


@program()
def sorted_with_method_key():
    class Scorer:
        def __init__(self, w):
            self.w = w

        def score(self, x):
            return -x * self.w

    return sorted([1, 3, 2], key=Scorer(2).score), max([1, 3, 2], key=Scorer(-1).score)


@program()
def int_subclass_bool_truth():
    class Z(int):
        pass

    class E(list):
        pass

    return bool(Z(0)), bool(Z(3)), bool(E()), not E([1]), "yes" if Z(2) else "no"


@program()
def conditional_import_and_reload_free():
    if True:
        import math as m
    return m.tau > 6


@program()
def large_literal_containers():
    d = {i: str(i) for i in range(300)}
    t = tuple(range(300))
    return len(d), sum(t), d[299]


@program()
def extended_arg_jumps():
    x = 0
    for i in range(3):
        if i == 1:
            x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1
            x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1
            x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1
            x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1
            x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1
            x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1
            x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1
            x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1; x += 1
        else:
            x -= 1
    return x


@program()
def exec_defines_function():
    ns = {}
    exec("def f(a):\n    return a * 3\n", ns)
    return ns["f"](4)


@program()
def generator_throw_before_start():
    def gen():
        yield 1

    g = gen()
    try:
        g.throw(ValueError("early"))
    except ValueError as e:
        return str(e), list(g)


@program()
def generator_close_unstarted_and_finished():
    def gen():
        yield 1

    g = gen()
    g.close()
    h = gen()
    list(h)
    h.close()
    return list(g), list(h)


@program()
def coroutine_await_in_try_finally():
    import asyncio

    log = []

    async def inner():
        await asyncio.sleep(0)
        raise KeyError("k")

    async def main():
        try:
            await inner()
        except KeyError:
            log.append("caught")
        finally:
            log.append("finally")
        return log

    return asyncio.run(main())


@program()
def class_method_resolution_via_instance_dict_function():
    class K:
        def m(self):
            return "class"

    k = K()
    k.m = lambda: "instance"
    return k.m(), K.m(k)


@program()
def error_list_extend_non_iterable():
    return [*1]


@program()
def error_set_update_non_iterable():
    return {*1}


@program()
def error_dict_update_non_mapping():
    return {**1}


@program()
def error_builtin_star_args():
    return print(*1)


@program()
def error_not_callable():
    s = "abc"
    return s()


@program()
def error_unhashable_key():
    return {[]: 1}


@program()
def error_bad_unary():
    return -"a"


@program()
def error_match_non_class():
    import math

    match 1:
        case math.pi():
            return "no"


@program()
def error_super_no_args():
    def f():
        return super()

    return f()


@program()
def error_super_no_class_cell():
    def f(self):
        return super()

    return f(1)


@program()
def error_delete_unbound():
    x = 1
    del x
    del x


@program()
def error_delete_global_missing():
    global NOT_DEFINED_ANYWHERE
    del NOT_DEFINED_ANYWHERE


@program()
def exec_import_star():
    ns = {}
    exec("from math import *", ns)
    return ns["sqrt"](9.0)


@program()
def error_setattr_builtin():
    x = 5
    x.y = 1


@program()
def error_iter_non_iterable_for():
    for _ in 5:
        pass


@program()
def error_yield_from_non_iterable():
    def g():
        yield from 5

    return list(g())


@program()
def error_await_non_awaitable():
    import asyncio

    async def main():
        await 5

    return asyncio.run(main())


@program()
def error_async_for_non_async_iterable():
    import asyncio

    async def main():
        async for _ in [1]:
            pass

    return asyncio.run(main())


@program()
def error_format_spec_invalid():
    return f"{5:q}"


@program()
def error_bool_returns_non_bool():
    class B:
        def __bool__(self):
            return 2

    return not B()


@program()
def error_len_negative():
    class L:
        def __len__(self):
            return -1

    return bool(L())


@program()
def error_str_returns_non_string():
    class S:
        def __str__(self):
            return 5

    return f"{S()}"


@program()
def error_getitem_index_type():
    key = "x"
    return [1, 2][key]


@program()
def error_int_parse():
    return int("12x")


@program()
def conversions_run_python_dunders():
    class V:
        def __init__(self, v):
            self.v = v

        def __str__(self):
            return f"V{self.v}"

        def __repr__(self):
            return f"V({self.v!r})"

        def __format__(self, spec):
            return f"<{spec}:{self.v}>"

        def __bool__(self):
            return self.v > 0

        def __iter__(self):
            return iter(range(self.v))

    class Counter:
        def __init__(self):
            self.n = 0

        def __next__(self):
            self.n += 1
            if self.n > 2:
                raise StopIteration
            return self.n

    c = Counter()
    return (str(V(1)), repr(V("a")), format(V(2), "x"), bool(V(0)), bool(V(3)), list(iter(V(3))),
            next(c), next(c), next(c, "done"), str(b"x", "ascii"), repr([V(1)]))


@program()
def error_str_non_string_builtin():
    class S:
        def __str__(self):
            return 1

    return str(S())


@program()
def error_next_on_non_iterator():
    return next(5)


@program()
def error_next_python_stop():
    class It:
        def __next__(self):
            raise StopIteration("custom")

    return next(It())


@cases((True,), (False,))
def comprehension_restores_unbound_local(flag):
    if flag:
        x = 1
    y = [x for x in range(3)]
    return y, x


@program()
def frame_introspection():
    import collections
    import inspect

    f = sys._getframe()
    P = collections.namedtuple("P", "x")
    here = inspect.currentframe()
    return (f.f_code.co_name, f.f_lineno > 0, P.__module__, here.f_code.co_name, "sys" in f.f_globals,
            sys._getframe(0).f_back is not None, sorted(k for k in f.f_locals if k != "f"))


@program()
def frame_introspection_nested():
    def inner():
        return sys._getframe(1).f_code.co_name, sys._getframe(1).f_locals.get("marker")

    marker = "outer-local"
    return inner()


@program()
def typevar_and_enum_module_names():
    import enum
    import typing

    T = typing.TypeVar("T")
    E = enum.Enum("E", "A B")
    return T.__module__, E.__module__, [m.name for m in E]
