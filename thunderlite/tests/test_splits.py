"""Split, don't refuse (docs/architecture.md §16): where a program needs a
traced value in Python, it is compiled as pieces split there, each path of
values compiled once; checked against eager over several calls that take
different paths (results, parameters, ``.grad``, buffers, optimizer state,
Python state), with the default and the torchcompile executors."""
from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thunderlite
from thunderlite.core.proxies import DataDependentError

EXECUTORS = {"default": None, "torchcompile": ["torchcompile", "torch"]}
TOL = dict(rtol=1e-5, atol=1e-5)


def _same(got, want, where="result", tol=None):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == want.shape, where
        assert got.requires_grad == want.requires_grad, where
        torch.testing.assert_close(got.detach(), want.detach(), equal_nan=True, **(tol or TOL),
                                   msg=lambda m: f"{where}: {m}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]", tol)
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            _same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, float):
        assert type(got) is float and (math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6)
                                       or math.isnan(got) and math.isnan(want)), (where, got, want)
    else:
        assert type(got) is type(want) and got == want, (where, got, want)


def _state(model: nn.Module, opt=None) -> dict:
    out = {n: p.detach().clone() for n, p in model.named_parameters()}
    out.update({f"{n}.grad": p.grad.clone() if p.grad is not None else None for n, p in model.named_parameters()})
    out.update({n: b.clone() for n, b in model.named_buffers()})
    if opt is not None:
        out["opt"] = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in opt.state[p].items()}
                      for p in model.parameters()]
    return out


def _same_state(got, want, where, tol=None):
    for k in want:
        if want[k] is None:
            assert got[k] is None, f"{where}: {k} is not None"
        else:
            _same(got[k], want[k], f"{where}: {k}", tol)


def _paths(jfn) -> int:
    return thunderlite.cache_info(jfn)["splits"]["paths"]


# --- each construct, over calls that take different paths ------------------------------------------

def branch_on_tensor(x):
    if x.sum() > 0:
        return x * 2
    return x - 1


def while_on_norm(x):
    n = 0
    while x.norm() > 1:
        x = x / 2
        n += 1
    return x, n


def item_compared(x):
    v = x.max().item()
    if v > 1.5:
        return x * v, "big"
    return x + v, "small"


def float_decided(x):
    s = float(x.sum())
    return x * (2.0 if s > 0 else 3.0) + s


def int_as_index(x, table):
    i = int(x.argmax())
    return table[i] * x


def list_indexed_by_tensor(x, table):
    return table[x.argmin()] + x


def tolist_loop(x):
    acc = 0.0
    for v in x.tolist():
        if v > 0:
            acc += v
    return x * acc


def formatted(x):
    m = x.mean()
    return x * 2, f"{m.item():.3f}", str(x.sum().item() > 0), f"{m}"


def early_exit(x):
    for i in range(4):
        x = x * 2 - 1
        if (x > 5).any():
            return x, i
    return x, -1


def builtins_on_tensors(x):
    a = max(x.sum(), x.mean())
    b = any(t > 1 for t in x)
    c = bool(x[0] > 0) and all(t > -5 for t in x)
    return a * 2, b, c, math.isclose(x.sum().item(), 0.0, abs_tol=1e-6)


def torch_equal(x):
    if torch.equal(x, x.abs()):
        return x
    return -x


def size_from_data(x):
    y = x[x > 0]
    if y.shape[0] >= 2:
        return y * 2
    return y - 1


def sizes_decided_in_ops(x):
    y = x[x > -10] + x                        # broadcasting a run-time size against 3
    return y, x[x.argmax().item()]             # indexing a tensor with an item()


INPUTS = [torch.tensor([0.5, -1.0, 2.0]), torch.tensor([-3.0, 1.0, 0.25]), torch.tensor([4.0, 3.0, 1.0]),
          torch.tensor([0.5, -1.0, 2.0]), torch.tensor([-0.5, -1.0, -2.0])]
TABLE = [10.0, 20.0, 30.0]
PROGRAMS = {
    "branch_on_tensor": (branch_on_tensor, ()), "while_on_norm": (while_on_norm, ()),
    "item_compared": (item_compared, ()), "float_decided": (float_decided, ()),
    "int_as_index": (int_as_index, (TABLE,)), "list_indexed_by_tensor": (list_indexed_by_tensor, (TABLE,)),
    "tolist_loop": (tolist_loop, ()), "formatted": (formatted, ()), "early_exit": (early_exit, ()),
    "builtins_on_tensors": (builtins_on_tensors, ()), "torch_equal": (torch_equal, ()),
    "size_from_data": (size_from_data, ()), "sizes_decided_in_ops": (sizes_decided_in_ops, ()),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_construct_equals_eager_over_paths(name):
    fn, extra = PROGRAMS[name]
    jfn = thunderlite.jit(fn)
    for i, x in enumerate(INPUTS):
        _same(jfn(x.clone(), *extra), fn(x.clone(), *extra), f"{name} call {i}")
    info = thunderlite.cache_info(jfn)
    assert info["misses"] == 1, info        # new paths resume the one entry, they do not recompile it
    assert info["splits"]["paths"] >= 2 or name in ("int_as_index",), info


def test_each_path_compiles_once():
    jfn = thunderlite.jit(branch_on_tensor)
    for _ in range(3):
        for x in (torch.ones(3), -torch.ones(3)):
            _same(jfn(x), branch_on_tensor(x))
    assert _paths(jfn) == 2
    assert thunderlite.cache_info(jfn)["splits"]["resumed"] == 1


def test_torchcompile_executor():
    jfn = thunderlite.jit(float_decided, executors=EXECUTORS["torchcompile"])
    for x in INPUTS[:3]:
        _same(jfn(x), float_decided(x))
    assert any(b.sym.executor is not None and b.sym.executor.name == "torchcompile"
               for t in thunderlite.last_traces(jfn) for b in t.bound_symbols)


# --- autodiff across the pieces ---------------------------------------------------------------------

class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 2)

    def forward(self, x):
        h = self.a(x)
        if h.mean() > 0:            # the split: each branch differentiates through what came before
            h = torch.tanh(h) * 2
        else:
            h = torch.relu(h) - 1
        return self.b(h).pow(2).mean()


@pytest.mark.parametrize("executors", ["default", "torchcompile"])
def test_gradients_flow_through_the_pieces_to_a_backward_outside(executors):
    torch.manual_seed(0)
    model, ref = Gate(), None
    ref = copy.deepcopy(model)
    jm = thunderlite.jit(model, executors=EXECUTORS[executors])
    g = torch.Generator().manual_seed(1)
    for i, shift in enumerate((2.0, -2.0, 2.0)):
        x = torch.randn(5, 4, generator=g) + shift * torch.sign(model.a.weight.detach().sum(0))
        xr = x.clone().requires_grad_()
        x.requires_grad_()
        loss, want = jm(x), ref(xr)
        loss.backward()
        want.backward()
        _same(loss, want, f"call {i}")
        _same(x.grad, xr.grad, f"call {i}: x.grad")
        _same_state(_state(model), _state(ref), f"call {i}")
    assert _paths(jm) == 2


def _train_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def step_finite_after_backward(model, opt, x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    if torch.isfinite(loss):
        opt.step()
    return loss.detach()


def step_backward_after_split(model, opt, x, y, log):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    log.append(loss.item())
    if loss.item() > 0.9:           # a backward after the split differentiates the first piece's forward
        loss.backward()
        opt.step()
    else:
        (loss * 0.5).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
    return loss


def step_finite_before_backward(model, opt, x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    if torch.isfinite(loss):
        loss.backward()
        opt.step()
    return loss.item()


STEPS = {"finite_after_backward": step_finite_after_backward, "backward_after_split": step_backward_after_split,
         "finite_before_backward": step_finite_before_backward}


def _step_data(calls=4):
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)) for _ in range(calls)]
    data[2][0][0, 0] = float("nan")      # one call takes the other path
    return data


@pytest.mark.parametrize("executors", ["default", "torchcompile"])
@pytest.mark.parametrize("name", sorted(STEPS))
def test_whole_step_with_the_backward_inside(name, executors):
    step = STEPS[name]
    model = _train_model()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    jstep = thunderlite.jit(step, executors=EXECUTORS[executors])
    for i, (x, y) in enumerate(_step_data()):
        extra, ref_extra = (([],), ([],)) if name == "backward_after_split" else ((), ())
        got = jstep(model, opt, x.clone(), y, *extra)
        want = step(ref, ref_opt, x.clone(), y, *ref_extra)
        _same(got, want, f"call {i}")
        _same(list(extra), list(ref_extra), f"call {i}: the log")
        _same_state(_state(model, opt), _state(ref, ref_opt), f"call {i}")
    if name != "finite_after_backward":     # that block only writes tensors: predicated once SGD has its state
        assert _paths(jstep) >= 2


@pytest.mark.parametrize("executors", ["default", "torchcompile"])
def test_lbfgs_with_a_closure_equals_eager_over_three_calls(executors):
    """``torch.optim.LBFGS.step`` reads ``float(closure())`` and decides on
    tensors (``if opt_cond``, ``min(1.0, ...)``): pieces, equal to eager."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    ref = copy.deepcopy(model)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    ref_opt = torch.optim.LBFGS(ref.parameters(), lr=0.5, max_iter=4)
    x, y = torch.randn(8, 4), torch.randn(8, 1)

    def step(model, opt, x, y):
        def closure():
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss
        return opt.step(closure)
    jstep = thunderlite.jit(step, executors=EXECUTORS[executors])
    # Inductor's fused reductions round differently; LBFGS's line search carries it further
    tol = dict(atol=1e-4, rtol=1e-4) if executors == "torchcompile" else None
    for i in range(3):
        _same(jstep(model, opt, x, y), step(ref, ref_opt, x, y), f"call {i}", tol)
        _same_state(_state(model), _state(ref), f"call {i}", tol)
        for p, r in zip(model.parameters(), ref.parameters(), strict=True):
            st, rst = opt.state[p], ref_opt.state[r]
            assert sorted(st) == sorted(rst)
            for k in rst:
                _same(st[k], rst[k], f"call {i}: state[{k!r}]", tol)


# --- side effects: once, in eager's order -------------------------------------------------------------

class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(3))
        self.calls = 0
        self.history = []

    def forward(self, x):
        self.buf.add_(x)                 # a write before the split
        self.calls += 1
        self.history.append(self.calls)
        if self.buf.sum() > 2:           # the split reads the written buffer
            self.buf.mul_(0.5)
            self.last = "halved"
        else:
            self.last = "kept"
        self.buf.add_(1)                 # a write after it
        return self.buf * x


def test_writes_happen_once_in_eagers_order():
    """A buffer written before and after the split, a Python counter and list:
    each write once, the split reading the written buffer, over calls that
    take both paths (``calls`` changes on every call: each call recompiles)."""
    m = Counter()
    ref = copy.deepcopy(m)
    jm = thunderlite.jit(m)
    taken = set()
    for i, x in enumerate([torch.ones(3) * 0.1, torch.ones(3), -torch.ones(3) * 3, torch.ones(3) * 0.1]):
        _same(jm(x), ref(x), f"call {i}")
        _same(m.buf, ref.buf, f"call {i}: buf")
        assert (m.calls, m.history, m.last) == (ref.calls, ref.history, ref.last), i
        taken.add(m.last)
    assert taken == {"halved", "kept"}


def test_the_programs_own_exception_after_a_split_leaves_earlier_writes():
    def f(buf, x):
        buf.add_(1)
        if x.sum() > 0:
            raise ValueError("positive")
        return buf * x
    jf = thunderlite.jit(f)
    buf, ref = torch.zeros(2), torch.zeros(2)
    _same(jf(buf, -torch.ones(2)), f(ref, -torch.ones(2)))
    for b in (buf, ref):
        with pytest.raises(ValueError, match="positive"):
            (jf if b is buf else f)(b, torch.ones(2))
    _same(buf, ref, "buf")


class Raiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.zeros(2))
        self.count = 0

    def forward(self, x):
        self.buf.add_(1)                 # the first piece's write
        if x.sum() > 0:
            self.count += 1              # Python-side, in the last piece, before the raise
            self.buf.mul_(2)             # a tensor write in the last piece, before the raise
            raise ValueError("positive")
        return self.buf * x


def test_the_programs_own_exception_after_a_split_leaves_the_writes_before_it():
    m = Raiser()
    ref = copy.deepcopy(m)
    jm = thunderlite.jit(m)
    for i, x in enumerate([-torch.ones(2), torch.ones(2), torch.ones(2), -torch.ones(2)]):
        for mod in (jm, ref):
            if x.sum() > 0:
                with pytest.raises(ValueError, match="positive"):
                    mod(x)
            else:
                mod(x)
        _same(m.buf, ref.buf, f"call {i}: buf")
        assert m.count == ref.count, i


def test_a_guard_of_a_later_piece_recompiles_only_that_piece():
    scale = {"v": 2.0}

    def f(x):
        if x.sum() > 0:
            return x * scale["v"]        # read only after the split
        return x

    jf = thunderlite.jit(f)
    _same(jf(torch.ones(2)), torch.ones(2) * 2)
    scale["v"] = 3.0
    _same(jf(torch.ones(2)), torch.ones(2) * 3)
    _same(jf(-torch.ones(2)), -torch.ones(2))
    assert thunderlite.cache_info(jf)["misses"] == 1


# --- the bound, the strict option, what users see -----------------------------------------------------

def test_paths_are_bounded_then_the_callable_runs_eagerly():
    def f(x):
        return x * 2, f"{x.sum().item():.2f}"     # a new text, a new path, on every call
    jf = thunderlite.jit(f, splits=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(5):
            x = torch.full((2,), float(i))
            _same(jf(x), f(x), f"call {i}")
    info = thunderlite.cache_info(jf)["splits"]
    assert info["resumed"] == 2 and "running eagerly" in info["eager"], info
    assert sum("running eagerly" in str(w.message) for w in caught) == 1


def test_strict_option_keeps_the_error():
    with pytest.raises(DataDependentError, match=r"test_splits.py:\d+: if x.sum\(\) > 0"):
        thunderlite.jit(branch_on_tensor, splits=False)(torch.ones(2))
    with pytest.raises(ValueError, match="splits"):
        thunderlite.jit(branch_on_tensor, splits=0)


def test_each_split_is_shown_with_its_line_and_why(tmp_path):
    jf = thunderlite.jit(branch_on_tensor)
    jf(torch.ones(3))
    jf(-torch.ones(3))
    traces = thunderlite.last_traces(jf)
    text = "\n".join(str(t) for t in traces)
    assert "piece 1: runs from the start up to the split at" in text
    assert "piece 2: runs after the split at" in text and "(value False)" in text
    assert "if x.sum() > 0" in text and "truth value" in text
    assert "x - 1" in str(traces[-1]) and "x * 2" not in text
    report = thunderlite.examine(branch_on_tensor, -torch.ones(3))
    assert report.splits and "if x.sum() > 0" in report.splits[0] and "False" in report.splits[0]
    assert "split into 2 pieces" in str(report)
    html = open(thunderlite.trace_report(jf, tmp_path / "r.html")).read()
    assert "piece 2: runs after the split at" in html


def test_a_decision_on_number_arguments_alone_does_not_split():
    """Numbers passed in (``cache='symbolic values'``) are known when the call
    starts: deciding on them specializes, as before, and never splits."""
    def f(x, k):
        return x * k if k > 1.0 else x - k
    jf = thunderlite.jit(f, cache="symbolic values")
    with pytest.warns(UserWarning, match="symbolic"):
        _same(jf(torch.ones(2), 2.0), torch.ones(2) * 2)
    assert thunderlite.cache_info(jf)["splits"]["paths"] == 0


def test_inside_a_torch_func_transform_it_still_raises_naming_the_line():
    """A split cuts the program between its own statements: inside a function a
    torch.func transform records (a scratch trace of its own) it cannot, and
    the error names the line."""
    def f(x):
        def inner(y):
            return y.sum() if y.sum() > 0 else -y.sum()
        return torch.func.grad(inner)(x)
    with pytest.raises(DataDependentError, match=r"test_splits.py:\d+: return y.sum\(\) if y.sum\(\) > 0"):
        thunderlite.jit(f)(torch.ones(3))


def test_symbolic_sizes_across_pieces():
    """A size guard recorded after the split is the later piece's (a failed
    one compiles an alternative for the same value), sizes stay symbolic."""
    def f(x, y):
        if x.sum() > 0:
            if y.shape[0] > 4:
                return x[: y.shape[0] // 2] * 2
            return x * 3
        return x
    jf = thunderlite.jit(f, dynamic=True)
    for n in (5, 3, 6, 2, 5):
        for s in (1.0, -1.0):
            x, y = torch.full((8,), s), torch.ones(n)
            _same(jf(x, y), f(x, y), f"n={n} s={s}")
    info = thunderlite.cache_info(jf)
    assert info["misses"] == 1 and info["splits"]["paths"] == 3, info


def test_threads_take_new_paths_at_once():
    """Calls from several threads that leave the tree at the same split resume
    one at a time; each gets eager's answer, each path is compiled once."""
    import threading
    jf = thunderlite.jit(while_on_norm)
    jf(torch.ones(3) * 0.1)
    inputs = [torch.full((3,), float(s)) for s in (0.5, 2.0, 5.0, 9.0) for _ in range(3)]
    results: dict = {}

    def call(i, x):
        results[i] = jf(x.clone())
    threads = [threading.Thread(target=call, args=(i, x)) for i, x in enumerate(inputs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x in enumerate(inputs):
        _same(results[i], while_on_norm(x.clone()), f"thread {i}")
    counts = {while_on_norm(x.clone())[1] for x in [torch.ones(3) * 0.1, *inputs]}     # one path per count
    assert _paths(jf) == len(counts) == 3, thunderlite.cache_info(jf)
