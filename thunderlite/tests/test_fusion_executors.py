"""Fusion executors (issue 10): torchcompile shares one compiled artifact
between regions of the same structure; the shared region former's
``repeat_bounds`` / ``split_region``."""
import pytest
import torch

import thunderlite
from thunderlite.core.tags import Tag
from thunderlite.core.verify import verify_trace
from thunderlite.executors.torchcompile import TorchCompileExecutor, structure_key
from thunderlite.extend import get_executor
from thunderlite.transforms.fusion import Region, fusion_regions, repeat_bounds, split_region


class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.lin(x)) * 0.5


class _Stack(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer() for _ in range(n)])

    def forward(self, x):
        x = x * 2
        for layer in self.layers:
            x = layer(x)
        return x.sum(-1)


def _fusions(trace):
    return [b for b in trace.bound_symbols if Tag.FUSION in b.sym.tags]


def test_identical_layers_share_one_compiled_artifact():
    tc = get_executor("torchcompile")
    ok, reason = tc.is_available()
    if not ok:
        pytest.skip(f"torch.compile executor unavailable: {reason}")
    fresh = TorchCompileExecutor("torchcompile_shared")      # its own artifact cache
    model = _Stack(4)
    x = torch.randn(3, 8)
    jm = thunderlite.jit(model, executors=[fresh])
    with torch.no_grad():
        torch.testing.assert_close(jm(x), model(x))
    final = thunderlite.last_traces(jm)[-1]
    verify_trace(final)
    fusions = _fusions(final)
    impls = {id(f.sym.impl) for f in fusions}
    assert len(fusions) >= 4 and fresh.artifacts == len(impls) < len(fusions)
    layer_pieces = [f for f in fusions if any(s.sym.id == "ltorch.gelu" for s in f.subsymbols)]
    assert len(layer_pieces) == 4 and len({id(f.sym.impl) for f in layer_pieces}) == 1
    before = fresh.artifacts
    bigger = thunderlite.jit(_Stack(6), executors=[fresh])      # same layer structure: nothing new to compile
    with torch.no_grad():
        bigger(x)
    assert fresh.artifacts == before


def test_repeat_bounds_cuts_each_repetition():
    from thunderlite.core import prims
    from thunderlite.core.proxies import TensorProxy
    from thunderlite.core.trace import Trace
    from thunderlite.core.tracectx import tracectx
    trc = Trace()
    with tracectx(trc):
        a = TensorProxy((4,), name=trc.claim_name("a"))
        trc.args = [a]
        x = prims.neg(a)
        for i in range(3):
            trc.source = ("model.py", 10, "x = (x * 2).sin()")
            x = prims.sin(prims.mul(x, 2.0))
        trc.source = ("model.py", 20, "return x.cos()")
        trc.set_return(prims.cos(x))
    (region,) = fusion_regions(trc, lambda b: True)
    bounds = repeat_bounds(region)
    pieces = split_region(region, bounds)
    assert [len(p.bsyms) for p in pieces] == [1, 2, 2, 2, 1]
    assert [p.outputs for p in pieces[:-1]] == [[p.bsyms[-1].output] for p in pieces[:-1]]
    assert pieces[-1].outputs == region.outputs
    keys = [structure_key(p) for p in pieces[1:4]]
    assert keys[0] == keys[1] == keys[2] and structure_key(pieces[0]) != keys[0]
    assert repeat_bounds(Region(region.bsyms[:2], [], [])) == [0, 2]
