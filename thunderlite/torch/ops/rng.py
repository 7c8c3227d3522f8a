"""Changing the random generator's state from inside a program.

``torch.manual_seed(s)`` in jitted code must happen at run time, in program
order with the draws around it, on every call: a leaf symbol tagged RANDOM and
DONT_DCE, so DCE keeps it and fusion never moves a draw across it. It returns
nothing in the trace (eager returns the generator, which programs rarely use).
"""
from __future__ import annotations

import torch

from thunderlite.core.prims import check
from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.torch.registry import _register_symbol, register_torch_callable


def _manual_seed_meta(seed) -> None:
    check(isinstance(seed, int), lambda: f"torch.manual_seed needs an int seed known while tracing, got {seed!r}",
          TypeError)
    return None


manual_seed = Symbol("manual_seed", meta=_manual_seed_meta, module="ltorch",
                     tags={Tag.RANDOM, Tag.DONT_DCE}, torch_fn=torch.manual_seed)
_register_symbol(manual_seed)
register_torch_callable(torch.manual_seed, manual_seed)
if torch.random.manual_seed is not torch.manual_seed:
    register_torch_callable(torch.random.manual_seed, manual_seed)
