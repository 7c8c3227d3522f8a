"""Aliasing between arguments and the tensors a program reads from globals,
closures and modules (docs/architecture.md §8), and eager's refusals of writes, raised at
trace time (docs/architecture.md §5).

A cached entry compiled with separate tensors must not be reused when the
same tensor (or storage) comes back through two paths, and an entry compiled
with one tensor on two paths must not be reused when they separate. Every case
runs with the default executors, with ``["torchcompile", "torch"]`` and with
the random reordering executor of the in-place fuzzer, and is compared with
eager: outputs, arguments and module state after each call."""
from __future__ import annotations

import copy

import pytest
import torch

import thunderlite
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion

EXECUTORS = [None, ["torchcompile", "torch"], "shuffle"]


def _jit(fn, exs):
    if exs == "shuffle":
        return thunderlite.jit(fn, executors=[ShuffleFusion(3), "torch"])
    return thunderlite.jit(fn, executors=exs)


def _ids(exs):
    return "default" if exs is None else exs if isinstance(exs, str) else "+".join(exs)


# --- globals ---------------------------------------------------------------------------------------

G = torch.ones(4)


def _reads_global_writes_arg(x):
    y = G * 2          # read before the write
    x.add_(1)          # when x is G, y must not see this write...
    return y + G       # ...and this read must


@pytest.mark.parametrize("exs", EXECUTORS, ids=_ids)
def test_argument_aliasing_a_global_after_separate_call(exs):
    global G
    G = torch.arange(4.0)
    jfn = _jit(_reads_global_writes_arg, exs)
    a = torch.zeros(4)
    torch.testing.assert_close(jfn(a), torch.arange(4.0) * 3)
    torch.testing.assert_close(a, torch.ones(4))

    G = torch.arange(4.0)
    ref = torch.arange(4.0)
    G, ref_g = ref, G                      # run eager on one copy, the jit on the other
    expected = _reads_global_writes_arg(ref)
    G = ref_g
    got = jfn(G)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(G, ref)
    assert thunderlite.cache_info(jfn)["misses"] == 2
    assert "share storage now" in thunderlite.cache_info(jfn)["last_miss_reason"]

    # separate again: the first entry is reused, and is still right
    G = torch.arange(4.0)
    b = torch.zeros(4)
    torch.testing.assert_close(jfn(b), torch.arange(4.0) * 3)
    torch.testing.assert_close(b, torch.ones(4))


@pytest.mark.parametrize("exs", EXECUTORS, ids=_ids)
def test_argument_is_a_view_of_a_global(exs):
    global G
    G = torch.arange(6.0)
    jfn = _jit(_reads_global_writes_arg, exs)
    jfn(torch.zeros(6))
    base = torch.arange(6.0)
    G = base.clone()
    expected_g = base.clone()
    G, keep = expected_g, G
    # eager: the argument is the whole global viewed flat (same storage, another tensor object)
    expected = _reads_global_writes_arg(expected_g.view(2, 3).view(6))
    G = keep
    got = jfn(G.view(2, 3).view(6))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(G, expected_g)


def _reads_global(x):
    return x * 2 + G


@pytest.mark.parametrize("exs", EXECUTORS, ids=_ids)
def test_one_tensor_on_two_paths_then_separate(exs):
    """Compiled with the global itself as the argument (one proxy for both
    paths), then called with another tensor: the paths must not stay merged."""
    global G
    G = torch.ones(3)
    jfn = _jit(_reads_global, exs)
    torch.testing.assert_close(jfn(G), torch.full((3,), 3.0))
    a = torch.zeros(3)
    torch.testing.assert_close(jfn(a), _reads_global(a))
    prologue = str(thunderlite.last_prologue_traces(jfn)[0])
    assert "G" in prologue


# --- closures and modules ---------------------------------------------------------------------------

def _closure_program():
    w = torch.arange(4.0)

    def f(x):
        x.mul_(2)
        return w + 1
    return f, w


@pytest.mark.parametrize("exs", EXECUTORS, ids=_ids)
def test_argument_aliasing_a_closure_cell(exs):
    f, w = _closure_program()
    jfn = _jit(f, exs)
    a = torch.ones(4)
    torch.testing.assert_close(jfn(a), torch.arange(4.0) + 1)
    ref_f, ref_w = _closure_program()
    expected = ref_f(ref_w)
    got = jfn(w)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(w, ref_w)


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x):
        return self.lin(x) * self.scale


def _module_program(model, inp):
    def step(s):
        s.add_(1)                       # writes the argument...
        return model(inp)               # ...which the module reads as its buffer
    return step


@pytest.mark.parametrize("exs", EXECUTORS, ids=_ids)
def test_argument_aliasing_a_module_buffer(exs):
    torch.manual_seed(0)
    model, inp = Scaled(), torch.randn(2, 3)
    ref_model = copy.deepcopy(model)
    jfn = _jit(_module_program(model, inp), exs)
    eager = _module_program(ref_model, inp)
    with torch.no_grad():
        torch.testing.assert_close(jfn(torch.zeros(3)), eager(torch.zeros(3)))
        for _ in range(2):
            torch.testing.assert_close(jfn(model.scale), eager(ref_model.scale))
            torch.testing.assert_close(model.scale, ref_model.scale)
    torch.testing.assert_close(model.state_dict(), ref_model.state_dict())


@pytest.mark.parametrize("exs", EXECUTORS, ids=_ids)
def test_parameter_passed_as_argument_and_read_from_the_module(exs):
    """``f(model, model.weight)``: compiled with the parameter as the argument,
    then called with another tensor (and back)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)

    def f(m, v):
        return m(v[0:1]) + v.sum()
    jfn = _jit(f, exs)
    with torch.no_grad():
        torch.testing.assert_close(jfn(lin, lin.weight), f(lin, lin.weight))
        other = torch.randn(3, 3)
        torch.testing.assert_close(jfn(lin, other), f(lin, other))
        torch.testing.assert_close(jfn(lin, lin.weight), f(lin, lin.weight))


@pytest.mark.parametrize("exs", EXECUTORS, ids=_ids)
def test_shadow_update_of_module_weight_passed_as_argument(exs):
    """The EMA pattern with the target being the module's own weight."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    ref = copy.deepcopy(lin)
    x = torch.randn(2, 4)

    def make(m):
        def ema(target):
            out = m(x)                      # reads m.weight
            target.mul_(0.5).add_(m.weight, alpha=0.5)
            return out + m.weight.sum()
        return ema
    jfn, eager = _jit(make(lin), exs), make(ref)
    with torch.no_grad():
        t, rt = torch.zeros(4, 4), torch.zeros(4, 4)
        torch.testing.assert_close(jfn(t), eager(rt))
        torch.testing.assert_close(t, rt)
        for _ in range(2):
            torch.testing.assert_close(jfn(lin.weight), eager(ref.weight))
            torch.testing.assert_close(lin.weight, ref.weight)


def test_programs_that_write_no_input_get_no_storage_guard():
    """The guard costs nothing where it cannot matter."""
    lin = torch.nn.Linear(3, 3)
    jfn = thunderlite.jit(lambda x: lin(x).sin())
    jfn(torch.randn(2, 3))
    prologue = str(thunderlite.last_prologue_traces(jfn)[0])
    assert "check_storage_sharing" not in prologue and "check_write_verdict" not in prologue


def test_prologue_trace_shows_the_storage_guard():
    global G
    G = torch.ones(4)
    jfn = thunderlite.jit(_reads_global_writes_arg)
    jfn(torch.zeros(4))
    prologue = str(thunderlite.last_prologue_traces(jfn)[0])
    assert "check_storage_sharing" in prologue and "check_write_verdict" in prologue


# --- eager's refusals, at trace time ----------------------------------------------------------------

def _writes_arg(x):
    y = x * 2
    x.add_(1)
    return y


def _refused_cases():
    w = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        no_grad_view = w[0:2]
    with torch.inference_mode():
        inference = torch.ones(3)
    return {"leaf": (w, w), "view_of_leaf": (w[0:2], w), "no_grad_view": (no_grad_view, w),
            "inference": (inference, inference)}


@pytest.mark.parametrize("case", ["leaf", "view_of_leaf", "no_grad_view", "inference"])
@pytest.mark.parametrize("exs", EXECUTORS, ids=_ids)
def test_refused_write_raises_eager_error_at_trace_time(case, exs):
    t, base = _refused_cases()[case]
    with pytest.raises(RuntimeError) as eager:
        _writes_arg(_refused_cases()[case][0])
    before = base.detach().clone()
    version = None if base.is_inference() else base._version
    with pytest.raises(RuntimeError) as info:
        _jit(_writes_arg, exs)(t)
    msg = str(info.value)
    assert msg.startswith(str(eager.value)[:60]), msg
    assert "x.add_(1)" in msg and "test_alias_guards.py" in msg
    torch.testing.assert_close(base.detach(), before)      # untouched: nothing ran
    assert (version is None or base._version == version) and base.grad is None


def test_write_into_parameter_in_grad_mode_raises_with_the_line():
    lin = torch.nn.Linear(2, 2)
    before = lin.weight.detach().clone()

    def f(x):
        lin.weight.mul_(2)
        return lin(x)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad") as info:
        thunderlite.jit(f)(torch.randn(2))
    assert "lin.weight.mul_(2)" in str(info.value)
    torch.testing.assert_close(lin.weight.detach(), before)
    with torch.no_grad():                                  # allowed there, as in eager
        thunderlite.jit(f)(torch.randn(2))
    torch.testing.assert_close(lin.weight.detach(), before * 2)


def test_cached_entry_rechecks_what_eager_allows():
    """Compiled for a non-leaf requiring grad (allowed), then called with a leaf
    (same key: shape, dtype, requires_grad): recompiled, and refused."""
    jfn = thunderlite.jit(_writes_arg)
    w = torch.randn(3, requires_grad=True)
    out = jfn(w * 1)
    assert out.requires_grad
    leaf = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        jfn(leaf)
    assert "whether eager allows writing argument 0" in thunderlite.cache_info(jfn)["last_miss_reason"]
    with torch.inference_mode():
        inf = torch.ones(3)
    with pytest.raises(RuntimeError, match="inference tensor"):
        jfn(inf)
    torch.testing.assert_close(inf, torch.ones(3))


def test_writes_eager_allows_still_run():
    w = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        got = thunderlite.jit(_writes_arg)(w)
    torch.testing.assert_close(got, (w.detach() - 1) * 2)
    with torch.inference_mode():
        inf = torch.ones(3)
        got = thunderlite.jit(_writes_arg)(inf)
        torch.testing.assert_close(inf, torch.full((3,), 2.0))
    torch.testing.assert_close(got, torch.full((3,), 2.0))


@pytest.mark.parametrize("exs", EXECUTORS, ids=_ids)
def test_write_into_unsafe_split_piece_of_a_leaf_runs_as_in_eager(exs):
    """``unsafe_split`` pieces share the leaf's storage, but autograd does not
    know them as views: eager allows the write (no "view of a leaf" error)."""
    def fn(x, w):
        piece = w.unsafe_split(1)[0]
        piece[..., 1] = 0.5
        return x * 2, piece * 1
    w, ref_w = torch.ones(2, 3, requires_grad=True), torch.ones(2, 3, requires_grad=True)
    x = torch.randn(3)
    expected = fn(x, ref_w)
    got = _jit(fn, exs)(x, w)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(w.detach(), ref_w.detach())
    assert [t.requires_grad for t in got] == [t.requires_grad for t in expected]


def _leaf(shape, strides):
    return torch.empty_strided(shape, strides).normal_().requires_grad_()


@pytest.mark.parametrize("exs", EXECUTORS, ids=_ids)
def test_write_into_reshape_copy_of_a_leaf_view_runs_as_in_eager(exs):
    """Grad fuzz seed 5033: ``w[:, ::2].reshape(-1)`` is a copy in eager when the
    slice's strides cannot be flattened, so writing it is allowed; where they can
    (another layout of ``w``, same shape), it is a view of the leaf and eager
    raises. The decision follows ``w``'s strides, which the entry guards."""
    state = {}

    def fn(x):
        v = state["w"][:, ::2].reshape(-1)
        v.masked_fill_(v > 0.2, 0.02)
        return x * 2, v * 1

    jfn = _jit(fn, exs)
    x = torch.randn(3, requires_grad=True)
    w = _leaf((3, 6), (1, 3))          # the slice has strides (1, 6): a copy
    state["w"] = w
    expected = fn(x)
    got = jfn(x)
    torch.testing.assert_close(got, expected)
    grads = torch.autograd.grad(got[1].sum(), w)
    torch.testing.assert_close(grads, torch.autograd.grad(expected[1].sum(), w))
    state["w"] = _leaf((3, 6), (6, 1))  # strides (6, 2): flattens to a view of the leaf
    with pytest.raises(RuntimeError, match="view of a leaf Variable") as info:
        fn(x)
    with pytest.raises(RuntimeError, match="view of a leaf Variable") as info:
        jfn(x)
    assert "v.masked_fill_" in str(info.value)
