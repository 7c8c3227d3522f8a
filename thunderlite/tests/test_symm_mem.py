"""The symmetric-memory executor (docs/architecture.md §15).

On CPU the CUDA-only calls go through ``FakeSymmMem``, a backend given to a
test's own ``SymmMemExecutor`` (nothing in torch is patched): buffers are plain
tensors it records, rendezvous is recorded, and the one-shot all-reduce is the
gloo all-reduce of a one-rank group. The tests check the planned trace (which
arguments live in symmetric buffers, where the copies are, the alias barriers)
and run it against eager. ``test_on_gpu_*`` use the real backend and skip with
the reason when it is unavailable; they need no change to run on a GPU.
"""
from __future__ import annotations

import datetime
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import thunderlite
from thunderlite.executors.registry import executor_status, get_executor
from thunderlite.extend import SymmMemBackend, SymmMemExecutor, declare_symm_mem_args, symm_mem_args
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion

GROUP = "tl_symm_test_group"
_seen: list[int] = []          # data_ptrs the test ops were called with

_lib = torch.library.Library("tlsymm", "FRAGMENT")
_lib.define("scale(Tensor input, float s, str group_name) -> Tensor")
_lib.define("bump_(Tensor(a!) input, str group_name) -> Tensor(a!)")
_lib.define("plain(Tensor input, str group_name) -> Tensor")


def _scale(input, s, group_name):
    _seen.append(input.data_ptr())
    return input * s


def _bump(input, group_name):
    _seen.append(input.data_ptr())
    return input.add_(1)


_lib.impl("scale", _scale, "CompositeExplicitAutograd")
_lib.impl("bump_", _bump, "CompositeExplicitAutograd")
_lib.impl("plain", lambda input, group_name: input * 3, "CompositeExplicitAutograd")
_lib._register_fake("scale", lambda input, s, group_name: torch.empty_like(input))
_lib._register_fake("bump_", lambda input, group_name: input)
_lib._register_fake("plain", lambda input, group_name: torch.empty_like(input))
if hasattr(_lib, "register_symm_mem_args"):              # torch's registry (PyTorch #173513)
    _lib.register_symm_mem_args("scale", ["input"])
    _lib.register_symm_mem_args("bump_", ["input"])
else:                                                    # older torch: thunderlite's own declarations
    declare_symm_mem_args("tlsymm::scale", ["input"])
    declare_symm_mem_args("tlsymm::bump_", ["input"])

scale = torch.ops.tlsymm.scale
bump_ = torch.ops.tlsymm.bump_
plain = torch.ops.tlsymm.plain


class FakeSymmMem(SymmMemBackend):
    def __init__(self, groups=(GROUP,)):
        self.groups = set(groups)
        self.allocated: list[torch.Tensor] = []
        self.rendezvous_calls: list[tuple[tuple, str]] = []

    def availability(self):
        return True, ""

    def group_enabled(self, group, device):
        return group in self.groups

    def empty(self, shape, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        self.allocated.append(t)
        return t

    def rendezvous(self, tensor, group):
        self.rendezvous_calls.append((tuple(tensor.shape), group))
        return ("handle", group)

    def one_shot_all_reduce(self, tensor, reduce_op, group):
        c10d = torch.ops._c10d_functional
        return c10d.wait_tensor(c10d.all_reduce(tensor, reduce_op, group))

    def ptrs(self) -> set[int]:
        return {t.data_ptr() for t in self.allocated}


def _fake_executor(name="symm_fake", **kw) -> tuple[SymmMemExecutor, FakeSymmMem]:
    backend = FakeSymmMem(**kw)
    return SymmMemExecutor(name, backend=backend), backend


def _run_in_buffer(jf, fn, backend, *args):
    """Run ``jf``: the declared op must receive a buffer of ``backend``; results equal eager's."""
    _seen.clear()
    got = jf(*args)
    assert _seen and _seen[-1] in backend.ptrs(), "the op did not get a symmetric buffer"
    torch.testing.assert_close(got, fn(*args))
    return got


def _final(jfn):
    return thunderlite.last_traces(jfn)[-1]


def _lines(trace) -> list[str]:
    return [ln.strip() for ln in str(trace).splitlines() if ln.strip() and not ln.strip().startswith(("#", "del("))]


def _bsyms_named(trace, text):
    return [b for b in trace.bound_symbols if text in b.sym.id]


def test_declarations_are_read_from_torch_and_thunderlite():
    assert symm_mem_args(scale.default) == ("input",)
    assert symm_mem_args(plain.default) == ()
    assert symm_mem_args(torch.ops.symm_mem.two_shot_all_reduce_.default) == ("input",)   # thunderlite's own
    declare_symm_mem_args("tlsymm::plain", ["input"])
    try:
        assert symm_mem_args(plain.default) == ("input",)
    finally:
        from thunderlite.executors.symm_mem import plan
        del plan._own["tlsymm::plain"]


def test_unavailable_without_cuda_with_reason():
    ok, reason = executor_status()["symm_mem"]
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert not ok and "CUDA" in reason
    assert get_executor("symm_mem").is_available() == (False, reason)
    jf = thunderlite.jit(lambda a: a + 1, executors=["symm_mem"])
    jf(torch.randn(2))
    report = str(thunderlite.examine(lambda a: a + 1, torch.randn(2), executors=["symm_mem"]))
    assert f"executor 'symm_mem' skipped: {reason}" in report


def test_declared_argument_is_produced_into_a_symmetric_buffer():
    ex, backend = _fake_executor()

    def f(a, b):
        x = torch.mul(a, b)
        return scale(x, 2.0, GROUP) + 1
    a, b = torch.randn(8), torch.randn(8)
    jf = thunderlite.jit(f, executors=[ex])
    _run_in_buffer(jf, f, backend, a, b)
    trace = _final(jf)
    (call,) = _bsyms_named(trace, "tlsymm_scale")
    assert call.args[0].memory == f"symm_mem:{GROUP}"
    (into,) = _bsyms_named(trace, "mul_into")                 # the producer writes into the buffer
    assert into.output.name == call.args[0].name
    assert not any(b.sym.name == "copy_" for b in trace.bound_symbols), "no copy: the producer writes there"
    lines = _lines(trace)
    assert any("symm_fake.buffer((8,), torch.float32" in ln for ln in lines), lines
    # cached: a second call allocates and rendezvouses nothing new
    n = len(backend.allocated)
    torch.testing.assert_close(jf(a, b), f(a, b))
    assert len(backend.allocated) == n == 1 and backend.rendezvous_calls == [((8,), GROUP)]


def test_program_input_is_copied_into_the_buffer():
    ex, backend = _fake_executor()

    def f(a):
        return scale(a, 3.0, GROUP)
    a = torch.randn(4, 3)
    jf = thunderlite.jit(f, executors=[ex])
    _run_in_buffer(jf, f, backend, a)
    trace = _final(jf)
    (call,) = _bsyms_named(trace, "tlsymm_scale")
    copies = [b for b in trace.bound_symbols if b.sym.name == "copy_"]
    assert len(copies) == 1 and copies[0].args[0].name == trace.args[0].name
    assert copies[0].output.name == call.args[0].name and call.args[0].memory == f"symm_mem:{GROUP}"


def test_undeclared_op_and_op_without_group_untouched():
    ex, backend = _fake_executor()

    def f(a):
        return plain(a, GROUP) * 2
    jf = thunderlite.jit(f, executors=[ex])
    a = torch.randn(3)
    torch.testing.assert_close(jf(a), f(a))
    assert not backend.allocated and "buffer" not in str(_final(jf))


def test_views_copied_and_groups_kept_apart():
    ex, backend = _fake_executor(groups=(GROUP, "other"))

    def f(a, b):
        x = torch.mul(a, b)
        u = scale(x, 2.0, GROUP)                 # x produced into a GROUP buffer
        v = scale(x, 3.0, "other")               # the same value for another group: copied
        w = scale(a[1:], 4.0, GROUP)             # a view of an input: copied
        return u, v, w
    a, b = torch.randn(5), torch.randn(5)
    jf = thunderlite.jit(f, executors=[ex])
    torch.testing.assert_close(jf(a, b), f(a, b))
    trace = _final(jf)
    calls = _bsyms_named(trace, "tlsymm_scale")
    assert [c.args[0].memory for c in calls] == [f"symm_mem:{GROUP}", "symm_mem:other", f"symm_mem:{GROUP}"]
    copies = [b for b in trace.bound_symbols if b.sym.name == "copy_"]
    assert [c.output.name for c in copies] == [calls[1].args[0].name, calls[2].args[0].name]
    assert sorted(g for _, g in backend.rendezvous_calls) == sorted([GROUP, "other", GROUP])


def _mutating_program(a, b):
    x = a * 2                       # producer
    y = x + b                       # a reader before the write
    r = bump_(x, GROUP)             # mutates x in place, returns it
    z = x * 10                      # readers after the write see the new value
    return y, r + 1, z


def _check_mutating_order(trace):
    lines = _lines(trace)
    (call,) = _bsyms_named(trace, "tlsymm_bump_")
    i_call = next(i for i, ln in enumerate(lines) if "tlsymm_bump_" in ln)
    x = call.args[0]
    assert x.memory == f"symm_mem:{GROUP}"
    i_prod = next(i for i, ln in enumerate(lines) if ln.startswith(f"{x.name} =") or f"{x.name} = " in ln.split("#")[0]
                  and "buffer" not in ln)
    assert i_prod < i_call, "the mutating op runs before its producer"
    return lines, i_call


def test_mutating_op_ordered_after_producers_and_before_readers():
    ex, backend = _fake_executor()
    a, b = torch.randn(6), torch.randn(6)
    jf = thunderlite.jit(_mutating_program, executors=[ex])
    got = _run_in_buffer(jf, _mutating_program, backend, a, b)
    trace = _final(jf)
    _check_mutating_order(trace)
    barriers = [b for b in trace.bound_symbols if b.sym.name == "update_aliases"]
    assert barriers, "the write is not followed by an alias barrier"
    # returned values never alias a cached buffer: the next call must not change them
    y, r, z = got
    saved = [t.clone() for t in got]
    jf(torch.randn(6), torch.randn(6))
    torch.testing.assert_close([y, r, z], saved)


def test_mutating_op_on_an_input_writes_back():
    ex, backend = _fake_executor()

    def f(a):
        r = bump_(a, GROUP)
        return a * 2, r
    a = torch.randn(5)
    ref = a.clone()
    jf = thunderlite.jit(f, executors=[ex])
    got = jf(a)
    exp = f(ref)
    torch.testing.assert_close(got, exp)
    torch.testing.assert_close(a, ref)               # the caller's tensor was written as in eager
    trace = _final(jf)
    copies = [b for b in trace.bound_symbols if b.sym.name == "copy_"]
    assert [c.args[1].name for c in copies][-1] == trace.args[0].name, "no write back into the input"


def _write_back_program(a, b):
    y = a + b                       # reads the input before the write
    r = bump_(a, GROUP)             # the input itself is declared: copied in, written back
    return y, a * b, r + 1


def _escaping_program(a, b):
    x = a * b                       # produced into the buffer
    r = bump_(x, GROUP)
    return r[1:], x.view(2, 3), x   # views of the buffer and the buffer itself leave the trace


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("program", [_mutating_program, _write_back_program, _escaping_program],
                         ids=lambda p: p.__name__)
def test_mutating_op_under_reordering_executor(seed, program):
    ex, backend = _fake_executor(f"symm_fake{seed}")
    a, b = torch.randn(6), torch.randn(6)
    ra, rb = a.clone(), b.clone()
    jf = thunderlite.jit(program, executors=[ex, ShuffleFusion(seed)])
    got = jf(a, b)
    torch.testing.assert_close(got, program(ra, rb))
    torch.testing.assert_close((a, b), (ra, rb))
    saved = [t.clone() for t in got]
    jf(torch.randn(6), torch.randn(6))                 # reuses the cached buffers
    torch.testing.assert_close(list(got), saved)       # returned tensors are not the buffers
    trace = _final(jf)
    # every reader of the written group comes after the write or reads through the barrier
    (call,) = _bsyms_named(trace, "tlsymm_bump_")
    idx = trace.bound_symbols.index(call)
    x = call.args[0].name
    later_readers = [b for b in trace.bound_symbols[idx + 1:] if any(getattr(p, "name", None) == x
                                                                     for p in b.flat_args())]
    for b in later_readers:     # only the barrier, the op's own write-backs and del may name x afterwards
        assert b.sym.name in ("update_aliases", "copy_", "del", "python_del", "return") or "into" in b.sym.name, b


@pytest.mark.usefixtures("one_rank_group")
def test_small_all_reduce_lowered_to_one_shot():
    name = dist.group.WORLD.group_name
    ex, backend = _fake_executor(groups=(name,))
    ex.one_shot_max_bytes = 64

    def f(a, big):
        x = a.exp()
        dist.all_reduce(x)                   # 16 bytes: one-shot
        dist.all_reduce(big)                 # 400 bytes: stays a c10d all-reduce
        return x + 1, big * 2
    a, big = torch.randn(4), torch.randn(100)
    jf = thunderlite.jit(f, executors=[ex])
    b1, b2 = big.clone(), big.clone()
    torch.testing.assert_close(jf(a, b1), f(a.clone(), b2))
    torch.testing.assert_close(b1, b2)
    trace = _final(jf)
    (one,) = _bsyms_named(trace, "one_shot_all_reduce")
    assert one.args[0].memory == f"symm_mem:{name}"
    assert len(_bsyms_named(trace, "dist.all_reduce")) == 1
    assert any("exp_into" in b.sym.name for b in trace.bound_symbols), "exp did not write the buffer"
    assert backend.rendezvous_calls == [((4,), name)]


# --- real symmetric memory (run unchanged on a GPU) ---------------------------------------------

_real_ok, _real_reason = get_executor("symm_mem").is_available()


@pytest.mark.skipif(not _real_ok, reason=f"symm_mem executor unavailable: {_real_reason}")
def test_on_gpu_one_shot_and_declared_args_real_backend():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("nccl", init_method=f"file://{os.path.join(d, 'store')}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", 0))
        try:
            def f(a):
                x = a * 2
                dist.all_reduce(x)
                y = torch.ops.symm_mem.two_shot_all_reduce_(x * 3, "sum", dist.group.WORLD.group_name)
                return x + 1, y
            a = torch.randn(256, device="cuda")
            jf = thunderlite.jit(f, executors=["symm_mem"])
            # one rank: every all-reduce is the identity (eager cannot call two_shot on ordinary memory)
            torch.testing.assert_close(jf(a), (a * 2 + 1, a * 2 * 3))
            trace = _final(jf)
            assert _bsyms_named(trace, "one_shot_all_reduce")
            (two,) = _bsyms_named(trace, "two_shot_all_reduce_")
            assert two.args[0].memory is not None
            n = len(get_executor("symm_mem").buffers)
            torch.testing.assert_close(jf(a), (a * 2 + 1, a * 2 * 3))
            assert len(get_executor("symm_mem").buffers) == n, "buffers are not reused across calls"
        finally:
            get_executor("symm_mem").clear_buffers()      # they belong to the group destroyed below
            dist.destroy_process_group()


@pytest.fixture
def one_rank_two_shot():
    """A CPU kernel for ``symm_mem::two_shot_all_reduce_`` as it is on a one-rank
    group (the sum of one rank: the input itself), registered for this test only."""
    lib = torch.library.Library("symm_mem", "IMPL")
    lib.impl("two_shot_all_reduce_", lambda input, reduce_op, group_name: _seen.append(input.data_ptr()) or input,
             "CPU")
    try:
        yield
    finally:
        lib._destroy()


def test_pytorch_mutating_symm_mem_op_planned_and_ordered(one_rank_two_shot):
    """``two_shot_all_reduce_(Tensor(a!) input, ...) -> Tensor(a!)``: a write to
    the torch language, its input declared by thunderlite, readers after it."""
    ex, backend = _fake_executor()

    def f(a):
        x = a + 1
        y = x * 3                                      # read before the write
        r = torch.ops.symm_mem.two_shot_all_reduce_(x, "sum", GROUP)
        return y, x * 2, r
    a = torch.randn(4)
    jf = thunderlite.jit(f, executors=[ex])
    got = _run_in_buffer(jf, f, backend, a)
    trace = _final(jf)
    (call,) = _bsyms_named(trace, "two_shot_all_reduce_")
    assert call.args[0].memory == f"symm_mem:{GROUP}"
    i = trace.bound_symbols.index(call)
    assert any(b.sym.name == "update_aliases" for b in trace.bound_symbols[i + 1:])
    saved = [t.clone() for t in got]
    jf(torch.randn(4))
    torch.testing.assert_close(list(got), saved)       # returned values are not the cached buffer
