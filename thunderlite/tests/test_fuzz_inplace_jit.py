"""Differential fuzzer through ``thunderlite.jit``: random Python programs of
views, in-place methods, setitem/augmented assignment and reads, over inputs
that may share storage (the same tensor twice, a view of another argument,
overlapping slices), compared with eager PyTorch (outputs and every input
afterwards). Each program also runs with a fusion executor that reorders the
trace at random (transforms/fusion.py), so mutation order is carried by the
trace's dependencies alone.

Programs are built statement by statement; a candidate statement eager PyTorch
rejects (shape mismatch, overlapping write) is dropped, so every program is one
eager runs. The menu of views includes those made by ops without a view symbol
(``detach``, ``.data``, ``as_strided``, ``view_as_real``/``view_as_complex``,
``unbind``/``split``/``unflatten``/``narrow`` results, ``aten.alias``,
``unsafe_split``, ops returning their input when nothing changes). ``scripts/fuzz_inplace.py --jit --seeds N`` runs many seeds.

Left out of the menu until the torch language handles it (reported): opaque
in-place ops (``index_fill_``) on expanded views, which the opaque fallback runs
on a clone and copies back, a copy eager refuses there."""
from __future__ import annotations

import linecache
import random
import warnings

import pytest
import torch

import thunderlite
from thunderlite.core.trace import Trace
from thunderlite.executors.base import FusionExecutor
from thunderlite.transforms.fusion import fuse

from thunderlite.tests.test_fuzz_inplace import ToyFusion

_VIEWS = ["{x}[{i}:{j}]", "{x}.t()", "{x}.transpose(0, 1)", "{x}.reshape(-1)", "{x}.view(-1)",
          "{x}.unsqueeze(0)", "{x}[{i}]", "{x}.narrow(0, {i}, 1)", "{x}.diagonal()", "{x}[:, ::2]",
          "{x}.unsqueeze(0).expand(2, *{x}.shape)", "{x}.squeeze()", "{x}.flatten()", "{x}[..., {i}]"]
# Views made by ops without a view symbol of their own (issue 9): opaque ops, ops whose
# schema under-states their aliasing, ops that return their input when nothing changes.
_ALIAS_VIEWS = ["{x}.detach()", "{x}.data", "{x}.detach()[{i}]", "{x}.data[..., {i}:{j}]",
                "{x}.as_strided((2,), (1,))", "{x}.as_strided((1, 2), (2, 1), 1)",
                "torch.view_as_real(torch.view_as_complex({x}))", "{x}.unflatten(0, (1, -1))",
                "{x}.unflatten(-1, (-1, 1))", "{x}.unbind(0)[{i}]", "{x}.unbind(-1)[0]", "{x}.split(1)[{i}]",
                "{x}.split(2, -1)[-1]", "{x}.narrow(-1, 0, 1)", "{x}.chunk(2)[-1]", "torch.ops.aten.alias({x})",
                "{x}.unsafe_split(1)[0]", "{x}.view_as({x})", "{x}.contiguous()",
                "{x}.reshape({x}.shape)", "{x}.expand_as({x})", "{x}.swapaxes(0, -1)",
                "{x}.sum_to_size({x}.shape)", "{x}.type_as({x})", "{x}.to({x}.dtype)", "{x}.float()",
                "{x}.detach().unflatten(0, (1, -1)).narrow(1, 0, 1)"]
_WRITES = ["{x}.add_({y})", "{x}.mul_({s})", "{x}.sin_()", "{x}.copy_({y})", "{x}.fill_({s})", "{x}.zero_()",
           "{x}[{i}] = {s}", "{x}[{i}:{j}] += {y}", "{x}[{i}:{j}] = {y}", "{x}.clamp_(-0.5, 0.5)",
           "torch.relu_({x})", "{x}.masked_fill_({x} > 0.2, {s})", "{x}.addcmul_({y}, {y})", "{x} += {y}",
           "{x} *= {s}", "{x}.sub_({y}, alpha=2)", "{x}.neg_()", "torch.nn.functional.relu({x}, inplace=True)",
           "{x}[..., {i}] = {s}", "{x}[..., {i}:{j}] -= {y}"]
_READS = ["{x}.sin()", "{x} + {y}", "{x}.sum(0)", "{x} * {s}", "{x}.exp()", "({x} - {y}).abs()",
          "{x}.clone()", "{x}.mean()", "torch.where({x} > 0, {x}, {y})"]


def _alias_inputs(rng: random.Random, rows: int, cols: int, g: torch.Generator, leaves: list | None = None):
    """Two argument tensors and the base(s) to compare afterwards. With
    ``leaves`` (a list), every tensor drawn is a leaf requiring grad (appended
    there) and the arguments are made from non-leaf copies of them, so the
    program's writes into its arguments are on a gradient path."""
    def fresh(t: torch.Tensor) -> torch.Tensor:
        if leaves is None:
            return t
        leaves.append(t.requires_grad_())
        return t * 1.0
    mode = rng.choice(["independent", "same", "view", "overlap", "disjoint", "reshaped"])
    base = fresh(torch.randn(rows + 2, cols, generator=g))
    if mode == "independent":
        other = fresh(torch.randn(rows, cols, generator=g))
        return (base[:rows].clone(), other), None
    if mode == "same":
        t = base[:rows].clone()
        return (t, t), None
    if mode == "view":
        return (base, base[1:rows]), None
    if mode == "overlap":
        return (base[0:rows], base[2:rows + 2]), base
    if mode == "disjoint":
        return (base[0:1], base[1:rows + 2]), base
    return (base, base.view(-1)), None


class FuzzProgram:
    def __init__(self, seed: int, source: str, make_args):
        self.seed = seed
        self.source = source
        self.make_args = make_args

    def function(self):
        filename = f"<fuzz program {self.seed}>"
        linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True), filename)
        namespace = {"torch": torch}
        exec(compile(self.source, filename, "exec"), namespace)
        return namespace["f"]


def generate(seed: int, steps: int = 12, grad: bool = False) -> FuzzProgram:
    """A random program; with ``grad`` its arguments require grad (see
    ``_alias_inputs``; ``make_args(leaves)`` fills the list with the leaves)."""
    rng = random.Random(seed)
    rows, cols = rng.randint(2, 4), rng.randint(2, 4)
    alias_mode = rng.randrange(1 << 30)

    def make_args(leaves: list | None = None):
        g = torch.Generator().manual_seed(seed)
        return _alias_inputs(random.Random(alias_mode), rows, cols, g, leaves)
    (a, b), _ = make_args([] if grad else None)
    env = {"torch": torch, "a": a, "b": b}
    names = ["a", "b"]
    lines: list[str] = []
    count = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps * 4):
            if len(lines) >= steps:
                break
            stmt, new = _candidate(rng, env, names, count)
            try:
                exec(stmt, env)
            except (RuntimeError, IndexError, ValueError, TypeError):
                env.pop(new, None)
                continue
            lines.append(stmt)
            if new is not None:
                names.append(new)
                count += 1
    outs = rng.sample(names, k=min(len(names), rng.randint(1, 3)))
    body = "".join(f"    {ln}\n" for ln in lines)
    source = f"def f(a, b):\n{body}    return ({', '.join(outs)},)\n"
    return FuzzProgram(seed, source, make_args)


def _candidate(rng: random.Random, env: dict, names: list[str], count: int):
    x, y = rng.choice(names), rng.choice(names)
    fill = dict(x=x, y=y, s=round(rng.uniform(-1.5, 1.5), 2), i=rng.randint(0, 2), j=rng.randint(1, 4))
    r = rng.random()
    if r < 0.3:
        new = f"v{count}"
        menu = _ALIAS_VIEWS if rng.random() < 0.4 else _VIEWS
        return f"{new} = {rng.choice(menu).format(**fill)}", new
    if r < 0.7:
        return rng.choice(_WRITES).format(**fill), None
    new = f"r{count}"
    return f"{new} = {rng.choice(_READS).format(**fill)}", new


class ShuffleFusion(FusionExecutor):
    """A fusion executor whose region choice is random per seed: whatever it
    picks, the reordered and fused program must still compute what eager does."""

    def __init__(self, seed: int):
        super().__init__(f"shuffle{seed}")
        self.rng = random.Random(seed)

    def fusion_pass(self, trace: Trace, input_alias_groups=None) -> Trace:
        picked = {}

        def can_fuse(bsym):
            key = bsym.sym.id
            if key not in picked:
                picked[key] = self.rng.random() < 0.5
            return picked[key] and bsym.sym.impl is None
        return fuse(trace, can_fuse, ToyFusion(), input_alias_groups=input_alias_groups)


def check_seed(seed: int, executors=None) -> None:
    prog = generate(seed)
    fn = prog.function()
    (ra, rb), ref_base = prog.make_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = fn(ra, rb)
    for exs in ([None, [ShuffleFusion(seed)]] if executors is None else [executors]):
        (a, b), base = prog.make_args()
        jfn = thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=exs)
        try:
            got = jfn(a, b)
            torch.testing.assert_close(got, expected, equal_nan=True)
            torch.testing.assert_close((a, b), (ra, rb), equal_nan=True)
            if base is not None:
                torch.testing.assert_close(base, ref_base, equal_nan=True)
        except Exception as err:
            traces = thunderlite.last_traces(jfn) if _has_traces(jfn) else []
            final = traces[-1] if traces else "(no trace)"
            raise AssertionError(f"seed {seed} (executors {exs}): {type(err).__name__}: {err}\n"
                                 f"program:\n{prog.source}\nfinal trace:\n{final}") from None


def _has_traces(jfn) -> bool:
    try:
        thunderlite.last_traces(jfn)
        return True
    except Exception:
        return False


@pytest.mark.parametrize("chunk", range(6))
def test_fuzz_inplace_jit(chunk):
    for seed in range(chunk * 25, (chunk + 1) * 25):
        check_seed(seed)


def test_generated_programs_mutate_and_alias():
    """The generator is not vacuous: writes, views and aliased inputs all occur."""
    text = "".join(generate(s).source for s in range(150))
    for piece in ("_(", "] = ", "+= ", ".t()", "[:, ::2]", ".detach()", ".data", ".as_strided(", ".unbind(",
                  ".split(", ".unflatten(", ".narrow(", "view_as_complex"):
        assert piece in text
    shared = set()
    for s in range(30):
        (a, b), _ = _alias_inputs(random.Random(s), 3, 3, torch.Generator().manual_seed(0))
        shared.add(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
    assert shared == {True, False}
