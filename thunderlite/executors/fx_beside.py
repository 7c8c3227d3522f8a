"""FX tracing on one thread beside torch.compile'd calls on others.

``make_fx`` (a boxed region compiling, and AOTAutograd inside every Inductor
compile) sets FX's process-wide "symbolic tracing" flag while it traces, and
dynamo refuses to run a compiled function under that flag: with
``torch._dynamo.config.error_on_nested_fx_trace`` on (torch's default) it
raises "Detected that you are using FX to symbolically trace a
dynamo-optimized function". The flag is not per thread, so while the tier
worker compiles a region, a ``torch.compile``d module the user calls on
another thread (or a ThunderFX graph, or a region of a ``torchcompile``
executor) would fail. Inside ``compiling_beside_others()`` that option is
off for every thread that did not set it itself (torch keeps a setting per
thread; the window changes the option's default, which the others read):
such a call runs its function's own code, uncompiled, as dynamo does when
the option is off, and compiles at a later call. Compiles on several threads
share one window; the last to finish puts the default back.

Example::

    with compiling_beside_others():
        gm = make_fx(fn)(*fakes)        # another thread's compiled calls run meanwhile
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_inside = 0
_saved: bool | None = None


@contextlib.contextmanager
def compiling_beside_others() -> Iterator[None]:
    """Trace and compile inside: other threads' compiled calls run their own code meanwhile."""
    global _inside, _saved
    with _lock:
        if _inside == 0:
            _saved = _option()
            _set_option(False)
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                _set_option(_saved)


_NAME = "error_on_nested_fx_trace"


def _entry():
    """The option's config entry, where torch keeps a setting per thread (a
    value set on one thread overrides the entry's default on that thread only):
    the default is what every other thread reads."""
    import torch._dynamo.config as dynamo_config
    entry = getattr(dynamo_config, "_config", {}).get(_NAME)
    return entry if hasattr(entry, "default") else None


def _option() -> bool:
    entry = _entry()
    if entry is not None:
        return entry.default
    import torch._dynamo.config as dynamo_config
    return getattr(dynamo_config, _NAME)


def _set_option(value: bool) -> None:
    entry = _entry()
    if entry is not None:
        entry.default = value
    else:
        import torch._dynamo.config as dynamo_config
        setattr(dynamo_config, _NAME, value)
