"""Programs: generators, send/throw/close, yield from, coroutines."""
# ruff: noqa
from __future__ import annotations

from interp_harness import cases, program


@cases((5,), (0,))
def simple_generator(n):
    def gen(k):
        for i in range(k):
            yield i * i

    return list(gen(n)), sum(gen(n)), [x for x in gen(n) if x % 2]


@program()
def generator_send():
    def acc():
        total = 0
        while True:
            v = yield total
            if v is None:
                break
            total += v
        return total

    g = acc()
    out = [next(g), g.send(3), g.send(4)]
    try:
        g.send(None)
    except StopIteration as e:
        out.append(("stop", e.value))
    return out


@program()
def generator_throw():
    def gen():
        while True:
            try:
                yield "ready"
            except ValueError as e:
                yield "handled " + str(e)

    g = gen()
    return next(g), g.throw(ValueError("x")), next(g)


@program()
def generator_throw_unhandled():
    def gen():
        yield 1

    g = gen()
    next(g)
    try:
        g.throw(KeyError("k"))
    except KeyError as e:
        return "propagated", repr(e)


@program()
def generator_close_runs_finally():
    log = []

    def gen():
        try:
            yield 1
        except GeneratorExit:
            log.append("exit")
            raise
        finally:
            log.append("finally")

    g = gen()
    next(g)
    g.close()
    return log


@program()
def generator_ignores_exit():
    def gen():
        try:
            yield 1
        except GeneratorExit:
            yield 2

    g = gen()
    next(g)
    g.close()


@program()
def generator_return_value():
    def gen():
        yield 1
        return "result"

    g = gen()
    next(g)
    try:
        next(g)
    except StopIteration as e:
        return e.value


@program()
def yield_from_delegation():
    def inner():
        x = yield 1
        y = yield 2
        return (x, y)

    def outer():
        r = yield from inner()
        yield ("inner returned", r)

    g = outer()
    return [next(g), g.send("a"), g.send("b")]


@program()
def yield_from_iterables():
    def gen():
        yield from [1, 2]
        yield from range(3, 5)
        yield from "ab"
        yield from (x * 10 for x in range(2))

    return list(gen())


@program()
def yield_from_throw_forwarded():
    def inner():
        try:
            yield "i1"
        except KeyError:
            yield "inner caught"
        return "inner done"

    def outer():
        r = yield from inner()
        yield r

    g = outer()
    return [next(g), g.throw(KeyError()), next(g)]


@program()
def yield_from_throw_finishes_inner():
    def inner():
        try:
            yield 1
        except ValueError:
            return "returned on throw"

    def outer():
        r = yield from inner()
        yield "outer got " + r

    g = outer()
    next(g)
    return g.throw(ValueError())


@program()
def yield_from_close_inner():
    log = []

    def inner():
        try:
            yield 1
        finally:
            log.append("inner closed")

    def outer():
        try:
            yield from inner()
        finally:
            log.append("outer closed")

    g = outer()
    next(g)
    g.close()
    return log


@program()
def generator_expression_lazy():
    log = []

    def src():
        for i in range(3):
            log.append(i)
            yield i

    g = (x * 2 for x in src())
    first = next(g)
    return first, list(log), list(g), log


@program()
def infinite_generator_islice():
    import itertools

    def naturals():
        n = 0
        while True:
            yield n
            n += 1

    return list(itertools.islice(naturals(), 5)), list(itertools.takewhile(lambda x: x < 4, naturals()))


@program()
def generator_state_attrs():
    def gen():
        yield 1

    g = gen()
    return g.__name__, next(g), list(g)


@program()
def generator_in_zip_enumerate():
    def letters():
        yield from "xyz"

    return list(zip(letters(), range(10))), list(enumerate(letters()))


@program()
def generator_pipeline():
    def read(lines):
        for l in lines:
            yield l.strip()

    def nonempty(it):
        for l in it:
            if l:
                yield l

    def upper(it):
        return (l.upper() for l in it)

    return list(upper(nonempty(read([" a ", "", "b", "  "]))))


@program()
def generator_with_closures():
    def counter_gen(start):
        step = 2

        def bump(v):
            return v + step

        v = start
        for _ in range(3):
            yield v
            v = bump(v)

    return list(counter_gen(5))


@program()
def send_to_just_started():
    def gen():
        yield 1

    g = gen()
    g.send(5)


@program()
def generator_reentrancy_error():
    def gen():
        yield next(g)

    g = gen()
    return next(g)


@program()
def coroutine_send_drive():
    async def add(a, b):
        return a + b

    async def main():
        x = await add(1, 2)
        y = await add(x, 10)
        return y

    c = main()
    try:
        c.send(None)
    except StopIteration as e:
        return e.value


@program()
def coroutine_asyncio_run():
    import asyncio

    async def work(n):
        await asyncio.sleep(0)
        return n * 2

    async def main():
        results = []
        for i in range(3):
            results.append(await work(i))
        return results

    return asyncio.run(main())


@program()
def coroutine_asyncio_gather():
    import asyncio

    async def work(n):
        await asyncio.sleep(0)
        return n + 100

    async def main():
        return await asyncio.gather(work(1), work(2))

    return asyncio.run(main())


@program()
def coroutine_exception():
    import asyncio

    async def bad():
        raise ValueError("async fail")

    async def main():
        try:
            await bad()
        except ValueError as e:
            return "caught " + str(e)

    return asyncio.run(main())


@program()
def async_with_statement():
    import asyncio

    log = []

    class ACM:
        async def __aenter__(self):
            log.append("enter")
            return "res"

        async def __aexit__(self, *a):
            log.append("exit")
            return False

    async def main():
        async with ACM() as r:
            log.append(r)
        return log

    return asyncio.run(main())


@program()
def async_for_statement():
    import asyncio

    class Ticker:
        def __init__(self, n):
            self.n = n

        def __aiter__(self):
            return self

        async def __anext__(self):
            if self.n == 0:
                raise StopAsyncIteration
            self.n -= 1
            return self.n

    async def main():
        out = []
        async for v in Ticker(3):
            out.append(v)
        return out

    return asyncio.run(main())


@program()
def awaitable_class():
    import asyncio

    class Aw:
        def __await__(self):
            yield from asyncio.sleep(0).__await__()
            return "awaited"

    async def main():
        return await Aw()

    return asyncio.run(main())


@program()
def async_generator_basic():
    import asyncio

    async def agen(n):
        for i in range(n):
            await asyncio.sleep(0)
            yield i * 3

    async def main():
        out = [v async for v in agen(4)]
        async for v in agen(2):
            out.append(-v)
        return out

    return asyncio.run(main())


@program()
def async_generator_asend_athrow():
    import asyncio

    async def agen():
        total = 0
        while True:
            try:
                v = yield total
            except KeyError:
                yield "caught"
                return
            total += v or 0

    async def main():
        g = agen()
        out = [await g.__anext__(), await g.asend(5), await g.asend(6), await g.athrow(KeyError)]
        try:
            await g.__anext__()
        except StopAsyncIteration:
            out.append("stop")
        return out

    return asyncio.run(main())


@program()
def async_generator_aclose_finally():
    import asyncio

    log = []

    async def agen():
        try:
            yield 1
            yield 2
        finally:
            log.append("closed")

    async def main():
        g = agen()
        first = await g.__anext__()
        await g.aclose()
        return first, log

    return asyncio.run(main())


@program()
def async_comprehensions():
    import asyncio

    async def double(x):
        await asyncio.sleep(0)
        return x * 2

    async def main():
        return [await double(i) for i in range(3)], {i: await double(i) for i in range(2)}

    return asyncio.run(main())


@program()
def exc_info_preserved_across_yield():
    import sys

    def gen():
        try:
            raise KeyError("k")
        except KeyError:
            yield sys.exc_info()[0]
            yield sys.exc_info()[0]
        yield sys.exc_info()[0]

    g = gen()
    a = next(g)
    outside = sys.exc_info()[0]
    b = next(g)
    c = next(g)
    return a, outside, b, c


@program()
def three_level_delegation_throw():
    log = []

    def leaf():
        try:
            yield "leaf"
        except ValueError as e:
            log.append("leaf caught " + str(e))
            yield "leaf recovered"
        return "leaf done"

    def middle():
        r = yield from leaf()
        log.append(r)
        return "middle done"

    def top():
        r = yield from middle()
        yield r

    g = top()
    out = [next(g), g.throw(ValueError("x")), next(g)]
    return out, log


@program()
def yield_in_finally():
    def gen():
        try:
            yield 1
        finally:
            yield "cleanup"

    return list(gen())


@program()
def throw_into_with_in_generator():
    log = []

    class CM:
        def __enter__(self):
            return self

        def __exit__(self, t, v, tb):
            log.append(t.__name__ if t else None)
            return t is KeyError

    def gen():
        with CM():
            yield 1
        yield "after with"

    g = gen()
    next(g)
    return g.throw(KeyError("swallowed")), log


@program()
def generator_return_in_finally_on_close():
    def gen():
        try:
            yield 1
        finally:
            return "ignored"

    g = gen()
    next(g)
    g.close()
    return "closed"


@program()
def await_in_except_block():
    import asyncio

    async def helper():
        await asyncio.sleep(0)
        return "helped"

    async def main():
        try:
            raise KeyError("k")
        except KeyError:
            r = await helper()
            return r, type(__import__("sys").exc_info()[1]).__name__

    return asyncio.run(main())


@program()
def generator_send_into_yield_from_native_generator():
    def inner():
        total = 0
        while True:
            v = yield total
            if v is None:
                return total
            total += v

    def outer():
        result = yield from inner()
        yield ("result", result)

    g = outer()
    next(g)
    g.send(2)
    g.send(3)
    return next(g)


@program()
def generator_expression_in_call_with_exception():
    def bad(x):
        if x == 2:
            raise ValueError("bad 2")
        return x

    try:
        return sum(bad(x) for x in range(4))
    except ValueError as e:
        return str(e)
