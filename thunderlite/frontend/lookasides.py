"""Proxy-aware replacements for the builtins and torch helpers a program may call
on proxies. A ``TensorProxy`` stands for a ``torch.Tensor`` (or an
``nn.Parameter`` when it is one), so ``isinstance``/``type``/``torch.is_tensor``
must answer as they would for the real tensor; a traced number (``NumberProxy``,
``SymInt``) for the Python number it stands for: ``isinstance(n, float)``,
``int(n)``, ``round(n)``, ``math.sqrt(n)``, ``n == 3`` are recorded
(torch/ops/numbers.py), and ``str(n)``/``f"{n}"``, which need the value, raise
``DataDependentError`` with the user's line. A ``DTensorProxy`` answers as
the ``DTensor`` it stands for."""
from __future__ import annotations

import builtins
import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core.proxies import NumberProxy, TensorProxy
from thunderlite.core.symint import SymInt
from thunderlite.distributed.dtensor import DTensorProxy, dtensor_type
from thunderlite.frontend.foreach import foreach_functions, foreach_lookaside
from thunderlite.frontend.functorch.apis import replacements as functorch_replacements
from thunderlite.frontend.training.predicated import grad_scaler_maybe_step
from thunderlite.interpreter import MISSING, call_past_lookaside, interpret
from thunderlite.torch.ops import numbers

_CREATION_NAMES = frozenset({
    "zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye", "rand", "randn",
    "randint", "randperm", "tensor", "as_tensor", "zeros_like", "ones_like", "empty_like",
    "full_like", "rand_like", "randn_like", "randint_like", "normal", "scalar_tensor",
    "empty_strided", "tril_indices", "triu_indices", "bernoulli", "multinomial",
})


def is_creation_fn(fn: Callable) -> bool:
    """Creation functions make tensors without tensor inputs; recorded, never run natively."""
    return getattr(fn, "__name__", None) in _CREATION_NAMES


def proxy_type(p: TensorProxy, parameters: set) -> type:
    return torch.nn.Parameter if p.name in parameters else torch.Tensor


def _matches(t: type, cls) -> bool:
    if isinstance(cls, tuple):
        return any(_matches(t, c) for c in cls)
    return isinstance(cls, type) and issubclass(t, cls)


class Lookasides:
    """The replacements, bound to the hooks of one traced call (one method each)."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.params = hooks.state.parameters

    def isinstance_(self, obj: Any, cls) -> bool:
        t = type(obj)
        if t is TensorProxy:
            return _matches(proxy_type(obj, self.params), cls) or _matches(TensorProxy, cls)
        if t is NumberProxy or t is SymInt:
            return _matches(numbers.python_type(obj), cls) or _matches(t, cls)
        if t is DTensorProxy:
            return _matches(dtensor_type(), cls) or _matches(t, cls)
        return isinstance(obj, cls)

    def type_(self, *args):
        if len(args) == 1:
            t = type(args[0])
            if t is TensorProxy:
                return proxy_type(args[0], self.params)
            if t is NumberProxy or t is SymInt:
                return numbers.python_type(args[0])
            if t is DTensorProxy:
                return dtensor_type()
            parent = self.hooks.state.prov_of.get(id(args[0]))
            if parent is not None:      # ``type(self).count += 1``: the class by its path
                return self.hooks.state.enter(parent.attr("__class__"), t)
        return type(*args)

    def number_function(self, fn: Callable, traced: Callable, *args, **kwargs):
        """``fn`` (``int``, ``round``, ``math.sqrt``...) as the program calls it, or
        its traced version (recorded with the user's line) when an argument is a
        traced number (``max([a, b])``: an item of its one list or tuple)."""
        if any(numbers.is_traced(a) for a in args):
            return self.hooks.recording(traced)(*args, **kwargs)
        if (fn is max or fn is min) and len(args) == 1 and not kwargs and type(args[0]) in (list, tuple) \
                and any(numbers.is_traced(a) for a in args[0]):
            return self.hooks.recording(traced)(*args[0])
        return call_past_lookaside(fn, args, kwargs)

    def recorded(self, traced: Callable, *args, **kwargs):
        """``traced`` recorded with the user's line."""
        return self.hooks.recording(traced)(*args, **kwargs)

    @staticmethod
    def is_tensor(obj: Any) -> bool:
        return type(obj) in (TensorProxy, DTensorProxy) or torch.is_tensor(obj)

    def set_grad_enabled(self, mode: bool) -> None:
        self.hooks.set_grad_enabled(bool(mode))

    def module_getattr(self, module, name: str):
        # nn.Module.__getattr__ natively (parameters, buffers, submodules), then the
        # load_attr hook gives the value its provenance (module_slot path).
        # A missing name goes to the hook too (as the interpreter's failed lookups
        # do): it guards the absence, or gives the value this call set.
        # A slot dict the program holds a copy of is the program's view of it
        # (``register_buffer`` in forward writes the copy).
        copy = self.hooks.slot_copy_holding(module, name)
        if copy is not None:
            return copy[name]
        try:
            value = torch.nn.Module.__getattr__(module, name)
        except AttributeError:
            value = self.hooks.load_attr(module, name, MISSING)
            if value is MISSING:
                raise
            return value
        return self.hooks.load_attr(module, name, value)

    def module_setattr(self, module, name: str, value) -> None:
        if not self.hooks.store_attr(module, name, value):
            torch.nn.Module.__setattr__(module, name, value)
            return
        copy = self.hooks.slot_copy_holding(module, name)
        if copy is not None:        # ``self.b = t`` for a buffer: ``self.buffers()`` sees t too
            copy[name] = value

    def module_delattr(self, module, name: str) -> None:
        if not self.hooks.delete_attr(module, name):
            torch.nn.Module.__delattr__(module, name)

    def object_setattr(self, obj, name: str, value) -> None:
        if not self.hooks.store_attr(obj, name, value):
            object.__setattr__(obj, name, value)

    @staticmethod
    def has_torch_function(*args) -> bool:
        # torch's Python functions ask this before dispatching to __torch_function__;
        # proxies take the ordinary path (their ops are recorded by the lookasides).
        return False

    @staticmethod
    def is_compiling() -> bool:
        # Libraries (HF transformers) skip data-dependent Python checks when compiling.
        return True

    def proxy_getattr(self, proxy, name: str):
        # ``p.grad``: the program's value (training/traced_autograd.py)
        if name == "grad":
            return self.hooks.input_grad(proxy)
        if name == "backward":
            return functools.partial(self.tensor_backward, proxy)
        if name == "grad_fn" and (not proxy.requires_grad or self.hooks.state.input_by_name(proxy.name)):
            return None     # a leaf, or a value without history (``zero_grad`` asks of ``p.grad``)
        if name == "__deepcopy__" and proxy.requires_grad:
            inp = self.hooks.state.input_by_name(proxy.name)
            if inp is None or not inp.value.is_leaf:
                raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                                   "protocol at the moment")      # eager's refusal
        return self.hooks.recording(TensorProxy.__getattr__)(proxy, name)

    def tensor_backward(self, tensor, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """``loss.backward()``: autodiff of what the trace computed so far, inlined."""
        self.hooks.autograd.backward(tensor, gradient, retain_graph, create_graph, inputs)

    def backward(self, *args, **kwargs):
        self.hooks.autograd.backward(*args, **kwargs)

    def autograd_grad(self, *args, **kwargs):
        return self.hooks.autograd.grad(*args, **kwargs)

    @staticmethod
    def group_tensors(tensorlistlist, with_indices: bool = False) -> dict:
        """``torch._C._group_tensors_by_device_and_dtype`` (``clip_grad_norm_``,
        foreach helpers) on proxies: the same grouping done here, so each group
        holds the program's own values (an opaque call would hand back new ones
        and in-place ops on them would miss the tensors they stand for)."""
        groups: dict = {}
        for i, t in enumerate(tensorlistlist[0]):
            key = (t.device, t.dtype)
            if key not in groups:
                groups[key] = ([[] for _ in tensorlistlist], [])
            for lst, out in zip(tensorlistlist, groups[key][0], strict=True):
                out.append(lst[i])
            groups[key][1].append(i)
        return groups

    def module_backward_hooks(self, hook_state, module, user_hooks, user_pre_hooks) -> None:
        # nn.Module._call_impl builds a BackwardHook when a module (or the global
        # registry) has full backward hooks: they fire inside autograd's backward
        # at the module's boundary, which the compiled program does not expose
        loc = self.hooks.locate()
        where = f" (at {loc[0]}:{loc[1]}: {loc[2]})" if loc else ""
        raise NotImplementedError(
            f"thunderlite does not run module backward hooks: {type(module).__name__} has "
            f"register_full_backward_hook/register_full_backward_pre_hook hooks{where}; call that module "
            "outside thunderlite.jit (jit its children instead), or remove the hooks")

    def make_subclass(self, cls, data, *args, **kwargs):
        """``nn.Parameter(t)`` (and other ``_make_subclass`` tensors) of a traced
        tensor: a new leaf object the program would hand the caller; refused."""
        if type(data) is TensorProxy:
            loc = self.hooks.locate()
            where = f" (at {loc[0]}:{loc[1]}: {loc[2].strip()})" if loc and loc[2] else ""
            raise NotImplementedError(
                f"thunderlite: making a {cls.__name__} of a traced tensor inside the jitted function is not "
                f"supported{where}; create it outside the function (between calls), or update the existing "
                "one in place under torch.no_grad()")
        return torch.Tensor._make_subclass(cls, data, *args, **kwargs)

    def checkpoint(self, function, *args, use_reentrant=None, context_fn=None, determinism_check=None,
                   debug=False, early_stop=True, **kwargs):
        """``torch.utils.checkpoint.checkpoint``: eager recomputes ``function`` in
        the backward to save memory, with the values and gradients of calling
        it once, so it is traced as that call (what the backward keeps is
        thunderlite's choice). The reentrant form none of whose tensor
        arguments requires grad records no graph in eager (its parameters get
        no gradient): traced under no_grad, as eager runs it."""
        kwargs.pop("preserve_rng_state", None)
        reentrant = True if use_reentrant is None else use_reentrant
        if kwargs and reentrant:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        run = interpret(function, self.hooks)
        if not reentrant or any(type(a) is TensorProxy and a.requires_grad for a in args):
            return run(*args, **kwargs)
        before = self.hooks.grad_enabled
        self.hooks.set_grad_enabled(False)
        try:
            return run(*args)
        finally:
            self.hooks.set_grad_enabled(before)

    @staticmethod
    def record_function(*args, **kwargs):
        # a profiler range (``optimizer.step`` opens one) is a run-time annotation
        # with no effect on values: tracing skips it (its C op returns a ScriptObject)
        return contextlib.nullcontext()

    def foreach(self, fn: Callable, *args, **kwargs):
        """``torch._foreach_*`` recorded per element (foreach.py), its runner made
        when the program calls it: most programs call none of the ~90 ops."""
        return foreach_lookaside(fn, self.hooks.lookaside)(*args, **kwargs)

def _method(name: str) -> Callable:
    """The replacement calling ``Lookasides.<name>`` on the call's instance."""
    attr = Lookasides.__dict__[name]
    if isinstance(attr, staticmethod):
        fn = attr.__func__
        return lambda self, *args, **kwargs: fn(*args, **kwargs)
    return attr


def _table() -> dict:
    """fn -> ``replacement(lookasides, *args, **kwargs)``, made once: a traced call
    binds a replacement to its own ``Lookasides`` only when the program calls it."""
    compare = {op: functools.partial(numbers.compare, op) for op in ("lt", "le", "gt", "ge", "eq", "ne")}

    def recorded(traced):
        return lambda self, *args, **kwargs: self.recorded(traced, *args, **kwargs)
    table = {f: (lambda f: lambda self, *a, **k: self.foreach(f, *a, **k))(f) for f in foreach_functions()}
    table.update({f: (lambda f, t: lambda self, *a, **k: self.number_function(f, t, *a, **k))(f, traced)
                  for f, traced in numbers.python_functions().items()})
    # the user's comparisons of traced numbers are traced (library code's decide or
    # raise: torch/ops/numbers.py ``compare``); their text needs the value
    table.update({getattr(SymInt, f"__{op}__"): recorded(compare[op]) for op in compare})
    table[NumberProxy.__eq__] = recorded(compare["eq"])
    table[NumberProxy.__ne__] = recorded(compare["ne"])
    for fn in (NumberProxy.__repr__, NumberProxy.__str__, SymInt.__repr__, NumberProxy.__format__,
               SymInt.__format__):
        table[fn] = recorded(numbers.as_text)
    for fn, name in [(torch.autograd.profiler.record_function, "record_function"),
                     (TensorProxy.__getattr__, "proxy_getattr"), (torch.autograd.backward, "backward"),
                     (torch.autograd.grad, "autograd_grad"), (torch.Tensor.backward, "tensor_backward"),
                     (torch.compiler.is_compiling, "is_compiling"),
                     (torch.overrides.has_torch_function, "has_torch_function"),
                     (torch.overrides.has_torch_function_unary, "has_torch_function"),
                     (torch.overrides.has_torch_function_variadic, "has_torch_function"),
                     (torch.nn.Module.__getattr__, "module_getattr"), (torch.nn.Module.__setattr__, "module_setattr"),
                     (torch.nn.Module.__delattr__, "module_delattr"), (object.__setattr__, "object_setattr"),
                     (builtins.isinstance, "isinstance_"),
                     (builtins.type, "type_"), (torch.is_tensor, "is_tensor"),
                     (torch._C._set_grad_enabled, "set_grad_enabled"),
                     (torch.utils.hooks.BackwardHook.__init__, "module_backward_hooks"),
                     (torch._C._group_tensors_by_device_and_dtype, "group_tensors"),
                     (torch.Tensor._make_subclass, "make_subclass"),
                     (torch.utils.checkpoint.checkpoint, "checkpoint")]:
        table[fn] = _method(name)
    # GradScaler's skipped step: predicated on its found_inf, no host read (training/predicated.py)
    table[torch.amp.GradScaler._maybe_opt_step] = lambda self, *a, **k: grad_scaler_maybe_step(self.hooks, *a, **k)
    # torch.func transforms as trace computations (functorch/apis.py)
    table.update({f: (lambda impl: lambda self, *a, **k: impl(self.hooks, *a, **k))(impl)
                  for f, impl in functorch_replacements().items()})
    return table


REPLACEMENTS = _table()


def proxy_aware_builtins(hooks) -> Lookasides:
    """The replacements' state for one traced call (``hooks`` gives it); bind a
    ``REPLACEMENTS`` entry to it to call one."""
    return Lookasides(hooks)
