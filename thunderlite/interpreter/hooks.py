"""The hook protocol the jit subclasses, the MISSING sentinel and InterpreterError."""
from __future__ import annotations


class _Missing:
    __slots__ = ()

    def __repr__(self):
        return "MISSING"

    def __bool__(self):
        return False


MISSING = _Missing()


class InterpreterError(RuntimeError):
    """A limit of the interpreter (unsupported opcode or construct), never a user error.

    The message names the construct and the user's ``file:line``, e.g.
    ``InterpreterError: unsupported opcode SETUP_ANNOTATIONS at /x/prog.py:12``.
    """


class InterpreterHooks:
    """Callbacks the interpreter makes on behalf of user code; the jit subclasses this.

    Every method has a do-nothing default. The interpreter checks which methods are
    overridden (by a subclass or on the instance) and skips the others entirely, so a
    default hook costs nothing.

    - ``lookaside(fn)``: before every call made for user code (CALL, CALL_FUNCTION_EX,
      implicit dunders of heap types such as ``type(a).__mul__``, ``__enter__``,
      ``__iter__``); return a callable to run natively instead of ``fn``, or None.
    - ``load_global``/``load_attr``/``load_subscr``/``load_deref``: see (and may replace)
      values resolved natively; ``load_attr`` gets ``MISSING`` for a failed lookup.
    - ``store_*``/``delete_*``: called before the native write; True means handled.
      ``store_deref``/``delete_deref`` see writes to closure cells (``nonlocal x; x = v``),
      including the frame's own cells (a subclass tells them apart by the cell).
    - ``subscr_key(container, key)``: the key a native ``container[key]`` read, write or
      delete uses (a tracer maps a stand-in value to the object it stands for).
    - ``predicate(value)``: at a conditional jump over a block on a value that is not a
      bool, an object running the block predicated, or None (``predicate.py``).

    Example::

        class Log(InterpreterHooks):
            def load_global(self, globals_dict, name, value):
                print("global", name)
                return value

        interpret(fn, Log())(3)
    """

    def lookaside(self, fn):
        return None

    def load_global(self, globals_dict, name, value):
        return value

    def store_global(self, globals_dict, name, value):
        return False

    def load_attr(self, obj, name, value):
        return value

    def store_attr(self, obj, name, value):
        return False

    def delete_attr(self, obj, name):
        return False

    def subscr_key(self, container, key):
        return key

    def load_subscr(self, container, key, value):
        return value

    def store_subscr(self, container, key, value):
        return False

    def delete_subscr(self, container, key):
        return False

    def load_deref(self, cell, value):
        return value

    def store_deref(self, cell, value):
        return False

    def delete_deref(self, cell):
        return False

    def predicate(self, value):
        """At ``if value:`` on a value that is not a bool: an object running the
        guarded block predicated (interpreter/predicate.py), or None to take
        ``bool(value)``."""
        return None


HOOK_NAMES = (
    "lookaside", "load_global", "store_global", "load_attr", "store_attr", "delete_attr",
    "subscr_key", "load_subscr", "store_subscr", "delete_subscr", "load_deref", "store_deref", "delete_deref",
    "predicate",
)
