"""Many threads calling one jitted function or module: first calls racing,
shape and dtype changes, recompiles, cached calls. Every result equals
eager's; compiling is per call, so nothing one thread traces leaks into
another's trace (issue 33, part 5)."""
from __future__ import annotations

import itertools
import threading
import traceback
import warnings

import pytest
import torch

import thunderlite
from thunderlite.core.tracectx import current_trace, made_once, tracectx
from thunderlite.extend import CUDAGraphs

THREADS = 8
_names = itertools.count()


def race(work, threads: int = THREADS) -> None:
    """Run ``work(i)`` in ``threads`` threads released at once; fail with every error raised."""
    errors: list[str] = []
    start = threading.Barrier(threads)

    def run(i):
        try:
            start.wait()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")     # recompile warnings are expected here
                work(i)
        except BaseException:       # noqa: BLE001 - every failure of every thread is reported
            errors.append(traceback.format_exc())
    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, f"{len(errors)} thread(s) failed; first:\n{errors[0]}"


def _program(a, b, s):
    x = torch.nn.functional.gelu(a @ b.transpose(-1, -2)) * s
    return x.softmax(-1).sum(-1), torch.cumsum(a, 0)


_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _inputs(i: int, r: int):
    g = torch.Generator().manual_seed(100 * i + r)
    n, k = 3 + (i + r) % 5, 4 + i % 3
    dt = _DTYPES[(i + r) % len(_DTYPES)]
    return torch.randn(n, k, generator=g).to(dt), torch.randn(n, k, generator=g).to(dt), 0.5 * (i % 3)


@pytest.mark.parametrize("cache,dynamic", [("constant values", None), ("constant values", False),
                                           ("constant values", True), ("symbolic values", None)])
def test_first_calls_shape_dtype_changes_and_recompiles_race(cache, dynamic):
    jf = thunderlite.jit(_program, cache=cache, dynamic=dynamic)

    def work(i):
        for r in range(4):          # new shapes and dtypes: recompiles in every thread
            args = _inputs(i, r)
            torch.testing.assert_close(jf(*args), _program(*args))
        args = _inputs(i, 0)
        for _ in range(3):          # cached calls racing other threads' compiles
            torch.testing.assert_close(jf(*args), _program(*args))
    race(work)
    info = thunderlite.cache_info(jf)
    assert info["misses"] >= 1 and info["hits"] >= 1


def test_the_garbage_collector_is_on_again_after_compiles_overlapped():
    import gc
    assert gc.isenabled()
    fns = [thunderlite.jit(lambda a, k=k: (a * k).cos().sum()) for k in range(THREADS)]

    def work(i):
        for r in range(3):
            a = torch.randn(3 + r, 2)
            torch.testing.assert_close(fns[i](a), (a * i).cos().sum())
    race(work)
    assert gc.isenabled()


def test_identical_first_calls_compile_once_or_twice_and_agree():
    jf = thunderlite.jit(lambda a: (a.sin() * 2).sum(0))
    a = torch.randn(6, 5)
    outs: list = [None] * THREADS

    def work(i):
        outs[i] = jf(a)
    race(work)
    for o in outs:
        torch.testing.assert_close(o, (a.sin() * 2).sum(0))
    assert 1 <= thunderlite.cache_info(jf)["misses"] <= 2


def test_module_from_threads_with_changing_batch_sizes():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                            torch.nn.Linear(16, 3)).eval()
    jm = thunderlite.jit(m)

    def work(i):
        with torch.no_grad():
            for r in range(4):
                x = torch.randn(1 + (3 * i + r) % 7, 6)
                torch.testing.assert_close(jm(x), m(x))
    race(work)


def test_gradients_from_threads():
    def loss(a, w):
        return (a @ w).tanh().sum()
    jl = thunderlite.jit(loss)

    def work(i):
        for r in range(3):
            a = torch.randn(2 + (i + r) % 4, 5)
            w = torch.randn(5, 3, requires_grad=True)
            got = torch.autograd.grad(jl(a, w), w)[0]
            torch.testing.assert_close(got, torch.autograd.grad(loss(a, w), w)[0])
    race(work)


def test_writes_into_inputs_from_threads():
    def f(a, b):
        a.add_(b)
        return a * 2
    jf = thunderlite.jit(f)

    def work(i):
        for r in range(3):
            a, b = torch.randn(3 + (i + r) % 4), torch.randn(3 + (i + r) % 4)
            a_eager, a_jit = a.clone(), a.clone()
            torch.testing.assert_close(jf(a_jit, b), f(a_eager, b))
            torch.testing.assert_close(a_jit, a_eager)
    race(work)


def test_ops_met_for_the_first_time_by_threads_at_once_get_one_symbol():
    # symbols made on an op's first use (a custom op, an autograd.Function) are made once,
    # under tables_lock: two with one printed name would break the generated code
    n = next(_names)

    @torch.library.custom_op(f"tl_threads::twice_{n}", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x * x * g

    def f(x):
        return twice(Cube.apply(x)) + torch.special.bessel_j0(x)
    jf = thunderlite.jit(f)

    def work(i):
        x = torch.randn(2 + i)
        torch.testing.assert_close(jf(x), f(x))
    race(work)


def test_cuda_graph_runner_keeps_each_threads_buffers():
    # the runner's CPU stand-in has static buffers as a captured graph does: per thread
    def f(a, b):
        return (a * b + 1).relu().sum(-1) * 2
    jf = thunderlite.jit(f, transforms=[CUDAGraphs(devices=("cpu",))])
    jf(torch.randn(64, 256), torch.randn(64, 256))      # compiled here: the threads race replays only

    def work(i):
        for _ in range(20):
            a, b = torch.randn(64, 256), torch.randn(64, 256)
            torch.testing.assert_close(jf(a, b), f(a, b))
    race(work)
    runner = next(b.sym.impl for b in thunderlite.last_traces(jf)[-1].bound_symbols if b.sym.module == "cudagraphs")
    assert runner.replays > 0


def test_trace_context_is_per_thread():
    seen = []
    ready, done = threading.Event(), threading.Event()

    def other():
        ready.wait()
        seen.append(current_trace())
        done.set()
    t = threading.Thread(target=other)
    t.start()
    marker = object()
    with tracectx(marker):
        ready.set()
        done.wait()
        assert current_trace() is marker
    t.join()
    assert seen == [None]


def test_made_once_gives_every_racing_thread_the_first_value():
    table: dict = {}
    made: list = []
    got: list = [None] * THREADS

    def make():
        made.append(object())
        return made[-1]

    def work(i):
        got[i] = made_once(table, "k", make)
    race(work)
    assert len(made) == 1 and all(g is made[0] for g in got)


def test_a_symbolic_dims_key_never_equals_a_static_key():
    # found by the gradients race: a thread waiting for the miss lock met the entry compiled for
    # exactly (2, 5) among the alternates of the symbolic key of a (5, 5) call, and ran it
    from thunderlite.frontend.caching.keys import ALL_DIMS, dynamic_shape
    assert dynamic_shape(torch.Size([5, 5]), {0}) != torch.Size([2, 5])
    assert dynamic_shape(torch.Size([2, 5]), ALL_DIMS) != torch.Size([2, 2])
    assert dynamic_shape(torch.Size([1, 7]), {0, 1}) == dynamic_shape(torch.Size([1, 9]), {0, 1})
    assert dynamic_shape(torch.Size([1, 7]), {0, 1}) != dynamic_shape(torch.Size([2, 7]), {0, 1})
