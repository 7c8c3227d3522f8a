"""Generated Triton kernels beyond one block (executors/triton/codegen.py): looped
reductions over rows of any length (forced here with a small block, since the
interpreter is slow), online softmax statistics, several rows per program, the
backward kernels of each family, a GPT block's training step, and autotuning
(triton/autotune.py: the choice, its key, the disk cache, a second process that
times nothing; a fake timer stands in for the GPU's).

Numerics (docs/architecture.md §6): a kernel computes in float32 and rounds once
at its outputs, so results are compared with eager within eager's own error
against a float64 reference (``assert_within_eager_error``), not bit for bit."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import thunderlite
from thunderlite.executors.triton import codegen, tiling
from thunderlite.executors.triton.executor import TritonKernel, triton_executor

_ok, _why = triton_executor.is_available()
pytestmark = pytest.mark.skipif(not _ok, reason=f"Triton executor unavailable: {_why}")

EXECUTORS = ["triton", "torch"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _device() -> str:
    from thunderlite.executors.triton import runtime
    return runtime.DEVICE_TYPE


def _dtypes() -> list:
    from thunderlite.executors.triton import runtime
    return [pytest.param(d, marks=pytest.mark.skipif(d not in runtime.DTYPES, reason=f"{d} only natively (the "
                                                     "interpreter truncates bfloat16)"))
            for d in (torch.float32, torch.float16, torch.bfloat16)]


def assert_within_eager_error(got, eager, ref, k: float = 2.0, atol: float = 1e-5) -> None:
    """``|got - ref| <= k * (|eager - ref| + eps * |ref|) + atol`` elementwise, ``ref`` computed in
    float64 (``eps``: the dtype's): the kernel is as accurate as eager, give or take a rounding or two
    (where eager happens to land on the correctly rounded value, its error says nothing)."""
    if isinstance(got, (tuple, list)):
        for g, e, r in zip(got, eager, ref, strict=True):
            assert_within_eager_error(g, e, r, k, atol)
        return
    assert got.dtype == eager.dtype and got.shape == eager.shape, (got.dtype, eager.dtype, got.shape, eager.shape)
    if not got.dtype.is_floating_point:
        assert torch.equal(got, eager)
        return
    g, e, r = got.double().cpu(), eager.double().cpu(), ref.double().cpu()
    ulp = torch.finfo(got.dtype).eps
    bound = k * ((e - r).abs() + ulp * r.abs()) + atol
    both_nan = g.isnan() & e.isnan()
    same_inf = g.isinf() & (g == e)
    bad = ~((g - r).abs() <= bound) & ~both_nan & ~same_inf
    assert not bad.any(), (f"{int(bad.sum())} of {g.numel()} elements beyond eager's error: got {g[bad][:5]}, "
                           f"eager {e[bad][:5]}, float64 {r[bad][:5]}")


def _kernels(trace) -> list:
    return [b for b in trace.bound_symbols if isinstance(b.sym.impl, TritonKernel)]


def _specs(trace) -> list:
    return [b.sym.impl.spec for b in _kernels(trace)]


@pytest.fixture
def small_blocks(monkeypatch):
    """Rows longer than 16 elements loop over blocks of 8 columns (natively too)."""
    for interpret in (True, False):
        monkeypatch.setitem(tiling.LIMITS, interpret, tiling.Limits(persistent_n=16, loop_bn=8, tile=64))


def _x(*shape, dtype=torch.float32, requires_grad=False):
    return torch.randn(*shape, dtype=dtype, device=_device()).requires_grad_(requires_grad)


_FAMILIES = {
    "softmax": (lambda x: torch.softmax(x, -1), []),
    "log_softmax": (lambda x: F.log_softmax(x, -1), []),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), []),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b), ["w", "b"]),
    "rms_norm": (lambda x, w: F.rms_norm(x, x.shape[-1:], w), ["w"]),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), ["t"]),
    "gelu": (lambda x, b: F.gelu(x + b), ["b"]),
    "silu": (lambda x: F.silu(x) * x, []),
    "row stats": (lambda x: (x.amax(-1), x.amin(-1), x.var(-1), x.mean(-1)), []),
}


def _args(extra: list[str], rows: int, n: int, dtype, requires_grad: bool) -> list:
    out = [_x(rows, n, dtype=dtype, requires_grad=requires_grad)]
    for name in extra:
        if name == "t":
            out.append(torch.randint(0, n, (rows,), device=_device()))
        else:
            out.append(_x(n, dtype=dtype, requires_grad=requires_grad))
    return out


def _check_family(name: str, rows: int, n: int, dtype, grad: bool):
    fn, extra = _FAMILIES[name]
    args = _args(extra, rows, n, dtype, grad)
    jfn = thunderlite.jit(fn, executors=EXECUTORS)
    ref_args = [a.detach().double().requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in args]
    got, eager, ref = jfn(*args), fn(*args), fn(*ref_args)
    got, eager, ref = (o if isinstance(o, tuple) else (o,) for o in (got, eager, ref))
    assert_within_eager_error(got, eager, ref)
    if grad:
        diff = [a for a in args if a.requires_grad]
        cot = [torch.randn_like(o) for o in eager]
        gg = torch.autograd.grad(got, diff, cot)
        ge = torch.autograd.grad(eager, diff, cot)
        gr = torch.autograd.grad(ref, [a for a in ref_args if a.requires_grad], [c.double() for c in cot])
        assert_within_eager_error(gg, ge, gr, k=4.0)
    return jfn


@pytest.mark.parametrize("n", [37, 64])
@pytest.mark.parametrize("name", list(_FAMILIES))
def test_long_rows_loop_over_column_blocks(small_blocks, name, n):
    """Rows longer than a block: looped kernels, forward and backward, odd lengths too."""
    jfn = _check_family(name, 5, n, torch.float32, grad=True)
    looped = [s for s in _specs(thunderlite.last_traces(jfn)[-1]) if s.config.loop]
    assert looped or name in ("gelu", "silu")           # pointwise: nothing to loop over
    assert all(s.BN == 8 and "for n0 in range(0, N, BN)" in s.source for s in looped)
    bwd = thunderlite.last_backward_traces(jfn)[-1]
    assert _kernels(bwd), bwd
    assert not {"native_layer_norm_backward", "fused_rms_norm_backward", "cross_entropy_backward",
                "_softmax_backward_data", "softmax_backward_data", "log_softmax_backward_data",
                "gelu_backward", "silu_backward"} & {b.sym.name for b in bwd.bound_symbols}, bwd


@pytest.mark.parametrize("dtype", _dtypes())
@pytest.mark.parametrize("name", ["softmax", "layer_norm", "cross_entropy", "gelu"])
def test_families_in_each_float_dtype(small_blocks, name, dtype):
    _check_family(name, 3, 21, dtype, grad=True)


def test_online_softmax_reads_the_row_once_for_its_statistics(small_blocks):
    """max and sum(exp(x - max)) accumulate in one pass; the output in a second."""
    for fn, passes in ((lambda x: torch.softmax(x, -1), 2), (lambda x: torch.logsumexp(x, -1), 1)):
        jfn = thunderlite.jit(fn, executors=EXECUTORS)
        x = _x(4, 40)
        assert_within_eager_error(jfn(x), fn(x), fn(x.double()))
        (spec,) = _specs(thunderlite.last_traces(jfn)[-1])
        assert codegen.online_sums(spec.plan) and spec.source.count("for n0 in range") == passes, spec.source


def test_cross_entropy_reads_a_long_row_once(small_blocks):
    """Online statistics in one pass; the target's logit is gathered, not scanned for."""
    fn = lambda x, t: F.cross_entropy(x, t, reduction="none", ignore_index=3)  # noqa: E731
    x, t = _x(6, 45), torch.tensor([0, 3, 44, 7, 3, 20], device=_device())
    jfn = thunderlite.jit(fn, executors=EXECUTORS)
    assert_within_eager_error(jfn(x, t), fn(x, t), fn(x.double(), t))
    (spec,) = _specs(thunderlite.last_traces(jfn)[-1])
    assert spec.source.count("for n0 in range") == 1 and re.search(r"cols_\w+ = tl.where\(cmask_", spec.source)


def test_iota_and_a_kernel_without_inputs():
    """``iota`` (a one-hot's classes) is an index expression; a kernel reading no tensor
    allocates its outputs on the trace's device."""
    fn = lambda: torch.arange(7, device=_device()) * 3 + 1  # noqa: E731
    jfn = thunderlite.jit(fn, executors=EXECUTORS)
    torch.testing.assert_close(jfn(), fn())
    assert _kernels(thunderlite.last_traces(jfn)[-1])


def test_long_rows_with_nan_inf_and_all_minus_inf(small_blocks):
    x = _x(5, 30)
    x[0, 3] = float("nan")
    x[1, 20] = float("inf")
    x[2] = float("-inf")
    x[3, 25] = -1e30
    fn = lambda x: (torch.softmax(x, -1), torch.log_softmax(x, -1), x.amax(-1), x.amin(-1))  # noqa: E731
    jfn = thunderlite.jit(fn, executors=EXECUTORS)
    torch.testing.assert_close(jfn(x), fn(x), equal_nan=True)


def test_cross_entropy_over_a_long_vocabulary_is_one_kernel():
    """No block size forced: rows past the persistent limit loop (interpreter: 16384)."""
    n = tiling.LIMITS[_device() == "cpu"].persistent_n * 2 + 3
    x, t = _x(2, n), torch.randint(0, n, (2,), device=_device())
    jfn = thunderlite.jit(lambda x, t: F.cross_entropy(x, t), executors=EXECUTORS)
    assert_within_eager_error(jfn(x, t), F.cross_entropy(x, t), F.cross_entropy(x.double(), t))
    (spec,) = _specs(thunderlite.last_traces(jfn)[-1])
    assert spec.config.loop


def test_short_rows_share_a_program():
    """Persistent reductions: whole rows in one tile, several rows per program."""
    jfn = thunderlite.jit(lambda x: torch.softmax(x, -1), executors=EXECUTORS)
    x = _x(50, 12)
    torch.testing.assert_close(jfn(x), torch.softmax(x, -1))
    (spec,) = _specs(thunderlite.last_traces(jfn)[-1])
    assert not spec.config.loop and spec.BN == 16 and spec.BM > 1 and spec.grid == (-(-50 // spec.BM),)


def test_a_long_reduction_into_few_rows_is_left_to_torch():
    """One program per row would idle most of a GPU: a sum of 2**18 elements into one
    value is torch's; the pointwise work before it is still a kernel."""
    from thunderlite.executors.triton import plan
    fn = lambda x: (x * 2 + 1).sum()  # noqa: E731
    x = _x(plan.LONG_ROW * 2)
    jfn = thunderlite.jit(fn, executors=EXECUTORS)
    assert_within_eager_error(jfn(x), fn(x), fn(x.double()), atol=1e-2)
    trace = thunderlite.last_traces(jfn)[-1]
    assert len(_kernels(trace)) == 1 and "sum" in {b.sym.name for b in trace.bound_symbols}


def test_column_reductions_take_many_neighbouring_rows(small_blocks):
    """A sum over the batch (a weight's gradient): rows run across memory, so a program
    takes a block of neighbouring outputs and loops down the batch in short blocks."""
    fn = lambda g, x: ((g * x).sum(0), g.sum(0), (x * x).mean(0))  # noqa: E731
    g, x = _x(45, 24), _x(45, 24)
    jfn = thunderlite.jit(fn, executors=EXECUTORS)
    assert_within_eager_error(jfn(g, x), fn(g, x), fn(g.double(), x.double()))
    (spec,) = _specs(thunderlite.last_traces(jfn)[-1])
    assert spec.config.loop and spec.BM == 32 and spec.BN == 8 and spec.plan.rdims == (0,)


def test_a_large_total_is_cut_from_its_rows():
    """The batch mean of a cross-entropy over many long rows is its own small kernel, not
    one program looping over everything."""
    from thunderlite.executors.triton import plan
    rows = plan.MAX_TOTAL_WORK // 512 + 1
    x, t = _x(rows, 512), torch.randint(0, 512, (rows,), device=_device())
    jfn = thunderlite.jit(lambda x, t: F.cross_entropy(x, t), executors=EXECUTORS)
    assert_within_eager_error(jfn(x, t), F.cross_entropy(x, t), F.cross_entropy(x.double(), t))
    specs = _specs(thunderlite.last_traces(jfn)[-1])
    assert len(specs) >= 2 and all(s.grid != (1,) or s.plan.M * s.plan.N <= rows for s in specs), specs


class _Block(torch.nn.Module):
    def __init__(self, d=16, heads=2, vocab=40):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, x, targets):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def test_gpt_block_training_step_equals_eager(small_blocks):
    model = _Block().to(_device())
    x, targets = _x(2, 6, 16), torch.randint(0, 40, (2, 6), device=_device())
    grads = {}
    for label, fn in (("eager", model), ("jit", thunderlite.jit(model, executors=EXECUTORS))):
        model.zero_grad(set_to_none=True)
        loss = fn(x, targets)
        loss.backward()
        grads[label] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
        jm = fn
    torch.testing.assert_close(grads["jit"][0], grads["eager"][0])
    for name, g in grads["eager"][1].items():
        torch.testing.assert_close(grads["jit"][1][name], g, msg=name, atol=1e-5, rtol=1e-4)
    bwd = thunderlite.last_backward_traces(jm)[-1]
    names = {b.sym.name for b in bwd.bound_symbols}
    assert len(_kernels(bwd)) >= 3 and not {"native_layer_norm_backward", "cross_entropy_backward",
                                            "gelu_backward"} & names, bwd


# --- autotuning ------------------------------------------------------------------------------------

@pytest.fixture
def tuning(monkeypatch, tmp_path):
    """Autotuning on, into a fresh cache, timed by a fake timer that prefers BM == 2
    (persistent) or BN == 16 (looped) and records what it timed."""
    from thunderlite.executors.triton import autotune
    monkeypatch.setenv("THUNDERLITE_TRITON_AUTOTUNE", "1")
    monkeypatch.setenv("THUNDERLITE_TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    monkeypatch.setattr(autotune, "timed", [])
    calls: list = []

    def fake(config, run):
        run()
        calls.append(config)
        return 0.0 if (config.BM == 2 and not config.loop) or (config.loop and config.BN == 16) else 1.0
    monkeypatch.setattr(autotune, "timer", fake)
    return calls, tmp_path


def test_autotune_picks_the_fastest_and_caches_it_on_disk(tuning):
    calls, cache = tuning
    fn = lambda x: torch.softmax(x * 2, -1)  # noqa: E731
    x = _x(9, 20)
    jfn = thunderlite.jit(fn, executors=EXECUTORS)
    torch.testing.assert_close(jfn(x), fn(x))
    (spec,) = _specs(thunderlite.last_traces(jfn)[-1])
    assert len(calls) == len(tiling.candidate_configs(spec.plan, _device() == "cpu")) > 1
    assert spec.BM == 2 and spec.grid == (5,)
    (path,) = cache.glob("*.json")
    stored = json.loads(path.read_text())
    assert stored["config"]["BM"] == 2 and len(stored["timings"]) == len(calls)
    calls.clear()
    torch.testing.assert_close(jfn(x), fn(x))               # the same kernel: tuned once
    jfn2 = thunderlite.jit(fn, executors=EXECUTORS)         # a new kernel object, same key: read back
    y = _x(12, 30)                                          # the same shape class
    torch.testing.assert_close(jfn2(y), fn(y))
    assert calls == [] and _specs(thunderlite.last_traces(jfn2)[-1])[0].BM == 2


def test_autotune_key_separates_structure_shape_class_device_and_version():
    from thunderlite.executors.triton import autotune
    from thunderlite.executors.triton.plan import Plan
    p1, p2, p3 = Plan(), Plan(), Plan()
    p1.domain, p1.rdims = (9, 20), (1,)
    p2.domain, p2.rdims = (12, 30), (1,)        # same powers of two: one class
    p3.domain, p3.rdims = (9, 40), (1,)
    key = autotune.cache_key("src", p1, "H100", "3.4")
    assert key == autotune.cache_key("src", p2, "H100", "3.4")
    assert len({key, autotune.cache_key("src", p3, "H100", "3.4"), autotune.cache_key("other", p1, "H100", "3.4"),
                autotune.cache_key("src", p1, "H200", "3.4"), autotune.cache_key("src", p1, "H100", "3.5")}) == 5


def test_autotune_looped_candidates_and_a_failing_candidate(small_blocks, tuning):
    """Looped reductions tune their column block; a candidate that raises is skipped."""
    from thunderlite.executors.triton import autotune
    calls, _ = tuning
    fake = autotune.timer

    def flaky(config, run):
        if config.loop and config.BN == 8:
            raise RuntimeError("out of resources")
        return fake(config, run)
    autotune.timer = flaky
    monkey_candidates = [tiling.Config(BM=1, BN=8, loop=True), tiling.Config(BM=1, BN=16, loop=True),
                         tiling.Config(BM=1, BN=32, loop=True)]
    original = tiling.candidate_configs
    tiling.candidate_configs = lambda plan, interpret: monkey_candidates
    try:
        jfn = thunderlite.jit(lambda x: F.log_softmax(x, -1), executors=EXECUTORS)
        x = _x(3, 50)
        torch.testing.assert_close(jfn(x), F.log_softmax(x, -1))
    finally:
        tiling.candidate_configs = original
    (spec,) = _specs(thunderlite.last_traces(jfn)[-1])
    assert spec.config == monkey_candidates[1] and len(calls) == 2


def test_autotune_off_takes_the_heuristic_untimed(tuning, monkeypatch):
    calls, cache = tuning
    monkeypatch.setenv("THUNDERLITE_TRITON_AUTOTUNE", "0")
    jfn = thunderlite.jit(lambda x: torch.softmax(x, -1), executors=EXECUTORS)
    x = _x(9, 20)
    torch.testing.assert_close(jfn(x), torch.softmax(x, -1))
    (spec,) = _specs(thunderlite.last_traces(jfn)[-1])
    assert calls == [] and not list(cache.glob("*.json"))
    assert spec.config == tiling.heuristic_config(spec.plan, _device() == "cpu")


def test_autotune_is_off_by_default_under_the_interpreter(monkeypatch):
    from thunderlite.executors.triton import autotune
    monkeypatch.delenv("THUNDERLITE_TRITON_AUTOTUNE", raising=False)
    assert autotune.enabled(interpret=True) is False and autotune.enabled(interpret=False) is True
    monkeypatch.setenv("THUNDERLITE_TRITON_AUTOTUNE", "1")
    assert autotune.enabled(interpret=True) is True


_SECOND_PROCESS = """
import json, sys, torch, thunderlite
from thunderlite.executors.triton import autotune
autotune.timer = lambda config, run: (run(), 0.0 if config.BM == 2 else 1.0)[1]
f = thunderlite.jit(lambda x: torch.softmax(x * 2, -1), executors=["triton"])
x = torch.randn(9, 20, device=sys.argv[1])
torch.testing.assert_close(f(x), torch.softmax(x * 2, -1))
spec = [b.sym.impl.spec for b in thunderlite.last_traces(f)[-1].bound_symbols if hasattr(b.sym.impl, "spec")][0]
print(json.dumps({"timed": len(autotune.timed), "BM": spec.BM}))
"""


def test_a_second_process_pays_nothing(tmp_path):
    env = {**os.environ, "THUNDERLITE_TRITON_AUTOTUNE": "1", "THUNDERLITE_TRITON_CACHE_DIR": str(tmp_path)}
    results = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _SECOND_PROCESS, _device()], capture_output=True, text=True,
                             env=env, cwd=ROOT, timeout=300)
        assert out.returncode == 0, out.stderr
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert results == [{"timed": 1, "BM": 2}, {"timed": 0, "BM": 2}]
