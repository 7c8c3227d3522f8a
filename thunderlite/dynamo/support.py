"""Which FX nodes thunderlite can take: a verdict per node, with the reason
and the user's source line when the answer is no.

Two questions, in this order:

1. ``refusal(node)``: does the backend model this kind of node at all? An
   allow-list: tensor and number inputs, tensor attributes, modules, Python
   operators, grad-mode/autocast switches, functorch level markers (the
   splitter's region rule), torch ops (ATen/custom ops, ``torch.*``,
   ``torch.nn.functional.*`` and the ATen-backed ``Tensor`` methods), and
   anything with a thunderlite symbol. A tensor hook
   (``higher_order.register_hook``) is modeled only where thunderlite takes
   the whole graph as one piece (``Verdict.unsplit_ok``; the splitter
   decides). Anything else (a ``BackwardState`` input, a higher-order op with a subgraph body, compiled
   autograd's ops, a Python function dynamo was told to keep opaque) may act
   on autograd or on state no piece boundary carries, so splitting around it
   could change the program: the whole graph goes to the fallback.
2. ``verdict(node)``: for a node the backend models, can thunderlite trace
   it? Yes when its target has a thunderlite symbol, is a Python operator or a
   global-state switch the tracer records (grad mode, autocast), or runs
   through the opaque fallback: the op must then run on meta tensors built from
   the node's example values (an op without a meta kernel, or whose output
   shape depends on data, cannot be traced and is split out: a piece of its
   own on the fallback, the rest stays with thunderlite).
"""
from __future__ import annotations

import builtins
import math
import operator
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor
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
    whole: bool = False       # not modeled: the whole graph goes to the fallback, unsplit
    unsplit_ok: bool = False  # modeled when the whole graph is one thunderlite piece (a tensor hook)


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


# --- what the backend models at all (an allow-list; anything else sends the whole graph away) ----

# C namespaces whose functions are ATen bindings (torch.sin, torch._C._nn.linear...)
_TORCH_C_NAMESPACES = frozenset({"torch", "torch._C._nn", "torch._C._linalg", "torch._C._fft",
                                 "torch._C._special", "torch._C._nested"})
# Python namespaces of torch ops built from other torch ops (torch.sym_int, F.dropout, einsum...)
_TORCH_PY_NAMESPACES = frozenset({"torch", "torch.functional", "torch.nn.functional"})
# Python-level Tensor methods (torch/_tensor.py) that compute values from torch ops; the others
# there register hooks, run the backward, share storage or serialize
_PY_TENSOR_METHODS = frozenset({
    "__floordiv__", "__ipow__", "__pow__", "__rdiv__", "__rfloordiv__", "__rlshift__", "__rmatmul__",
    "__rmod__", "__rpow__", "__rrshift__", "__rsub__", "__rtruediv__", "__len__", "__reversed__",
    "istft", "lu", "norm", "split", "stft", "unflatten", "unique", "unique_consecutive"})
# builtins dynamo may leave in a graph for number arithmetic
_BUILTINS = frozenset({builtins.abs, builtins.min, builtins.max, builtins.round, builtins.pow, builtins.divmod,
                       builtins.int, builtins.float, builtins.bool, builtins.len, builtins.getattr})
# torch._C calls outside the op namespaces that thunderlite models: ``x.data`` (dynamo's
# spelling; an alias autograd does not see, docs/architecture.md §5) and PyTorch's API
# usage logging (no effect on values)
_MODELED_C = frozenset({torch._C._autograd._get_data_attr, torch._C._log_api_usage_once})
# Tensor methods with autograd effects a piece boundary would lose (thunderlite.jit refuses them too)
_AUTOGRAD_METHODS = frozenset({"register_hook", "register_post_accumulate_grad_hook", "retain_grad", "backward"})
_MISSING = object()


def _whole(node: torch.fx.Node, why: str) -> Verdict:
    return Verdict(False, why, source_of(node), whole=True)


def _member(fn: Any, names: frozenset | set) -> bool:
    try:
        return fn in names
    except TypeError:           # an unhashable target is none of them
        return False


def _is_number(v: Any) -> bool:
    return type(v) in (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def _is_plain_tensor(v: Any) -> bool:
    """A tensor thunderlite takes as it is: dynamo's fake tensor for one, or a
    plain tensor/parameter (a subclass such as DTensor is not modeled)."""
    return isinstance(v, FakeTensor) or type(v) in (torch.Tensor, torch.nn.Parameter)


def _input_refusal(node: torch.fx.Node, example: Any) -> Verdict | None:
    value = node.meta.get("example_value", node.meta.get("val", example))
    if value is _MISSING:
        return _whole(node, f"input {node.name} has no example value to judge it by")
    if _is_plain_tensor(value) or _is_number(value):
        return None
    kind = type(value).__name__
    if kind == "BackwardState":
        return _whole(node, f"input {node.name} is a BackwardState: dynamo's carrier of tensor hooks that run "
                            "in the backward (compiled autograd); thunderlite pieces run their own backward")
    return _whole(node, f"input {node.name} is a {kind}, which thunderlite does not model")


def _attr(node: torch.fx.Node) -> Any:
    obj: Any = node.graph.owning_module
    for atom in str(node.target).split("."):
        obj = getattr(obj, atom, None)
    return obj


def _method_refusal(node: torch.fx.Node, name: str) -> Verdict | None:
    if name in _AUTOGRAD_METHODS:
        return _whole(node, f"Tensor.{name} changes what autograd does with a gradient; "
                            "a split would lose it at a piece boundary")
    if name in vars(torch._C.TensorBase) or name in _PY_TENSOR_METHODS:
        return None
    if symbol_for(getattr(torch.Tensor, name, None)) is not None:
        return None
    return _whole(node, f"Tensor.{name} is not a tensor op thunderlite models")


def _function_refusal(node: torch.fx.Node) -> Verdict | None:
    fn = node.target
    if isinstance(fn, torch._ops.HigherOrderOperator):
        if fn.name() == "register_hook":
            return Verdict(False, "torch.ops.higher_order.register_hook: a tensor hook (Tensor.register_hook on a "
                                  "tensor made in the graph) must see the gradient eager computes; thunderlite "
                                  "honours it only when it takes the whole graph as one piece", source_of(node),
                           whole=True, unsplit_ok=True)
        return _whole(node, f"torch.ops.higher_order.{fn.name()}: a higher-order op (a subgraph with its own "
                            "semantics) thunderlite does not model")
    if _member(fn, _GLOBAL_STATE) or _member(fn, _BUILTINS) or _member(fn, _MODELED_C):
        return None
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return None                                     # ATen, prims and torch.library ops
    mod = getattr(fn, "__module__", None) or ""
    if mod in ("operator", "_operator", math.__name__):
        return None
    if mod.startswith(("torch._functorch", "torch._C._functorch")):
        return None                                     # vmap/grad levels: the splitter's region rule
    if symbol_for(fn) is not None:
        return None
    if isinstance(fn, types.BuiltinFunctionType) and mod in _TORCH_C_NAMESPACES:
        return None
    objclass = getattr(fn, "__objclass__", None)
    if objclass is torch._C.TensorBase:                  # Tensor.add as a function
        return _method_refusal(node, fn.__name__)
    if isinstance(fn, types.FunctionType):
        if mod == "torch._tensor":
            return _method_refusal(node, fn.__name__)
        if mod in _TORCH_PY_NAMESPACES:
            return None
    name = getattr(fn, "__name__", None) or repr(fn)
    if "_register_hook_trampoline" in name:
        return _whole(node, "a tensor hook registered through a BackwardState (compiled autograd) must see the "
                            "gradient eager computes; thunderlite pieces run their own backward")
    if mod.startswith("torch._dynamo.compiled_autograd"):
        return _whole(node, f"{mod}.{name}: a graph compiled autograd captured from a backward, which "
                            "thunderlite does not model")
    return _whole(node, f"{mod or '?'}.{name}: a call dynamo kept in the graph that is not a torch op "
                        "thunderlite models")


def refusal(node: torch.fx.Node, example: Any = _MISSING) -> Verdict | None:
    """None when the backend models this kind of node (see the module docstring);
    else a verdict with ``whole=True``: the whole graph goes to the fallback.
    ``example``: the backend's example input for a placeholder without one in its meta."""
    if node.op == "output" or node.op == "call_module":
        return None                     # a module is traced through its own forward
    if node.op == "placeholder":
        return _input_refusal(node, example)
    if node.op == "get_attr":
        value = _attr(node)
        if isinstance(value, torch.Tensor) and _is_plain_tensor(value):
            return None
        if isinstance(value, torch.fx.GraphModule) and node.users and all(
                isinstance(u.target, torch._ops.HigherOrderOperator) for u in node.users):
            return None                 # a higher-order op's body: the op's own refusal names it
        return _whole(node, f"graph attribute {node.target} ({type(value).__name__}) is not a tensor "
                            "thunderlite models")
    if node.op == "call_method":
        return _method_refusal(node, str(node.target))
    if node.op == "call_function":
        return _function_refusal(node)
    return _whole(node, f"FX node kind {node.op!r} is not modeled")
