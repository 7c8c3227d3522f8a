"""The torch.compile executor: a fusion executor that compiles regions of a
trace with ``torch.compile`` (Inductor; on CPU it needs a C++ compiler).

Regions come from the shared dataflow region former (transforms/fusion.py).
A region holds only symbols the torch executor can run as one torch call and
that are safe to hand to Dynamo: no random ops (Inductor draws differently from
eager, which would break reproducibility, see core/prims.py), no writes into
memory, no alias barriers, nothing that returns a Python number. Each region
becomes a small trace of torch calls, compiled to Python and then by
``torch.compile``; the fusion symbol prints as ``torchcompile.fusion<N>`` and
keeps the region's symbols as subsymbols.
"""
from __future__ import annotations

import itertools
import shutil

import torch

from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.executors.base import FusionExecutor
from thunderlite.executors.torchex import torch_executor
from thunderlite.transforms.claim import claim_executors
from thunderlite.transforms.fusion import Region, fuse

_UNFUSIBLE = frozenset({Tag.RANDOM, Tag.INPLACE, Tag.ALIAS_BARRIER, Tag.DONT_DCE, Tag.RETURN})


class TorchCompileExecutor(FusionExecutor):
    """Compiles fusible regions of at least ``min_size`` symbols with torch.compile."""

    def __init__(self, name: str = "torchcompile", *, min_size: int = 2, compile_options: dict | None = None):
        super().__init__(name)
        self.min_size = min_size
        self.compile_options = {"dynamic": False, **(compile_options or {})}
        self._counter = itertools.count()

    def check_availability(self) -> tuple[bool, str]:
        if not hasattr(torch, "compile"):
            return False, "this torch has no torch.compile"
        if not torch.cuda.is_available() and shutil.which("g++") is None and shutil.which("c++") is None:
            return False, "Inductor on CPU needs a C++ compiler (g++ or c++) on PATH"
        return True, ""

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        if bsym.sym.tags & _UNFUSIBLE or bsym.sym.executor is not None:
            return False
        if not all(type(o) is TensorProxy for o in bsym.flat_outs()):
            return False
        if torch_executor.claim(bsym) is not None:
            return True
        return bsym.sym.decomposition is not None and bool(bsym.subsymbols) and all(
            self.can_fuse(sub) for sub in bsym.subsymbols)

    def fusion_pass(self, trace: Trace, input_alias_groups=None) -> Trace:
        return fuse(trace, self.can_fuse, lambda region: self._make_fusion(trace, region),
                    min_size=self.min_size, input_alias_groups=input_alias_groups)

    def _make_fusion(self, trace: Trace, region: Region) -> BoundSymbol:
        name = f"fusion{next(self._counter)}"
        sub = Trace(name, stage=f"{self.name} region", names=trace.names)
        sub.args = list(region.inputs)
        sub.bound_symbols[:] = region.bsyms
        sub.set_return(tuple(region.outputs))
        sub = claim_executors(sub, [torch_executor])
        compiled = torch.compile(sub.python_callable(), **self.compile_options)
        compiled.__thunderlite_trace__ = sub
        sym = self.fusion_symbol(name, compiled)
        return sym.bind(*region.inputs, output=tuple(region.outputs), subsymbols=tuple(region.bsyms),
                        source=region.bsyms[0].source)


torchcompile_executor = TorchCompileExecutor()
