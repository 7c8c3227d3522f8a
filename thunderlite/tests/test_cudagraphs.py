"""CUDA graphs (executors/cudagraphs/): the plan on CPU traces (which regions,
what stays out and why), the rewritten traces run through the runner's CPU
stand-in (static input and output buffers as a replay uses them) against
eager, and real capture and replay on CUDA (``test_on_gpu_*``, skipped
without a GPU)."""
import pytest
import torch

import thunderlite
from thunderlite.executors.cudagraphs import plan as cg_plan
from thunderlite.executors.cudagraphs.runtime import GraphRunner
from thunderlite.extend import CUDAGraphs

CPU = dict(devices=("cpu",))
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def _graphs(trace):
    return [b for b in trace.bound_symbols if b.sym.module == "cudagraphs"]


def _left_out(trace):
    return {b.sym.name: b.header for b in trace.bound_symbols if (b.header or "").startswith(cg_plan.NOT_CAPTURED)}


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def test_training_step_forward_and_backward_become_graphs_and_match_eager():
    model = _mlp()
    ref = _mlp()
    jm = thunderlite.jit(model, transforms=[CUDAGraphs(**CPU)])
    for _ in range(3):
        x = torch.randn(5, 8)
        jm(x).square().mean().backward()
        ref(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    fwd, bwd = thunderlite.last_traces(jm)[-1], thunderlite.last_backward_traces(jm)[-1]
    assert len(_graphs(fwd)) == 1 and len(_graphs(bwd)) == 1
    assert "unpack_saved" in _left_out(bwd)       # a Python object, not a tensor
    runner = _graphs(fwd)[0].sym.impl
    assert isinstance(runner, GraphRunner) and runner.replays == 2


def test_saved_and_returned_outputs_outlive_the_next_replay():
    """Two forwards before their backwards (gradient accumulation): the first
    call's saved tensors and output must not be the static buffers the second
    replay overwrites."""
    model, ref = _mlp(), _mlp()
    jm = thunderlite.jit(model, transforms=[CUDAGraphs(**CPU)])
    xs = [torch.randn(5, 8) for _ in range(3)]
    jm(xs[0]).sum().backward()       # compiles and captures
    outs = [jm(x) for x in xs[1:]]
    refs = [ref(x) for x in xs[1:]]
    ref(xs[0]).sum().backward()
    torch.testing.assert_close(outs[0], refs[0])
    for o, r in zip(outs, refs, strict=True):
        (o * 3).sum().backward()
        (r * 3).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_item_stays_out_with_its_reason_and_splits_the_graphs():
    def f(x):
        y = x.sin().exp()
        n = y.sum().item()
        return (y * 2 + 1) * n

    jf = thunderlite.jit(f, transforms=[CUDAGraphs(**CPU)])
    x = torch.randn(4, 4)
    torch.testing.assert_close(jf(x), f(x))
    x2 = torch.randn(4, 4)
    torch.testing.assert_close(jf(x2), f(x2))
    t = thunderlite.last_traces(jf)[-1]
    assert len(_graphs(t)) == 2
    assert cg_plan.SYNC in _left_out(t)["item"]


def test_data_dependent_shape_stays_out():
    def f(x):
        y = x.cos().abs()
        return y.nonzero().float().sum() + y.sum()

    x = torch.randn(6, 3)
    t = thunderlite.last_traces(_run(f, x))[-1]
    assert any(cg_plan.SYNC in h for h in _left_out(t).values())


def _run(f, *args, **jit_kwargs):
    jf = thunderlite.jit(f, transforms=[CUDAGraphs(**CPU)], **jit_kwargs)
    torch.testing.assert_close(jf(*args), f(*args))
    return jf


def test_random_with_a_user_generator_stays_out_default_generator_is_captured():
    g = torch.Generator().manual_seed(1)

    def user_gen(x):
        return x.sin().cos() + torch.rand(x.shape, generator=g)

    def default_gen(x):
        return (x.sin().cos() + torch.rand(x.shape)).exp()

    jf = thunderlite.jit(user_gen, transforms=[CUDAGraphs(**CPU)])
    jf(torch.randn(3))
    t = thunderlite.last_traces(jf)[-1]
    assert any(cg_plan.GENERATOR in h for h in _left_out(t).values())
    jd = thunderlite.jit(default_gen, transforms=[CUDAGraphs(**CPU)])
    x = torch.randn(3)
    torch.manual_seed(3)
    out = jd(x)
    torch.manual_seed(3)
    torch.testing.assert_close(out, default_gen(x))
    t = thunderlite.last_traces(jd)[-1]
    assert len(_graphs(t)) == 1 and not _left_out(t)


def test_a_write_into_an_input_stays_out_and_the_input_is_written():
    def f(x, y):
        a = y.sin() * 2
        x.add_(a)
        return (x * a).cos()

    x, y = torch.randn(4), torch.randn(4)
    xe = x.clone()
    jf = thunderlite.jit(f, transforms=[CUDAGraphs(**CPU)])
    out = jf(x, y)
    torch.testing.assert_close(out, f(xe, y))
    torch.testing.assert_close(x, xe)
    t = thunderlite.last_traces(jf)[-1]
    assert any(cg_plan.WRITES_OUTSIDE in h for h in _left_out(t).values())


def test_a_returned_view_of_an_input_is_the_input_not_a_static_buffer():
    def f(x):
        v = x.t()
        return v, (v.sin() * 2).cos()

    x = torch.randn(3, 5)
    jf = thunderlite.jit(f, transforms=[CUDAGraphs(**CPU)])
    v, out = jf(x)
    assert v.data_ptr() == x.data_ptr()
    torch.testing.assert_close(out, f(x)[1])
    assert len(_graphs(thunderlite.last_traces(jf)[-1])) == 1


def test_a_new_shape_gets_its_own_buffers_under_dynamic_shapes():
    def f(x):
        return (x.sin() * 2).cos().sum(0)

    jf = thunderlite.jit(f, transforms=[CUDAGraphs(**CPU)], dynamic=True)
    for n in (3, 5, 3):
        x = torch.randn(n, 4)
        torch.testing.assert_close(jf(x), f(x))
    runner = _graphs(thunderlite.last_traces(jf)[-1])[0].sym.impl
    assert len(runner._graphs) == 2 and runner.replays == 1


@pytest.mark.usefixtures("one_rank_group")
def test_collectives_stay_out():
    import torch.distributed as dist

    def f(a):
        x = (a.exp() * 2).sin()
        dist.all_reduce(x)
        return (x + 1).cos() * 3

    a = torch.randn(4)
    jf = thunderlite.jit(f, transforms=[CUDAGraphs(**CPU)])
    torch.testing.assert_close(jf(a.clone()), f(a.clone()))     # one rank: all_reduce is the identity
    left = _left_out(thunderlite.last_traces(jf)[-1])
    assert any(n.startswith("all_reduce") or n == "wait" for n in left), left
    assert all(cg_plan.EFFECT in h or cg_plan.HOST_VALUE in h or cg_plan.WRITES_OUTSIDE in h for h in left.values())


def test_cpu_work_stays_out_by_default_and_examine_says_why():
    report = thunderlite.examine(_mlp(), torch.randn(2, 8), cudagraphs=True)
    text = str(report)
    assert report.ok and "forward: 0 graph regions" in text and "cpu tensor" in text


def test_small_regions_are_not_captured():
    def f(x):
        return x.sin()

    jf = thunderlite.jit(f, transforms=[CUDAGraphs(**CPU)])
    jf(torch.randn(3))
    assert not _graphs(thunderlite.last_traces(jf)[-1])
    jf1 = thunderlite.jit(f, transforms=[CUDAGraphs(min_kernels=1, **CPU)])
    torch.testing.assert_close(jf1(torch.ones(3)), torch.ones(3).sin())
    assert len(_graphs(thunderlite.last_traces(jf1)[-1])) == 1


def test_combines_with_the_torchcompile_executor():
    model, ref = _mlp(), _mlp()
    jm = thunderlite.jit(model, executors=["torchcompile"], transforms=[CUDAGraphs(**CPU)])
    x = torch.randn(5, 8)
    for _ in range(2):
        jm(x).sum().backward()
        ref(x).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    assert _graphs(thunderlite.last_traces(jm)[-1])


# --- real capture and replay ------------------------------------------------------------------------

@needs_cuda
def test_on_gpu_training_steps_replay_graphs_and_match_eager():
    torch.manual_seed(0)
    model = _mlp().cuda()
    ref = _mlp().cuda()
    jm = thunderlite.jit(model, cudagraphs=True)
    for _ in range(4):
        x = torch.randn(5, 8, device="cuda")
        jm(x).square().mean().backward()
        ref(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    for t in (thunderlite.last_traces(jm)[-1], thunderlite.last_backward_traces(jm)[-1]):
        runners = [b.sym.impl for b in _graphs(t)]
        assert runners and all(r.captures == 1 and r.replays == 3 and not r.fallbacks for r in runners)


@needs_cuda
def test_on_gpu_new_shape_captures_again_and_item_stays_out():
    def f(x):
        y = (x.sin() * 2).cos()
        return y * y.sum().item()

    jf = thunderlite.jit(f, cudagraphs=True, dynamic=True)
    for n in (3, 7, 3, 7):
        x = torch.randn(n, 4, device="cuda")
        torch.testing.assert_close(jf(x), f(x))
    t = thunderlite.last_traces(jf)[-1]
    assert "item" in _left_out(t)
    runner = _graphs(t)[0].sym.impl
    assert runner.captures == 2 and runner.replays == 2, runner.fallbacks
