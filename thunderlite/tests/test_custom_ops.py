"""Custom ops from ``torch.library`` (docs/architecture.md §5): recorded from their schema
with no registration, shapes from their fake/Meta kernel, writes and aliases
as the schema says; checked against eager PyTorch."""
from __future__ import annotations

import warnings

import pytest
import torch

from thunderlite.core import prims
from thunderlite.core.aliasing import views
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.core.verify import verify_trace
from thunderlite.executors.run import compile_trace
from thunderlite.tests.fuzz_inplace_ops import check_against_eager, mix_
from thunderlite.tests.test_fuzz_inplace import ToyFusion
from thunderlite.torch.custom_ops import custom_op_callable, is_custom_op
from thunderlite.transforms.aliasing.update_aliases import update_aliases
from thunderlite.transforms.dce import dce
from thunderlite.transforms.del_last_used import del_last_used, is_del
from thunderlite.transforms.fusion import fuse


@torch.library.custom_op("tl_aliasing::scale_", mutates_args={"x"})
def scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


@torch.library.custom_op("tl_aliasing::split_update", mutates_args={"x"})
def split_update(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x.add_(y)
    return y * 2, y + 1


@split_update.register_fake
def _(x, y):
    return torch.empty_like(y), torch.empty_like(y)


@torch.library.custom_op("tl_aliasing::pure", mutates_args=())
def pure(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + 1


@pure.register_fake
def _(x):
    return torch.empty_like(x)


_lib = torch.library.Library("tl_aliasing_def", "DEF")
_lib.define("inc_(Tensor(a!) x, float step=1.0) -> Tensor(a!)")
_lib.define("rows(Tensor x, int n) -> Tensor")


def _inc(x, step=1.0):
    return x.add_(step)


_lib.impl("inc_", _inc, "CompositeExplicitAutograd")
_lib.impl("inc_", lambda x, step=1.0: x, "Meta")
_lib.impl("rows", lambda x, n: x[:n].clone(), "CompositeExplicitAutograd")
_lib.impl("rows", lambda x, n: x.new_empty((n,) + tuple(x.shape[1:])), "Meta")

inc_ = torch.ops.tl_aliasing_def.inc_.default


def _record(build, *shapes):
    trc = Trace()
    with tracectx(trc):
        args = [TensorProxy(s, name=n) for s, n in zip(shapes, "xyz", strict=False)]   # names: a longer pool
        trc.args = args
        trc.set_return(build(*args))
    return trc


def _run(trc, inputs):
    return compile_trace(trc, ["torch"])[1](*inputs)


def _check(build, eager, *shapes, passes=lambda t: del_last_used(dce(update_aliases(t)))):
    trc = _record(build, *shapes)
    final = passes(trc)
    verify_trace(final)
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(s, generator=g) for s in shapes]
    ref_in = [t.clone() for t in inputs]
    expected = eager(*ref_in)
    got = _run(final, inputs)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(inputs, ref_in)
    return trc, final


def test_recognises_every_spelling():
    for fn in (scale_, torch.ops.tl_aliasing.scale_, torch.ops.tl_aliasing.scale_.default, inc_):
        assert is_custom_op(fn)
        assert custom_op_callable(fn) is not None
    assert custom_op_callable(scale_) is custom_op_callable(torch.ops.tl_aliasing.scale_.default)
    assert custom_op_callable(torch.sin) is None


def test_mutating_op_returning_nothing_orders_later_reads():
    op = custom_op_callable(scale_)

    def build(x):
        before = prims.sin(x)
        assert op(x, 3.0) is None                     # what the program sees: the op's own result
        return before, prims.cos(x)

    def eager(x):
        before = x.sin()
        scale_(x, 3.0)
        return before, x.cos()
    trc, final = _check(build, eager, (4,))
    (bsym,) = [b for b in trc.bound_symbols if b.sym.module == "custom"]
    assert bsym.has_tag(Tag.INPLACE) and bsym.has_tag(Tag.DONT_DCE)
    assert any(b.has_tag(Tag.ALIAS_BARRIER) for b in update_aliases(trc).bound_symbols)


def test_mutating_op_is_never_dropped_even_if_unobserved():
    op = custom_op_callable(scale_)

    def build(x):
        t = prims.exp(x)
        op(t, 2.0)                                    # writes an intermediate nobody reads
        return prims.sin(x)
    trc = update_aliases(_record(build, (3,)))
    assert any(b.sym.module == "custom" for b in dce(trc).bound_symbols)


def test_mutate_and_return_alias_with_default_argument():
    op = custom_op_callable(inc_)

    def build(x):
        y = op(x)                                     # Tensor(a!) -> Tensor(a!): y aliases x
        z = op(y, step=2.0)
        return prims.mul(z, 2.0), prims.sin(x)

    def eager(x):
        y = inc_(x)
        z = inc_(y, step=2.0)
        return z * 2.0, x.sin()
    trc, final = _check(build, eager, (5,))
    assert "custom.tl_aliasing_def_inc__default(x, 1.0)" in str(trc)


def test_several_fresh_outputs_freed_as_soon_as_unpacked():
    op = custom_op_callable(split_update)

    def build(x, y):
        a, b = op(x, y)
        return prims.add(a, x)

    def eager(x, y):
        a, b = split_update(x, y)
        return a + x
    trc, final = _check(build, eager, (3,), (3,))
    bsyms = final.bound_symbols
    i = next(i for i, b in enumerate(bsyms) if b.sym.module == "custom")
    (written,), (a, b) = bsyms[i].output
    nxt = bsyms[i + 1]
    assert is_del(nxt)
    assert {b.name, "y"} <= {p.name for p in nxt.args}       # freed on the next line
    assert a.name not in {p.name for p in nxt.args}
    barrier, nxt = bsyms[i + 2], bsyms[i + 3]
    assert barrier.has_tag(Tag.ALIAS_BARRIER) and [p.name for p in barrier.args[1]] == [written.name]
    assert is_del(nxt) and written.name in {p.name for p in nxt.args}


def test_pure_op_is_functional_and_fusion_can_move_around_it():
    op = custom_op_callable(pure)
    rows = custom_op_callable(torch.ops.tl_aliasing_def.rows)

    def build(x):
        return prims.add(op(x), 1.0), rows(x, 2)

    def eager(x):
        return pure(x) + 1.0, torch.ops.tl_aliasing_def.rows(x, 2)
    trc, _ = _check(build, eager, (4, 3),
                    passes=lambda t: fuse(update_aliases(t), lambda b: b.sym is prims.add, ToyFusion()))
    assert update_aliases(trc) is trc                 # no write: no barrier
    assert not any(b.has_tag(Tag.INPLACE) for b in trc.bound_symbols)


def test_custom_op_write_survives_reordering_and_fusion():
    op = custom_op_callable(scale_)

    def build(x, y):
        s = prims.sin(y)
        old = prims.cos(x)
        op(x, 0.5)
        return prims.add(prims.mul(x, s), old)

    def eager(x, y):
        s = y.sin()
        old = x.cos()
        scale_(x, 0.5)
        return x * s + old
    fusible = {prims.sin, prims.cos, prims.add, prims.mul}
    _check(build, eager, (4,), (4,),
           passes=lambda t: del_last_used(fuse(dce(update_aliases(t)), lambda b: b.sym in fusible, ToyFusion())))


def test_op_without_fake_kernel_names_the_op():
    lib = torch.library.Library("tl_aliasing_nofake", "DEF")
    lib.define("f(Tensor x) -> Tensor")
    lib.impl("f", lambda x: x + 1, "CPU")
    op = custom_op_callable(torch.ops.tl_aliasing_nofake.f)
    with pytest.raises(NotImplementedError, match="tl_aliasing_nofake.f.default.*fake kernel"):
        _record(lambda x: op(x), (3,))


def test_view_returns_and_aten_overloads_follow_their_schema():
    lib = torch.library.Library("tl_aliasing_view", "DEF")
    lib.define("rows2(Tensor(a) x) -> Tensor(a)")
    lib.impl("rows2", lambda x: x.view(2, -1), "CompositeImplicitAutograd")
    rows2 = torch.ops.tl_aliasing_view.rows2.default
    view = custom_op_callable(rows2)
    add_ = custom_op_callable(torch.ops.aten.add_.Tensor)
    assert not is_custom_op(torch.ops.aten.add_.Tensor)       # aten goes through the torch language

    def build(x, y):
        v = view(x)
        add_(v, prims.reshape(y, (2, 3)))                    # writes x through the view
        return prims.sin(x)

    def eager(x, y):
        torch.ops.aten.add_.Tensor(rows2(x), y.reshape(2, 3))
        return x.sin()
    trc, _ = _check(build, eager, (6,), (6,))
    assert views(trc.bound_symbols[0])                        # the schema's view rule
    (barrier,) = [b for b in update_aliases(trc).bound_symbols if b.has_tag(Tag.ALIAS_BARRIER)]
    assert [p.name for p in barrier.args[0]] == ["x"]


def test_packet_with_several_overloads_is_left_to_the_opaque_fallback():
    assert custom_op_callable(torch.ops.aten.add) is None


def test_custom_ops_through_jit_without_registration():
    import thunderlite

    def fn(x, y):
        s = x.sin()
        scale_(x, 2.0)                                # (Tensor(a!) x) -> ()
        a, b = split_update(x, y)                     # writes x, two fresh outputs
        z = inc_(y)                                   # (Tensor(a!) x) -> Tensor(a!)
        return s, x.cos(), a, z * 2

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, generator=g), torch.randn(3, generator=g)
    rx, ry = x.clone(), y.clone()
    jfn = thunderlite.jit(fn)
    torch.testing.assert_close(jfn(x, y), fn(rx, ry))
    torch.testing.assert_close((x, y), (rx, ry))
    final = thunderlite.last_traces(jfn)[-1]
    bsyms = final.bound_symbols
    i = next(i for i, b in enumerate(bsyms) if b.sym.name == "tl_aliasing_split_update_default")
    (_,), (_, unused) = bsyms[i].output
    assert is_del(bsyms[i + 1]) and unused.name in {p.name for p in bsyms[i + 1].args}


# --- custom ops through jit with gradients (issue 9), compared with eager ------------------------

import thunderlite  # noqa: E402

F64 = torch.float64
EXECUTORS = [pytest.param(None, id="default"), pytest.param(["torchcompile", "torch"], id="torchcompile")]


@torch.library.custom_op("tl_autograd::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x.sin() * scale


@scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _sin_setup(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def _sin_backward(ctx, g):
    (x,) = ctx.saved_tensors
    if ctx.scale > 0:                                # data-independent Python in the user's backward
        return g * x.cos() * ctx.scale, None
    return g * 0, None


scaled_sin.register_autograd(_sin_backward, setup_context=_sin_setup)


@torch.library.custom_op("tl_autograd::no_formula", mutates_args=())
def no_formula(x: torch.Tensor) -> torch.Tensor:
    return x.exp()


@no_formula.register_fake
def _(x):
    return torch.empty_like(x)


_ag_lib = torch.library.Library("tl_autograd_def", "DEF")
_ag_lib.define("cube(Tensor x) -> Tensor")
_ag_lib.define("scale_all_(Tensor(a!)[] xs, float s) -> ()")
_ag_lib.define("add_maybe_(Tensor(a!) x, Tensor? y, Tensor(b!)? out) -> ()")
_ag_lib.define("scale_all_ret_(Tensor(a!)[] xs, float s) -> Tensor(a!)[]")
_ag_lib.impl("cube", lambda x: x * x * x, "CPU")
_ag_lib.impl("cube", lambda x: torch.empty_like(x), "Meta")
torch.library.register_autograd(
    "tl_autograd_def::cube", lambda ctx, g: g * 3 * ctx.saved_tensors[0] ** 2,
    setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]), lib=_ag_lib)


def _scale_all_(xs, s):
    for x in xs:
        x.mul_(s)


def _scale_all_ret_(xs, s):
    _scale_all_(xs, s)
    return list(xs)


def _add_maybe_(x, y, out):
    if y is not None:
        x.add_(y)
    if out is not None:
        out.copy_(x * 2)


_ag_lib.impl("scale_all_", _scale_all_, "CompositeExplicitAutograd")
_ag_lib.impl("scale_all_", lambda xs, s: None, "Meta")
_ag_lib.impl("scale_all_ret_", _scale_all_ret_, "CompositeExplicitAutograd")
_ag_lib.impl("scale_all_ret_", lambda xs, s: list(xs), "Meta")
_ag_lib.impl("add_maybe_", _add_maybe_, "CompositeExplicitAutograd")
_ag_lib.impl("add_maybe_", lambda x, y, out: None, "Meta")
cube = torch.ops.tl_autograd_def.cube.default
scale_all_ = torch.ops.tl_autograd_def.scale_all_.default
scale_all_ret_ = torch.ops.tl_autograd_def.scale_all_ret_.default
add_maybe_ = torch.ops.tl_autograd_def.add_maybe_.default


@pytest.mark.parametrize("executors", EXECUTORS)
def test_custom_op_with_registered_autograd_is_differentiable(executors):
    def fn(x, y):
        return scaled_sin(x * 2, 3.0) * y, cube(y.cos())
    jfn = check_against_eager(fn, [(4, 3), (4, 3)], executors)
    assert thunderlite.last_backward_traces(jfn)


def test_custom_op_without_formula_raises_eagers_error_at_backward():
    def fn(x):
        return no_formula(x * 2).sum()
    x = torch.randn(3, dtype=F64, requires_grad=True)
    with pytest.raises(RuntimeError, match="no autograd formula was registered") as eager:
        fn(x).backward()
    out = thunderlite.jit(fn)(x)
    assert out.requires_grad
    with pytest.raises(RuntimeError, match="no autograd formula was registered") as ours:
        out.backward()
    assert type(ours.value) is type(eager.value)


@pytest.mark.parametrize("executors", EXECUTORS)
def test_mutating_custom_op_on_a_gradient_path(executors):
    """Eager: the write is invisible to autograd (h keeps its history); the
    fresh output has no formula, so it is detached before the loss."""
    def fn(x, y):
        h = x * 2
        r = mix_(h, y.detach())
        return h.sin(), r.detach() * 2
    check_against_eager(fn, [(5,), (5,)], executors)


@pytest.mark.parametrize("executors", EXECUTORS)
def test_written_tensor_lists_and_optional_tensors(executors):
    def fn(a, b, c):
        h, k = a * 1, b * 1
        before = h.sum() + k.sum()
        scale_all_([h, k], 3.0)                       # Tensor(a!)[] xs -> ()
        out = torch.empty_like(c)
        add_maybe_(h, c, out)                         # Tensor? y given, Tensor(b!)? out given
        add_maybe_(k, None, None)                     # both optional tensors absent
        m, n = scale_all_ret_([h, k], 0.5)            # -> Tensor(a!)[]: returns the written list
        return before, h.exp(), k * 2, out, m + n
    check_against_eager(fn, [(3,), (3,), (3,)], executors, grad_mask=[True, True, False])


def test_written_tensor_lists_without_grad_write_the_callers_tensors():
    def fn(a, b):
        scale_all_([a, b], 2.0)
        return a + b
    x, y = torch.randn(3), torch.randn(3)
    rx, ry = x.clone(), y.clone()
    torch.testing.assert_close(thunderlite.jit(fn)(x, y), fn(rx, ry))
    torch.testing.assert_close((x, y), (rx, ry))


_ag_lib.define("second_rows(Tensor x, Tensor(a) y, int n) -> Tensor(a)")
_ag_lib.impl("second_rows", lambda x, y, n: y[:n], "CompositeExplicitAutograd")
_ag_lib.impl("second_rows", lambda x, y, n: y[:n], "Meta")
second_rows = torch.ops.tl_autograd_def.second_rows.default


@pytest.mark.parametrize("executors", EXECUTORS)
def test_return_viewing_an_argument_other_than_the_first(executors):
    """A write through the returned view lands in the second argument."""
    def fn(x, y):
        y = y * 1
        v = second_rows(x, y, 2)
        before = y.sum()
        v.mul_(x[:2])
        return before, y.cos(), v + 1
    x, y = torch.randn(4, 3, dtype=F64), torch.randn(4, 3, dtype=F64)
    jfn = thunderlite.jit(fn) if executors is None else thunderlite.jit(fn, executors=executors)
    torch.testing.assert_close(jfn(x, y), fn(x, y))


@pytest.mark.parametrize("executors", EXECUTORS)
def test_custom_op_writing_a_leaf_that_requires_grad(executors):
    """A ``custom_op`` runs below autograd: eager does not refuse its write into
    a leaf requiring grad (or a view of one), and the leaf keeps its history."""
    def fn(w, y):
        before = w * 2
        r = mix_(w, y).detach()         # no formula registered: not differentiable
        scale_(w[1:], 0.5)
        return before, r, w * 3
    ws = [torch.randn(4, dtype=F64, generator=torch.Generator().manual_seed(2)).requires_grad_() for _ in range(2)]
    y = torch.randn(4, dtype=F64)
    jfn = thunderlite.jit(fn) if executors is None else thunderlite.jit(fn, executors=executors)
    outs = []
    for f, w in zip((fn, jfn), ws, strict=True):
        got = f(w, y)
        sum(o.sum() * (i + 1) for i, o in enumerate(got) if o.requires_grad).backward()
        outs.append((tuple(o.detach() for o in got), w.detach(), w.grad, w.is_leaf))
    torch.testing.assert_close(outs[1], outs[0])
    _functional(jfn)


# --- mutating custom ops on a gradient path, functionalized (issue 9, docs §5 and §9) ------------
# A write into memory other tensors share (a view, its base, an argument) is made functional: the
# op runs on a clone of what it writes and the clone's new value is written back. A custom_op's
# write is below autograd (the tensor keeps its history); a Library op's kernel is recorded.

from thunderlite.executors.autograd_function import EAGER_MODE_STAGE  # noqa: E402
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion  # noqa: E402

WRITE_EXECUTORS = [pytest.param(None, id="default"), pytest.param("shuffle", id="shuffle"),
                   pytest.param(["torchcompile", "torch"], id="torchcompile")]


def _exs(executors):
    return [ShuffleFusion(3), "torch"] if executors == "shuffle" else executors


def _functional(jfn):
    """The program was differentiated by thunderlite, not replayed in eager mode."""
    stages = [t.stage for t in thunderlite.last_traces(jfn)]
    assert EAGER_MODE_STAGE not in stages, str(thunderlite.last_traces(jfn)[-1])
    bwd = thunderlite.last_backward_traces(jfn)
    assert bwd and bwd[-1].bound_symbols


def _eager_mode_reason(jfn) -> str:
    named = [t for t in thunderlite.last_traces(jfn) if t.stage == EAGER_MODE_STAGE]
    assert named, "the program was expected to run in eager mode"
    return str(named[0])


def write_into_intermediate_then_used(x, y):
    h = x * 2
    v = h[:2]
    r = mix_(h, y)                      # y requires grad, yet h's gradient reaches x only (and y gets None)
    return h.sin(), v * 3, r.detach()


def write_into_view_of_intermediate(x, y):
    h = x + 1
    v = h[1:]
    scale_(v, 3.0)
    return h.sin(), v * y[1:]


def write_into_view_under_no_grad(x, y):
    h = x * y
    with torch.no_grad():
        scale_(h[1:], 0.5)
    return h.cos()


def list_write_into_views(x, y):
    h = x * 1
    a, b = h[:2], h[2:]
    scale_all_([a, b], 3.0)              # Tensor(a!)[]: two disjoint views of one tensor
    m, n = scale_all_ret_([a, y[:2] * 1], 0.5)
    return h.exp(), m * n


def same_tensor_written_and_read(x, y):
    h = x * y
    v = h[1:]
    r = mix_(v, v)                      # eager: v += v, then r reads the new v
    scale_all_([h, h], 0.5)             # the same tensor twice in a written list: scaled twice
    return h.exp(), r.detach() * 1


def library_op_returning_its_written_view(x, y):
    h = x * y
    r = torch.ops.tl_aliasing_def.inc_(h[1:], 2.0)    # -> Tensor(a!): r is h[1:] after the write
    return h.sin(), r * y[1:]


@pytest.mark.parametrize("executors", WRITE_EXECUTORS)
@pytest.mark.parametrize("fn", [write_into_intermediate_then_used, write_into_view_of_intermediate,
                                write_into_view_under_no_grad, list_write_into_views,
                                same_tensor_written_and_read, library_op_returning_its_written_view],
                         ids=lambda f: f.__name__)
def test_mutating_custom_op_into_shared_memory_is_functional(fn, executors):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # eager's "no autograd kernel" warning for the Library op
        jfn = check_against_eager(fn, [(4,), (4,)], _exs(executors))
    _functional(jfn)


def test_written_intermediate_gives_no_gradient_to_what_the_op_read():
    """Eager: ``mix_(h, y)`` adds ``y`` into ``h`` below autograd, so ``h``'s
    later uses do not reach ``y``: its gradient is None, not zeros."""
    x, y = (torch.randn(4, dtype=F64, requires_grad=True) for _ in range(2))
    jfn = thunderlite.jit(write_into_intermediate_then_used)
    outs = jfn(x, y)
    _functional(jfn)
    sum(o.sum() for o in outs if o.requires_grad).backward()
    assert y.grad is None and x.grad is not None


@pytest.mark.parametrize("executors", WRITE_EXECUTORS)
def test_mutating_custom_op_writes_an_argument_and_a_view_of_it(executors):
    """The arguments are non-leaf descendants of leaves requiring grad: written
    below autograd, each keeps its history (and stays a non-leaf of the same
    graph), so the caller's gradients are eager's."""
    def fn(a, b):
        before = a * 2
        scale_(a, 0.5)
        r = mix_(b[1:], a[:3])
        return before, a.sin() + b.cos(), r.detach()
    exs = _exs(executors)
    jfn = thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=exs)
    results = []
    for f in (fn, jfn):
        g = torch.Generator().manual_seed(4)
        leaves = [torch.randn(4, dtype=F64, generator=g).requires_grad_() for _ in range(2)]
        a, b = leaves[0] * 1.5, leaves[1] + 1
        outs = f(a, b)
        grads = torch.autograd.grad(sum(o.sum() * (i + 1) for i, o in enumerate(outs + (a, b)) if o.requires_grad),
                                    leaves)
        results.append((tuple(o.detach() for o in outs), a.detach(), b.detach(), grads,
                        [o.requires_grad for o in outs], (a.grad_fn.name(), b.grad_fn.name())))
    torch.testing.assert_close(results[1][:4], results[0][:4])
    assert results[1][4:] == results[0][4:]
    _functional(jfn)


@pytest.mark.parametrize("executors", WRITE_EXECUTORS)
def test_differentiating_a_mutating_ops_output_raises_eagers_error(executors):
    def fn(x, y):
        h = x * 2
        r = mix_(h[1:], y)
        return h.sin(), r
    x, y = torch.randn(4, dtype=F64, requires_grad=True), torch.randn(3, dtype=F64, requires_grad=True)
    exs = _exs(executors)
    jfn = thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=exs)
    want, got = fn(x, y), jfn(x, y)
    torch.testing.assert_close(got, want)
    assert [o.requires_grad for o in got] == [o.requires_grad for o in want] == [True, True]
    _functional(jfn)
    for outs in (want, got):
        with pytest.raises(RuntimeError, match="no autograd formula was registered"):
            (outs[0].sum() + outs[1].sum()).backward()


@pytest.mark.parametrize("executors", WRITE_EXECUTORS)
def test_a_mutating_op_no_gradient_reaches_is_not_differentiated(executors):
    """Grad fuzz seed 4283: eager's backward from ``h.sin()`` alone never visits
    the op's node (its write is below autograd), so its missing formula raises
    nothing; the jitted backward skips the op's graph when no output's gradient
    reaches it, and still raises eager's error when one does."""
    def fn(x, y):
        h = x * 2
        r = mix_(h[1:], y)
        return h.sin(), r * 3
    x, y = torch.randn(4, dtype=F64, requires_grad=True), torch.randn(3, dtype=F64, requires_grad=True)
    exs = _exs(executors)
    jfn = thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=exs)
    want, got = fn(x, y), jfn(x, y)
    torch.testing.assert_close(got, want)
    _functional(jfn)
    expected = torch.autograd.grad(want[0].sum(), (x, y), allow_unused=True)
    grads = torch.autograd.grad(got[0].sum(), (x, y), allow_unused=True)
    torch.testing.assert_close(grads[0], expected[0])
    assert grads[1] is expected[1] is None
    want, got = fn(x, y), jfn(x, y)
    for out in (want[1], got[1]):
        with pytest.raises(RuntimeError, match="no autograd formula was registered"):
            out.sum().backward()


@pytest.mark.parametrize("executors", WRITE_EXECUTORS)
def test_mutating_custom_op_into_a_saved_tensor_keeps_eager_mode(executors):
    """``h.sin()`` saves ``h``; the op's write bumps its version: eager's
    backward raises "modified by an inplace operation", and so does ours."""
    def fn(x, y):
        h = x * 2
        v = h[1:]
        s = h.sin()
        scale_(v, 3.0)
        return s, v * y
    x, y = torch.randn(4, dtype=F64, requires_grad=True), torch.randn(3, dtype=F64, requires_grad=True)
    exs = _exs(executors)
    jfn = thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=exs)
    want, got = fn(x, y), jfn(x, y)
    torch.testing.assert_close(got, want)
    assert "which eager saved for the backward of" in _eager_mode_reason(jfn)
    for outs in (want, got):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            outs[0].sum().backward()


@pytest.mark.parametrize("executors", WRITE_EXECUTORS)
def test_mutating_custom_op_reading_the_memory_it_writes_keeps_eager_mode(executors):
    """``scale_all_([h[:3], h[1:]])``: the kernel writes overlapping views (what
    it reads of one depends on its order of writes), so the program keeps
    eager mode, named."""
    def fn(x, y):
        h = x * y
        scale_all_([h[:3], h[1:]], 2.0)
        return h.sin()
    jfn = check_against_eager(fn, [(4,), (4,)], _exs(executors))
    assert "writes a tensor sharing memory with another it is given" in _eager_mode_reason(jfn)


@pytest.mark.parametrize("executors", WRITE_EXECUTORS)
def test_written_arguments_returned_are_the_callers_tensors(executors):
    """``inc_(a) -> Tensor(a!)`` returns ``a`` itself (its kernel's write is
    recorded: ``a``'s new history reaches the kernel's graph); a view of an
    argument a ``custom_op`` wrote is a view of the caller's tensor."""
    def fn(a, b):
        v = b[1:]
        r = torch.ops.tl_aliasing_def.inc_(a, 2.0)
        scale_(v, 0.5)
        return r, a.sin(), v
    exs = _exs(executors)
    jfn = thunderlite.jit(fn) if exs is None else thunderlite.jit(fn, executors=exs)
    results = []
    for f in (fn, jfn):
        g = torch.Generator().manual_seed(5)
        leaves = [torch.randn(4, dtype=F64, generator=g).requires_grad_() for _ in range(2)]
        a, b = leaves[0] * 1.5, leaves[1] + 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # eager's "no autograd kernel" warning for the Library op
            outs = f(a, b)
            grads = torch.autograd.grad(sum((o * (i + 1)).sum() for i, o in enumerate(outs + (a, b))), leaves)
        assert outs[0] is a and outs[2]._base is b
        results.append((tuple(o.detach() for o in outs), a.detach(), b.detach(), grads))
    torch.testing.assert_close(results[1], results[0])
    _functional(jfn)
