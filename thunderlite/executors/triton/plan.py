"""What one generated Triton kernel computes: the analysis of a fusion region.

A region (a run of torch-language symbols, flattened to prims) becomes one
kernel over a 2-D tile space ``[M, N]`` of a *domain* shape ``S`` (the largest
shape in the region):

- ``R`` (the *row* dims) are the domain dims the region's row reductions reduce;
  ``N`` is their element count (any: a row longer than a block is reduced in a
  loop over column blocks, triton/codegen.py); the other dims ``K`` enumerate ``M`` rows. A pointwise region
  has ``R = ()`` and ``N = 1``.
- every tensor value is *aligned* to the domain: for each of its dims, the domain
  dim it runs along (None for a size-1 dim). A value varying along ``K`` dims is a
  ``[BM, ...]`` tile, along ``R`` dims a ``[..., BN]`` tile; ``[BM, 1]`` tiles hold
  per-row values (a reduction's result), ``[1, BN]`` per-column ones (a
  layer-norm weight), ``[1, 1]`` uniform ones.
- a reduction over every dim its input varies along, rows included (the mean
  over the batch of a cross-entropy), is a *total*: the kernel then runs as one
  program looping over the rows and finishes the totals after the loop; values
  computed from totals may only meet other totals and literals.

Inputs are read through their strides (broadcast dims have stride 0), so
contiguous, strided and expanded inputs all work. Anything else (a reshape that
moves data, a permute, an unsupported prim or dtype) raises ``Unsupported``
and the region is not claimed.

Example: ``softmax(x)`` for ``x: f32[4, 8]`` has ``S = (4, 8)``, ``R = (1,)``,
``M = 4``, ``N = 8``; ``amax`` and ``sum`` are row reductions, ``x - max`` is a
``[BM, BN]`` tile, the result is stored as one.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from thunderlite.core.aliasing import output_aliases_input
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag

MAX_ROW = 16384
"""Largest row one program holds whole (a *persistent* reduction); longer rows loop over column blocks."""

FEW_ROWS, LONG_ROW = 16, 1 << 17
"""Fewer than ``FEW_ROWS`` rows longer than ``LONG_ROW`` are refused: one program per row would
leave most of a GPU idle, where torch splits such a reduction across many programs."""

MAX_TOTAL_WORK = 1 << 20
"""Most elements a region with totals may cover: its one program loops over every row, so a larger
region is cut before the total, which then runs as a kernel of its own."""

SUPPORTED_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                              torch.float16, torch.bfloat16, torch.float32, torch.float64})

ELEMENTWISE = frozenset({
    "neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "erf", "sigmoid", "floor", "ceil",
    "trunc", "reciprocal", "bitwise_not", "logical_not", "isfinite", "isnan", "isinf",
    "add", "sub", "mul", "div", "maximum", "minimum", "bitwise_and", "bitwise_or", "bitwise_xor",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "lerp", "pow",
    "where", "convert_element_type", "expm1", "log1p", "tanh"})
"""Elementwise prims the code generator translates (triton.codegen.EXPRESSIONS and _MULTI_LINE)."""

FLOAT_ONLY = frozenset({"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "erf", "sigmoid", "expm1", "log1p",
                        "tanh", "reciprocal", "div", "lerp", "floor", "ceil", "trunc"})
INT_ONLY = frozenset({"bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor"})
POW_EXPONENTS = frozenset({0, 1, 2, 3, 0.5, -1, -2})
ROW_REDUCTIONS = frozenset({"sum", "amax", "amin", "var", "var_mean"})
TOTAL_REDUCTIONS = frozenset({"sum", "amax", "amin"})
_UNCLAIMABLE_TAGS = frozenset({Tag.RANDOM, Tag.INPLACE, Tag.ALIAS_BARRIER, Tag.DONT_DCE, Tag.RETURN,
                               Tag.ORDER_BARRIER, Tag.OPAQUE})
# A view returned to the user must share its input's storage, which a kernel's fresh
# output cannot: a symbol whose output may alias an input (its ATen schema says so,
# core/aliasing.py) is claimed only inside a composite (where it is internal).


class Unsupported(Exception):
    """The region cannot be one generated kernel; the message says why."""


class Value:
    """A tensor of the region: ``amap[j]`` is the domain dim of its dim j (None: size 1)."""
    __slots__ = ("name", "shape", "dtype", "kind", "amap", "total", "const")

    def __init__(self, name: str, shape: tuple, dtype: torch.dtype, kind: str, const=None):
        self.name, self.shape, self.dtype, self.kind, self.const = name, shape, dtype, kind, const
        self.amap: tuple | None = None
        self.total = False

    def dims(self) -> frozenset:
        return frozenset(d for d in self.amap if d is not None)

    def __repr__(self):
        total = " total" if self.total else ""
        return f"<Value {self.name} {self.kind} {self.shape} {self.dtype} amap={self.amap}{total}>"


class Op:
    """One prim of the region: its name, operands (Values or Python numbers), outputs and options."""
    __slots__ = ("name", "args", "outs", "opts")

    def __init__(self, name: str, args: list, outs: list[Value], opts: dict):
        self.name, self.args, self.outs, self.opts = name, args, outs, opts


class Plan:
    """The analysed region: ``ops`` in order, ``inputs``/``outputs`` (Values, in the
    region's order), the domain, its row dims ``rdims`` and whether totals loop."""

    def __init__(self):
        self.values: dict[str, Value] = {}
        self.ops: list[Op] = []
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.domain: tuple = ()
        self.rdims: tuple = ()
        self.looped = False
        self.loopable = True        # whether rows may be reduced in column blocks (triton.codegen)
        self.dtypes = SUPPORTED_DTYPES

    @property
    def kdims(self) -> tuple:
        return tuple(d for d in range(len(self.domain)) if d not in self.rdims)

    @property
    def M(self) -> int:
        return math.prod(self.domain[d] for d in self.kdims)

    @property
    def N(self) -> int:
        return math.prod(self.domain[d] for d in self.rdims)

    def has_m(self, v: Value) -> bool:
        return bool(v.dims() & set(self.kdims))

    def has_n(self, v: Value) -> bool:
        return bool(v.dims() & set(self.rdims))


def flatten(bsyms: Sequence[BoundSymbol], internal: frozenset = frozenset()) -> list[BoundSymbol]:
    """The region's prims, composites replaced by their subsymbols. ``internal``: names of
    values no one outside a decomposed composite sees, which may be views made fresh."""
    out: list[BoundSymbol] = []

    def visit(b: BoundSymbol, top: bool = False) -> None:
        if b.sym.tags & _UNCLAIMABLE_TAGS or b.sym.executor is not None:
            raise Unsupported(f"{b.sym.id} is tagged {sorted(t.name for t in b.sym.tags)} or already claimed")
        if top and output_aliases_input(b) and not all(p.name in internal for p in b.proxy_outs()):
            raise Unsupported(f"{b.sym.id} at top level may return a view")
        if Tag.PRIM in b.sym.tags:
            out.append(b)
        elif b.sym.decomposition is not None and b.subsymbols:
            for s in b.subsymbols:
                visit(s)
        else:
            raise Unsupported(f"{b.sym.id} has no prim decomposition")
    for b in bsyms:
        visit(b, top=True)
    return out


def plan_region(bsyms: Sequence[BoundSymbol], inputs: Sequence, outputs: Sequence,
                dtypes: frozenset = SUPPORTED_DTYPES, internal: frozenset = frozenset()) -> Plan:
    """Analyse ``bsyms`` (reading ``inputs``, producing ``outputs``) as one kernel, or raise
    Unsupported. ``dtypes``: the tensor dtypes allowed (the interpreter rounds bfloat16 wrongly)."""
    plan = Plan()
    plan.dtypes = dtypes
    for p in inputs:
        if not isinstance(p, TensorProxy):
            raise Unsupported(f"input {p} is not a tensor")
        plan.inputs.append(_new_value(plan, p, "input"))
    prims = flatten(bsyms, internal)
    plan.domain = _domain(prims, inputs)
    if 0 in plan.domain:
        raise Unsupported("zero-size tensors")
    for b in prims:
        _add_op(plan, b)
    for p in outputs:
        v = plan.values.get(getattr(p, "name", None))
        if v is None or v.kind != "temp":
            raise Unsupported(f"output {p} is not computed by the region")
        plan.outputs.append(v)
    _align(plan)
    _choose_rows(plan)
    _check_classes(plan)
    return plan


def _new_value(plan: Plan, p: TensorProxy, kind: str, const=None) -> Value:
    if p.dtype not in plan.dtypes:
        raise Unsupported(f"dtype {p.dtype}")
    if p.memory is not None:
        raise Unsupported(f"tensor in {p.memory!r} memory")
    v = Value(p.name, tuple(p.shape), p.dtype, kind, const)
    plan.values[p.name] = v
    return v


def _domain(prims: list[BoundSymbol], inputs: Sequence) -> tuple:
    shapes = [tuple(p.shape) for b in prims for p in b.proxy_args() + b.proxy_outs() if isinstance(p, TensorProxy)]
    shapes += [tuple(p.shape) for p in inputs]
    if not shapes:
        raise Unsupported("no tensors")
    return max(shapes, key=lambda s: (math.prod(s), len(s)))


def _operand(plan: Plan, a):
    """A tensor argument as its Value; anything else (dims, shapes, dtypes, numbers) as is."""
    if isinstance(a, TensorProxy):
        v = plan.values.get(a.name)
        if v is None:
            raise Unsupported(f"{a.name} is read before it is defined in the region")
        return v
    if isinstance(a, Proxy):
        raise Unsupported(f"argument {a} is a traced number")
    return a


def _add_op(plan: Plan, b: BoundSymbol) -> None:
    name = b.sym.name
    outs = b.flat_outs()
    if not all(isinstance(o, TensorProxy) for o in outs):
        raise Unsupported(f"prims.{name} returns a non-tensor")
    if name == "full":
        fill = b.kwargs.get("fill_value", b.args[1] if len(b.args) > 1 else None)
        if type(fill) not in (bool, int, float):
            raise Unsupported("full with a non-literal fill value")
        _new_value(plan, outs[0], "const", const=fill)
        return
    if name not in _CHECKS and name not in ELEMENTWISE:
        raise Unsupported(f"prims.{name} has no Triton translation")
    args = [_operand(plan, a) for a in b.args]
    kwargs = {k: _operand(plan, a) for k, a in b.kwargs.items()}
    if name == "gather":                 # gather(a, dim, index): take_along_axis(a, index, dim)
        name, args = "take_along_axis", [args[0], args[2], args[1]]
    op = Op(name, args, [_new_value(plan, o, "temp") for o in outs], kwargs)
    _CHECKS.get(name, _check_elementwise)(op)
    plan.ops.append(op)


# --- what each prim accepts -----------------------------------------------------------------

def _check_elementwise(op: Op) -> None:
    name, args = op.name, op.args[:1] if op.name == "convert_element_type" else op.args
    if any(type(a) not in (Value, bool, int, float) for a in args):
        raise Unsupported(f"prims.{name} with an argument that is not a tensor or a Python number")
    tensors = [a for a in args if isinstance(a, Value)]
    if name == "pow" and (isinstance(args[1], Value) or args[1] not in POW_EXPONENTS):
        raise Unsupported("pow with an exponent other than a small literal")
    if not any(t.kind != "const" for t in tensors):
        raise Unsupported(f"prims.{name} of literals only")
    dt = tensors[-1].dtype if name == "where" else tensors[0].dtype
    if name in FLOAT_ONLY and not dt.is_floating_point or name in INT_ONLY and dt.is_floating_point:
        raise Unsupported(f"prims.{name} on {dt}")
    if dt is torch.bool and name in {"add", "sub", "mul", "neg", "abs", "pow", "maximum", "minimum"}:
        raise Unsupported(f"prims.{name} on bool")
    if name == "pow" and not dt.is_floating_point and args[1] not in (0, 1, 2, 3):
        raise Unsupported("integer pow with a negative or fractional exponent")


def _check_view(op: Op) -> None:
    a, out = op.args[0], op.outs[0]
    if not isinstance(a, Value):
        raise Unsupported(f"prims.{op.name} of a number")
    if op.name != "broadcast_in_dim" and [s for s in a.shape if s != 1] != [s for s in out.shape if s != 1]:
        raise Unsupported(f"prims.{op.name} from {a.shape} to {out.shape} moves data")


def _check_reduction(op: Op) -> None:
    a = op.args[0]
    if a.dtype is torch.bool or a.kind == "const":
        raise Unsupported(f"prims.{op.name} of a bool or literal tensor")
    if op.name in ("var", "var_mean") and not a.dtype.is_floating_point:
        raise Unsupported(f"prims.{op.name} of {a.dtype}")
    if op.opts.get("output_dtype") not in (None, op.outs[0].dtype):
        raise Unsupported(f"prims.{op.name} with output_dtype")
    if type(op.opts.get("correction", 1)) not in (int, float):
        raise Unsupported("var with a traced correction")


def _check_take(op: Op) -> None:
    a, idx, dim = op.args[0], op.args[1], op.args[2] % len(op.args[0].shape)
    if not a.dtype.is_floating_point:
        raise Unsupported("take_along_axis of a non-float tensor (an index out of range could not show)")
    if not isinstance(idx, Value) or idx.dtype not in (torch.int64, torch.int32) or idx.kind == "const":
        raise Unsupported("take_along_axis needs an integer index tensor")
    if a.shape[dim] == 1 or idx.shape[dim] != 1 or any(
            s != t for j, (s, t) in enumerate(zip(a.shape, idx.shape, strict=True)) if j != dim):
        raise Unsupported("take_along_axis other than picking one element per row")


def _check_iota(op: Op) -> None:
    if op.outs[0].dtype is torch.bool or any(type(op.opts.get(k)) not in (int, float) for k in ("start", "step")):
        raise Unsupported("iota with a traced start or step, or of bool")


_CHECKS = {"broadcast_in_dim": _check_view, "gather": _check_take, "iota": _check_iota, "reshape": _check_view,
           "squeeze": _check_view, "take_along_axis": _check_take, **{r: _check_reduction for r in ROW_REDUCTIONS}}


# --- alignment: which domain dim each dim of each value runs along ---------------------------

def _default_amap(domain: tuple, shape: tuple) -> tuple:
    """Right-aligned onto the domain (broadcasting's rule), else left-aligned (a per-row
    value met before anything ties it to the rows: a cross-entropy's targets), or Unsupported."""
    if len(shape) > len(domain):
        raise Unsupported(f"shape {shape} has more dims than the domain {domain}")
    for off in dict.fromkeys((len(domain) - len(shape), 0)):
        if all(s == 1 or s == domain[off + j] for j, s in enumerate(shape)):
            return tuple(None if s == 1 else off + j for j, s in enumerate(shape))
    raise Unsupported(f"shape {shape} does not align with the domain {domain}")


def _set_amap(plan: Plan, v: Value, amap: tuple) -> None:
    amap = tuple(None if s == 1 else d for s, d in zip(v.shape, amap, strict=True))
    if any(d is not None and plan.domain[d] != s for s, d in zip(v.shape, amap, strict=True)):
        raise Unsupported(f"{v.name}{v.shape} cannot run along domain dims {amap}")
    if len({d for d in amap if d is not None}) != sum(d is not None for d in amap):
        raise Unsupported(f"{v.name} uses a domain dim twice")
    if v.amap is None:
        v.amap = amap
    elif v.amap != amap:
        raise Unsupported(f"{v.name} is used along two different alignments")


def _align(plan: Plan) -> None:
    """Solve the alignment constraints of every op, in both directions; where
    nothing constrains a value, broadcasting's right-alignment decides."""
    identity = tuple(d for d in range(len(plan.domain)))
    for v in plan.values.values():
        if v.shape == plan.domain:
            _set_amap(plan, v, identity)
    pending = list(plan.ops)
    while pending:
        rest = [op for op in pending if not _ALIGN.get(op.name, _align_elementwise)(plan, op)]
        if len(rest) == len(pending):
            stuck = next(v for op in rest for v in _tensors(op) if v.amap is None)
            _set_amap(plan, stuck, _default_amap(plan.domain, stuck.shape))
        pending = rest
    for v in plan.values.values():
        if v.amap is None:
            _set_amap(plan, v, _default_amap(plan.domain, v.shape))


def _tensors(op: Op) -> list[Value]:
    return [a for a in op.args if isinstance(a, Value)] + op.outs


def _align_elementwise(plan: Plan, op: Op) -> bool:
    vals = [a for a in (op.args[:1] if op.name == "convert_element_type" else op.args)
            if isinstance(a, Value)] + op.outs
    known = next((v.amap for v in vals if v.amap is not None), None)
    if known is None:
        return False
    for v in vals:
        _set_amap(plan, v, known)
    return True


def _align_broadcast(plan: Plan, op: Op) -> bool:
    a, out, bdims = op.args[0], op.outs[0], tuple(op.args[2])
    if out.amap is None and a.amap is not None:
        _set_amap(plan, out, _default_amap(plan.domain, out.shape))
    if out.amap is None:
        return False
    _set_amap(plan, a, tuple(None if a.shape[j] == 1 else out.amap[bdims[j]] for j in range(len(a.shape))))
    return True


def _align_reshape(plan: Plan, op: Op) -> bool:
    a, out = op.args[0], op.outs[0]
    src, dst = (a, out) if a.amap is not None else (out, a)
    if src.amap is None:
        return False
    it = iter(d for s, d in zip(src.shape, src.amap, strict=True) if s != 1)
    _set_amap(plan, dst, tuple(None if s == 1 else next(it) for s in dst.shape))
    return True


def _align_reduction(plan: Plan, op: Op) -> bool:
    a = op.args[0]
    if a.amap is None:
        return False
    dims = {d % max(len(a.shape), 1) for d in op.args[1]}
    for out in op.outs:
        _set_amap(plan, out, tuple(d for j, d in enumerate(a.amap) if j not in dims))
    return True


def _align_take(plan: Plan, op: Op) -> bool:
    a, idx, out = op.args[0], op.args[1], op.outs[0]
    if a.amap is None:
        return False
    dim = op.args[2] % len(a.shape)
    _set_amap(plan, idx, tuple(None if j == dim else d for j, d in enumerate(a.amap)))
    _set_amap(plan, out, idx.amap)
    return True


_ALIGN = {"broadcast_in_dim": _align_broadcast, "reshape": _align_reshape, "squeeze": _align_reshape,
          "take_along_axis": _align_take, **{r: _align_reduction for r in ROW_REDUCTIONS}}


def reduced_dims(op: Op) -> frozenset:
    """The domain dims a reduction (or take_along_axis) runs along."""
    a = op.args[0]
    if op.name == "take_along_axis":
        return frozenset({a.amap[op.args[2] % len(a.shape)]})
    dims = {d % max(len(a.shape), 1) for d in op.args[1]}
    return frozenset(a.amap[j] for j in dims if a.amap[j] is not None)


def _choose_rows(plan: Plan) -> None:
    """The row dims: those of the first reduction, when a row of them fits one program."""
    for op in plan.ops:
        if op.name in ROW_REDUCTIONS or op.name == "take_along_axis":
            rd = reduced_dims(op)
            if rd:
                plan.rdims = tuple(sorted(rd))
            return


def _check_classes(plan: Plan) -> None:
    rset = frozenset(plan.rdims)
    for op in plan.ops:
        vals = [a for a in op.args if isinstance(a, Value)]
        if op.name in ROW_REDUCTIONS or op.name == "take_along_axis":
            a = vals[0]
            rd = reduced_dims(op)
            if a.total:
                raise Unsupported("a reduction of a value computed from a total")
            if not rd or rd == rset:
                continue
            if op.name in TOTAL_REDUCTIONS and rd == a.dims() and plan.has_m(a):
                if plan.M * plan.N > MAX_TOTAL_WORK:
                    raise Unsupported(f"a total over {plan.M} rows of {plan.N}: one program would loop over them")
                plan.looped = True
                plan.loopable &= not plan.has_n(a)
                for o in op.outs:
                    o.total = True
                continue
            raise Unsupported(f"prims.{op.name} over domain dims {sorted(rd)} (rows run along {sorted(rset)})")
        if any(v.total for v in vals):
            if any(not v.total and v.kind != "const" for v in vals):
                raise Unsupported(f"prims.{op.name} mixes a total with per-row values")
            for o in op.outs:
                o.total = True
    for v in plan.outputs:
        if v.kind == "const":
            raise Unsupported("a literal tensor as an output")
    if plan.M < FEW_ROWS and plan.N > LONG_ROW:
        raise Unsupported(f"{plan.M} rows of {plan.N}: too few programs for a reduction that long")
    if plan.N > MAX_ROW and not plan.loopable:
        raise Unsupported(f"rows of {plan.N} beside a total over them: too long for one block, cannot loop")
