"""Programs: structural pattern matching."""
# ruff: noqa
from __future__ import annotations

from dataclasses import dataclass

from interp_harness import cases, program


@dataclass
class Pt:
    x: int
    y: int


class Circle:
    __match_args__ = ("r",)

    def __init__(self, r):
        self.r = r


@cases((0,), (1,), (5,), ("hi",), (None,), (3.5,))
def match_literals(v):
    match v:
        case 0:
            return "zero"
        case 1 | 2:
            return "small"
        case str():
            return "string"
        case None:
            return "none"
        case int(n) if n > 3:
            return f"big {n}"
        case _:
            return "other"


@cases(([],), ([1],), ([1, 2],), ([1, 2, 3, 4],), ((5, 6),), ("ab",))
def match_sequences(v):
    match v:
        case []:
            return "empty"
        case [x]:
            return ("one", x)
        case [x, y]:
            return ("two", x, y)
        case [first, *rest]:
            return ("many", first, rest)
        case _:
            return "not a sequence"


@cases(({"k": 1},), ({"k": 2, "extra": 3},), ({"type": "p", "v": [1, 2]},), ({},))
def match_mappings(v):
    match v:
        case {"type": "p", "v": [a, b]}:
            return ("p", a + b)
        case {"k": 1}:
            return "k1"
        case {"k": val, **rest}:
            return ("k", val, rest)
        case _:
            return "nomatch"


@cases((Pt(0, 0),), (Pt(1, 0),), (Pt(2, 3),), (Circle(4),), ("x",))
def match_classes(v):
    match v:
        case Pt(x=0, y=0):
            return "origin"
        case Pt(x, 0):
            return f"x-axis {x}"
        case Pt(x=a, y=b):
            return a * b
        case Circle(r):
            return ("circle", r)
        case _:
            return "unknown"


@cases(((1, "a"),), ((2, "b"),), ([3, "c"],))
def match_as_and_guards(v):
    match v:
        case (1, s) as whole:
            return ("one", s, whole)
        case (n, str() as s) if n % 2 == 0:
            return ("even", s)
        case [n, s]:
            return ("list-like", n, s)


@program()
def match_class_too_many_positional():
    match Circle(1):
        case Circle(a, b):
            return a


@program()
def match_args_naming_one_attribute_twice():
    class Twice:
        __match_args__ = ("a", "a")

        def __init__(self):
            self.a = 1

    match Twice():
        case Twice(p, q):
            return (p, q)


@program()
def match_keyword_repeating_a_positional():
    match Circle(2):
        case Circle(r, r=s):
            return (r, s)


@program()
def match_value_patterns():
    import enum

    class Color(enum.Enum):
        RED = 1
        BLUE = 2

    out = []
    for c in (Color.RED, Color.BLUE):
        match c:
            case Color.RED:
                out.append("r")
            case Color.BLUE:
                out.append("b")
    return out
