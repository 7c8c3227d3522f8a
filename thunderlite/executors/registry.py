"""The executor registry: names -> executors, the default list, and turning a
user's ``executors=[...]`` into the list the execution transform gets.

Availability is checked once per executor (``Executor.is_available``); an
unavailable executor is skipped with its reason recorded (``skipped_executors``),
never an error at import. The torch executor is always last.
"""
from __future__ import annotations

from thunderlite.core.prims import check
from thunderlite.executors.base import Executor
from thunderlite.executors.nvfuser.executor import nvfuser_executor
from thunderlite.executors.symm_mem.executor import symm_mem_executor
from thunderlite.executors.torchcompile import torchcompile_executor
from thunderlite.executors.torchex import torch_executor
from thunderlite.executors.triton.executor import triton_executor

_executors: dict[str, Executor] = {}
_default_names: list[str] = []


def register_executor(ex: Executor, *, default: bool = False) -> Executor:
    """Make ``ex`` known by its name (refusing a second executor of that name);
    ``default=True`` also puts it in the default list, ahead of torch."""
    check(isinstance(ex, Executor), lambda: f"register_executor expects an Executor, got {ex!r}", TypeError)
    check(ex.name not in _executors, lambda: f"an executor named {ex.name!r} is already registered", ValueError)
    _executors[ex.name] = ex
    if default:
        _default_names.append(ex.name)
    return ex


def get_executor(name: str) -> Executor:
    ex = _executors.get(name)
    check(ex is not None, lambda: f"unknown executor {name!r}; registered: {sorted(_executors)}", KeyError)
    return ex


def all_executors() -> list[Executor]:
    return list(_executors.values())


def get_all_executors() -> tuple[Executor, ...]:
    """Every registered executor, available or not, in registration order."""
    return tuple(_executors.values())


def get_default_executors() -> tuple[Executor, ...]:
    """The executors ``jit`` uses when ``executors=`` is not given, in priority
    order (unavailable ones included; ``resolve_executors`` skips them)."""
    return tuple(_executors[n] for n in _default_names)


def add_default_executor(ex: Executor | str) -> None:
    """Put ``ex`` (registered first if it is not yet) at the front of the default
    list: it claims ahead of every other default executor."""
    if not isinstance(ex, str) and ex.name not in _executors:
        register_executor(ex)
    name = ex if isinstance(ex, str) else ex.name
    check(isinstance(ex, str) or _executors[name] is ex,
          lambda: f"another executor named {name!r} is already registered", ValueError)
    get_executor(name)
    if name in _default_names:
        _default_names.remove(name)
    _default_names.insert(0, name)


def remove_default_executor(ex: Executor | str) -> None:
    """Drop ``ex`` from the default list (it stays registered). The torch
    executor cannot be removed: it runs every prim."""
    name = ex if isinstance(ex, str) else ex.name
    check(name != "torch", lambda: "the torch executor is always in the executor list (it runs every prim)",
          ValueError)
    check(name in _default_names, lambda: f"executor {name!r} is not a default executor; "
                                          f"defaults: {_default_names}", ValueError)
    _default_names.remove(name)


def available_executors() -> list[Executor]:
    return [ex for ex in _executors.values() if ex.is_available()[0]]


def executor_status() -> dict[str, tuple[bool, str]]:
    """name -> (available, reason it is not): what ``examine`` reports."""
    return {name: ex.is_available() for name, ex in _executors.items()}


def default_executors() -> list[Executor]:
    """The default list, unavailable executors skipped, torch last."""
    return resolve_executors(_default_names)


def resolve_executors(executors=None) -> list[Executor]:
    """Names or Executor objects -> the available executors in the given order,
    with the torch executor appended if missing (it runs every prim)."""
    if executors is None:
        return default_executors()
    out: list[Executor] = []
    for e in executors:
        ex = get_executor(e) if isinstance(e, str) else e
        check(isinstance(ex, Executor),
              lambda: f"executors=[...] takes names or Executor objects, got {e!r}", TypeError)
        if ex.is_available()[0] and ex not in out:
            out.append(ex)
    if torch_executor in out:
        out.remove(torch_executor)
    out.append(torch_executor)
    return out


def skipped_executors(executors=None) -> dict[str, str]:
    """name -> reason, for the requested (or default) executors that are unavailable."""
    names = _default_names if executors is None else executors
    skipped = {}
    for e in names:
        ex = get_executor(e) if isinstance(e, str) else e
        ok, reason = ex.is_available()
        if not ok:
            skipped[ex.name] = reason
    return skipped


register_executor(torch_executor, default=True)
register_executor(torchcompile_executor)
register_executor(nvfuser_executor)
register_executor(triton_executor)
register_executor(symm_mem_executor)
