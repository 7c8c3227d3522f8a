"""Tensor factories and random ops. Factories read the default dtype at trace
time (``get_factory_defaults``); the jit guards on it."""
from __future__ import annotations

import math

import torch

from thunderlite.core import devices, dtypes, prims
from thunderlite.core.prims import check
from thunderlite.core.symint import is_int as _is_int
from thunderlite.core.tags import Tag
from thunderlite.torch.ops import elementwise as ew
from thunderlite.torch.ops.numbers import is_traced, python_type
from thunderlite.torch.ops.shapes import _shape_arg
from thunderlite.torch.registry import decomposable, torchsymbol
from thunderlite.torch.utils import convert, expand_to, is_tensor

T = torch.Tensor
RANDOM = {Tag.RANDOM}


def get_factory_defaults() -> tuple[torch.dtype, torch.device]:
    """(default dtype, default device) factories use; part of the jit's guard."""
    return torch.get_default_dtype(), torch.device("cpu")


def _dtype(dtype, fill=None) -> torch.dtype:
    """``dtype``, or the one torch infers from the fill value's Python type
    (a traced number's type is the one it stands for)."""
    if dtype is not None:
        return dtype
    pt = python_type(fill)
    if pt is bool:
        return torch.bool
    if pt is int:
        return torch.int64
    if pt is complex:
        return dtypes.to_complex(torch.get_default_dtype())
    return torch.get_default_dtype()


def _device(device):
    return devices.to_device(device) if device is not None else get_factory_defaults()[1]


@torchsymbol(torch.full)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    return prims.full(tuple(size), fill_value, device=_device(device), dtype=_dtype(dtype, fill_value))


@torchsymbol(torch.zeros)
def zeros(*size, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    dt = _dtype(dtype)
    return prims.full(_shape_arg(size), False if dt is torch.bool else 0, device=_device(device), dtype=dt)


@torchsymbol(torch.ones)
def ones(*size, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    dt = _dtype(dtype)
    return prims.full(_shape_arg(size), True if dt is torch.bool else 1, device=_device(device), dtype=dt)


@torchsymbol(torch.empty)
def empty(*size, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False,
          memory_format=None):
    return prims.empty(_shape_arg(size), device=_device(device), dtype=_dtype(dtype))


@torchsymbol(torch.empty_permuted)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=False,
                   requires_grad=False):
    """Strides are not part of a proxy: uninitialized memory of the logical shape."""
    return prims.empty(_shape_arg((size,)), device=_device(device), dtype=_dtype(dtype))


@torchsymbol(torch.empty_strided)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    return prims.empty(_shape_arg((size,)), device=_device(device), dtype=_dtype(dtype))


def _like(a, dtype, device):
    return (a.dtype if dtype is None else dtype), (a.device if device is None else devices.to_device(device))


def _zero_of(dt):
    return False if dt is torch.bool else 0


@torchsymbol(torch.full_like)
def full_like(input, fill_value, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False,
              memory_format=None):
    dt, dev = _like(input, dtype, device)
    return prims.full(input.shape, fill_value, device=dev, dtype=dt)


@torchsymbol(torch.zeros_like)
def zeros_like(input, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False,
               memory_format=None):
    dt, dev = _like(input, dtype, device)
    return prims.full(input.shape, _zero_of(dt), device=dev, dtype=dt)


@torchsymbol(torch.ones_like)
def ones_like(input, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False,
              memory_format=None):
    dt, dev = _like(input, dtype, device)
    return prims.full(input.shape, True if dt is torch.bool else 1, device=dev, dtype=dt)


@torchsymbol(torch.empty_like)
def empty_like(input, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False,
               memory_format=None):
    dt, dev = _like(input, dtype, device)
    return prims.empty(input.shape, device=dev, dtype=dt)


@torchsymbol(T.new_full, method_name="new_full")
def new_full(a, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    dt, dev = _like(a, dtype, device)
    return prims.full(tuple(size), fill_value, device=dev, dtype=dt)


@torchsymbol(T.new_zeros, method_name="new_zeros")
def new_zeros(a, *size, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    dt, dev = _like(a, dtype, device)
    return prims.full(_shape_arg(size), _zero_of(dt), device=dev, dtype=dt)


@torchsymbol(T.new_ones, method_name="new_ones")
def new_ones(a, *size, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    dt, dev = _like(a, dtype, device)
    return prims.full(_shape_arg(size), True if dt is torch.bool else 1, device=dev, dtype=dt)


@torchsymbol(T.new_empty, method_name="new_empty")
def new_empty(a, *size, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    dt, dev = _like(a, dtype, device)
    return prims.empty(_shape_arg(size), device=dev, dtype=dt)


@torchsymbol(torch.arange)
def arange(start, end=None, step=1, *, dtype=None, layout=None, device=None, pin_memory=False,
           requires_grad=False):
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = torch.int64 if all(_is_int(x) for x in (start, end, step)) else torch.get_default_dtype()
    check(step != 0, lambda: "step must be nonzero")
    if all(_is_int(x) for x in (start, end, step)):
        length = max(-((start - end) // step), 0)      # ceil division, exact for symbolic sizes
    else:
        length = max(math.ceil((end - start) / step), 0)
    if dtypes.is_integer(dtype) and not all(_is_int(x) for x in (start, end, step)):
        vals = prims.iota(length, start=0, step=1, device=_device(device), dtype=torch.float64)
        return convert(ew.add(ew.mul(vals, float(step)), float(start)), dtype)
    return prims.iota(length, start=start, step=step, device=_device(device), dtype=dtype)


@torchsymbol(torch.linspace)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    dtype = torch.get_default_dtype() if dtype is None else dtype
    compute = torch.float64 if not dtypes.is_complex(dtype) else torch.complex128
    idx = prims.iota(steps, start=0, step=1, device=_device(device), dtype=compute)
    if steps <= 1:
        return convert(ew.add(ew.mul(idx, 0.0), start), dtype)
    step = (end - start) / (steps - 1)
    half = steps // 2
    lo = ew.add(ew.mul(idx, step), start)
    hi = ew.sub(end, ew.mul(ew.sub(steps - 1, idx), step))
    return convert(ew.where(ew.lt(idx, half), lo, hi), dtype)


@torchsymbol(torch.logspace)
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=False,
             requires_grad=False):
    decomposable(not is_tensor(start) and not is_tensor(end), lambda: "logspace with tensor bounds")
    dtype = torch.get_default_dtype() if dtype is None else dtype
    exponents = linspace(start, end, steps, dtype=torch.float64, device=device)
    return convert(ew.pow(float(base), exponents), dtype)


@torchsymbol(torch.eye)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    m = n if m is None else m
    dt = _dtype(dtype)
    r = prims.broadcast_in_dim(prims.iota(n, start=0, step=1, device=_device(device), dtype=torch.int64), (n, m), (0,))
    c = prims.broadcast_in_dim(prims.iota(m, start=0, step=1, device=_device(device), dtype=torch.int64), (n, m), (1,))
    return convert(ew.eq(r, c), dt)


@torchsymbol(torch.scalar_tensor)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    return prims.full((), s, device=_device(device), dtype=dtype if dtype is not None else torch.get_default_dtype())


# --- random ----------------------------------------------------------------------------------

@torchsymbol(torch.rand, tags=RANDOM)
def rand(*size, generator=None, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    return prims.uniform(_shape_arg(size), 0.0, 1.0, device=_device(device), dtype=_dtype(dtype), generator=generator)


@torchsymbol(torch.randn, tags=RANDOM)
def randn(*size, generator=None, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    return prims.normal(_shape_arg(size), 0.0, 1.0, device=_device(device), dtype=_dtype(dtype), generator=generator)


@torchsymbol(torch.rand_like, tags=RANDOM)
def rand_like(input, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False,
              memory_format=None):
    dt, dev = _like(input, dtype, device)
    return prims.uniform(input.shape, 0.0, 1.0, device=dev, dtype=dt)


@torchsymbol(torch.randn_like, tags=RANDOM)
def randn_like(input, *, dtype=None, layout=None, device=None, pin_memory=False, requires_grad=False,
               memory_format=None):
    dt, dev = _like(input, dtype, device)
    return prims.normal(input.shape, 0.0, 1.0, device=dev, dtype=dt)


@torchsymbol(torch.bernoulli, T.bernoulli, method_name="bernoulli", tags=RANDOM)
def bernoulli(input, p=None, *, generator=None):
    probs = input if p is None else p
    if is_tensor(probs):
        probs = convert(expand_to(probs, input.shape), input.dtype)
    return prims.bernoulli(input.shape, probs, device=input.device, dtype=input.dtype, generator=generator)


@torchsymbol(torch.tensor)
def tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    if isinstance(data, (list, tuple)):
        return _tensor_of_numbers(data, dtype, _device(device))
    decomposable(python_type(data) is not None,
                 lambda: f"torch.tensor of a {type(data).__name__} is not decomposed")
    return prims.full((), data, device=_device(device), dtype=_dtype(dtype, data))


def _tensor_of_numbers(data, dtype, device):
    """``torch.tensor`` of a nested list holding traced numbers (``[a.item(), 2.0]``):
    one ``full`` per number, concatenated. Without any, the jit traces the list
    as a constant (one opaque call)."""
    shape, leaves = _nested(data)
    decomposable(shape is not None and any(is_traced(v) for v in leaves),
                 lambda: "torch.tensor of a nested sequence is traced as a constant by the jit, not decomposed")
    dt = dtype if dtype is not None else dtypes.result_type(*leaves) if leaves else torch.get_default_dtype()
    if not leaves:
        return prims.full(shape, 0, device=device, dtype=dt)
    flat = prims.cat([prims.full((1,), v, device=device, dtype=dt) for v in leaves], 0)
    return prims.reshape(flat, shape)


def _nested(data) -> tuple[tuple | None, list]:
    """(shape, numbers in row-major order) of a rectangular nested list of
    numbers; shape None when it is not one."""
    if not isinstance(data, (list, tuple)):
        return ((), [data]) if python_type(data) is not None else (None, [])
    parts = [_nested(d) for d in data]
    shapes_ = {p[0] for p in parts}
    if len(shapes_) > 1 or None in shapes_:
        return None, []
    inner = parts[0][0] if parts else ()
    return (len(data), *inner), [v for _, leaves in parts for v in leaves]
