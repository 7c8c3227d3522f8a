"""A cache miss: trace the call through the interpreter, run the pipeline, and
generate the entry function (docs/architecture.md §7).

Stages recorded (each only when it changed the trace): the interpretation,
update_aliases, dce, then either the execution transform (claim, alias and DCE
re-run, del_last_used) or, when an input requires grad and grad mode is on,
the autograd bridge's forward traces (its backward traces kept separately).
"""
from __future__ import annotations

import contextlib
import gc
import threading
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from thunderlite.core.proxies import DataDependentError, NumberProxy, Proxy, TensorProxy
from thunderlite.core.symint import ShapeEnv
from thunderlite.core.trace import Trace, TracePass
from thunderlite.core.tracectx import tracectx
from thunderlite.executors.autograd_function import DifferentiableProgram, make_differentiable
from thunderlite.executors.registry import resolve_executors
from thunderlite.executors.rehearsal import rehearse
from thunderlite.executors.torchex import view_folding, writes_out
from thunderlite.frontend.autocast import without_autocast
from thunderlite.frontend.caching.alias_guard import plan_alias_guard, refused_writes, written_inputs
from thunderlite.frontend.caching.automatic import PathDynamic
from thunderlite.frontend.caching.entries import CompiledEntry
from thunderlite.frontend.caching.keys import VALUE_TYPES, storage_groups
from thunderlite.frontend.entry import build_entry, prologue_trace
from thunderlite.frontend.epilogue import (
    Template,
    Write,
    collect_writes,
    guard_held_by_functions,
    is_simple,
    made_by_call,
    proxies_in,
    resolvable,
)
from thunderlite.frontend.hooks import NotTracedError, TracingHooks, is_stateful_iterator
from thunderlite.frontend.progress import compile_progress, note
from thunderlite.frontend.provenance import Prov
from thunderlite.frontend.splits import Resume, SplitBudget, SplitRefused, Splitter, after_split, mark_after_split
from thunderlite.frontend.state import Input, Mirror, TraceState
from thunderlite.frontend.training.predicated import NOT_PREDICATED, PredicationRefused, predication_notes
from thunderlite.interpreter import interpret
from thunderlite.interpreter.hooks import InterpreterError
from thunderlite.interpreter.tracebacks import NOTE_HEADER as INTERPRETED_FRAMES_NOTE
from thunderlite.torch.ops.grad_mode import REGISTER_HOOK_ID, RETAIN_GRAD_ID
from thunderlite.torch.ops.inplace import grown
from thunderlite.transforms.aliasing.eager_layout import eager_copies, inputs_behind
from thunderlite.transforms.aliasing.update_aliases import AliasGroups, check_writes, update_aliases, writes_memory
from thunderlite.transforms.autodiff.split import REQUIRES_GRAD_ID
from thunderlite.transforms.box_inputs import box_inputs
from thunderlite.transforms.claim import claim_executors
from thunderlite.transforms.dce import dce
from thunderlite.transforms.del_last_used import del_last_used
from thunderlite.transforms.fold_views import fold_views
from thunderlite.transforms.reuse_buffers import reuse_buffers
from thunderlite.transforms.schedule_collectives import schedule_collectives
from thunderlite.transforms.user import apply_after_autodiff, apply_hook, prefetch_units
from thunderlite.transforms.whole_step import batch_scalar_chains, drop_autograd_markers, schedule_updates

INTERPRETATION_STAGE = "interpretation"


def compile_call(fn: Callable, args: tuple, kwargs: dict, sig: tuple, *, executors=None,
                 symbolic_numbers: bool = False, transforms: tuple = (), progress: bool | None = None,
                 name: str | None = None, dynamic: dict | None = None,
                 auto: PathDynamic | None = None, splits: SplitBudget | None = None) -> CompiledEntry:
    """Trace ``fn(*args, **kwargs)`` (whose signature is ``sig``) and compile it,
    showing progress on stderr when it takes long (frontend/progress.py).
    ``dynamic``: tensor leaf index (signature order) -> dims whose sizes stay
    symbolic (core/symint.py); their guards join the prologue. ``auto``: which
    sizes and floats read through paths are symbolic (caching/automatic.py);
    a trace that grows a tensor it read through a path is traced again with
    the growing dims symbolic. ``splits``: the callable's budget of paths
    where Python needs a traced value (frontend/splits/; None: such a program
    raises ``DataDependentError``). A split program's first call runs while
    it is compiled: its output is the entry's ``run_first``."""
    job = _Job(fn, sig, executors, symbolic_numbers, tuple(transforms), progress,
               name or getattr(fn, "__qualname__", "function"), dynamic, auto, splits)
    return job.compile(args, kwargs)


_MAX_TRACES = 3     # a growing state is learned whole from one trace: the second one has its dims symbolic


class _Grows(Exception):
    """The program grows a tensor it read through a path: trace it again (``compile_call``)."""

    def __init__(self, learned: str):
        self.learned = learned


class _Job:
    """What every compile of one signature shares: the first call's, and the
    later ones that resume a split program (frontend/splits/); the blocks whose
    flag is read as eager does (``unpredicated``: site -> why)."""

    def __init__(self, fn, sig, executors, symbolic_numbers, transforms, progress, name, dynamic, auto, splits):
        self.fn, self.sig, self.executors = fn, sig, executors
        self.symbolic_numbers, self.transforms, self.progress = symbolic_numbers, transforms, progress
        self.name, self.dynamic, self.auto, self.splits = name, dynamic, auto, splits
        self.unpredicated: dict = {}

    def compile(self, args: tuple, kwargs: dict, resume: Resume | None = None):
        """A predicated block refused restarts the compile with that site
        reading its flag (training/predicated.py), a growing state with its
        dims symbolic; never once a piece of a split program ran
        (frontend/splits/: it would run twice)."""
        learned = None
        auto = self.auto
        with compile_progress(self.name, self.progress), gc_paused():
            traces = 1
            while True:
                if auto is not None:
                    auto.used = set()
                with ShapeEnv() as env:     # static sizes: only data-dependent ops' sizes (unbacked) join it
                    symbolic = env if self.dynamic or self.symbolic_numbers or (auto is not None and auto.active()) \
                        else None
                    try:
                        entry = _compile_call(self, args, kwargs, symbolic, resume, retrace=traces < _MAX_TRACES)
                    except _Grows as e:
                        learned, traces = e.learned, traces + 1
                        continue
                    except PredicationRefused as e:
                        if e.site in self.unpredicated or after_split(e):
                            raise
                        self.unpredicated[e.site] = e.reason
                        continue
                    except Exception as e:
                        for why in self.unpredicated.values():      # why the flag was read, where reading it failed
                            e.add_note(f"{NOT_PREDICATED}{why}")
                        raise
                if resume is None:
                    entry.learned = learned
                return entry

    def resume(self, tree, path, values, args: tuple, kwargs: dict, env: dict) -> Any:
        """The rest of a call whose path left its split program's tree: compiled, run, its output."""
        return self.compile(args, kwargs, Resume(tree, path, values, env))


def _own_error(e: BaseException) -> bool:
    """Whether ``e`` is thunderlite refusing or failing, rather than the program
    raising (its ``raise``, or torch's error for its arguments, which eager
    raises at the same line). Only the program's own exceptions leave its
    earlier writes done (``run_until_raise``)."""
    return isinstance(e, (NotTracedError, DataDependentError, InterpreterError, NotImplementedError,
                          RecursionError, PredicationRefused)) or "thunderlite" in str(e)[:300]


def run_until_raise(entry: CompiledEntry, args: tuple, kwargs: dict) -> None:
    """A program that raised its own exception while tracing: run what it did
    before the raise (in-place writes, module state, ``.grad``), as eager did
    before the exception reached the caller, then raise it. Nothing is cached:
    each such call traces again."""
    exc = entry.raises
    try:
        entry.fn(args, kwargs)
    except Exception:  # noqa: BLE001 - the prefix failing must not hide the program's exception
        pass
    raise exc


class _GCPause:
    """How many compiles are running, and whether the collector was on before the first."""
    def __init__(self):
        self.lock = threading.Lock()
        self.running = 0
        self.resume = False


_gc_pause = _GCPause()


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection while compiling: a compile makes thousands of
    short-lived objects, and each collection they trigger would walk the
    process's long-lived ones (torch's, the user's) for nothing: on a small
    program that was a third of the first call. What the compile leaves is
    collected at the next collection after it; refcounting frees the rest.
    The collector is the process's: compiles running in several threads pause
    it together, and the last to finish turns it back on (if it was on)."""
    with _gc_pause.lock:
        if _gc_pause.running == 0:
            _gc_pause.resume = gc.isenabled()
            gc.disable()
        _gc_pause.running += 1
    try:
        yield
    finally:
        with _gc_pause.lock:
            _gc_pause.running -= 1
            if _gc_pause.running == 0 and _gc_pause.resume:
                gc.enable()


def _compile_call(job: _Job, args: tuple, kwargs: dict, env: ShapeEnv | None, resume: Resume | None,
                  retrace: bool = False):
    fn, transforms, auto = job.fn, job.transforms, job.auto
    start = time.perf_counter()
    trace = Trace("computation", stage=INTERPRETATION_STAGE)
    state = TraceState(trace)
    state.unpredicated = job.unpredicated
    state.shape_env = env
    state.auto = auto
    state.transforms = tuple(transforms)
    hooks = TracingHooks(state)
    if job.splits is not None:
        hooks.splitter = Splitter(hooks, job.splits, lambda t, i, g, s: _compile_piece(job, hooks, t, i, g, s),
                                  job.resume, fn, args, kwargs, resume, env)
    state.note_closure(fn)
    owner = getattr(fn, "__self__", None)
    if isinstance(fn, types.MethodType) and owner is not None:
        # ``jit(optimizer.step)``: what the method reads from ``self`` has a path
        # (guarded, unpacked on every call, written back), like an argument's attributes
        if isinstance(owner, torch.nn.Module):
            state.register_module_tree(owner, Prov.object(owner))
        else:
            state.note(owner, Prov.object(owner))
    note(INTERPRETATION_STAGE, trace)
    try:
        with tracectx(trace):
            pargs, pkwargs = proxy_arguments(state, args, kwargs, job.sig, _param_names(fn), job.dynamic)
            raises = None
            try:
                result = _interpret(fn, hooks, pargs, pkwargs)
            except Exception as e:
                if _own_error(e) or not _wrote_anything(trace, state):
                    raise
                raises, result = e, None
            _check_not_lazy(fn, result)
            result = hooks.autograd.returned(hooks.settled(result, "returned by the program"))
            piece = hooks.splitter.tail() if hooks.splitter is not None and hooks.splitter.cuts else trace
            _check_hook_functions(piece, state)
            writes = (collect_writes(state) + hooks.autograd.writes() + _input_hooks(piece, state)
                      + _rebound_inputs(piece, state))
            for w in writes:
                w.value = made_by_call(hooks.settled(w.value, "stored where it outlives the call"), state)
            state.guard_distinct({id(obj) for obj, _ in state.attr_writes.values()}
                                 | {i for i, m in state.mirror_of.items() if m.prov is not None and m.changed()})
            guard_held_by_functions((result, [w.value for w in writes]), state)
            ran = hooks.splitter is not None and hooks.splitter.ran     # tracing again would run a piece twice
            grows = auto.learn_from_writes(state.inputs, writes) if auto is not None and retrace and not ran else None
            if grows is not None:
                raise _Grows(grows)
            extras: list[Proxy] = []
            for w in writes:
                proxies_in(w.value, extras, set())
            mode, ret, rebuild = _output_plan(result, extras, state)
            if piece is trace:
                trace.args = [inp.proxy for inp in state.inputs]
                trace.set_return(ret)
                inputs, guards, sym_guards = state.inputs, state.guards, list(env.guards) if env is not None else []
            else:
                inputs, guards, sym_guards = hooks.splitter.seal_tail(piece, ret)
        piece.header_comments += predication_notes(state)
        trace.pass_time_ms = (time.perf_counter() - start) * 1e3
        compiled = _compile_piece(job, hooks, piece, inputs, guards, sym_guards, writes, mode, rebuild,
                                  [p.name for p in extras])
        compiled.raises = raises
        if piece is trace:
            return compiled
        if raises is not None:        # the program's own exception after a split: the rest, then the raise
            hooks.splitter.run_last(compiled)
            raise raises
        out, entry = hooks.splitter.finish(compiled)
        return out if resume is not None else entry
    except BaseException as e:
        if hooks.splitter is not None and hooks.splitter.ran:
            mark_after_split(e)
        raise


def _compile_piece(job: _Job, hooks: TracingHooks, trace: Trace, inputs: list[Input], guards: list,
                   sym_guards: list, writes: list[Write] | None = None, mode: str = "direct",
                   rebuild: Callable | None = None, extra_names: list[str] | None = None) -> CompiledEntry:
    """The pipeline and the entry function of ``trace`` (a whole program, or a
    piece of a split one: ``writes`` None), whose arguments are ``inputs``."""
    start = time.perf_counter()
    state = hooks.state
    piece = trace is not state.trace
    if piece and writes is None:
        _check_hook_functions(trace, state)
        if _input_hooks(trace, state):
            raise SplitRefused("thunderlite cannot split a program after register_hook()/retain_grad() on one of "
                               "its inputs (the hook is registered when the call ends)")
    groups = _input_alias_groups(inputs)
    _check_growing_resizes(trace, groups)
    transforms = (*job.transforms, *state.module_transforms)
    if transforms:
        values = {inp.proxy.name: inp.value for inp in inputs}
        for tr in transforms:
            tr.bind_inputs(values)
    traces = [trace]
    comp, backward, strided, lowering = run_pipeline(trace, traces, groups, job.executors, transforms,
                                                     refused_writes(inputs), _input_strides(inputs),
                                                     own_backward=hooks.autograd.backward_names())
    alias_guard = plan_alias_guard(inputs, written_inputs(trace, groups), strided,
                                   getattr(comp, "placed_inputs", ()))
    entry = build_entry(inputs, guards, writes or [], comp, mode, rebuild, extra_names or [], alias_guard,
                        sym_guards, env=piece, objects=resolvable(state))
    stage_ms = {t.stage: t.pass_time_ms for t in traces if t.pass_time_ms is not None}
    total = (time.perf_counter() - start) * 1e3 + (trace.pass_time_ms or 0.0)
    prologue = prologue_trace(inputs, guards, trace, alias_guard, sym_guards)
    compiled = CompiledEntry(entry, traces, backward, [prologue], stage_ms, total, list(guards))
    compiled.sym_guards = sym_guards
    compiled.alias_guard = alias_guard
    compiled.inputs = [(inp.prov, inp.value if inp.prov is None else None) for inp in inputs]
    compiled.input_names = [inp.proxy.name for inp in inputs]
    compiled.gradients = dict(hooks.autograd.gradient_of)
    compiled.lowering = lowering
    compiled.path_shapes = [(inp.prov, tuple(inp.value.shape), inp.dims) for inp in inputs
                            if inp.guard_meta and inp.prov is not None and isinstance(inp.value, torch.Tensor)
                            and not isinstance(inp.value, torch.nn.Parameter)]
    compiled.predication = predication_notes(state)
    return compiled


def _wrote_anything(trace: Trace, state: TraceState) -> bool:
    """Whether the program, up to now, wrote something its caller can see."""
    return writes_memory(trace) or bool(collect_writes(state))


def _check_hook_functions(trace: Trace, state: TraceState) -> None:
    """A tensor hook runs when the backward runs, after the call (or, reading
    traced tensors, is traced into the backward). A function the program made
    (a ``lambda`` in its body) was made once, while tracing, and serves every
    call: what it holds must mean the same on every call. Refused, with the
    line, where it holds a list or dict the program sees as a copy (an
    argument's: eager's hook would fill the caller's, which may be another
    object on the next call) or an object the call made (the caller gets a
    copy of it)."""
    for bsym in trace.bound_symbols:
        if bsym.sym.id != REGISTER_HOOK_ID:
            continue
        fn = bsym.args[1]
        for what, value in _held_by(fn, state):
            if _stable(value, state):
                continue
            where = f" (at {bsym.source[0]}:{bsym.source[1]}: {bsym.source[2].strip()})" if bsym.source else ""
            kind = ("a list or dict argument, which the jit traces as a copy"
                    if id(value) in state.mirrors_by_copy else f"a {type(value).__name__} made during the call")
            raise NotImplementedError(
                f"the tensor hook{where} holds {kind} ({what}): a hook made inside a jitted function is made once, "
                "when it is traced, and runs after the call; keep what it fills outside the function (a global, a "
                "closure of an enclosing function, an attribute of a module or object passed in)")


def _held_by(fn: Any, state: TraceState):
    """(what, value) the hook function holds that the call may have made: its
    own closure cells' contents, defaults, a bound method's ``self``."""
    if id(fn) in state.prov_of:
        return
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, types.ModuleType):
        yield "the object its method is bound to", owner
    for name, cell in zip(getattr(getattr(fn, "__code__", None), "co_freevars", ()),
                          getattr(fn, "__closure__", None) or (), strict=False):
        if id(cell) in state.external_cells:
            continue            # a cell of a function outside the call: read when the hook runs
        try:
            yield f"the variable {name!r}", cell.cell_contents
        except ValueError:
            continue
    for i, d in enumerate(getattr(fn, "__defaults__", None) or ()):
        yield f"default {i}", d


def _stable(value: Any, state: TraceState, nested: bool = True) -> bool:
    """Means the same on every call of the compiled entry (``nested``: look
    one level into a function the call made)."""
    if type(value) in VALUE_TYPES or isinstance(value, (TensorProxy, NumberProxy)):
        return True
    if id(value) in state.prov_of:
        # an object keyed by type: the hook, made once, holds this call's object
        state.identity_used(value, "held by a tensor hook the program registered")
        return id(value) not in state.mirrors_by_copy
    if isinstance(value, types.FunctionType):
        return nested and all(_stable(v, state, nested=False) for _, v in _held_by(value, state))
    if isinstance(value, (types.ModuleType, type, types.BuiltinFunctionType)):
        return getattr(value, "__self__", None) is None or isinstance(value.__self__, types.ModuleType)
    if type(value) is tuple:
        return all(_stable(v, state, nested) for v in value)
    return False


def _input_hooks(trace: Trace, state: TraceState) -> list[Write]:
    """``register_hook``/``retain_grad`` on a program input act on the caller's
    tensor (the hook outlives the call, as in eager): their markers leave the
    trace and become epilogue calls on that tensor, in program order."""
    inputs = {inp.proxy.name: inp for inp in state.inputs if isinstance(inp.value, torch.Tensor)}
    writes, kept = [], []
    for bsym in trace.bound_symbols:
        inp = inputs.get(bsym.args[0].name) if bsym.sym.id in _INPUT_MARKERS and bsym.args else None
        if inp is None:
            kept.append(bsym)
            continue
        target = inp.prov if inp.prov is not None else Prov.object(inp.value)
        writes.append(Write("call", target, _INPUT_MARKERS[bsym.sym.id], tuple(bsym.args[1:2])))
    trace.bound_symbols[:] = kept
    return writes


def _rebound_inputs(trace: Trace, state: TraceState) -> list[Write]:
    """Inputs whose tensor object took another shape or other memory in place
    (``x.t_()``, ``x.resize_(n)``, ``x.set_(y)``, ``x.data = v``;
    ``core.retrace.rebind``): the trace reads the value the input had on entry,
    and the epilogue replays the same steps on the caller's tensor (eager's
    strides, the same object: a Parameter stays that Parameter); a ``resize_``
    that grows it then copies the final elements in. Refused before anything
    runs where the caller's tensor cannot follow: it requires grad (eager's leaf
    error), or a ``resize_`` grows a tensor sharing storage with another input."""
    writes: list[Write] = []
    if not trace.rebound:
        return writes
    shared = {i for g in storage_groups([inp.value for inp in state.inputs
                                         if isinstance(inp.value, torch.Tensor)]) for i in g}
    tensors = [inp for inp in state.inputs if isinstance(inp.value, torch.Tensor)]
    for p, entry, steps in trace.rebound.values():
        k = next((k for k, inp in enumerate(tensors) if inp.proxy is p), None)
        if k is None:
            continue
        inp = tensors[k]
        what = ", ".join(f"{name}" for name, *_ in steps)
        if inp.value.requires_grad and any(step[3] for step in steps):
            raise RuntimeError(f"a leaf Variable that requires grad is being used in an in-place operation "
                               f"({what} on the input {entry.name}; thunderlite also refuses this on an input "
                               "that requires grad and is not a leaf)")
        if inp.value.requires_grad and torch.is_grad_enabled() and _reads(trace, p.name):
            raise NotImplementedError(f"{what} under no_grad on the input {entry.name}, which requires grad, and a "
                                      "later read of it: eager differentiates that read with respect to the same "
                                      "leaf in its new shape, which thunderlite cannot give; change its shape "
                                      "outside the jitted function")
        grew = any(step[4] for step in steps)
        if grew and k in shared:
            raise NotImplementedError(f"{what} on the input {entry.name}, which shares storage with another "
                                      "input: thunderlite cannot grow the caller's tensor")
        inp.proxy = entry
        target = inp.prov if inp.prov is not None else Prov.object(inp.value)
        for name, args, kwargs, *_ in steps:
            if name == "data":
                writes.append(Write("attr", target, "data", args[0]))
            else:
                writes.append(Write("call", target, name, tuple(args) + tuple(kwargs.values())))
        if grew:        # the grown elements are fresh memory in the trace: copied into the caller's
            writes.append(Write("call", target, "copy_", (p.replace(name=p.name),)))
    return writes


def _reads(trace: Trace, name: str) -> bool:
    return any(p.name == name for b in trace.bound_symbols for p in b.proxy_args())


def _check_growing_resizes(trace: Trace, groups) -> None:
    """A growing ``resize_`` gives the resized tensor fresh memory in the trace
    (``ltorch.inplace.grown``); eager reallocates the storage itself, which every
    tensor sharing it sees. Refused where another tensor shares it."""
    grows = [b for b in trace.bound_symbols if getattr(b.sym, "torch_fn", None) is grown]
    if not grows:
        return
    aliases = AliasGroups.of_trace(trace, groups)
    for b in grows:
        a = b.args[0]
        others = [m.name for m in aliases.members(a.name) if m.name != a.name]
        if others:
            where = f" (at {b.source[0]}:{b.source[1]}: {b.source[2].strip()})" if b.source else ""
            raise NotImplementedError(f"Tensor.resize_ grows {a.name}, which shares storage with "
                                      f"{', '.join(others)}{where}; eager reallocates the storage they share, "
                                      "which thunderlite does not model: resize a tensor of its own (a clone)")


_INPUT_MARKERS = {REGISTER_HOOK_ID: "register_hook", RETAIN_GRAD_ID: "retain_grad"}


def _param_names(fn: Callable) -> list[str]:
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    names = list(code.co_varnames[:code.co_argcount])
    return names[1:] if isinstance(fn, types.MethodType) else names     # a bound method's self is no argument


def proxy_arguments(state: TraceState, args: tuple, kwargs: dict, sig: tuple, names: list[str],
                    dynamic: dict | None = None):
    """The arguments the interpreted program sees: tensors as proxies, lists and
    dicts as copies (mutations are written back by the epilogue). ``dynamic``:
    see ``compile_call``."""
    _, arg_nodes, kw_nodes = sig
    leaf = _TensorLeaves(dynamic or {})
    pargs = tuple(_arg_value(state, node, a, Prov.arg(i), names[i] if i < len(names) else None, leaf)
                  for i, (node, a) in enumerate(zip(arg_nodes, args, strict=True)))
    pkwargs = {k: _arg_value(state, node, kwargs[k], Prov.kwarg(k), k, leaf) for k, node in kw_nodes}
    return pargs, pkwargs


class _TensorLeaves:
    """Numbers the tensor leaves in signature order (as the key function does)."""

    def __init__(self, dynamic: dict):
        self.dynamic = dynamic
        self.n = 0

    def next_dims(self):
        dims = self.dynamic.get(self.n)
        self.n += 1
        return dims


def _arg_value(state: TraceState, node: tuple, value: Any, prov: Prov, name: str | None,
               leaf: _TensorLeaves) -> Any:
    kind = node[0]
    if kind == "T":
        return state.tensor_input(value, prov, guard_meta=False, name=name, symbolic_dims=leaf.next_dims())
    if kind == "DT":
        return state.tensor_input(value, prov, name=name)      # a DTensor: distributed/dtensor.py
    if kind == "V":
        return value
    if kind == "S":
        proxy = NumberProxy(value, type(value), name=state.trace.claim_name(name or "n"))
        state.inputs.append(Input(proxy, prov, value, guard_meta=False))
        if type(value) is int and state.shape_env is not None:
            # an int the program computes with: a symbol, guarded where the program decides on it
            return state.shape_env.size_symbol(proxy, value, f"{prov.describe()} = {proxy.name}", lower=None)
        return proxy
    if kind == "tuple":
        return tuple(_arg_value(state, c, v, prov.item(i), None, leaf)
                     for i, (c, v) in enumerate(zip(node[2], value, strict=True)))
    if kind == "list":
        copy = [_arg_value(state, c, v, prov.item(i), None, leaf)
                for i, (c, v) in enumerate(zip(node[2], value, strict=True))]
        return _register_mirror(state, value, copy, prov)
    if kind == "dict":
        copy = {k: _arg_value(state, c, value[k], prov.item(k), None, leaf) for k, c in node[2]}
        return _register_mirror(state, value, copy, prov)
    if is_stateful_iterator(value):
        raise NotTracedError(f"thunderlite does not trace an iterator passed in ({type(value).__name__}, "
                             f"{prov.describe()}): advanced while tracing, the compiled program would not advance it "
                             "again. Pass the items (a list or tuple) instead.")
    if isinstance(value, torch.nn.Module):
        if id(value) in state.prov_of:      # passed twice: the key holds its identity, twice
            return value
        state.register_module_tree(value, prov)
    elif kind == "P":       # keyed by its type (keys.py): its identity is guarded if the program uses it
        state.note_object(value, prov, keyed="type")
    elif isinstance(value, types.FunctionType):
        state.note(value, prov)
        state.note_closure(value)     # nonlocal writes to its cells are replayed
    elif kind == "O" and not isinstance(value, (type, types.BuiltinFunctionType, types.MethodType)):
        state.note_object(value, prov, keyed="identity")
    else:
        state.note(value, prov)
    return value


def _register_mirror(state: TraceState, original, copy, prov: Prov):
    m = Mirror(original, copy, prov)
    state.mirror_of[id(original)] = m
    state.mirrors_by_copy[id(copy)] = m
    state._alive += [original, copy]
    return copy


def _interpret(fn: Callable, hooks: TracingHooks, pargs: tuple, pkwargs: dict) -> Any:
    grad = torch.is_grad_enabled()
    # a torch op jitted directly (``jit(torch.bmm)``) is recorded like a call from user code
    fn = hooks.lookaside(fn) or fn
    try:
        return interpret(fn, hooks)(*pargs, **pkwargs)
    except DataDependentError as e:
        if " (at " in str(e):
            raise
        loc = hooks.user_location(e)
        where = f" (at {loc[0]}:{loc[1]}: {loc[2]})" if loc else ""
        raise type(e)(f"{e}{where}") from None
    except Exception as e:
        loc = hooks.last_location
        named = any(n.startswith(INTERPRETED_FRAMES_NOTE) for n in getattr(e, "__notes__", ()))
        if loc is not None and hasattr(e, "add_note") and not named:  # the interpreter's note names the line
            e.add_note(f"thunderlite: raised while tracing {loc[0]}:{loc[1]}: {loc[2]}")
        raise
    finally:
        torch._C._set_grad_enabled(grad)


def _check_not_lazy(fn: Callable, result: Any) -> None:
    """A returned generator or coroutine would run its body after the call, outside the trace."""
    items = result if type(result) in (tuple, list) else (result,)
    for item in items:
        if isinstance(item, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
            name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
            raise TypeError(f"thunderlite.jit: {name!r} returned a {type(item).__name__}, whose body runs "
                            "only when it is iterated, after the jitted call has returned, so it cannot be "
                            "traced. Return a tuple or list (e.g. tuple(...) around a generator expression).")


def _output_plan(result: Any, extras: list[Proxy], state: TraceState):
    """How the computation returns the user's value: 'direct', 'extras', or 'rebuild'."""
    if is_simple(result):
        if not extras:
            return "direct", result, None
        return "extras", (result, tuple(extras)), None
    flat: list[Proxy] = []
    proxies_in(result, flat, set())
    template = Template(result, state)
    names = [p.name for p in flat]

    def rebuild(values, resolved):
        return template.build(dict(zip(names, values, strict=True)), resolved)
    rebuild.paths = template.paths
    return "rebuild", (tuple(flat), tuple(extras)), rebuild


def _input_alias_groups(inputs: list[Input]) -> list[list[str]] | None:
    tensors = [inp for inp in inputs if isinstance(inp.value, torch.Tensor)]
    groups = storage_groups([inp.value for inp in tensors])
    return [[tensors[i].proxy.name for i in g] for g in groups] or None


def _input_strides(inputs: list[Input]) -> dict[str, tuple]:
    return {inp.proxy.name: (tuple(inp.value.stride()), inp.value.storage_offset()) for inp in inputs
            if isinstance(inp.value, torch.Tensor) and inp.value.layout == torch.strided}


def run_pipeline(trace: Trace, traces: list[Trace], groups, executors: Sequence | None, transforms: tuple = (),
                 refused: dict | None = None, input_strides: dict | None = None,
                 own_backward: frozenset[str] | None = None):
    """update_aliases, dce, autodiff or not, the execution transform, with the
    user transforms' hooks (transforms/user.py) at their points. Returns the
    callable running the computation, the backward traces, the inputs whose
    strides the program relies on, and the ``Lowering`` (what followed the
    alias passes, kept so a later tier can lower the same trace with other
    executors). ``refused``: ``check_writes``' arguments
    naming inputs eager refuses to write (leaves requiring grad, inference
    tensors...), so the error is raised here, at trace time, before anything
    ran. ``input_strides``: for eager's view-or-copy of reshapes, in those
    checks and in autodiff's functionalization (see ``split_forward_backward``).
    ``own_backward``: the names its last backward made, when the program ran
    its backward itself (a whole training step, frontend/training/): it needs
    no autograd, runs under no_grad, and its updates are scheduled right after
    their gradients (transforms/whole_step.py)."""
    t = apply_hook(transforms, "after_tracing", trace, traces)
    copies = lambda: eager_copies(t, input_strides or {}, groups)  # noqa: E731
    strided = inputs_behind(t, check_writes(t, **(refused or {}), copies=copies))
    t = _record(traces, _step(update_aliases, t, groups))
    t = _record(traces, _step(dce, t, groups))
    if own_backward is not None:
        t = _record(traces, _step(drop_autograd_markers, t))
        t = _record(traces, _step(schedule_updates, t, own_backward, groups))
        t = _record(traces, _step(batch_scalar_chains, t, groups))
    lowering = Lowering(t, groups, resolve_executors(executors), transforms, input_strides, own_backward)
    lowering.front = len(traces)
    done = lowering.lower(lowering.executors, traces)
    lowering.placed = lowering.placed_by(done)
    return done.comp, done.backward, tuple(strided.union(done.placed)), lowering


class Lowering:
    """Everything ``run_pipeline`` does after the alias passes, from the trace
    they left: autodiff's split (when an input requires grad), the executors'
    claim and the passes after it, the computation's wrappers (no grad for a
    program that ran its own backward, no autocast: its casts are in the
    trace). Kept on the compiled entry, so that a later tier
    (frontend/caching/tiers.py) lowers the same trace with other executors
    without tracing again; ``lower`` reads no thread's grad or autocast mode,
    only the ones recorded when the entry was compiled."""
    __slots__ = ("trace", "groups", "executors", "transforms", "input_strides", "own_backward", "grad", "autocast",
                 "differentiable", "front", "placed")

    def __init__(self, trace: Trace, groups, executors: list, transforms: tuple, input_strides: dict | None,
                 own_backward: frozenset[str] | None):
        self.trace = trace
        self.groups = groups
        self.executors = executors
        self.transforms = transforms
        self.input_strides = input_strides
        self.own_backward = own_backward
        self.grad = torch.is_grad_enabled()
        self.autocast = torch._C._is_any_autocast_enabled()
        mask = [type(p) is TensorProxy and p.requires_grad for p in trace.args]
        self.differentiable = self.grad and (any(mask) or _makes_leaves(trace)) and own_backward is None
        self.front = 0      # how many of the entry's traces (stages) came before the lowering
        self.placed: tuple = ()     # ``placed_by`` of the entry's own lowering

    @staticmethod
    def placed_by(done: Lowered) -> tuple:
        """The inputs whose strides (and offsets) ``done``'s computation relies
        on: what the entry's prologue checks (alias_guard.py), so a lowering
        that relies on others cannot replace the entry's."""
        return tuple(done.placed), tuple(getattr(done.comp, "placed_inputs", ()))

    def lower(self, exs: list, traces: list[Trace]) -> Lowered:
        """The computation with executors ``exs`` (priority order, resolved);
        appends its stages to ``traces``."""
        with torch.set_grad_enabled(self.grad):
            done = self._lower(exs, traces)
        if self.autocast:
            done.comp = without_autocast(done.comp)    # the key holds the autocast state: casts are in the trace
            done.comp.program = done.program
        return done

    def _lower(self, exs: list, traces: list[Trace]) -> Lowered:
        t, groups, transforms = self.trace, self.groups, self.transforms
        if self.differentiable:
            def stages(tr: Trace) -> list[Trace]:
                steps: list[Trace] = []     # every stage is recorded for last_traces / last_backward_traces
                final = finalize(tr, exs, groups, steps, transforms)
                return steps or [final]     # no pass changed it: the input itself runs
            after_split = (lambda f, b: apply_after_autodiff(transforms, f, b)) if transforms else None
            note("split_forward_backward", t)
            mask = [type(p) is TensorProxy and p.requires_grad for p in t.args]
            program = make_differentiable(t, mask, stages, groups, after_split=after_split, executors=exs,
                                          input_strides=self.input_strides)
            traces += program.forward_traces
            return Lowered(program, program, program.forward_traces[-1], list(program.backward_traces),
                           tuple(program.stride_inputs))
        steps: list[Trace] = []
        final = finalize(t, exs, groups, steps, transforms)
        # as on the differentiable path (executors/autograd_function.py), an elementwise
        # step may write into a buffer dying there, unless autograd records it
        recorded = self.grad and self.own_backward is None
        final = _record(steps, _step(reuse_buffers, final, writes_out, recorded=recorded), final)
        traces += steps
        run = final.python_callable()
        return Lowered(_without_grad(run) if self.own_backward is not None else run, None, final, [], ())

    def rehearse(self, done: Lowered, inputs: list, grad_layouts: list | None = None,
                 later: Callable | None = None) -> int:
        """Run ``done``'s computation once on fake tensors like ``inputs`` (the
        values a call passes it), so its compiled regions compile now, on this
        thread, for the layouts a call meets (executors/rehearsal.py);
        ``grad_layouts``: those of the gradients its backward gets
        (``DifferentiableProgram.rehearse``); ``later``: where its regions send
        a layout the rehearsal did not foresee (``rehearsal.rehearse``).
        Returns how many region calls were prepared."""
        def run(fakes: list, resolve: Callable) -> None:
            if done.program is not None:
                done.program.rehearse(fakes, resolve, grad_layouts)
            else:
                done.final.python_callable(resolve)(*fakes)
        with torch.set_grad_enabled(self.grad and self.own_backward is None):
            return rehearse(run, inputs, later)


class Lowered:
    """What one lowering made: ``comp``, the computation an entry calls
    (wrapped as it runs); ``program``, the differentiable program inside it
    (None without autodiff); ``final``, the final (forward) trace; the backward
    traces; the inputs whose strides and offsets it relies on (``placed``)."""
    __slots__ = ("comp", "program", "final", "backward", "placed")

    def __init__(self, comp: Callable, program: DifferentiableProgram | None, final: Trace, backward: list[Trace],
                 placed: tuple):
        self.comp = comp
        self.program = program
        self.final = final
        self.backward = backward
        self.placed = placed


def _without_grad(run: Callable) -> Callable:
    """The computation of a program that ran its own backward: nothing in it is
    recorded by PyTorch's autograd (its gradients are trace values)."""
    def computation(*args):
        with torch.no_grad():
            return run(*args)
    computation.__thunderlite_source__ = getattr(run, "__thunderlite_source__", None)
    return computation


def _makes_leaves(trace: Trace) -> bool:
    """The program calls ``requires_grad_`` (it may start a differentiable graph)."""
    return any(b.sym.id == REQUIRES_GRAD_ID for b in trace.bound_symbols)


def finalize(trace: Trace, executors: list, groups, steps: list | None = None, transforms: tuple = ()) -> Trace:
    """The execution transform, the alias/DCE re-run it may need, fold_views, the user
    transforms' ``after_claiming``, del_last_used, box_inputs."""
    steps = [] if steps is None else steps
    t = _record(steps, _step(claim_executors, trace, executors, input_alias_groups=groups), trace)
    t = _record(steps, _step(update_aliases, t, groups), t)
    t = _record(steps, _step(dce, t, groups), t)
    t = _record(steps, _step(schedule_collectives, t, groups, prefetch_units(transforms)), t)
    t = _record(steps, _step(fold_views, t, view_folding), t)
    t = apply_hook(transforms, "after_claiming", t, steps)
    t = _record(steps, _step(del_last_used, t), t)
    return _record(steps, _step(box_inputs, t), t)


def _step(trace_pass: TracePass, trace: Trace, *args, **kwargs) -> Trace:
    """Run one pass, telling the progress reporter which (frontend/progress.py)."""
    note(trace_pass.stage, trace)
    return trace_pass(trace, *args, **kwargs)


def _record(traces: list[Trace], t: Trace, before: Trace | None = None) -> Trace:
    """Append ``t`` unless the pass returned its input (``before``, or the last
    recorded trace) unchanged: each stage is listed once, under its own pass's name."""
    if t is not (before if before is not None else (traces[-1] if traces else None)) and \
            not (traces and traces[-1] is t):
        traces.append(t)
    return t
