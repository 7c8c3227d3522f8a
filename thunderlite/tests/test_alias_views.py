"""Writes through views the alias model must see (issue 9): ``detach``,
``.data``, ``as_strided``, ``view_as_real``/``view_as_complex``, ``unflatten``,
``unbind``, ``split``, ``narrow``, ``alias``, ops whose schema under-states their
aliasing (``unsafe_split``, ``sum_to_size``), a module buffer updated through
``detach()``, shadow parameters updated under ``torch.no_grad()`` inside
``forward``, an EMA target network.

Each program is compared with eager PyTorch: outputs, every input and the
module state after the call, gradients where inputs require grad. Each runs with
the default executors, with a fusion executor that reorders the trace at random
(so the order of a write and the reads around it is carried by the trace's
dependencies alone), and a few with ``executors=["torchcompile", "torch"]``.

The alias facts themselves are read from ATen schemas (core/aliasing.py);
the last tests check where they come from."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import thunderlite
from thunderlite.core import prims
from thunderlite.core.aliasing import SchemaAliases, callable_aliases, returns_annotated, views
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import Symbol
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion

# --- programs -------------------------------------------------------------------------------


def ema_detach(w, x):
    w.detach().mul_(0.9)
    w.detach().add_(x, alpha=0.1)
    return x * 2


def ema_then_use(w, x):
    w.detach().mul_(0.9)
    return (w * x).sum(), w.detach() + 1


def read_around_detach_write(w, x):
    before = w.sin()
    d = w.detach()
    d.mul_(0.5)
    return before, w.cos() + x


def data_add(p, x):
    p.data.add_(x)
    return p.sum()


def as_strided_add(x):
    x.as_strided((2, 2), (1, 2)).add_(1)
    x.as_strided((2,), (3,), 1).zero_()
    return x * 1


def view_as_real_zero(c):
    torch.view_as_real(c)[..., 1].zero_()
    return c.abs()


def view_as_complex_mul(x):
    torch.view_as_complex(x).mul_(2)
    return x + 0


def unflatten_write(x):
    u = x.unflatten(0, (2, 2))
    u[0].add_(1)
    return x.sin()


def unbind_write(x):
    a, b = x.unbind(0)
    a.mul_(2)
    return x + 0, b * 1


def split_write(x):
    a, b = x.split(2)
    b.zero_()
    return x * 1, a + 1


def narrow_write(x):
    x.narrow(0, 1, 2).add_(5)
    return x.cos()


def detach_setitem(x):
    d = x.detach()
    d[0] = 7
    return x * 1


def aten_alias(x):
    torch.ops.aten.alias(x).add_(1)
    return x * 1


def unsafe_split_write(x):
    x.unsafe_split(2)[1].fill_(3)
    return x * 1


def sum_to_size_write(x):
    x.sum_to_size(x.shape).mul_(3)
    return x - 1


def chained_views(x):
    v = x.detach().unflatten(1, (2, 2)).narrow(2, 0, 1)
    v.add_(10)
    return x.sum(1)


PROGRAMS = {
    "ema_detach": (ema_detach, lambda: (torch.randn(4), torch.randn(4))),
    "ema_then_use": (ema_then_use, lambda: (torch.randn(4), torch.randn(4))),
    "read_around_detach_write": (read_around_detach_write, lambda: (torch.randn(3, 2), torch.randn(3, 2))),
    "data_add": (data_add, lambda: (torch.randn(4), torch.randn(4))),
    "as_strided_add": (as_strided_add, lambda: (torch.randn(6),)),
    "view_as_real_zero": (view_as_real_zero, lambda: (torch.randn(4, dtype=torch.complex64),)),
    "view_as_complex_mul": (view_as_complex_mul, lambda: (torch.randn(3, 2),)),
    "unflatten_write": (unflatten_write, lambda: (torch.randn(4, 3),)),
    "unbind_write": (unbind_write, lambda: (torch.randn(2, 3),)),
    "split_write": (split_write, lambda: (torch.randn(4, 3),)),
    "narrow_write": (narrow_write, lambda: (torch.randn(4, 3),)),
    "detach_setitem": (detach_setitem, lambda: (torch.randn(4, 3),)),
    "aten_alias": (aten_alias, lambda: (torch.randn(4, 3),)),
    "unsafe_split_write": (unsafe_split_write, lambda: (torch.randn(4, 3),)),
    "sum_to_size_write": (sum_to_size_write, lambda: (torch.randn(4, 3),)),
    "chained_views": (chained_views, lambda: (torch.randn(3, 4),)),
}


class RunningBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("running", torch.zeros(3))

    def forward(self, x):
        y = self.lin(x)
        self.running.detach().mul_(0.9).add_(y.mean(0).detach(), alpha=0.1)
        return y


class ShadowParameters(torch.nn.Module):
    """Shadow weights updated under no_grad inside forward, then used."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.shadow = torch.nn.Linear(3, 3)

    def forward(self, x):
        with torch.no_grad():
            for p, s in zip(self.lin.parameters(), self.shadow.parameters(), strict=True):
                s.mul_(0.5).add_(p, alpha=0.5)
        return self.lin(x) + self.shadow(x)


class EMATarget(torch.nn.Module):
    """The target-network update of self-supervised / RL code: in place through detach()."""

    def __init__(self):
        super().__init__()
        self.online = torch.nn.Linear(4, 4)
        self.target = torch.nn.Linear(4, 4)

    def forward(self, x):
        for t, o in zip(self.target.parameters(), self.online.parameters(), strict=True):
            t.detach().mul_(0.99).add_(o.detach(), alpha=0.01)
        return (self.online(x) - self.target(x)).pow(2).mean()


class DataUpdate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        self.lin.weight.data.mul_(0.5)
        return self.lin(x).sum()


MODULES = {"running_buffer": RunningBuffer, "shadow_parameters": ShadowParameters, "ema_target": EMATarget,
           "data_update": DataUpdate}

# --- checking -------------------------------------------------------------------------------

EXECUTORS = {"default": lambda: None, "reordering0": lambda: [ShuffleFusion(0)],
             "reordering1": lambda: [ShuffleFusion(1)], "reordering2": lambda: [ShuffleFusion(2)]}


def _jit(fn, executors):
    return thunderlite.jit(fn) if executors is None else thunderlite.jit(fn, executors=executors)


def _leaves(args, requires_grad: bool):
    return tuple(a.clone().requires_grad_(requires_grad and a.is_floating_point()) for a in args)


def check_program(fn, make, executors, requires_grad: bool = False) -> None:
    torch.manual_seed(0)
    base = make()
    ref, ours = _leaves(base, requires_grad), _leaves(base, requires_grad)
    # eager's in-place writes into a leaf that requires grad go through detach()/.data:
    # compare the leaves themselves afterwards
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = fn(*ref)
        got = _jit(fn, executors)(*ours)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(tuple(a.detach() for a in ours), tuple(a.detach() for a in ref))
    if requires_grad:
        _backward(expected)
        _backward(got)
        for o, r in zip(ours, ref, strict=True):
            torch.testing.assert_close(o.grad, r.grad)


def _backward(out) -> None:
    outs = out if isinstance(out, tuple) else (out,)
    total = sum((o.float().sum() if not o.is_complex() else o.abs().sum()) for o in outs if o.requires_grad)
    if isinstance(total, torch.Tensor):
        total.backward()


def check_module(cls, executors, x_shape) -> None:
    torch.manual_seed(0)
    ref = cls()
    ours = copy.deepcopy(ref)
    x = torch.randn(*x_shape)
    jm = _jit(ours, executors)
    for _ in range(2):                      # the second call runs the cached program
        expected = ref(x)
        got = jm(x)
        torch.testing.assert_close(got, expected)
        for (name, r), (_, o) in zip(ref.state_dict().items(), ours.state_dict().items(), strict=True):
            torch.testing.assert_close(o, r, msg=lambda m: f"{name}: {m}")
        if expected.requires_grad:
            expected.sum().backward()
            got.sum().backward()
            for (name, r), (_, o) in zip(ref.named_parameters(), ours.named_parameters(), strict=True):
                torch.testing.assert_close(o.grad, r.grad, msg=lambda m: f"grad of {name}: {m}")


@pytest.mark.parametrize("executors", list(EXECUTORS))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_write_through_view_matches_eager(name, executors):
    fn, make = PROGRAMS[name]
    check_program(fn, make, EXECUTORS[executors]())


_GRAD_PROGRAMS = ["ema_detach", "ema_then_use", "data_add", "detach_setitem", "chained_views"]


@pytest.mark.parametrize("executors", ["default", "reordering0"])
@pytest.mark.parametrize("name", _GRAD_PROGRAMS)
def test_write_through_detached_view_of_leaf_requiring_grad(name, executors):
    """Writes through detach()/.data into a leaf that requires grad are allowed
    (eager's EMA update); the gradient sees the values the program read."""
    fn, make = PROGRAMS[name]
    check_program(fn, make, EXECUTORS[executors](), requires_grad=True)


_X_SHAPE = {"running_buffer": (2, 3), "shadow_parameters": (2, 3), "ema_target": (2, 4), "data_update": (2, 3)}


@pytest.mark.parametrize("executors", list(EXECUTORS))
@pytest.mark.parametrize("name", list(MODULES))
def test_module_state_written_through_views_matches_eager(name, executors):
    check_module(MODULES[name], EXECUTORS[executors](), _X_SHAPE[name])


_TORCHCOMPILE = ["torchcompile", "torch"]


@pytest.mark.parametrize("name", ["read_around_detach_write", "split_write", "view_as_real_zero"])
def test_write_through_view_with_torchcompile(name):
    fn, make = PROGRAMS[name]
    check_program(fn, make, _TORCHCOMPILE)


def test_ema_target_with_torchcompile():
    check_module(EMATarget, _TORCHCOMPILE, _X_SHAPE["ema_target"])


# --- where the facts come from --------------------------------------------------------------


def _bsyms(fn, *args):
    jfn = thunderlite.jit(fn)
    jfn(*args)
    return thunderlite.last_traces(jfn)[0].bound_symbols


def test_opaque_view_ops_alias_their_input():
    x = torch.randn(4, 2)
    for fn in (lambda a: a.detach(), lambda a: a.data, lambda a: torch.view_as_complex(a),
               lambda a: a.as_strided((2,), (1,))):
        b = _bsyms(fn, x)[0]
        assert [(o.name, i.name) for o, i in views(b)] == [(b.output.name, "a")], b


def test_opaque_fresh_ops_do_not_alias():
    b = _bsyms(lambda a: torch.special.i1(a), torch.randn(3))[0]
    assert views(b) == []


def test_torch_language_facts_come_from_schemas():
    """A view symbol aliases its input because its ATen schema says ``Tensor(a)``."""
    bs = _bsyms(lambda a: (a.narrow(0, 0, 1), a.unflatten(0, (2, 2)), a + 1, a.unbind(1)), torch.randn(4, 2))
    by_name = {b.sym.name: b for b in bs}
    assert all(i.name == "a" for _, i in views(by_name["narrow"])) and views(by_name["narrow"])
    assert views(by_name["unflatten"]) and views(by_name["unbind"])
    assert views(by_name["add"]) == []
    assert callable_aliases(torch.Tensor.narrow).positions == {0}
    assert callable_aliases(torch.sin).positions == set()


def test_schema_text_says_which_returns_are_annotated():
    """The facts skip a schema whose printed returns carry no alias annotation
    without walking its objects: the text must say so exactly for every schema
    (a return read as unannotated that has an annotation would lose a view), and
    the facts of every op read both ways agree."""
    ops = set()
    for schema in torch._C._jit_get_all_schemas():
        text = str(schema)
        annotated = any(r.alias_info is not None for r in schema.returns)
        assert not annotated or returns_annotated(text), text
        if text.startswith("aten::"):
            ops.add(schema.name.partition("::")[2])
    for name in sorted(ops):
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{name}")
        walked, skipped = SchemaAliases(schemas), SchemaAliases(schemas, tuple(str(s) for s in schemas))
        assert (walked.positions, walked.names) == (skipped.positions, skipped.names), name


def test_prim_facts_come_from_their_aten_op():
    trc = Trace()
    with tracectx(trc):
        a = TensorProxy((2, 3), name="a")
        r = prims.reshape(a, (3, 2))
        s = prims.sin(a)
        c = prims.convert_element_type(a, torch.float64)
    reshape, sin, convert = trc.bound_symbols
    assert [(o.name, i.name) for o, i in views(reshape)] == [(r.name, "a")]
    assert views(sin) == [] and s is sin.output
    assert views(convert) == [] and c is convert.output   # aten::_to_copy: always fresh
    assert prims.aten_op_of(prims.broadcast_in_dim) == "expand"


def test_undecidable_leaf_may_alias_every_input():
    """A leaf nobody can say anything about is never taken for fresh memory."""
    mystery = Symbol("mystery", meta=lambda a, b: TensorProxy(a.shape), module="test")
    trc = Trace()
    with tracectx(trc):
        a, b = TensorProxy((2,), name="a"), TensorProxy((2,), name="b")
        out = mystery(a, b)
    assert {(o.name, i.name) for o, i in views(trc.bound_symbols[0])} == {(out.name, "a"), (out.name, "b")}


def test_write_after_dtype_change_is_no_view_write():
    """``to``'s schema says it may alias, but with a new dtype it is fresh: a
    write into the result is neither eager's "view of a leaf" error nor a
    reason to leave the functional backward (the decomposition decides)."""
    def f(x, w):
        h = (x @ w).to(torch.float64)
        h.mul_(2)
        y = x.double()
        y.add_(1)
        z = (x * 1).float()
        z.mul_(3)
        return h.sum() + y.sum() + z.sum()
    check_program(f, lambda: (torch.randn(3, 3), torch.randn(3, 3)), None, requires_grad=True)
    jf = thunderlite.jit(f)
    jf(torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)).backward()
    assert thunderlite.last_backward_traces(jf)


def test_write_into_same_dtype_to_of_leaf_raises_as_eager():
    """``x.float()`` of a float32 leaf is the leaf itself: eager refuses the write."""
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x.float().add_(1)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        thunderlite.jit(lambda a: a.float().add_(1))(x)
