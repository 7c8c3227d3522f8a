"""Proxies: named stand-ins for runtime values while a program is traced.

A ``TensorProxy`` carries what shape/dtype inference needs (shape, dtype,
device, requires_grad) and nothing that changes per call. Tensor methods and
Python operators on proxies are resolved through ``method_table``, which the
torch language layer fills: core cannot import that layer (docs/architecture.md §2).

Example::

    >>> with tracectx(Trace()) as trc:
    ...     a = TensorProxy(shape=(2, 3), dtype=torch.float32)
    ...     b = a + 1           # looked up in method_table['__add__']
    >>> str(trc)                # prints the recorded program
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core import devices, dtypes
from thunderlite.core.tracectx import current_trace

# name -> callable(proxy, *args, **kwargs); filled by thunderlite.torch.
method_table: dict[str, Callable] = {}
# attribute name -> callable(proxy); properties such as .T, .mT, .real.
property_table: dict[str, Callable] = {}


def register_method(name: str, fn: Callable) -> None:
    if name in method_table:
        raise ValueError(f"tensor method {name!r} is already registered")
    method_table[name] = fn


# Called for torch functions applied to proxies outside the jit's lookaside
# (e.g. a torch function invoked natively, or a trace built by hand):
# ``handler(func, args, kwargs)``. Set once by thunderlite.torch.
torch_function_handler: list = [None]


# ``fallback(proxy, name) -> value | None``: Tensor attributes the tables lack
# (the torch language answers with an opaque op for real torch.Tensor methods).
attribute_fallback: list = [None]


def set_attribute_fallback(fn: Callable) -> None:
    if attribute_fallback[0] is not None and attribute_fallback[0] is not fn:
        raise ValueError("a tensor attribute fallback is already set")
    attribute_fallback[0] = fn


def set_torch_function_handler(fn: Callable) -> None:
    if torch_function_handler[0] is not None and torch_function_handler[0] is not fn:
        raise ValueError("a torch function handler is already set")
    torch_function_handler[0] = fn


def register_property(name: str, fn: Callable) -> None:
    if name in property_table:
        raise ValueError(f"tensor property {name!r} is already registered")
    property_table[name] = fn


class Proxy:
    """A named value in a trace. Names are unique within a trace family."""
    __slots__ = ("name",)

    def __init__(self, name: str | None = None, prefix: str = "p"):
        self.name = name if name is not None else _fresh_name(prefix)

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}>"

    def type_string(self) -> str:
        return type(self).__name__


def _fresh_name(prefix: str) -> str:
    trc = current_trace()
    if trc is None:
        raise RuntimeError("a proxy needs a name or an active trace to name it")
    return trc.fresh_name(prefix)


class NumberProxy(Proxy):
    """A Python number the trace keeps symbolic (an int, float, bool or complex).

    ``value`` is the value seen while tracing (None for a number made while the
    program runs: ``item()``, arithmetic on traced numbers); it is what guards
    compare against when the jit chooses to specialize.

    Python's number protocol on it (``n + 1``, ``n < 2``, ``-n``, ``round(n)``...)
    records the operation through ``number_ops``, which the torch language fills
    (torch/ops/numbers.py): core cannot import that layer. What needs the value
    (``bool(n)``, ``int(n)`` from C code, ``n.is_integer()``) raises ``DataDependentError``. ``==``
    and ``!=`` natively compare identity with other proxies (proxies are records
    passes keep in lists and dicts) and raise with a Python number: library code
    deciding ``alpha == 1`` on a traced number would silently take one branch.
    Interpreted user code gets the traced comparison (frontend/lookasides.py)::

        >>> with tracectx(trc):
        ...     n = ltorch.item(t)          # NumberProxy n0 (a float)
        ...     m = n * 2 + 1               # n1 = number_mul(n0, 2); n2 = number_add(n1, 1)
    """
    __slots__ = ("python_type", "value")

    def __init__(self, value: Any = None, python_type: type | None = None, name: str | None = None):
        super().__init__(name, "n" if python_type is not bool else "b")
        self.value = value
        self.python_type = python_type if python_type is not None else type(value)

    def type_string(self) -> str:
        return self.python_type.__name__

    def __repr__(self):
        return f"<NumberProxy {self.name}: {self.python_type.__name__}>"

    def __str__(self):
        return repr(self)

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __eq__(self, other):
        if other is self:
            return True
        if _is_python_number(other):
            raise _undecided(self, "==", other)
        return NotImplemented

    def __ne__(self, other):
        if other is self:
            return False
        if _is_python_number(other):
            raise _undecided(self, "!=", other)
        return NotImplemented

    __hash__ = object.__hash__


def _undecided(n: NumberProxy, op: str, other) -> DataDependentError:
    return DataDependentError(f"deciding {n.name} {op} {other!r} needs the value of the traced number {n.name}, "
                              "which is not known while tracing; thunderlite cannot branch on it")


def _is_python_number(x) -> bool:
    return isinstance(x, (int, float, complex)) and not isinstance(x, Proxy)


def _number_op(name: str, *args):
    fn = number_ops.get(name)
    if fn is None:
        raise TypeError(f"traced numbers have no {name!r} operation without the torch language "
                        "(import thunderlite.torch)")
    return fn(*args)


# name -> callable(*operands): Python's number protocol on traced numbers
# (``"add"``, ``"lt"``, ``"neg"``, ``"floor"``, ``"bool"``...), filled by the torch
# language (torch/ops/numbers.py), which records each operation.
number_ops: dict[str, Callable] = {}


def _install_number_operator(dunder: str, name: str, reflected: bool = False) -> None:
    if reflected:
        def op(self, other):
            return _number_op(name, other, self)
    else:
        def op(self, *args):
            return _number_op(name, self, *args)
    op.__name__ = dunder
    op.__qualname__ = f"NumberProxy.{dunder}"
    setattr(NumberProxy, dunder, op)


_NUMBER_BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift",
                  "rshift", "divmod")
for _name in _NUMBER_BINARY:
    _install_number_operator(f"__{_name}__", _name)
    _install_number_operator(f"__r{_name}__", _name, reflected=True)
for _name in ("lt", "le", "gt", "ge", "neg", "pos", "abs", "invert", "round", "trunc", "floor", "ceil"):
    _install_number_operator(f"__{_name}__", _name)


def _value_needed(n: NumberProxy, what: str) -> DataDependentError:
    """``what`` needs ``n``'s value: the error names how the trace made ``n``
    (``describe`` of the torch language: ``n0 > 3``, with where ``n0`` came from)."""
    describe = number_ops.get("describe")
    made = describe(n) if describe is not None else n.name
    return DataDependentError(f"the traced number {made} is not known while tracing, but {what} needs its value; "
                              "thunderlite cannot branch on it")


def _install_value_needed(dunder: str, what: str) -> None:
    def op(self):
        raise _value_needed(self, what)
    op.__name__ = dunder
    op.__qualname__ = f"NumberProxy.{dunder}"
    setattr(NumberProxy, dunder, op)


for _dunder, _what in (("__bool__", "its truth value (if, while, and/or/not, bool())"), ("__int__", "int()"),
                       ("__float__", "float()"), ("__complex__", "complex()"),
                       ("__index__", "using it as an index or int"),
                       # float's and int's methods whose answer is the value's (a bool, a pair of ints, a string)
                       ("is_integer", ".is_integer()"), ("as_integer_ratio", ".as_integer_ratio()"),
                       ("hex", ".hex()")):
    _install_value_needed(_dunder, _what)


class TensorProxy(Proxy):
    """A tensor while tracing. ``shape`` is a tuple of ints; ``dtype`` a torch.dtype;
    ``device`` a torch.device. ``memory`` is where a pass wants the tensor
    allocated (None: ordinary memory), docs/architecture.md §6."""
    __slots__ = ("shape", "dtype", "device", "requires_grad", "memory", "__weakref__")

    def __init__(self, shape=(), dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 requires_grad: bool = False, name: str | None = None, memory: str | None = None):
        super().__init__(name, "t")
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = devices.to_device(device)
        self.requires_grad = requires_grad and (dtypes.is_inexact(dtype))
        self.memory = memory

    # --- metadata, mirroring torch.Tensor -------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    ndimension = dim

    def size(self, dim: int | None = None):
        if dim is None:
            # torch.Size holds only ints: a symbolic size stays symbolic in a tuple
            return torch.Size(self.shape) if all(type(s) is int for s in self.shape) else self.shape
        return self.shape[dim]

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    nelement = numel

    @property
    def nbytes(self) -> int:
        """Bytes of a dense tensor of this shape and dtype, as ``torch.Tensor.nbytes``."""
        return self.numel() * self.dtype.itemsize

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype, device="meta").element_size()

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self.device.type == "cpu"

    @property
    def is_meta(self) -> bool:
        return self.device.type == "meta"

    def is_floating_point(self) -> bool:
        return dtypes.is_float(self.dtype)

    def is_complex(self) -> bool:
        return dtypes.is_complex(self.dtype)

    @property
    def layout(self):
        return torch.strided

    @property
    def is_sparse(self) -> bool:
        return False

    @property
    def is_quantized(self) -> bool:
        return False

    @property
    def is_nested(self) -> bool:
        return False

    def type_string(self) -> str:
        dims = ", ".join(str(s) for s in self.shape)
        where = f" in {self.memory}" if self.memory else ""
        return f"{devices.short_name(self.device)} {dtypes.short_name(self.dtype)}[{dims}]{where}"

    def __repr__(self):
        return f"<TensorProxy {self.name}: {self.type_string()}>"

    def __str__(self):
        return repr(self)

    def __format__(self, spec: str) -> str:
        # a traced program's own str()/format()/f-string of a tensor reads its values:
        # the jit looks these up aside (frontend/lookasides.py); thunderlite's code gets the name
        return format(repr(self), spec)

    def replace(self, **changes) -> TensorProxy:
        """A proxy with the same metadata except ``changes`` (a fresh name unless given)."""
        kw = dict(shape=self.shape, dtype=self.dtype, device=self.device,
                  requires_grad=self.requires_grad, memory=self.memory)
        kw.update(changes)
        return TensorProxy(**kw)

    # --- everything else goes through the torch language ------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        handler = torch_function_handler[0]
        if handler is None:
            return NotImplemented
        return handler(func, args, kwargs or {})

    def __getattr__(self, name: str):
        prop = property_table.get(name)
        if prop is not None:
            return prop(self)
        method = method_table.get(name)
        if method is not None:
            return _BoundMethod(method, self)
        fallback = attribute_fallback[0]
        if fallback is not None and not name.startswith("__"):
            value = fallback(self, name)
            if value is not None:
                return value
        raise AttributeError(f"'Tensor' object has no attribute or method {name!r} "
                             f"that thunderlite can trace")

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        return iter(method_table["unbind"](self, 0))

    def __bool__(self):
        raise _data_dependent("bool(tensor)")

    def __int__(self):
        raise _data_dependent("int(tensor)")

    def __float__(self):
        raise _data_dependent("float(tensor)")

    def __index__(self):
        raise _data_dependent("using a tensor as an index")

    __hash__ = object.__hash__


def _data_dependent(what: str) -> Exception:
    return DataDependentError(f"{what} depends on a tensor's values, which are not known while "
                              "tracing; thunderlite cannot follow data-dependent control flow")


class DataDependentError(RuntimeError):
    """Control flow or a Python value depends on a tensor's data."""


class _BoundMethod:
    __slots__ = ("fn", "proxy")

    def __init__(self, fn, proxy):
        self.fn = fn
        self.proxy = proxy

    def __call__(self, *args, **kwargs):
        return self.fn(self.proxy, *args, **kwargs)

    def __repr__(self):
        return f"<traced method {getattr(self.fn, '__name__', self.fn)} of {self.proxy.name}>"


def _install_operator(name: str) -> None:
    def op(self, *args):
        fn = method_table.get(name)
        if fn is None:
            return NotImplemented
        return fn(self, *args)
    op.__name__ = name
    setattr(TensorProxy, name, op)


_OPERATORS = [
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
    "__rpow__", "__matmul__", "__rmatmul__", "__and__", "__rand__", "__or__", "__ror__",
    "__xor__", "__rxor__", "__lshift__", "__rlshift__", "__rshift__", "__rrshift__",
    "__neg__", "__pos__", "__abs__", "__invert__", "__eq__", "__ne__", "__lt__", "__le__",
    "__gt__", "__ge__", "__getitem__", "__setitem__", "__iadd__", "__isub__", "__imul__",
    "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__",
    "__ixor__", "__ilshift__", "__irshift__", "__imatmul__",
]
for _name in _OPERATORS:
    _install_operator(_name)


def proxy_of_tensor(t: torch.Tensor, name: str | None = None) -> TensorProxy:
    """The proxy standing for a concrete tensor (metadata copied, data not)."""
    return TensorProxy(shape=tuple(t.shape), dtype=t.dtype, device=t.device,
                       requires_grad=t.requires_grad, name=name)
