"""The nvFuser executor: regions of the trace compiled by nvFuser (``nvfuser_direct``).

Available only with CUDA and the ``nvfuser_direct`` package, NVIDIA's wheel
for the CUDA toolkit and torch release in use (``install_hint``: from
NVIDIA's index, https://pypi.nvidia.com); otherwise it is skipped with the
reason in ``examine``. Regions come from the shared region former
(transforms/fusion.py). A symbol joins a region when every prim it decomposes
into has a translation (``translate.TRANSLATIONS``) that accepts the call,
its tensors are CUDA tensors, and it neither writes memory nor draws random
numbers. A region is translated prim by prim into one ``FusionDefinition``
when it first runs; compiled definitions are cached by the input descriptors
(shape, strides, dtype, device of each tensor; the type of each number), so a
new layout compiles a new fusion and an old one is reused.

Outputs of a region are fresh tensors (nvFuser never returns views), which is
why symbols that return a view of an input that is written later stay out:
after ``update_aliases`` such writes are carried by alias barriers, which are
never fusible.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch

from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.specialize import MissingSize, hint_values, size_inputs, sizes_of, specialize
from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.symint import mentions_symbolic
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.executors.base import FusionExecutor
from thunderlite.executors.cost import keep_kernel
from thunderlite.executors.nvfuser import translate
from thunderlite.transforms.fusion import Region, fuse

_UNFUSIBLE = frozenset({Tag.RANDOM, Tag.INPLACE, Tag.ALIAS_BARRIER, Tag.DONT_DCE, Tag.RETURN, Tag.OPAQUE})


def descriptor(x: Any) -> tuple:
    """What a compiled fusion depends on, for one runtime input."""
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), x.dtype, x.device)
    return ("S", type(x))


class NvFuserFusion:
    """The callable of one region: builds and caches one FusionDefinition per
    input descriptor, runs it, returns the region's outputs as a tuple."""

    def __init__(self, name: str, region: Region, inputs: list | None = None):
        self.name = name
        self.inputs = list(region.inputs) if inputs is None else inputs
        self.bsyms = list(region.bsyms)
        self.outputs = list(region.outputs)
        self.symbolic = any(mentions_symbolic(b) for b in self.bsyms)
        self.cache: dict[tuple, Any] = {}

    def __call__(self, *args):
        key = tuple(descriptor(a) for a in args)
        if self.symbolic:       # sizes that only int inputs carry are part of what a definition fixes
            key += tuple(a for a in args if type(a) is int)
        fd = self.cache.get(key)
        if fd is None:
            fd = self.cache[key] = self.define(args)
        return tuple(fd.execute(list(args)))

    def define(self, args) -> Any:
        """Translate the region prim by prim into a FusionDefinition for these
        inputs; a region traced with symbolic sizes is specialized to theirs
        first (core/specialize.py), so each set of sizes gets its definition."""
        from nvfuser_direct import FusionDefinition
        bsyms = self.bsyms
        if self.symbolic:
            bsyms = specialize(bsyms, sizes_of(self.inputs, list(args)))[0]
        with FusionDefinition() as fd:
            env: dict[str, Any] = {}
            for p, a in zip(self.inputs, args, strict=True):
                if isinstance(a, torch.Tensor):
                    env[p.name] = fd.from_pytorch(a, static_sizes=True)
                else:
                    env[p.name] = fd.define_scalar(dtype=translate.nv_dtype(
                        {bool: torch.bool, int: torch.int64, float: torch.float64}[type(a)]))
            for bsym in bsyms:
                for leaf in walk(bsym):
                    if not leaf.subsymbols:
                        self._translate(fd, leaf, env)
            for o in self.outputs:
                fd.add_output(env[o.name])
        return fd

    @staticmethod
    def _translate(fd, leaf: BoundSymbol, env: dict) -> None:
        def lookup(x):
            if isinstance(x, Proxy):
                return env[x.name]
            if isinstance(x, (list, tuple)):
                return type(x)(lookup(v) for v in x)
            return x
        args = tuple(lookup(a) for a in leaf.args)
        kwargs = {k: lookup(v) for k, v in leaf.kwargs.items()}
        out = translate.TRANSLATIONS[leaf.sym.name](fd, leaf, args, kwargs)
        outs = leaf.flat_outs()
        values = list(out) if isinstance(out, (tuple, list)) else [out]
        for o, v in zip(outs, values, strict=True):
            if isinstance(o, Proxy):
                env[o.name] = v


def install_hint() -> str:
    """How to get nvFuser for this torch, as NVIDIA documents it (the NVIDIA/Fuser
    README): wheels built per CUDA toolkit and torch release, on pypi.org and
    NVIDIA's index; the plain ``nvfuser`` name on PyPI is an old build without
    ``nvfuser_direct``, and ``nvfuser-cuXXY`` on pypi.org are placeholders."""
    cuda = "".join((torch.version.cuda or "12.8").split(".")[:2])
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return (f"install NVIDIA's build for CUDA {torch.version.cuda or '12.x'} and torch {major}.{minor}: "
            f"pip install nvfuser-cu{cuda}-torch{major}{minor} --extra-index-url https://pypi.nvidia.com "
            f"(for a torch nightly: pip install --pre nvfuser-cu{cuda} --extra-index-url https://pypi.nvidia.com)")


class NvFuserExecutor(FusionExecutor):
    """Fuses regions of at least ``min_size`` symbols into nvFuser fusions."""
    symbolic_sizes = True       # a region with symbolic sizes is defined per concrete sizes at run time

    def __init__(self, name: str = "nvfuser", *, min_size: int = 1):
        super().__init__(name)
        self.min_size = min_size
        self._counter = itertools.count()

    def check_availability(self) -> tuple[bool, str]:
        if not torch.cuda.is_available():
            return False, "nvFuser needs CUDA (torch.cuda.is_available() is False)"
        try:
            import nvfuser_direct  # noqa: F401
        except ImportError as e:
            return False, f"the nvfuser_direct package is not importable ({e}); {install_hint()}"
        return True, ""

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        if bsym.sym.tags & _UNFUSIBLE or bsym.sym.executor is not None:
            return False
        if mentions_symbolic(bsym):     # judged at its traced sizes; sizes known only at run time are refused
            try:
                bsym = specialize([bsym], hint_values([bsym]))[0][0]
            except MissingSize:
                return False
        outs = bsym.flat_outs()
        if not outs or not all(type(o) is TensorProxy for o in outs):
            return False
        if not bsym.subsymbols:
            return bsym.sym.is_prim and translate.accepts(bsym)
        if bsym.sym.torch_fn is not None and keep_kernel(bsym)[0]:
            return False            # attention: its one torch call beats its decomposition fused around matmuls
        return all(self.can_fuse(sub) if sub.subsymbols else
                   (not sub.sym.tags & _UNFUSIBLE and sub.sym.is_prim and translate.accepts(sub))
                   for sub in bsym.subsymbols)

    def fusion_pass(self, trace: Trace, input_alias_groups=None) -> Trace:
        return fuse(trace, self.can_fuse, lambda region: self._make_fusion(trace, region), min_size=self.min_size,
                    input_alias_groups=input_alias_groups)

    def _make_fusion(self, trace: Trace, region: Region) -> BoundSymbol:
        name = f"fusion{next(self._counter)}"
        inputs = list(region.inputs)
        if any(mentions_symbolic(b) for b in region.bsyms):     # the size symbols its shapes use come in too
            inputs += size_inputs(trace, region.bsyms, inputs)
        fn = NvFuserFusion(name, region, inputs)
        sym = self.fusion_symbol(name, fn)
        return sym.bind(*inputs, output=tuple(region.outputs), subsymbols=tuple(region.bsyms),
                        source=region.bsyms[0].source)


nvfuser_executor = NvFuserExecutor()
