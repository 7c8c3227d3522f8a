"""Choosing a kernel's tiling (triton.tiling.Config) by timing, once per machine.

On a kernel's first call with real inputs, each of ``tiling.candidate_configs``
is compiled and timed and the fastest kept. The choice is stored on disk under a
key of (kernel structure, shape class, device name, triton version), so another
process running the same kernel on the same kind of device pays nothing: it
reads the choice and compiles only that configuration. The structure is the
digest of the heuristic configuration's source (which encodes the region's
prims, dtypes and broadcasting); the shape class is the row count and row length
rounded up to powers of two.

Switches, read when a kernel is first called (environment, since the cache is
shared by every jitted function of a process and outlives it):

- ``THUNDERLITE_TRITON_AUTOTUNE``: ``1`` times the candidates, ``0`` takes the
  heuristic choice untimed. Unset: on natively, off under the interpreter (whose
  timings say nothing about a GPU).
- ``THUNDERLITE_TRITON_CACHE_DIR``: where choices are kept; by default
  ``$XDG_CACHE_HOME/thunderlite/triton-autotune`` (``~/.cache/...``).

Example::

    key = cache_key(source, plan, "NVIDIA H100 80GB HBM3", "3.4.0")
    config = choose(key, candidates, time_one)      # times on a miss, reads the disk on a hit
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from thunderlite.executors.triton.plan import Plan
from thunderlite.executors.triton.tiling import Config

Timer = Callable[[Config, Callable[[], None]], float]
"""``timer(config, run)``: seconds one call of ``run`` (the kernel tiled as ``config``) takes."""

_memory: dict[str, Config] = {}
timed: list[str] = []
"""Keys this process has timed (tests read it: a warm cache times nothing)."""


def enabled(interpret: bool) -> bool:
    flag = os.environ.get("THUNDERLITE_TRITON_AUTOTUNE")
    if flag is None:
        return not interpret
    return flag not in ("0", "", "false", "False")


def cache_dir() -> Path:
    explicit = os.environ.get("THUNDERLITE_TRITON_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "thunderlite" / "triton-autotune"


def shape_class(plan: Plan) -> tuple[int, int]:
    """Rows and row length rounded up to powers of two: sizes that tune alike."""
    return tuple(1 << max(n - 1, 0).bit_length() for n in (plan.M, plan.N))


def cache_key(source: str, plan: Plan, device_name: str, triton_version: str) -> str:
    raw = json.dumps([hashlib.sha256(source.encode()).hexdigest(), shape_class(plan), device_name,
                      triton_version])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _path(key: str) -> Path:
    return cache_dir() / f"{key}.json"


def load(key: str) -> Config | None:
    """The stored choice for ``key`` (memory, then disk), or None; an unreadable file is a miss."""
    hit = _memory.get(key)
    if hit is not None:
        return hit
    try:
        data = json.loads(_path(key).read_text())
        config = Config(**data["config"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    _memory[key] = config
    return config


def store(key: str, config: Config, timings: dict[Config, float]) -> None:
    """Keep ``config`` for ``key`` in memory and on disk (written whole, then renamed into place,
    so a concurrent reader sees the old file or the new one)."""
    _memory[key] = config
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"config": config._asdict(),
                                   "timings": [[c._asdict(), t] for c, t in timings.items()]}, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass        # a read-only cache: the choice lives in this process only


def choose(key: str, candidates: Sequence[Config], timer: Timer, run_for: Callable[[Config], Callable[[], None]]
           ) -> Config:
    """The cached choice for ``key``, else the fastest of ``candidates`` as ``timer`` measures
    ``run_for(config)`` (a candidate that fails to compile or run is skipped)."""
    hit = load(key)
    if hit is not None:
        return hit
    if len(candidates) == 1:
        return candidates[0]
    timings: dict[Config, float] = {}
    for config in candidates:
        try:
            timings[config] = timer(config, run_for(config))
        except Exception:      # noqa: BLE001 - e.g. out of shared memory for this tiling: not a candidate
            continue
    if not timings:             # nothing could be timed (no GPU to time on): the heuristic, not remembered
        return candidates[0]
    timed.append(key)
    best = min(timings, key=timings.get)
    store(key, best, timings)
    return best


timer: Timer | None = None
"""The timer ``choose`` uses instead of the runtime's benchmark (tests put a fake one here)."""
