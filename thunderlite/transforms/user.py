"""User trace transforms: ``jit(fn, transforms=[...])`` (docs/architecture.md §7).

A ``Transform`` has one method per named point of the pipeline; each gets the
trace(s) at that point and returns them, changed or not (return the input
itself when nothing changed, as every pass does). The points, in order:

- ``after_tracing(trace)``: the interpreted program, before update_aliases and
  DCE (so a transform may add in-place ops; barriers are inserted after it);
- ``after_autodiff(forward, backward)``: the forward and backward traces of a
  differentiable call, before executors claim them (not called when no input
  requires grad). Keep their interfaces: the forward's return and the
  backward's arguments carry the saved values;
- ``after_claiming(trace)``: each claimed trace (``trace.name`` is
  ``computation``, ``forward`` or ``backward``), before del_last_used; symbols
  added here must already carry an executor (``sym.executor``) or an ``impl``.

Besides the hooks, two queries: ``bind_inputs(values)`` (the trace's input
values by proxy name, before the hooks of one compile) and
``prefetch_units()`` (inputs whose all-gathers the collective scheduler
prefetches as one group: ``fsdp`` and FSDP2 name each shard's module).

Transforms run in list order at each point; every trace a transform changed is
recorded in ``last_traces`` / ``last_backward_traces`` under the stage name
``<TransformClass>.<hook>``. Example, a transform that counts symbols::

    class Count(Transform):
        def after_claiming(self, trace):
            print(trace.name, len(trace.bound_symbols))
            return trace

    jfn = thunderlite.jit(fn, transforms=[Count()])
"""
from __future__ import annotations

from collections.abc import Sequence

from thunderlite.core.prims import check
from thunderlite.core.trace import Trace

HOOKS = ("after_tracing", "after_autodiff", "after_claiming")


class Transform:
    """Base class of user trace transforms; override the hooks you need."""

    def bind_inputs(self, values: dict) -> None:
        """Before the hooks of one compile: the trace's input values by proxy name,
        for transforms that pick inputs by identity (``ddp``: the module's
        parameters). Keep no reference past the compile."""

    def prefetch_units(self) -> dict[str, str]:
        """After ``bind_inputs``: trace inputs (by proxy name) whose all-gathers
        are prefetched as one group, name -> unit (``fsdp``, FSDP2: the sharded
        module; transforms/schedule_collectives.py). Empty: group by use."""
        return {}

    def after_tracing(self, trace: Trace) -> Trace:
        return trace

    def after_autodiff(self, forward: Trace, backward: Trace) -> tuple[Trace, Trace]:
        return forward, backward

    def after_claiming(self, trace: Trace) -> Trace:
        return trace

    def __repr__(self):
        return f"<{type(self).__name__}>"


def check_transforms(transforms: Sequence | None) -> tuple[Transform, ...]:
    """The validated tuple of transforms (``jit`` calls this once)."""
    if transforms is None:
        return ()
    check(isinstance(transforms, (list, tuple)),
          lambda: f"transforms= takes a list of Transform objects, got {transforms!r}", TypeError)
    for t in transforms:
        check(isinstance(t, Transform), lambda: f"transforms=[...] takes Transform instances "
                                                f"(thunderlite.extend.Transform), got {t!r}", TypeError)
    return tuple(transforms)


def prefetch_units(transforms: Sequence[Transform]) -> dict[str, str]:
    """Every transform's ``prefetch_units``, merged."""
    units: dict[str, str] = {}
    for tr in transforms:
        units.update(tr.prefetch_units())
    return units


def _stamp(t: Trace, original: Trace, stage: str) -> Trace:
    check(isinstance(t, Trace), lambda: f"{stage} returned {type(t).__name__}, not a Trace", TypeError)
    if t is not original:
        t.stage = stage
    return t


def apply_hook(transforms: Sequence[Transform], hook: str, trace: Trace, steps: list | None = None) -> Trace:
    """Run ``hook`` of every transform on ``trace``; changed traces go to ``steps``."""
    for tr in transforms:
        new = _stamp(getattr(tr, hook)(trace), trace, f"{type(tr).__name__}.{hook}")
        if new is not trace and steps is not None:
            steps.append(new)
        trace = new
    return trace


def apply_after_autodiff(transforms: Sequence[Transform], forward: Trace, backward: Trace,
                         fwd_steps: list | None = None, bwd_steps: list | None = None) -> tuple[Trace, Trace]:
    """Run every transform's ``after_autodiff`` on the pair."""
    for tr in transforms:
        stage = f"{type(tr).__name__}.after_autodiff"
        out = tr.after_autodiff(forward, backward)
        check(isinstance(out, tuple) and len(out) == 2,
              lambda: f"{stage} must return (forward, backward), got {out!r}", TypeError)
        f, b = _stamp(out[0], forward, stage), _stamp(out[1], backward, stage)
        if f is not forward and fwd_steps is not None:
            fwd_steps.append(f)
        if b is not backward and bwd_steps is not None:
            bwd_steps.append(b)
        forward, backward = f, b
    return forward, backward
