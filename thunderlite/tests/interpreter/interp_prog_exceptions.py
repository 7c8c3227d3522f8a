"""Programs: try/except/else/finally, raise from, chaining, with-statements, sys.exc_info."""
# ruff: noqa
from __future__ import annotations

import sys

from interp_harness import cases, program


@cases((0,), (1,), (2,), (3,))
def try_except_else_finally(mode):
    log = []
    try:
        log.append("try")
        if mode == 1:
            raise ValueError("v")
        if mode == 2:
            raise KeyError("k")
        if mode == 3:
            return log + ["early"]
    except ValueError as e:
        log.append(("value", str(e)))
    except (KeyError, IndexError) as e:
        log.append(("lookup", type(e).__name__))
    else:
        log.append("else")
    finally:
        log.append("finally")
    return log


@program()
def finally_overrides_return():
    def f():
        try:
            return "try"
        finally:
            return "finally"

    return f()


@program()
def finally_runs_on_break_continue():
    log = []
    for i in range(4):
        try:
            if i == 1:
                continue
            if i == 3:
                break
            log.append(i)
        finally:
            log.append("f%d" % i)
    return log


@program()
def nested_try():
    log = []
    try:
        try:
            raise ValueError("inner")
        except KeyError:
            log.append("wrong")
        finally:
            log.append("inner finally")
    except ValueError as e:
        log.append("outer " + str(e))
    return log


@program()
def reraise_bare():
    try:
        try:
            raise TypeError("t")
        except TypeError:
            raise
    except TypeError as e:
        return "reraised " + str(e)


@program()
def raise_from_cause():
    try:
        try:
            1 / 0
        except ZeroDivisionError as e:
            raise ValueError("wrapped") from e
    except ValueError as e:
        return type(e.__cause__).__name__, type(e.__context__).__name__, e.__suppress_context__


@program()
def raise_from_none():
    try:
        try:
            {}["x"]
        except KeyError:
            raise ValueError("clean") from None
    except ValueError as e:
        return e.__cause__, type(e.__context__).__name__, e.__suppress_context__


@program()
def implicit_context_chaining():
    try:
        try:
            raise KeyError("first")
        except KeyError:
            raise ValueError("second")
    except ValueError as e:
        return repr(e.__context__), e.__cause__


@program()
def context_from_native_error():
    try:
        try:
            raise KeyError("first")
        except KeyError:
            [][1]
    except IndexError as e:
        return repr(e.__context__)


@program()
def context_across_calls():
    def fail():
        raise RuntimeError("in callee")

    try:
        try:
            raise KeyError("outer")
        except KeyError:
            fail()
    except RuntimeError as e:
        return repr(e.__context__)


@program()
def exception_variable_cleared():
    try:
        raise ValueError()
    except ValueError as e:
        pass
    try:
        return e
    except NameError as n:
        return "cleared"
    except UnboundLocalError:
        return "cleared-unbound"


@program()
def raise_class_not_instance():
    try:
        raise KeyError
    except KeyError as e:
        return type(e).__name__, e.args


@program()
def raise_non_exception():
    raise 5


@program()
def raise_bare_no_active():
    raise


@program()
def catch_non_exception_class():
    try:
        1 / 0
    except int:
        pass


@program()
def exception_args_and_str():
    e = ValueError("a", 2)
    k = KeyError("key")
    return e.args, str(e), str(k), repr(k), str(OSError(2, "No such file"))


@program()
def exc_info_inside_handler():
    try:
        raise ValueError("info")
    except ValueError:
        t, v, tb = sys.exc_info()
        inside = (t.__name__, str(v), tb is not None)
    after = sys.exc_info()
    return inside, after


@program()
def exc_info_nested_restored():
    try:
        raise KeyError("a")
    except KeyError:
        try:
            raise ValueError("b")
        except ValueError:
            inner = sys.exc_info()[0].__name__
        outer = sys.exc_info()[0].__name__
    return inner, outer, sys.exc_info()[0]


@program()
def exception_in_finally_replaces():
    try:
        try:
            raise KeyError("a")
        finally:
            raise ValueError("b")
    except Exception as e:
        return type(e).__name__, type(e.__context__).__name__


@program()
def exception_from_generator_consumer():
    def gen():
        yield 1
        raise ValueError("gen failed")

    out = []
    try:
        for v in gen():
            out.append(v)
    except ValueError as e:
        out.append(str(e))
    return out


@program()
def try_in_loop_with_return():
    def find(xs, target):
        for i, x in enumerate(xs):
            try:
                if x == target:
                    return i
            finally:
                pass
        return -1

    return find([3, 4, 5], 5), find([], 1)


@program()
def with_statement_exception_propagates():
    class CM:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.seen = exc[0]
            return False

    cm = CM()
    try:
        with cm:
            raise IndexError("idx")
    except IndexError as e:
        return cm.seen.__name__, str(e)


@program()
def with_return_inside():
    log = []

    class CM:
        def __enter__(self):
            log.append("in")

        def __exit__(self, *a):
            log.append("out")

    def f():
        with CM():
            return "ret"

    return f(), log


@program()
def with_contextlib():
    import contextlib

    log = []

    @contextlib.contextmanager
    def managed(name):
        log.append("open " + name)
        try:
            yield name * 2
        finally:
            log.append("close " + name)

    with managed("a") as v:
        log.append(v)
    try:
        with managed("b"):
            raise ValueError("boom")
    except ValueError:
        log.append("caught")
    with contextlib.suppress(KeyError):
        {}["x"]
    return log


@program()
def exitstack_usage():
    import contextlib

    log = []
    with contextlib.ExitStack() as stack:
        for i in range(3):
            stack.callback(log.append, i)
    return log


@program()
def exception_attributes():
    try:
        int("abc")
    except ValueError as e:
        msg = str(e)
    try:
        open("/nonexistent/path/xyz")
    except FileNotFoundError as e:
        errno = e.errno
    return msg, errno


@program()
def deep_exception_propagation():
    def level(n):
        if n == 0:
            raise LookupError("bottom")
        return level(n - 1)

    try:
        level(20)
    except LookupError as e:
        return str(e)


@program()
def exception_swallowed_then_value():
    def safe_div(a, b):
        try:
            return a / b
        except ZeroDivisionError:
            return float("inf")
        finally:
            pass

    return [safe_div(1, x) for x in (1, 0, 4)]


@program()
def exception_escapes_interpreted_function():
    def f(x):
        if x > 2:
            raise OverflowError(f"too big: {x}")
        return x

    return [f(i) for i in range(5)]


@program()
def keyboard_interrupt_like_base_exception():
    class Stop(BaseException):
        pass

    try:
        raise Stop("s")
    except Exception:
        return "wrong"
    except BaseException as e:
        return "base " + str(e)


@program()
def stopiteration_in_generator_becomes_runtime_error():
    def gen():
        yield 1
        raise StopIteration("x")

    return list(gen())


@program()
def recursion_error_caught():
    def r(n):
        return r(n + 1)

    try:
        r(0)
    except RecursionError:
        return "recursion"


@program()
def assertion_error_catch():
    try:
        assert False, "nope"
    except AssertionError as e:
        return str(e)


@program()
def except_order_first_match():
    try:
        raise KeyError("k")
    except LookupError:
        return "lookup"
    except KeyError:
        return "key"


@program()
def exception_in_except_clause_expression():
    def boom():
        raise TypeError("from except expr")

    try:
        try:
            raise ValueError
        except boom():
            pass
    except TypeError as e:
        return str(e)


@program()
def unicode_errors():
    try:
        b"\xff".decode("utf-8")
    except UnicodeDecodeError as e:
        return e.reason, e.start


@program()
def try_finally_in_generator_close():
    log = []

    def gen():
        try:
            yield 1
            yield 2
        finally:
            log.append("cleanup")

    g = gen()
    next(g)
    g.close()
    return log


@program()
def with_missing_exit():
    class OnlyEnter:
        def __enter__(self):
            return 1

    with OnlyEnter():
        pass


@program()
def async_with_missing_aexit():
    import asyncio

    class OnlyAenter:
        async def __aenter__(self):
            return 1

    async def main():
        async with OnlyAenter():
            pass

    return asyncio.run(main())


@program()
def async_with_not_a_manager():
    import asyncio

    async def main():
        async with 5:
            pass

    return asyncio.run(main())
