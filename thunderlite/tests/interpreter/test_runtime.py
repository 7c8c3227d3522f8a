"""Interpreter runtime behaviour: threads, generators as real generators, caching."""
from __future__ import annotations

import sys
import threading
import types

from thunderlite.interpreter import InterpreterHooks, current_source_location, interpret


class Base:
    def who(self):
        return "base"


class Derived(Base):
    def who(self):
        return "derived+" + super().who()


def busy(n):
    out = []
    for i in range(n):
        try:
            raise KeyError(i)
        except KeyError:
            out.append((Derived().who(), sys.exc_info()[1].args[0], sorted(locals())[:2]))
    return out


def test_threads_do_not_share_frames_or_handled_exceptions():
    results, errors = {}, []

    def work(k):
        try:
            results[k] = interpret(busy)(200)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(results[k] == busy(200) for k in range(4))


def test_generator_is_a_real_generator():
    def gen(n):
        yield from range(n)

    g = interpret(gen)(3)
    assert isinstance(g, types.GeneratorType)
    assert g.__name__ == "gen" and g.__qualname__.endswith("gen")
    assert list(g) == [0, 1, 2]


def test_generator_hooks_fire_while_consumed_natively():
    seen = []

    class H(InterpreterHooks):
        def lookaside(self, fn):
            if fn is len:
                seen.append(current_source_location()[1])
            return None

    def gen(xs):
        for x in xs:
            yield len(x)

    g = interpret(gen, H())(["a", "bb"])
    assert sum(g) == 3
    assert len(seen) == 2


def test_interpreted_function_result_identity():
    obj = object()

    def f(x):
        return x

    assert interpret(f)(obj) is obj


def test_kwargs_and_defaults_through_interpret():
    def f(a, b=2, *args, c, d=4, **kw):
        return a, b, args, c, d, kw

    assert interpret(f)(1, c=3) == f(1, c=3)
    assert interpret(f)(1, 5, 6, 7, c=3, e=9) == f(1, 5, 6, 7, c=3, e=9)


def test_decode_cache_does_not_keep_code_alive():
    import gc

    from thunderlite.interpreter.decode import _CACHE

    gc.collect()
    before = len(_CACHE)
    for i in range(30):
        ns = {}
        exec(f"def f(x):\n    return x + {i}\n", ns)
        assert interpret(ns["f"])(1) == 1 + i
        del ns
    gc.collect()
    assert len(_CACHE) <= before + 1
