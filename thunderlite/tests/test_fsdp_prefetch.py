"""Bounded all-gather prefetch (issue 28, transforms/schedule_collectives.py):
FSDP's gathers are issued one layer ahead of their use, not all at the top of
the forward, so at most two layers' full parameters are alive at once, in the
forward and in the backward's re-gathers; gradients' reduce-scatters are still
issued as soon as ready, in trace order. Checked on the final traces of
``thunderlite.distributed.fsdp`` and of torch's ``fully_shard`` (FSDP2) on a
one-rank gloo group, against eager for values and gradients."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

import thunderlite
from thunderlite.core.trace import Trace

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available in this build")
LAYERS, WIDTH = 5, 16


@pytest.fixture
def one_rank_mesh(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (1,))


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.down = torch.nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[_Block() for _ in range(LAYERS)])


def _shard_read(bsyms: list, i: int) -> str:
    """The name of the shard all-gather ``i`` gathers (walking back its views and casts)."""
    producer = {p.name: b for b in bsyms for p in b.proxy_outs()}
    name = bsyms[i].proxy_args()[0].name
    while "_fsdp_shard_" not in name:
        name = producer[name].proxy_args()[0].name
    return name


def _gathers(trace: Trace, unit) -> list[dict]:
    """Each all-gather of ``trace`` (in order): its unit (``unit`` of the shard's
    name), its issue position, the position of its wait, of its *use* (the first
    symbol reading the gathered value, or a view or cast of it, together with
    anything else), the last position reading any of those values (where it
    dies: its ``del`` or the return) and its size."""
    bsyms = trace.bound_symbols
    out = []
    for i, b in enumerate(bsyms):
        if b.sym.name != "all_gather":
            continue
        names = {p.name for p in b.proxy_outs()}
        g = dict(unit=unit(_shard_read(bsyms, i)), issue=i, wait=None, use=None, last=i, numel=b.output.numel())
        for j in range(i + 1, len(bsyms)):
            args = {p.name for p in bsyms[j].proxy_args()}
            if not args & names:
                continue
            g["last"] = j
            if bsyms[j].sym.name == "wait":
                g["wait"] = j
            if g["use"] is None and bsyms[j].sym.name != "del":
                if args <= names and bsyms[j].sym.name not in ("all_gather", "all_reduce", "reduce_scatter"):
                    names.update(p.name for p in bsyms[j].proxy_outs())
                else:
                    g["use"] = j
        out.append(g)
    return out


def _check_bounded(trace: Trace, unit, unit_numel: int) -> None:
    """Gathers go by unit (a module), one unit ahead: each unit's gathers are
    issued after the previous unit was waited for and before their use; at most
    two units are in flight (issued, not yet all used), and at most two units'
    gathered elements are alive at any point of the trace."""
    gathers = _gathers(trace, unit)
    assert len(gathers) >= 2 * LAYERS - 2, str(trace)
    assert all(g["wait"] is not None and g["use"] is not None for g in gathers)
    units = sorted({g["unit"] for g in gathers}, key=lambda u: min(g["use"] for g in gathers if g["unit"] == u))
    groups = [[g for g in gathers if g["unit"] == u] for u in units]
    for prev, group in zip(groups, groups[1:], strict=False):
        first_wait = min(p["wait"] for p in prev)
        for g in group:
            assert first_wait < g["issue"] < g["use"], str(trace)
    for i in range(len(trace.bound_symbols)):
        in_flight = {g["unit"] for g in gathers if g["issue"] <= i < g["use"]}
        assert len(in_flight) <= 2, f"{len(in_flight)} units of gathers in flight at {i}:\n{trace}"
        alive = sum(g["numel"] for g in gathers if g["issue"] <= i <= g["last"])
        assert alive <= 2 * unit_numel, f"{alive} gathered elements alive at {i} (one unit: {unit_numel})"
    assert sum(g["numel"] for g in gathers) > 2 * unit_numel      # the bound is one: all at once would break it


def _issues(trace: Trace, name: str) -> list[str]:
    return [b.proxy_args()[0].name for b in trace.bound_symbols if b.sym.name == name]


def _check_issue_order(traces: list[Trace], forward: bool) -> None:
    """Reduce-scatters keep their trace order and are not held back by the
    prefetch; the forward's gathers keep the program's order."""
    k = next(i for i, t in enumerate(traces) if t.stage == "schedule_collectives")
    # fold_views (after the scheduling) writes a gathered view's expression into its call,
    # renaming arguments, not moving calls: the order is read from the trace before it
    folded = next((i for i, t in enumerate(traces) if t.stage == "fold_views"), len(traces))
    before, final = traces[k - 1], traces[folded - 1]
    kinds = ("all_gather", "reduce_scatter") if forward else ("reduce_scatter",)
    for kind in kinds:
        assert _issues(final, kind) == _issues(before, kind), kind
    bsyms = final.bound_symbols
    producer = {p.name: i for i, b in enumerate(bsyms) for p in b.proxy_outs()}
    ready = -1
    for i, b in enumerate(bsyms):         # issued as soon as its input and the previous one are
        if b.sym.name != "reduce_scatter":
            continue
        ready = max(ready, producer[b.proxy_args()[0].name])
        between = {x.sym.name for x in bsyms[ready + 1:i]}
        assert between <= {"all_gather", "reduce_scatter", "all_reduce", "del"}, \
            f"reduce-scatter at {i} held back behind {between}"
        ready = i


def _train_and_compare(jm, model, ref, x, tol: dict | None = None) -> None:
    tol = tol or {}
    out = jm(x)
    torch.testing.assert_close(out.float(), ref(x), **tol)
    out.float().square().mean().backward()
    ref(x).square().mean().backward()
    for (n, p), r in zip(model.named_parameters(), ref.parameters(), strict=True):
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        torch.testing.assert_close(g.reshape(r.shape) if g.numel() == r.numel() else g[:r.numel()].view(r.shape),
                                   r.grad, msg=lambda m, n=n: f"{n}: {m}", **tol)


def test_fsdp_gathers_one_layer_ahead_forward_and_backward(one_rank_mesh):
    from thunderlite.distributed import fsdp
    ref = _net()
    model = fsdp(copy.deepcopy(ref))
    jm = thunderlite.jit(model)
    _train_and_compare(jm, model, ref, torch.randn(3, WIDTH))
    def linear(shard: str) -> str:       # fsdp's unit: the module holding the parameter
        return shard.split("__fsdp_shard_")[0]
    largest = WIDTH * 2 * WIDTH + 2 * WIDTH
    _check_bounded(thunderlite.last_traces(jm)[-1], linear, largest)
    _check_bounded(thunderlite.last_backward_traces(jm)[-1], linear, largest)
    _check_issue_order(thunderlite.last_traces(jm), forward=True)
    _check_issue_order(thunderlite.last_backward_traces(jm), forward=False)


@pytest.mark.parametrize("mixed", [False, True], ids=["fp32", "bf16_params_fp32_reduce"])
def test_fsdp2_gathers_one_layer_ahead_forward_and_backward(one_rank_mesh, mixed):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    ref = _net()
    model = copy.deepcopy(ref)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else \
        MixedPrecisionPolicy()
    for block in model:
        fully_shard(block, mesh=one_rank_mesh, mp_policy=mp)
    fully_shard(model, mesh=one_rank_mesh, mp_policy=mp)
    jm = thunderlite.jit(model)
    _train_and_compare(jm, model, ref, torch.randn(3, WIDTH), dict(atol=5e-2, rtol=5e-2) if mixed else None)
    def block(shard: str) -> str:        # FSDP2's unit: the fully_shard module, a block here
        return "_".join(shard.split("_")[:2])
    block_numel = 2 * WIDTH * 2 * WIDTH + 3 * WIDTH
    _check_bounded(thunderlite.last_traces(jm)[-1], block, block_numel)
    _check_bounded(thunderlite.last_backward_traces(jm)[-1], block, block_numel)
    _check_issue_order(thunderlite.last_traces(jm), forward=True)
    _check_issue_order(thunderlite.last_backward_traces(jm), forward=False)


def test_gathers_without_units_are_grouped_by_use(one_rank_mesh):
    """A program's own gathers (no FSDP transform naming units): each group is
    the gathers its first reader needs, prefetched one group ahead."""
    import torch.distributed._functional_collectives as funcol

    def f(x, *ws):
        for w in ws:
            full = funcol.all_gather_tensor(w, 0, dist.group.WORLD)
            x = torch.tanh(x @ full.view(WIDTH, WIDTH))
        return x
    ws = [torch.randn(WIDTH * WIDTH) for _ in range(LAYERS)]
    x = torch.randn(3, WIDTH)
    jf = thunderlite.jit(f)
    torch.testing.assert_close(jf(x, *ws), f(x, *ws))
    trace = thunderlite.last_traces(jf)[-1]
    bsyms = trace.bound_symbols
    args = [a.name for a in trace.args[1:]]

    gathers = [i for i, b in enumerate(bsyms) if b.sym.name == "all_gather"]
    assert [bsyms[i].proxy_args()[0].name for i in gathers] == args       # program order
    waits = [i for i, b in enumerate(bsyms) if b.sym.name == "wait"]
    for k in range(1, LAYERS):      # gather k after wait k-1, and before its matmul
        assert waits[k - 1] < gathers[k] < waits[k]
    assert gathers[2] > waits[0] and gathers[2] > next(
        i for i, b in enumerate(bsyms) if b.sym.name == "matmul"), "more than one gather ahead"
