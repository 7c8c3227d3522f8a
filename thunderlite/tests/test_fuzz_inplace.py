"""Differential fuzzer for in-place ops and aliasing (issue 5).

Random programs of views (view prims, and views made by opaque and
torch-language ops: ``detach``, ``.data``, ``as_strided``, ``unflatten``,
``narrow``, ``unbind``, ``split``), writes (plain ``copy_`` and writes hidden inside a
composite), random draws and reads over inputs that may share storage are run
twice: as recorded (the trace run in order by the torch executor is
exactly eager PyTorch: real views, real writes) and after the alias pipeline
(``update_aliases``, ``dce``, a *random* topological order allowed by
``fusion.dependencies``, a toy fusion executor's regions, ``del_last_used``).
Outputs and every input afterwards must match. A few hundred seeds here;
``scripts/fuzz_inplace.py --seeds 5000`` runs thousands.
"""
from __future__ import annotations

import random
import re

import pytest
import torch

from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.core.verify import verify_trace
from thunderlite.executors.run import compile_trace
from thunderlite.torch import opaque_symbol_for, tensor_attribute_fallback
from thunderlite.torch.ops import shapes
from thunderlite.transforms.aliasing.update_aliases import update_aliases
from thunderlite.transforms.dce import dce
from thunderlite.transforms.del_last_used import del_last_used
from thunderlite.transforms.fusion import dependencies, fuse

_UNARY = [prims.sin, prims.cos, prims.neg, prims.tanh, prims.abs]
_BINARY = [prims.add, prims.mul, prims.sub]


class Program:
    """A generated trace plus how to build its concrete inputs."""

    def __init__(self, trace: Trace, make_inputs, alias_groups: list[list[str]], text: str):
        self.trace = trace
        self.make_inputs = make_inputs
        self.alias_groups = alias_groups
        self.text = text


def _scale_and_read(x, s):
    """A composite whose write is hidden in its decomposition (as batch_norm's
    running stats): scales ``x`` in place and returns a fresh read of it."""
    new = prims.copy_(prims.mul(x, s), x)
    return prims.sin(new)


_HIDDEN_WRITE = Symbol("fuzz_scale_and_read", decomposition=_scale_and_read, module="ltorch")


def _random_view(rng: random.Random, t: TensorProxy) -> TensorProxy:
    kind = rng.choice(["slice", "slice", "permute", "reshape", "squeeze"])
    if kind == "permute" and t.ndim == 2:
        return prims.permute(t, (1, 0))
    if kind == "reshape" and t.ndim == 2:
        return prims.reshape(t, (t.numel(),))
    if kind == "squeeze" and 1 in t.shape:
        return prims.squeeze(t, (t.shape.index(1),))
    starts, ends, steps = [], [], []
    for s in t.shape:
        lo = rng.randrange(s)
        hi = rng.randrange(lo + 1, s + 1)
        starts.append(lo)
        ends.append(hi)
        steps.append(rng.choice([1, 1, 2]))
    return prims.slice_prim(t, tuple(starts), tuple(ends), tuple(steps))


def _alias_view(rng: random.Random, t: TensorProxy) -> TensorProxy:
    """A view made by an op without a view prim (issue 9): opaque ``detach``,
    ``.data``, ``as_strided``, or a torch-language ``unflatten``/``narrow``/
    ``unbind``/``split`` element; the alias facts come from ATen schemas."""
    kinds = ["detach", "data"]
    if t.numel():
        kinds.append("as_strided")
    if t.ndim and t.shape[0]:
        kinds += ["unflatten", "narrow", "unbind", "split"]
    kind = rng.choice(kinds)
    if kind == "detach":
        return opaque_symbol_for(torch.Tensor.detach)(t)
    if kind == "data":
        return tensor_attribute_fallback(t, "data")
    if kind == "as_strided":
        return opaque_symbol_for(torch.Tensor.as_strided)(t, (1,), (1,))
    if kind == "unflatten":
        return shapes.unflatten(t, 0, (1, t.shape[0]))
    if kind == "narrow":
        return shapes.narrow(t, 0, rng.randrange(t.shape[0]), 1)
    if kind == "unbind":
        return rng.choice(shapes.unbind(t, 0))
    return rng.choice(shapes.split(t, 1, 0))


def _fresh_from(rng: random.Random, pool: list[TensorProxy], shape: tuple) -> TensorProxy:
    """A value of ``shape`` in fresh memory computed from the pool (or a constant)."""
    same = [p for p in pool if p.shape == shape]
    if not same:
        return prims.full(shape, rng.uniform(-2, 2), device="cpu", dtype=torch.float32)
    a = rng.choice(same)
    if rng.random() < 0.5:
        return rng.choice(_UNARY)(a)
    return rng.choice(_BINARY)(a, rng.choice(same))


def generate(seed: int) -> Program:
    """A random program: inputs (two of them may share storage), then a mix of
    views, writes (``copy_`` of fresh values into views or bases) and reads."""
    rng = random.Random(seed)
    trc = Trace(name="fuzzed")
    rows, cols = rng.randint(2, 5), rng.randint(2, 5)
    aliased = rng.random() < 0.5
    lo = rng.randrange(rows)
    hi = rng.randrange(lo + 1, rows + 1)
    with tracectx(trc):
        a = TensorProxy((rows, cols), name="a")
        b = TensorProxy((rows, cols), name="b")
        args = [a, b]
        if aliased:
            args.append(TensorProxy((hi - lo, cols), name="c"))
        trc.args = args
        pool = list(args)
        for _ in range(rng.randint(3, 14)):
            r = rng.random()
            if r < 0.3:
                view = _alias_view if rng.random() < 0.4 else _random_view
                pool.append(view(rng, rng.choice(pool)))
            elif r < 0.6:
                dst = rng.choice(pool)
                pool.append(prims.copy_(_fresh_from(rng, pool, dst.shape), dst))
            elif r < 0.7:
                pool.append(_HIDDEN_WRITE(rng.choice(pool), rng.uniform(0.5, 1.5)))
            elif r < 0.75:
                shape = rng.choice(pool).shape
                pool.append(prims.uniform(shape, 0.0, 1.0, device="cpu", dtype=torch.float32))
            else:
                pool.append(_fresh_from(rng, pool, rng.choice(pool).shape))
        outs = rng.sample(pool, k=min(len(pool), rng.randint(1, 3)))
        trc.set_return(tuple(outs))

    def make_inputs():
        g = torch.Generator().manual_seed(seed)
        ta = torch.randn(rows, cols, generator=g)
        tb = torch.randn(rows, cols, generator=g)
        return [ta, tb, ta[lo:hi]] if aliased else [ta, tb]

    groups = [["a", "c"]] if aliased else []
    return Program(trc, make_inputs, groups, str(trc))


def random_topological_order(trace: Trace, rng: random.Random, input_alias_groups) -> Trace:
    """Any order the dependencies allow (return last): the strongest test that
    they carry every order the program needs."""
    body = trace.bound_symbols[:-1]
    preds = dependencies(trace.with_bound_symbols(trace.stage, body), input_alias_groups)
    missing = [len(p) for p in preds]
    succs: list[list[int]] = [[] for _ in body]
    for i, ps in enumerate(preds):
        for j in ps:
            succs[j].append(i)
    ready = [i for i in range(len(body)) if missing[i] == 0]
    order = []
    while ready:
        i = ready.pop(rng.randrange(len(ready)))
        order.append(i)
        for s in succs[i]:
            missing[s] -= 1
            if missing[s] == 0:
                ready.append(s)
    assert len(order) == len(body), "dependencies form a cycle"
    return trace.with_bound_symbols("random order", [body[i] for i in order] + [trace.bound_symbols[-1]])


class ToyFusion:
    """Replaces a region by one symbol whose callable runs the region's symbols
    (compiled by the torch executor): the shape every fusion executor has."""

    def __init__(self):
        self.count = 0

    def __call__(self, region) -> object:
        sub = Trace(name=f"region{self.count}")
        sub.args = list(region.inputs)
        sub.bound_symbols.extend(region.bsyms)
        sub.set_return(tuple(region.outputs))
        _, fn = compile_trace(sub, ["torch"])
        sym = Symbol(f"fusion{self.count}", impl=fn, module="toyfusion", tags={Tag.FUSION})
        self.count += 1
        return sym.bind(*region.inputs, output=tuple(region.outputs))


def pipeline(prog: Program, seed: int) -> Trace:
    rng = random.Random(seed * 7919 + 1)
    groups = prog.alias_groups
    t = update_aliases(prog.trace, groups)
    verify_trace(t)
    assert update_aliases(t, groups) is t, "update_aliases is not idempotent"
    t = dce(t, groups)
    verify_trace(t)
    t = random_topological_order(t, rng, groups)
    verify_trace(t)
    fusible = {s for s in _UNARY + _BINARY + [prims.copy_, prims.slice_prim, prims.full, prims.uniform,
                                              _HIDDEN_WRITE] if rng.random() < 0.6}
    t = fuse(t, lambda b: b.sym in fusible, ToyFusion(), input_alias_groups=groups)
    verify_trace(t)
    t = del_last_used(t)
    return t


def _run(trace: Trace, inputs: list[torch.Tensor]):
    _, fn = compile_trace(trace, ["torch"])
    torch.manual_seed(0)                  # random draws must match, so their order must
    return fn(*inputs)


def check_seed(seed: int) -> None:
    """Raise AssertionError (with the program) if the pipeline differs from eager."""
    prog = generate(seed)
    ref_inputs = prog.make_inputs()
    expected = _run(prog.trace, ref_inputs)
    final = pipeline(prog, seed)
    inputs = prog.make_inputs()
    got = _run(final, inputs)
    try:
        for e, g in zip(expected, got, strict=True):
            torch.testing.assert_close(g, e)
        for e, g in zip(ref_inputs, inputs, strict=True):
            torch.testing.assert_close(g, e)
    except AssertionError as err:
        raise AssertionError(f"seed {seed}: {err}\nprogram:\n{prog.text}\nafter the pipeline:\n{final}") from None


@pytest.mark.parametrize("chunk", range(8))
def test_fuzz_inplace(chunk):
    for seed in range(chunk * 40, (chunk + 1) * 40):
        check_seed(seed)


def test_fuzzer_generates_writes_views_and_aliased_inputs():
    """The generator is not vacuous: across seeds it makes every kind of step."""
    seen = set()
    for seed in range(120):
        prog = generate(seed)
        for b in prog.trace.bound_symbols:
            # opaque ops are named per call pattern, in the order a process first meets them
            # (as_strided, as_strided_view, as_strided_1...): count the op, not the suffix
            seen.add(re.sub(r"(_view|_fresh|_\d+)+$", "", b.sym.name))
        if prog.alias_groups:
            seen.add("aliased inputs")
        if any(b.has_tag(Tag.ALIAS_BARRIER) for b in update_aliases(prog.trace, prog.alias_groups).bound_symbols):
            seen.add("barrier")
    assert {"copy_", "slice_prim", "permute", "uniform", "fuzz_scale_and_read", "aliased inputs", "barrier",
            "detach", "data", "as_strided", "unflatten", "narrow", "unbind", "split"} <= seen
