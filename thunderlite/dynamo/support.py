"""Which FX nodes thunderlite can take: a verdict per node, with the reason
and the user's source line when the answer is no.

A node is supported when its target has a thunderlite symbol, is a Python
operator or a global-state switch the tracer records (grad mode, autocast),
or runs through the opaque fallback: the op must then run on meta tensors
built from the node's example values (an op without a meta kernel, or whose
output shape depends on data, cannot be traced and is split out).
"""
from __future__ import annotations

import builtins
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from thunderlite.torch import symbol_for

# Python-level functions dynamo puts in graphs that the tracer handles as they are.
_GLOBAL_STATE = {torch._C._set_grad_enabled, torch.amp._enter_autocast, torch.amp._exit_autocast}
# modules of the Python-level callables dynamo puts in graphs (operator.add, getattr...)
_PYTHON_MODULES = frozenset({operator.add.__module__, "operator", builtins.__name__})
# ops whose result is a Python number/list read from tensor data
_READS_VALUES = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
                 torch.Tensor.__float__, torch.Tensor.__index__}
_SOURCE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


@dataclass(frozen=True)
class Verdict:
    supported: bool
    reason: str = ""          # why not (empty when supported)
    source: str = ""          # the user's line, "file:line: code"


def user_frame(node: torch.fx.Node) -> tuple[str, int, str] | None:
    """The innermost user frame of the node's stack trace: (file, line, code)."""
    hits = _SOURCE.findall(node.meta.get("stack_trace") or "")
    if not hits:
        return None
    file, line, _fn, code = hits[-1]
    return file, int(line), code.strip()


def source_of(node: torch.fx.Node) -> str:
    """The innermost user frame of the node's stack trace, as ``file:line: code``."""
    frame = user_frame(node)
    return f"{frame[0]}:{frame[1]}: {frame[2]}" if frame else ""


def op_name(node: torch.fx.Node) -> str:
    """The public name of a node's op (``torch.nonzero``, ``Tensor.tolist``)."""
    t = node.target
    if node.op == "call_method":
        return f"Tensor.{t}"
    if node.op == "call_module":
        return f"module {t}"
    mod = getattr(t, "__module__", None) or ""
    name = getattr(t, "__name__", repr(t))
    if mod in ("_operator", "operator", "builtins"):
        return f"{mod.lstrip('_')}.{name}"
    if mod.startswith("torch._C._nn") or mod == "torch.nn.functional":
        return f"torch.nn.functional.{name}"
    if mod.startswith("torch._C") or mod in ("torch", "torch.functional") or not mod:
        return f"torch.{name}"
    return f"{mod}.{name}"


def _target_callable(node: torch.fx.Node) -> Callable | None:
    if node.op == "call_method":
        return getattr(torch.Tensor, node.target, None)
    if node.op == "call_function":
        return node.target
    return None


def _to_meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        shape = [_concrete(s) for s in v.shape]
        if any(s is None for s in shape):
            raise _Unbacked()
        return torch.empty(shape, dtype=v.dtype, device="meta")
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        c = _concrete(v)
        if c is None:
            raise _Unbacked()
        return c
    if isinstance(v, torch.device):
        return torch.device("meta")
    return v


class _Unbacked(Exception):
    """A size known only at run time (no hint to check the op with)."""


def _concrete(s: Any) -> Any:
    if isinstance(s, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return getattr(s.node, "hint", None)
    return s


def _example(arg: Any) -> Any:
    if isinstance(arg, torch.fx.Node):
        return arg.meta.get("example_value", arg.meta.get("val"))
    return arg


def _meta_runs(fn: Callable, node: torch.fx.Node) -> str:
    """Run ``fn`` on meta stand-ins of the node's example inputs; '' when it
    runs, else the reason it cannot be traced."""
    args = torch.fx.node.map_aggregate(node.args, _example)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, _example)
    try:
        margs = torch.utils._pytree.tree_map(_to_meta, args)
        mkwargs = torch.utils._pytree.tree_map(_to_meta, kwargs)
    except _Unbacked:
        return "an input size is only known at run time (data-dependent)"
    if "device" in mkwargs and mkwargs["device"] is not None:
        mkwargs["device"] = "meta"
    try:
        with torch.no_grad():
            out = fn(*margs, **mkwargs)
    except Exception as e:  # noqa: BLE001 - any failure here means "cannot trace it"
        msg = str(e)
        if "data-in" in msg or "data-dependent" in msg or "Meta" in msg or "meta" in msg:
            return "no thunderlite symbol, and PyTorch has no meta kernel for it (its output shape depends on the data)"
        first = (msg.splitlines() or [type(e).__name__])[0]
        return f"no thunderlite symbol, and it fails on meta tensors: {first[:160]}"
    for leaf in torch.utils._pytree.tree_leaves(out):
        if not isinstance(leaf, (torch.Tensor, torch.dtype, torch.device, torch.Size, str, type(None),
                                 bool, int, float, complex)):
            return f"returns a {type(leaf).__name__}, which a trace cannot hold"
    return ""


def _makes_unbacked(node: torch.fx.Node) -> bool:
    """Whether dynamo gave the node's output a size known only at run time."""
    try:
        return bool(free_unbacked_symbols(_example(node)))
    except Exception:  # noqa: BLE001 - example values of other kinds hold no sizes
        return False


def verdict(node: torch.fx.Node) -> Verdict:
    """Can thunderlite trace this node? (``placeholder``/``output``/``get_attr`` always can.)"""
    if node.op in ("placeholder", "output", "get_attr"):
        return Verdict(True)
    if node.op == "call_module":
        return Verdict(True)        # traced through the module's own forward
    fn = _target_callable(node)
    if fn is None:
        return Verdict(False, f"unknown {node.op} target {node.target!r}", source_of(node))
    if fn in _GLOBAL_STATE:
        return Verdict(True)
    if getattr(fn, "__module__", None) in _PYTHON_MODULES:
        return Verdict(True)
    if fn in _READS_VALUES:
        return Verdict(False, f"{op_name(node)} reads tensor data into a Python value, which a thunderlite "
                              "trace cannot hold yet (data-dependent)", source_of(node))
    if _makes_unbacked(node):
        # thunderlite traces it (a size known at run time), but a piece boundary cannot
        # carry dynamo's unbacked size: the op stays with the fallback
        return Verdict(False, f"{op_name(node)}: its output size depends on the data (dynamo's unbacked size "
                              "cannot cross into a thunderlite piece)", source_of(node))
    if symbol_for(fn) is not None:
        return Verdict(True)
    why = _meta_runs(fn, node)
    if why:
        return Verdict(False, f"{op_name(node)}: {why}", source_of(node))
    return Verdict(True)
