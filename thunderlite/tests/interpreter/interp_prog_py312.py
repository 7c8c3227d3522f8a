"""Programs needing Python 3.12+: type parameter syntax (PEP 695)."""
# ruff: noqa
from __future__ import annotations

from interp_harness import program


@program()
def generic_function_and_class():
    def first[T](xs: list[T]) -> T:
        return xs[0]

    class Box[U]:
        def __init__(self, v: U):
            self.v = v

        def get(self) -> U:
            return self.v

    return first([3, 4]), Box[int](5).get(), [p.__name__ for p in first.__type_params__], [p.__name__ for p in Box.__type_params__]


@program()
def bounded_and_variadic_type_params():
    def f[T: int, *Ts, **P](x: T) -> T:
        return x

    return f(7), [type(p).__name__ for p in f.__type_params__], f.__type_params__[0].__bound__ is int


@program()
def constrained_type_param():
    def f[S: (int, str)](x: S) -> S:
        return x

    return f("s"), f.__type_params__[0].__constraints__


@program()
def type_alias_statement():
    type Pair[V] = tuple[V, V]
    type IntList = list[int]

    return IntList.__value__, Pair.__name__, [p.__name__ for p in Pair.__type_params__], str(Pair[int])
