"""In-place ops end to end through ``thunderlite.jit`` (issue 5): outputs,
every mutated input and module buffer equal eager PyTorch, with the torch
executor and after the region former has reordered the trace."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunderlite
from thunderlite.core.tags import Tag


def _inputs(shapes, seed=0, low=0.1, high=0.9):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(s, generator=g) * (high - low) + low if isinstance(s, tuple) else s for s in shapes]


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(y) for y in x)
    return x


def check(fn, *args, jitted=None):
    """Run ``fn`` eagerly and jitted on equal copies; compare outputs and inputs."""
    ref_args, args = _clone(args), _clone(args)
    expected = fn(*ref_args)
    jfn = jitted or thunderlite.jit(fn)
    got = jfn(*args)
    torch.testing.assert_close(got, expected, equal_nan=True)
    torch.testing.assert_close(args, ref_args, equal_nan=True)
    return jfn


def _final(jfn):
    return thunderlite.last_traces(jfn)[-1]


def _barriers(trace):
    """The trace's alias barriers, those inside fusions included."""
    from thunderlite.core.symbol import walk
    return [leaf for b in trace.bound_symbols for leaf in walk(b) if leaf.has_tag(Tag.ALIAS_BARRIER)]


# --- in-place methods and functions ------------------------------------------------------------

_UNARY_METHODS = ["abs_", "acos_", "asin_", "atan_", "ceil_", "cos_", "cosh_", "erf_", "erfc_", "exp_",
                  "expm1_", "floor_", "frac_", "log_", "log10_", "log1p_", "log2_", "neg_", "reciprocal_",
                  "relu_", "round_", "rsqrt_", "sigmoid_", "sign_", "sin_", "sinh_", "sqrt_", "square_",
                  "tan_", "tanh_", "trunc_", "zero_", "digamma_", "lgamma_", "erfinv_", "exp2_", "logit_",
                  "nan_to_num_", "deg2rad_", "rad2deg_", "sinc_"]


@pytest.mark.parametrize("name", _UNARY_METHODS)
def test_unary_inplace_method(name):
    def fn(x):
        y = x * 1.0
        before = y.cos()
        getattr(y, name)()
        getattr(x[1:], name)()
        return before, y, y.sum()
    check(fn, *_inputs([(3, 4)]))


_BINARY_METHODS = ["add_", "sub_", "mul_", "div_", "pow_", "atan2_", "remainder_", "fmod_", "hypot_",
                   "copysign_", "xlogy_", "true_divide_",
                   "floor_divide_", "lerp_", "copy_"]


@pytest.mark.parametrize("name", _BINARY_METHODS)
def test_binary_inplace_method(name):
    def fn(x, y):
        extra = (0.3,) if name == "lerp_" else ()
        getattr(x, name)(y, *extra)
        getattr(y[0], name)(x[1], *extra)
        return x + y
    check(fn, *_inputs([(3, 4), (3, 4)]))


def test_inplace_with_scalars_alpha_and_broadcast():
    def fn(x, b):
        x.add_(b, alpha=2.0)
        x.mul_(3)
        x.clamp_(0.2, 1.5)
        x.addcmul_(b, b, value=0.5)
        return x.sum(0)
    check(fn, *_inputs([(3, 4), (4,)]))


def test_torch_namespace_inplace_functions():
    def fn(x):
        torch.relu_(x)
        torch.sigmoid_(x)
        torch.exp_(x)
        return x
    check(fn, *_inputs([(5,)]))


# --- out= -------------------------------------------------------------------------------------

def test_out_arguments():
    def fn(a, b, c):
        torch.add(a, b, out=c)
        torch.sin(a, out=b)
        return c * 2, b
    check(fn, *_inputs([(4,), (4,), (4,)]))


def test_out_tuple_views_and_ignored_out_parameters():
    def fn(a, v, m):
        torch.max(a, 0, out=(v[0], torch.empty(4, dtype=torch.long)))
        torch.linalg.multi_dot([m, m], out=a[:, :3])      # its decomposition used to drop out=
        return v, a
    check(fn, *_inputs([(3, 4), (2, 4), (3, 3)]))


def test_out_with_inputs_requiring_grad_is_refused_as_eager():
    def fn(a, c):
        return torch.add(a, 1, out=c)
    a, c = _inputs([(4,), (4,)])
    a.requires_grad_()
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        fn(a, c.clone())
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        thunderlite.jit(fn)(a, c)
    with torch.no_grad():
        check(fn, a, c)


def test_out_of_another_shape_is_a_clear_error():
    def fn(a, c):
        return torch.add(a, 1, out=c)
    with pytest.raises(RuntimeError, match="does not resize out= tensors"):
        thunderlite.jit(fn)(*_inputs([(4,), (3,)]))


# --- setitem, augmented assignment, index ops -------------------------------------------------

def test_setitem_slices_and_augmented_assignment():
    def fn(y, v):
        y[0] = 5.0
        y[1:3] += 1
        y[:, 1] *= 2
        y[2, 1:] = v[1:]
        return y.sum(), y
    check(fn, *_inputs([(4, 3), (3,)]))


def test_setitem_with_ellipsis():
    def fn(y, v):
        y[..., 0] -= v[0]
        return y
    check(fn, *_inputs([(4, 3), (3,)]))


def test_setitem_ellipsis_none_and_leading_size_one_values():
    def fn(z, v):
        z[..., 1, :] = 3.0
        z[0, ..., 0] += v[0, 0, 0]
        z[None, 1:, ...] = v[None, None, :1, :, :1]    # value (1, 1, 1, 3, 1): eager drops a leading 1
        z[0:1] = v[None, 1:2]                             # value (1, 1, 3, 4) into a (1, 3, 4) view
        return z
    check(fn, *_inputs([(2, 3, 4), (2, 3, 4)]))


def test_setitem_advanced_indices_and_masks():
    def fn(y, v):
        y[[0, 2]] = v
        y[torch.tensor([1, 3])] += 1.0
        y[y > 0.5] = 0.0
        return y
    check(fn, *_inputs([(4, 3), (3,)]))


def test_index_put_scatter_masked_fill():
    def fn(x, src):
        idx = torch.tensor([0, 2])
        x.index_put_((idx,), src[:2])
        x.scatter_(1, torch.tensor([[0], [1], [2], [0]]), 7.0)
        x.masked_fill_(x > 0.8, -1.0)
        x.index_add_(0, torch.tensor([1, 3]), src[:2])
        x.scatter_add_(0, torch.zeros(1, 3, dtype=torch.long), src[:1])
        return x
    check(fn, *_inputs([(4, 3), (4, 3)]))


def test_fill_zero_copy():
    def fn(a, b):
        a[0].fill_(2.0)
        a[1].zero_()
        a[2].copy_(b[0])
        b.fill_(torch.tensor(3.0))
        return a, b
    check(fn, *_inputs([(3, 4), (2, 4)]))


# --- inplace=True and module state -------------------------------------------------------------

def test_relu_inplace_and_friends():
    def fn(x):
        y = x - 0.5
        F.relu(y, inplace=True)
        F.leaky_relu(y, 0.1, inplace=True)
        F.hardtanh(y, -0.1, 0.1, inplace=True)
        F.relu_(x[0])
        return y
    check(fn, *_inputs([(3, 4)]))


def test_modules_with_inplace_activations():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2), nn.ELU(inplace=True))
    x = _inputs([(3, 4)])[0]
    with torch.no_grad():
        check(model, x, jitted=thunderlite.jit(model))


def test_batch_norm_running_stats():
    eager = nn.BatchNorm1d(4)
    jitted_module = nn.BatchNorm1d(4)
    jitted_module.load_state_dict(eager.state_dict())
    jm = thunderlite.jit(jitted_module)
    for seed in range(3):
        x = _inputs([(5, 4)], seed=seed)[0]
        with torch.no_grad():
            torch.testing.assert_close(jm(x), eager(x))
    torch.testing.assert_close(jitted_module.running_mean, eager.running_mean)
    torch.testing.assert_close(jitted_module.running_var, eager.running_var)
    assert jitted_module.num_batches_tracked == eager.num_batches_tracked


def test_no_grad_parameter_update():
    def step(w, b, lr):
        with torch.no_grad():
            w.mul_(1 - lr)
            b.sub_(w.sum(0) * lr)
        return (w * 2).sum()
    w = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    wr, br = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    expected = step(wr, br, 0.1)
    got = thunderlite.jit(step)(w, b, 0.1)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close((w, b), (wr, br))


def _grad_check(fn, *shapes):
    """``fn`` jitted vs eager on inputs requiring grad: outputs, mutated inputs,
    ``requires_grad`` of the outputs, gradients of a sum of the outputs."""
    leaves = [t.requires_grad_() for t in _inputs(list(shapes))]
    refs = [t.detach().clone().requires_grad_() for t in leaves]
    expected, got = fn(*refs), thunderlite.jit(fn)(*leaves)
    torch.testing.assert_close(got, expected)
    assert [o.requires_grad for o in got] == [o.requires_grad for o in expected]
    sum(o.sum() for o in expected if o.requires_grad).backward()
    sum(o.sum() for o in got if o.requires_grad).backward()
    torch.testing.assert_close([t.grad for t in leaves], [t.grad for t in refs])
    assert torch.is_grad_enabled()


@torch.no_grad()
def _scaled(x):
    return x * 3


def test_no_grad_decorator_and_nested_enable_grad():
    def fn(x, w):
        a = _scaled(x) * w               # the decorator cuts x's path
        with torch.no_grad():
            b = x * 2
            with torch.enable_grad():
                c = x.sin()
            d = c * w
        return a, b + w, c, d
    _grad_check(fn, (3, 4), (3, 4))


def test_set_grad_enabled_region_with_view_write():
    def fn(x, w):
        y = x * 1.0
        with torch.set_grad_enabled(False):
            y[0].add_(w[0])            # a write into a view: eager-mode replay
            z = y * w
        return y * w, z
    _grad_check(fn, (3, 4), (3, 4))


def test_grad_mode_switches_are_order_barriers_for_fusion():
    """Eager mode runs the trace with autograd on: a fusion executor that reorders
    freely must not move a symbol across a grad-mode switch."""
    from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion

    def fn(x, w):
        y = x * 1.0
        a = (y * 2) * w
        with torch.no_grad():
            y[0].add_(w[0])
            b = y.cos() * w
        return a, b, y.exp() * w
    for seed in range(6):
        leaves = [t.requires_grad_() for t in _inputs([(3, 4), (3, 4)], seed=seed)]
        refs = [t.detach().clone().requires_grad_() for t in leaves]
        got = thunderlite.jit(fn, executors=[ShuffleFusion(seed)])(*leaves)
        want = fn(*refs)
        torch.testing.assert_close(got, want)
        assert [o.requires_grad for o in got] == [o.requires_grad for o in want] == [True, False, True]
        (got[0].sum() + got[2].sum()).backward()
        (want[0].sum() + want[2].sum()).backward()
        torch.testing.assert_close([t.grad for t in leaves], [t.grad for t in refs])


def test_grad_mode_switch_orders_every_symbol():
    from thunderlite.core.tags import Tag
    from thunderlite.transforms.fusion import dependencies

    def fn(x, w):
        a = x * 2
        with torch.no_grad():
            b = w * 3
        return a + 1, b + 1, x * w
    jfn = thunderlite.jit(fn)
    jfn(*_inputs([(3,), (3,)]))
    trc = thunderlite.last_traces(jfn)[0]
    preds = dependencies(trc)
    ancestors: list[set[int]] = []
    for ps in preds:
        ancestors.append(set(ps).union(*(ancestors[j] for j in ps)))
    barriers = [i for i, b in enumerate(trc.bound_symbols) if Tag.ORDER_BARRIER in b.sym.tags]
    assert len(barriers) == 2
    for k in barriers:
        assert ancestors[k] == set(range(k))
        assert all(k in ancestors[i] for i in range(k + 1, len(preds)))


def test_module_buffer_update():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(3))

        def forward(self, x):
            self.total.add_(x.sum(0))
            return x * self.total
    m, ref = Counter(), Counter()
    jm = thunderlite.jit(m)
    for seed in range(3):
        x = _inputs([(2, 3)], seed=seed)[0]
        torch.testing.assert_close(jm(x), ref(x))
        torch.testing.assert_close(m.total, ref.total)


# --- aliased inputs ----------------------------------------------------------------------------

def _aliasing(x, y):
    x.mul_(2)
    return y + 1


def test_same_tensor_passed_twice():
    base = _inputs([(4,)])[0]
    ref = base.clone()
    expected = _aliasing(ref, ref)
    jfn = thunderlite.jit(_aliasing)
    torch.testing.assert_close(jfn(base, base), expected)
    torch.testing.assert_close(base, ref)
    assert _barriers(_final(jfn))


def test_view_of_another_argument_and_overlapping_slices():
    jfn = thunderlite.jit(_aliasing)
    for make in (lambda t: (t, t[1:3]), lambda t: (t[0:3], t[1:4]), lambda t: (t[0:2], t[2:4]),
                 lambda t: (t, t.view(2, 2))):
        base = _inputs([(4,)])[0]
        ref = base.clone()
        expected = _aliasing(*make(ref))
        torch.testing.assert_close(jfn(*make(base)), expected)
        torch.testing.assert_close(base, ref)


def test_alias_pattern_is_part_of_the_cache_key():
    jfn = thunderlite.jit(_aliasing)
    a, b = _inputs([(4,), (4,)])
    check(_aliasing, a, b, jitted=jfn)
    base = _inputs([(4,)])[0]
    ref = base.clone()
    torch.testing.assert_close(jfn(base, base), _aliasing(ref, ref))


# --- trace properties ---------------------------------------------------------------------------

def test_no_barrier_without_mutation():
    jfn = check(lambda x, y: (x.t() + y).sin()[1:], *_inputs([(3, 3), (3, 3)]))
    assert all(not _barriers(t) for t in thunderlite.last_traces(jfn))


def test_dead_inplace_on_intermediate_is_removed():
    def fn(x):
        t = x.exp()
        t.add_(1)                      # nobody reads t again
        return x.sin()
    jfn = check(fn, *_inputs([(4,)]))
    assert not any(b.has_tag(Tag.INPLACE) for b in _final(jfn).bound_symbols)


def test_return_is_last_and_input_mutation_kept():
    def fn(x, y):
        s = y.sin()
        x.add_(s)
        return x.cos(), s
    jfn = check(fn, *_inputs([(4,), (4,)]))
    for t in thunderlite.last_traces(jfn):
        assert t.bound_symbols[-1].has_tag(Tag.RETURN)


# --- errors as eager ------------------------------------------------------------------------------

def test_inplace_on_leaf_requiring_grad_raises_like_eager():
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        thunderlite.jit(lambda p: p.add_(1))(torch.randn(3, requires_grad=True))


def test_write_through_expanded_view_raises_like_eager():
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        thunderlite.jit(lambda x: x.expand(4, 3).add_(1))(torch.randn(1, 3))


def test_inplace_on_inference_tensor_raises_like_eager():
    with torch.inference_mode():
        t = torch.ones(3)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        thunderlite.jit(lambda x: x.add_(1))(t)


class _AccumulateInto(torch.autograd.Function):
    """A user autograd.Function whose forward writes into an argument."""

    @staticmethod
    def forward(ctx, x, buf):
        buf.add_(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


def test_inplace_inside_user_autograd_function():
    def fn(x, buf):
        before = buf.sum()
        y = _AccumulateInto.apply(x, buf)
        return before, y + buf
    jfn = check(fn, *_inputs([(3,), (3,)]))
    assert any(_barriers(t) for t in thunderlite.last_traces(jfn))


def test_mutations_with_the_torchcompile_fusion_executor():
    """Inductor regions around writes: the real region former and a real
    fusion executor reorder the trace; results and inputs still match eager."""
    def fn(x, y):
        a = (x * 2).sin()
        x.add_(y)
        b = (x + 1).cos() * a
        y[1:] *= 0.5
        return b + y.sum(), (y * y).exp()
    jfn = check(fn, *_inputs([(4, 3), (4, 3)]), jitted=thunderlite.jit(fn, executors=["torchcompile"]))
    final = _final(jfn)
    assert any(b.has_tag(Tag.FUSION) for b in final.bound_symbols) and _barriers(final)


# --- shape-changing in-place ops (metadata mutation) -------------------------------------------

@pytest.mark.parametrize("stmt", ["x.t_()", "x.transpose_(0, 1)", "x.unsqueeze_(0)", "x.swapaxes_(0, 1)",
                                  "x[None].squeeze_(0)", "x.resize_(12)", "torch.Tensor.t_(x)"])
def test_shape_changing_inplace_ops_match_eager(stmt):
    """Once refused; the caller's tensor now takes eager's shape and strides
    (test_shape_inplace.py has the full matrix)."""
    ns = {"torch": torch}
    exec(compile(f"def fn(x):\n    {stmt}\n    return x * 2\n", "<shape_inplace>", "exec"), ns)
    x, xe = _inputs([(3, 4)])[0], _inputs([(3, 4)])[0]
    torch.testing.assert_close(thunderlite.jit(ns["fn"])(x), ns["fn"](xe))
    assert (x.shape, x.stride()) == (xe.shape, xe.stride())
    torch.testing.assert_close(x, xe)


def test_shape_changing_inplace_ops_that_change_nothing_run():
    def fn(x):
        x.squeeze_()
        x.transpose_(1, 1)
        x.resize_(3, 4)
        return x * 2
    check(fn, *_inputs([(3, 4)]))
