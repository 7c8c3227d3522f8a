"""``DTensor`` s inside traces (docs/architecture.md §15, "DTensor proxies").

A ``DTensor`` that enters a traced program (an argument, a module attribute,
``DTensor.from_local`` of a traced tensor) becomes a ``DTensorProxy``: the
proxy of its *local* tensor plus its mesh, placements and global shape and
stride (the prologue guards the placements and the mesh's identity). The
trace itself only ever holds local tensors.

An op on ``DTensorProxy`` s asks torch what to do rather than knowing it:
the torch callable runs once on meta-device ``DTensor`` s with the same
specs under a dispatch mode that catches the ATen op ``DTensor`` dispatches,
and ``DTensor``'s own sharding propagator
(``sharding_propagator.propagate_op_sharding``) says which inputs must be
redistributed first and what the output's spec is. The redistributions are
recorded as the torch language's collectives on the local proxies
(``Shard(d)``→``Replicate``: all-gather; ``Partial``→``Replicate``:
all-reduce; ``Partial``→``Shard(d)``: reduce-scatter; ``Replicate``→
``Shard(d)``: this rank's slice; ``Replicate``→``Partial(sum)``: zeros off
rank 0), then the op itself on the local tensors; its result is checked
against the local shape ``DTensor`` computed. A call ``DTensor`` runs as
several ATen ops (``F.linear``) is replayed op by op (``_replay_aten``). ``to_local``, ``full_tensor``,
``redistribute`` and ``from_local`` work on the records; a ``DTensorProxy``
returned by the program is rebuilt with ``DTensor.from_local`` on the real
local result (``materialize``).

Shards may be uneven (``torch.chunk``'s split, as ``DTensor``'s): gathers
pad them to equal chunks and cut the result. An op whose non-tensor
arguments propagation rewrites for the shards (a ``view``'s sizes) is
replayed as its ATen op with those arguments, as ``DTensor`` runs it.
Refused by name (``DTensorRefused``): multi-dimensional meshes, a call with
an ATen op that has no ``torch.<op>`` or ``Tensor`` method symbol, in-place
ops that would redistribute what they write, ``__setitem__``,
``Shard``→``Partial``, and programs that need gradients.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from thunderlite.core.proxies import _OPERATORS, NumberProxy, TensorProxy
from thunderlite.torch.ops import creation, shapes
from thunderlite.torch.ops import distributed as tdist


class DTensorRefused(NotImplementedError):
    """A DTensor construct thunderlite does not trace (the message names it)."""


def dtensor_type() -> type:
    """``torch.distributed.tensor.DTensor`` (imported on first use)."""
    from torch.distributed.tensor import DTensor
    return DTensor


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a real ``torch.distributed.tensor.DTensor``."""
    import sys
    # getattr: another thread may be importing the module (no DTensor exists before its class does)
    cls = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return cls is not None and isinstance(t, cls)


class _Mesh:
    """The 1-D mesh facts a trace needs: c10d group name, size, this rank."""

    def __init__(self, mesh: Any):
        if mesh.ndim != 1:
            raise DTensorRefused(f"DTensor on a {mesh.ndim}-dimensional device mesh {tuple(mesh.shape)}: only "
                                 "1-D meshes are traced")
        self.mesh = mesh
        self.group = mesh.get_group(0).group_name
        self.world = mesh.size(0)
        self.rank = mesh.get_local_rank(0)


class DTensorProxy:
    """A ``DTensor`` while tracing: ``local`` is its local tensor's proxy, the
    rest its spec. Metadata (``shape``, ``size()``, ``dtype``...) is the global
    tensor's, as on a ``DTensor``."""

    def __init__(self, local: TensorProxy, mesh: Any, placements: tuple, shape: tuple, stride: tuple):
        self.local = local
        self.device_mesh = mesh
        self.placements = tuple(placements)
        self.shape = torch.Size(shape)
        self._stride = tuple(stride)
        self.where: str | None = None         # how the program reached it, for an input (``of_input``)

    # --- metadata ---------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.local.dtype

    @property
    def device(self) -> torch.device:
        return self.local.device

    @property
    def requires_grad(self) -> bool:
        return self.local.requires_grad

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def stride(self, dim: int | None = None):
        return self._stride if dim is None else self._stride[dim]

    def numel(self) -> int:
        return self.shape.numel()

    def is_contiguous(self, memory_format: torch.memory_format = torch.contiguous_format) -> bool:
        return _meta(self).is_contiguous(memory_format=memory_format)       # metadata: no ATen op

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"DTensorProxy({self.local.name}, {tuple(self.shape)}, {self.placements})"

    # --- DTensor's own API --------------------------------------------------------------------
    def to_local(self, *, grad_placements: Any = None) -> TensorProxy:
        return self.local

    def redistribute(self, device_mesh: Any = None, placements: Any = None, *, async_op: bool = False,
                     forward_dtype: Any = None, backward_dtype: Any = None) -> DTensorProxy:
        if device_mesh is not None and device_mesh is not self.device_mesh:
            raise DTensorRefused("DTensor.redistribute to another device mesh")
        if forward_dtype is not None or backward_dtype is not None:
            raise DTensorRefused("DTensor.redistribute(forward_dtype=/backward_dtype=)")
        if placements is None:
            placements = self.placements
        local = redistribute_local(self.local, self.placements[0], tuple(placements)[0], _Mesh(self.device_mesh),
                                   self.shape)
        return DTensorProxy(local, self.device_mesh, placements, self.shape, self._stride)

    def full_tensor(self, *, grad_placements: Any = None) -> TensorProxy:
        from torch.distributed.tensor import Replicate
        return self.redistribute(placements=[Replicate()] * self.device_mesh.ndim).local

    # --- torch ops ------------------------------------------------------------------------------
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "grad":
            raise DTensorRefused(f"the .grad of the DTensor{' ' + self.where if self.where else ''}: gradients of "
                                 "DTensors are not traced (run the optimizer step over DTensor parameters eagerly)")
        method = getattr(torch.Tensor, name, None)
        if method is None:
            raise AttributeError(f"'DTensor' object has no attribute {name!r}")
        if not callable(method):        # a property that computes (``.T``, ``.mT``)
            def read(t):
                return getattr(t, name)
            return dispatch(read, read, (self,), {}, f"Tensor.{name}")

        def call(*args, **kwargs):
            return dispatch(method, lambda t, *a, **k: getattr(t, name)(*a, **k), (self, *args), kwargs,
                            f"Tensor.{name}")
        return call


def _refuse_setitem(self, *args):
    raise DTensorRefused("the in-place op __setitem__ on a DTensor")


def _inplace_operator(name: str) -> Callable:
    """``a += b``: the ``torch.Tensor`` dunder on the shards, ``a`` written in place."""
    def write(self, other):
        return dispatch(getattr(torch.Tensor, name), lambda t, o: getattr(t, name)(o), (self, other), {}, name,
                        inplace=True)
    return write


def _install_operators() -> None:
    """Every operator ``TensorProxy`` has (``core.proxies._OPERATORS``), dispatched
    as the ``torch.Tensor`` dunder: reflected ones (``2 - x``) compute
    ``other op self`` on the local tensors too; in-place ones write the shards."""
    for name in _OPERATORS:
        base = f"__{name[3:]}"          # the operator an ``__r*__`` reflects, an ``__i*__`` writes
        if name == "__setitem__":
            DTensorProxy.__setitem__ = _refuse_setitem
        elif name.startswith("__i") and base in _OPERATORS:
            setattr(DTensorProxy, name, _inplace_operator(name))
        elif name == "__getitem__":
            setattr(DTensorProxy, name, lambda self, key: dispatch(torch.Tensor.__getitem__, operator.getitem,
                                                                   (self, key), {}, "__getitem__"))
        elif name == "__pos__":           # no ATen op: ``+x`` is ``x``
            DTensorProxy.__pos__ = lambda self: self
        elif name in ("__neg__", "__abs__", "__invert__"):
            setattr(DTensorProxy, name, _unary(name))
        elif name.startswith("__r") and base in _OPERATORS:
            setattr(DTensorProxy, name, _binary(name, _operator_fn(base), reflected=True))
        else:
            setattr(DTensorProxy, name, _binary(name, _operator_fn(name), reflected=False))
    # a truth value or number needs the data: the local proxy's data-dependence error
    DTensorProxy.__bool__ = lambda self: bool(self.local)
    DTensorProxy.__int__ = lambda self: int(self.local)
    DTensorProxy.__float__ = lambda self: float(self.local)
    DTensorProxy.__index__ = lambda self: self.local.__index__()
    DTensorProxy.__hash__ = object.__hash__


def _operator_fn(dunder: str) -> Callable:
    """``operator``'s function for a dunder (``__and__`` is ``operator.and_``)."""
    bare = dunder.strip("_")
    return getattr(operator, bare, None) or getattr(operator, bare + "_")


def _unary(name: str) -> Callable:
    tensor_fn, fn = getattr(torch.Tensor, name), _operator_fn(name)

    def op(self):
        return dispatch(tensor_fn, fn, (self,), {}, name)
    return op


def _binary(name: str, fn: Callable, reflected: bool) -> Callable:
    tensor_fn = getattr(torch.Tensor, name)

    def op(self, other):
        if reflected:       # ``other op self``: the arguments in the order the local op takes them
            return dispatch(lambda a, b: tensor_fn(b, a), fn, (other, self), {}, name)
        return dispatch(tensor_fn, fn, (self, other), {}, name)
    return op


_install_operators()


def has_dtensor(args: tuple, kwargs: dict) -> bool:
    """Whether a call's arguments (or lists/tuples among them) hold a ``DTensorProxy``."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, DTensorProxy) or (type(a) in (list, tuple)
                                          and any(isinstance(b, DTensorProxy) for b in a)):
            return True
    return False


def _meta(p: DTensorProxy):
    loc = torch.empty(p.local.shape, dtype=p.local.dtype, device="meta")
    return dtensor_type().from_local(loc, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p._stride)


def from_local(local: Any, device_mesh: Any = None, placements: Any = None, *, run_check: bool = False,
               shape: Any = None, stride: Any = None, grad_placements: Any = None) -> DTensorProxy:
    """``DTensor.from_local`` of a traced tensor: a record on its proxy."""
    if not isinstance(local, TensorProxy):
        raise DTensorRefused(f"DTensor.from_local of a {type(local).__name__}")
    if run_check:
        raise DTensorRefused("DTensor.from_local(run_check=True) (it broadcasts replicated shards)")
    if device_mesh is None or placements is None:
        raise DTensorRefused("DTensor.from_local without an explicit device_mesh and placements")
    _refuse_grad(local, "DTensor.from_local of a tensor that requires grad")
    meta = dtensor_type().from_local(torch.empty(local.shape, dtype=local.dtype, device="meta"), device_mesh,
                            tuple(placements), run_check=False, shape=shape, stride=stride)
    return DTensorProxy(local, device_mesh, tuple(meta.placements), tuple(meta.shape), meta.stride())


def of_input(dtensor: Any, local: TensorProxy, where: str) -> DTensorProxy:
    """The proxy of a ``DTensor`` that entered the program (as ``where``), ``local``
    its local tensor's."""
    if dtensor.requires_grad and torch.is_grad_enabled():
        raise DTensorRefused(f"the DTensor {where} (placements {tuple(dtensor.placements)}), which requires grad: "
                             f"{_GRAD_HINT}")
    _refuse_grad(local, f"the DTensor {where}, whose local tensor requires grad")
    try:
        p = DTensorProxy(local, dtensor.device_mesh, tuple(dtensor.placements), tuple(dtensor.shape),
                         dtensor.stride())
    except DTensorRefused as e:          # named: which of the program's DTensors it is
        raise DTensorRefused(f"the DTensor {where}: {e}") from None
    p.where = where
    return p


def materialize(p: DTensorProxy, local: torch.Tensor):
    """The ``DTensor`` a returned ``DTensorProxy`` stands for, on the real local result."""
    return dtensor_type().from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                     stride=p._stride)


_GRAD_HINT = ("DTensor programs that need gradients are not traced yet (run them under torch.no_grad(), or on "
              "tensors that do not require grad)")


def _refuse_grad(local: TensorProxy, what: str) -> None:
    if local.requires_grad and torch.is_grad_enabled():
        raise DTensorRefused(f"{what}: {_GRAD_HINT}")


# --- redistribution as collectives on the local tensor ----------------------------------------
def redistribute_local(t: TensorProxy, src: Any, dst: Any, mesh: _Mesh, global_shape: tuple) -> TensorProxy:
    """The local tensor of placement ``dst`` from the local tensor ``t`` of ``src`` (1-D mesh)."""
    if src == dst:
        return t
    if mesh.world == 1 and not src.is_partial() and not dst.is_partial():
        return t            # one rank: its shard is the whole tensor
    if dst.is_replicate():
        if src.is_shard():
            return _gather_shards(t, _dim(src, t), mesh, global_shape)
        if src.is_partial():
            return tdist.wait(tdist.all_reduce(t, src.reduce_op, mesh.group))
    if dst.is_shard():
        d = _dim(dst, t)
        if src.is_replicate():
            return _my_chunk(t, d, mesh)
        if src.is_shard():
            return _my_chunk(_gather_shards(t, _dim(src, t), mesh, global_shape), d, mesh)
        if src.is_partial():
            chunk, _, length = _chunk_bounds(t.shape[d], mesh)
            x = _padded(t, d, chunk * mesh.world - t.shape[d])       # uneven: every rank scatters equal chunks
            x = x if d == 0 else shapes.cat(list(x.chunk(mesh.world, d)), 0)
            mine = tdist.wait(tdist.reduce_scatter(x.contiguous(), src.reduce_op, mesh.world, mesh.group))
            return mine if length == chunk else mine.narrow(d, 0, length)
    if dst.is_partial() and src.is_replicate():
        if dst.reduce_op in ("sum",) and mesh.rank != 0:
            return creation.zeros_like(t)
        if dst.reduce_op in ("sum", "avg", "max", "min"):
            return t
    raise DTensorRefused(f"redistributing a DTensor from {src} to {dst}")


def _dim(pl: Any, t: TensorProxy) -> int:
    return pl.dim if pl.dim >= 0 else pl.dim + t.ndim


def _chunk_bounds(n: int, mesh: _Mesh) -> tuple[int, int, int]:
    """How ``Shard`` splits ``n`` rows over the ranks (``torch.chunk``'s split:
    chunks of ``ceil(n / world)``, the last ones shorter or empty): the chunk
    size, and this rank's start and length."""
    chunk = -(-n // mesh.world)
    start = min(mesh.rank * chunk, n)
    return chunk, start, min(chunk, n - start)


def _padded(t: TensorProxy, d: int, extra: int) -> TensorProxy:
    if extra == 0:
        return t
    from thunderlite.torch.ops.nn import pad
    return pad(t, [0, 0] * (t.ndim - 1 - d) + [0, extra])


def _gather_shards(t: TensorProxy, d: int, mesh: _Mesh, global_shape: tuple) -> TensorProxy:
    """The whole tensor from every rank's ``Shard(d)``: an all-gather of equal
    sizes, so an uneven shard is padded to the chunk size and the result cut
    to the global size (only the last ranks' chunks are short, so the padding
    all lands past the real rows)."""
    n = global_shape[d]
    chunk, _, length = _chunk_bounds(n, mesh)
    full = tdist._funcol_all_gather_tensor(_padded(t, d, chunk - length), d, mesh.group)
    return full if full.shape[d] == n else full.narrow(d, 0, n)


def _my_chunk(t: TensorProxy, d: int, mesh: _Mesh) -> TensorProxy:
    _, start, length = _chunk_bounds(t.shape[d], mesh)
    return t.narrow(d, start, length)


# --- ops ------------------------------------------------------------------------------------------
class _Capture(TorchDispatchMode):
    """Records the ATen ops ``DTensor`` dispatches and propagation's verdict on each."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dt = dtensor_type()
        if not any(isinstance(a, dt) for a in pytree.tree_leaves((args, kwargs))):
            self.ops.append((func, args, kwargs, None, None, None))   # no DTensor: refused if replayed
            return func(*args, **kwargs)
        dispatcher = dt._op_dispatcher
        if func in dispatcher._random_ops or func in dispatcher._custom_op_handlers:
            raise DTensorRefused(f"{func} on a DTensor (DTensor handles it outside sharding propagation: random "
                                 "numbers per shard, or a custom handler)")
        info = dt._op_dispatcher.unwrap_to_op_info(func, args, kwargs)
        sharding = dt._op_dispatcher.sharding_propagator.propagate_op_sharding(info.schema)
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, info, sharding, out))
        return out


def _meta_value(a: Any, by_local: dict) -> Any:
    if isinstance(a, DTensorProxy):
        m = _meta(a)
        by_local[id(m._local_tensor)] = a
        return m
    if isinstance(a, TensorProxy):
        return torch.empty(a.shape, dtype=a.dtype, device="meta")
    if isinstance(a, NumberProxy):
        return a.value
    return a


def dispatch(torch_fn: Callable, local_fn: Callable, args: tuple, kwargs: dict, what: str,
             inplace: bool | None = None) -> Any:
    """``torch_fn(*args, **kwargs)`` with ``DTensorProxy`` arguments: the collectives
    ``DTensor``'s propagation asks for, then ``local_fn`` on the local tensors.
    An in-place op (``mul_``, ``+=``) writes its first argument's shard, which
    must be a ``DTensorProxy`` that keeps its placements (``DTensor`` itself
    refuses to redistribute the tensor it writes), and returns that argument."""
    name = getattr(torch_fn, "__name__", None) or what
    if inplace is None:
        inplace = name.endswith("_") and not name.endswith("__")
    if inplace and not (args and isinstance(args[0], DTensorProxy)):
        raise DTensorRefused(f"the in-place op {name} writing a tensor that is not a DTensor with DTensor operands")
    flat, spec = pytree.tree_flatten((args, kwargs))
    for a in flat:
        if isinstance(a, (TensorProxy, DTensorProxy)):
            _refuse_grad(a.local if isinstance(a, DTensorProxy) else a, f"{what} on a tensor that requires grad")
    dts = [a for a in flat if isinstance(a, DTensorProxy)]
    mesh_obj = dts[0].device_mesh
    if any(d.device_mesh is not mesh_obj for d in dts):
        raise DTensorRefused(f"{what} on DTensors of different device meshes")
    by_local: dict[int, DTensorProxy] = {}
    margs, mkwargs = pytree.tree_unflatten([_meta_value(a, by_local) for a in flat], spec)
    cap = _Capture()
    try:
        with cap:
            meta_out = torch_fn(*margs, **mkwargs)
    except DTensorRefused:
        raise
    except (NotImplementedError, RuntimeError, TypeError, ValueError) as e:
        raise DTensorRefused(f"{what} on a DTensor: DTensor (on meta tensors) raised {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    if not cap.ops:
        raise DTensorRefused(f"{what} on a DTensor: DTensor dispatched no ATen op for it")
    if len(cap.ops) > 1:
        if inplace:
            raise DTensorRefused(f"the in-place op {name} on a DTensor, which DTensor runs as {len(cap.ops)} ATen "
                                 "ops")
        return _replay_aten(cap.ops, meta_out, by_local, _Mesh(mesh_obj), flat, margs, mkwargs, what)
    op, _, _, info, sharding, _ = cap.ops[0]
    if info is None:
        raise DTensorRefused(f"{what} on a DTensor: DTensor dispatched {op} without a DTensor argument")
    targets, rewrites = _targets(op, info, sharding, by_local)
    if rewrites and not inplace:        # the ATen op itself, with the sizes propagation gives the shards
        return _replay_aten(cap.ops, meta_out, by_local, _Mesh(mesh_obj), flat, margs, mkwargs, what)
    if inplace:
        written = args[0]
        if id(written) in targets or rewrites or not isinstance(meta_out, dtensor_type()) \
                or tuple(meta_out.placements) != tuple(written.placements) \
                or tuple(meta_out.shape) != tuple(written.shape):
            raise DTensorRefused(f"the in-place op {name} on a DTensor: it would change the placements or shape "
                                 "of the DTensor it writes")
    mesh = _Mesh(mesh_obj)
    local_flat = []
    for a in flat:
        if isinstance(a, DTensorProxy):
            dst = targets.get(id(a))
            a = a.local if dst is None else redistribute_local(a.local, a.placements[0], dst[0], mesh, a.shape)
        local_flat.append(a)
    largs, lkwargs = pytree.tree_unflatten(local_flat, spec)
    out = local_fn(*largs, **lkwargs)
    if inplace:
        _wrap_outputs(meta_out, out, mesh_obj, what)      # the shard's shape checked against DTensor's
        return args[0]
    return _wrap_outputs(meta_out, out, mesh_obj, what)


# ATen ops DTensor adds that change nothing in a trace without gradients (``zeros_like`` detaches its result)
_PASS_THROUGH = frozenset({"detach", "alias"})


def _identity(t: TensorProxy) -> TensorProxy:
    return t


def _replay_aten(ops: list, meta_out: Any, by_local: dict, mesh: _Mesh, flat: list, margs: tuple,
                 mkwargs: dict, what: str) -> Any:
    """A torch call ``DTensor`` runs as several ATen ops (``F.linear``: ``t`` and
    ``mm``): each op replayed in order as its ``torch.<op>`` namesake's symbol on
    the local tensors, after the redistributions propagation asked for."""
    from thunderlite.torch import symbol_for
    plain = {id(m): a for m, a in zip(pytree.tree_leaves((margs, mkwargs)), flat, strict=True)
             if isinstance(a, TensorProxy)}          # meta stand-ins of plain traced tensors
    dt = dtensor_type()
    known = dict(by_local)         # id(meta local tensor) -> DTensorProxy (inputs, then results)
    made: dict[int, Any] = {}      # id(meta plain tensor result) -> its proxy
    for func, args, kwargs, info, sharding, out in ops:
        name = func.overloadpacket.__name__
        sym = _identity if name in _PASS_THROUGH else (symbol_for(getattr(torch, name, None))
                                                        or symbol_for(getattr(torch.Tensor, name, None)))
        if info is None or sym is None:
            raise DTensorRefused(f"{what} on a DTensor, which DTensor runs as {len(ops)} ATen ops (" +
                                 ", ".join(str(o[0]) for o in ops) + f"): {func} cannot be replayed")
        targets, rewrites = _targets(func, info, sharding, known)
        if rewrites:
            if info.args_tree_spec is None:
                args = tuple(rewrites.get(i, a) for i, a in enumerate(args))
            else:
                leaves, tree = pytree.tree_flatten(args)
                args = pytree.tree_unflatten([rewrites.get(i, a) for i, a in enumerate(leaves)], tree)

        def local(a, targets=targets, func=func):
            if isinstance(a, dt):
                p = known.get(id(a._local_tensor))
                if p is None:
                    raise DTensorRefused(f"{what}: {func} reads a DTensor made outside the traced ops")
                dst = targets.get(id(p))
                return p.local if dst is None else redistribute_local(p.local, p.placements[0], dst[0], mesh,
                                                                      p.shape)
            if isinstance(a, torch.Tensor):
                v = plain.get(id(a), made.get(id(a)))
                if v is None:
                    raise DTensorRefused(f"{what}: {func} reads a tensor made outside the traced ops")
                return v
            return a
        largs, lkwargs = pytree.tree_map(local, (args, kwargs))
        result = _wrap_outputs(out, sym(*largs, **lkwargs), mesh.mesh, f"{what} ({func})")
        for m, r in zip(pytree.tree_leaves(out), pytree.tree_leaves(result), strict=True):
            if isinstance(m, dt):
                known[id(m._local_tensor)] = r
            elif isinstance(m, torch.Tensor):
                made[id(m)] = r

    def final(m):
        if isinstance(m, dt) and id(m._local_tensor) in known:
            return known[id(m._local_tensor)]
        if isinstance(m, torch.Tensor):
            if id(m) not in made:
                raise DTensorRefused(f"{what}: its result is not one of the traced ops' results")
            return made[id(m)]
        return m
    return pytree.tree_map(final, meta_out)


def _targets(op: Any, info: Any, sharding: Any, by_local: dict) -> tuple[dict[int, tuple], dict[int, Any]]:
    """id(DTensorProxy) -> the placements propagation wants it in before ``op``;
    and the non-tensor arguments it rewrites for the shards (a view's sizes are
    the local ones), by position among the op's (flattened) arguments."""
    if sharding.output_spec is None:
        raise DTensorRefused(f"{op} on a DTensor (no output spec from sharding propagation)")
    if not sharding.needs_redistribute:
        return {}, {}
    suggested = sharding.redistribute_schema
    new_flat = pytree.tree_leaves(suggested.args_schema) if info.args_tree_spec is not None \
        else suggested.args_schema
    targets: dict[int, tuple] = {}
    rewrites: dict[int, Any] = {}
    for i, old in enumerate(info.flat_args_schema):
        new = new_flat[i]
        if type(old).__name__ == "DTensorSpec":
            p = by_local.get(id(info.local_args[i]))
            if p is None:
                raise DTensorRefused(f"{op}: an argument DTensor made inside the call")
            if old != new:
                if id(p) in targets and targets[id(p)] != tuple(new.placements):
                    raise DTensorRefused(f"{op} wants one DTensor in two placements")
                targets[id(p)] = tuple(new.placements)
        elif not _same(old, new):
            rewrites[i] = new
    return targets, rewrites


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except (TypeError, RuntimeError, ValueError):
        return a is b


def _wrap_outputs(meta_out: Any, out: Any, mesh: Any, what: str) -> Any:
    dt = dtensor_type()
    meta_flat, meta_spec = pytree.tree_flatten(meta_out)
    out_flat, out_spec = pytree.tree_flatten(out)
    if len(meta_flat) != len(out_flat):
        raise DTensorRefused(f"{what} on a DTensor: its local result does not match DTensor's")
    wrapped = []
    for m, o in zip(meta_flat, out_flat, strict=True):
        if isinstance(m, dt):
            if not isinstance(o, TensorProxy) or tuple(o.shape) != tuple(m._local_tensor.shape):
                want = tuple(m._local_tensor.shape)
                raise DTensorRefused(f"{what} on a DTensor: the op on the local shard gives "
                                     f"{getattr(o, 'shape', o)}, DTensor's local result is {want}")
            o = DTensorProxy(o, mesh, tuple(m.placements), tuple(m.shape), m.stride())
        wrapped.append(o)
    return pytree.tree_unflatten(wrapped, out_spec)
