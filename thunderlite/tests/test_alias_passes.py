"""Pass-level properties of update_aliases, dce, the region former and
del_last_used on hand-built traces (docs/architecture.md §5), each checked against eager
PyTorch by running the trace before and after with the torch executor."""
from __future__ import annotations

import torch

from thunderlite.core import prims
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.core.verify import verify_trace
from thunderlite.executors.registry import resolve_executors
from thunderlite.executors.run import compile_trace
from thunderlite.tests.test_fuzz_inplace import ToyFusion
from thunderlite.transforms.aliasing.update_aliases import AliasGroups, update_aliases
from thunderlite.transforms.claim import claim_executors
from thunderlite.transforms.dce import dce
from thunderlite.transforms.del_last_used import del_last_used, is_del
from thunderlite.transforms.fusion import dependencies, fuse, fusion_regions, reorder


def _trace(build, *shapes, names="abcd"):
    trc = Trace()
    with tracectx(trc):
        args = [TensorProxy(s, name=n) for s, n in zip(shapes, names, strict=False)]   # names: a longer pool
        trc.args = args
        trc.set_return(build(*args))
    return trc


def _barriers(trc):
    return [b for b in trc.bound_symbols if b.has_tag(Tag.ALIAS_BARRIER)]


def _run(trc, inputs):
    return compile_trace(trc, ["torch"])[1](*inputs)


def _assert_same_as_recorded(before, after, make_inputs):
    """Running ``after`` gives what running ``before`` (= eager) gives, inputs included."""
    ref_in, got_in = make_inputs(), make_inputs()
    ref, got = _run(before, ref_in), _run(after, got_in)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(got_in, ref_in)


def _inputs(*shapes):
    def make():
        g = torch.Generator().manual_seed(0)
        return [torch.randn(s, generator=g) for s in shapes]
    return make


# --- update_aliases ---------------------------------------------------------------------------

def test_no_inplace_no_barrier():
    trc = _trace(lambda a, b: prims.sin(prims.add(prims.permute(a, (1, 0)), b)), (3, 3), (3, 3))
    assert update_aliases(trc) is trc
    assert update_aliases(trc, [["a", "b"]]) is trc


def test_write_through_view_renames_base_and_views_read_later():
    def build(a, x):
        v = prims.slice_prim(a, (0, 0), (1, 4))
        w = prims.permute(a, (1, 0))
        before = prims.sin(a)
        prims.copy_(prims.reshape(x, (1, 4)), v)
        return before, prims.sin(a), prims.cos(w)
    trc = _trace(build, (4, 4), (4,))
    out = update_aliases(trc)
    verify_trace(out)
    (barrier,) = _barriers(out)
    assert {p.name for p in barrier.args[0]} == {"a", _name(out, "permute")}
    reads = [b for b in out.bound_symbols if b.sym in (prims.sin, prims.cos)]
    assert reads[0].args[0].name == "a"                        # before the write: the old name
    assert {r.args[0].name for r in reads[1:]} == {p.name for p in barrier.output}
    _assert_same_as_recorded(trc, out, _inputs((4, 4), (4,)))


def _name(trc, symname):
    return next(b.output.name for b in trc.bound_symbols if b.sym.name == symname)


def test_tensor_outside_mutated_group_never_renamed():
    def build(a, b):
        s = prims.sin(b)
        prims.copy_(prims.cos(b), a)
        return prims.add(a, s), prims.mul(b, s)
    trc = _trace(build, (3,), (3,))
    out = update_aliases(trc)
    (barrier,) = _barriers(out)
    assert [p.name for p in barrier.args[0]] == ["a"]
    renamed = {p.name for p in barrier.args[0]}
    for bsym in out.bound_symbols:
        if bsym is not barrier and bsym.sym is prims.mul:
            assert [p.name for p in bsym.proxy_args()] == ["b", bsym.args[1].name]
    assert "b" not in renamed


def test_idempotent():
    def build(a, b):
        v = prims.slice_prim(a, (1,), (3,))
        prims.copy_(prims.sin(v), v)
        prims.copy_(prims.cos(a), a)
        return prims.add(v, prims.slice_prim(b, (0,), (2,))), a
    trc = _trace(build, (4,), (4,))
    once = update_aliases(trc, [["a", "b"]])
    twice = update_aliases(once, [["a", "b"]])
    assert twice is once
    assert str(dce(once, [["a", "b"]])) == str(update_aliases(dce(once, [["a", "b"]]), [["a", "b"]]))
    assert len(_barriers(once)) == 2


def test_input_alias_groups_order_reads_of_the_other_argument():
    def build(a, b):
        prims.copy_(prims.full((4,), 3.0, device="cpu", dtype=torch.float32), a)
        return prims.sin(b)
    trc = _trace(build, (4,), (4,))
    assert not _barriers(update_aliases(trc))               # not aliased: b flows past
    out = update_aliases(trc, [["a", "b"]])
    (barrier,) = _barriers(out)
    assert [p.name for p in barrier.args[0]] == ["b"]
    base = torch.randn(4)
    (got,) = [_run(out, [base, base])]
    torch.testing.assert_close(got, torch.full((4,), 3.0).sin())


def _running_stat_op():
    """A composite with a write hidden in its decomposition (batch_norm's running
    mean update), and no torch_fn: the claim transform must decompose it."""
    def decomp(x, running):
        mean = prims.mul(x, 0.5)
        prims.copy_(prims.add(prims.mul(running, 0.9), prims.mul(mean, 0.1)), running)
        return prims.neg(x)
    return Symbol("toy_norm", decomposition=decomp, module="ltorch")


def test_hidden_write_in_composite_and_rerun_after_decomposition():
    norm = _running_stat_op()

    def build(x, r):
        y = norm(x, r)
        return y, prims.sin(r)
    trc = _trace(build, (3,), (3,))
    out = update_aliases(trc)
    (barrier,) = _barriers(out)                               # found through the subsymbols
    assert [p.name for p in barrier.args[0]] == ["b"]     # r: the second argument
    claimed = claim_executors(out, resolve_executors(["torch"]))
    assert not any(b.sym.name == "toy_norm" for b in claimed.bound_symbols)
    again = update_aliases(claimed)
    assert again is claimed                                   # the decomposed write is already ordered
    verify_trace(again)
    _assert_same_as_recorded(trc, again, _inputs((3,), (3,)))


def test_decomposition_exposing_a_write_gets_its_barrier_on_rerun():
    """A trace whose barrier pass ran before a rewrite exposed the write (here:
    a composite added afterwards, decomposed by claiming) gets it on re-run."""
    norm = _running_stat_op()
    trc = _trace(lambda x, r: (norm(x, r), prims.sin(r)), (3,), (3,))
    claimed = claim_executors(trc, resolve_executors(["torch"]))
    assert not _barriers(claimed)
    out = update_aliases(claimed)
    (barrier,) = _barriers(out)
    assert [p.name for p in barrier.args[0]] == ["b"]
    _assert_same_as_recorded(trc, out, _inputs((3,), (3,)))


def test_alias_groups_view_chain():
    def build(a, b):
        v = prims.permute(prims.slice_prim(a, (0, 0), (2, 2)), (1, 0))
        return prims.add(v, prims.slice_prim(b, (0, 0), (2, 2)))
    trc = _trace(build, (3, 3), (3, 3))
    g = AliasGroups.of_trace(trc)
    v = _name(trc, "permute")
    assert g.same("a", v) and not g.same("b", v)
    assert AliasGroups.of_trace(trc, [["a", "b"]]).same("b", v)


# --- dce ------------------------------------------------------------------------------------------

def test_dce_drops_write_into_dead_intermediate():
    def build(a, b):
        t = prims.exp(a)
        prims.copy_(b, t)                         # t is never read again
        return prims.sin(a)
    trc = update_aliases(_trace(build, (3,), (3,)))
    out = dce(trc)
    assert [b.sym.name for b in out.bound_symbols] == ["sin", "return"]
    _assert_same_as_recorded(trc, out, _inputs((3,), (3,)))


def test_dce_keeps_writes_the_caller_can_see():
    def build(a, b):
        prims.copy_(prims.sin(prims.slice_prim(b, (1,), (3,))), prims.slice_prim(a, (0,), (2,)))  # input, via a view
        t = prims.exp(b)
        prims.copy_(prims.cos(b), t)                                  # returned intermediate
        u = prims.exp(b)
        prims.copy_(prims.neg(b), u)                                  # read later
        return t, prims.add(u, 1.0)
    trc = update_aliases(_trace(build, (3,), (3,)))
    out = dce(trc)
    assert sum(b.sym is prims.copy_ for b in out.bound_symbols) == 3
    assert out is trc
    _assert_same_as_recorded(trc, out, _inputs((3,), (3,)))


def test_dce_keeps_random_and_dont_dce():
    def build(a):
        prims.uniform((3,), 0.0, 1.0, device="cpu", dtype=torch.float32)
        return prims.sin(a)
    trc = _trace(build, (3,))
    assert dce(trc) is trc


# --- region former -------------------------------------------------------------------------------

_ELEMENTWISE = {prims.sin, prims.cos, prims.add, prims.mul, prims.neg, prims.exp}


def _mixed_program(a, b):
    s = prims.sin(a)
    m = prims.matmul(b, b)                     # not fusible, independent of s
    c = prims.cos(s)
    prims.copy_(prims.neg(b), b)
    return prims.add(c, prims.exp(a)), m, prims.mul(b, 2.0)


def test_reorder_groups_fusible_and_keeps_return_last():
    trc = update_aliases(_trace(_mixed_program, (3, 3), (3, 3)))
    def fusible(b):
        return b.sym in _ELEMENTWISE
    out = reorder(trc, fusible)
    verify_trace(out)
    assert out.bound_symbols[-1].has_tag(Tag.RETURN)
    assert len(fusion_regions(out, fusible)) < len(fusion_regions(trc, fusible))
    names = [b.sym.name for b in out.bound_symbols]
    assert names.index("matmul") < names.index("copy_")        # the read of old b stays before the write
    _assert_same_as_recorded(trc, out, _inputs((3, 3), (3, 3)))


def test_regions_are_acyclic_and_fused_program_matches_eager():
    trc = update_aliases(_trace(_mixed_program, (3, 3), (3, 3)))
    def fusible(b):
        return b.sym in _ELEMENTWISE or b.sym is prims.copy_
    out = fuse(trc, fusible, ToyFusion())
    verify_trace(out)
    assert any(b.has_tag(Tag.FUSION) for b in out.bound_symbols)
    assert out.bound_symbols[-1].has_tag(Tag.RETURN)
    preds = dependencies(out.with_bound_symbols("check", out.bound_symbols[:-1]))
    assert all(j < i for i, ps in enumerate(preds) for j in ps)   # the fused order is topological
    _assert_same_as_recorded(trc, out, _inputs((3, 3), (3, 3)))


def test_random_ops_keep_their_order():
    def build(a):
        u = prims.uniform((3,), 0.0, 1.0, device="cpu", dtype=torch.float32)
        n = prims.normal((3,), 0.0, 1.0, device="cpu", dtype=torch.float32)
        return prims.add(prims.sin(n), u), prims.cos(a)
    trc = _trace(build, (3,))
    out = reorder(trc, lambda b: b.sym in _ELEMENTWISE)
    names = [b.sym.name for b in out.bound_symbols]
    assert names.index("uniform") < names.index("normal")
    torch.manual_seed(3)
    ref = _run(trc, [torch.ones(3)])
    torch.manual_seed(3)
    torch.testing.assert_close(_run(out, [torch.ones(3)]), ref)


# --- del_last_used -----------------------------------------------------------------------------

def test_del_last_used_never_deletes_before_last_use():
    trc = update_aliases(_trace(_mixed_program, (3, 3), (3, 3)))
    out = del_last_used(trc)
    verify_trace(out)
    deleted: set[str] = set()
    returned = {p.name for p in out.bound_symbols[-1].proxy_args()}
    for bsym in out.bound_symbols:
        if is_del(bsym):
            deleted.update(p.name for p in bsym.args)
            continue
        assert not deleted & {p.name for p in bsym.proxy_args()}
    assert not deleted & returned
    assert del_last_used(out) is out
    _assert_same_as_recorded(trc, out, _inputs((3, 3), (3, 3)))


def test_del_last_used_frees_unread_outputs_right_away():
    def build(a):
        vals, idx = prims.topk(a, 2, 0, True, True)
        return prims.sin(vals)
    trc = _trace(build, (5,))
    out = del_last_used(trc)
    i = next(i for i, b in enumerate(out.bound_symbols) if b.sym is prims.topk)
    nxt = out.bound_symbols[i + 1]
    assert is_del(nxt) and [p.name for p in nxt.args] == [p.name for p in out.bound_symbols[i].proxy_outs()[1:]] + ["a"]
    assert isinstance(nxt.args[0], Proxy)


def test_one_barrier_per_written_group():
    """batch_norm-like: one op writes two separate buffers; each gets its own
    barrier, and a later write into one never renames readers of the other."""
    def decomp(x, mean, var):
        prims.copy_(prims.add(mean, x), mean)
        prims.copy_(prims.mul(var, x), var)
        return prims.neg(x)
    stats = Symbol("toy_stats", decomposition=decomp, module="ltorch")

    def build(x, mean, var):
        y = stats(x, mean, var)
        prims.copy_(prims.sin(mean), mean)
        return y, prims.add(mean, var)
    trc = _trace(build, (3,), (3,), (3,))
    out = update_aliases(trc)
    first, second, third = _barriers(out)
    assert [p.name for p in first.args[0]] == ["b"] and [p.name for p in second.args[0]] == ["c"]
    assert [p.name for p in third.args[0]] == [first.output[0].name]      # only mean's group
    assert update_aliases(out) is out
    _assert_same_as_recorded(trc, out, _inputs((3,), (3,), (3,)))
