"""Loading and launching generated Triton kernels (the only module of the
Triton executor that imports ``triton``).

Native or interpreted. Triton picks its mode when ``triton.jit`` decorates a
function: with ``TRITON_INTERPRET=1`` in the environment it builds an
``InterpretedFunction`` (numpy on the CPU, slow: a correctness tool), otherwise
a ``JITFunction`` compiled for the GPU. The mode is chosen once, when this
module is imported:

- ``TRITON_INTERPRET=1`` already set by the user: interpreter;
- no CUDA device: interpreter (the only way Triton runs on a CPU);
- otherwise: native.

The variable is set only around each ``triton.jit`` call that decorates one of
our kernels and restored right after, so nothing else in the process (Inductor,
the user's own kernels) sees a changed environment. The generated kernels call
only Triton builtins (``tl.load``, ``tl.where``, ``tl.reduce`` ...), never the
``@triton.jit`` helpers of ``triton.language.standard`` (``tl.sum``,
``tl.zeros``): those were decorated when ``triton`` was first imported, perhaps
natively by ``torch.compile``, and an interpreted kernel cannot call them.
Reductions pass Triton's own combine functions to ``tl.reduce`` (the
interpreter runs those as numpy reductions).

Kernels are cached by their source text, which encodes the region's structure,
dtypes and shape class (sizes and strides are runtime arguments).
"""
from __future__ import annotations

import contextlib
import hashlib
import linecache
import os
import threading
import types
from collections.abc import Callable

import torch

try:
    import triton
    import triton.language  # the generated source imports it
    _IMPORT_ERROR: str | None = None
except ImportError as e:   # the executor then reports itself unavailable
    triton = None
    _IMPORT_ERROR = f"triton is not installed ({e}); pip install 'thunderlite[triton]'"

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1" or not torch.cuda.is_available()
"""Whether kernels run under the Triton interpreter (on CPU tensors) instead of natively (on CUDA tensors)."""

DEVICE_TYPE: str = "cpu" if INTERPRET else "cuda"
"""The device type of the tensors the kernels accept."""

DTYPES: frozenset = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                               torch.float16, torch.float32, torch.float64}
                              | (set() if INTERPRET else {torch.bfloat16}))
"""Tensor dtypes the kernels take: the interpreter (numpy) truncates float32 to bfloat16
instead of rounding to nearest even, so bfloat16 runs only natively."""

_kernels: dict[str, Callable] = {}
_load_lock = threading.Lock()


def availability() -> tuple[bool, str]:
    if triton is None:
        return False, _IMPORT_ERROR
    return True, ""


@contextlib.contextmanager
def _interpret_env(on: bool):
    """``TRITON_INTERPRET`` as ``on`` for the duration of one decoration, then as before."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


def load_kernel(source: str, fn_name: str, do_not_specialize: tuple = ()) -> Callable:
    """The ``triton.jit`` kernel ``fn_name`` defined by ``source``, compiled once per
    distinct source. The source is registered with ``linecache`` under a stable
    file name so Triton (which reads a kernel's source) and tracebacks see it.
    ``do_not_specialize``: integer arguments the kernel uses as values (sizes), which
    native Triton would otherwise turn into constants when they equal 1."""
    kernel = _kernels.get(source)
    if kernel is not None:
        return kernel
    with _load_lock:        # TRITON_INTERPRET is process state, set around each decoration
        kernel = _kernels.get(source)
        if kernel is None:
            kernel = _kernels[source] = _load(source, fn_name, do_not_specialize)
    return kernel


def _load(source: str, fn_name: str, do_not_specialize: tuple) -> Callable:
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    filename = f"<thunderlite-triton-{digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(f"thunderlite_triton_{digest}")
    module.__file__ = filename
    exec(compile(source, filename, "exec"), module.__dict__)
    with _interpret_env(INTERPRET):
        return triton.jit(getattr(module, fn_name), do_not_specialize=list(do_not_specialize))


def device_name(device: torch.device) -> str:
    """What autotuning choices are kept per: the GPU's model, or the interpreter."""
    return "interpreter" if INTERPRET else torch.cuda.get_device_name(device)


def triton_version() -> str:
    return getattr(triton, "__version__", "unknown")


def bench(config, run: Callable[[], None]) -> float:
    """Median milliseconds of ``run`` by Triton's benchmark helper (natively: CUDA events)."""
    from triton.testing import do_bench
    run()           # compiles outside the timing
    return do_bench(run, warmup=5, rep=20, return_mode="median")


def launch(kernel: Callable, grid: tuple, args: list, constexprs: dict, num_warps: int, num_stages: int = 1) -> None:
    """Run ``kernel`` on ``grid``; ``args[0]`` is a tensor on the device to run on."""
    if INTERPRET:
        import numpy as np
        # Masked-off lanes compute on filler values (log(0), 0/0); numpy must not warn about them.
        with np.errstate(all="ignore"):
            kernel[grid](*args, **constexprs)
    else:
        # No fused multiply-add contraction: float32 code rounds after every prim as eager's float32 ops do,
        # so float32 results stay within the tolerances the OpInfo sweep checks natively.
        with torch.cuda.device(args[0].device):     # Triton launches on the current device
            kernel[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=False)


def cached_kernel_count() -> int:
    return len(_kernels)
