"""The Triton executor: a fusion executor whose kernels are generated from the trace.

Regions come from the shared region former (transforms/fusion.py) with a
predicate that accepts a symbol when it alone would make a kernel
(triton/plan.py). A region is then cut greedily into consecutive pieces that each
analyse as ONE kernel (a consecutive run of a topological order is still free of
cycles); each piece becomes a fusion symbol ``triton.fusion<N>`` whose subsymbols
are the piece's symbols and whose callable launches the generated kernel
(triton/codegen.py). Everything the analysis refuses stays in the trace for the
next executor.

Where it runs: natively on CUDA tensors, or under the Triton interpreter on CPU
tensors when there is no GPU (triton/runtime.py explains the choice of mode). The
interpreter is slow: use it to check correctness, not speed. ``triton`` is
imported only when the executor is first asked whether it is available, so
``import thunderlite`` does not pay for it. ``kernel_source(jfn)`` returns the
source of the kernels of a jitted function's last call.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from thunderlite.core.proxies import TensorProxy
from thunderlite.core.specialize import MissingSize, hint_values, size_inputs, sizes_of, specialize
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.symint import mentions_symbolic
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.executors.base import FusionExecutor
from thunderlite.executors.cost import keep_kernel
from thunderlite.executors.torchex import torch_executor
from thunderlite.executors.triton.plan import Plan, Unsupported, plan_region
from thunderlite.transforms.claim import claim_executors
from thunderlite.transforms.fusion import fusion_regions, reorder


class TritonKernel:
    """The callable of one fusion symbol: allocates the outputs and launches the kernel.

    Its tiling is chosen on the first call: by timing the candidate configurations on
    the real inputs when autotuning is on (triton/autotune.py; the choice is cached on
    disk), else the heuristic's, which ``spec`` holds until then.

    A kernel is not differentiable. When autograd is recording (grad mode on and an
    input requiring grad: an eager-mode program, see executors/autograd_function.py)
    the region runs as its torch calls (``torch_fallback``) so that autograd records
    it as eager would. A differentiable jit call runs its forward with grad mode off,
    so the kernel runs there."""

    def __init__(self, spec, kernel: Callable, runtime, torch_fallback: Callable, tune: bool = False,
                 device: torch.device | None = None):
        self.spec = spec
        self.device = device            # of the outputs, for a kernel without inputs (an iota)
        self.torch_fallback = torch_fallback
        self._kernel = kernel
        self._rt = runtime
        self._tune = tune
        plan: Plan = spec.plan
        self._inputs = [(v.shape, [j for j, d in enumerate(v.amap) if d is not None]) for v in plan.inputs]
        self._outputs = [(v.shape, v.dtype, [j for j, d in enumerate(v.amap) if d is not None])
                         for v in plan.outputs]
        self._scalars = [plan.M, plan.N, *plan.domain]

    @property
    def source(self) -> str:
        return self.spec.source

    def __repr__(self):
        return f"<TritonKernel {self.spec.fn_name}>"

    def __call__(self, *tensors: torch.Tensor):
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self.torch_fallback(*tensors)
        device = tensors[0].device if tensors else self.device
        outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, _ in self._outputs]
        strides = []
        for t, (shape, dims) in zip(tensors, self._inputs, strict=True):
            if tuple(t.shape) != shape:
                raise RuntimeError(f"{self.spec.fn_name}: input of shape {tuple(t.shape)}, compiled for {shape}")
            strides += [t.stride(j) for j in dims]
        for t, (_, _, dims) in zip(outs, self._outputs, strict=True):
            strides += [t.stride(j) for j in dims]
        args = [*tensors, *outs, *self._scalars, *strides]
        if self._tune:
            self._tune = False
            self._autotune(args, device)
        self._run(self._kernel, self.spec, args)
        return tuple(outs)

    def _run(self, kernel: Callable, spec, args: list) -> None:
        self._rt.launch(kernel, spec.grid, args, {"BM": spec.BM, "BN": spec.BN}, spec.num_warps, spec.num_stages)

    def _autotune(self, args: list, device: torch.device) -> None:
        """Replace the heuristic spec by the fastest candidate (or the cached choice)."""
        from thunderlite.executors.triton import autotune, tiling
        from thunderlite.executors.triton.codegen import generate
        rt, plan = self._rt, self.spec.plan
        key = autotune.cache_key(self.spec.source, plan, rt.device_name(device), rt.triton_version())
        specs: dict = {}

        def compiled(config):
            if config not in specs:
                spec = self.spec if config == self.spec.config else generate(plan, rt.INTERPRET, config)
                specs[config] = (spec, rt.load_kernel(spec.source, spec.fn_name, tuple(spec.scalar_args)))
            return specs[config]

        def run_for(config):
            spec, kernel = compiled(config)
            return lambda: self._run(kernel, spec, args)
        best = autotune.choose(key, tiling.candidate_configs(plan, rt.INTERPRET), autotune.timer or rt.bench, run_for)
        self.spec, self._kernel = compiled(best)


class TritonExecutor(FusionExecutor):
    """Generates one Triton kernel per claimed region (see the module docstring).

    ``max_prims``: the longest region (in prims) analysed as one kernel; longer
    runs are cut, which bounds the greedy cutting's cost."""
    symbolic_sizes = True       # a region with symbolic sizes compiles per concrete sizes at run time

    def __init__(self, name: str = "triton", *, max_prims: int = 400):
        super().__init__(name)
        self.max_prims = max_prims
        self._counter = itertools.count()
        self._internal: frozenset = frozenset()    # during a fusion pass: see _expand_composites

    def check_availability(self) -> tuple[bool, str]:
        from thunderlite.executors.triton import runtime
        return runtime.availability()

    def _runtime(self):
        from thunderlite.executors.triton import runtime
        return runtime

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        """Whether ``bsym`` alone would be one kernel (on this mode's device type)."""
        if bsym.sym.executor is not None:
            return False
        if mentions_symbolic(bsym):     # analysed as traced; run per concrete sizes (SizedTritonKernel)
            try:
                bsym = specialize([bsym], hint_values([bsym]))[0][0]
            except MissingSize:         # a size known only at run time (nonzero's length): no traced value
                return False
        device_type = self._runtime().DEVICE_TYPE
        proxies = bsym.proxy_args() + bsym.proxy_outs()
        if not proxies or not all(type(p) is TensorProxy and p.device.type == device_type for p in proxies):
            return False
        try:
            plan_region([bsym], _unique(bsym.proxy_args()), bsym.proxy_outs(), self._runtime().DTYPES,
                        self._internal)
        except Unsupported:
            return False
        return True

    def fusion_pass(self, trace: Trace, input_alias_groups=None) -> Trace:
        if not self.is_available()[0]:
            return trace
        return _triton_fusion(trace, self, input_alias_groups)

    def pieces(self, bsyms: list[BoundSymbol]) -> list[list[BoundSymbol]]:
        """``bsyms`` cut into consecutive runs that each analyse as one kernel."""
        out: list[list[BoundSymbol]] = []
        run: list[BoundSymbol] = []
        for b in bsyms:
            if run and self._one_kernel(run + [b]):
                run.append(b)
                continue
            if run:
                out.append(run)
            run = [b]
        if run:
            out.append(run)
        return out

    def _one_kernel(self, bsyms: list[BoundSymbol]) -> bool:
        if any(mentions_symbolic(b) for b in bsyms):
            try:
                bsyms = specialize(bsyms, hint_values(bsyms))[0]
            except MissingSize:
                return False
        defined = {p.name for b in bsyms for p in b.proxy_outs()}
        inputs = _unique([p for b in bsyms for p in b.proxy_args() if p.name not in defined])
        try:
            plan = plan_region(bsyms, inputs, [p for b in bsyms for p in b.proxy_outs()], self._runtime().DTYPES,
                               self._internal)
        except Unsupported:
            return False
        return len(plan.ops) <= self.max_prims

    def make_fusion(self, trace: Trace, region) -> BoundSymbol:
        name = f"fusion{next(self._counter)}"
        fallback = _torch_callable(trace, region, name)
        inputs = list(region.inputs)
        if any(mentions_symbolic(b) for b in region.bsyms):
            inputs += size_inputs(trace, region.bsyms, inputs)
            impl = SizedTritonKernel(self, region, inputs, fallback)
        else:
            impl = self.kernel(region.bsyms, region.inputs, region.outputs, fallback)
        sym = self.fusion_symbol(name, impl)
        return sym.bind(*inputs, output=tuple(region.outputs), subsymbols=tuple(region.bsyms),
                        source=region.bsyms[0].source)

    def kernel(self, bsyms: list[BoundSymbol], inputs: list, outputs: list, fallback: Callable) -> TritonKernel:
        """The compiled kernel of a region whose sizes are all static."""
        from thunderlite.executors.triton import autotune
        from thunderlite.executors.triton.codegen import generate
        rt = self._runtime()
        plan = plan_region(bsyms, inputs, outputs, rt.DTYPES, self._internal)
        spec = generate(plan, rt.INTERPRET)
        kernel = rt.load_kernel(spec.source, spec.fn_name, tuple(spec.scalar_args))
        return TritonKernel(spec, kernel, rt, fallback, tune=autotune.enabled(rt.INTERPRET), device=outputs[0].device)


class SizedTritonKernel:
    """The callable of a region whose sizes are symbolic: on each call the
    concrete sizes (read from its int inputs and its tensors' shapes) pick a
    kernel compiled for them, made on first use (the planner and the
    generated code work on static shapes). Sizes it cannot read run the region
    as its torch calls, as an autograd-recording call does."""

    def __init__(self, ex: TritonExecutor, region, inputs: list, torch_fallback: Callable):
        self.ex = ex
        self.bsyms = list(region.bsyms)
        self.inputs = inputs            # the region's inputs, then the size symbols its shapes read
        self.n_region_inputs = len(region.inputs)
        self.outputs = list(region.outputs)
        self.torch_fallback = torch_fallback
        self.tensor_positions = [i for i, p in enumerate(self.inputs) if type(p) is TensorProxy]
        self.kernels: dict[tuple, TritonKernel] = {}

    @property
    def source(self) -> str:
        """The source of every kernel compiled so far, one per set of sizes."""
        return "\n\n".join(f"# sizes {dict(key)}\n{k.source}" for key, k in self.kernels.items())

    def __repr__(self):
        return f"<SizedTritonKernel {len(self.kernels)} size(s)>"

    def __call__(self, *args):
        tensors = [args[i] for i in self.tensor_positions]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self.torch_fallback(*args[:self.n_region_inputs])
        values = sizes_of(self.inputs, list(args))
        key = tuple(sorted(values.items()))
        kernel = self.kernels.get(key)
        if kernel is None:
            try:
                bsyms, conv = specialize(self.bsyms, values)
            except MissingSize:
                return self.torch_fallback(*args[:self.n_region_inputs])
            inputs = [conv(self.inputs[i]) for i in self.tensor_positions]
            kernel = self.kernels[key] = self.ex.kernel(bsyms, inputs, [conv(o) for o in self.outputs],
                                                        self.torch_fallback)
        return kernel(*tensors)


def _torch_callable(trace: Trace, region, name: str) -> Callable:
    """The region as a program of torch calls (what runs while autograd records)."""
    sub = Trace(name, stage="triton region (torch fallback)", names=trace.names)
    sub.args = list(region.inputs)
    sub.bound_symbols[:] = region.bsyms
    sub.set_return(tuple(region.outputs))
    return claim_executors(sub, [torch_executor]).python_callable()


def _unique(proxies: list) -> list:
    seen, out = set(), []
    for p in proxies:
        if p.name not in seen:
            seen.add(p.name)
            out.append(p)
    return out


@trace_pass("triton fusion")
def _triton_fusion(trace: Trace, ex: TritonExecutor, input_alias_groups=None) -> Trace:
    """Reorder (shared former), find the fusible runs, cut them into kernels, replace each."""
    cache: dict[int, bool] = {}

    def can_fuse(b: BoundSymbol) -> bool:
        hit = cache.get(id(b))
        if hit is None:
            hit = cache[id(b)] = ex.can_fuse(b)
        return hit

    trace, ex._internal = _expand_composites(trace, ex, ex.can_fuse)     # uncached: the answers change
    try:
        return _fuse(trace, ex, can_fuse, input_alias_groups)
    finally:
        ex._internal = frozenset()


def _fuse(trace: Trace, ex: TritonExecutor, can_fuse, input_alias_groups) -> Trace:
    ordered = reorder(trace, can_fuse, input_alias_groups)
    fused: dict[int, BoundSymbol] = {}          # id of a piece's first symbol -> its fusion symbol
    skip: set[int] = set()
    for region in fusion_regions(ordered, can_fuse):
        for piece in ex.pieces(region.bsyms):
            ids = {id(b) for b in piece}
            (exact,) = fusion_regions(ordered, lambda b: id(b) in ids)    # the piece's own inputs/outputs
            fused[id(piece[0])] = ex.make_fusion(ordered, exact)
            skip.update(ids)
    if not fused:
        return trace
    out = [fused.get(id(b), b) for b in ordered.bound_symbols if id(b) not in skip or id(b) in fused]
    return ordered.with_bound_symbols("triton fusion", out)


def _expand_composites(trace: Trace, ex: TritonExecutor, can_fuse: Callable[[BoundSymbol], bool]
                       ) -> tuple[Trace, frozenset]:
    """Composites that are not one kernel but whose decomposition is all kernels (a layer
    norm's backward: row reductions for the input's gradient, column sums for the
    weight's) replaced by that decomposition, so the cutter makes it a few kernels
    instead of leaving it whole to the next executor. A composite holding anything the
    executor cannot run (a matmul, attention) stays whole, and so does one the cost
    model keeps whole (``cost.keep_kernel``).
    Also returns the names of the values internal to the decomposed composites: a view
    among them (an ``unsqueeze`` inside a loss) may then be computed fresh by a kernel."""
    out: list[BoundSymbol] = []
    internal: set[str] = set()
    for b in trace.bound_symbols:
        if b.sym.executor is not None or can_fuse(b) or b.sym.decomposition is None or not b.subsymbols or \
                (b.sym.torch_fn is not None and keep_kernel(b)[0]):
            out.append(b)
            continue
        mine = frozenset(p.name for s in _leaves(b) for p in s.proxy_outs()) - {p.name for p in b.proxy_outs()}
        ex._internal = frozenset(internal | mine)
        leaves = _fusible_leaves(b, can_fuse)
        ex._internal = frozenset(internal)
        if leaves is None:
            out.append(b)
            continue
        out += leaves
        internal |= mine
    if len(out) == len(trace.bound_symbols):
        return trace, frozenset(internal)
    return trace.with_bound_symbols("triton fusion", out), frozenset(internal)


def _leaves(b: BoundSymbol) -> list[BoundSymbol]:
    return [s for sub in b.subsymbols for s in ([sub] + _leaves(sub))]


def _fusible_leaves(b: BoundSymbol, can_fuse: Callable[[BoundSymbol], bool]) -> list[BoundSymbol] | None:
    """``[b]`` if it is one kernel, else its decomposition's kernels (recursively), else None."""
    if can_fuse(b):
        return [b]
    if b.sym.executor is not None or b.sym.decomposition is None or not b.subsymbols or b.sym.tags & _KEEP_WHOLE:
        return None
    out: list[BoundSymbol] = []
    for sub in b.parts():
        leaves = _fusible_leaves(sub, can_fuse)
        if leaves is None:
            return None
        out += leaves
    return out


_KEEP_WHOLE = frozenset({Tag.RANDOM, Tag.INPLACE, Tag.ALIAS_BARRIER, Tag.DONT_DCE, Tag.RETURN, Tag.ORDER_BARRIER,
                         Tag.OPAQUE})


triton_executor = TritonExecutor()


def kernel_sources(traces: dict) -> str:
    """The generated Triton source of every kernel the final traces ran
    (``{"forward": trace, "backward": trace or None}``), each under a comment
    naming its fusion symbol. Empty if the Triton executor claimed nothing."""
    parts = []
    for label, trace in traces.items():
        if trace is None:
            continue
        for bsym in trace.bound_symbols:
            impl = bsym.sym.impl
            if isinstance(impl, (TritonKernel, SizedTritonKernel)):
                parts.append(f"# {label}: {bsym.sym.module}.{bsym.sym.name} "
                             f"({', '.join(o.name for o in bsym.proxy_outs())})\n{impl.source}")
    return "\n\n".join(parts)
