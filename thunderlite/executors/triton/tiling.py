"""How a generated kernel is tiled and launched (``Config``): the heuristic choice from the
shapes, and the candidates autotuning times (triton/autotune.py).

A *persistent* reduction holds whole rows in one ``[BM, BN]`` tile (``BN >= N``;
several short rows per program); a *looped* one reduces each row in blocks of
``BN`` columns (triton/codegen.py, ``_column_passes``). A *column* reduction (rows
running across memory: a weight's gradient summed over the batch) takes many
neighbouring rows per program, the contiguous direction.
"""
from __future__ import annotations

from typing import NamedTuple

from thunderlite.executors.triton.plan import MAX_ROW, Plan


class Config(NamedTuple):
    """How a kernel is tiled and launched: ``BM`` rows by ``BN`` columns per tile; ``loop``:
    rows are reduced in blocks of ``BN`` columns (a looped reduction) instead of one
    ``BN >= N`` tile holding a whole row (a persistent reduction)."""
    BM: int
    BN: int
    num_warps: int = 4
    num_stages: int = 1
    loop: bool = False



class Limits(NamedTuple):
    """Where persistent reductions stop and how wide a looped one's column block is."""
    persistent_n: int       # longest row held whole in one tile
    loop_bn: int            # column block of a looped reduction
    tile: int               # elements of a [BM, BN] tile (rows per program = tile // BN)


LIMITS = {True: Limits(persistent_n=MAX_ROW, loop_bn=4096, tile=1 << 16),      # the interpreter
          False: Limits(persistent_n=8192, loop_bn=2048, tile=4096)}            # natively
"""Per mode (``interpret``): tests shrink them to exercise looped reductions on small shapes."""


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _warps(elements: int) -> int:
    return 4 if elements <= 2048 else 8 if elements <= 8192 else 16


def _column_reduction(plan: Plan) -> bool:
    """Rows that run across memory (a weight's gradient summed over the batch): the row
    dims exclude the innermost one, so a program takes many neighbouring rows (the
    contiguous direction) and a short block of each."""
    return bool(plan.rdims) and plan.rdims[-1] != len(plan.domain) - 1 and plan.M > 1


def heuristic_config(plan: Plan, interpret: bool) -> Config:
    """Block sizes from the shapes: a whole row per program while it fits ``persistent_n``
    (several short rows per program, to fill a tile), else a looped reduction in
    blocks of ``loop_bn`` columns, one row per program; a column reduction takes 64
    neighbouring rows per program, in blocks of 64."""
    lim = LIMITS[interpret]
    M, N = plan.M, plan.N
    if _column_reduction(plan):
        BM, BN = min(_pow2(M), 64), min(_pow2(N), 64 if not interpret else lim.loop_bn)
        loop = _pow2(N) > BN and plan.loopable
        return Config(BM=BM, BN=BN if loop else _pow2(N), num_warps=_warps(BM * BN), loop=loop)
    if _pow2(N) > lim.persistent_n and plan.loopable:
        BN = min(lim.loop_bn, _pow2(N))
        return Config(BM=1, BN=BN, num_warps=_warps(BN), loop=True)
    BN = _pow2(N)
    tile = lim.tile if interpret or N > 1 else 1024
    BM = max(1, min(_pow2(M), tile // BN))
    return Config(BM=BM, BN=BN, num_warps=_warps(BM * BN))


def candidate_configs(plan: Plan, interpret: bool) -> list[Config]:
    """The configurations autotuning times: the heuristic's first, then neighbours in rows
    per program, column block, warps and pipeline stages (a handful: each is compiled)."""
    best = heuristic_config(plan, interpret)
    if plan.looped:             # one program looping over every row: nothing to choose
        return [best]
    M, N = plan.M, plan.N
    out = [best]
    if _column_reduction(plan):
        for BM in (32, 64, 128):
            for BN in (32, 64):
                if BM <= _pow2(M) and (BN < _pow2(N) and plan.loopable or BN == _pow2(N)):
                    out += [Config(BM=BM, BN=BN, num_warps=warps, loop=BN < _pow2(N)) for warps in (4, 8)]
    elif best.loop:
        for BN in (1024, 2048, 4096):
            if BN <= _pow2(N):
                out += [Config(BM=1, BN=BN, num_warps=warps, loop=True) for warps in (4, 8, 16)]
        out.append(best._replace(num_stages=2))
    elif N == 1:
        for BM in (512, 1024, 2048):
            if BM <= max(_pow2(M), 512):
                out += [Config(BM=BM, BN=1, num_warps=warps) for warps in (4, 8)]
    else:
        BN = best.BN
        for BM in (1, 2, 4, 8, 16):
            if BM <= _pow2(M) and BM * BN <= 16384:
                out += [Config(BM=BM, BN=BN, num_warps=warps) for warps in (4, 8, 16)
                        if warps * 32 <= max(BM * BN, 128) and (warps == 4 or BM * BN >= 1024)]
        if plan.loopable and N >= 2048:
            out += [Config(BM=1, BN=bn, num_warps=8, loop=True) for bn in (1024, 2048) if bn < N]
    seen: set = set()
    return [c for c in out if not (c in seen or seen.add(c))]
