"""The dispatch loop, exception routing, and running Python functions as frames."""
from __future__ import annotations

import collections.abc
import types

from .asyncgen import InterpretedAsyncGenerator
from .decode import _CACHE, decode
from .frame import UNBOUND, Frame, thread_state
from .hooks import InterpreterError
from .tracebacks import adds_traceback_entry, record_raise

RETURN = 1  # a handler's result when the frame returned (value in frame.result)
YIELD = 2  # ... when it yielded (value in frame.result)

CO_GENERATOR = 0x20
CO_COROUTINE = 0x80
CO_ITERABLE_COROUTINE = 0x100
CO_ASYNC_GENERATOR = 0x200
CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08
_SUSPENDABLE = CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR


def run_frame(f, exc=None):
    """Run f until it returns or yields; with exc, first raise exc at f's position."""
    instrs = f.dec.instrs
    frames = f.ts.frames
    frames.append(f)
    try:
        if exc is not None:
            record_raise(exc, f)
            if not f.rt.table.unwind(f, exc):
                raise exc
        while True:
            try:
                while True:
                    ins = instrs[f.pc]
                    f.pc += 1
                    r = ins.fn(f, ins)
                    if r is not None:
                        return r
            except InterpreterError as e:
                record_raise(e, f)
                raise
            except BaseException as e:  # user exceptions: route to the frame's handlers
                if adds_traceback_entry(ins):
                    record_raise(e, f)
                if not f.rt.table.unwind(f, e):
                    raise
    finally:
        frames.pop()


def chain_context(ts, exc):
    """Set exc.__context__ to the exception interpreted code is handling, as CPython does."""
    cur = ts.handled
    if cur is None or cur is exc or exc.__context__ is not None:
        return
    # Break cycles: if exc is already in cur's context chain, cut it out.
    o = cur
    while True:
        ctx = o.__context__
        if ctx is None:
            break
        if ctx is exc:
            o.__context__ = None
            break
        o = ctx
    exc.__context__ = cur


def unwind_exception_table(f, exc):
    """3.11+: jump to the handler covering the raising instruction (True) or give up."""
    chain_context(f.ts, exc)
    entry = f.dec.exc_for[f.pc - 1] if f.pc else None
    if entry is None:
        f.ts.handled = f.entry_handled
        return False
    target, depth, lasti = entry
    del f.stack[depth:]
    if lasti:
        f.stack.append(f.pc - 1)
    f.stack.append(exc)
    f.pc = target
    return True


# ----------------------------------------------------------------------------- binding

def _make_binder(code):
    """A native stub with code's signature returning the bound arguments in varnames order.

    Binding natively is fast and gives CPython's exact error messages.
    """
    names = code.co_varnames
    na, npo, nk = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    varargs = bool(code.co_flags & CO_VARARGS)
    varkw = bool(code.co_flags & CO_VARKEYWORDS)
    params = []
    for i, n in enumerate(names[:na]):
        params.append(n)
        if i == npo - 1:
            params.append("/")
    i = na + nk
    if varargs:
        params.append("*" + names[i])
        i += 1
    elif nk:
        params.append("*")
    params.extend(names[na:na + nk])
    if varkw:
        params.append("**" + names[i])
        i += 1
    total = i
    body = ", ".join(names[:total])
    src = f"def _bind({', '.join(params)}):\n    return ({body}{',' if total else ''})\n"
    ns = {}
    exec(src, ns)
    return ns["_bind"], total


def bind(fn, code, dec, args, kwargs):
    """The localsplus list for a call of fn with args/kwargs."""
    n = dec.nlocalsplus
    if not kwargs and len(args) == code.co_argcount and not fn.__defaults__ and not (
        code.co_flags & (CO_VARARGS | CO_VARKEYWORDS)
    ) and not code.co_kwonlyargcount:
        fast = list(args)
    else:
        b = dec.binder
        if b is None:
            b = dec.binder = _make_binder(code)
        binder, _ = b
        if binder.__defaults__ is not fn.__defaults__:
            binder.__defaults__ = fn.__defaults__
        if binder.__kwdefaults__ is not fn.__kwdefaults__:
            binder.__kwdefaults__ = fn.__kwdefaults__
        if binder.__qualname__ != fn.__qualname__:
            binder.__qualname__ = fn.__qualname__
        fast = list(binder(*args, **kwargs) if kwargs else binder(*args))
    fast.extend([UNBOUND] * (n - len(fast)))
    return fast


def call_py(rt, fn, args, kwargs):
    """Interpret a call of the Python function fn."""
    code = fn.__code__
    dec = _CACHE.get(id(code))
    if dec is None:
        dec = decode(code, rt.table)
    if not kwargs and len(args) == dec.simple_argc:
        fast = [*args, *dec.padding]
    else:
        fast = bind(fn, code, dec, args, kwargs)
    f = Frame(rt, dec, fn, fn.__globals__, fn.__builtins__, None, fast, fn.__closure__)
    init = rt.table.init_frame
    if init is not None:
        init(f)
    if dec.suspendable:
        return make_suspendable(f)
    f.entry_handled = f.ts.handled
    run_frame(f)
    return f.result


def run_code(rt, code, globals_, locals_, closure=None, builtins_=None):
    """Interpret a code object with explicit namespaces (class bodies, exec/eval)."""
    dec = decode(code, rt.table)
    if builtins_ is None:
        b = globals_.get("__builtins__", __builtins__)
        builtins_ = b if isinstance(b, dict) else b.__dict__
    fast = [UNBOUND] * dec.nlocalsplus
    f = Frame(rt, dec, None, globals_, builtins_, locals_, fast, closure)
    init = rt.table.init_frame
    if init is not None:
        init(f)
    f.entry_handled = f.ts.handled
    run_frame(f)
    return f.result


# ----------------------------------------------------------------------------- generators

def resume(f, sent, exc):
    """Resume a suspended frame with a sent value or a thrown exception."""
    ts = f.ts = thread_state()
    outer = ts.handled
    if f.saved_handled is not None:
        ts.handled = f.saved_handled
    f.entry_handled = outer
    try:
        d = f.delegate
        f.delegate = None
        if exc is None:
            f.stack.append(sent)
            return run_frame(f)
        if d is not None:
            return _throw_delegate(f, d, exc)
        return _raise_in(f, exc)
    finally:
        cur = ts.handled
        f.saved_handled = cur if cur is not outer else None
        ts.handled = outer


def _throw_delegate(f, d, exc):
    """gen.throw() while f is suspended in ``yield from``/``await`` d, as CPython does."""
    if isinstance(exc, GeneratorExit):
        close = getattr(d, "close", None)
        if close is not None:
            try:
                close()
            except BaseException as e:  # noqa: BLE001 - the close error replaces GeneratorExit
                exc = e
        return _raise_in(f, exc)
    throw = getattr(d, "throw", None)
    if throw is None:
        return _raise_in(f, exc)
    raised = None
    try:
        value = throw(exc)
    except BaseException as e:  # noqa: BLE001 - handled below, outside this except block
        raised = e
    if raised is not None:
        exc = f.rt.table.delegate_raised(f, raised)
        return run_frame(f) if exc is None else _raise_in(f, exc)
    f.delegate = d
    f.result = value
    return YIELD


def _raise_in(f, exc):
    """Raise exc at f's suspension point; like CPython, a None is pushed first."""
    f.stack.append(None)
    return run_frame(f, exc)


def _drive(f):
    """The real generator that drives an interpreted generator frame."""
    sent = None
    exc = None
    while True:
        r = resume(f, sent, exc)
        if r == RETURN:
            return f.result
        try:
            sent = yield f.result
            exc = None
        except BaseException as e:  # noqa: BLE001 - thrown in (throw/close): forward into the frame
            sent = None
            exc = e


# The same driver flagged CO_ITERABLE_COROUTINE, for @types.coroutine generator functions:
# native ``await`` accepts what it returns.
_drive_iterable_coroutine = types.FunctionType(
    _drive.__code__.replace(co_flags=_drive.__code__.co_flags | CO_ITERABLE_COROUTINE), globals(), "_drive"
)


class InterpretedCoroutine:
    """A coroutine object backed by an interpreted frame (awaitable, send/throw/close)."""

    __slots__ = ("_gen", "__name__", "__qualname__")

    def __init__(self, gen, name, qualname):
        self._gen = gen
        self.__name__ = name
        self.__qualname__ = qualname

    def __await__(self):
        return self._gen

    def send(self, value):
        return self._gen.send(value)

    def throw(self, *args):
        return self._gen.throw(*args)

    def close(self):
        return self._gen.close()

    def __repr__(self):
        return f"<interpreted coroutine object {self.__qualname__}>"


def make_suspendable(f):
    """What calling a generator/coroutine function returns: a driver around frame f."""
    code = f.code
    f.delegate = None
    f.saved_handled = None
    f.entry_handled = f.ts.handled
    if f.rt.table.gen_prerun:
        run_frame(f)  # up to RETURN_GENERATOR (cells and free variables set up first)
    gen = (_drive_iterable_coroutine if code.co_flags & CO_ITERABLE_COROUTINE else _drive)(f)
    gen.__name__ = code.co_name
    gen.__qualname__ = f.fn.__qualname__
    if code.co_flags & CO_COROUTINE:
        return InterpretedCoroutine(gen, code.co_name, f.fn.__qualname__)
    if code.co_flags & CO_ASYNC_GENERATOR:
        return InterpretedAsyncGenerator(gen, code.co_name, f.fn.__qualname__)
    return gen


collections.abc.Coroutine.register(InterpretedCoroutine)
