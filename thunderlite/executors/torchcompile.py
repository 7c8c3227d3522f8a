"""The torch.compile executor: a fusion executor that compiles regions of a
trace with ``torch.compile`` (Inductor; on CPU it needs a C++ compiler).

Regions come from the shared dataflow region former (transforms/fusion.py).
A region holds only symbols the torch executor can run as one torch call and
that are safe to hand to Dynamo: no random ops (Inductor draws differently from
eager, which would break reproducibility, see core/prims.py), nothing that
returns a Python number computed at run time (constants of the trace, as CUDA flash attention's sequence lengths,
may be returned). Each region becomes a small trace of torch calls, compiled
to Python and then by ``torch.compile``; the fusion symbol prints as ``torchcompile.fusion<N>`` and
keeps the region's symbols as subsymbols.
Writes join regions, with the alias barriers (``update_aliases``) that order
the reads after them: AOTAutograd functionalizes a graph's writes and
Inductor applies those into its inputs where eager writes (a static KV
cache's ``index_copy_`` runs inside a decode step's one region). A region
whose outputs alias a written input runs its torch calls (``_compile_region``),
as do calls of a writing region whose inputs share storage.

Regions with the same structure share one compiled artifact: a region is cut
where it repeats (``transforms.fusion.repeat_span``: a model with N identical
layers gives N/k identical pieces of k layers), and each piece is looked up by
its structure key (symbols, constants, input/output metadata, dataflow with
canonical names). A model's k layers are compiled once, whatever the number of
layers; ``artifacts`` counts the distinct compiled callables. k grows until a
region computes for about 50 ms, at most 8 (``executors/cost.py``: what a cut
costs against what a bigger region costs to compile; ``layers_per_region``
fixes it).

A region of tensor inputs compiled with the default options is a
``BoxedRegion``: Inductor's boxed calling convention, as AOTAutograd calls
torch.compile's own backward. The trace hands it the inputs in a list
(``transforms/box_inputs.py``) after deleting its names for those that die
there; the compiled code empties the list and drops each input at its last
use, so a saved tensor the backward reads only there is freed mid-region, not
when the region returns.
"""
from __future__ import annotations

import contextlib
import itertools
import shutil
import warnings
from collections.abc import Callable

import torch

from thunderlite.core.aliasing import BARRIER, views, writes
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.symexpr import atom, evaluate
from thunderlite.core.symint import SymInt, mentions_symbolic
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tables_lock
from thunderlite.executors.base import FusionExecutor
from thunderlite.executors.cost import layers_per_region
from thunderlite.executors.fx_beside import compiling_beside_others
from thunderlite.executors.rehearsal import examples_like, kind_of
from thunderlite.executors.torchex import torch_executor
from thunderlite.torch.ops import linalg
from thunderlite.transforms.autodiff import kernels
from thunderlite.transforms.claim import claim_executors
from thunderlite.transforms.fusion import Region, fuse, repeat_span, span_bounds, split_region

_UNFUSIBLE = frozenset({Tag.RANDOM, Tag.DONT_DCE, Tag.RETURN})
# ATen's grouped GEMM (mixture of experts): one kernel with nothing to fuse inside,
# whose FakeTensor kernel (what Inductor traces with) takes bfloat16 only where the
# CPU kernel takes float32 and float16 too; it runs on the torch executor between regions
_KERNEL_ONLY = frozenset({linalg.grouped_mm, linalg.grouped_mm_call, kernels.grouped_mm_backward})


class TorchCompileExecutor(FusionExecutor):
    """Compiles fusible regions of at least ``min_size`` symbols with torch.compile.
    ``layers_per_region``: how many repeated layers one region holds (None:
    chosen per region from their estimated work, ``executors/cost.py``)."""

    def __init__(self, name: str = "torchcompile", *, min_size: int = 2, compile_options: dict | None = None,
                 layers_per_region: int | None = None):
        super().__init__(name)
        self.min_size = min_size
        self.layers_per_region = layers_per_region
        self.compile_options = {"dynamic": False, **(compile_options or {})}
        # a region with symbolic sizes (dynamic shapes, sizes known only at run time) gets
        # torch.compile's automatic dynamic unless the user chose: one recompile, not one per size
        self._symbolic_options = self.compile_options if "dynamic" in (compile_options or {}) else \
            {**self.compile_options, "dynamic": None}
        self._counter = itertools.count()
        self._artifacts: dict[tuple, object] = {}     # structure key -> compiled callable

    def check_availability(self) -> tuple[bool, str]:
        if not hasattr(torch, "compile"):
            return False, "this torch has no torch.compile"
        if not torch.cuda.is_available() and shutil.which("g++") is None and shutil.which("c++") is None:
            return False, "Inductor on CPU needs a C++ compiler (g++ or c++) on PATH"
        return True, ""

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        if bsym.sym is BARRIER:
            return True
        if bsym.sym.tags & _UNFUSIBLE or bsym.sym.executor is not None or bsym.sym in _KERNEL_ONLY:
            return False
        if not _tensor_outputs(bsym):
            return False
        if bsym.sym.module == "custom" and views(bsym):
            return False           # Inductor cannot functionalize a non-ATen op whose output aliases an input
        if _untracked_alias(bsym):
            return False
        if torch_executor.claim(bsym) is not None:
            return True
        return bsym.sym.decomposition is not None and bool(bsym.subsymbols) and all(
            self.can_fuse(sub) for sub in bsym.subsymbols)

    def fusion_pass(self, trace: Trace, input_alias_groups=None) -> Trace:
        return fuse(trace, self.can_fuse, lambda region: self._make_fusions(trace, region),
                    min_size=self.min_size, input_alias_groups=input_alias_groups)

    @property
    def prepares_symbolic(self) -> bool:
        """Its regions of symbolic sizes compile once for every size, and off
        the calling thread once rehearsed (``SymbolicRegion``): the default
        options, where the user chose no ``dynamic``."""
        return self.compile_options == {"dynamic": False} and self._symbolic_options["dynamic"] is None

    @property
    def artifacts(self) -> int:
        """How many distinct regions this executor has compiled (shared ones count once)."""
        return len(self._artifacts)

    def _make_fusions(self, trace: Trace, region: Region) -> list[BoundSymbol]:
        span = repeat_span(region)
        pieces = split_region(region, span_bounds(len(region.bsyms), span, self._group(region, span)))
        out: list[BoundSymbol] = []
        for piece in pieces:
            if piece.bsyms:
                piece, tail = _views_outside(piece)
                out.append(self._make_fusion(trace, piece))
                out.extend(tail)
        return out

    def _group(self, region: Region, span: tuple[int, int, int] | None) -> int:
        """Repeated layers per region: one when a layer computes for long, so
        identical layers share one compilation; more as layers get cheaper,
        each cut costing a region call and fusion across it (``executors/cost.py``)."""
        if span is None:
            return 1
        if self.layers_per_region is not None:
            return self.layers_per_region
        start, period, reps = span
        return layers_per_region(region.bsyms[start:start + period], reps)

    def _make_fusion(self, trace: Trace, region: Region) -> BoundSymbol:
        key = structure_key(region)
        compiled = self._artifacts.get(key)
        name = f"fusion{next(self._counter)}"
        if compiled is None:
            sub = Trace(name, stage=f"{self.name} region", names=trace.names)
            sub.args = list(region.inputs)
            sub.bound_symbols[:] = _alpha_spelled_out(region.bsyms)
            sub.set_return(tuple(region.outputs))
            sub = claim_executors(sub, [torch_executor])
            compiled = self._compile(sub, region)
            compiled.__thunderlite_trace__ = sub
            with tables_lock:       # another thread's compile may have made this region meanwhile: first wins
                if key not in self._artifacts and len(self._artifacts) >= MAX_ARTIFACTS:
                    self._artifacts.pop(next(iter(self._artifacts)))
                compiled = self._artifacts.setdefault(key, compiled)
        sym = self.fusion_symbol(name, compiled)
        return sym.bind(*region.inputs, output=tuple(region.outputs), subsymbols=tuple(region.bsyms),
                        source=region.bsyms[0].source)


    def _compile(self, sub: Trace, region: Region):
        fresh = _fresh_outputs(region)
        compiled = self._compile_region(sub, region, fresh)
        return compiled if isinstance(compiled, BoxedRegion) else _DistinctOutputs(compiled, fresh)

    def _compile_region(self, sub: Trace, region: Region, fresh: tuple = ()):
        fn = sub.python_callable()
        writing = any(writes(leaf) for b in region.bsyms for leaf in walk(b))
        if writing and _input_aliases(region):
            # AOTAutograd rebuilds an output aliasing a written input from a view replay that fails for
            # some views ("incorrect out shape after application of ViewMeta sequence") after the writes
            # ran: such a region runs as its torch calls
            return EagerWhenRecording(fn, fn, writing)
        if any(mentions_symbolic(b) for b in region.bsyms):
            if self.prepares_symbolic:
                return SymbolicRegion(fn, writing, tuple(region.inputs))
            return EagerWhenRecording(fn, torch.compile(fn, **self._symbolic_options), writing)
        if self.compile_options == {"dynamic": False} and region.inputs and \
                all(type(p) is TensorProxy for p in region.inputs):
            return BoxedRegion(fn, writing, fresh)
        return EagerWhenRecording(fn, torch.compile(fn, **self.compile_options), writing)


def _alpha_spelled_out(bsyms) -> list[BoundSymbol]:
    """``add(x, y, alpha=c)`` as its decomposition (``x + y * c``): Inductor
    (torch 2.13 on CPU) turns ``add(mm(a, b), y, alpha=c)`` into ``addmm`` and
    drops ``c``, so SGD's weight decay in the step's region
    (``grad.add(p, alpha=wd)``) came out as ``grad + p``."""
    out: list[BoundSymbol] = []
    for b in bsyms:
        alpha = b.kwargs.get("alpha", 1)
        if b.sym.id == "ltorch.add" and b.subsymbols and not (type(alpha) in (int, float) and alpha == 1):
            out.extend(_alpha_spelled_out(b.subsymbols))
        else:
            out.append(b)
    return out


def _tensor_outputs(bsym: BoundSymbol) -> bool:
    """Its results are tensors, beside constants of the trace (CUDA flash
    attention's ``None``s and its sequence lengths, ints): no Python number
    computed at run time, which a compiled region could not return."""
    return all(type(o) is TensorProxy or o is None or type(o) in (int, float, bool) for o in bsym.flat_outs())


def _fresh_outputs(region: Region) -> tuple:
    """For each output, whether the trace makes it fresh memory: made by a call
    with no view, write or alias barrier anywhere in it."""
    fresh = {o.name for b in region.bsyms for o in b.tensor_outs()
             if not any(views(leaf) or writes(leaf) or Tag.ALIAS_BARRIER in leaf.sym.tags for leaf in walk(b))}
    return tuple(o.name in fresh for o in region.outputs)


class _DistinctOutputs:
    """A compiled region whose outputs of different memory in the trace come
    back as different tensors: Inductor returned one buffer for two equal
    outputs (``b.clone()`` twice), so an in-place write after the region into
    one changed the other (grad fuzz seed 2984). An output the trace makes
    fresh that comes back sharing an earlier output's buffer is cloned
    (``distinct_outputs``). ``BoxedRegion`` checks its own outputs, once per layout."""

    def __init__(self, compiled, fresh: tuple):
        self.compiled = compiled
        self.fresh = fresh
        self.may_share = may_share(fresh)     # else nothing to check per call
        self._boxed_call = getattr(compiled, "_boxed_call", False)

    def __getattr__(self, name):
        return getattr(self.compiled, name)

    def __call__(self, *args):
        outs = self.compiled(*args)
        return distinct_outputs(outs, self.fresh)[0] if self.may_share else outs


def may_share(fresh: tuple) -> bool:
    """Whether a region with outputs ``fresh`` (``_fresh_outputs``) could return
    a fresh output in another one's buffer: two outputs, one fresh."""
    return len(fresh) > 1 and any(fresh)


def distinct_outputs(outs, fresh: tuple) -> tuple:
    """``(outs, cloned)``: ``outs`` with each fresh output that shares an earlier
    output's buffer cloned, and whether one was."""
    ptrs = [t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else 0 for t in outs]
    if not _shares(ptrs):
        return outs, False
    seen: set[int] = set()
    fixed = list(outs)
    cloned = False
    for i, (ptr, new) in enumerate(zip(ptrs, fresh, strict=True)):
        if ptr in seen and ptr and new:
            fixed[i] = outs[i].clone()
            cloned = True
        seen.add(ptr)
    return (type(outs)(fixed), True) if cloned else (outs, False)


def _input_aliases(region: Region, every: bool = False) -> dict[str, str]:
    """Region outputs that may share storage with a region input (a view, or a
    written input returned), each with the input it aliases; with ``every``,
    every name in the region that may (inputs map to themselves)."""
    root = {p.name: p.name for p in region.inputs if type(p) is TensorProxy}
    for b in region.bsyms:
        for leaf in walk(b):
            if leaf.subsymbols:
                continue
            for out, base in views(leaf):
                if base.name in root:
                    root[out.name] = root[base.name]
            for dst, new in writes(leaf):
                if new is not None and dst.name in root:
                    root[new.name] = root[dst.name]
    if every:
        return root
    return {o.name: root[o.name] for o in region.outputs if o.name in root and root[o.name] != o.name}


def _views_outside(region: Region) -> tuple[Region, list[BoundSymbol]]:
    """A region that writes nothing returns no view of its inputs: the view
    calls making such an output run again after it, as torch calls (free), and
    the compiled graph returns only fresh tensors. AOTAutograd would rebuild a
    returned view from a replay of its view steps, which fails for some
    (``diagonal`` as slice, reshape and strided slice: "incorrect out shape
    after application of ViewMeta sequence"). Outputs reached only through
    pure views; anything else stays (a writing region is handled by ``_compile``)."""
    if any(writes(leaf) for b in region.bsyms for leaf in walk(b)):
        return region, []
    aliased = _input_aliases(region)
    if not aliased:
        return region, []
    alias_of = _input_aliases(region, every=True)
    producer = {o.name: b for b in region.bsyms for o in b.proxy_outs()}
    inputs = {p.name for p in region.inputs}
    needed: set[int] = set()

    def need(name: str) -> bool:
        if name in inputs:
            return True
        b = producer.get(name)
        if b is None or b.sym.tags & {Tag.RANDOM, Tag.DONT_DCE} or \
                not all(o.name in alias_of for o in b.tensor_outs()):
            return False
        if not all(need(a.name) for a in b.proxy_args()):
            return False
        needed.add(id(b))
        return True
    moved = {name for name in aliased if need(name)}
    if not moved:
        return region, []
    tail = [b for b in region.bsyms if id(b) in needed]
    outputs = [o for o in region.outputs if o.name not in moved]
    made_by_tail = {o.name for b in tail for o in b.proxy_outs()}
    outputs = [o for o in outputs if o.name not in made_by_tail]
    return Region(region.bsyms, region.inputs, outputs), tail


def _untracked_alias(bsym: BoundSymbol) -> bool:
    """An alias autograd does not know as a view (``detach()``, ``.data``,
    ``unsafe_split``'s pieces): a compiled graph returns an output aliasing
    another as a view of it (AOTAutograd regenerates it from its base), so a
    later write with a value requiring grad (``r.detach().add_(a)``) would make
    the base require grad, where eager's detached alias keeps it apart."""
    if Tag.OPAQUE not in bsym.sym.tags or not views(bsym):
        return False
    fn = bsym.sym.torch_fn
    return (fn is torch.Tensor.detach or fn is torch.detach or getattr(fn, "__name__", None) == "data"
            or Tag.HIDDEN_VIEW in bsym.sym.tags)


def _recording(tensors) -> bool:
    """Autograd records this call (an eager-mode program, executors/autograd_function.py)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _as_torch_calls(tensors, writing: bool = True, ptrs: list[int] | None = None) -> bool:
    """Run the region's torch calls instead of the compiled code: autograd records
    the call (``_recording``), or two inputs of a region that writes share storage, where AOTAutograd
    rebuilds outputs aliasing a synthetic base and fails for some views
    ("incorrect out shape after application of ViewMeta sequence") after the
    graph's writes ran (no retry is possible then). ``ptrs``: the tensors'
    storages' addresses, where the caller has them."""
    if _recording(tensors):
        return True
    if not writing:     # AOTAutograd makes synthetic bases only for aliased inputs a graph writes
        return False
    if ptrs is None:
        ptrs = [t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)]
    return _shares(ptrs)


def _compiled_call(compiled, fn, args: tuple):
    """``compiled(*args)``, or ``fn``'s torch calls where dynamo refuses to
    run: another thread's ``make_fx`` (the tier worker compiling a boxed
    region) sets FX's process-wide tracing flag, and dynamo's wrapper raises
    under it before running anything."""
    try:
        return compiled(*args)
    except RuntimeError as e:
        if "symbolically trace a dynamo-optimized function" not in str(e):
            raise
    return fn(*args)


class EagerWhenRecording:
    """A compiled region that runs as its torch calls while autograd records
    it: autograd then saves exactly what eager's ops save, so a later write into
    a tensor the compiled graph would have saved is no error eager does not
    raise ("modified by an inplace operation"), as the Triton executor does."""

    def __init__(self, fn, compiled, writing: bool = True):
        self.fn = fn
        self.compiled = compiled
        self.writing = writing      # the region writes (into its inputs, maybe)

    def __call__(self, *args):
        return self.fn(*args) if _as_torch_calls(args, self.writing) else _compiled_call(self.compiled, self.fn, args)

    def prepare(self, example: list) -> None:
        """Compile now for inputs like ``example`` (tensors of the layouts a call
        will pass, and its numbers): ``torch.compile`` compiles on a first call,
        so ``example`` is run, zeroed first (``_run_to_compile``). Nothing to
        do where calls run the torch calls."""
        if self.compiled is self.fn or _as_torch_calls(example, self.writing):
            return
        _run_to_compile(self.compiled, self.fn, example)


def _graphs(fn) -> int:
    """How many graphs dynamo keeps for ``fn``'s code."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    return len(_debug_get_cache_entry_list(fn.__code__))


def _run_to_compile(compiled, fn, example: list) -> None:
    """Call ``compiled`` on made-up ``example`` values, zeroed first, so that it compiles.
    Running them may fail where the compile did not: indices computed from
    zeros (``position_ids = mask.cumsum(-1) - 1`` of a zero mask is -1) trip
    Inductor's bounds checks. Such a failure, after dynamo kept the new graph,
    is no failure of the compile; one before it is raised."""
    with torch.no_grad():
        for t in example:
            if isinstance(t, torch.Tensor):
                t.zero_()
    before = _graphs(fn)
    try:
        compiled(*example)
    except Exception:
        if _graphs(fn) == before:
            raise


class SymbolicRegion(EagerWhenRecording):
    """A region of symbolic sizes (a decode step's cache length) or symbolic
    numbers, compiled by ``torch.compile(dynamic=True)``: one compilation
    serves every size (dynamo specializes sizes 0 and 1, which the cache key
    never lets a symbolic size be). Called unprepared it compiles on its first
    call, on the calling thread, as any region of a ``torchcompile`` executor
    list does. ``prepare`` (a rehearsal: the tier worker) compiles it on
    zeroed examples (no dim marked static: dynamo would then guard a static
    tensor's strides, which a slice of a growing tensor changes per call),
    then calls it once more with every size symbol one
    larger (floats moved): a region that compiled again for that would
    recompile per size, so ``prepare`` raises ``RecompilesPerSize`` and the
    tier stays fast. Once prepared and handed the worker (``defer_to``), calls
    run dynamo's cached code only (``torch._dynamo.run``, cheaper per call
    than the compiling wrapper): a call its guards refuse runs the torch
    calls, and nothing compiles on the calling thread."""

    def __init__(self, fn, writing: bool, inputs: tuple):
        super().__init__(fn, torch.compile(fn, dynamic=True), writing)
        self.inputs = inputs        # the region's input proxies: which dims and numbers are symbolic
        self.compile_later: Callable[[Callable[[], None]], None] | None = None
        self._run_only = None
        self._direct: DirectSymbolic | None = None
        self.fallbacks: list[str] = []      # why it is not compiled directly (dynamo's path serves it)

    def __call__(self, *args):
        if _as_torch_calls(args, self.writing):
            return self.fn(*args)
        direct = self._direct
        if direct is not None:
            out = direct(args)
            return self.fn(*args) if out is None else out
        return _compiled_call(self._run_only or self.compiled, self.fn, args)

    def defer_to(self, later: Callable[[Callable[[], None]], None]) -> None:
        """From now on calls never compile: those its compiled code does not
        serve run the torch calls."""
        from torch._dynamo import run
        self.compile_later = later
        self._run_only = run(self.compiled)

    def prepare(self, example: list) -> None:
        if _as_torch_calls(example, self.writing):
            return
        if self._prepare_direct(example):
            return
        _run_to_compile(self.compiled, self.fn, example)
        moved = _sizes_moved(self.inputs, example)
        if moved is None:
            return
        before = self.compilations
        try:
            self.compiled(*moved)
        except Exception:  # noqa: BLE001 - made-up values may fail to run (_run_to_compile): only a new graph counts
            pass
        if self.compilations > before:
            raise RecompilesPerSize("a region of symbolic sizes compiled again for other sizes (its code is "
                                    "specialized to the sizes it met): it would recompile per size")

    def _prepare_direct(self, example: list) -> bool:
        """Compile without dynamo (``DirectSymbolic``) where the region writes
        nothing; False where that is not possible (dynamo's path then)."""
        if self.writing or self._direct is not None:
            return self._direct is not None
        try:
            direct = DirectSymbolic.compile(self.fn, self.inputs, example)
        except Exception as e:  # noqa: BLE001 - dynamo's path compiles what this one cannot
            self.fallbacks.append(f"compiled through dynamo: {type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''}")
            return False
        moved = _sizes_moved(self.inputs, example)
        if moved is not None and not direct.serves(moved):
            raise RecompilesPerSize("a region of symbolic sizes compiled for the sizes it met only (its code is "
                                    "specialized to them): it would recompile per size")
        self._direct = direct
        return True

    @property
    def compilations(self) -> int:
        """How many graphs serve this region (one serves every size): the
        direct compilation, or those dynamo keeps."""
        return 1 if self._direct is not None else _graphs(self.fn)


class DirectSymbolic:
    """A region of symbolic sizes compiled by Inductor without dynamo: traced
    to an ATen graph on fake tensors whose symbolic dims (and the numbers kept
    symbolic) are symbols of a ShapeEnv, compiled by ``compile_fx`` and
    called directly behind the ShapeEnv's guards, evaluated in Python.
    Dynamo's path (``torch.compile(dynamic=True)``) costs tens of microseconds
    more per call (its frame evaluation, its guards over every input); a
    decode step runs several such regions per token. A tensor input met
    with gaps or at an offset in its storage (a slice of a longer tensor,
    whose strides and offset change per call: what ``generate`` passes) is
    made contiguous at each call, and compiled so. A call whose inputs the
    guards refuse returns None (the caller runs the torch calls). Only for
    regions that write nothing: a call that fails the compiled code's own
    layout checks (it raises before it computes) is run again as torch calls."""

    def __init__(self, compiled, guard: Callable[[tuple], bool], gapped: tuple[int, ...]):
        self.compiled = compiled
        self.guard = guard
        self.gapped = gapped        # inputs made contiguous per call

    def __call__(self, args: tuple):
        if self.gapped:
            args = list(args)
            for i in self.gapped:
                args[i] = args[i].contiguous()
            args = tuple(args)
        if not self.guard(args):
            return None
        try:
            return self.compiled(list(args))
        except AssertionError:      # assert_size_stride: a layout the code was not compiled for
            return None

    def serves(self, args: list) -> bool:
        """Whether a call with ``args`` would run the compiled code."""
        return self.guard(tuple(args))

    @classmethod
    def compile(cls, fn, inputs: tuple, example: list) -> DirectSymbolic:
        from torch._dynamo.source import LocalSource
        from torch._dynamo.utils import GmWrapper
        from torch._guards import TracingContext, tracing
        from torch._inductor.compile_fx import compile_fx
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
        env = ShapeEnv(duck_shape=False)
        mode = FakeTensorMode(shape_env=env)
        fakes: list = []
        gapped = tuple(i for i, v in enumerate(example) if isinstance(v, torch.Tensor) and not _dense(v))
        example = [v.contiguous() if i in gapped else v for i, v in enumerate(example)]
        for i, (p, v) in enumerate(zip(inputs, example, strict=True)):
            if isinstance(v, torch.Tensor):
                if type(p) is not TensorProxy or v.layout is not torch.strided:
                    raise NotImplementedError("a tensor input of another layout")
                dims = [DimDynamic.DYNAMIC if type(d) is SymInt else DimDynamic.STATIC for d in p.shape]
                fakes.append(mode.from_tensor(v, source=LocalSource(f"a{i}"),
                                              symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims)))
            elif type(v) is int and isinstance(p, Proxy):
                source = LocalSource(f"a{i}")
                sym = env.create_symbol(v, source, dynamic_dim=DimDynamic.DYNAMIC)
                fakes.append(env.create_symintnode(sym, hint=v, source=source))
            else:
                raise NotImplementedError(f"an input of type {type(v).__name__}")
        with torch.no_grad():
            with mode:
                gm = make_fx(fn)(*fakes)
            if _places_by_offset(gm):
                raise NotImplementedError("as_strided over inputs (their storage offsets)")
            with tracing(TracingContext(mode)):
                compiled = compile_fx(GmWrapper(gm, lambda flat: flat), list(fakes))
        if not getattr(compiled, "_boxed_call", False):
            raise RuntimeError("Inductor did not return a boxed callable for a region (torch changed?)")
        expr = env.produce_guards_expression(fakes)
        guard = _guard_function(expr, len(fakes), example, fakes)
        if not guard(tuple(example)):
            raise RuntimeError("the compiled region's guards refuse the inputs it was compiled for")
        return cls(compiled, guard, gapped)


def _dense(t: torch.Tensor) -> bool:
    """At the start of its storage, every element of which it covers once
    (contiguous in some order of its dims): strides follow from sizes."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    return t.storage_offset() == 0 and is_non_overlapping_and_dense_or_false(t)


def _guard_function(expr: str | None, n: int, example: list, fakes: list) -> Callable[[tuple], bool]:
    """The checks a call's inputs pass to run the compiled code: the tensors'
    kinds (type, dtype, device, requires_grad, dispatch keys) and static sizes
    by torch's ``TensorGuards`` (in C++), and ``expr`` (a ShapeEnv's guards over
    ``L['t<i>']``, the i-th input: the symbolic sizes, strides and numbers)."""
    import math

    from torch._C._dynamo.guards import TensorGuards
    at = [i for i, v in enumerate(example) if isinstance(v, torch.Tensor)]
    # a symbolic dim the code specialized (it branched on the size) is a static size now, whose guard
    # ``produce_guards_expression`` leaves out: ``TensorGuards`` checks it
    sizes = [[d if type(d) is int else d.node.maybe_as_int() for d in fakes[i].shape] for i in at]
    kinds = TensorGuards(*(example[i] for i in at), dynamic_dims_sizes=sizes,
                         dynamic_dims_strides=[[None] * len(s) for s in sizes]).check
    names = "".join(f"a{i}, " for i in range(n)) or "_"
    body = expr or "True"
    for i in reversed(range(n)):
        body = body.replace(f"L['t{i}']", f"a{i}")
    src = (f"def guard(args):\n  {names}= args\n"
           f"  return _kinds({', '.join(f'a{i}' for i in at)}) and bool({body})\n")
    from thunderlite.core import codegen
    return codegen.compile_source(src, "guard", {"math": math, "torch": torch, "_kinds": kinds,
                                                 "__builtins__": __builtins__})


class RecompilesPerSize(RuntimeError):
    """A region of symbolic sizes whose compiled code serves only the sizes it was compiled for."""


def _sizes_moved(inputs: tuple, example: list) -> list | None:
    """Inputs like ``example`` with every size symbol one larger (numbers
    moved, floats by a half; each tensor of symbolic sizes laid out in its
    example's stride order, zeroed; the others as they were): what a later
    call of other sizes passes. None where a
    symbolic size is not read from the inputs (nothing to move it by)."""
    values: dict[str, int] = {}
    for p, v in zip(inputs, example, strict=True):
        if type(p) is TensorProxy and isinstance(v, torch.Tensor):
            for d, n in zip(p.shape, v.shape, strict=True):
                if type(d) is SymInt and len(d.atoms()) == 1:
                    (name,) = d.atoms()
                    if d.expr == atom(name):
                        values[name] = n
        elif isinstance(p, Proxy) and type(v) is int:
            values[p.name] = v
    moved = {k: v + 1 for k, v in values.items()}
    out = []
    for p, v in zip(inputs, example, strict=True):
        if type(p) is TensorProxy and isinstance(v, torch.Tensor) and not any(type(d) is SymInt for d in p.shape):
            out.append(v)       # its layout as it was (dynamo guards a static tensor's strides)
        elif type(p) is TensorProxy and isinstance(v, torch.Tensor):
            shape = [evaluate(d.expr, moved) if type(d) is SymInt else d for d in p.shape]
            if any(n is None for n in shape):
                return None
            order = sorted(range(v.dim()), key=lambda i: (-v.stride(i), i))
            stride, step = [0] * v.dim(), 1
            for i in reversed(order):
                stride[i], step = step, step * max(shape[i], 1)
            out.append(kind_of(v, torch.empty_strided(shape, stride, dtype=v.dtype, device=v.device).zero_()))
        elif isinstance(p, Proxy) and type(v) is int:
            out.append(moved[p.name])
        elif isinstance(p, Proxy) and type(v) is float:
            out.append(v + 0.5)
        else:
            out.append(v)
    return out


class BoxedRegion:
    """A region compiled by Inductor (``compile_fx``) with the boxed calling
    convention: called with one list of its input tensors, it empties the list
    and the compiled code drops each input after its last use. Called with the
    tensors as arguments it runs the same code (nothing is freed early then)::

        region = BoxedRegion(fn)         # fn(a, b) -> tuple of tensors
        box = [a, b]; del a              # the caller keeps b
        outs = region(box)               # box == [] now; a is freed inside

    One compilation per layout of the inputs (strides and storage offsets; the
    structure key fixes shapes, dtypes and devices). A call that autograd records (grad mode on and
    an input requiring grad: an eager-mode program), or a call of a region that
    writes whose inputs share storage, runs ``fn``'s torch calls (see
    ``_as_torch_calls``). A region a hot tier prepared (``compile_later``, the
    tier worker's queue: executors/rehearsal.py) does not compile a layout it
    meets unprepared on the calling thread: the call runs ``fn``'s torch calls
    and the worker compiles that layout for the calls after it."""

    _boxed_call = True

    def __init__(self, fn, writing: bool = True, fresh: tuple = ()):
        self.fn = fn
        self.writing = writing      # the region writes (into its inputs, maybe)
        self.fresh = fresh          # which outputs the trace makes fresh (``distinct_outputs``)
        self._by_layout: dict[tuple, object] = {}
        self.fallbacks: list[str] = []     # why a layout runs uncompiled (see _compile_boxed)
        self.compile_later: Callable[[Callable[[], None]], None] | None = None
        self._later: set[tuple] = set()     # layouts handed to ``compile_later``
        # layouts whose compiled code returned distinct buffers for its fresh outputs: which
        # buffer an output gets is decided when the code is generated, once per layout
        self._may_share = may_share(fresh)
        self._distinct: set[tuple] = set()
        self._hot: _HotLayout | None = None     # the layout the last calls met, checked in C++
        self._last: tuple | None = None

    def __call__(self, *args):
        box = args[0] if len(args) == 1 and type(args[0]) is list else list(args)
        del args
        ptrs = list(map(_data_ptr, map(_storage, box)))
        hot = self._hot
        if hot is not None and hot.serves(box, ptrs):
            return hot.compiled(box)
        if _as_torch_calls(box, self.writing, ptrs):    # as EagerWhenRecording: autograd saves what eager saves
            flat = list(box)
            box.clear()
            return self.fn(*flat)
        layout = _layout(box, ptrs)
        compiled = self._by_layout.get(layout)
        if compiled is None:
            if self.compile_later is not None:
                return self._compile_later(layout, box)
            compiled = self._compile_layout(layout, box)
        last, self._last = self._last, layout
        if self._may_share and layout not in self._distinct:
            outs, cloned = distinct_outputs(compiled(box), self.fresh)
            if not cloned:
                self._distinct.add(layout)
            return outs
        if layout == last and (hot is None or hot.layout != layout):
            self._hot = _HotLayout(layout, box, ptrs, compiled)     # met twice in a row: checked in C++ now
        return compiled(box)

    def _compile_layout(self, layout: tuple, box: list):
        """Compiled under torch's own compile lock (Inductor's state is per
        process): threads calling a new layout at once compile it once."""
        from torch._dynamo.convert_frame import compile_lock
        with compile_lock:
            compiled = self._by_layout.get(layout)
            if compiled is None:
                compiled = self._by_layout[layout] = _compile_boxed(self.fn, box, self.fallbacks)
        return compiled

    def _compile_later(self, layout: tuple, box: list):
        if layout not in self._later:
            self._later.add(layout)
            example = examples_like(box)
            self.compile_later(lambda: self._prepare_later(example))
        flat = list(box)
        box.clear()
        return self.fn(*flat)

    def _prepare_later(self, example: list) -> None:
        try:
            self.prepare(example)
        except Exception as e:  # noqa: BLE001 - calls of this layout keep running the torch calls
            self.fallbacks.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    def defer_to(self, later: Callable[[Callable[[], None]], None]) -> None:
        """From now on, layouts met unprepared are compiled by ``later(job)`` (the
        tier worker), while their calls run the torch calls."""
        self.compile_later = later

    def prepare(self, example: list) -> None:
        """Compile now for inputs of ``example``'s layout (strides, offsets,
        storage sharing; their values are not read), unless a call like it runs
        the torch calls or is compiled already. Safe beside calls from other
        threads (``_compile_layout``)."""
        ptrs = list(map(_data_ptr, map(_storage, example)))
        if _as_torch_calls(example, self.writing, ptrs):
            return
        layout = _layout(example, ptrs)
        if layout not in self._by_layout:
            self._compile_layout(layout, list(example))

    @property
    def compilations(self) -> int:
        """How many input layouts this region has been compiled for (boxed)."""
        return len(self._by_layout)


def _compile_boxed(fn, example: list, fallbacks: list[str]):
    """``fn`` traced to an ATen graph and compiled by Inductor the way it compiles a
    graph with boxed inputs (``flatten_graph_inputs`` wraps it in ``GmWrapper``:
    AOTAutograd then returns a callable that takes the list and empties it).
    Traced on the fake tensors of, and compiled inside a tracing context whose
    fake mode has, a ShapeEnv, as dynamo's calls are: Inductor's FX graph cache bypasses a graph compiled without one,
    so every process would recompile every region from scratch. Its fake mode
    keeps shapes static (with a ShapeEnv a fake mode's default is symbolic
    sizes: shape-generic code where the region is compiled per layout anyway).
    Not for a graph with ``as_strided`` over inputs with a storage offset: with a
    ShapeEnv the offset becomes a symbol that Inductor's code for ``as_strided``
    reads without binding (NameError at the call); without one it is a constant
    of the code (part of the layout key).
    Where AOTAutograd refuses the inputs (aliased inputs with different
    ``._base``: "non-differentiable view input mutations"; a view it cannot
    replay), the region runs as its torch calls for that layout: correct, slower,
    so it is said (a warning, and the reason in ``fallbacks``)."""
    from torch._dynamo.utils import GmWrapper
    from torch._guards import TracingContext, tracing
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    with torch.no_grad(), compiling_beside_others():
        mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True)
        try:
            # traced on the fake tensors of the mode it is compiled under: a graph traced in another fake
            # mode got wrong sizes from Inductor (diagonal(a) > 0.2 of a 3x4 `a` came out with 4 elements)
            fakes = [mode.from_tensor(t, static_shapes=True) for t in example]
            with mode:
                gm = make_fx(fn)(*fakes)
            if any(t.storage_offset() for t in example) and _places_by_offset(gm):
                mode = None
                gm = make_fx(fn, tracing_mode="fake")(*example)
        except Exception as e:  # noqa: BLE001 - an op fake tensors cannot run (linalg.lstsq): dynamo's path
            fallbacks.append(f"make_fx: {type(e).__name__}; compiled through dynamo")
            return _Unboxed(torch.compile(fn, dynamic=False))
        try:
            with contextlib.nullcontext() if mode is None else tracing(TracingContext(mode)):
                compiled = compile_fx(GmWrapper(gm, lambda flat: flat), list(example))
        except Exception as e:  # noqa: BLE001 - AOTAutograd refuses some aliased inputs: the torch calls
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            fallbacks.append(why)
            warnings.warn(f"thunderlite.torchcompile: Inductor could not compile a region for this input layout "
                          f"({why}); it runs as its torch calls", stacklevel=2)
            return _Unboxed(fn)
    if not getattr(compiled, "_boxed_call", False):
        raise RuntimeError("Inductor did not return a boxed callable for a region (torch changed?)")
    return compiled


def _places_by_offset(gm) -> bool:
    """Whether the graph has an ``as_strided`` (which reads its input's storage
    offset): with a ShapeEnv Inductor's code for it reads the offset's symbol
    unbound. Other graphs over inputs at an offset (q, k, v split from one
    projection) compile with one, so Inductor's caches serve them."""
    return any(n.op == "call_function" and "as_strided" in str(n.target) for n in gm.graph.nodes)


def _layout(tensors: list, ptrs: list[int]) -> tuple:
    """What one compilation of a boxed region is specialized to: the inputs'
    strides and storage offsets, and which share storage (``ptrs``: their storages' addresses)."""
    return (*map(_stride, tensors), *map(_offset, tensors), _pattern(ptrs))


def _pattern(ptrs: list[int]) -> tuple | None:
    """``_sharing(ptrs)``, or None where no two inputs share storage."""
    return _sharing(ptrs) if len(set(ptrs)) < len(ptrs) else None


class _HotLayout:
    """The layout a boxed region's calls keep meeting, and its compiled code:
    a call is checked against it without building the layout's key (about 250
    tuples and a hash of them for a training step's backward region): the
    inputs' kinds, sizes and strides by torch's C++ ``TensorGuards``, then their
    storage offsets and storage sharing. Its inputs' requires_grad is part of
    the kinds; with one requiring grad, a call under grad mode is one autograd
    records, which runs the torch calls (``_as_torch_calls``). Sharing is the
    layout's when as many storages are shared and each input shares its
    pattern's first mate's (``_sharing``)."""
    __slots__ = ("layout", "kinds", "offsets", "storages", "mates", "grads", "compiled")

    def __init__(self, layout: tuple, box: list, ptrs: list[int], compiled):
        from torch._C._dynamo.guards import TensorGuards
        self.layout = layout
        self.kinds = TensorGuards(*box, dynamic_dims_sizes=None, dynamic_dims_strides=None).check
        self.offsets = list(map(_offset, box))
        self.storages = len(set(ptrs))
        self.mates = _pattern(ptrs)
        self.grads = any(t.requires_grad for t in box)
        self.compiled = compiled

    def serves(self, box: list, ptrs: list[int]) -> bool:
        return (self.kinds(*box) and list(map(_offset, box)) == self.offsets and len(set(ptrs)) == self.storages
                and (self.mates is None or list(map(ptrs.__getitem__, self.mates)) == ptrs)
                and not (self.grads and torch.is_grad_enabled()))


def _sharing(ptrs: list[int]) -> tuple:
    """Which inputs share storage (each input's first storage mate; ``ptrs``:
    the inputs' storages' addresses): code compiled for one pattern is not
    served to another (a region shared by two cache entries met its inputs
    aliased in one and apart in the other and returned wrong values: jit fuzz
    seed 955 with torchcompile)."""
    first: dict[int, int] = {}
    return tuple(map(first.setdefault, ptrs, range(len(ptrs))))


def _shares(ptrs: list[int]) -> bool:
    """Two of the storages at ``ptrs`` are one (empty storages, address 0, share nothing)."""
    real = [p for p in ptrs if p]
    return len(set(real)) < len(real)


# unbound methods: a region's per-call checks map them over its inputs (faster than a loop in Python)
_storage, _data_ptr = torch.Tensor.untyped_storage, torch.UntypedStorage.data_ptr
_stride, _offset = torch.Tensor.stride, torch.Tensor.storage_offset


class _Unboxed:
    """A region dynamo compiles, called the boxed way: it empties the list it
    gets, but its inputs live until it returns (no early frees)."""
    _boxed_call = True

    def __init__(self, compiled):
        self.compiled = compiled

    def __call__(self, box: list):
        flat = list(box)
        box.clear()
        return self.compiled(*flat)


MAX_ARTIFACTS = 1024      # compiled regions kept for sharing (oldest dropped first)


def structure_key(region: Region) -> tuple:
    """Two regions with equal keys compute the same function of their inputs
    (in ``region.inputs`` order) and return outputs in the same order: same
    symbols, same constants, same tensor metadata, same dataflow."""
    names: dict[str, int] = {}

    def canon(x):
        if isinstance(x, Proxy):
            idx = names.setdefault(x.name, len(names))
            if isinstance(x, TensorProxy):
                return ("T", idx, tuple(x.shape), x.dtype, str(x.device), x.requires_grad)
            return ("P", idx, type(x).__name__)
        if isinstance(x, (list, tuple)):
            return (type(x).__name__, tuple(canon(v) for v in x))
        if isinstance(x, dict):
            return ("dict", tuple((k, canon(v)) for k, v in x.items()))
        return ("C", type(x).__name__, repr(x))

    key: list = [tuple(canon(p) for p in region.inputs)]
    for b in region.bsyms:
        key.append((b.sym, canon(b.args), canon(b.kwargs), canon(b.output)))
    key.append(tuple(canon(p) for p in region.outputs))
    return tuple(key)


torchcompile_executor = TorchCompileExecutor()
