"""The OpInfo entry point: run one OpInfo sample through ``thunderlite.jit``
and compare with eager PyTorch (outputs and the state of every input).

Per (op, dtype) the verdict is one of
- ``native``: every leaf of the fully decomposed interpretation trace is a prim,
  and running that prim-level program (not the direct torch calls) matches eager;
- ``fallback``: the trace contains opaque torch calls and matches eager;
- ``failing``: with the reason.
Every sample also round-trips: the final trace (``last_traces(jfn)[-1]``) is
compiled again from its printed source (``python_callable``) and its result
compared. ``record`` (trace-level, without the jit) stays for unit tests.
"""
from __future__ import annotations

import linecache
import sys
import warnings

import torch

import thunderlite
import thunderlite.torch as ltorch
from thunderlite.core import pytree
from thunderlite.core.proxies import TensorProxy, proxy_of_tensor
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.core.verify import verify_trace
from thunderlite.executors import compile_trace

RANDOM_WORDS = ("rand", "dropout", "bernoulli", "multinomial", "normal", "uniform", "poisson", "exponential",
                "geometric", "cauchy", "log_normal", "randint", "randperm", "rrelu")


def _fill_linecache(limit: int = 80) -> None:
    """Warm ``linecache`` past the jit's mirror limit. Traced library code reads
    ``linecache.cache`` (``traceback.format_stack`` inside ``torch.manual_seed``,
    which OpInfo's ``wrapper_set_seed`` calls); while that dict was small the jit
    mirrored it and guarded its keys, and compiling a trace added to it, so the
    fresh entry rejected its own call. That no longer reproduces with the current
    jit; the warm-up stays so verdicts cannot depend on test order (the in-place
    OpInfo sweep uses it too)."""
    for mod in list(sys.modules.values()):
        if len(linecache.cache) > limit:
            return
        path = getattr(mod, "__file__", None)
        if path and path.endswith(".py"):
            linecache.getlines(path)


def op_db():
    from torch.testing._internal.common_methods_invocations import op_db as db
    return db


def is_random(op) -> bool:
    return any(w in op.name for w in RANDOM_WORDS)


def values_undefined(op) -> bool:
    """Random draws and uninitialized memory: only shape and dtype can match."""
    return is_random(op) or "empty" in op.name


def first_sample(op, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return next(iter(op.sample_inputs("cpu", dtype, requires_grad=False)), None)


def record(fn, args, kwargs) -> Trace:
    """A trace calling ``fn`` on proxies for every tensor in args/kwargs."""
    trc = Trace(name="computation", stage="OpInfo sample")
    with tracectx(trc):
        tensors = []

        def to_proxy(x):
            if isinstance(x, torch.Tensor):
                p = proxy_of_tensor(x)
                tensors.append(p)
                return p
            return x
        pargs, pkwargs = pytree.tree_map(to_proxy, args), pytree.tree_map(to_proxy, kwargs)
        trc.args = tensors
        sym = ltorch.symbol_for(fn)
        if sym is not None:
            out = sym(*pargs, **pkwargs)
        elif _is_descriptor(fn):
            out = ltorch.opaque_symbol_for(fn)(*pargs, **pkwargs)
        else:
            out = fn(*pargs, **pkwargs)   # lambdas, Python wrappers: torch functions dispatch to the language
        trc.set_return(out)
    return trc


def _is_descriptor(fn) -> bool:
    return type(fn).__name__ in ("method_descriptor", "wrapper_descriptor", "getset_descriptor",
                                 "builtin_function_or_method") and not hasattr(torch, getattr(fn, "__name__", ""))


def flatten_to_prims(trace: Trace) -> Trace:
    """The trace with every composite replaced by its subsymbols, recursively."""
    out = []

    def visit(bsym):
        if bsym.sym.decomposition is not None and bsym.subsymbols:
            for s in bsym.subsymbols:
                visit(s)
        else:
            out.append(bsym)
    for b in trace.bound_symbols:
        visit(b)
    return trace.with_bound_symbols("flattened to prims", out)


def tensors_of(args, kwargs) -> list:
    return [x for x in pytree.leaves((args, kwargs)) if isinstance(x, torch.Tensor)]


def tolerance(op, dtype):
    """(atol, rtol) from the OpInfo's toleranceOverride decorators, if any."""
    from torch.testing._internal.common_device_type import toleranceOverride
    atol = rtol = None
    for d in getattr(op, "decorators", ()) or ():
        for dec in getattr(d, "decorators", ()) or ():
            if isinstance(dec, toleranceOverride) and dtype in dec.d:
                t = dec.d[dtype]
                atol = t.atol if atol is None else max(atol, t.atol)
                rtol = t.rtol if rtol is None else max(rtol, t.rtol)
    defaults = {torch.float32: (1e-5, 1.3e-6), torch.float64: (1e-7, 1e-7), torch.bfloat16: (1e-2, 1.6e-2),
                torch.float16: (1e-3, 1e-3)}
    da, dr = defaults.get(dtype, (0, 0))
    return (max(atol or 0, da), max(rtol or 0, dr)) if dtype in defaults else (atol or 0, rtol or 0)


def compare(actual, expected, atol, rtol, metadata_only: bool = False) -> None:
    a_leaves = [x for x in pytree.leaves(_plain(actual))]
    e_leaves = [x for x in pytree.leaves(_plain(expected))]
    assert len(a_leaves) == len(e_leaves), f"{len(a_leaves)} outputs vs eager's {len(e_leaves)}"
    for a, e in zip(a_leaves, e_leaves, strict=True):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"got {type(a).__name__} where eager gave a tensor"
            assert a.shape == e.shape and a.dtype == e.dtype, \
                f"metadata {tuple(a.shape)} {a.dtype} vs eager {tuple(e.shape)} {e.dtype}"
            if not metadata_only:
                torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True, check_stride=False,
                                           check_device=True)
        elif not metadata_only:
            assert a == e or (a != a and e != e), f"{a!r} vs eager {e!r}"


def _plain(x):
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return tuple(x)
    return x


def _clone(x):
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x)


def _caller(fn):
    """The program the jit traces: one call of the OpInfo's callable."""
    def call_op(*args, **kwargs):
        return fn(*args, **kwargs)
    return call_op


def call_inputs(args: tuple, kwargs: dict) -> list:
    """The call's tensors in the order the jit makes them trace inputs: arguments
    depth-first, then keyword arguments by name, each tensor once."""
    seen, out = set(), []
    for x in pytree.leaves((args, [kwargs[k] for k in sorted(kwargs)])):
        if isinstance(x, torch.Tensor) and id(x) not in seen:
            seen.add(id(x))
            out.append(x)
    return out


def _inputs_for(trace: Trace, args: tuple, kwargs: dict) -> list:
    tensors = call_inputs(args, kwargs)
    params = trace.args
    assert len(params) == len(tensors) and all(
        isinstance(p, TensorProxy) and p.shape == tuple(t.shape) and p.dtype == t.dtype
        for p, t in zip(params, tensors, strict=True)), "the trace's inputs are not the call's tensors"
    return tensors


def compare_trace_output(out, expected, atol, rtol, metadata_only: bool) -> None:
    """A computation trace returns the user's value, or it followed by the
    extras the epilogue needs: compare the user's tensors, in order."""
    if len(list(pytree.leaves(_plain(out)))) == len(list(pytree.leaves(_plain(expected)))):
        return compare(out, expected, atol, rtol, metadata_only)
    got = [x for x in pytree.leaves(_plain(out)) if isinstance(x, torch.Tensor)]
    want = [x for x in pytree.leaves(_plain(expected)) if isinstance(x, torch.Tensor)]
    assert len(got) >= len(want), f"{len(got)} tensors returned vs eager's {len(want)}"
    compare(got[:len(want)], want, atol, rtol, metadata_only)


def check(op, dtype, executors=None, inspect=None) -> tuple[str, str]:
    """(verdict, reason) for the first sample of ``op`` at ``dtype``, run through
    ``thunderlite.jit``: the jitted call, the final trace recompiled from its
    source, and (for ``native``) the prim-level decomposition all match eager.
    ``executors`` goes to the jit; ``inspect(jfn)`` is called after the jitted
    call matched (e.g. to look at which executor ran what)."""
    sample = first_sample(op, dtype)
    if sample is None:
        return "failing", "no sample input"
    args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)
    eager_args, eager_kwargs = _clone(args), _clone(kwargs)
    try:
        torch.manual_seed(0)
        expected = op.op(*eager_args, **eager_kwargs)
    except Exception as e:  # noqa: BLE001 - eager's own failure means the sample is not usable
        return "failing", f"eager fails on the sample: {type(e).__name__}"
    atol, rtol = tolerance(op, dtype)
    rnd = values_undefined(op)
    _fill_linecache()
    jfn = thunderlite.jit(_caller(op.op), executors=executors)
    jit_args, jit_kwargs = _clone(args), _clone(kwargs)
    try:
        torch.manual_seed(0)
        compare(jfn(*jit_args, **jit_kwargs), expected, atol, rtol, rnd)
        compare(tensors_of(jit_args, jit_kwargs), tensors_of(eager_args, eager_kwargs), atol, rtol, rnd)
    except Exception as e:  # noqa: BLE001 - reported in the coverage table
        return "failing", f"jit: {type(e).__name__}: {_short(e)}"
    if inspect is not None:
        inspect(jfn)
    traces = thunderlite.last_traces(jfn)
    try:
        inputs = _inputs_for(traces[-1], _clone(args), _clone(kwargs))   # distinct tensors, as the jit saw
        verify_trace(traces[-1])
        compare_trace_output(traces[-1].python_callable()(*_clone(inputs)), expected, atol, rtol, rnd)
    except Exception as e:  # noqa: BLE001
        return "failing", f"round trip: {type(e).__name__}: {_short(e)}"
    return _native_verdict(traces[0], inputs, expected, atol, rtol, rnd)


def _native_verdict(trace: Trace, inputs: list, expected, atol, rtol, rnd: bool) -> tuple[str, str]:
    flat = flatten_to_prims(trace)
    opaque = [b for b in flat.bound_symbols if Tag.OPAQUE in b.sym.tags]
    if opaque:
        return "fallback", "opaque: " + ", ".join(sorted({b.sym.name for b in opaque}))
    try:
        _, pfn = compile_trace(flat)
        compare_trace_output(pfn(*_clone(inputs)), expected, atol, rtol, rnd)
    except Exception as e:  # noqa: BLE001
        return "failing", f"decomposition: {type(e).__name__}: {_short(e)}"
    return "native", "values undefined (random/empty): shape and dtype checked" if rnd else ""


def _short(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else repr(e))[:160].replace("|", "/")


def ops_for(dtype):
    return [op for op in op_db() if dtype in op.supported_dtypes("cpu")]


def sweep(dtypes, ops=None, executors=None):
    results = []
    for dtype in dtypes:
        for op in (ops or ops_for(dtype)):
            if dtype not in op.supported_dtypes("cpu"):
                continue
            results.append((op.name, op.variant_test_name, dtype, *check(op, dtype, executors)))
    return results
