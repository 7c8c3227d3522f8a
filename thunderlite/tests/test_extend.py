"""The extension API (issue 10): ``thunderlite.extend``, executor priority in
the user's order, implementations used wherever their op runs (with and
without grad, in the backward), grad_transform / execution_transform,
``examine``'s unused implementations, and ``jit(fn, transforms=[...])``."""
import pytest
import torch

import thunderlite
from thunderlite.core import prims
from thunderlite.core.tags import Tag
from thunderlite.core.verify import verify_trace
from thunderlite.executors import torchcompile_executor
from thunderlite.extend import (
    FusionExecutor,
    OperatorExecutor,
    Transform,
    add_default_executor,
    get_all_executors,
    get_default_executors,
    get_executor,
    get_grad,
    put_grad,
    register_executor,
    remove_default_executor,
)


def _counting(name: str, fn, calls: list):
    def impl(*args, **kwargs):
        calls.append(name)
        return fn(*args, **kwargs)
    impl.__name__ = name
    return impl


def _executors_in(trace) -> set[str]:
    return {b.sym.executor.name for b in trace.bound_symbols if b.sym.executor is not None}


def _sin_chain(a):
    return (a * 2).sin().sum()


def _run_with_and_without_grad(jfn, a):
    """(no-grad output, grad output, its gradient)."""
    with torch.no_grad():
        plain = jfn(a)
    ar = a.clone().requires_grad_()
    out = jfn(ar)
    out.backward()
    return plain, out, ar.grad


# --- the public module ----------------------------------------------------------------

def test_extend_exports_the_thunder_names():
    import thunderlite.extend as extend
    for name in ("OperatorExecutor", "FusionExecutor", "Transform", "register_executor", "get_executor",
                 "get_default_executors", "add_default_executor", "remove_default_executor", "get_all_executors"):
        assert name in extend.__all__ and hasattr(extend, name), name
    assert thunderlite.extend is extend
    assert issubclass(type(torchcompile_executor), FusionExecutor)


def test_default_list_can_be_changed_and_restored():
    myex = OperatorExecutor("ext_default")
    assert myex not in get_all_executors()
    add_default_executor(myex)
    try:
        assert get_default_executors()[0] is myex and get_executor("ext_default") is myex
        assert myex in get_all_executors()
        calls: list = []
        myex.register_implementation("ltorch.sin", _counting("sin", torch.sin, calls))
        jfn = thunderlite.jit(lambda a: a.sin())                 # no executors=: the defaults
        jfn(torch.randn(3))
        assert calls == ["sin"]
    finally:
        remove_default_executor(myex)
    assert myex not in get_default_executors() and get_executor("ext_default") is myex
    with pytest.raises(ValueError, match="always in the executor list"):
        remove_default_executor("torch")
    with pytest.raises(ValueError, match="not a default executor"):
        remove_default_executor(myex)


# --- implementations run wherever their op runs ------------------------------------------

def test_prim_implementation_runs_with_and_without_grad_and_in_the_backward():
    calls: list = []
    myex = OperatorExecutor("ext_prim_sin")
    myex.register_implementation(prims.sin, _counting("sin", torch.sin, calls))
    myex.register_implementation(prims.cos, _counting("cos", torch.cos, calls))
    jfn = thunderlite.jit(_sin_chain, executors=[myex])
    a = torch.randn(5)
    with torch.no_grad():
        torch.testing.assert_close(jfn(a), _sin_chain(a))
    assert calls == ["sin"]                       # ltorch.sin was decomposed so that prims.sin is myex's
    calls.clear()
    ar = a.clone().requires_grad_()
    out = jfn(ar)
    assert calls == ["sin"]
    out.backward()
    assert calls == ["sin", "cos"]                # sin's backward uses prims.cos: myex runs it
    torch.testing.assert_close(ar.grad, 2 * torch.cos(2 * a))
    assert "ext_prim_sin" in _executors_in(thunderlite.last_backward_traces(jfn)[-1])


def test_torch_level_implementation_runs_with_and_without_grad():
    calls: list = []
    myex = OperatorExecutor("ext_ltorch_sin")
    myex.register_implementation("ltorch.sin", _counting("sin", torch.sin, calls))
    jfn = thunderlite.jit(_sin_chain, executors=[myex])
    a = torch.randn(5)
    plain, out, grad = _run_with_and_without_grad(jfn, a)
    assert calls == ["sin", "sin"]                # the backward differentiates sin's decomposition
    torch.testing.assert_close(plain, _sin_chain(a))
    torch.testing.assert_close(out, _sin_chain(a))
    torch.testing.assert_close(grad, 2 * torch.cos(2 * a))
    fwd = thunderlite.last_traces(jfn)[-1]
    assert "ext_ltorch_sin.sin(" in str(fwd)
    verify_trace(fwd)
    verify_trace(thunderlite.last_backward_traces(jfn)[-1])


def test_torch_level_implementation_of_a_multi_step_composite_gets_correct_grads():
    calls: list = []
    myex = OperatorExecutor("ext_gelu")
    myex.register_implementation("ltorch.gelu", _counting("gelu", torch.nn.functional.gelu, calls))
    fn = lambda x, w: torch.nn.functional.gelu(x @ w).pow(2).sum()   # noqa: E731
    jfn = thunderlite.jit(fn, executors=[myex])
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    jfn(xr, wr).backward()
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    fn(xe, we).backward()
    assert calls and set(calls) == {"gelu"}     # rematerialization may run it again in the backward
    torch.testing.assert_close(xr.grad, xe.grad)
    torch.testing.assert_close(wr.grad, we.grad)


def test_checker_decides_per_call():
    calls: list = []
    myex = OperatorExecutor("ext_checked")
    myex.register_implementation("ltorch.sin", _counting("sin", torch.sin, calls),
                                 checker=lambda a: a.dtype == torch.float32)
    jfn = thunderlite.jit(lambda a: a.sin(), executors=[myex])
    jfn(torch.randn(3))
    jfn(torch.randn(3, dtype=torch.float64))
    assert calls == ["sin"]
    assert "ext_checked" not in _executors_in(thunderlite.last_traces(jfn)[-1])


# --- priority is the user's order ----------------------------------------------------------

def _needs_torchcompile():
    ok, reason = torchcompile_executor.is_available()
    if not ok:
        pytest.skip(f"torch.compile executor unavailable: {reason}")


def test_operator_executor_before_a_fusion_executor_keeps_its_ops():
    _needs_torchcompile()
    calls: list = []
    myex = OperatorExecutor("ext_prio")
    myex.register_implementation("ltorch.sin", _counting("sin", torch.sin, calls))
    fn = lambda a: ((a * 2 + 1).sin() * 3 - 1).sum()   # noqa: E731
    a = torch.randn(16)
    first = thunderlite.jit(fn, executors=[myex, "torchcompile", "torch"])
    torch.testing.assert_close(first(a), fn(a))
    assert calls == ["sin"]
    trace = thunderlite.last_traces(first)[-1]
    assert "ext_prio.sin(" in str(trace) and "torchcompile" in _executors_in(trace)
    fused = [b for b in trace.bound_symbols if Tag.FUSION in b.sym.tags]
    assert all(s.sym.name != "sin" for f in fused for s in f.subsymbols)
    calls.clear()
    later = thunderlite.jit(fn, executors=["torchcompile", myex, "torch"])
    torch.testing.assert_close(later(a), fn(a))
    assert calls == [] and "ext_prio" not in _executors_in(thunderlite.last_traces(later)[-1])


def test_earlier_operator_executor_wins_over_a_later_one():
    calls: list = []
    first, second = OperatorExecutor("ext_first"), OperatorExecutor("ext_second")
    first.register_implementation(prims.sin, _counting("first", torch.sin, calls))
    second.register_implementation("ltorch.sin", _counting("second", torch.sin, calls))
    thunderlite.jit(lambda a: a.sin(), executors=[first, second])(torch.randn(2))
    thunderlite.jit(lambda a: a.sin(), executors=[second, first])(torch.randn(2))
    assert calls == ["first", "second"]


# --- grad_transform and execution_transform ------------------------------------------------

def _grad_transform_executor(name: str, calls: list) -> OperatorExecutor:
    ex = OperatorExecutor(name)
    sin_op = ex.register_operator("sin_fwd", like="ltorch.sin", fn=_counting("sin_fwd", torch.sin, calls))
    cos_op = ex.register_operator("cos_bwd", like=prims.cos, fn=_counting("cos_bwd", torch.cos, calls))
    mul_op = ex.register_operator("mul_bwd", like=prims.mul, fn=_counting("mul_bwd", torch.mul, calls))

    def sin_grad(a):
        out = sin_op(a)
        put_grad(a, mul_op(get_grad(out), cos_op(a)))
        return out
    ex.register_implementation("ltorch.sin", sin_op, grad_transform=sin_grad)
    return ex


def test_grad_transform_gives_the_executor_its_own_forward_and_backward():
    calls: list = []
    myex = _grad_transform_executor("ext_gradt", calls)
    jfn = thunderlite.jit(_sin_chain, executors=[myex])
    a = torch.randn(6)
    plain, out, grad = _run_with_and_without_grad(jfn, a)
    torch.testing.assert_close(plain, _sin_chain(a))
    torch.testing.assert_close(out, _sin_chain(a))
    torch.testing.assert_close(grad, 2 * torch.cos(2 * a))
    assert sorted(calls) == ["cos_bwd", "mul_bwd", "sin_fwd", "sin_fwd"]
    fwd, bwd = thunderlite.last_traces(jfn)[-1], thunderlite.last_backward_traces(jfn)[-1]
    assert "ext_gradt.sin_fwd(" in str(fwd) and "ext_gradt.mul_bwd(" in str(bwd)
    verify_trace(fwd)
    verify_trace(bwd)


def test_grad_transform_errors_name_the_problem():
    myex = OperatorExecutor("ext_gradt_bad")

    def bad(a):
        out = torch.sin(a)
        put_grad(out, get_grad(out))           # out is not an argument
        return out
    myex.register_implementation("ltorch.sin", torch.sin, grad_transform=bad)
    jfn = thunderlite.jit(lambda a: a.sin(), executors=[myex])
    with pytest.raises(ValueError, match="put_grad on .* not arguments of the symbol"):
        jfn(torch.randn(2, requires_grad=True))
    with pytest.raises(RuntimeError, match="only meaningful inside a grad_transform"):
        get_grad(None)


def test_execution_transform_replaces_the_symbol_by_what_it_traces():
    calls: list = []
    myex = OperatorExecutor("ext_exect")
    exp_op = myex.register_operator("exp", like=prims.exp, fn=_counting("exp", torch.exp, calls))

    def tanh_by_exp(a):                           # tanh(a) = 1 - 2 / (exp(2a) + 1)
        return 1 - 2 / (exp_op(a * 2) + 1)
    myex.register_implementation("ltorch.tanh", execution_transform=tanh_by_exp)
    jfn = thunderlite.jit(lambda a: a.tanh() * 3, executors=[myex])
    a = torch.randn(7)
    torch.testing.assert_close(jfn(a), a.tanh() * 3)
    assert calls == ["exp"]
    trace = thunderlite.last_traces(jfn)[-1]
    assert "ext_exect.exp(" in str(trace) and "tanh" not in str(trace).split("def computation")[1].split("#")[0]
    verify_trace(trace)
    with pytest.raises(ValueError, match="exactly one of impl and execution_transform"):
        myex.register_implementation("ltorch.cos", torch.cos, execution_transform=tanh_by_exp)


# --- examine: implementations a call did not use --------------------------------------------

def test_examine_says_why_an_implementation_was_not_used():
    myex = OperatorExecutor("ext_unused")
    myex.register_implementation("ltorch.cos", torch.cos)
    myex.register_implementation(prims.exp, torch.exp, checker=lambda a: a.dtype == torch.float64)
    myex.register_implementation("ltorch.sin", torch.sin)
    myex.register_implementation("ltorch.dropout", torch.nn.functional.dropout)
    earlier = OperatorExecutor("ext_earlier")
    earlier.register_implementation("ltorch.sin", torch.sin)
    fn = lambda a: torch.nn.functional.dropout(a.exp() + a.sin(), 0.5).sum()   # noqa: E731
    report = thunderlite.examine(fn, torch.randn(3, requires_grad=True), executors=[earlier, myex])
    reasons = {sym: why for ex, sym, why in report.unused if ex == "ext_unused"}
    assert reasons == {
        "ltorch.cos": "not called by this program",
        "prims.exp": reasons["prims.exp"],
        "ltorch.sin": "claimed by an earlier executor 'ext_earlier'",
        "ltorch.dropout": "decomposed away before claiming (autodiff differentiated it through its decomposition)",
    }, report
    assert reasons["prims.exp"].startswith("checker declined (")
    assert "implementation of prims.exp not used: checker declined" in str(report)
    assert not [u for u in report.unused if u[0] == "ext_earlier"]


# --- user transforms ---------------------------------------------------------------------------

class _Recorder(Transform):
    def __init__(self):
        self.seen = []

    def after_tracing(self, trace):
        self.seen.append(("after_tracing", trace.name))
        return trace

    def after_autodiff(self, forward, backward):
        self.seen.append(("after_autodiff", forward.name, backward.name))
        return forward, backward

    def after_claiming(self, trace):
        self.seen.append(("after_claiming", trace.name, all(
            b.sym.executor is not None or b.sym.impl is not None or Tag.RETURN in b.sym.tags
            for b in trace.bound_symbols)))
        return trace


def test_transform_hooks_run_at_their_points():
    rec = _Recorder()
    jfn = thunderlite.jit(_sin_chain, transforms=[rec])
    jfn(torch.randn(3))
    assert rec.seen == [("after_tracing", "computation"), ("after_claiming", "computation", True)]
    rec.seen.clear()
    jfn(torch.randn(3, requires_grad=True)).backward()
    assert rec.seen == [("after_tracing", "computation"), ("after_autodiff", "forward", "backward"),
                        ("after_claiming", "forward", True), ("after_claiming", "backward", True)]


class _SinToCos(Transform):
    """Rewrites every ltorch.sin into ltorch.cos right after tracing."""

    def after_tracing(self, trace):
        from thunderlite.core.retrace import retrace
        from thunderlite.torch.registry import all_symbols
        cos = all_symbols()["cos"]
        out = []
        for b in trace.bound_symbols:
            if b.sym.id == "ltorch.sin":     # record cos (with its decomposition) producing sin's output
                out += retrace(b, cos, names=trace.names, what="sin -> cos")[0]
            else:
                out.append(b)
        return trace.with_bound_symbols("sin -> cos", out)


def test_a_transform_changes_what_runs_and_is_recorded_as_a_stage():
    jfn = thunderlite.jit(_sin_chain, transforms=[_SinToCos()])
    a = torch.randn(4)
    torch.testing.assert_close(jfn(a), (a * 2).cos().sum())
    stages = [t.stage for t in thunderlite.last_traces(jfn)]
    assert "_SinToCos.after_tracing" in stages
    ar = a.clone().requires_grad_()
    jfn(ar).backward()
    torch.testing.assert_close(ar.grad, -2 * torch.sin(2 * a))


def test_transforms_are_validated():
    with pytest.raises(TypeError, match="Transform instances"):
        thunderlite.jit(_sin_chain, transforms=[lambda t: t])

    class Broken(Transform):
        def after_claiming(self, trace):
            return None
    with pytest.raises(TypeError, match="Broken.after_claiming returned NoneType"):
        thunderlite.jit(_sin_chain, transforms=[Broken()])(torch.randn(2))


def test_register_executor_refuses_non_executors():
    with pytest.raises(TypeError, match="expects an Executor"):
        register_executor("myex")


# --- the notebook -----------------------------------------------------------------------------

def test_extending_notebook_is_committed_with_outputs_and_executes():
    import json
    from pathlib import Path
    nbformat = pytest.importorskip("nbformat", reason="nbformat is in the test extra")
    path = Path(__file__).resolve().parents[2] / "notebooks" / "extending.ipynb"
    committed = json.loads(path.read_text())
    code = [c for c in committed["cells"] if c["cell_type"] == "code"]
    assert all(c.get("id") for c in committed["cells"])
    assert code and all(c["outputs"] for c in code), "commit the notebook executed, with its outputs"
    assert all(o.get("output_type") != "error" for c in code for o in c["outputs"])
    try:
        import ipykernel  # noqa: F401
        from nbclient import NotebookClient
    except ImportError:
        NotebookClient = None
    if NotebookClient is not None:
        nb = nbformat.read(path, as_version=4)
        try:
            NotebookClient(nb, timeout=600, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parents[1])}}).execute()
            return
        except Exception as e:  # no usable kernel here: run the same cells in-process below
            if "kernel" not in str(e).lower():
                raise
    namespace: dict = {}
    for c in code:
        exec(compile("".join(c["source"]), "extending.ipynb", "exec"), namespace)


def test_add_default_executor_refuses_a_second_executor_of_a_registered_name():
    with pytest.raises(ValueError, match="another executor named 'torchcompile'"):
        add_default_executor(OperatorExecutor("torchcompile"))
    with pytest.raises(KeyError, match="unknown executor"):
        add_default_executor("no_such_executor")
