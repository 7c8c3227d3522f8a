"""Triton source for an analysed region (triton.plan.Plan): one kernel.

The kernel body is written prim by prim from the region: every value becomes a
tile variable (see triton/plan.py for the tile space), elementwise prims become
expressions from ``EXPRESSIONS``, reductions ``tl.reduce`` calls on masked
tiles (or, for rows longer than a block, accumulated over a loop of column
blocks: ``_column_passes``). float16/bfloat16 values are held in float32 and
rounded once, when stored (``_held``; the numerics policy of docs/architecture.md
§6, as Inductor computes). Only Triton builtins are called (see triton/runtime.py for why), so the same
source runs natively and under the interpreter, except for transcendental
math: natively it is libdevice's (``_native_math``), as accurate as eager's
CUDA kernels. Generated names are canonical (``v0``, ``in0``, ``out0``), so
regions with the same structure, dtypes and shape class produce the same
source and share one compiled kernel.

Example (``x * 2 + 1`` on ``f32[4, 8]``, abridged)::

    def fusion_3f2a..(in0, out0, M, N, in0_st0, in0_st1, out0_st0, out0_st1, BM: tl.constexpr, ...):
        ...
        v0 = tl.load(in0 + i0 * in0_st0 + i1 * in0_st1, mask=rmask, other=0)
        v1 = v0 * 2.0
        v2 = v1 + 1.0
        tl.store(out0 + i0 * out0_st0 + i1 * out0_st1, v2, mask=rmask)
"""
from __future__ import annotations

import hashlib
import math
import re

import torch

from thunderlite.executors.triton.plan import ROW_REDUCTIONS, Op, Plan, Value, reduced_dims
from thunderlite.executors.triton.tiling import Config, heuristic_config

TL_DTYPES = {torch.bool: "tl.int1", torch.uint8: "tl.uint8", torch.int8: "tl.int8", torch.int16: "tl.int16",
             torch.int32: "tl.int32", torch.int64: "tl.int64", torch.float16: "tl.float16",
             torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32", torch.float64: "tl.float64"}

_NAN_MAX = ", propagate_nan=tl.PropagateNan.ALL"
_NEG_INF = 'float("-inf")'
# DIV( and SQRT( are IEEE-rounded division and square root: tl.div_rn/tl.sqrt_rn for float32
# (Triton's "/" and tl.sqrt are approximate there), "/" and tl.sqrt for float64 (exact; the
# _rn forms take float32 only). See _ieee.
EXPRESSIONS = {
    "neg": "-{0}", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})", "log": "tl.log({0})",
    "log2": "tl.log2({0})", "sqrt": "SQRT({0})", "rsqrt": "DIV(1.0, SQRT({0}))",
    "sin": "tl.sin({0})", "cos": "tl.cos({0})", "erf": "tl.erf({0})",
    "sigmoid": "DIV(1.0, 1.0 + tl.exp(-{0}))", "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
    "trunc": "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))", "reciprocal": "DIV(1.0, {0})",
    "bitwise_not": "~{0}", "logical_not": "{0} == 0", "isnan": "{0} != {0}",
    "isfinite": "tl.abs({0}) < float(\"inf\")", "isinf": "tl.abs({0}) == float(\"inf\")",
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "DIV({0}, {1})",
    "bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}", "bitwise_xor": "{0} ^ {1}",
    "eq": "{0} == {1}", "ne": "{0} != {1}", "lt": "{0} < {1}", "le": "{0} <= {1}", "gt": "{0} > {1}",
    "ge": "{0} >= {1}", "logical_and": "({0} != 0) & ({1} != 0)", "logical_or": "({0} != 0) | ({1} != 0)",
    "logical_xor": "({0} != 0) ^ ({1} != 0)", "where": "tl.where({0}, {1}, {2})",
    # eager's lerp: the formula depends on |weight| < 0.5 (ATen's lerp kernel)
    "lerp": "tl.where(tl.abs({2}) < 0.5, {0} + {2} * ({1} - {0}), {1} - ({1} - {0}) * (1.0 - {2}))",
}
_POW = {0: "tl.where({0} == {0}, 1, 1)", 1: "{0}", 2: "{0} * {0}", 3: "{0} * {0} * {0}",
        0.5: "SQRT({0})", -1: "DIV(1.0, {0})", -2: "DIV(1.0, {0} * {0})"}
_COMBINE = {"sum": "_sum_combine", "amax": "_elementwise_max", "amin": "_elementwise_min"}

_HEADER = """import triton
import triton.language as tl
from triton.language.standard import _elementwise_max, _elementwise_min, _sum_combine
"""


class KernelSpec:
    """A generated kernel and how to launch it: argument layout, grid, block sizes."""
    __slots__ = ("source", "fn_name", "scalar_args", "BM", "BN", "grid", "num_warps", "num_stages", "config", "plan")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


def _ieee(expr: str, ctx: torch.dtype) -> str:
    """Spell DIV(a, b) and SQRT(a) for the compute dtype (see EXPRESSIONS)."""
    if ctx != torch.float64:
        return expr.replace("DIV(", "tl.div_rn(").replace("SQRT(", "tl.sqrt_rn(")
    expr = expr.replace("SQRT(", "tl.sqrt(")
    while "DIV(" in expr:     # DIV(a, b) -> tl.fdiv(a, b, True): IEEE-rounded for float64
        start = expr.index("DIV(") + 4
        depth, i = 1, start
        while depth:
            depth += {"(": 1, ")": -1}.get(expr[i], 0)
            i += 1
        a, b = _split_args(expr[start:i - 1])
        # tl.fdiv neither promotes nor takes a Python float (a float32 constant) beside a float64 tile
        expr = expr[:start - 4] + f"tl.fdiv(tl.cast({a}, tl.float64), tl.cast({b}, tl.float64), True)" + expr[i:]
    return expr


def _split_args(args: str) -> tuple[str, str]:
    """``"a, b"`` at its top-level comma."""
    depth = 0
    for i, c in enumerate(args):
        depth += {"(": 1, ")": -1, "[": 1, "]": -1}.get(c, 0)
        if c == "," and depth == 0:
            return args[:i].strip(), args[i + 1:].strip()
    raise ValueError(f"DIV needs two arguments: {args}")


_NATIVE_MATH = ("exp", "exp2", "log", "log2", "sin", "cos", "erf")


def _native_math(body: str) -> str:
    """Native kernels call libdevice's correctly rounded-to-a-few-ulp math where
    Triton's builtins lower to approximate instructions (``tl.exp`` is
    ``ex2.approx`` of ``x * log2(e)``: about ``|x|`` ulp off for large ``x``),
    as eager's CUDA kernels call the CUDA math library."""
    for name in _NATIVE_MATH:
        body = body.replace(f"tl.{name}(", f"libdevice.{name}(")
    return body


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _held(v: Value) -> torch.dtype:
    """The dtype a computed value is held in: float16/bfloat16 results stay float32 until
    stored (the numerics policy: one rounding, at the outputs; docs/architecture.md §6)."""
    return _compute_dtype(v.dtype) if v.kind == "temp" else v.dtype


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_floating_point:
        return torch.float64 if dtype == torch.float64 else torch.float32
    return torch.int64


def _literal(x, dtype: torch.dtype) -> str:
    if isinstance(x, bool) or dtype == torch.bool:
        return "True" if x else "False"
    if dtype.is_floating_point:
        x = float(x)
        text = ('float("nan")' if math.isnan(x)
                else f'float("{"-" if x < 0 else ""}inf")' if math.isinf(x) else repr(x))
        # a bare literal would be float32 in Triton: keep float64 constants exact
        return f"tl.full([1, 1], {text}, tl.float64)" if dtype == torch.float64 else f"({text})"
    return f"({int(x)})"


def _neutral(name: str, dtype: torch.dtype) -> str:
    if name == "sum":
        return "0"
    if dtype.is_floating_point:
        return 'float("-inf")' if name == "amax" else 'float("inf")'
    info = torch.iinfo(dtype)
    if name == "amax" and dtype == torch.int64:
        return f"({info.min + 1} - 1)"     # the literal 9223372036854775808 would not fit an int64
    return str(info.min if name == "amax" else info.max)


class _Writer:
    def __init__(self, plan: Plan, interpret: bool):
        self.plan = plan
        self.interpret = interpret
        self.lines: list[str] = []
        self.indent = 1
        self.var: dict[str, str] = {}            # value name -> tile variable
        self.tmp = 0
        self.gather = False                     # inside a direct take: one column per row (_gather)
        for i, v in enumerate(plan.values.values()):
            self.var[v.name] = f"v{i}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def fresh(self) -> str:
        self.tmp += 1
        return f"r{self.tmp}"

    def tile(self, v: Value) -> str:
        if v.total:
            return "(1, 1)"
        columns = "BN" if self.plan.has_n(v) and not self.gather else "1"
        return f"({'BM' if self.plan.has_m(v) else '1'}, {columns})"

    def mask(self, v: Value) -> str | None:
        parts = (["rmask"] if self.plan.has_m(v) and not v.total else []) + (
            ["cmask"] if self.plan.has_n(v) and not v.total else [])
        return " & ".join(parts) or None

    def operand(self, a, ctx: torch.dtype) -> str:
        """``a`` in the op's compute dtype ``ctx``: a widened tile, or a literal."""
        if not isinstance(a, Value):
            return _literal(a, ctx)
        if a.kind == "const":
            return _literal(a.const, ctx)
        name = self.var[a.name]
        return f"{name}.to(tl.float32)" if _compute_dtype(a.dtype) != a.dtype else name


def generate(plan: Plan, interpret: bool, config: Config | None = None) -> KernelSpec:
    """The kernel of ``plan`` tiled as ``config`` (by default ``heuristic_config``)."""
    config = config or heuristic_config(plan, interpret)
    w = _Writer(plan, interpret)
    n_in, n_out = len(plan.inputs), len(plan.outputs)
    sizes = [f"s{d}" for d in range(len(plan.domain))]
    strides = [f"in{i}_st{j}" for i, v in enumerate(plan.inputs) for j, d in enumerate(v.amap) if d is not None]
    strides += [f"out{k}_st{j}" for k, v in enumerate(plan.outputs) for j, d in enumerate(v.amap) if d is not None]
    big = max([math.prod(v.shape) for v in plan.values.values()] + [math.prod(plan.domain)]) >= 2 ** 31 - 1
    w.emit("pid = tl.program_id(0)")
    if not config.loop:
        _column_indices(w, big, "0")
    totals = [op for op in plan.ops if op.outs[0].total and op.name in _COMBINE and not op.args[0].total]
    for k, op in enumerate(totals):
        acc = _acc_dtype(op.args[0].dtype)
        w.emit(f"acc{k} = tl.full((BM, 1), {_neutral(op.name, op.args[0].dtype)}, {TL_DTYPES[acc]})")
        if op.name != "sum" and op.args[0].dtype.is_floating_point:
            w.emit(f"nan{k} = tl.full((BM, 1), 0, tl.int32)")
    if plan.looped:
        w.emit("for m0 in range(0, M, BM):")
        w.indent += 1
    else:
        w.emit("m0 = pid * BM")
    _row_indices(w, big)
    first = "m0" if plan.looped else "pid"
    if config.loop:
        _column_passes(w, big, first)
    else:
        for i, v in enumerate(plan.inputs):
            _load(w, v, f"in{i}")
        for op in plan.ops:
            if not op.outs[0].total:
                _op(w, op)
        for k, v in enumerate(plan.outputs):
            if not v.total:
                _store(w, v, f"out{k}", first=first)
    for k, op in enumerate(totals):
        _accumulate(w, op, k)
    if plan.looped:
        w.indent -= 1
        for k, op in enumerate(totals):
            _finish_total(w, op, k)
        for op in plan.ops:
            if op.outs[0].total and op not in totals:
                _op(w, op)
        for k, v in enumerate(plan.outputs):
            if v.total:
                _store(w, v, f"out{k}", first=None)
    params = ([f"in{i}" for i in range(n_in)] + [f"out{k}" for k in range(n_out)] + ["M", "N"] + sizes + strides)
    body = "\n".join(w.lines) if interpret else _native_math("\n".join(w.lines))
    digest = hashlib.sha1(f"{params}\n{body}".encode()).hexdigest()[:10]
    fn_name = f"fusion_{digest}"
    header = _HEADER if interpret else _HEADER + "from triton.language.extra import libdevice\n"
    source = (header + "\n\n" + f"def {fn_name}({', '.join(params)}, BM: tl.constexpr, BN: tl.constexpr):\n"
              + body + "\n")
    grid = (1,) if plan.looped else ((plan.M + config.BM - 1) // config.BM,)
    return KernelSpec(source=source, fn_name=fn_name, scalar_args=["M", "N"] + sizes, BM=config.BM, BN=config.BN,
                      grid=grid, num_warps=config.num_warps, num_stages=config.num_stages, config=config, plan=plan)


def _column_indices(w: _Writer, big: bool, start: str) -> None:
    w.emit(f"cols = {start} + tl.arange(0, BN)[None, :]{'.to(tl.int64)' if big else ''}")
    w.emit("cmask = cols < N")
    _decompose(w, "cols", w.plan.rdims)


def _row_indices(w: _Writer, big: bool) -> None:
    w.emit(f"rows = m0 + tl.arange(0, BM)[:, None]{'.to(tl.int64)' if big else ''}")
    w.emit("rmask = rows < M")
    _decompose(w, "rows", w.plan.kdims)


def _decompose(w: _Writer, flat: str, dims: tuple) -> None:
    """Row-major multi-index ``i<d>`` of the flat index over ``dims`` (last fastest)."""
    rem = flat
    for pos in range(len(dims) - 1, -1, -1):
        d = dims[pos]
        if pos == 0:
            w.emit(f"i{d} = {rem}")
        else:
            w.emit(f"i{d} = {rem} % s{d}")
            w.emit(f"q{d} = {rem} // s{d}")
            rem = f"q{d}"


def _offsets(v: Value, prefix: str) -> str:
    terms = [f"i{d} * {prefix}_st{j}" for j, d in enumerate(v.amap) if d is not None]
    return " + ".join(terms) if terms else "tl.full((1, 1), 0, tl.int32)"


def _load(w: _Writer, v: Value, ptr: str) -> None:
    mask = w.mask(v)
    masked = f", mask={mask}, other=0" if mask else ""
    w.emit(f"{w.var[v.name]} = tl.load({ptr} + {_offsets(v, ptr)}{masked})")


def _store(w: _Writer, v: Value, ptr: str, first: str | None) -> None:
    mask = w.mask(v)
    if first is not None and not w.plan.has_m(v):
        # a value without rows is the same in every program: the first one writes it
        w.emit(f"first = (tl.arange(0, 1)[None, :] + {first}) == 0")
        mask = f"{mask} & first" if mask else "first"
    masked = f", mask={mask}" if mask else ""
    w.emit(f"tl.store({ptr} + {_offsets(v, ptr)}, {w.var[v.name]}{masked})")


def _op(w: _Writer, op: Op) -> None:
    out = op.outs[0]
    target = w.var[out.name]
    if op.name in ("reshape", "squeeze", "broadcast_in_dim"):
        a = op.args[0]
        if a.kind == "const":
            w.emit(f"{target} = tl.full({w.tile(out)}, {_literal(a.const, a.dtype)}, {TL_DTYPES[a.dtype]})")
        elif w.tile(a) != w.tile(out):
            w.emit(f"{target} = tl.broadcast_to({w.var[a.name]}, {w.tile(out)})")
        else:
            w.emit(f"{target} = {w.var[a.name]}")
    elif op.name == "convert_element_type":
        a = op.args[0]
        src = w.var[a.name] if a.kind != "const" else _literal(a.const, a.dtype)
        if _held(a) != a.dtype and not out.dtype.is_floating_point:
            src = f"{src}.to({TL_DTYPES[a.dtype]})"     # rounded where it leaves floating point
        expr = f"{src} != 0" if out.dtype == torch.bool else f"{src}.to({TL_DTYPES[_held(out)]})"
        if a.kind == "const":
            expr = f"tl.full({w.tile(out)}, {_literal(a.const, out.dtype)}, {TL_DTYPES[out.dtype]})"
        w.emit(f"{target} = {expr}")
    elif op.name in ("sum", "amax", "amin"):
        _row_reduction(w, op)
    elif op.name in ("var", "var_mean"):
        _variance(w, op)
    elif op.name == "take_along_axis":
        _take(w, op)
    elif op.name == "iota":
        _iota(w, op)
    else:
        _elementwise(w, op)


def _elementwise(w: _Writer, op: Op) -> None:
    out = op.outs[0]
    tensors = [a for a in op.args if isinstance(a, Value)]
    ctx = _compute_dtype(out.dtype if op.name == "where" else tensors[0].dtype)
    if op.name == "where":
        args = [w.operand(op.args[0], torch.bool)] + [w.operand(a, ctx) for a in op.args[1:]]
    else:
        args = [w.operand(a, ctx) for a in op.args]
    if op.name in _MULTI_LINE and not w.interpret:
        template = f"libdevice.{op.name}({{0}})"
    elif op.name in _MULTI_LINE:
        x = w.fresh()
        w.emit(f"{x} = {args[0]}")
        template = _MULTI_LINE[op.name](w, x, ctx)
    elif op.name == "pow":
        template = _POW[op.args[1]]
    elif op.name in ("maximum", "minimum"):
        fn = "tl.maximum" if op.name == "maximum" else "tl.minimum"
        template = fn + "({0}, {1}" + (_NAN_MAX if ctx.is_floating_point else "") + ")"
    else:
        template = EXPRESSIONS[op.name]
    expr = _ieee(template.format(*args), ctx)
    w.emit(f"{w.var[out.name]} = {expr}")


def _expm1(w: _Writer, x: str, ctx: torch.dtype) -> str:
    """Kahan's expm1, (e^x - 1) * (x / log(e^x)): accurate near 0 without libdevice
    (which the interpreter lacks)."""
    u, r = w.fresh(), w.fresh()
    w.emit(f"{u} = tl.exp({x})")
    w.emit(_ieee(f"{r} = tl.where({u} == 1.0, {x}, tl.where({u} - 1.0 == -1.0, -1.0, "
                 f"({u} - 1.0) * DIV({x}, tl.log({u}))))", ctx))
    return f'tl.where({u} == float("inf"), {u}, {r})'


def _log1p(w: _Writer, x: str, ctx: torch.dtype) -> str:
    """Kahan's log1p, log(1 + x) * x / ((1 + x) - 1)."""
    u = w.fresh()
    w.emit(f"{u} = 1.0 + {x}")
    return _ieee(f'tl.where(({u} == 1.0) | ({x} == float("inf")), {x}, DIV(tl.log({u}) * {x}, {u} - 1.0))', ctx)


def _tanh(w: _Writer, x: str, ctx: torch.dtype) -> str:
    """tanh|x| = -expm1(-2|x|) / (2 + expm1(-2|x|)), sign restored."""
    a, t, r = w.fresh(), w.fresh(), w.fresh()
    w.emit(f"{a} = -2.0 * tl.abs({x})")
    w.emit(f"{t} = {_expm1(w, a, ctx)}")
    w.emit(_ieee(f"{r} = DIV(-{t}, 2.0 + {t})", ctx))
    return f"tl.where({x} < 0, -{r}, {r})"


_MULTI_LINE = {"expm1": _expm1, "log1p": _log1p, "tanh": _tanh}


def _reduce(w: _Writer, tile: str, name: str, axis: int) -> str:
    return f"tl.reduce({tile}, {axis}, {_COMBINE[name]}, keep_dims=True)"


def _masked(w: _Writer, v: Value, neutral: str, ctx: torch.dtype) -> str:
    x = w.var[v.name] if ctx == v.dtype else f"{w.var[v.name]}.to({TL_DTYPES[ctx]})"
    mask = w.mask(v)
    return f"tl.where({mask}, {x}, {neutral})" if mask else x


def _finish(w: _Writer, out: Value, value: str) -> None:
    w.emit(f"{w.var[out.name]} = ({value}).to({TL_DTYPES[_held(out)]})")


def _row_reduction(w: _Writer, op: Op) -> None:
    a, out = op.args[0], op.outs[0]
    if not reduced_dims(op):            # reducing size-1 dims only: a copy
        w.emit(f"{w.var[out.name]} = {w.var[a.name]}.to({TL_DTYPES[out.dtype]})")
        return
    ctx = _acc_dtype(a.dtype)
    r = w.fresh()
    w.emit(f"{r} = {_reduce(w, _masked(w, a, _neutral(op.name, a.dtype), ctx), op.name, 1)}")
    if op.name != "sum" and a.dtype.is_floating_point:
        # Triton's max/min ignore NaN; eager's amax/amin return it
        nans = w.fresh()
        mask = w.mask(a)
        w.emit(f"{nans} = {_reduce(w, f'tl.where({mask} & ({w.var[a.name]} != {w.var[a.name]}), 1, 0)', 'sum', 1)}")
        r = f"tl.where({nans} > 0, float(\"nan\"), {r})"
    _finish(w, out, r)


def _variance(w: _Writer, op: Op) -> None:
    a = op.args[0]
    ctx = _acc_dtype(a.dtype)
    tl_ctx = TL_DTYPES[ctx]
    correction = op.opts.get("correction", 1)
    mask = w.mask(a)
    x = w.fresh()
    w.emit(f"{x} = tl.where({mask}, {w.var[a.name]}.to({tl_ctx}), 0)")
    mean, d, var = w.fresh(), w.fresh(), w.fresh()
    w.emit(_ieee(f"{mean} = DIV({_reduce(w, x, 'sum', 1)}, N.to({tl_ctx}))", ctx))
    w.emit(f"{d} = tl.where({mask}, {x} - {mean}, 0)")
    w.emit(_ieee(f"{var} = DIV({_reduce(w, f'{d} * {d}', 'sum', 1)}, "
                 f"tl.maximum(N.to({tl_ctx}) - {_literal(correction, ctx)}, 0.0))", ctx))
    _finish(w, op.outs[0], var)
    if op.name == "var_mean":
        _finish(w, op.outs[1], mean)


def _take(w: _Writer, op: Op) -> None:
    a, idx, out = op.args[0], op.args[1], op.outs[0]
    d = reduced_dims(op)
    (dim,) = d
    hit, val, found = w.fresh(), w.fresh(), w.fresh()
    w.emit(f"{hit} = (i{dim} == {w.var[idx.name]}) & {w.mask(a)}")
    acc = TL_DTYPES[_acc_dtype(a.dtype)]
    w.emit(f"{val} = {_reduce(w, f'tl.where({hit}, {w.var[a.name]}.to({acc}), 0)', 'sum', 1)}")
    w.emit(f"{found} = {_reduce(w, f'tl.where({hit}, 1, 0)', 'sum', 1)}")
    # eager raises for an index out of range; a kernel cannot, so it yields NaN rather than a number
    _finish(w, out, f"tl.where({found} > 0, {val}, float(\"nan\"))")


def _iota(w: _Writer, op: Op) -> None:
    out = op.outs[0]
    (d,) = out.amap
    start, step = op.opts["start"], op.opts["step"]
    expr = f"tl.full({w.tile(out)}, {_literal(start, out.dtype)}, {TL_DTYPES[out.dtype]})" if d is None else \
        f"({_literal(start, out.dtype)} + {_literal(step, out.dtype)} * i{d}).to({TL_DTYPES[out.dtype]})"
    w.emit(f"{w.var[out.name]} = {expr}")


def _accumulate(w: _Writer, op: Op, k: int) -> None:
    a = op.args[0]
    ctx = _acc_dtype(a.dtype)
    neutral = _neutral(op.name, a.dtype)
    part = _masked(w, a, neutral, ctx)
    if w.plan.has_n(a):
        part = _reduce(w, part, op.name, 1)
    combine = {"sum": "acc{k} + {p}", "amax": "tl.maximum(acc{k}, {p})", "amin": "tl.minimum(acc{k}, {p})"}
    w.emit(f"acc{k} = " + combine[op.name].format(k=k, p=part))
    if op.name != "sum" and a.dtype.is_floating_point:
        nan_part = f"tl.where({w.mask(a)} & ({w.var[a.name]} != {w.var[a.name]}), 1, 0)"
        if w.plan.has_n(a):
            nan_part = _reduce(w, nan_part, "sum", 1)
        w.emit(f"nan{k} = nan{k} + {nan_part}")


def _finish_total(w: _Writer, op: Op, k: int) -> None:
    r = _reduce(w, f"acc{k}", op.name, 0)
    if op.name != "sum" and op.args[0].dtype.is_floating_point:
        r = f"tl.where({_reduce(w, f'nan{k}', 'sum', 0)} > 0, float(\"nan\"), {r})"
    _finish(w, op.outs[0], r)


# --- looped reductions: rows reduced in blocks of BN columns -------------------------------------------

def _reducer(op: Op) -> bool:
    return (op.name in ROW_REDUCTIONS or op.name == "take_along_axis") and bool(reduced_dims(op))


def _tensor_args(op: Op) -> list[Value]:
    return [a for a in op.args if isinstance(a, Value) and a.kind != "const"]


def _through_views(plan: Plan, v: Value) -> Value:
    """``v`` before the reshapes and broadcasts that made it."""
    producer = {o.name: op for op in plan.ops for o in op.outs}
    while v.name in producer and producer[v.name].name in ("reshape", "squeeze", "broadcast_in_dim"):
        v = producer[v.name].args[0]
    return v


def online_sums(plan: Plan) -> dict[int, tuple[Op, Value]]:
    """``sum(exp(a - b))`` reductions whose per-row shift ``b`` is ``amax(a)`` of the same rows
    (or a ``where`` of it: logsumexp's guard against an infinite max), by ``id``, with the
    ``amax`` and ``b``: an online softmax accumulates them in the max's pass over the row
    (rescaling the running sum whenever the running max grows, then to ``b``), so softmax,
    log_softmax, logsumexp and cross-entropy read a long row once for their statistics."""
    producer = {o.name: op for op in plan.ops for o in op.outs}
    out: dict[int, tuple[Op, Value]] = {}
    for op in plan.ops:
        if op.name != "sum" or not _reducer(op) or op.outs[0].total:
            continue
        e = producer.get(op.args[0].name)
        d = producer.get(e.args[0].name) if e is not None and e.name == "exp" else None
        if d is None or d.name != "sub" or not all(isinstance(a, Value) for a in d.args):
            continue
        shift = _through_views(plan, d.args[1])
        guard = producer.get(shift.name)
        sources = [guard] if guard is None or guard.name != "where" else [
            producer.get(_through_views(plan, a).name) for a in guard.args if isinstance(a, Value)]
        m = next((s for s in sources if s is not None and s.name == "amax"), None)
        if (m is not None and _reducer(m) and m.args[0] is d.args[0] and reduced_dims(m) == reduced_dims(op)
                and d.args[0].dtype.is_floating_point and not plan.has_n(shift)):
            out[id(op)] = (m, shift)
    return out


def _direct_takes(plan: Plan, producer: dict, per_elem: set) -> dict[int, set[str]]:
    """``take_along_axis`` ops of a looped reduction that evaluate their per-element operand at
    each row's index alone (a gather: no pass over the row), by ``id``, with the per-row
    values that evaluation reads. Needs one row dim and an operand built from values that
    vary along the rows (a ``[BM, 1]`` tile at the index); else the op scans the row."""
    out: dict[int, set[str]] = {}
    if len(plan.rdims) != 1:
        return out
    for op in plan.ops:
        if op.name != "take_along_axis" or not _reducer(op):
            continue
        sub = _needed([op.args[0]], producer, per_elem)
        if not all(plan.has_m(plan.values[n]) for n in sub):
            continue
        reads = {a.name for n in sub if n in producer for a in _tensor_args(producer[n]) if a.name not in per_elem}
        out[id(op)] = reads | {op.args[1].name}
    return out


def _passes(plan: Plan, direct: dict) -> tuple[dict[str, int], dict[int, int]]:
    """Each value's level (how many passes over the row precede it) and each reducer's
    pass: a per-element value is computed, again, in every pass that needs it."""
    online = online_sums(plan)
    level = {v.name: 0 for v in plan.values.values() if v.kind != "temp"}
    passes: dict[int, int] = {}
    for op in plan.ops:
        if op.outs[0].total:
            continue
        base = max((level[a.name] for a in _tensor_args(op)), default=0)
        if _reducer(op) and id(op) not in direct:
            passes[id(op)] = passes[id(online[id(op)][0])] if id(op) in online else base
            base = passes[id(op)] + 1
        for o in op.outs:
            level[o.name] = base
    return level, passes


def _column_passes(w: _Writer, big: bool, first: str) -> None:
    """The row body of a looped reduction: per-row inputs and values, then one loop over
    the row's column blocks per pass (accumulating that pass's reductions, storing the
    per-element outputs it can), per-row values as soon as their reductions finish."""
    plan = w.plan
    producer = {o.name: op for op in plan.ops for o in op.outs}
    per_elem = {v.name for v in plan.values.values() if plan.has_n(v) and not v.total}
    direct = _direct_takes(plan, producer, per_elem)
    level, passes = _passes(plan, direct)
    online = online_sums(plan)
    row_ops = [op for op in plan.ops if not op.outs[0].total and (id(op) in direct or not _reducer(op))
               and op.outs[0].name not in per_elem]
    done = {v.name for v in plan.values.values() if v.kind == "const"}
    for i, v in enumerate(plan.inputs):
        if v.name not in per_elem:
            _load(w, v, f"in{i}")
            done.add(v.name)
    _row_ops(w, row_ops, done, direct, big)
    outputs = {v.name: k for k, v in enumerate(plan.outputs)}
    order = sorted(set(passes.values()) | {level[v.name] for v in plan.outputs if v.name in per_elem})
    for p in order:
        reducers = [op for op in plan.ops if passes.get(id(op)) == p]
        stores = [v for v in plan.outputs if v.name in per_elem and level[v.name] == p]
        roots = [a for op in reducers for a in (_tensor_args(online[id(op)][0]) if id(op) in online
                                                  else _tensor_args(op))] + stores
        needed = _needed(roots, producer, per_elem)
        for op in reducers:
            _loop_init(w, op, online)
        w.emit("for n0 in range(0, N, BN):")
        w.indent += 1
        _column_indices(w, big, "n0")
        _per_element(w, needed, per_elem)
        for op in reducers:
            _loop_step(w, op, online)
        for v in stores:
            _store(w, v, f"out{outputs[v.name]}", first=first)
        w.indent -= 1
        for late in (False, True):          # an online sum is rescaled to its shift, computed from the max
            for op in reducers:
                if (id(op) in online) == late:
                    _loop_finish(w, op, online)
                    done.update(o.name for o in op.outs)
            _row_ops(w, row_ops, done, direct, big)
    for k, v in enumerate(plan.outputs):
        if v.name not in per_elem and not v.total:
            _store(w, v, f"out{k}", first=first)


def _per_element(w: _Writer, needed: set, per_elem: set) -> None:
    """Load and compute the ``needed`` per-element values at the current column indices."""
    for i, v in enumerate(w.plan.inputs):
        if v.name in needed:
            _load(w, v, f"in{i}")
    for op in w.plan.ops:
        if any(o.name in needed for o in op.outs) and op.outs[0].name in per_elem:
            _op(w, op)


def _gather(w: _Writer, op: Op, big: bool) -> None:
    """A direct take: the operand evaluated at each row's index, as ``[BM, 1]`` tiles."""
    plan = w.plan
    a, idx, out = op.args[0], op.args[1], op.outs[0]
    per_elem = {v.name for v in plan.values.values() if plan.has_n(v) and not v.total}
    needed = _needed([a], {o.name: p for p in plan.ops for o in p.outs}, per_elem)
    start = len(w.lines)
    w.gather = True
    w.emit(f"cols = {w.var[idx.name]}{'.to(tl.int64)' if big else ''}")
    w.emit("cmask = (cols >= 0) & (cols < N)")
    w.emit("cols = tl.where(cmask, cols, 0)")
    _decompose(w, "cols", plan.rdims)
    _per_element(w, needed, per_elem)
    w.gather = False
    # The block's names get a suffix: a later loop over the row assigns the same names with
    # [BM, BN] tiles, which Triton would otherwise take for loop-carried values of another type.
    suffix = f"_{w.fresh()}"
    defined = {m.group(1) for line in w.lines[start:] if (m := re.match(r"\s*(\w+) = ", line))}
    pattern = re.compile(r"\b(" + "|".join(sorted(defined, key=len, reverse=True)) + r")\b")
    w.lines[start:] = [pattern.sub(lambda m: m.group(1) + suffix, line) for line in w.lines[start:]]
    acc = TL_DTYPES[_acc_dtype(a.dtype)]
    # eager raises for an index out of range; a kernel cannot, so it yields NaN rather than a number
    _finish(w, out, f"tl.where(cmask{suffix}, {w.var[a.name]}{suffix}.to({acc}), float(\"nan\"))")


def _needed(roots: list[Value], producer: dict, per_elem: set) -> set[str]:
    out: set[str] = set()
    stack = [v for v in roots if v.name in per_elem]
    while stack:
        v = stack.pop()
        if v.name in out:
            continue
        out.add(v.name)
        op = producer.get(v.name)
        if op is not None:
            stack += [a for a in _tensor_args(op) if a.name in per_elem]
    return out


def _row_ops(w: _Writer, ops: list[Op], done: set, direct: dict, big: bool) -> None:
    """Emit, in order, the per-row ops whose operands are all known (a direct take: the
    per-row values its operand reads)."""
    for op in ops:
        if op.outs[0].name in done:
            continue
        if id(op) in direct and direct[id(op)] <= done:
            _gather(w, op, big)
        elif id(op) not in direct and all(a.name in done for a in _tensor_args(op)):
            _op(w, op)
        else:
            continue
        done.update(o.name for o in op.outs)


def _lanes(w: _Writer, a: Value) -> str:
    return f"({'BM' if w.plan.has_m(a) else '1'}, BN)"


def _loop_init(w: _Writer, op: Op, online: dict) -> None:
    a, k = op.args[0], w.var[op.outs[0].name]
    acc = TL_DTYPES[_acc_dtype(a.dtype)]
    lanes = _lanes(w, a)
    if id(op) in online:
        w.emit(f"{k}_m = tl.full({lanes}, float(\"-inf\"), {acc})")
        w.emit(f"{k}_s = tl.full({lanes}, 0, {acc})")
    elif op.name in ("var", "var_mean"):
        for part in ("n", "mu", "m2"):
            w.emit(f"{k}_{part} = tl.full({lanes}, 0, {acc})")
    elif op.name == "take_along_axis":
        w.emit(f"{k}_a = tl.full({lanes}, 0, {acc})")
        w.emit(f"{k}_hits = tl.full({lanes}, 0, tl.int32)")
    else:
        w.emit(f"{k}_a = tl.full({lanes}, {_neutral(op.name, a.dtype)}, {acc})")
        if op.name != "sum" and a.dtype.is_floating_point:
            w.emit(f"{k}_nans = tl.full({lanes}, 0, tl.int32)")


def _loop_step(w: _Writer, op: Op, online: dict) -> None:
    a, k = op.args[0], w.var[op.outs[0].name]
    ctx = _acc_dtype(a.dtype)
    mask = w.mask(a)
    if id(op) in online:
        x, mx = w.fresh(), w.fresh()
        src = online[id(op)][0].args[0]
        w.emit(f"{x} = {_masked(w, src, _NEG_INF, ctx)}")
        w.emit(f"{mx} = tl.maximum({k}_m, {x})")
        # exp(-inf - -inf) is NaN: a lane that has seen only -inf keeps its sum, adds nothing
        w.emit(f"{k}_s = {k}_s * tl.where({k}_m == {mx}, 1.0, tl.exp({k}_m - {mx})) + "
               f"tl.where({x} == float(\"-inf\"), 0.0, tl.exp({x} - {mx}))")
        w.emit(f"{k}_m = {mx}")
    elif op.name in ("var", "var_mean"):      # Welford, per lane
        x, n, d = w.fresh(), w.fresh(), w.fresh()
        w.emit(f"{x} = {_masked(w, a, '0', ctx)}")
        w.emit(f"{n} = {k}_n + tl.where({mask}, 1.0, 0.0)")
        w.emit(f"{d} = {x} - {k}_mu")
        w.emit(_ieee(f"{k}_mu = {k}_mu + tl.where({mask}, DIV({d}, tl.maximum({n}, 1.0)), 0.0)", ctx))
        w.emit(f"{k}_m2 = {k}_m2 + tl.where({mask}, {d} * ({x} - {k}_mu), 0.0)")
        w.emit(f"{k}_n = {n}")
    elif op.name == "take_along_axis":
        (dim,) = reduced_dims(op)
        hit = w.fresh()
        w.emit(f"{hit} = (i{dim} == {w.var[op.args[1].name]}) & {mask}")
        w.emit(f"{k}_a = {k}_a + tl.where({hit}, {w.var[a.name]}.to({TL_DTYPES[ctx]}), 0)")
        w.emit(f"{k}_hits = {k}_hits + tl.where({hit}, 1, 0)")
    else:
        part = _masked(w, a, _neutral(op.name, a.dtype), ctx)
        combine = {"sum": "{k}_a + {p}", "amax": "tl.maximum({k}_a, {p})", "amin": "tl.minimum({k}_a, {p})"}
        w.emit(f"{k}_a = " + combine[op.name].format(k=k, p=part))
        if op.name != "sum" and a.dtype.is_floating_point:
            w.emit(f"{k}_nans = {k}_nans + tl.where({mask} & ({w.var[a.name]} != {w.var[a.name]}), 1, 0)")


def _loop_finish(w: _Writer, op: Op, online: dict) -> None:
    a, out = op.args[0], op.outs[0]
    k = w.var[out.name]
    ctx = _acc_dtype(a.dtype)
    tl_ctx = TL_DTYPES[ctx]
    if id(op) in online:
        # each lane's sum rescaled to the shift b: exp(m - b) * sum(exp(x - m)); a lane holding +inf
        # adds exp(inf - b) as eager's sum would (inf, or NaN when b is inf too)
        b = f"{w.var[online[id(op)][1].name]}.to({tl_ctx})"
        _finish(w, out, _reduce(w, f"tl.where({k}_m == float(\"-inf\"), 0.0, tl.where({k}_m == float(\"inf\"), "
                                   f"tl.exp({k}_m - {b}), {k}_s * tl.exp({k}_m - {b})))", "sum", 1))
    elif op.name in ("var", "var_mean"):      # the lanes combined (Chan et al.)
        mean, m2 = w.fresh(), w.fresh()
        w.emit(_ieee(f"{mean} = DIV({_reduce(w, f'{k}_mu * {k}_n', 'sum', 1)}, N.to({tl_ctx}))", ctx))
        w.emit(f"{m2} = {_reduce(w, f'{k}_m2 + {k}_n * ({k}_mu - {mean}) * ({k}_mu - {mean})', 'sum', 1)}")
        correction = _literal(op.opts.get("correction", 1), ctx)
        _finish(w, out, _ieee(f"DIV({m2}, tl.maximum(N.to({tl_ctx}) - {correction}, 0.0))", ctx))
        if op.name == "var_mean":
            _finish(w, op.outs[1], mean)
    elif op.name == "take_along_axis":
        # eager raises for an index out of range; a kernel cannot, so it yields NaN rather than a number
        _finish(w, out, f"tl.where({_reduce(w, f'{k}_hits', 'sum', 1)} > 0, {_reduce(w, f'{k}_a', 'sum', 1)}, "
                        f"float(\"nan\"))")
    else:
        r = _reduce(w, f"{k}_a", op.name, 1)
        if op.name != "sum" and a.dtype.is_floating_point:
            r = f"tl.where({_reduce(w, f'{k}_nans', 'sum', 1)} > 0, float(\"nan\"), {r})"
        _finish(w, out, r)
