"""Fusion executors (issue 10): torchcompile shares one compiled artifact
between regions of the same structure; the shared region former's
``repeat_span`` / ``span_bounds`` / ``split_region``."""
from collections.abc import Callable

import pytest
import torch

import thunderlite
from thunderlite.core import prims
from thunderlite.core.proxies import NumberProxy, TensorProxy
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.core.verify import verify_trace
from thunderlite.executors.torchcompile import TorchCompileExecutor, structure_key
from thunderlite.extend import get_executor
from thunderlite.transforms.fusion import Region, fusion_regions, repeat_span, span_bounds, split_region


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
    fresh = TorchCompileExecutor("torchcompile_shared", layers_per_region=1)      # its own artifact cache
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


def _region_of_three_layers(layer: Callable[[Trace, TensorProxy], TensorProxy]) -> Region:
    """The one fusion region of a trace computing ``neg``, then ``layer`` three
    times (it sets the trace's source lines), then ``cos``: a model's repeated
    layers between a first and a last op."""
    trc = Trace()
    with tracectx(trc):
        a = TensorProxy((4,), name=trc.claim_name("a"))
        trc.args = [a]
        x = prims.neg(a)
        for _ in range(3):
            x = layer(trc, x)
        trc.source = ("model.py", 99, "return x.cos()")
        trc.set_return(prims.cos(x))
    (region,) = fusion_regions(trc, lambda b: True)
    return region


def test_repeated_layers_are_cut_one_to_a_piece():
    def layer(trc, x):
        trc.source = ("model.py", 10, "x = (x * 2).sin()")
        return prims.sin(prims.mul(x, 2.0))
    region = _region_of_three_layers(layer)
    bounds = span_bounds(len(region.bsyms), repeat_span(region))
    pieces = split_region(region, bounds)
    assert [len(p.bsyms) for p in pieces] == [1, 2, 2, 2, 1]
    assert [p.outputs for p in pieces[:-1]] == [[p.bsyms[-1].output] for p in pieces[:-1]]
    assert pieces[-1].outputs == region.outputs
    keys = [structure_key(p) for p in pieces[1:4]]
    assert keys[0] == keys[1] == keys[2] and structure_key(pieces[0]) != keys[0]
    assert repeat_span(Region(region.bsyms[:2], [], [])) is None


def test_small_layers_share_a_region_big_layers_get_their_own(monkeypatch):
    """The default groups repeated layers by their estimated work
    (executors/cost.py): layers computing for microseconds or milliseconds go
    several to a region (each cut costs a region call on the host and
    Inductor's fusion across it), layers computing for a quarter of a second or
    more one to a region (one compilation shared by all). CPU estimates divide
    by torch's thread count, so the numbers below are for one thread (a
    16-core GPU host runs 16: a layer there is 16x cheaper, the last check)."""
    from thunderlite.executors.cost import MAX_LAYERS_PER_REGION, estimated_seconds, group_size, layers_per_region
    tc = get_executor("torchcompile")
    ok, reason = tc.is_available()
    if not ok:
        pytest.skip(f"torch.compile executor unavailable: {reason}")
    model, x = _Stack(4), torch.randn(3, 8)
    jm = thunderlite.jit(model, executors=[TorchCompileExecutor("torchcompile_grouped")])
    with torch.no_grad():
        torch.testing.assert_close(jm(x), model(x))
    (fusion,) = _fusions(thunderlite.last_traces(jm)[-1])
    assert [s.sym.id for s in fusion.subsymbols].count("ltorch.gelu") == 4

    def layer(n: int, dtype=torch.float32, device="cpu"):
        from thunderlite.torch.ops import elementwise as ew
        from thunderlite.torch.ops import linalg
        trc = Trace()
        with tracectx(trc):
            h = TensorProxy((n, n), dtype, device, name="h")
            trc.args = [h]
            trc.set_return(ew.add(h, linalg.matmul(h, h)))
        return trc.bound_symbols
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert 1e-8 < estimated_seconds(layer(16)) < 1e-5 and layers_per_region(layer(16), 6) == 6
    assert layers_per_region(layer(16), 40) == MAX_LAYERS_PER_REGION
    assert layers_per_region(layer(16), MAX_LAYERS_PER_REGION + 2) == MAX_LAYERS_PER_REGION // 2 + 1   # evened out
    assert [group_size(2.5, 8), group_size(3, 4), group_size(3, 7), group_size(0.2, 5),
            group_size(4, 4)] == [2, 2, 3, 1, 4]
    assert estimated_seconds(layer(2048)) > 0.25 and layers_per_region(layer(2048), 6) == 1
    # a GPU computes the same layer hundreds of times faster: grouped there
    assert layers_per_region(layer(1536), 4) == 2 and layers_per_region(layer(1536, torch.bfloat16, "cuda"), 4) == 4
    one_thread = estimated_seconds(layer(4096))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert estimated_seconds(layer(4096)) == pytest.approx(one_thread / 16) and layers_per_region(layer(4096), 6) == 2


def test_layers_of_symbolic_sizes_are_grouped_at_their_traced_sizes():
    """A symbolic size counts at the value it was traced with (its hint): a
    decode step's cheap layers go to one region, not one region per layer
    (each a region call on every token). The region serves other sizes."""
    from thunderlite.executors.cost import estimated_seconds
    tc = get_executor("torchcompile")
    ok, reason = tc.is_available()
    if not ok:
        pytest.skip(f"torch.compile executor unavailable: {reason}")
    model = _Stack(4)
    jm = thunderlite.jit(model, executors=[TorchCompileExecutor("torchcompile_symbolic_grouped")], dynamic=True)
    with torch.no_grad():
        for n in (3, 5, 9):
            x = torch.randn(n, 8)
            torch.testing.assert_close(jm(x), model(x))
    trace = thunderlite.last_traces(jm)[-1]
    assert any(type(s) is not int for p in trace.args if isinstance(p, TensorProxy) for s in p.shape)
    (fusion,) = _fusions(trace)
    assert [s.sym.id for s in fusion.subsymbols].count("ltorch.gelu") == 4
    assert 0 < estimated_seconds(fusion.subsymbols) < 1e-3


def test_cost_estimates_symbolic_sizes_at_their_hints_and_gives_up_on_data_dependent_ones():
    """A size symbol counts at its traced value; a data-dependent one (no
    value while tracing) makes the estimate unknown (one layer a region) and
    keeps a kernel whole, even where only a matmul's contraction is
    data-dependent and its output's sizes are known."""
    from thunderlite.core.symint import ShapeEnv
    from thunderlite.executors.cost import estimated_seconds, keep_kernel
    from thunderlite.torch.ops import linalg
    env = ShapeEnv()
    u0 = env.unbacked_symbol(NumberProxy(None, int, name="u0"), "the length of torch.nonzero(x)")
    s0 = env.size_symbol(NumberProxy(None, int, name="s0"), 64, "a dynamic dim")

    def matmul_over(inner):
        trc = Trace()
        with tracectx(trc):
            a = TensorProxy((4, inner), torch.float32, "cpu", name="a")
            b = TensorProxy((inner, 4), torch.float32, "cpu", name="b")
            trc.args = [a, b]
            trc.set_return(linalg.matmul(a, b))
        return trc.bound_symbols[0]
    hinted, unknown = matmul_over(s0), matmul_over(u0)
    static = matmul_over(64)
    assert estimated_seconds([static]) > 0 and estimated_seconds([hinted]) == pytest.approx(estimated_seconds([static]))
    assert estimated_seconds([unknown]) is None
    assert keep_kernel(unknown) == (True, "sizes known only at run time: the kernel runs")
    assert keep_kernel(static)[0] is False


def test_layers_per_region_groups_consecutive_layers_sharing_one_artifact():
    tc = get_executor("torchcompile")
    ok, reason = tc.is_available()
    if not ok:
        pytest.skip(f"torch.compile executor unavailable: {reason}")
    fresh = TorchCompileExecutor("torchcompile_pairs", layers_per_region=2)
    model, x = _Stack(5), torch.randn(3, 8)
    jm = thunderlite.jit(model, executors=[fresh])
    with torch.no_grad():
        torch.testing.assert_close(jm(x), model(x))
    layered = [f for f in _fusions(thunderlite.last_traces(jm)[-1])
               if any(s.sym.id == "ltorch.gelu" for s in f.subsymbols)]
    assert [[s.sym.id for s in f.subsymbols].count("ltorch.gelu") for f in layered] == [2, 2, 1]
    assert layered[0].sym.impl is layered[1].sym.impl is not layered[2].sym.impl


def test_span_bounds_groups_repetitions():
    assert span_bounds(12, (1, 2, 5), 1) == [0, 1, 3, 5, 7, 9, 11, 12]
    assert span_bounds(12, (1, 2, 5), 2) == [0, 1, 5, 9, 11, 12]
    assert span_bounds(12, (1, 2, 5), 5) == span_bounds(12, None) == [0, 12]


def test_repeat_span_finds_layers_behind_more_frequent_inner_repeats():
    """A backward's layer repeats its own short patterns (q, k and v alike; a
    linear's two matmuls) more often than the layer period itself occurs."""
    body = ["s1", *["m"] * 4, "s2", *["e", "x"] * 3, *["p", "q", "r"] * 2, *["a", "b", "c", "d"] * 2, "end"]
    lines = {tag: 10 + i for i, tag in enumerate(dict.fromkeys(body))}

    def layer(trc, x):
        for tag in body:
            trc.source = ("model.py", lines[tag], tag)
            x = prims.mul(x, 2.0)
        return x
    region = _region_of_three_layers(layer)
    n = len(body)
    assert repeat_span(region) == (1, n, 3)


# --- nvFuser ------------------------------------------------------------------------------------

def test_nvfuser_translation_table_covers_every_prim():
    from thunderlite.executors.nvfuser.translate import TRANSLATIONS, UNSUPPORTED
    names = set(prims.all_prims())
    assert not set(TRANSLATIONS) & set(UNSUPPORTED)
    assert sorted(names - set(TRANSLATIONS) - set(UNSUPPORTED)) == []
    assert sorted((set(TRANSLATIONS) | set(UNSUPPORTED)) - names) == []
    assert all(isinstance(why, str) and len(why) > 10 for why in UNSUPPORTED.values())
    for tag_prim in ("uniform", "copy_"):
        assert tag_prim in UNSUPPORTED


def test_nvfuser_checker_refuses_what_it_cannot_express():
    from thunderlite.executors.nvfuser.translate import accepts
    cuda = torch.device("cuda")
    a = TensorProxy((4, 3), name="a", device=cuda)
    cpu = TensorProxy((4, 3), name="c")
    assert accepts(prims.sin.bind(a, output=a.replace(name="o")))
    assert not accepts(prims.sin.bind(cpu, output=cpu.replace(name="o")))          # CPU tensors stay with torch
    assert not accepts(prims.pad.bind(a, 0.0, ((0, 0, 1), (0, 0, 0)), output=a.replace(name="o")))  # interior
    assert not accepts(prims.sum.bind(a, (), output=a.replace(name="o")))
    assert not accepts(prims.flip.bind(a, (0,), output=a.replace(name="o")))
    z = TensorProxy((4, 3), name="z", device=cuda, dtype=torch.complex64)
    assert accepts(prims.mul.bind(z, NumberProxy(None, float, name="f"), output=z.replace(name="o")))
    assert not accepts(prims.mul.bind(z, NumberProxy(None, complex, name="n"), output=z.replace(name="o")))


def test_nvfuser_leaves_attention_to_its_kernel_and_fuses_a_norms_backward():
    """The cost model (cost.keep_kernel): attention's decomposition would write
    its [B, H, L, S] scores around its matmuls, so nvFuser leaves the
    memory-efficient kernel whole to the torch executor; a norm's backward it fuses."""
    from thunderlite.executors.nvfuser.executor import NvFuserExecutor
    from thunderlite.transforms.autodiff import kernels as K
    cuda = torch.device("cuda")
    trc = Trace()
    with tracectx(trc):
        q = TensorProxy((4, 8, 128, 64), name="q", device=cuda, dtype=torch.bfloat16)
        K.sdpa_efficient(q, q, q, None, True, 0.0, True)        # every output a tensor: nvFuser could take it
        x, w = TensorProxy((512, 256), name="x", device=cuda), TensorProxy((256,), name="w", device=cuda)
        mean = TensorProxy((512, 1), name="mean", device=cuda)
        K.native_layer_norm_backward(x, x, (256,), mean, mean, w, w, [True, True, True])
    attention, norm_backward = trc.bound_symbols
    ex = NvFuserExecutor()
    assert not ex.can_fuse(attention)
    assert ex.can_fuse(norm_backward)


def test_nvfuser_unavailable_is_skipped_with_its_reason():
    nv = get_executor("nvfuser")
    ok, reason = nv.is_available()
    if ok:
        pytest.skip("nvFuser is available here: the execution tests below cover it")
    assert "CUDA" in reason or "nvfuser_direct" in reason
    report = thunderlite.examine(lambda a: a.sin() + 1, torch.randn(3), executors=["nvfuser"])
    assert report.ok and report.skipped["nvfuser"] == reason
    assert f"executor 'nvfuser' skipped: {reason}" in str(report)


def test_nvfuser_install_hint_names_nvidias_index(monkeypatch):
    """Where CUDA is present but the package is not, the reason says where the
    wheel comes from (NVIDIA's index, per CUDA toolkit and torch release)."""
    from thunderlite.executors.nvfuser.executor import install_hint
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu128")
    hint = install_hint()
    assert "pip install nvfuser-cu128-torch211 --extra-index-url https://pypi.nvidia.com" in hint, hint


def _nvfuser_or_skip():
    ok, reason = get_executor("nvfuser").is_available()
    if not ok:
        pytest.skip(f"nvFuser executor unavailable: {reason}")


def test_nvfuser_fuses_an_elementwise_chain_and_a_reduction():
    _nvfuser_or_skip()
    fn = lambda a, b: ((a * b + 1).sin() * 2).sum(-1).exp()   # noqa: E731
    a, b = torch.randn(32, 64, device="cuda"), torch.randn(32, 64, device="cuda")
    jfn = thunderlite.jit(fn, executors=["nvfuser", "torch"])
    torch.testing.assert_close(jfn(a, b), fn(a, b))
    final = thunderlite.last_traces(jfn)[-1]
    verify_trace(final)
    fusions = _fusions(final)
    assert len(fusions) == 1 and fusions[0].sym.executor is get_executor("nvfuser")
    impl = fusions[0].sym.impl
    jfn(a, b)
    jfn(a.t().contiguous().t(), b)                 # a new layout: a second compiled fusion
    assert len(impl.cache) == 2


def test_nvfuser_layer_norm_forward_and_backward_match_eager():
    _nvfuser_or_skip()
    ln = torch.nn.LayerNorm(64).cuda()
    x = torch.randn(8, 64, device="cuda", requires_grad=True)
    jln = thunderlite.jit(ln, executors=["nvfuser", "torch"])
    out = jln(x)
    out.sum().backward()
    gx = x.grad.clone()
    x.grad = None
    ln(x).sum().backward()
    torch.testing.assert_close(out, ln(x))
    torch.testing.assert_close(gx, x.grad)


def test_nvfuser_extra_installs_what_the_executor_imports():
    import ast
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    setup = ast.parse((root / "setup.py").read_text())
    extras = next(ast.literal_eval(kw.value) for node in ast.walk(setup) if isinstance(node, ast.Call)
                  for kw in node.keywords if kw.arg == "extras_require")
    imported = set()
    for name in ("executor.py", "translate.py"):
        for node in ast.walk(ast.parse((root / "thunderlite" / "executors" / "nvfuser" / name).read_text())):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"torch", "thunderlite", "__future__"}
    assert third_party == {"nvfuser_direct"}
    # nvfuser_direct ships in NVIDIA's per-CUDA wheels (nvfuser-cu1XY); the bare "nvfuser" wheel predates it
    (dist,) = extras["nvfuser"]
    assert dist.startswith("nvfuser-cu")


def _torchcompile_or_skip():
    ok, reason = get_executor("torchcompile").is_available()
    if not ok:
        pytest.skip(f"torch.compile executor unavailable: {reason}")


def test_region_gets_its_dying_inputs_in_a_list_it_empties(monkeypatch):
    _torchcompile_or_skip()
    from thunderlite.executors.torchcompile import BoxedRegion
    from thunderlite.transforms.box_inputs import BOX
    from thunderlite.transforms.del_last_used import is_del
    calls = []
    original = BoxedRegion.__call__

    def spy(self, *args):
        boxed = len(args) == 1 and type(args[0]) is list
        out = original(self, *args)
        calls.append((boxed, len(args[0]) if boxed else None))
        return out
    monkeypatch.setattr(BoxedRegion, "__call__", spy)
    torch.manual_seed(0)
    model, ref = _Stack(2), _Stack(2)
    ref.load_state_dict(model.state_dict())
    jm = thunderlite.jit(model, executors=["torchcompile", "torch"])
    x = torch.randn(3, 8)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        losses = []
        for f, o in ((jm, opt), (ref, ref_opt)):
            o.zero_grad()
            loss = f(x).square().mean()
            loss.backward()
            o.step()
            losses.append(loss.detach())
        torch.testing.assert_close(*losses, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert calls and all(boxed and left == 0 for boxed, left in calls if boxed) and any(b for b, _ in calls)
    bwd = thunderlite.last_backward_traces(jm)[-1]
    verify_trace(bwd)
    bsyms = bwd.bound_symbols
    boxes = [i for i, b in enumerate(bsyms) if b.sym is BOX]
    assert boxes
    for i in boxes:
        call = next(b for b in bsyms[i + 1:] if not is_del(b))
        assert Tag.FUSION in call.sym.tags and [p.name for p in call.args] == [bsyms[i].output.name]
        dropped = {p.name for p in bsyms[i + 1].args} if is_del(bsyms[i + 1]) else set()
        assert dropped, "a box is made only for a region some input dies at"
        later = {p.name for b in bsyms[bsyms.index(call) + 1:] for p in b.proxy_args()}
        boxed = {p.name for p in bsyms[i].args}
        assert dropped <= boxed and not dropped & later
        assert boxed - dropped <= later | {p.name for p in bwd.args}


def test_boxed_regions_use_inductors_fx_graph_cache():
    """A boxed region is compiled the way dynamo compiles a graph (inside a
    tracing context with a ShapeEnv), so Inductor's FX graph cache serves it:
    the same region compiled again (another process, or another jitted
    function) is a cache hit, not a bypass that recompiles from scratch."""
    _torchcompile_or_skip()
    from torch._dynamo.utils import counters

    from thunderlite.executors.torchcompile import BoxedRegion

    def region(a, b):
        return ((a @ b).sin() * 3.0,)

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    counters.clear()
    outs = []
    for _ in range(2):
        box = [x, y]
        outs.append(BoxedRegion(region)(box)[0])
        assert box == []
    assert counters["inductor"]["fxgraph_cache_bypass"] == 0
    assert counters["inductor"]["fxgraph_cache_hit"] >= 1
    for out in outs:
        torch.testing.assert_close(out, region(x, y)[0])


def test_region_reading_inputs_that_share_storage_stays_compiled():
    """Inputs sharing storage (q, k, v split from one projection) only send a
    region to its torch calls where the region writes: AOTAutograd needs a
    synthetic base only for aliased inputs a graph mutates. A training step's
    regions read q/k/v views of one tensor and must stay compiled."""
    _torchcompile_or_skip()
    from thunderlite.executors.torchcompile import BoxedRegion

    def region(q, k):
        return ((q * k).sin(),)

    qkv = torch.randn(4, 6)
    q, k = qkv[:, :3], qkv[:, 3:]
    reading = BoxedRegion(region, writing=False)
    torch.testing.assert_close(reading([q, k])[0], region(q, k)[0])
    assert reading.compilations == 1
    writing = BoxedRegion(region, writing=True)
    torch.testing.assert_close(writing([q, k])[0], region(q, k)[0])
    assert writing.compilations == 0       # its torch calls ran


def test_region_inductor_refuses_is_said(monkeypatch):
    """Where Inductor refuses a region, it runs as its torch calls (right
    values) and says so: a warning with the reason, kept in ``fallbacks``."""
    _torchcompile_or_skip()
    import torch._inductor.compile_fx as compile_fx_module

    from thunderlite.executors.torchcompile import BoxedRegion

    def refuse(*args, **kwargs):
        raise RuntimeError("no such luck")

    monkeypatch.setattr(compile_fx_module, "compile_fx", refuse)

    def region(a):
        return (a.sin(),)

    x = torch.randn(3)
    boxed = BoxedRegion(region, writing=False)
    with pytest.warns(UserWarning, match="runs as its torch calls"):
        out = boxed([x])[0]
    torch.testing.assert_close(out, x.sin())
    assert boxed.fallbacks == ["RuntimeError: no such luck"]


def test_region_over_inputs_at_storage_offsets_uses_inductors_cache():
    """q, k, v split from one projection sit at storage offsets: a region over
    them without ``as_strided`` still compiles inside the tracing context, so
    Inductor's FX graph cache serves it (a training step's attention backward
    recompiled in every process before)."""
    _torchcompile_or_skip()
    from torch._dynamo.utils import counters

    from thunderlite.executors.torchcompile import BoxedRegion

    def region(q, k):
        return ((q @ k.t()).sin(), q[:, 1:] * 2.0)

    qkv = torch.randn(4, 12)
    q, k = qkv[:, 4:8], qkv[:, 8:12]
    counters.clear()
    for _ in range(2):
        boxed = BoxedRegion(region, writing=False)
        outs = boxed([q, k])
        for got, want in zip(outs, region(q, k), strict=True):
            torch.testing.assert_close(got, want)
        assert boxed.fallbacks == []
    assert counters["inductor"]["fxgraph_cache_bypass"] == 0
    assert counters["inductor"]["fxgraph_cache_hit"] >= 1


def test_region_compiles_per_storage_sharing_of_its_inputs():
    """Code compiled while two inputs shared storage is not served to inputs
    apart (nor the reverse): the sharing pattern is part of the layout key."""
    _torchcompile_or_skip()
    from thunderlite.executors.torchcompile import BoxedRegion

    def region(a, b):
        return ((a - b).abs() + a,)

    boxed = BoxedRegion(region, writing=False)
    x = torch.randn(6, 3)
    torch.testing.assert_close(boxed([x, x])[0], region(x, x)[0])
    y = torch.randn(6, 3)
    torch.testing.assert_close(boxed([x, y])[0], region(x, y)[0])
    assert boxed.compilations == 2


def test_region_views_of_inputs_are_made_outside_it():
    """A region that writes nothing returns no view of its inputs: the view
    runs after it as a torch call, so the caller gets eager's view (its base
    is the input) and Inductor compiles only fresh outputs."""
    _torchcompile_or_skip()

    def f(a):
        v = a.diagonal()
        return v, (v > 0.2), v.sin()

    jf = thunderlite.jit(f, executors=["torchcompile", "torch"])
    a = torch.randn(4, 3)
    got = jf(a)
    for g, w in zip(got, f(a), strict=True):
        torch.testing.assert_close(g, w)
    assert got[0]._base is a
    trace = thunderlite.last_traces(jf)[-1]
    fusions = [b for b in trace.bound_symbols if b.sym.name.startswith("fusion")]
    assert fusions and all(o.name != got_name for b in fusions for o in b.tensor_outs()
                           for got_name in [trace.output[0].name]), str(trace)


def test_region_traced_in_the_fake_mode_it_is_compiled_under():
    """``diagonal(a) > 0.2`` of a 3x4 ``a``: traced in one fake mode and compiled
    under another (with a ShapeEnv), Inductor returned 4 elements (jit fuzz
    seed 575 once the diagonal view itself ran outside the region)."""
    _torchcompile_or_skip()
    from thunderlite.executors.torchcompile import BoxedRegion

    def region(a):
        return (torch.diagonal(a) > 0.2, torch.diagonal(a, 1).exp())

    a = torch.randn(3, 4)
    for got, want in zip(BoxedRegion(region, writing=False)([a]), region(a), strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


def test_equal_region_outputs_written_after_the_region_stay_apart():
    """Two equal clones computed in one region: Inductor returned one buffer
    for both, so an in-place write after the region into one changed the
    other (grad fuzz seed 2984: ``b.clone()`` and a custom op's clone of ``b``).
    Outputs of different memory in the trace come back as different tensors."""
    _torchcompile_or_skip()

    def f(a):
        b = a * 2
        x1 = b.clone()
        x2 = b.clone()
        x1.add_(1)
        return x1, x2

    jf = thunderlite.jit(f, executors=["torchcompile", "torch"])
    for _ in range(4):      # whether outputs share is decided per layout: every call of this one clones
        a = torch.randn(4)
        got = jf(a)
        assert got[0].untyped_storage().data_ptr() != got[1].untyped_storage().data_ptr()
        for g, want in zip(got, f(a), strict=True):
            torch.testing.assert_close(g, want)


def test_region_checks_a_repeated_layout_without_building_its_key(monkeypatch):
    """A layout met twice in a row is checked in C++ (sizes, strides, kinds)
    plus offsets and storage sharing, without building the layout's key; a
    call differing in strides, offset, sharing or autograd recording takes the
    full path and gets the code for its own layout (or the torch calls)."""
    _torchcompile_or_skip()
    from thunderlite.executors import torchcompile as tc

    def region(a, b):
        return ((a * b).sin() + a, (a - b).cos())

    built = []
    layout = tc._layout
    monkeypatch.setattr(tc, "_layout", lambda *args: built.append(1) or layout(*args))
    boxed = tc.BoxedRegion(region, writing=False, fresh=(True, True))

    def check(a, b):
        got = boxed([a, b])
        for g, w in zip(got, region(a, b), strict=True):
            torch.testing.assert_close(g, w)
        return got

    for _ in range(4):
        check(torch.randn(6, 4), torch.randn(6, 4))
    assert len(built) == 2 and boxed.compilations == 1        # armed after its second call
    wide = torch.randn(6, 8)
    others = [(torch.randn(4, 6).t(), torch.randn(6, 4)),          # strides
              (wide[:, 4:], torch.randn(6, 4)),                    # a storage offset
              (wide[:, :4], wide[:, :4]),                          # one storage for both
              (torch.randn(6, 4), torch.randn(6, 4))]              # the hot layout again
    for a, b in others:
        check(a, b)
    assert boxed.compilations == 4 and len(built) == 5
    a = torch.randn(6, 4, requires_grad=True)
    got = check(a, torch.randn(6, 4))       # recorded by autograd: the torch calls
    assert got[0].grad_fn is not None
    with torch.no_grad():
        check(a, torch.randn(6, 4))


def test_region_called_from_threads_with_different_layouts_gives_each_its_answer():
    """Threads calling one region with their own layouts (contiguous, transposed,
    at an offset) at once: the hot layout one thread arms never serves another's."""
    _torchcompile_or_skip()
    import threading

    from thunderlite.executors import torchcompile as tc

    def region(a, b):
        return ((a * b).sin() + a,)

    boxed = tc.BoxedRegion(region, writing=False, fresh=(True,))
    makers = [lambda: (torch.randn(6, 4), torch.randn(6, 4)),
              lambda: (torch.randn(4, 6).t(), torch.randn(6, 4)),
              lambda: (torch.randn(6, 8)[:, 4:], torch.randn(6, 4))]
    for make in makers:         # compile each layout first: the threads then only race on arming
        boxed(list(make()))
    errors: list = []

    def caller(make):
        try:
            for _ in range(40):
                a, b = make()
                torch.testing.assert_close(boxed([a, b])[0], region(a, b)[0])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=caller, args=(makers[k % 3],)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert boxed.compilations == 3


def test_cuda_flash_attention_stays_inside_the_layers_region(monkeypatch):
    """CUDA flash attention returns constants of the trace beside its tensors
    (``None``s, the sequence lengths as ints): it is fused with the rest of its
    layer, not left between two regions per layer (on CUDA proxies: no GPU is
    needed to form the regions, which compile at their first call)."""
    from thunderlite.torch.ops import elementwise as ew
    from thunderlite.torch.ops import linalg
    from thunderlite.torch.ops import nn as lnn
    from thunderlite.torch.ops import reductions as red
    from thunderlite.transforms.autodiff.split import split_forward_backward
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: False)    # else cuDNN attention on sm90
    trc = Trace()
    with tracectx(trc):
        x = TensorProxy((2, 3, 32, 64), torch.bfloat16, "cuda", requires_grad=True, name="x")
        w = TensorProxy((64, 64), torch.bfloat16, "cuda", requires_grad=True, name="w")
        trc.args = [x, w]
        h = x
        for _ in range(2):
            q = linalg.matmul(h, w)
            h = ew.add(h, lnn.scaled_dot_product_attention(q, q, q, is_causal=True))
        trc.set_return(red.sum(h))
    split = split_forward_backward(trc, [True, True])
    assert [b.sym.name for b in split.forward.bound_symbols].count("sdpa_flash_cuda") == 2
    fused = TorchCompileExecutor("torchcompile_flash").fusion_pass(split.forward)
    left = [b.sym.name for b in fused.bound_symbols if Tag.FUSION not in b.sym.tags]
    assert left == ["return"], left
    inside = [s.sym.name for f in _fusions(fused) for s in f.subsymbols]
    assert inside.count("sdpa_flash_cuda") == 2
