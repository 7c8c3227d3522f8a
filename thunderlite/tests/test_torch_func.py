"""torch.func inside jitted code (docs/architecture.md §9, "torch.func inside a
trace"): every transform is compared with eager torch.func, values and, where
the jitted function's outputs are differentiated by a ``backward()`` outside
the jit, the gradients of its inputs."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, grad_and_value, hessian, jacfwd, jacrev, jvp, vjp, vmap

import thunderlite
from thunderlite.core.verify import verify_trace

EXECUTORS = [None, ["torchcompile", "torch"]]


def _jit(fn, executors=None):
    return thunderlite.jit(fn) if executors is None else thunderlite.jit(fn, executors=executors)


def _leaves(x):
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _check(fn, *args, executors=None, backward=False, atol=1e-5, rtol=1e-5):
    """``fn`` jitted against eager: outputs, and with ``backward`` the input
    gradients of the sum of the outputs."""
    def clone(a):
        return a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
    eargs = torch.utils._pytree.tree_map(clone, args)
    jargs = torch.utils._pytree.tree_map(clone, args)
    expected = fn(*eargs)
    jfn = _jit(fn, executors)
    got = jfn(*jargs)
    for trace in thunderlite.last_traces(jfn):
        verify_trace(trace)
    e_out, g_out = _leaves(expected), _leaves(got)
    assert len(e_out) == len(g_out)
    for e, g in zip(e_out, g_out, strict=True):
        assert e.shape == g.shape
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol)
    if backward:
        sum(e.sum() for e in e_out).backward()
        sum(g.sum() for g in g_out).backward()
        for ea, ga in zip(_leaves(eargs), _leaves(jargs), strict=True):
            if ea.requires_grad:
                torch.testing.assert_close(ga.grad, ea.grad, atol=atol, rtol=rtol)
    return jfn


def _loss(w, x):
    return (torch.tanh(x @ w) ** 2).sum()


# --- grad ------------------------------------------------------------------------------

@pytest.mark.parametrize("executors", EXECUTORS)
def test_grad_matches_eager(executors):
    w, x = torch.randn(3, 2), torch.randn(4, 3)
    jfn = _check(lambda w, x: grad(_loss)(w, x), w, x, executors=executors)
    text = str(thunderlite.last_traces(jfn)[0])
    assert "tanh_backward" in text or "tanh" in text        # the gradient is computed in the trace


def test_grad_argnums_tuple_and_has_aux():
    def f(w, b, x):
        y = x @ w + b
        return y.pow(2).mean(), y.detach()
    w, b, x = torch.randn(3, 2), torch.randn(2), torch.randn(5, 3)
    _check(lambda w, b, x: grad(f, argnums=(0, 1), has_aux=True)(w, b, x), w, b, x)
    _check(lambda w, b, x: grad_and_value(f, argnums=1, has_aux=True)(w, b, x), w, b, x)


def test_grad_of_dict_argument():
    def f(p, x):
        return (x @ p["w"] + p["b"]).sin().sum()
    p = {"w": torch.randn(3, 2), "b": torch.randn(2)}
    _check(lambda p, x: grad(f)(p, x), p, torch.randn(4, 3))


def test_grad_unused_input_is_zeros():
    _check(lambda a, b: grad(lambda a, b: (a * 2).sum(), argnums=1)(a, b), torch.randn(3), torch.randn(3))


def test_grad_under_no_grad_and_outer_backward():
    w, x = torch.randn(3, 2, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    _check(lambda w, x: grad(_loss)(w, x), w, x, backward=True)

    def under_no_grad(w, x):
        with torch.no_grad():
            return grad(_loss)(w, x)
    _check(under_no_grad, torch.randn(3, 2), torch.randn(4, 3))


def test_grad_of_grad():
    def f(x):
        return (x.sin() * x).sum()
    x = torch.randn(5)
    _check(lambda x: grad(lambda y: grad(f)(y).sum())(x), x)
    # functorch's levels: the closed-over x is a constant of the inner grad
    _check(lambda x: grad(lambda x: grad(lambda y: (x * y).sum())(x).sum())(x), x)


def test_grad_errors():
    with pytest.raises(RuntimeError, match="scalar Tensor"):
        thunderlite.jit(lambda x: grad(lambda x: x * 2)(x))(torch.randn(3))
    with pytest.raises(RuntimeError, match="floating point"):
        thunderlite.jit(lambda x: grad(lambda x: x.sum())(x))(torch.arange(3))


def test_grad_through_module_and_inplace():
    lin = torch.nn.Linear(4, 3)

    def f(x):
        y = lin(x).relu()
        y = y.clone()
        y.mul_(2)
        return y.sum()
    _check(lambda x: grad(f)(x), torch.randn(2, 4))


# --- vjp / jvp -------------------------------------------------------------------------

@pytest.mark.parametrize("executors", EXECUTORS)
def test_vjp(executors):
    def prog(x, w, ct):
        out, fn = vjp(lambda x, w: torch.tanh(x @ w), x, w)
        gx, gw = fn(ct)
        return out, gx, gw
    x, w, ct = torch.randn(4, 3), torch.randn(3, 2), torch.randn(4, 2)
    _check(prog, x, w, ct, executors=executors)


def test_vjp_has_aux_and_outer_backward():
    def prog(x, ct):
        out, fn, aux = vjp(lambda x: (x.exp(), x.cos()), x, has_aux=True)
        return fn(ct)[0], aux
    _check(prog, torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True), backward=True)


def test_jvp():
    def prog(x, t):
        return jvp(lambda x: (x.sin() * x).cumsum(0), (x,), (t,))
    _check(prog, torch.randn(5), torch.randn(5))

    def two(x, y, tx, ty):
        return jvp(lambda x, y: (x @ y).tanh(), (x, y), (tx, ty))
    _check(two, torch.randn(2, 3), torch.randn(3, 4), torch.randn(2, 3), torch.randn(3, 4))


# --- jacobians --------------------------------------------------------------------------

@pytest.mark.parametrize("transform", [jacrev, jacfwd])
def test_jacobian(transform):
    def f(x, w):
        return torch.tanh(x @ w)
    x, w = torch.randn(3), torch.randn(3, 2)
    _check(lambda x, w: transform(f)(x, w), x, w)
    _check(lambda x, w: transform(f, argnums=(0, 1))(x, w), x, w)


def test_jacfwd_randomness():
    def f(x):
        return x * torch.rand(3)
    with pytest.raises(RuntimeError, match="randomness error mode"):
        thunderlite.jit(lambda x: jacfwd(f)(x))(torch.randn(3))
    with pytest.raises(NotImplementedError, match="reverse mode"):
        thunderlite.jit(lambda x: jacfwd(f, randomness="different")(x))(torch.randn(3))
    jac = thunderlite.jit(lambda x: jacfwd(f, randomness="same")(x))(torch.randn(3))
    assert torch.count_nonzero(jac - torch.diag(torch.diagonal(jac))) == 0


def test_hessian():
    def f(x):
        return (x.sin() * x.pow(2)).sum()
    _check(lambda x: hessian(f)(x), torch.randn(4))


# --- vmap ------------------------------------------------------------------------------

@pytest.mark.parametrize("executors", EXECUTORS)
def test_vmap_basic(executors):
    def f(x, w):
        return torch.tanh(x @ w).sum(0) + w.mean()
    x, w = torch.randn(6, 4, 3), torch.randn(3, 2)
    jfn = _check(lambda x, w: vmap(f, in_dims=(0, None))(x, w), x, w, executors=executors)
    assert "vmap" not in str(thunderlite.last_traces(jfn)[-1]).lower()


def test_vmap_in_dims_out_dims_nested():
    def f(a, b):
        return a * b.unsqueeze(-1) + a.softmax(-1)
    a, b = torch.randn(3, 4, 5), torch.randn(4, 3)
    _check(lambda a, b: vmap(f, in_dims=(0, 1), out_dims=1)(a, b), a, b)
    _check(lambda a: vmap(vmap(lambda r: r.sum() * r))(a), torch.randn(2, 3, 4))
    _check(lambda a, v: vmap(lambda m: m @ v)(a), torch.randn(5, 2, 3), torch.randn(3))
    _check(lambda v, a: vmap(lambda x, y: x @ y)(v, a), torch.randn(5, 2), torch.randn(5, 2, 3))
    _check(lambda a, b: vmap(torch.dot)(a, b), torch.randn(5, 3), torch.randn(5, 3))


def test_vmap_outer_backward():
    def f(x, w):
        return F.gelu(x @ w).sum(-1)
    _check(lambda x, w: vmap(f, in_dims=(0, None))(x, w), torch.randn(4, 3, requires_grad=True),
           torch.randn(3, 2, requires_grad=True), backward=True)


def test_vmap_randomness():
    with pytest.raises(RuntimeError, match="randomness"):
        thunderlite.jit(lambda x: vmap(lambda r: r + torch.rand(()))(x))(torch.randn(3))
    out = thunderlite.jit(lambda x: vmap(lambda r: r * 0 + torch.rand(()), randomness="same")(x))(torch.randn(4))
    assert torch.all(out == out[0])
    out = thunderlite.jit(lambda x: vmap(lambda r: r * 0 + torch.rand(()), randomness="different")(x))(
        torch.randn(64))
    assert out.unique().numel() > 1
    # a composite draw (dropout): one mask per example with "different", one for all with "same"
    ones = torch.ones(8, 100)
    out = thunderlite.jit(lambda x: vmap(lambda r: F.dropout(r, 0.5), randomness="different")(x))(ones)
    assert set(out.unique().tolist()) <= {0.0, 2.0} and (out[0] != out[1]).any()
    out = thunderlite.jit(lambda x: vmap(lambda r: F.dropout(r, 0.5), randomness="same")(x))(ones)
    assert (out == out[0]).all()
    out = thunderlite.jit(lambda x: vmap(lambda r: r * 0 + torch.rand(3), randomness="different")(x))(
        torch.randn(8, 3))
    assert out.shape == (8, 3) and (out[0] != out[1]).any()


def test_vmap_errors_and_out_dims_none():
    with pytest.raises(ValueError, match="same size"):
        thunderlite.jit(lambda a, b: vmap(torch.add)(a, b))(torch.randn(3), torch.randn(4))
    with pytest.raises(ValueError, match="out_dim is None"):
        thunderlite.jit(lambda a: vmap(lambda a: a * 2, out_dims=None)(a))(torch.randn(4, 3))
    _check(lambda a, b: vmap(lambda a, b: (a * 2, b + 1), in_dims=(0, None), out_dims=(0, None))(a, b),
           torch.randn(4, 3), torch.randn(3))


# --- per-sample gradients, functional_call --------------------------------------------

@pytest.mark.parametrize("executors", EXECUTORS)
def test_per_sample_gradients(executors):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))

    def loss(params, x, y):
        out = functional_call(model, params, (x.unsqueeze(0),))
        return F.cross_entropy(out, y.unsqueeze(0))

    def prog(params, x, y):
        return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    params = {k: v.detach() for k, v in model.named_parameters()}
    _check(prog, params, torch.randn(5, 4), torch.randint(0, 3, (5,)), executors=executors)


def test_functional_call_tied_and_buffers():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 3)
            self.b = torch.nn.Linear(3, 3)
            self.b.weight = self.a.weight
            self.register_buffer("scale", torch.tensor(2.0))

        def forward(self, x):
            return self.b(self.a(x)) * self.scale
    m = M()
    x = torch.randn(2, 3)
    new = {"a.weight": torch.randn(3, 3), "scale": torch.tensor(3.0)}
    _check(lambda x, p: functional_call(m, p, (x,)), x, new)
    # the module's own parameters are untouched afterwards
    jfn = thunderlite.jit(lambda x: m(x))
    torch.testing.assert_close(jfn(x), m(x))


def test_functional_call_module_reading_its_slots():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3))
            self.register_buffer("b", torch.ones(3))

        def forward(self, x):
            return x * self._parameters["w"] + sum(p.sum() for p in self.parameters()) + self._buffers["b"]
    m = M()
    _check(lambda x, p: functional_call(m, p, (x,)), torch.randn(3), {"w": torch.randn(3), "b": torch.randn(3)})


def test_jacrev_of_module_params():
    lin = torch.nn.Linear(3, 2)
    params = {k: v.detach() for k, v in lin.named_parameters()}
    _check(lambda p, x: jacrev(lambda p: functional_call(lin, p, (x,)))(p), params, torch.randn(3))


def test_per_sample_gradients_cnn():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 4 * 4, 3))

    def loss(params, x, y):
        return F.cross_entropy(functional_call(model, params, (x.unsqueeze(0),)), y.unsqueeze(0))
    params = {k: v.detach() for k, v in model.named_parameters()}
    _check(lambda p, x, y: vmap(grad(loss), in_dims=(None, 0, 0))(p, x, y), params, torch.randn(3, 1, 6, 6),
           torch.randint(0, 3, (3,)))
    _check(lambda x, w: vmap(lambda xi: F.conv2d(xi, w))(x), torch.randn(3, 2, 1, 6, 6), torch.randn(4, 1, 3, 3))


def test_vmap_views_reductions_indexing():
    idx = torch.tensor([0, 2])
    _check(lambda a, v: vmap(lambda r, vv: r.index_put((idx,), vv, accumulate=True))(a, v),
           torch.randn(3, 4, 2), torch.randn(3, 2, 2))
    _check(lambda a, i: vmap(lambda r, ii: r[ii] * 2)(a, i), torch.randn(3, 5), torch.randint(0, 5, (3, 2)))
    _check(lambda a, i: vmap(lambda r, ii: torch.index_select(r, 0, ii))(a, i), torch.randn(3, 5, 2),
           torch.randint(0, 5, (3, 2)))
    _check(lambda a: vmap(lambda r: r[1:3].T.reshape(-1).flip(0).cumsum(0).max())(a), torch.randn(3, 5, 2))
    _check(lambda a, b: vmap(lambda x, y: torch.cat([x, y]).sort().values + torch.where(x > 0, x, y).sum())(a, b),
           torch.randn(3, 5), torch.randn(3, 5))
    w = torch.randn(4)
    _check(lambda a: vmap(lambda x: F.layer_norm(x, (4,), w).softmax(-1).var())(a), torch.randn(3, 2, 4))


def test_vmap_missing_rule_names_op_and_line():
    with pytest.raises(NotImplementedError, match=r"no batching rule for prims.item .*test_torch_func.py"):
        thunderlite.jit(lambda a: vmap(lambda r: r * r.sum().item())(a))(torch.randn(3, 2))


def test_vjp_tuple_output_called_twice_and_jacrev_has_aux():
    def prog(x, c1, c2):
        out, fn = vjp(lambda x: (x.sin(), x.cos().sum()), x)
        return out, fn((c1, c2)), fn((c1 * 0 + 1, c2))
    _check(prog, torch.randn(3), torch.randn(3), torch.randn(()))
    _check(lambda x: jacrev(lambda x: (x.exp(), x.sum()), has_aux=True)(x), torch.randn(3))


def test_vmap_pytree_dims_and_compositions():
    _check(lambda a, b: vmap(lambda a, b: (a + b, a.sum(), b * 0 + 1), in_dims=(0, None), out_dims=(1, 0, 0))(a, b),
           torch.randn(4, 3), torch.randn(3))
    _check(lambda d: vmap(lambda d: d["a"] * d["b"], in_dims=({"a": 0, "b": None},))(d),
           {"a": torch.randn(4, 3), "b": torch.randn(3)})
    _check(lambda w, X: grad(lambda w: vmap(lambda x: (x @ w).sin().sum())(X).sum())(w), torch.randn(3, 2),
           torch.randn(5, 3))
    _check(lambda X: vmap(jacrev(lambda x: x.sin() * x.sum()))(X), torch.randn(4, 3))
    _check(lambda x: grad(grad(grad(lambda x: x.sin() * x ** 3)))(x), torch.tensor(0.7))


def test_vmap_of_vjp_fn_and_of_jvp():
    def over_cotangents(x, cts):
        _, fn = vjp(lambda x: x.sin() * x, x)
        return vmap(fn)(cts)
    _check(over_cotangents, torch.randn(3), torch.randn(5, 3))
    _check(lambda x: vmap(lambda t: jvp(lambda x: x.sin() * x.sum(), (x,), (t,))[1])(torch.eye(3)), torch.randn(3))


def test_vmap_nn_ops():
    q = torch.randn(2, 3, 4, 8)
    _check(lambda q, k, v: vmap(F.scaled_dot_product_attention)(q, k, v), q, torch.randn_like(q), torch.randn_like(q))
    _check(lambda w, i: vmap(lambda ii: F.embedding(ii, w))(i), torch.randn(10, 4), torch.randint(0, 10, (3, 5)))
    _check(lambda x, w, b: vmap(F.linear, in_dims=(0, None, None))(x, w, b), torch.randn(3, 4, 5), torch.randn(2, 5),
           torch.randn(2))
    _check(lambda X, Y: vmap(F.cross_entropy)(X, Y), torch.randn(4, 3, 5), torch.randint(0, 5, (4, 3)))


def test_write_into_captured_tensor_raises_as_eager():
    bn = torch.nn.BatchNorm1d(3)            # train mode: the running statistics are written
    with pytest.raises(RuntimeError, match="mutate a captured Tensor.*test_torch_func.py"):
        thunderlite.jit(lambda x: grad(lambda x: bn(x).pow(2).sum())(x))(torch.randn(4, 3))
    bn.eval()
    _check(lambda x: grad(lambda x: bn(x).pow(2).sum())(x), torch.randn(4, 3))


def test_write_into_differentiated_input_is_refused():
    def f(x):
        x.mul_(2)
        return x.sum()
    with pytest.raises(NotImplementedError, match="grad at .*test_torch_func.py"):
        thunderlite.jit(lambda x: grad(f)(x))(torch.randn(3))


def test_value_a_later_write_overwrites_is_kept_for_the_backward():
    """Eager raises "modified by an inplace operation"; the gradient is the
    mathematically correct one, as in the program's own backward (split.py)."""
    def f(x):
        y = x * 2
        z = y.sin()
        y.mul_(3)
        return (z + y).sum()

    def reference(x):
        y = x * 2
        return (y.sin() + y * 3).sum()
    x = torch.randn(4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        grad(f)(x)
    torch.testing.assert_close(thunderlite.jit(lambda x: grad(f)(x))(x), grad(reference)(x))


_GLOBAL_GRAD = grad(_loss)
_GLOBAL_VMAP = vmap(torch.dot)


def test_transforms_made_outside_the_jitted_function():
    _check(lambda w, x: _GLOBAL_GRAD(w, x), torch.randn(3, 2), torch.randn(4, 3))
    _check(lambda a, b: _GLOBAL_VMAP(a, b), torch.randn(4, 3), torch.randn(4, 3))


def test_every_prim_has_a_batching_rule():
    from thunderlite.core import prims
    from thunderlite.core.tags import Tag
    from thunderlite.transforms.batching import RULES
    # creation prims never take a batched tensor; random ones follow vmap's randomness; item reads a value
    exempt = {"full", "empty", "iota", "item"}
    missing = [s.id for name, s in prims.all_prims().items()
               if s.id not in RULES and name not in exempt and Tag.RANDOM not in s.tags]
    assert missing == []


# --- tensor hooks inside a transform (the same sweep as the program's backward) -------------

def _hooked(x):
    y = x.sin()
    y.register_hook(lambda g: g * 3)
    y.register_hook(lambda g: g - 1)
    z = y * x
    z.register_hook(lambda g: g * 0.5)
    return z.sum()


def test_grad_of_a_function_registering_hooks_on_intermediates():
    x = torch.randn(4, dtype=torch.float64)
    _check(lambda x: grad(_hooked)(x), x)
    _check(lambda x: vjp(_hooked, x)[1](torch.tensor(2.0, dtype=torch.float64)), x)
    _check(lambda x: jacrev(lambda x: x.sin() * _hooked(x))(x), x)
    _check(lambda x: grad(lambda x: grad(_hooked)(x).pow(2).sum())(x), x)      # through the hooks' math
    _check(lambda x: hessian(_hooked)(x), x)           # jacfwd over the jacrev level the hooks belong to


def test_hooks_on_inputs_outputs_and_captured_tensors_inside_grad():
    calls = []

    def on_input(x):
        x.register_hook(lambda g: g * 7)
        return x.cos().sum()

    def on_output(x):
        out = (x * x).sum()
        out.register_hook(lambda g: g * 5)
        return out

    def python_hook(x):                      # not tensor math: called when the backward runs, as in eager
        y = x.exp()
        y.register_hook(lambda g: calls.append(1) or g + 1)
        return (y * x).sum()
    x = torch.randn(4, dtype=torch.float64)
    for f in (on_input, on_output, python_hook):
        _check(lambda x, f=f: grad(f)(x), x)
    assert len(calls) == 2                   # eager's call and the jitted one

    def captured(x, w):                      # no gradient of grad's level reaches v: the caller's backward runs it
        v = w * 2

        def f(x):
            v.register_hook(lambda g: g * 10)
            return (x * v).sum()
        return grad(f)(x).sum() + v.sum()
    _check(captured, x, torch.randn(4, dtype=torch.float64, requires_grad=True), backward=True)


def test_hook_inside_forward_mode_raises_as_eager():
    x = torch.randn(4, dtype=torch.float64)
    for prog in (lambda x: jvp(_hooked, (x,), (torch.ones_like(x),)), lambda x: jacfwd(_hooked)(x)):
        with pytest.raises(RuntimeError, match="doesn't require gradient"):
            prog(x)
        with pytest.raises(RuntimeError, match="doesn't require gradient.*test_torch_func.py"):
            thunderlite.jit(prog)(x)


def test_second_order_through_backward_kernels():
    # conv, batch_norm and cross_entropy backward kernels differentiated again (PyTorch autograd's
    # double backward) and the statistics a fused forward saves kept differentiable
    x, t = torch.randn(2, 1, 5), torch.tensor([0, 1])
    _check(lambda w: grad(lambda w: grad(lambda w: F.conv1d(x, w).pow(2).sum())(w).pow(2).sum())(w),
           torch.randn(3, 1, 2))
    _check(lambda w: grad(lambda w: grad(lambda z: F.cross_entropy(z, t))(w).pow(2).sum())(w), torch.randn(2, 2))
    _check(lambda w: grad(lambda w: grad(lambda w: F.cross_entropy(w @ w.T, t))(w).pow(2).sum())(w),
           torch.randn(2, 3))
    bn = torch.nn.BatchNorm1d(3).eval()
    _check(lambda x: grad(lambda x: grad(lambda x: bn(x).pow(3).sum())(x).pow(2).sum())(x), torch.randn(4, 3))
    _check(lambda w: grad(lambda w: F.conv1d(x, w).pow(2).sum())(w), torch.randn(3, 1, 2, requires_grad=True),
           backward=True)


def test_forward_mode_and_hessians_through_fused_ops():
    t = torch.tensor([0, 2])
    w = torch.randn(5)
    _check(lambda x, v: jvp(lambda x: F.cross_entropy(x, t), (x,), (v,)), torch.randn(2, 3), torch.randn(2, 3))
    _check(lambda x, v: jvp(lambda x: F.layer_norm(x, (5,), w), (x,), (v,)), torch.randn(2, 5), torch.randn(2, 5))
    _check(lambda w: jacfwd(lambda w: F.conv1d(torch.ones(1, 1, 4), w))(w), torch.randn(2, 1, 2))
    _check(lambda x: hessian(lambda x: F.layer_norm(x, (3,)).pow(3).sum())(x), torch.randn(2, 3))
    _check(lambda x: hessian(lambda x: F.cross_entropy(x, t))(x), torch.randn(2, 3))


def test_gradient_penalty_in_a_jitted_module():
    # WGAN-GP: per-example input gradients inside the forward, then the caller's backward()
    # differentiates them with respect to the parameters
    class GP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.d = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.GELU(),
                                         torch.nn.Linear(8, 1))

        def forward(self, x):
            gx = vmap(grad(lambda xi: self.d(xi).sum()))(x)
            return self.d(x).mean() + ((gx.norm(dim=-1) - 1) ** 2).mean()
    torch.manual_seed(0)
    m = GP()
    jm = thunderlite.jit(copy.deepcopy(m))
    x = torch.randn(5, 4)
    m(x).backward()
    jm(x).backward()
    for p, jp in zip(m.parameters(), jm.parameters(), strict=True):
        torch.testing.assert_close(jp.grad, p.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_per_sample_gradients_and_attention():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).cuda()
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x, y):
        return F.cross_entropy(functional_call(model, p, (x.unsqueeze(0),)), y.unsqueeze(0))
    _check(lambda p, x, y: vmap(grad(loss), in_dims=(None, 0, 0))(p, x, y), params, torch.randn(6, 8, device="cuda"),
           torch.randint(0, 4, (6,), device="cuda"), atol=1e-4, rtol=1e-4)
    q = torch.randn(2, 4, 16, 64, device="cuda", dtype=torch.float16)
    _check(lambda q: grad(lambda q: F.scaled_dot_product_attention(q, q, q).float().sum())(q), q, atol=2e-2, rtol=2e-2)
    _check(lambda q: vmap(F.scaled_dot_product_attention)(q, q, q), q, atol=2e-2, rtol=2e-2)


def test_functional_call_after_the_program_read_the_parameters():
    """``named_parameters()`` before ``functional_call`` makes the program hold a
    copy of the module's ``_parameters``; the call's overlay must still win (it
    read the module's own parameters: a zero gradient, silently)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))

    def step(model, x, y):
        params = {k: v.detach() * 2 for k, v in model.named_parameters()}

        def loss_fn(params, x, y):
            return F.cross_entropy(functional_call(model, params, (x,)), y)
        return grad(loss_fn)(params, x, y), model[0].weight.sum()

    want = step(model, x, y)
    got = thunderlite.jit(step)(model, x, y)
    torch.testing.assert_close(got, want)
