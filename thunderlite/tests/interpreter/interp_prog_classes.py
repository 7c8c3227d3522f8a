"""Programs: classes, methods, properties, descriptors, inheritance, dunders, metaclasses."""
# ruff: noqa
from __future__ import annotations

import functools

from interp_harness import program


class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __repr__(self):
        return f"Point({self.x}, {self.y})"

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    def __hash__(self):
        return hash((self.x, self.y))

    def __add__(self, other):
        return Point(self.x + other.x, self.y + other.y)

    def __sub__(self, other):
        return Point(self.x - other.x, self.y - other.y)

    def __mul__(self, k):
        return Point(self.x * k, self.y * k)

    __rmul__ = __mul__

    def __neg__(self):
        return Point(-self.x, -self.y)

    def __abs__(self):
        return (self.x ** 2 + self.y ** 2) ** 0.5

    def __lt__(self, other):
        return (self.x, self.y) < (other.x, other.y)

    def __bool__(self):
        return bool(self.x or self.y)

    def __iter__(self):
        yield self.x
        yield self.y

    def __getitem__(self, i):
        return (self.x, self.y)[i]

    def __len__(self):
        return 2

    def __contains__(self, v):
        return v in (self.x, self.y)


@program()
def point_arith():
    p = Point(1, 2)
    q = Point(3, 5)
    return p + q, q - p, p * 3, 2 * p, -p, abs(Point(3, 4)), p == Point(1, 2), p != q, p < q, q > p


@program()
def point_protocols():
    p = Point(1, 2)
    x, y = p
    return x, y, list(p), p[1], len(p), 2 in p, 7 in p, bool(Point(0, 0)), bool(p), sorted([q for q in [Point(2, 1), p]])


@program()
def point_in_containers():
    s = {Point(1, 2), Point(1, 2), Point(0, 0)}
    d = {Point(1, 1): "a"}
    return len(s), d[Point(1, 1)], repr(Point(3, 4)), str(Point(0, 1)), f"{Point(5, 6)}"


class Account:
    interest = 0.1
    _count = 0

    def __init__(self, owner, balance=0):
        self.owner = owner
        self._balance = balance
        Account._count += 1

    @property
    def balance(self):
        return self._balance

    @balance.setter
    def balance(self, v):
        if v < 0:
            raise ValueError("negative balance")
        self._balance = v

    @balance.deleter
    def balance(self):
        self._balance = 0

    @classmethod
    def count(cls):
        return cls._count

    @staticmethod
    def describe(x):
        return f"account:{x}"

    def deposit(self, amount):
        self.balance = self.balance + amount
        return self


@program()
def properties_and_methods():
    a = Account("ann", 10)
    a.deposit(5).deposit(1)
    b = a.balance
    del a.balance
    return b, a.balance, Account.describe(3), a.describe(4), a.interest, Account.count() > 0


@program()
def property_setter_raises():
    a = Account("bob")
    a.balance = -1


@program()
def class_and_instance_attrs():
    a = Account("x")
    a.interest = 0.5
    return a.interest, Account.interest, type(a).__name__, isinstance(a, Account), hasattr(a, "owner")


class Base:
    def __init__(self, name):
        self.name = name

    def greet(self):
        return f"base {self.name}"

    def kind(self):
        return "base"


class Child(Base):
    def __init__(self, name, age):
        super().__init__(name)
        self.age = age

    def greet(self):
        return "child " + super().greet()


class GrandChild(Child):
    def greet(self):
        return "grand " + super().greet()

    def kind(self):
        return super(Child, self).kind() + "!"


@program()
def inheritance_super():
    g = GrandChild("z", 3)
    return g.greet(), g.kind(), g.age, isinstance(g, Base), issubclass(GrandChild, Child), [c.__name__ for c in GrandChild.__mro__]


class A1:
    def who(self):
        return ["A1"]


class B1(A1):
    def who(self):
        return ["B1"] + super().who()


class C1(A1):
    def who(self):
        return ["C1"] + super().who()


class D1(B1, C1):
    def who(self):
        return ["D1"] + super().who()


@program()
def diamond_mro():
    return D1().who()


@program()
def class_defined_inside():
    class Counter:
        total = 0

        def __init__(self):
            Counter.total += 1
            self.id = Counter.total

        def __repr__(self):
            return f"C{self.id}"

    cs = [Counter() for _ in range(3)]
    return repr(cs), Counter.total


@program()
def class_body_features():
    class K:
        a = 1
        b = a + 1
        items = [i for i in range(3)]
        doubled = {k: k * 2 for k in items}

        def m(self):
            return self.b

    return K.a, K.b, K.items, K.doubled, K().m(), K.__qualname__.split(".")[-1]


@program()
def closure_in_class_body():
    def make(v):
        class K:
            val = v

            def get(self):
                return v * 2

        return K

    K = make(5)
    return K.val, K().get()


@program()
def zero_arg_super_in_closure_class():
    def make():
        class Base2:
            def f(self):
                return "b"

        class Derived(Base2):
            def f(self):
                return "d" + super().f()

        return Derived()

    return make().f()


class Callable:
    def __init__(self, k):
        self.k = k

    def __call__(self, x, y=0):
        return self.k * x + y


@program()
def call_objects():
    c = Callable(3)
    return c(2), c(2, y=1), list(map(c, [1, 2]))


@program()
def partial_functions():
    def f(a, b, c=0):
        return a * 100 + b * 10 + c

    p = functools.partial(f, 1)
    q = functools.partial(p, c=5)
    return p(2), q(3), p(2, c=9)


@program()
def bound_method_objects():
    a = Account("m", 3)
    dep = a.deposit
    dep(2)
    meths = [a.deposit, Account.describe]
    return a.balance, dep.__self__ is a, meths[1](7)


class Desc:
    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return getattr(obj, self.name, "unset")

    def __set__(self, obj, value):
        setattr(obj, self.name, value * 10)


class UsesDesc:
    d = Desc()


@program()
def data_descriptor():
    u = UsesDesc()
    before = u.d
    u.d = 4
    return before, u.d, isinstance(UsesDesc.d, Desc)


class NonData:
    def __get__(self, obj, objtype=None):
        return "from descriptor"


class UsesNonData:
    nd = NonData()


@program()
def non_data_descriptor():
    u = UsesNonData()
    a = u.nd
    u.__dict__["nd"] = "instance wins"
    return a, u.nd


class Dyn:
    def __init__(self):
        self.real = 1

    def __getattr__(self, name):
        if name.startswith("x"):
            return name.upper()
        raise AttributeError(f"no {name}")


@program()
def getattr_fallback():
    d = Dyn()
    return d.real, d.xyz, getattr(d, "xa"), hasattr(d, "nope"), getattr(d, "nope", 0)


@program()
def getattr_fallback_raises():
    return Dyn().missing


class Proxy:
    def __init__(self, target):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "log", [])

    def __getattribute__(self, name):
        if name in ("_target", "log"):
            return object.__getattribute__(self, name)
        self.log.append(name)
        return getattr(self._target, name)

    def __setattr__(self, name, value):
        self.log.append("set " + name)
        setattr(self._target, name, value)


@program()
def custom_getattribute_setattr():
    p = Point(1, 2)
    px = Proxy(p)
    a = px.x
    px.y = 7
    return a, p.y, px.log


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self):
        self.a = 1


@program()
def slots_class():
    s = Slotted()
    s.b = 2
    try:
        s.c = 3
    except AttributeError as e:
        err = "attr"
    return s.a, s.b, err


@program()
def slots_unset_attribute():
    return Slotted().b


class Meta(type):
    def __new__(mcls, name, bases, ns, **kw):
        ns["created_by"] = "Meta"
        return super().__new__(mcls, name, bases, ns)

    def __call__(cls, *args, **kwargs):
        obj = super().__call__(*args, **kwargs)
        obj.via_meta = True
        return obj


@program()
def metaclass_usage():
    class WithMeta(metaclass=Meta):
        def __init__(self, v):
            self.v = v

    w = WithMeta(3)
    return w.v, w.via_meta, WithMeta.created_by, type(WithMeta).__name__


class Registry:
    registered = []

    def __init_subclass__(cls, tag="none", **kw):
        super().__init_subclass__(**kw)
        Registry.registered.append((cls.__name__, tag))


@program()
def init_subclass_hook():
    Registry.registered = []

    class P(Registry, tag="p"):
        pass

    class Q(Registry):
        pass

    return Registry.registered


@program()
def class_new_override():
    class Singleton:
        _inst = None

        def __new__(cls, *a):
            if cls._inst is None:
                cls._inst = super().__new__(cls)
            return cls._inst

        def __init__(self, v):
            self.v = v

    a = Singleton(1)
    b = Singleton(2)
    return a is b, a.v


@program()
def init_returns_value_error():
    class Bad:
        def __init__(self):
            return 5

    return Bad()


@program()
def abstract_class_error():
    import abc

    class Abs(abc.ABC):
        @abc.abstractmethod
        def m(self):
            pass

    return Abs()


@program()
def builtin_subclasses():
    class MyList(list):
        def total(self):
            return sum(self)

    class MyDict(dict):
        def __missing__(self, key):
            return key * 2

    class MyInt(int):
        def __add__(self, other):
            return MyInt(int(self) - int(other))

    ml = MyList([1, 2, 3])
    ml.append(4)
    md = MyDict(a=1)
    return ml.total(), len(ml), md["a"], md["zz"], MyInt(5) + 3, type(MyInt(5) + 3).__name__


@program()
def exception_subclass():
    class MyError(ValueError):
        def __init__(self, code):
            super().__init__(f"code {code}")
            self.code = code

    try:
        raise MyError(42)
    except ValueError as e:
        return e.code, str(e), e.args, isinstance(e, MyError)


@program()
def operator_fallbacks():
    class OnlyRadd:
        def __radd__(self, other):
            return ("radd", other)

    class NotImpl:
        def __eq__(self, other):
            return NotImplemented

    n = NotImpl()
    return 1 + OnlyRadd(), n == n, n == 1, n != 2


@program()
def unsupported_operand_error():
    class X:
        pass

    return X() + 1


@program()
def unorderable_error():
    class X:
        pass

    return X() < X()


@program()
def reflected_subclass_priority():
    class Num:
        def __init__(self, v):
            self.v = v

        def __add__(self, o):
            return "Num.add"

        def __radd__(self, o):
            return "Num.radd"

    class Sub(Num):
        def __radd__(self, o):
            return "Sub.radd"

    return Num(1) + Sub(2), Sub(1) + Num(2)


@program()
def inplace_dunders():
    class Acc:
        def __init__(self):
            self.items = []

        def __iadd__(self, other):
            self.items.append(other)
            return self

    class NoIadd:
        def __init__(self, v):
            self.v = v

        def __add__(self, o):
            return NoIadd(self.v + o)

    a = Acc()
    a += 1
    a += 2
    b = NoIadd(1)
    b += 5
    return a.items, b.v


@program()
def context_manager_class():
    log = []

    class CM:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            log.append("enter " + self.name)
            return self.name.upper()

        def __exit__(self, et, ev, tb):
            log.append(("exit", self.name, et.__name__ if et else None))
            return self.name == "swallow"

    with CM("a") as v:
        log.append(v)
    with CM("swallow"):
        raise ValueError("x")
    try:
        with CM("b"), CM("c"):
            raise KeyError("k")
    except KeyError:
        log.append("caught")
    return log


@program()
def not_a_context_manager():
    with 5:
        pass


@program()
def dataclass_usage():
    from dataclasses import dataclass, field, asdict

    @dataclass(order=True)
    class Item:
        price: float
        name: str = "x"
        tags: list = field(default_factory=list)

    a = Item(2.0, "a")
    b = Item(1.0)
    b.tags.append("t")
    return sorted([a, b])[0].name, asdict(b), a == Item(2.0, "a"), repr(a)


@program()
def dataclass_frozen_error():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class F:
        v: int

    f = F(1)
    f.v = 2


@program()
def enum_usage():
    import enum

    class Color(enum.Enum):
        RED = 1
        GREEN = 2

    class Perm(enum.IntFlag):
        R = 4
        W = 2

    return Color.RED.name, Color(2).name, Color["GREEN"].value, [c.name for c in Color], int(Perm.R | Perm.W), Color.RED in Color


@program()
def namedtuple_usage():
    from collections import namedtuple
    from typing import NamedTuple

    P = namedtuple("P", "x y")

    class Q(NamedTuple):
        a: int
        b: str = "d"

    p = P(1, 2)
    return p.x + p.y, p._replace(x=5), Q(1), Q(2, "z").b, p._asdict()


@program()
def class_repr_str_format():
    class R:
        def __repr__(self):
            return "R!"

    class S:
        def __str__(self):
            return "S!"

        def __format__(self, spec):
            return "fmt:" + spec

    return repr(R()), str(R()), f"{R()}", f"{R()!r}", str(S()), f"{S():abc}", format(S(), "q"), "%s" % R()


@program()
def class_with_class_attr_mutation():
    class K:
        items = []

        def add(self, v):
            self.items.append(v)

    a, b = K(), K()
    a.add(1)
    b.add(2)
    return K.items


@program()
def staticmethod_classmethod_via_instance():
    class K:
        factor = 3

        @classmethod
        def make(cls, v):
            obj = cls()
            obj.v = v * cls.factor
            return obj

        @staticmethod
        def helper(a, b):
            return a - b

    class K2(K):
        factor = 5

    return K.make(2).v, K2.make(2).v, K2().helper(5, 3), type(K2.make(1)).__name__


@program()
def cached_property_usage():
    from functools import cached_property

    class C:
        calls = 0

        @cached_property
        def value(self):
            C.calls += 1
            return 42

    c = C()
    return c.value, c.value, C.calls


@program()
def total_ordering_usage():
    from functools import total_ordering

    @total_ordering
    class V:
        def __init__(self, v):
            self.v = v

        def __eq__(self, o):
            return self.v == o.v

        def __lt__(self, o):
            return self.v < o.v

    return V(1) <= V(2), V(3) >= V(2), V(1) > V(2)


@program()
def iterator_class():
    class Countdown:
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return self

        def __next__(self):
            if self.n <= 0:
                raise StopIteration
            self.n -= 1
            return self.n

    return list(Countdown(3)), [x * 2 for x in Countdown(4)], sum(Countdown(5))


@program()
def getitem_iteration_protocol():
    class Seq:
        def __getitem__(self, i):
            if i >= 3:
                raise IndexError
            return i * 10

    return list(Seq()), 20 in Seq()


@program()
def len_and_bool_protocol():
    class L:
        def __len__(self):
            return 0

    class B:
        def __bool__(self):
            return 1

    r = "empty" if not L() else "full"
    try:
        bool(B())
    except TypeError as e:
        return r, str(e)


@program()
def hash_eq_protocol():
    class K:
        def __init__(self, v):
            self.v = v

        def __eq__(self, o):
            return self.v % 3 == o.v % 3

        def __hash__(self):
            return self.v % 3

    return len({K(1), K(4), K(2)})


@program()
def class_getitem_generic():
    from typing import Generic, TypeVar

    T = TypeVar("T")

    class Box(Generic[T]):
        def __init__(self, v: T):
            self.v = v

    return Box[int](3).v, Box.__name__


@program()
def super_in_classmethod():
    class A:
        @classmethod
        def name(cls):
            return "A:" + cls.__name__

    class B(A):
        @classmethod
        def name(cls):
            return "B+" + super().name()

    return B.name()


@program()
def property_inheritance_override():
    class A:
        @property
        def v(self):
            return 1

    class B(A):
        @property
        def v(self):
            return super().v + 10

    return B().v


@program()
def object_identity_methods():
    class K:
        pass

    k = K()
    return type(k) is K, k.__class__.__name__, id(k) == id(k), K.__dict__["__module__"] == __name__


@program()
def call_non_callable():
    x = 5
    return x()


@program()
def method_missing_self_error():
    class K:
        def m(self, a):
            return a

    return K().m()
