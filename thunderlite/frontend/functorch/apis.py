"""The ``torch.func`` transforms as trace computations (docs/architecture.md §9,
"torch.func inside a trace").

Each lookaside returns a thunderlite callable the program then calls; the call
records the transformed function into a scratch trace (subtrace.py) and
emits, into the enclosing trace, what the transform computes from it:

- reverse mode (``grad``, ``grad_and_value``, ``vjp``): every differentiated
  tensor enters as a fresh name (an identity reshape of the value given), the
  function's symbols are differentiated from those names only
  (``autodiff/inline.py``), and forward and backward are inlined, so
  ``last_traces`` shows the gradient computation, and a transform nested in
  another, or the caller's ``backward()``, differentiates it again;
- forward mode (``jvp``) by the double-VJP identity: the VJP is linear in its
  cotangent, so the VJP of the VJP with respect to the cotangent, applied to
  the tangents, is the JVP;
- ``jacrev`` batches the VJP over the rows of an identity (``vmap`` below);
  ``jacfwd`` gives the same Jacobian the same way (reverse mode), ``hessian``
  is ``jacfwd(jacrev(f))``;
- ``vmap`` records the function on per-example proxies and re-records its
  symbols with a leading batch dim (``transforms/batching.py``), never a loop;
- ``functional_call`` runs the module with its parameters and buffers read
  from the given dicts (the interpreter's attribute overlay, undone after).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch._functorch import eager_transforms
from torch._functorch import vmap as functorch_vmap
from torch.utils import _pytree as torch_pytree

from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import walk
from thunderlite.core.tags import Tag
from thunderlite.core.tracectx import current_trace
from thunderlite.frontend.functorch.subtrace import inline, record, recorded
from thunderlite.interpreter import interpret
from thunderlite.torch import symbol_for
from thunderlite.transforms.autodiff.inline import Linearized, linearize, settle_requires_grad
from thunderlite.transforms.batching import batch

_MISSING = object()


def _line(hooks) -> str:
    loc = hooks.locate()
    return f"{loc[0]}:{loc[1]}: {loc[2].strip()}" if loc else "an unknown line"


def _fn_name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _is_t(x) -> bool:
    return type(x) is TensorProxy


def _identity(p: TensorProxy) -> TensorProxy:
    """A new name for ``p``'s value: where one transform level starts differentiating."""
    return prims.reshape(p, tuple(p.shape))


def _argnums(argnums, n: int, what: str) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums:
        raise RuntimeError(f"{what}: argnums must be non-empty")
    out = []
    for a in nums:
        if not isinstance(a, int) or not -n <= a < n:
            raise RuntimeError(f"Got argnums={argnums}, but only {n} positional inputs")
        out.append(a % n)
    return tuple(out)


class _Diff:
    """One level of reverse mode over ``fn``: the linearized function and the
    structure of the values it is differentiated with respect to."""

    def __init__(self, hooks, fn: Callable, args: tuple, kwargs: dict, nums: tuple[int, ...], has_aux: bool,
                 what: str):
        self.nums = nums
        call_args = list(args)
        self.specs, self.wrt, self.given = [], [], []
        for i in nums:
            leaves, spec = torch_pytree.tree_flatten(args[i])
            new = []
            for leaf in leaves:
                if _is_t(leaf):
                    if not (leaf.dtype.is_floating_point or leaf.dtype.is_complex):
                        raise RuntimeError(f"{what}: only Tensors of floating point dtype can require gradients "
                                           f"(got {leaf.dtype}) at {_line(hooks)}")
                    w = _identity(leaf)
                    w.requires_grad = True
                    self.wrt.append(w)
                    self.given.append(leaf)
                new.append(w if _is_t(leaf) else leaf)
            self.specs.append((spec, new))
            call_args[i] = torch_pytree.tree_unflatten(new, spec)
        bsyms, out = record(hooks, fn, tuple(call_args), kwargs, grad=True)
        self.aux = None
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise RuntimeError(f"{what}(f)(*args): output of function f should be a tuple: (output, aux) "
                                   f"if has_aux is True (at {_line(hooks)})")
        names = current_trace().names
        self.lin: Linearized = linearize(bsyms, self.wrt, out, names, f"{what} at {_line(hooks)}",
                                         higher_order=any(g.requires_grad for g in self.given))
        if self.lin.hooks and what in ("jvp", "jacfwd"):      # eager's forward mode: its tensors carry no grad
            if not any(g.requires_grad for g in self.given):
                raise RuntimeError(f"cannot register a hook on a tensor that doesn't require gradient (in {what} "
                                   f"at {_line(hooks)})")
            raise NotImplementedError(f"{what} at {_line(hooks)}: thunderlite computes forward mode by reverse "
                                      "mode, so a tensor hook registered inside the function would run where "
                                      "eager's runs in the caller's backward; register it outside the transform")
        out = self.lin.output
        if has_aux:
            out, self.aux = out
        self.out = out
        for w, g in zip(self.wrt, self.given, strict=True):
            w.requires_grad = g.requires_grad
        settle_requires_grad(self.lin.forward)
        inline(self.lin.forward)

    def backward(self, cotangents: list) -> list:
        """Gradients of the differentiated arguments, one pytree per argnum
        (zeros where the output does not depend on a value, as torch.func)."""
        cotangents = list(cotangents) + [None] * (len(self.lin.outputs) - len(cotangents))    # aux: none
        grads = self.lin.backward(cotangents)
        grads = [g if g is not None else prims.full(w.shape, 0, device=w.device, dtype=w.dtype)
                 for g, w in zip(grads, self.wrt, strict=True)]
        return self.unflatten(grads)

    def unflatten(self, flat: list) -> list:
        it = iter(flat)
        return [torch_pytree.tree_unflatten([next(it) if _is_t(x) else x for x in new], spec)
                for spec, new in self.specs]


def _scalar_out(out, what: str, hooks) -> TensorProxy:
    if not _is_t(out):
        raise RuntimeError(f"{what}(f)(*args): Expected f(*args) to return a Tensor, got {type(out)} "
                           f"(at {_line(hooks)})")
    if out.ndim != 0:
        raise RuntimeError(f"{what}(f)(*args): Expected f(*args) to return a scalar Tensor, got tensor with "
                           f"{out.ndim} dims. Maybe you wanted to use the vjp or jacrev APIs instead? "
                           f"(at {_line(hooks)})")
    return out


# --- reverse mode --------------------------------------------------------------------

def grad_and_value(hooks, func: Callable, argnums=0, has_aux: bool = False, what: str = "grad_and_value"
                   ) -> Callable:
    def transformed(*args, **kwargs):
        nums = _argnums(argnums, len(args), what)
        d = _Diff(hooks, func, args, kwargs, nums, has_aux, what)
        out = _scalar_out(d.out, what, hooks)
        one = prims.full((), 1, device=out.device, dtype=out.dtype)
        grads = d.backward([one])
        g = grads[0] if isinstance(argnums, int) else tuple(grads)
        return (g, (out, d.aux)) if has_aux else (g, out)
    return transformed


def grad(hooks, func: Callable, argnums=0, has_aux: bool = False) -> Callable:
    gv = grad_and_value(hooks, func, argnums, has_aux, "grad")

    def transformed(*args, **kwargs):
        g, value = gv(*args, **kwargs)
        return (g, value[1]) if has_aux else g
    return transformed


def vjp(hooks, func: Callable, *primals, has_aux: bool = False):
    d = _Diff(hooks, func, primals, {}, tuple(range(len(primals))), has_aux, "vjp")
    out_leaves, out_spec = torch_pytree.tree_flatten(d.out)

    def vjp_fn(cotangents, *more):
        if more:                 # a tuple output's cotangents may come as separate arguments
            cotangents = (cotangents, *more)
        cots, spec = torch_pytree.tree_flatten(cotangents)
        if spec != out_spec:
            raise RuntimeError(f"Expected pytree structure of cotangents to be the same as pytree structure of "
                               f"outputs to the function. cotangents: {spec}, primal output: {out_spec}")
        return tuple(d.backward([c if _is_t(o) else None for o, c in zip(out_leaves, cots, strict=True)]))
    return (d.out, vjp_fn, d.aux) if has_aux else (d.out, vjp_fn)


def jvp(hooks, func: Callable, primals, tangents, *, strict: bool = False, has_aux: bool = False):
    what = "jvp"
    if not isinstance(primals, tuple) or not isinstance(tangents, tuple):
        raise RuntimeError(f"{what}(f, primals, tangents): Expected primals and tangents to be tuples")
    d = _Diff(hooks, func, primals, {}, tuple(range(len(primals))), has_aux, what)
    t_leaves, _ = torch_pytree.tree_flatten(tangents)
    t_leaves = [t for t in t_leaves if _is_t(t)]
    if len(t_leaves) != len(d.wrt):
        raise RuntimeError(f"{what}: Expected primals and tangents to have the same python structure")
    out_leaves, out_spec = torch_pytree.tree_flatten(d.out)
    # the VJP at a cotangent u (a fresh name), differentiated with respect to u
    us = []
    for o in out_leaves:
        u = _identity(prims.full(o.shape, 0, device=o.device, dtype=o.dtype)) if _is_t(o) else None
        if u is not None:
            u.requires_grad = True
        us.append(u)
    pad = [None] * (len(d.lin.outputs) - len(us))        # the aux outputs: no cotangent
    bsyms, grads = recorded(lambda us: d.lin.backward(us + pad), us)
    wrt_u = [u for u in us if u is not None]
    lin2 = linearize(bsyms, wrt_u, grads, current_trace().names, f"{what} at {_line(hooks)}")
    for u in wrt_u:
        u.requires_grad = False
    settle_requires_grad(lin2.forward)
    inline(lin2.forward)
    t_grads = [t if g is not None else None for g, t in zip(lin2.outputs, t_leaves, strict=True)]
    tangent_out = lin2.backward(t_grads)
    it = iter(tangent_out)
    outs = []
    for o in out_leaves:
        if not _is_t(o):
            outs.append(o)
            continue
        t = next(it)
        outs.append(t if t is not None else prims.full(o.shape, 0, device=o.device, dtype=o.dtype))
    tangent = torch_pytree.tree_unflatten(outs, out_spec)
    return (d.out, tangent, d.aux) if has_aux else (d.out, tangent)


def _jacobian(hooks, func: Callable, argnums, has_aux: bool, what: str, randomness: str | None = None) -> Callable:
    def transformed(*args, **kwargs):
        nums = _argnums(argnums, len(args), what)
        d = _Diff(hooks, func, args, kwargs, nums, has_aux, what)
        if randomness is not None:
            _check_forward_randomness(d, randomness, what, hooks)
        out_leaves, out_spec = torch_pytree.tree_flatten(d.out)
        per_out = []
        for j, o in enumerate(out_leaves):
            if not _is_t(o):
                raise RuntimeError(f"{what}: Expected f(*args) to return only tensors, got {type(o)} "
                                   f"(at {_line(hooks)})")
            jac = _rows(hooks, d, out_leaves, j, what)
            per_arg = d.unflatten(jac)
            per_out.append(per_arg[0] if isinstance(argnums, int) else tuple(per_arg))
        result = torch_pytree.tree_unflatten(per_out, out_spec)
        return (result, d.aux) if has_aux else result
    return transformed


def _rows(hooks, d: _Diff, out_leaves: list, j: int, what: str) -> list:
    """The Jacobian of output leaf ``j`` with respect to every differentiated
    tensor: the VJP recorded on one cotangent row, batched over the identity."""
    o = out_leaves[j]
    n = o.numel()
    eye = symbol_for(torch.eye)(n, dtype=o.dtype, device=o.device)
    basis = prims.reshape(eye, (n, *o.shape))
    row = basis.replace(name=current_trace().fresh_name("row"), shape=tuple(o.shape), requires_grad=False)
    bsyms, grads = recorded(d.lin.backward, [row if k == j else None for k in range(len(d.lin.outputs))])
    env = {row.name: basis}
    batch(bsyms, env, n, "error", f"{what} at {_line(hooks)}")
    out = []
    for g, w in zip(grads, d.wrt, strict=True):
        if g is None:
            jac = prims.full((*o.shape, *w.shape), 0, device=w.device, dtype=w.dtype)
        else:
            phys = env.get(g.name)
            if phys is None:
                phys = prims.broadcast_in_dim(g, (n, *g.shape), tuple(range(1, g.ndim + 1)))
            jac = prims.reshape(phys, (*o.shape, *w.shape))
        out.append(jac)
    return out


def _check_forward_randomness(d: _Diff, randomness: str, what: str, hooks) -> None:
    """jacfwd vmaps its function over the tangents in eager: a random draw there
    follows ``randomness``. Here the function runs once (the Jacobian comes
    from reverse mode): one draw, which is ``"same"``."""
    drawn = next((b for bsym in d.lin.forward for b in walk(bsym) if Tag.RANDOM in b.sym.tags), None)
    if drawn is None or randomness == "same":
        return
    if randomness == "error":
        raise RuntimeError(f"vmap: called random operation while in randomness error mode ({what} at "
                           f"{_line(hooks)}). Please either use the 'same' or 'different' randomness flags on vmap "
                           "or perform the randomness operation out of vmap")
    raise NotImplementedError(f"{what}(randomness={randomness!r}) of a function drawing random numbers (at "
                              f"{_line(hooks)}): thunderlite computes jacfwd by reverse mode, with one draw; "
                              "use randomness='same' or jacrev")


def jacrev(hooks, func: Callable, argnums=0, *, has_aux: bool = False, chunk_size=None,
           _preallocate_and_copy: bool = False) -> Callable:
    return _jacobian(hooks, func, argnums, has_aux, "jacrev")


def jacfwd(hooks, func: Callable, argnums=0, has_aux: bool = False, *, randomness: str = "error") -> Callable:
    return _jacobian(hooks, func, argnums, has_aux, "jacfwd", randomness)


def hessian(hooks, func: Callable, argnums=0) -> Callable:
    return _jacobian(hooks, _jacobian(hooks, func, argnums, False, "jacrev"), argnums, False, "jacfwd", "error")


# --- vmap ------------------------------------------------------------------------------

def _broadcast_dims(dims, tree, what: str):
    """``dims`` (an int/None prefix of ``tree``) given for every leaf of ``tree``."""
    if dims is None or isinstance(dims, int):
        return [dims] * len(torch_pytree.tree_leaves(tree))
    if type(dims) in (tuple, list) and type(tree) in (tuple, list) and len(dims) == len(tree):
        return [d for sub, t in zip(dims, tree, strict=True) for d in _broadcast_dims(sub, t, what)]
    if isinstance(dims, dict) and isinstance(tree, dict) and dims.keys() == tree.keys():
        return [d for k in tree for d in _broadcast_dims(dims[k], tree[k], what)]
    raise ValueError(f"{what}: in_dims is not compatible with the structure of `inputs`. in_dims has structure "
                     f"{torch_pytree.tree_structure(dims)} but inputs has structure "
                     f"{torch_pytree.tree_structure(tree)}.")


def vmap(hooks, func: Callable, in_dims=0, out_dims=0, randomness: str = "error", *, chunk_size=None) -> Callable:
    if randomness not in ("error", "different", "same"):
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. "
                           f"Got {randomness}")

    def transformed(*args, **kwargs):
        what = f"vmap({_fn_name(func)}) at {_line(hooks)}"
        logical, env, size = _map_inputs(args, in_dims, what)
        bsyms, out = record(hooks, func, logical, kwargs)
        batch(bsyms, env, size, randomness, what)
        return _map_outputs(out, out_dims, env, size, what, _fn_name(func))
    return transformed


def _map_inputs(args: tuple, in_dims, what: str) -> tuple[tuple, dict, Any]:
    """The per-example arguments, the physical (batch-first) value of each
    mapped one by name, and the batch size."""
    dims = in_dims if not isinstance(in_dims, list) else tuple(in_dims)
    if isinstance(dims, tuple) and len(dims) != len(args):
        raise ValueError(f"{what}: in_dims is not compatible with the structure of `inputs`. in_dims has length "
                         f"{len(dims)} but inputs has length {len(args)}.")
    leaves, spec = torch_pytree.tree_flatten(args)
    size, env, logical = None, {}, []
    for leaf, dim in zip(leaves, _broadcast_dims(dims, args, what), strict=True):
        if dim is None:
            logical.append(leaf)
            continue
        if not _is_t(leaf):
            raise ValueError(f"{what}: Got in_dim={dim} for an input but the input is of type {type(leaf)}. "
                             "We cannot vmap over non-Tensor arguments, please use None as the respective in_dim")
        if leaf.ndim == 0 or not -leaf.ndim <= dim < leaf.ndim:
            raise ValueError(f"{what}: Got in_dim={dim} for some input, but that input is a Tensor of "
                             f"dimensionality {leaf.ndim} so expected in_dim to satisfy "
                             f"-{leaf.ndim} <= in_dim < {leaf.ndim}.")
        d = dim % leaf.ndim
        if size is None:
            size = leaf.shape[d]
        elif leaf.shape[d] != size:
            raise ValueError(f"{what}: Expected all tensors to have the same size in the mapped dimension, "
                             f"got sizes {size} and {leaf.shape[d]} for the mapped dimension")
        phys = leaf if d == 0 else symbol_for(torch.movedim)(leaf, d, 0)
        lo = phys.replace(name=current_trace().fresh_name("t"), shape=tuple(phys.shape[1:]))
        env[lo.name] = phys
        logical.append(lo)
    if size is None:
        raise ValueError(f"{what}: There are no tensors to vmap over: at least one input needs a non-None in_dim")
    return torch_pytree.tree_unflatten(logical, spec), env, size


def _map_outputs(out, out_dims, env: dict, size, what: str, name: str):
    """The per-example outputs as vmap returns them: the batch at ``out_dims``."""
    out_leaves, out_spec = torch_pytree.tree_flatten(out)
    result = []
    for o, od in zip(out_leaves, _broadcast_dims(out_dims, out, what), strict=True):
        if od is None:          # returned as it is: it must be the same for every example
            if _is_t(o) and o.name in env:
                raise ValueError(f"{what}: `{name}` can not return a BatchedTensor when out_dim is None "
                                 "(the output depends on the mapped inputs)")
            result.append(o)
            continue
        if not _is_t(o):
            raise ValueError(f"{what}: `{name}` must only return Tensors, got type {type(o)}. "
                             "Did you mean to set out_dims= to None for output?")
        phys = env.get(o.name)
        if phys is None:
            phys = prims.broadcast_in_dim(o, (size, *o.shape), tuple(range(1, o.ndim + 1)))
        if od % phys.ndim != 0:
            phys = symbol_for(torch.movedim)(phys, 0, od)
        result.append(phys)
    return torch_pytree.tree_unflatten(result, out_spec)


# --- functional_call ------------------------------------------------------------------

@contextlib.contextmanager
def _overlay(hooks, module: torch.nn.Module, values: dict, tie_weights: bool, strict: bool):
    """``module``'s parameters and buffers read as ``values`` (by dotted name)."""
    st = hooks.state
    names = dict(module.named_parameters(remove_duplicate=False))
    names.update(module.named_buffers(remove_duplicate=False))
    if strict:
        missing = sorted(set(names) - set(values))
        unexpected = sorted(set(values) - set(names))
        if missing or unexpected:
            raise RuntimeError(f"Error(s) in reparametrizing for {type(module).__name__}: missing keys {missing}, "
                               f"unexpected keys {unexpected}")
    values = dict(values)
    if tie_weights:
        by_tensor = {}
        for name, t in names.items():
            by_tensor.setdefault(id(t), []).append(name)
        for tied in by_tensor.values():
            given = [n for n in tied if n in values]
            if len(tied) > 1 and given:
                for n in tied:
                    values.setdefault(n, values[given[0]])
    overlay = {}
    for name, value in values.items():
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        if isinstance(value, torch.Tensor):
            value = st.enter(None, value)
        overlay[(id(owner), attr)] = (owner, value)
        # code reading the slots (``self._parameters[name]``, ``parameters()``) sees the values too
        for slot in ("_parameters", "_buffers"):
            if attr in owner.__dict__.get(slot, ()):
                key = (id(owner), slot)
                if key not in overlay:
                    overlay[key] = (owner, dict(owner.__dict__[slot]))
                overlay[key][1][attr] = value
    saved = {key: st.attr_writes.get(key, _MISSING) for key in overlay}
    st.attr_writes.update(overlay)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is _MISSING:
                del st.attr_writes[key]
            else:
                st.attr_writes[key] = old


def functional_call(hooks, module: torch.nn.Module, parameter_and_buffer_dicts, args=None, kwargs=None, *,
                    tie_weights: bool = True, strict: bool = False):
    dicts = parameter_and_buffer_dicts
    if isinstance(dicts, dict):
        values = dict(dicts)
    else:
        values = {}
        for dct in dicts:
            overlap = set(values) & set(dct)
            if overlap:
                raise ValueError(f"{sorted(overlap)} appeared in multiple dictionaries; behavior of "
                                 "functional call is ambiguous")
            values.update(dct)
    args = () if args is None else args if isinstance(args, tuple) else (args,)
    with _overlay(hooks, module, values, tie_weights, strict):
        return interpret(module, hooks)(*args, **(kwargs or {}))


def _grad_impl(hooks, func, argnums, has_aux, args, kwargs):
    return grad(hooks, func, argnums, has_aux)(*args, **kwargs)


def _grad_and_value_impl(hooks, func, argnums, has_aux, args, kwargs):
    return grad_and_value(hooks, func, argnums, has_aux)(*args, **kwargs)


def _vmap_impl(hooks, func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs):
    return vmap(hooks, func, in_dims, out_dims, randomness, chunk_size=chunk_size)(*args, **kwargs)


def replacements() -> dict:
    """torch.func callable -> ``replacement(hooks, *args, **kwargs)``. The
    ``*_impl`` entries catch a ``grad``/``vmap`` made outside the jitted
    function (``g = grad(f)`` at module level) and called inside it."""
    return {torch.func.grad: grad, torch.func.grad_and_value: grad_and_value, torch.func.vjp: vjp,
            torch.func.jvp: jvp, torch.func.jacrev: jacrev, torch.func.jacfwd: jacfwd,
            torch.func.hessian: hessian, torch.func.vmap: vmap, torch.func.functional_call: functional_call,
            eager_transforms.grad_impl: _grad_impl, eager_transforms.grad_and_value_impl: _grad_and_value_impl,
            functorch_vmap.vmap_impl: _vmap_impl}
