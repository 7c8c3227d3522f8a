"""Passes for a program that ran its own backward (a whole training step,
docs/architecture.md §9; frontend/training/): it runs without autograd, and each
parameter's update can run as soon as its gradient is final.

- ``drop_autograd_markers``: grad-mode switches, and ``requires_grad_(False)``
  on values the program made, change nothing when the whole program runs
  under ``no_grad``; dropped, they no longer stop reordering (they are
  ``ORDER_BARRIER``s).
- ``schedule_updates``: every symbol after the program's last backward (the
  optimizer, clipping, ``zero_grad``) moves up to right after the last symbol
  it depends on (data, alias order, effects: ``fusion.dependencies``). An
  update then follows its gradient's last producer (and the last read of the
  parameter it overwrites), so ``del_last_used`` frees each gradient there
  when nothing outside observes it (``zero_grad(set_to_none=True)``): the
  gradients of a step are never all alive at once. What needs every gradient
  (``clip_grad_norm_``'s total norm) keeps the updates after the backward.
"""
from __future__ import annotations

from thunderlite.core.proxies import Proxy
from thunderlite.core.tags import Tag
from thunderlite.core.trace import Trace, trace_pass
from thunderlite.torch.ops.grad_mode import SET_GRAD_ENABLED_ID, requires_grad_marker
from thunderlite.transforms.fusion import dependencies


@trace_pass("drop_autograd_markers")
def drop_autograd_markers(trace: Trace) -> Trace:
    """``trace`` without the symbols that only matter to autograd (see the module docstring)."""
    inputs = {a.name for a in trace.args if isinstance(a, Proxy)}

    def keep(b) -> bool:
        if b.sym.id == SET_GRAD_ENABLED_ID:
            return False
        if b.sym is requires_grad_marker:
            flag = b.args[1] if len(b.args) > 1 else b.kwargs.get("requires_grad", True)
            return bool(flag) or b.args[0].name in inputs
        return True
    kept = [b for b in trace.bound_symbols if keep(b)]
    return trace if len(kept) == len(trace.bound_symbols) else trace.with_bound_symbols("", kept)


@trace_pass("schedule_updates")
def schedule_updates(trace: Trace, backward_names: frozenset[str], input_alias_groups=None) -> Trace:
    """Each symbol after the last one defining a name of ``backward_names``
    (the last backward's values) placed right after its last dependency."""
    bsyms = trace.bound_symbols
    start = max((i for i, b in enumerate(bsyms) if any(p.name in backward_names for p in b.proxy_outs())),
                default=-1) + 1
    if start <= 0 or start >= len(bsyms) - 1:
        return trace
    preds = dependencies(trace, input_alias_groups)
    order = list(range(start))
    where = {i: k for k, i in enumerate(order)}
    for i in range(start, len(bsyms)):
        if Tag.RETURN in bsyms[i].sym.tags:
            order.append(i)
            continue
        at = max((where[j] for j in preds[i]), default=-1) + 1
        order.insert(at, i)
        where = {j: k for k, j in enumerate(order)} if at < len(order) - 1 else {**where, i: at}
    if order == list(range(len(bsyms))):
        return trace
    return trace.with_bound_symbols("", [bsyms[i] for i in order])
