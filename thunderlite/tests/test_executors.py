"""The Executor API, the registry, the torch executor and the execution transform."""
import pytest
import torch

import thunderlite
from thunderlite.core import prims
from thunderlite.core.aliasing import prim_aliases
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.core.verify import verify_trace
from thunderlite.executors import (
    Executor,
    FusionExecutor,
    OperatorExecutor,
    compile_trace,
    default_executors,
    executor_status,
    get_executor,
    register_executor,
    resolve_executors,
    run_trace,
    skipped_executors,
    torch_executor,
    torch_path,
    torchcompile_executor,
)
from thunderlite.transforms.claim import ClaimError, claim_executors

# Hand-made torch-language symbols: composites with a torch_fn, as thunderlite/torch makes them.
MUL = Symbol("mul_t", decomposition=lambda a, b: prims.mul(a, b), torch_fn=torch.mul)
ADD1 = Symbol("add1_t", decomposition=lambda a: prims.add(a, 1.0))          # no torch_fn: decomposes
SUM = Symbol("sum_t", decomposition=lambda a: prims.sum(a, tuple(range(a.ndim))), torch_fn=torch.sum)
SIN = Symbol("sin_t", decomposition=lambda a: prims.sin(a), torch_fn=torch.sin)
OPAQUE = Symbol("cummax_t", meta=lambda a, dim: (a.replace(), a.replace(dtype=torch.int64)),
                tags={Tag.OPAQUE}, torch_fn=torch.cummax)
LEAF_NO_IMPL = Symbol("mystery", meta=lambda a: a.replace())


def _trace(body, *shapes, source=("user.py", 12, "    return (a * b + 1).sin().sum()")):
    trc = Trace()
    with tracectx(trc):
        args = [TensorProxy(s, name=trc.claim_name(n)) for n, s in zip("abcd", shapes, strict=False)]  # a name pool
        trc.args = args
        trc.source = source
        trc.set_return(body(*args))
    return trc


def _example(a, b):
    return SUM(SIN(ADD1(MUL(a, b))))


def test_final_trace_calls_torch_directly():
    claimed, fn = compile_trace(_trace(_example, (2, 3), (2, 3)))
    verify_trace(claimed)
    src = str(claimed)
    assert "# Constructed by claim_executors" in src
    for line in ("t0 = torch.mul(a, b)", "t1 = torch.add(t0, 1.0)", "t2 = torch.sin(t1)", "t3 = torch.sum(t2)"):
        assert line in src, src
    assert "# user.py:12: return (a * b + 1).sin().sum()" in src
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(fn(a, b), (a * b + 1).sin().sum())
    # torch's own functions are bound: no wrapper frame between the trace and torch
    assert claimed.bound_symbols[0].sym.impl is torch.mul


def test_printed_trace_round_trips_through_exec():
    claimed, fn = compile_trace(_trace(_example, (4,), (4,)))
    globs = {"torch": torch}
    exec(compile(str(claimed), "<round trip>", "exec"), globs)
    a, b = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(globs["computation"](a, b), fn(a, b))


def test_unclaimed_composite_is_decomposed_and_keeps_its_source():
    claimed, _ = compile_trace(_trace(lambda a: ADD1(a), (3,)))
    (bsym, ret) = claimed.bound_symbols
    assert bsym.sym.module == "torch" and bsym.sym.name == "add"
    assert bsym.source == ("user.py", 12, "    return (a * b + 1).sin().sum()")
    assert Tag.RETURN in ret.sym.tags


def test_opaque_symbol_runs_as_its_torch_callable():
    claimed, fn = compile_trace(_trace(lambda a: OPAQUE(a, 0), (5,)))
    assert "torch.cummax(a, 0)" in str(claimed)
    a = torch.randn(5)
    values, indices = fn(a)
    want = torch.cummax(a, 0)
    torch.testing.assert_close(values, want.values)
    torch.testing.assert_close(indices, want.indices)


def test_unclaimable_leaf_names_symbol_and_user_line():
    with pytest.raises(ClaimError, match=r"ltorch\.mystery \(from user\.py:12: return"):
        compile_trace(_trace(lambda a: LEAF_NO_IMPL(a), (3,)))


def test_torch_executor_implements_every_prim():
    claimable = set(torch_executor.implemented_symbols())
    assert [name for name, p in prims.all_prims().items() if p not in claimable] == []


def test_user_operator_executor_claims_ahead_of_torch():
    calls = []

    def my_sin(a):
        calls.append(a.shape)
        return torch.sin(a)

    myex = OperatorExecutor("myex_sin")
    myex.register_implementation(prims.sin, my_sin)
    myex.register_implementation("prims.cos", torch.cos, checker=lambda a: a.ndim == 1)
    trc = _trace(lambda a, b: prims.add(prims.sin(a), prims.cos(b)), (3,), (3,))
    claimed, fn = compile_trace(trc, executors=[myex])
    src = str(claimed)
    assert "myex_sin.sin(a)" in src and "torch.cos(b)" in src and "torch.add" in src
    assert claimed.bound_symbols[0].sym.executor is myex
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(fn(a, b), a.sin() + b.cos())
    assert calls == [torch.Size([3])]


def test_checker_can_decline_and_the_next_executor_runs_it():
    myex = OperatorExecutor("myex_picky")
    myex.register_implementation(prims.cos, torch.cos, checker=lambda a: a.ndim == 2)
    claimed, _ = compile_trace(_trace(lambda a: prims.cos(a), (3,)), executors=[myex])
    assert claimed.bound_symbols[0].sym.executor is torch_executor


def test_explicit_registration_overrides_the_generic_torch_fn_mapping():
    myex = OperatorExecutor("myex_mul")
    myex.register_implementation(MUL, lambda a, b: a * b)
    claimed, fn = compile_trace(_trace(lambda a, b: MUL(a, b), (2,), (2,)), executors=[myex])
    assert "myex_mul.mul_t(a, b)" in str(claimed)
    torch.testing.assert_close(fn(torch.ones(2), torch.full((2,), 3.0)), torch.full((2,), 3.0))


def test_registrations_validate():
    myex = OperatorExecutor("myex_validate")
    myex.register_implementation(prims.exp, torch.exp)
    with pytest.raises(ValueError, match="already has an implementation of prims.exp"):
        myex.register_implementation(prims.exp, torch.exp)
    with pytest.raises(ValueError, match="unknown symbol id"):
        myex.register_implementation("prims.no_such_prim", torch.exp)
    with pytest.raises(ValueError, match="unknown symbol id"):
        myex.register_implementation("ltorch.no_such_op", torch.exp)
    softmax = myex.register_implementation("ltorch.softmax", torch.softmax)
    assert (softmax.module, softmax.name, softmax.executor) == ("torch", "softmax", myex)
    with pytest.raises(ValueError, match="not the implementation"):
        myex.register_implementation(prims.log, torch.exp, print_as="torch.log")
    with pytest.raises(ValueError, match="must be a Python identifier"):
        OperatorExecutor("my-ex")
    register_executor(OperatorExecutor("myex_once"))
    with pytest.raises(ValueError, match="already registered"):
        register_executor(OperatorExecutor("myex_once"))
    with pytest.raises(KeyError, match="unknown executor 'nope'"):
        get_executor("nope")


def test_same_printed_name_for_different_callables_gets_a_suffix():
    myex = OperatorExecutor("myex_names")
    s1 = myex.executor_symbol(prims.sin, lambda a: a.sin())
    s2 = myex.executor_symbol(prims.sin, lambda a: a.sin())
    assert (s1.module, s1.name, s2.name) == ("myex_names", "sin", "sin_1")


class _Unavailable(OperatorExecutor):
    def check_availability(self):
        return False, "needs a GPU with frobnication support"


class _Crashing(OperatorExecutor):
    def check_availability(self):
        raise ImportError("no module named frob")


def test_unavailable_executor_is_skipped_with_its_reason():
    unavailable = register_executor(_Unavailable("unavailable_ex"))
    crashing = register_executor(_Crashing("crashing_ex"))
    unavailable.register_implementation(prims.sin, torch.sin)
    assert resolve_executors(["unavailable_ex", crashing, "torch"]) == [torch_executor]
    reasons = skipped_executors(["unavailable_ex", "crashing_ex"])
    assert reasons["unavailable_ex"] == "needs a GPU with frobnication support"
    assert "ImportError: no module named frob" in reasons["crashing_ex"]
    assert executor_status()["unavailable_ex"][0] is False
    claimed, _ = compile_trace(_trace(lambda a: prims.sin(a), (3,)), executors=["unavailable_ex"])
    assert claimed.bound_symbols[0].sym.executor is torch_executor


def test_default_list_ends_with_torch():
    ex = default_executors()
    assert ex[-1] is torch_executor and get_executor("torch") is torch_executor
    assert resolve_executors([torch_executor, OperatorExecutor("myex_last")])[-1] is torch_executor


def test_torch_path_finds_public_names():
    assert torch_path(torch.add) == "torch.add"
    assert torch_path(torch.nn.functional.linear) == "torch.nn.functional.linear"
    assert torch_path(torch.Tensor.add_) == "torch.Tensor.add_"
    assert torch_path(lambda x: x) is None


class _DoubleSinFusion(FusionExecutor):
    """A toy fusion executor: fuses runs of prims.sin into one callable."""

    def fusion_pass(self, trace, input_alias_groups=None):
        out, changed = [], False
        for bsym in trace.bound_symbols:
            if bsym.sym is prims.sin and out and out[-1].sym.executor is self:
                prev = out.pop()
                inner = prev.sym.impl
                fused = self.fusion_symbol("fused_sin", lambda x, f=inner: torch.sin(f(x)))
                out.append(fused.bind(*prev.args, output=bsym.output))
                changed = True
            elif bsym.sym is prims.sin:
                out.append(self.fusion_symbol("sin1", torch.sin).bind(*bsym.args, output=bsym.output))
            else:
                out.append(bsym)
        return trace.with_bound_symbols("toy fusion", out) if changed else trace


def test_fusion_executor_sees_the_trace_first():
    fex = _DoubleSinFusion("toyfuse")
    trc = _trace(lambda a: prims.cos(prims.sin(prims.sin(a))), (3,))
    claimed, fn = compile_trace(trc, executors=[fex])
    verify_trace(claimed)
    names = [b.sym.id for b in claimed.bound_symbols[:-1]]
    assert names == ["toyfuse.fused_sin", "torch.cos"]
    a = torch.randn(3)
    torch.testing.assert_close(fn(a), a.sin().sin().cos())


def test_claim_is_a_pass_that_leaves_its_input_alone_and_is_idempotent():
    trc = _trace(_example, (2,), (2,))
    before = str(trc)
    claimed = claim_executors(trc, [torch_executor])
    assert str(trc) == before and claimed is not trc
    again = claim_executors(claimed, [torch_executor])
    assert [b.sym for b in again.bound_symbols] == [b.sym for b in claimed.bound_symbols]


def test_symbols_with_their_own_impl_are_kept():
    barrier = Symbol("identity_barrier", meta=lambda a: a.replace(), impl=lambda a: a, module="prims")
    claimed, fn = compile_trace(_trace(lambda a: prims.neg(barrier(a)), (2,)))
    assert claimed.bound_symbols[0].sym is barrier
    torch.testing.assert_close(fn(torch.ones(2)), -torch.ones(2))


def test_run_trace_is_the_entry_point_for_hand_built_traces():
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(run_trace(_trace(_example, (3,), (3,)), [a, b]), (a * b + 1).sin().sum())


def test_executor_symbols_keep_the_tags_passes_need():
    exsym = torch_executor.claim(prims.copy_.bind(None, None, output=None)).sym
    assert Tag.INPLACE in exsym.tags and Tag.PRIM not in exsym.tags
    uniform = torch_executor.claim(prims.uniform.bind((2,), 0.0, 1.0, output=None)).sym
    assert {Tag.RANDOM, Tag.DONT_DCE} <= uniform.tags


def test_view_prims_run_as_views_and_say_so():
    for name in ("reshape", "permute", "broadcast_in_dim", "slice_prim", "squeeze"):
        exsym = torch_executor.claim(getattr(prims, name).bind(None, output=None)).sym
        assert prim_aliases(exsym).positions == {0}, name       # the prim's ATen schema, shared by meta
    assert prim_aliases(torch_executor.claim(prims.sin.bind(None, output=None)).sym).positions == set()
    trc = _trace(lambda a: prims.slice_prim(prims.permute(a, (1, 0)), (0, 1), (3, 2), (2, 1)), (2, 3))
    a = torch.randn(2, 3)
    out = run_trace(trc, [a])
    assert out.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    torch.testing.assert_close(out, a.t()[0:3:2, 1:2])


def test_base_executor_claims_nothing():
    ex = Executor("plain_ex")
    assert ex.is_available() == (True, "")
    assert not ex.can_run(prims.sin.bind(None, output=None))


def test_torchcompile_executor_fuses_a_region_and_matches_eager():
    ok, reason = torchcompile_executor.is_available()
    if not ok:
        pytest.skip(f"torch.compile executor unavailable: {reason}")
    trc = _trace(lambda a, b: SUM(prims.cos(SIN(ADD1(MUL(a, b))))), (8,), (8,))
    claimed, fn = compile_trace(trc, executors=["torchcompile"])
    verify_trace(claimed)
    fusions = [b for b in claimed.bound_symbols if Tag.FUSION in b.sym.tags]
    assert len(fusions) == 1 and fusions[0].sym.executor is torchcompile_executor
    assert "torchcompile.fusion" in str(claimed)
    region = fusions[0].sym.impl.__thunderlite_trace__
    assert "torch.mul(a, b)" in str(region) and "torch.add(" in str(region)
    a, b = torch.randn(8), torch.randn(8)
    torch.testing.assert_close(fn(a, b), (a * b + 1).sin().cos().sum())


def test_torchcompile_leaves_random_symbols_to_torch_and_fuses_writes():
    """Random draws stay torch calls (Inductor draws differently); a write
    joins the region computing what it writes (Inductor applies writes into
    its inputs as eager does: a static KV cache's ``index_copy_`` inside a
    decode step's one region)."""
    trc = _trace(lambda a: prims.copy_(prims.mul(prims.uniform((3,), 0.0, 1.0, device="cpu", dtype=torch.float32),
                                                 prims.sin(a)), a), (3,))
    fused = torchcompile_executor.fusion_pass(trc)
    top = [b.sym for b in fused.bound_symbols]
    assert prims.uniform in top and prims.copy_ not in top and prims.mul not in top and prims.sin not in top
    (region,) = [b for b in fused.bound_symbols if Tag.FUSION in b.sym.tags]
    assert [b.sym for b in region.subsymbols] == [prims.sin, prims.mul, prims.copy_]


def _block(x, w, b):
    y = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)) * 2 + 1
    x.add_(1)
    return y.softmax(-1), torch.rand(3)


def test_jit_with_torchcompile_matches_eager_outputs_mutations_and_random_draws():
    ok, reason = torchcompile_executor.is_available()
    if not ok:
        pytest.skip(f"torch.compile executor unavailable: {reason}")
    x, w, b = torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)
    jfn = thunderlite.jit(_block, executors=["torchcompile"])
    x1, x2 = x.clone(), x.clone()
    torch.manual_seed(0)
    got = jfn(x1, w, b)
    torch.manual_seed(0)
    want = _block(x2, w, b)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x1, x2)
    final = thunderlite.last_traces(jfn)[-1]
    claimed_by = {b.sym.executor.name for b in final.bound_symbols if b.sym.executor is not None}
    assert claimed_by == {"torch", "torchcompile"}


def test_torchcompile_add_with_alpha_after_a_matmul_matches_eager():
    """Inductor (torch 2.13, CPU) compiles ``add(mm(a, b), w, alpha=c)`` as
    ``mm + w``: the region spells ``alpha`` out (``w * c``); SGD's weight decay
    in a whole step (``grad.add(p, alpha=wd)``) was wrong before."""
    ok, reason = torchcompile_executor.is_available()
    if not ok:
        pytest.skip(f"torch.compile executor unavailable: {reason}")

    def fn(a, b, w):
        return torch.add(a @ b, w, alpha=0.01), torch.add(w, a @ b, alpha=-2.0)
    a, b, w = torch.randn(5, 6), torch.randn(6, 4), torch.randn(5, 4)
    torch.testing.assert_close(thunderlite.jit(fn, executors=["torchcompile", "torch"])(a, b, w), fn(a, b, w))
