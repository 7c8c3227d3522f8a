"""Tiered compilation (frontend/caching/tiers.py): an entry called N times
gets its regions compiled by torchcompile off the calling thread and swapped
in. Checked against eager before and after the swap: outputs, gradients,
written inputs and module state; concurrent calls during the swap; a failing
hot tier keeps the fast one; ``cache_info``/``examine``/the report show the
tier. Each hot tier compiles Inductor code (seconds each; Inductor's on-disk
caches make reruns cheaper)."""
from __future__ import annotations

import copy
import linecache
import subprocess
import sys
import threading
import time

import pytest
import torch

import thunderlite
from thunderlite.core.tags import Tag
from thunderlite.executors.torchcompile import TorchCompileExecutor
from thunderlite.extend import get_executor
from thunderlite.frontend.caching import tiers
from thunderlite.frontend.caching.tiers import TRIAL_WARMUP


@pytest.fixture(autouse=True)
def _needs_torchcompile():
    ok, reason = get_executor("torchcompile").is_available()
    if not ok:
        pytest.skip(f"the hot tier's executor is unavailable: {reason}")


def _trial_length(trial_calls: int) -> int:
    """Calls a hot tier's trial takes after its swap: one to start the first
    interval, the warm-up ones, then ``trial_calls`` of each tier, alternating."""
    return 1 + TRIAL_WARMUP + 2 * trial_calls


def _policy(after_calls: int, **options) -> thunderlite.TierPolicy:
    """Tier up after ``after_calls`` calls, untried unless ``trial_calls`` is given (no timing decides)."""
    return thunderlite.TierPolicy(after_calls=after_calls, **{"trial_calls": 0, **options})


def _tier(jfn) -> dict:
    (tier,) = thunderlite.cache_info(jfn)["tiers"]
    return tier


def _hot_regions(jfn) -> list:
    finals = [thunderlite.last_traces(jfn)[-1], *thunderlite.last_backward_traces(jfn)[-1:]]
    return [b for t in finals for b in t.bound_symbols
            if Tag.FUSION in b.sym.tags and b.sym.executor is get_executor("torchcompile")]


def _compilations(jfn) -> int:
    return sum(b.sym.impl.compilations for b in _hot_regions(jfn))


def _symbolic_regions(jfn) -> list:
    from thunderlite.executors.torchcompile import SymbolicRegion
    return [b.sym.impl.compiled for b in _hot_regions(jfn) if type(b.sym.impl.compiled) is SymbolicRegion]


def _mlp(x, w, b):
    h = torch.nn.functional.gelu(x @ w + b)
    return (h.sin() * 2 + h.cos() * h - x.t().sum(0)).tanh()


def test_tier_up_after_n_calls_with_eager_answers_before_and_after():
    x, w, b = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8)
    jf = thunderlite.jit(_mlp, tiering=_policy(3))
    for _ in range(2):
        torch.testing.assert_close(jf(x, w, b), _mlp(x, w, b))
    assert _tier(jf)["tier"] == "fast" and _tier(jf)["calls"] == 2
    assert not _hot_regions(jf)
    torch.testing.assert_close(jf(x, w, b), _mlp(x, w, b))     # the third call: the tier-up starts
    assert _tier(jf)["tier"] in ("compiling", "hot")
    assert thunderlite.wait_for_tiers(jf)
    tier = _tier(jf)
    assert tier["tier"] == "hot", tier
    assert tier["seconds_to_hot"] >= tier["hot_compile_seconds"] > 0 and tier["hot_regions"] >= 1
    torch.testing.assert_close(jf(x, w, b), _mlp(x, w, b))
    assert _hot_regions(jf), thunderlite.last_traces(jf)[-1]
    assert _tier(jf)["calls"] == 4
    # the rehearsal compiled every layout the call met (x.t() included): the hot call compiled nothing
    before = _compilations(jf)
    jf(x, w, b)
    assert _compilations(jf) == before
    # other inputs of the same key run the hot entry too
    x2 = torch.randn(8, 8)
    torch.testing.assert_close(jf(x2, w, b), _mlp(x2, w, b))


def test_tiering_off_and_policy_options():
    x = torch.randn(4)
    jf = thunderlite.jit(lambda a: a.sin() + 1, tiering=False)
    for _ in range(30):
        jf(x)
    assert thunderlite.cache_info(jf)["tiers"] == []
    assert thunderlite.wait_for_tiers(jf)
    assert "tiering off" in str(thunderlite.examine(jf, x))
    with pytest.raises(ValueError, match="at least 1"):
        thunderlite.TierPolicy(after_calls=0)
    with pytest.raises(TypeError, match="tiering="):
        thunderlite.jit(lambda a: a, tiering="yes")


def test_entries_that_stay_fast_say_why():
    x = torch.randn(4)
    jf = thunderlite.jit(lambda a: a.sin() + 1, executors=["torchcompile", "torch"], tiering=_policy(2))
    jf(x)
    jf(x)
    assert _tier(jf)["tier"] == "fast (final)" and "fuse already ('torchcompile')" in _tier(jf)["reason"]

    def reseeds(a):
        torch.manual_seed(0)
        return a + torch.rand(4)
    jr = thunderlite.jit(reseeds, tiering=_policy(2))
    for _ in range(3):
        torch.testing.assert_close(jr(x), reseeds(x))
    assert _tier(jr)["tier"] == "fast (final)" and "manual_seed" in _tier(jr)["reason"]

    # an executor whose symbolic regions compile on a call's thread (the user chose dynamic=)
    per_call = TorchCompileExecutor("torchcompile_dynamic", compile_options={"dynamic": True})
    jd = thunderlite.jit(lambda a: a * 2, dynamic=True, tiering=_policy(2, executor=per_call))
    jd(torch.randn(3))
    jd(torch.randn(3))
    assert "symbolic sizes" in _tier(jd)["reason"]

    js = thunderlite.jit(lambda a: a.sin() + 1, tiering=_policy(2))      # two torch calls: a region costs more
    js(x)
    js(x)
    assert thunderlite.wait_for_tiers(js)
    assert _tier(js)["tier"] == "fast (final)" and "symbols of about" in _tier(js)["reason"], _tier(js)


class _BrokenRegions(TorchCompileExecutor):
    """Regions whose compile fails: the hot tier must fail and keep the fast one."""

    def _compile(self, sub, region):
        raise RuntimeError("no compiler today")


def test_a_failing_hot_tier_keeps_the_fast_tier_with_the_reason():
    broken = _BrokenRegions("torchcompile_broken")
    x, w, b = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8)
    jf = thunderlite.jit(_mlp, tiering=_policy(2, executor=broken))
    for _ in range(2):
        torch.testing.assert_close(jf(x, w, b), _mlp(x, w, b))
    assert thunderlite.wait_for_tiers(jf)
    tier = _tier(jf)
    assert tier["tier"] == "fast (final)" and "no compiler today" in tier["reason"], tier
    for _ in range(3):
        torch.testing.assert_close(jf(x, w, b), _mlp(x, w, b))
    assert not [b for b in thunderlite.last_traces(jf)[-1].bound_symbols if Tag.FUSION in b.sym.tags]
    assert "stays so" in str(thunderlite.examine(jf, x, w, b))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.register_buffer("seen", torch.zeros(8))

    def forward(self, x):
        h = torch.nn.functional.gelu(self.bn(self.lin(x)))
        self.seen.add_(h.detach().mean(0))      # a buffer written on every call
        return (h * h.sigmoid() + h.tanh() * 0.5 - h.cos()).sum(-1)


def test_writes_and_module_state_stay_eager_after_the_swap():
    torch.manual_seed(0)
    model = _Net()
    ref = copy.deepcopy(model)
    jm = thunderlite.jit(model, tiering=_policy(2))
    x = torch.randn(6, 8)
    with torch.no_grad():
        for i in range(6):
            torch.testing.assert_close(jm(x + i), ref(x + i))
            if i == 2:
                assert thunderlite.wait_for_tiers(jm) and _tier(jm)["tier"] == "hot", _tier(jm)
    assert _hot_regions(jm)
    for name, buf in ref.named_buffers():
        torch.testing.assert_close(dict(model.named_buffers())[name], buf)

    def scale_(a, s):
        a.mul_(s)
        h = (a.sin() * 2 + a.cos() * a.sigmoid() - a.tanh()).tanh()
        a.add_(h.mean())
        return h
    ja = thunderlite.jit(scale_, tiering=_policy(2))
    a = torch.randn(5)
    ea = a.clone()
    for _ in range(5):
        torch.testing.assert_close(ja(a, torch.full((5,), 0.5)), scale_(ea, torch.full((5,), 0.5)))
        torch.testing.assert_close(a, ea)
        thunderlite.wait_for_tiers(ja)
    assert _tier(ja)["tier"] == "hot"


class _Mini(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.down(torch.nn.functional.silu(self.up(self.norm(h))))
        return torch.nn.functional.cross_entropy(h.flatten(0, 1), ids.flatten() % 8)


def _grads(m):
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def test_training_forward_backward_stays_eager_after_the_swap():
    torch.manual_seed(0)
    model = _Mini()
    ref = copy.deepcopy(model)
    jm = thunderlite.jit(model, tiering=_policy(2))
    ids = torch.randint(0, 16, (2, 5))
    for i in range(5):
        loss, eloss = jm(ids), ref(ids)
        loss.backward()
        eloss.backward()
        torch.testing.assert_close(loss, eloss)
        for n, g in _grads(ref).items():
            torch.testing.assert_close(_grads(model)[n], g)
        if i == 1:
            assert thunderlite.wait_for_tiers(jm) and _tier(jm)["tier"] == "hot", _tier(jm)
    hot = _hot_regions(jm)
    assert any(b in thunderlite.last_backward_traces(jm)[-1].bound_symbols for b in hot)
    before = _compilations(jm)
    jm(ids).backward()
    assert _compilations(jm) == before      # forward and backward layouts were all rehearsed
    # the hot entry's fast guard checks the parameters in one C++ call, as the fast tier's did
    src = "".join(linecache.getlines(jm._jitted._fast.__code__.co_filename))
    assert "_tensor_meta(" in src and "isinstance(" not in src.split("try:")[1], src


def test_whole_training_step_with_optimizer_stays_eager_after_the_swap():
    torch.manual_seed(0)
    model = _Mini()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)

    def step(m, o, ids):
        loss = m(ids)
        loss.backward()
        o.step()
        o.zero_grad()
        return loss.detach()
    jstep = thunderlite.jit(step, tiering=_policy(2))
    ids = torch.randint(0, 16, (2, 5))
    for i in range(6):
        torch.testing.assert_close(jstep(model, opt, ids), step(ref, ref_opt, ids))
        if i == 2:      # the first step compiled without momentum buffers, the second with them
            assert thunderlite.wait_for_tiers(jstep)
    tiers = thunderlite.cache_info(jstep)["tiers"]
    assert [t["tier"] for t in tiers] == ["fast", "hot"], tiers
    assert _hot_regions(jstep)
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=n)


def test_dropout_draws_eager_numbers_and_the_rehearsal_draws_none():
    def drop(a):
        d = torch.nn.functional.dropout(a.sin() * a.cos() + a.tanh(), 0.5, training=True)
        return d * 3 + a.cos() * a.sigmoid() - a.exp().tanh()
    x = torch.randn(64)
    jf = thunderlite.jit(drop, tiering=_policy(2))
    torch.manual_seed(1)
    outs = [jf(x), jf(x)]
    assert thunderlite.wait_for_tiers(jf) and _tier(jf)["tier"] == "hot", _tier(jf)
    outs += [jf(x), jf(x)]
    torch.manual_seed(1)
    for out in outs:
        torch.testing.assert_close(out, drop(x))


def test_concurrent_calls_during_the_swap_return_eager_answers():
    x, w, b = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8)
    expected = _mlp(x, w, b)
    jf = thunderlite.jit(_mlp, tiering=_policy(2))
    jf(x, w, b)
    jf(x, w, b)         # the second call starts the compile: the threads below call while it runs
    assert _tier(jf)["tier"] in ("compiling", "hot")
    errors: list = []
    swapped = threading.Event()
    after = [0] * 4         # each thread's calls after the swap

    def caller(k: int):
        try:
            while after[k] < 5:
                torch.testing.assert_close(jf(x, w, b), expected)
                after[k] += swapped.is_set()
        except Exception as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)
    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    assert thunderlite.wait_for_tiers(jf, timeout=600)
    swapped.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert _tier(jf)["tier"] == "hot"
    torch.testing.assert_close(jf(x, w, b), expected)
    assert _hot_regions(jf)


def test_examine_and_the_report_show_the_tier(tmp_path):
    x, w, b = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8)
    jf = thunderlite.jit(_mlp, tiering=_policy(2))
    assert "tier: fast (compiled in" in str(thunderlite.examine(jf, x, w, b))     # its first call
    jf(x, w, b)
    assert thunderlite.wait_for_tiers(jf)
    text = str(thunderlite.examine(jf, x, w, b))
    assert "tier: hot: 1 regions compiled by torchcompile" in text, text
    page = open(thunderlite.trace_report(jf, tmp_path / "r.html"), encoding="utf-8").read()
    assert "tier: hot" in page


def _chain(x):
    for _ in range(6):
        x = (x * 1.01 + 0.5).sin()
    return x


def test_a_trial_keeps_a_hot_tier_that_costs_less():
    """18 passes over 8 MB in eager, one in the fused region: the trial keeps it."""
    x = torch.randn(2_000_000)
    want = _chain(x)            # once: the intervals measured hold the jitted calls only
    jf = thunderlite.jit(_chain, tiering=thunderlite.TierPolicy(after_calls=3, trial_calls=4))
    outs = [jf(x) for _ in range(7)]        # calls 3-7 measure the fast tier; the seventh starts the compile
    assert thunderlite.wait_for_tiers(jf)
    assert _tier(jf)["tier"] == "trial", _tier(jf)
    outs += [jf(x) for _ in range(_trial_length(4))]
    for out in outs:
        torch.testing.assert_close(out, want)
    tier = _tier(jf)
    assert tier["tier"] == "hot" and tier["hot_ms_per_call"] <= tier["fast_ms_per_call"], repr(tier)
    assert "tier: hot:" in str(thunderlite.examine(jf, x))


class _Burning:
    """A compiled region that spends 20 ms of CPU before each call."""

    def __init__(self, compiled):
        self.compiled = compiled

    def __getattr__(self, name):
        return getattr(self.compiled, name)

    def __call__(self, *args):
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass
        return self.compiled(*args)


class _SlowRegions(TorchCompileExecutor):
    def _compile(self, sub, region):
        return _Burning(super()._compile(sub, region))


def test_a_trial_puts_back_the_fast_tier_when_the_hot_one_costs_more():
    x, w, b = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8)
    policy = thunderlite.TierPolicy(after_calls=3, trial_calls=3, executor=_SlowRegions("torchcompile_slow"))
    jf = thunderlite.jit(_mlp, tiering=policy)
    for _ in range(6):
        torch.testing.assert_close(jf(x, w, b), _mlp(x, w, b))
    assert thunderlite.wait_for_tiers(jf) and _tier(jf)["tier"] == "trial", _tier(jf)
    for _ in range(_trial_length(3)):
        torch.testing.assert_close(jf(x, w, b), _mlp(x, w, b))
    tier = _tier(jf)
    assert tier["tier"] == "fast (final)" and "slower" in tier["reason"], tier
    assert tier["hot_ms_per_call"] > tier["fast_ms_per_call"]
    torch.testing.assert_close(jf(x, w, b), _mlp(x, w, b))
    assert not _hot_regions(jf)


def test_the_backward_is_rehearsed_with_the_gradient_layouts_autograd_gives():
    """``out.sum().backward()`` hands the backward an expanded gradient (stride 0):
    measured on the fast tier, rehearsed, so no hot call compiles a region."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16), torch.nn.Tanh())
    ref = copy.deepcopy(model)

    def f(m, x):
        h = m(x)
        return (h * h.sigmoid() + h.cos() - h.sin() * 2).t()
    x = torch.randn(8, 16)
    jf = thunderlite.jit(f, tiering=thunderlite.TierPolicy(after_calls=2, trial_calls=2))
    for i in range(5 + _trial_length(2)):
        out = jf(model, x)
        out.sum().backward()
        f(ref, x).sum().backward()
        torch.testing.assert_close(out, f(ref, x))
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
        if i == 4:      # calls 3-5 measured the fast tier, the fifth started the compile
            assert thunderlite.wait_for_tiers(jf) and _tier(jf)["tier"] == "trial", _tier(jf)
        if i == 5:      # the hot tier's first call: both regions ran the one layout the rehearsal compiled
            assert _compilations(jf) == 2 and len(_hot_regions(jf)) == 2
    assert _tier(jf)["tier"] in ("hot", "fast (final)"), _tier(jf)       # what the trial measured decides


def test_a_layout_the_rehearsal_did_not_meet_compiles_off_the_calling_thread():
    """The key holds no strides: a transposed input runs the hot entry with a
    region layout nobody rehearsed. That call runs the region's torch calls,
    the worker compiles the layout, and the calls after it run compiled code."""
    x, w, b = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8)
    jf = thunderlite.jit(_mlp, tiering=_policy(2))
    jf(x, w, b)
    jf(x, w, b)
    assert thunderlite.wait_for_tiers(jf)
    jf(x, w, b)
    assert _compilations(jf) == 1
    xt = x.t().contiguous().t()         # same values and key, other strides
    from thunderlite.frontend.caching.tiers import _worker
    gate = threading.Event()
    _worker().submit(gate.wait)         # the worker waits until the call is checked
    torch.testing.assert_close(jf(xt, w, b), _mlp(xt, w, b))
    assert _compilations(jf) == 1       # not compiled by that call
    gate.set()
    assert thunderlite.wait_for_tiers(jf)
    assert _compilations(jf) == 2       # by the worker
    torch.testing.assert_close(jf(xt, w, b), _mlp(xt, w, b))
    assert _compilations(jf) == 2


def test_tiering_is_on_by_default_outside_the_suite():
    """The suite's conftest turns the default off; a user's process has it on."""
    prog = ("import torch, thunderlite\n"
            "jf = thunderlite.jit(lambda a: a.sin() + 1)\n"
            "jf(torch.randn(3))\n"
            "(tier,) = thunderlite.cache_info(jf)['tiers']\n"
            "assert tier['tier'] == 'fast', tier\n"
            "assert thunderlite.TierPolicy().after_calls == 20\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def _norm_mlp(x, w):
    """Enough work over a symbolic length (rows of ``x``) to be worth a region."""
    h = torch.nn.functional.gelu(x @ w)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (h.sin() * 2 + h.cos() * h).softmax(0).tanh()


def test_an_entry_of_symbolic_sizes_tiers_up_and_serves_every_size_without_compiling():
    """``dynamic=True``: the length of ``x`` is a size symbol (a decode step's
    cache length). Its regions compile once, on the worker, for every length
    (``SymbolicRegion``): after the swap, calls of other lengths return eager's
    answers and compile nothing, on no thread."""
    w = torch.randn(16, 16)
    jf = thunderlite.jit(_norm_mlp, dynamic=True, tiering=_policy(2))
    for n in (5, 6):
        x = torch.randn(n, 16)
        torch.testing.assert_close(jf(x, w), _norm_mlp(x, w))
    assert thunderlite.wait_for_tiers(jf)
    tier = _tier(jf)
    assert tier["tier"] == "hot", tier
    x = torch.randn(7, 16)
    torch.testing.assert_close(jf(x, w), _norm_mlp(x, w))
    regions = _symbolic_regions(jf)
    assert regions, thunderlite.last_traces(jf)[-1]
    before = _compilations(jf)
    for n in (2, 3, 9, 31, 64, 100):
        x = torch.randn(n, 16)
        torch.testing.assert_close(jf(x, w), _norm_mlp(x, w))
    assert _compilations(jf) == before
    assert thunderlite.wait_for_tiers(jf)
    assert _compilations(jf) == before      # nor did the worker: nothing was handed to it
    assert thunderlite.cache_info(jf)["misses"] == 1


def test_a_symbolic_number_entry_tiers_up_with_eager_answers():
    """``cache="symbolic values"``: the int is a trace input; the hot regions serve every value."""
    def f(x, k):
        h = torch.nn.functional.gelu(x * k + 1)
        return (h.sin() * 2 + h.cos() * h).softmax(-1).tanh() + x[:k].sum()
    jf = thunderlite.jit(f, cache="symbolic values", tiering=_policy(2))
    x = torch.randn(12, 8)
    for k in (3, 4):
        torch.testing.assert_close(jf(x, k), f(x, k))
    assert thunderlite.wait_for_tiers(jf)
    assert _tier(jf)["tier"] == "hot", _tier(jf)
    jf(x, 5)
    assert _symbolic_regions(jf), thunderlite.last_traces(jf)[-1]
    before = _compilations(jf)
    for k in (2, 6, 7, 11):
        torch.testing.assert_close(jf(x, k), f(x, k))
    assert _compilations(jf) == before


def _region_over_rows(fn, writing: bool):
    """A ``SymbolicRegion`` of ``fn(x)`` (a tuple, as a region's trace
    returns), ``x`` of a symbolic number of rows and 4 columns. One that
    writes takes dynamo's path (``torch.compile(dynamic=True)``, its caches
    reset: tests share code objects); one that does not is compiled without
    dynamo (``DirectSymbolic``) once prepared."""
    import torch._dynamo

    from thunderlite.core.proxies import NumberProxy, TensorProxy
    from thunderlite.core.symint import ShapeEnv
    from thunderlite.executors.torchcompile import SymbolicRegion
    if writing:
        torch._dynamo.reset()
    s0 = ShapeEnv().size_symbol(NumberProxy(5, int, name="s0"), 5, "x.shape[0]")
    return SymbolicRegion(fn, writing, (TensorProxy(shape=(s0, 4), name="x"),))


def _sin2(x):
    return (x * 2).sin(),


@pytest.mark.parametrize("writing", [False, True], ids=["direct", "dynamo"])
def test_a_region_that_would_recompile_per_size_keeps_the_fast_tier(writing):
    """A region whose compiled code is specialized to the sizes it met (here
    its code branches on a size) would compile again per size: ``prepare``
    says so and raises, and a tier-up meeting it stays fast with that reason
    (on both paths: the direct one's guards refuse other sizes, dynamo
    compiles again)."""
    from thunderlite.executors.torchcompile import RecompilesPerSize

    def specialized(x):
        return (x * 2 if x.shape[0] == 5 else x * 3).sin(),
    region = _region_over_rows(specialized, writing)
    with pytest.raises(RecompilesPerSize, match="recompile per size"):
        region.prepare([torch.empty(5, 4)])

    def generic(x):
        return (x * 2).sin().cumsum(0),
    region = _region_over_rows(generic, writing)
    region.prepare([torch.empty(5, 4)])
    assert region.compilations == 1 and (region._direct is None) == writing
    region.defer_to(lambda job: None)
    x = torch.randn(8, 4)
    torch.testing.assert_close(region(x), generic(x))
    assert region.compilations == 1


@pytest.mark.parametrize("writing", [False, True], ids=["direct", "dynamo"])
def test_a_hot_symbolic_region_meeting_unforeseen_inputs_runs_torch_calls_on_the_calling_thread(writing):
    """Once deferred, a region never compiles on a calling thread: a call its
    compiled code's guards refuse runs the region's torch calls."""
    region = _region_over_rows(_sin2, writing)
    region.prepare([torch.empty(5, 4)])
    region.defer_to(lambda job: None)
    assert region.compilations == 1 and (region._direct is None) == writing
    for x in (torch.randn(6, 4, dtype=torch.float64), torch.randn(3, 5), torch.randn(9, 4)):  # guards refuse two
        torch.testing.assert_close(region(x), _sin2(x))
    assert region.compilations == 1


def _counting(direct):
    """``direct``'s compiled code, counting the calls that reach it."""
    calls = [0]
    compiled = direct.compiled

    def counted(box):
        calls[0] += 1
        return compiled(box)
    direct.compiled = counted
    return calls


def test_a_rehearsed_symbolic_region_runs_inductors_code_without_dynamo():
    """A prepared region of symbolic sizes that writes nothing is compiled
    without dynamo (``DirectSymbolic``: cheaper per call): its compiled code
    serves every size, and slices of longer tensors whose strides change per
    call (what ``generate`` passes); a call of another dtype runs the torch
    calls; every answer is eager's."""
    from thunderlite.core.proxies import NumberProxy, TensorProxy
    from thunderlite.core.symint import ShapeEnv
    from thunderlite.executors.torchcompile import SymbolicRegion
    env = ShapeEnv()
    s0 = env.size_symbol(NumberProxy(5, int, name="s0"), 5, "k.shape[1]")

    def f(q, k):
        s = (q.unsqueeze(1) * k).sum(-1).softmax(-1)
        return ((s.unsqueeze(-1) * k).sum(1) + q).tanh(),
    region = SymbolicRegion(f, False, (TensorProxy(shape=(2, 8), name="q"), TensorProxy(shape=(2, s0, 8), name="k")))
    full = torch.randn(2, 40, 8)
    region.prepare([full[:, 3], full[:, 5:10]])
    assert region._direct is not None, region.fallbacks
    region.defer_to(lambda job: None)
    calls = _counting(region._direct)
    for n in (2, 5, 9, 33):         # q and k: slices of a longer tensor, their strides its
        q, k = full[:, n], full[:, :n]
        torch.testing.assert_close(region(q, k), f(q, k))
    for n in (3, 7):
        q, k = torch.randn(40, 2, 8)[n], torch.randn(2, 40, 8)[:, 4:4 + n]
        torch.testing.assert_close(region(q, k), f(q, k))
    assert calls[0] == 6 and region.compilations == 1
    q, k = full[:, 0].double(), full[:, :6].double()
    torch.testing.assert_close(region(q, k), f(q, k))
    assert calls[0] == 6


def test_a_compiled_region_called_while_another_thread_runs_make_fx_runs_its_torch_calls(monkeypatch):
    """The tier worker's ``make_fx`` (a boxed region compiling) sets FX's
    process-wide tracing flag; dynamo refuses a compiled call under it. A
    region on dynamo's path (one that writes) called meanwhile on another
    thread runs its torch calls; one compiled without dynamo runs its code."""
    import torch.fx._symbolic_trace as fx_trace
    for writing in (True, False):
        region = _region_over_rows(_sin2, writing)
        region.prepare([torch.empty(5, 4)])
        assert (region._direct is None) == writing
        for deferred in (False, True):
            if deferred:
                region.defer_to(lambda job: None)
            monkeypatch.setattr(fx_trace, "_is_fx_tracing_flag", True)
            x = torch.randn(7, 4)
            torch.testing.assert_close(region(x), _sin2(x))
            monkeypatch.setattr(fx_trace, "_is_fx_tracing_flag", False)


def test_a_users_compiled_function_runs_while_the_worker_traces(monkeypatch):
    """While thunderlite traces on one thread (FX's tracing flag is process-wide),
    a ``torch.compile``d function called on another thread runs its own code
    instead of raising dynamo's "symbolically trace a dynamo-optimized
    function" error; before and after the window, dynamo's own setting holds."""
    import torch.fx._symbolic_trace as fx_trace

    from thunderlite.executors.fx_beside import compiling_beside_others
    compiled = torch.compile(lambda t: t.sin() + 1, backend="eager")
    x = torch.randn(5)
    tracing, called = threading.Event(), threading.Event()

    def worker():
        with compiling_beside_others():
            monkeypatch.setattr(fx_trace, "_is_fx_tracing_flag", True)     # as its make_fx does
            tracing.set()
            called.wait(60)
            monkeypatch.setattr(fx_trace, "_is_fx_tracing_flag", False)

    t = threading.Thread(target=worker)
    t.start()
    assert tracing.wait(60)
    try:
        torch.testing.assert_close(compiled(x), x.sin() + 1)
    finally:
        called.set()
        t.join()
    monkeypatch.setattr(fx_trace, "_is_fx_tracing_flag", True)
    with pytest.raises(RuntimeError, match="symbolically trace a dynamo-optimized function"):
        compiled(x)         # outside the window: dynamo's setting again


def test_thunderfx_calls_during_the_tier_up_return_eager_answers():
    """``torch.compile(m, backend=ThunderCompiler(...))``: the graph's entry tiers up on
    the worker while the caller keeps calling the compiled module, whose
    dynamo wrapper used to raise under the worker's FX tracing flag (every
    call while a region compiled)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64))
                              for _ in range(4)])
    from thunderlite.dynamo import ThunderCompiler
    backend = ThunderCompiler(tiering=_policy(3))
    cm = torch.compile(m, backend=backend)
    x = torch.randn(16, 64)
    expected = m(x)
    seen_busy = False
    for _ in range(20000):
        torch.testing.assert_close(cm(x), expected)
        busy = tiers._WORKER is not None and tiers._WORKER.busy
        seen_busy |= busy
        if seen_busy and not busy:
            break
    assert seen_busy, "no call ran while the worker compiled"


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_hf_generate_reaches_the_hot_tier_with_eager_tokens(cache):
    """HF ``generate()`` on a tiny Llama, batch 2 with left padding: the decode
    step's entry (a ``DynamicCache``'s length is a size symbol; a
    ``StaticCache`` writes with ``index_copy_``) tiers up, and the tokens of
    every later generate equal eager's. The slice ``generate`` passes as
    ``input_ids`` and the masks' layouts change with the length: the regions'
    compiled code must serve them all."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=128)
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).eval()
    prompt = torch.randint(1, cfg.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0
    kw = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    expected = m.generate(prompt, **kw)
    jm = thunderlite.jit(m, tiering=_policy(4))
    assert torch.equal(jm.generate(prompt, **kw), expected)
    assert thunderlite.wait_for_tiers(jm)
    decode = max(thunderlite.cache_info(jm)["tiers"], key=lambda t: t["calls"])
    assert decode["tier"] == "hot", decode
    for _ in range(2):
        assert torch.equal(jm.generate(prompt, **kw), expected)
    if cache == "dynamic":      # the last call was a decode step: one graph of each region served every length
        regions = _symbolic_regions(jm)
        assert regions and all(r.compilations == 1 for r in regions)
