"""Custom ops known to compute what a torch function computes (docs/architecture.md §5).

Libraries hide a loop behind a ``torch.library`` custom op where
``torch.compile`` cannot take the torch function, and choose between the two
with ``torch.compiler.is_compiling()``. The jit answers that question True
(frontend/lookasides.py: such code must take its traceable branch), so it
records the custom op where eager calls the torch function's one kernel.
This table names such pairs: a call of the custom op whose inputs the torch
function accepts (the eager branch would take it) records the torch
function's symbol instead; any other call records the custom op itself.

``transformers::grouped_mm_fallback(input, weight, offs)``: transformers'
mixture-of-experts loop of ``torch.mm`` into a zero-filled output, taken under
compilation only; eager (``_can_use_grouped_mm``) calls
``torch.nn.functional.grouped_mm(input, weight, offs=offs)`` on the CPU
whenever the kernel exists, and on CUDA from compute capability 8.0. The
two agree on every row below ``offs[-1]``; the loop writes zeros past it,
the kernel leaves those rows unset, and transformers masks them either way.
The kernel's refusals are the loop's cases: other dtypes, other devices,
operands whose rows are not 16-byte multiples.

Example::

    # inside a jitted Mixtral forward, transformers calls
    torch.ops.transformers.grouped_mm_fallback(x, w, offs=offs)
    # and the trace records ltorch.grouped_mm(x, w, offs)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symint import statically_known


@dataclass(frozen=True)
class Equivalent:
    """``accepts(*args)``: the torch function takes these (schema-ordered)
    arguments as the custom op's eager branch would; ``call(fn, *args)``
    records ``fn`` (the torch function's symbol) on them."""
    torch_fns: tuple[str, ...]
    accepts: Callable[..., bool]
    call: Callable[..., object]


_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _aligned(size, dtype: torch.dtype) -> bool:
    """A row of ``size`` elements is a multiple of 16 bytes (the kernel's rule
    for its operands' strides), known without a guard."""
    return statically_known(size * dtype.itemsize % 16, "==", 0) is True


def _kernel_device(device: torch.device) -> bool:
    if device.type == "cpu":
        return True
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def _grouped_mm_accepts(input, weight, offs) -> bool:
    if not all(type(t) is TensorProxy for t in (input, weight, offs)):
        return False
    return (input.ndim == 2 and weight.ndim == 3 and offs.ndim == 1 and offs.dtype is torch.int32
            and input.dtype == weight.dtype and input.dtype in _KERNEL_DTYPES
            and input.device == weight.device == offs.device and _kernel_device(input.device)
            and all(_aligned(n, input.dtype) for n in (input.shape[1], weight.shape[1], weight.shape[2])))


_TABLE: dict[str, Equivalent] = {
    "transformers::grouped_mm_fallback": Equivalent(
        ("torch.nn.functional.grouped_mm", "torch._grouped_mm"), _grouped_mm_accepts,
        lambda fn, input, weight, offs: fn(input, weight, offs=offs)),
}


def _resolve(path: str):
    obj = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def with_equivalent(qualname: str, names: list[str], defaults: dict, record: Callable,
                    symbol_for: Callable) -> Callable:
    """``record`` (the custom op's recorder), or one that records the torch
    function's symbol for the calls it accepts. ``names``/``defaults``: the
    op's schema arguments; ``symbol_for``: torch callable -> its symbol."""
    entry = _TABLE.get(qualname)
    if entry is None:
        return record
    fn = next((s for s in (symbol_for(_resolve(p)) for p in entry.torch_fns) if s is not None), None)
    if fn is None:
        return record               # this torch has neither spelling: the custom op is what eager runs

    def record_equivalent(*args, **kwargs):
        vals = list(args) + [kwargs[n] if n in kwargs else defaults[n] for n in names[len(args):]]
        if entry.accepts(*vals):
            return entry.call(fn, *vals)
        return record(*args, **kwargs)
    record_equivalent.__name__ = record.__name__
    record_equivalent.symbol = record.symbol
    return record_equivalent
