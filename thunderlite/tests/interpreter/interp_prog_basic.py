"""Programs: arithmetic, control flow, comprehensions, closures, strings, unpacking, scopes."""
# ruff: noqa
from __future__ import annotations

from interp_harness import cases, program

G_COUNTER = 0


@cases((3, 4), (-2, 7), (2.5, 0.5), (10**30, 3))
def arith(a, b):
    return a + b, a - b, a * b, a / b, a // b, a % b, a ** 2, -a, +a, abs(a)


@cases((12, 5), (-7, 3), (0, 1))
def bitops(a, b):
    return a & b, a | b, a ^ b, ~a, a << 2, a >> 1


@cases((1, 2), (2, 1), (3, 3))
def comparisons(a, b):
    return a < b, a <= b, a == b, a != b, a > b, a >= b, a is b, 1 < a < 3


@cases((1,), (0,), (None,), ("",), ([1],))
def truthiness(x):
    r = []
    if x:
        r.append("t")
    else:
        r.append("f")
    r.append(not x)
    r.append(x and 5)
    r.append(x or 6)
    return r


@cases((5,), (0,), (17,))
def while_loop(n):
    total = 0
    i = 0
    while i < n:
        i += 1
        if i % 3 == 0:
            continue
        if i > 12:
            break
        total += i
    else:
        total = -total
    return total, i


@cases((4,), (0,))
def for_else(n):
    for i in range(n):
        if i == 10:
            break
    else:
        return "no break", n
    return "break"


@program()
def nested_loops():
    out = []
    for i in range(4):
        for j in range(i):
            if (i + j) % 2:
                continue
            out.append((i, j))
    return out


@program()
def list_comprehensions():
    xs = [i * i for i in range(10) if i % 2]
    ys = [(i, j) for i in range(3) for j in range(i)]
    zs = [[j for j in range(i)] for i in range(4)]
    return xs, ys, zs


@program()
def set_dict_comprehensions():
    s = {i % 3 for i in range(10)}
    d = {str(i): i * 2 for i in range(5) if i != 2}
    return sorted(s), d


@program()
def generator_expressions():
    g = (i * 2 for i in range(5))
    return sum(g), list(x for x in "abc"), max(len(w) for w in ["a", "bbb", "cc"])


@program()
def comprehension_closure():
    fs = [lambda: i for i in range(3)]
    gs = [(lambda i=i: i) for i in range(3)]
    return [f() for f in fs], [g() for g in gs]


@program()
def comprehension_scope():
    x = 10
    ys = [x + i for i in range(3)]
    i = "outer"
    zs = [i for i in range(2)]
    return ys, zs, i


@cases((5,), (1,))
def closures(n):
    def make_adder(k):
        def add(x):
            return x + k
        return add

    adders = [make_adder(i) for i in range(n)]
    return [a(10) for a in adders]


@program()
def nonlocal_counter():
    def counter():
        count = 0

        def inc(by=1):
            nonlocal count
            count += by
            return count

        return inc

    c = counter()
    c()
    c(5)
    return c(), c.__closure__[0].cell_contents


@program()
def global_statement():
    global G_COUNTER
    G_COUNTER = 0
    for _ in range(3):
        G_COUNTER += 2
    return G_COUNTER


@program()
def unbound_local():
    def f():
        y = x
        x = 1
        return y
    return f()


@program()
def unbound_free():
    def outer():
        def inner():
            return v
        r = inner
        del_me = 1
        return inner()
        v = 3
    return outer()


@program()
def name_error():
    return undefined_name_xyz


@program()
def del_statement():
    a = 1
    b = [1, 2, 3]
    del b[0]
    d = {"k": 1, "j": 2}
    del d["k"]
    del a
    try:
        a
    except UnboundLocalError as e:
        msg = "unbound"
    return b, d, msg


@cases(("hello world",), ("",))
def string_methods(s):
    return s.upper(), s.split(), s.replace("o", "0"), s[::-1], s.title(), s.find("w"), len(s)


@cases((3.14159, "x"), (42, "yz"))
def fstrings(v, name):
    w = 10
    return f"{v}", f"{v:.2f}", f"{name!r}", f"{v:>{w}}", f"{name:*^7}", f"{v=}", f"{{literal}} {name}"


@program()
def string_formatting():
    return "%s-%d-%.2f" % ("a", 3, 1.5), "{} {}".format(1, "b"), "{0:>5}|{x}".format(7, x="y"), format(255, "x")


@program()
def unpacking():
    a, b = 1, 2
    a, b = b, a
    (c, d), e = (3, 4), 5
    f, *g = [1, 2, 3, 4]
    *h, i = "xyz"
    j, *k, l = range(5)
    return a, b, c, d, e, f, g, h, i, j, k, l


@program()
def unpack_errors_few():
    a, b, c = [1, 2]


@program()
def unpack_errors_many():
    a, b = [1, 2, 3]


@program()
def unpack_non_iterable():
    a, b = 5


@program()
def unpack_ex_error():
    a, b, *c, d = [1, 2]


@program()
def star_expressions():
    xs = [1, 2]
    ys = (3,)
    return [*xs, *ys, 4], (*xs, *"ab"), {*xs, 2}, {**{"a": 1}, "b": 2, **{"a": 3}}


@cases((5,), (-1,))
def walrus(n):
    out = []
    if (m := n * 2) > 0:
        out.append(m)
    data = [1, 2, 3, 4]
    filtered = [y for x in data if (y := x * n) > 2]
    return out, filtered, m


@program()
def chained_assignment():
    a = b = c = []
    a.append(1)
    x, y = z = (1, 2)
    return a, b, c, x, y, z


@program()
def augmented_assign():
    x = 5
    x += 3
    x -= 1
    x *= 2
    x //= 3
    x **= 2
    x %= 7
    s = "a"
    s *= 3
    lst = [1]
    lst += [2]
    lst *= 2
    d = {"k": 1}
    d["k"] += 5
    return x, s, lst, d


@program()
def slicing():
    xs = list(range(10))
    ys = xs[2:5] + xs[::3] + xs[-3:] + xs[:-7:-2]
    xs[1:3] = ["a", "b", "c"]
    del xs[5:]
    s = "abcdef"
    return ys, xs, s[1:4], s[::-2]


@program()
def conditional_expression():
    return [("even" if i % 2 == 0 else "odd") for i in range(4)]


@program()
def lambdas():
    f = lambda x, y=2: x * y
    g = lambda *a, **k: (a, k)
    return f(3), f(3, 3), g(1, 2, z=3), sorted([3, 1, 2], key=lambda v: -v)


@program()
def recursion():
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)

    return fib(12), fact(20)


@program()
def mutual_recursion():
    def even(n):
        return True if n == 0 else odd(n - 1)

    def odd(n):
        return False if n == 0 else even(n - 1)

    return even(10), odd(7)


@cases((10,), (3,))
def dict_ops(n):
    d = {}
    for i in range(n):
        d.setdefault(i % 3, []).append(i)
    keys = list(d.keys())
    vals = [sum(v) for v in d.values()]
    items = sorted(d.items())
    return keys, vals, items, d.get(99, "missing"), 2 in d


@program()
def set_ops():
    a = {1, 2, 3}
    b = {2, 3, 4}
    return sorted(a | b), sorted(a & b), sorted(a - b), sorted(a ^ b), a <= b, {1} < a


@program()
def tuple_list_ops():
    t = (1, 2, 3)
    l = list(t) * 2
    l.sort(reverse=True)
    return t + (4,), t * 2, l, t.index(2), l.count(3), 2 in t, t[::-1]


@program()
def builtin_functions():
    xs = [3, 1, 2]
    return (len(xs), sum(xs), min(xs), max(xs), sorted(xs), list(reversed(xs)),
            list(enumerate(xs, 1)), list(zip(xs, "abc")), any(xs), all(xs), divmod(7, 3),
            round(2.567, 2), abs(-3), pow(2, 10, 7), chr(65), ord("a"), hex(255), bin(5), isinstance(3, int))


@program()
def map_filter():
    return list(map(lambda x: x * 2, range(4))), list(filter(lambda x: x % 2, range(6))), list(map(str, [1, 2]))


@program()
def zero_division():
    return 1 / 0


@program()
def key_error():
    return {}["missing"]


@program()
def index_error():
    return [1, 2][5]


@program()
def type_error_add():
    return 1 + "a"


@program()
def type_error_compare():
    return [] < 3


@program()
def attribute_error():
    return (1).nope


@program()
def int_overflowish():
    return 2 ** 200 // 3 ** 50, (-7) // 2, -7 % 3, 7.5 // 2, divmod(-7, 2)


@program()
def float_ops():
    import math
    return math.sqrt(16), math.floor(-2.5), round(0.1 + 0.2, 10), float("inf") > 1e308, math.isnan(float("nan"))


@program()
def complex_numbers():
    z = complex(1, 2)
    return z * z, abs(3 + 4j), z.conjugate(), z.real


@program()
def bytes_ops():
    b = b"abc"
    ba = bytearray(b)
    ba[0] = 65
    return b + b"d", b[1], ba, b.hex(), bytes(range(3)), b.decode()


@program()
def string_iteration():
    counts = {}
    for ch in "mississippi":
        counts[ch] = counts.get(ch, 0) + 1
    return counts


@program()
def nested_functions_defaults():
    def f(a, b=[], c={"x": 1}):
        b.append(a)
        return b, c

    f(1)
    return f(2)


@program()
def keyword_only_args():
    def f(a, *, b, c=3):
        return a, b, c

    return f(1, b=2), f(1, c=4, b=5)


@program()
def positional_only_args():
    def f(a, b, /, c):
        return a, b, c

    return f(1, 2, 3), f(1, 2, c=3)


@program()
def positional_only_error():
    def f(a, b, /, c):
        return a, b, c

    return f(1, b=2, c=3)


@program()
def missing_argument_error():
    def f(a, b, c):
        return a

    return f(1)


@program()
def too_many_arguments_error():
    def f(a, b=1):
        return a

    return f(1, 2, 3)


@program()
def unexpected_kwarg_error():
    def f(a):
        return a

    return f(a=1, z=2)


@program()
def multiple_values_error():
    def f(a, b):
        return a

    return f(1, a=2)


@program()
def missing_kwonly_error():
    def f(*, k):
        return k

    return f()


@program()
def varargs_kwargs():
    def f(*args, **kwargs):
        return args, sorted(kwargs.items())

    a = [1, 2]
    k = {"x": 1}
    return f(*a, 3, *a, **k, y=2), f(), f(*range(3)), f(**{"z": 0})


@program()
def call_with_generator_star():
    def f(*a):
        return a

    def gen():
        yield 1
        yield 2

    return f(*gen()), f(*(i for i in range(3))), f(*{"a": 1}), f(*"xy")


@program()
def star_args_not_iterable():
    def f(*a):
        return a

    return f(*5)


@program()
def kwargs_not_mapping():
    def f(**k):
        return k

    return f(**5)


@program()
def kwargs_duplicate():
    def f(**k):
        return k

    return f(**{"a": 1}, **{"a": 2})


@program()
def docstring_and_annotations():
    def f(a: int, b: "str" = "x") -> list:
        """doc"""
        return [a, b]

    return f.__doc__, f(1), sorted(f.__annotations__)


@program()
def function_attributes():
    def f():
        return f.counter

    f.counter = 5
    return f(), f.__name__, f.__qualname__.split(".")[-1]


@program()
def boolean_short_circuit():
    calls = []

    def t(v):
        calls.append(v)
        return v

    r = t(0) and t(1)
    r2 = t(2) or t(3)
    r3 = t(None) or t(0) or t("z")
    return r, r2, r3, calls


@program()
def is_and_in():
    a = [1]
    b = a
    return a is b, a is not [1], 1 in a, 2 not in a, "b" in "abc", None is None


@program()
def range_ops():
    r = range(2, 20, 3)
    return list(r), r[2], len(r), 5 in r, r.index(8), list(range(5, 0, -2))


@program()
def iter_next_builtin():
    it = iter([1, 2, 3])
    a = next(it)
    b = next(it)
    rest = list(it)
    return a, b, rest, next(it, "default")


@program()
def stop_iteration_escape():
    it = iter([])
    return next(it)


@program()
def large_function():
    x = 0
    for i in range(50):
        if i % 2 == 0:
            x += i
        elif i % 3 == 0:
            x -= i
        elif i % 5 == 0:
            x *= 2
        else:
            x ^= i
    return x


@program()
def long_int_loop():
    total = 0
    for i in range(2000):
        total += i * i % 7
    return total


@program()
def assert_statement():
    assert 1 == 1, "fine"
    assert 1 == 2, "one is not two"


@program()
def assert_no_message():
    assert []


@program()
def exec_eval_builtins():
    ns = {}
    exec("y = 2 + 3", ns)
    return ns["y"], eval("1 + 2"), eval("a * 2", {"a": 4})


@program()
def eval_sees_locals():
    q = 21
    return eval("q * 2")


@program()
def locals_globals_builtins():
    a = 1
    b = "x"
    loc = locals()
    return sorted(loc), loc["a"], "G_COUNTER" in globals(), sorted(dir())


@program()
def vars_no_args():
    k = 3
    return vars()


@program()
def locals_with_cells():
    x = 1

    def g():
        return x

    y = 2
    return sorted(locals().keys()), locals()["x"]


@program()
def print_to_string():
    import io
    buf = io.StringIO()
    print("a", 1, sep="-", end="!", file=buf)
    print([1, 2], file=buf)
    return buf.getvalue()


@program()
def imports_inside():
    import os.path
    from collections import OrderedDict as OD
    from math import pi, e
    import json as j
    return os.path.join("a", "b"), list(OD(a=1)), round(pi + e, 3), j.dumps([1])


@program()
def import_error():
    from math import does_not_exist
    return does_not_exist


@program()
def module_not_found():
    import no_such_module_xyz
