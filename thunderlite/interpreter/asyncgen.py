"""Async generator objects backed by an interpreted frame.

The frame's driver (a plain generator) yields two kinds of values: ``Wrapped`` ones
(the async generator's own ``yield``, wrapped by ASYNC_GEN_WRAP) and raw ones (an
``await`` inside it, passed through to the event loop). Each ``__anext__``/``asend``/
``athrow``/``aclose`` returns an awaitable step that unwraps the first kind.
"""
from __future__ import annotations

import collections.abc


class Wrapped:
    """A value yielded by an async generator (as opposed to one passed up by await)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


_SEND, _THROW, _CLOSE = 0, 1, 2


class AsyncGenStep:
    """The awaitable of one asend/athrow/aclose on an InterpretedAsyncGenerator."""

    __slots__ = ("agen", "mode", "arg", "started")

    def __init__(self, agen, mode, arg):
        self.agen = agen
        self.mode = mode
        self.arg = arg
        self.started = False

    def __await__(self):
        return self

    def __iter__(self):
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        gen = self.agen.gen
        if not self.started:
            self.started = True
            if self.mode == _SEND:
                return self._step(gen.send, self.arg)
            return self._step(gen.throw, self.arg)
        return self._step(gen.send, value)

    def throw(self, *exc):
        return self._step(self.agen.gen.throw, exc[0] if len(exc) == 1 else exc[1] or exc[0]())

    def close(self):
        pass

    def _step(self, fn, arg):
        finished = False
        closed_ok = False
        try:
            r = fn(arg)
        except StopIteration:
            finished = True
        except GeneratorExit:
            if self.mode != _CLOSE:
                raise
            closed_ok = True
        if finished or closed_ok:
            if self.mode == _CLOSE:
                raise StopIteration(None)
            raise StopAsyncIteration
        if type(r) is Wrapped:
            if self.mode == _CLOSE:
                raise RuntimeError("async generator ignored GeneratorExit")
            raise StopIteration(r.value)
        return r


class InterpretedAsyncGenerator:
    """An async generator object whose body runs in the interpreter."""

    __slots__ = ("gen", "__name__", "__qualname__")

    def __init__(self, gen, name, qualname):
        self.gen = gen
        self.__name__ = name
        self.__qualname__ = qualname

    def __aiter__(self):
        return self

    def __anext__(self):
        return AsyncGenStep(self, _SEND, None)

    def asend(self, value):
        return AsyncGenStep(self, _SEND, value)

    def athrow(self, typ, val=None, tb=None):
        exc = typ if isinstance(typ, BaseException) else (typ(val) if val is not None else typ())
        return AsyncGenStep(self, _THROW, exc)

    def aclose(self):
        return AsyncGenStep(self, _CLOSE, GeneratorExit())

    def __repr__(self):
        return f"<interpreted async_generator object {self.__qualname__}>"


collections.abc.AsyncGenerator.register(InterpretedAsyncGenerator)
