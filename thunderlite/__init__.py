"""thunderlite: a trace-based JIT for PyTorch programs.

The public face (docs/architecture.md §10). Everything is imported lazily through the
module ``__getattr__`` so that ``import thunderlite`` stays fast and does not
import torch until a public name is first used.

Example::

    import thunderlite
    jfn = thunderlite.jit(fn)          # or thunderlite.jit(module)
    out = jfn(x)
    print(thunderlite.last_traces(jfn)[-1])
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> (module, attribute)
_LAZY = {
    "jit": ("thunderlite.api", "jit"),
    "last_traces": ("thunderlite.api", "last_traces"),
    "last_backward_traces": ("thunderlite.api", "last_backward_traces"),
    "last_prologue_traces": ("thunderlite.api", "last_prologue_traces"),
    "last_gradients": ("thunderlite.api", "last_gradients"),
    "cache_info": ("thunderlite.api", "cache_info"),
    "compile_stats": ("thunderlite.api", "compile_stats"),
    "wait_for_tiers": ("thunderlite.api", "wait_for_tiers"),
    "TierPolicy": ("thunderlite.frontend.caching.tiers", "TierPolicy"),
    "examine": ("thunderlite.api", "examine"),
    "trace_report": ("thunderlite.report", "trace_report"),
    "kernel_source": ("thunderlite.api", "kernel_source"),
    "thunderfx": ("thunderlite.dynamo", "thunderfx"),
    "ThunderCompiler": ("thunderlite.dynamo", "ThunderCompiler"),
    "CACHE_MODES": ("thunderlite.api", "CACHE_MODES"),
    "ThunderliteModule": ("thunderlite.api", "ThunderliteModule"),
    "DataDependentError": ("thunderlite.core.proxies", "DataDependentError"),
}

__all__ = sorted(_LAZY) + ["__version__"]


_SUBMODULES = ("extend", "dynamo")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"thunderlite.{name}")
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'thunderlite' has no attribute {name!r}")
    module_name, attr = target
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value          # later lookups skip __getattr__
    return value


def __dir__():
    return __all__
