"""A rehearsal: a program's final traces run once on fake tensors, so that the
compiled regions they call compile before any real call needs them.

A fusion executor's region may compile lazily, on its first call, for the
layout of the inputs it meets (``torchcompile.BoxedRegion``: strides, storage
offsets, storage sharing). Those layouts are known only by running the
program: its intermediates' strides are those of the ops that make them. A
rehearsal runs the program under torch's ``FakeTensorMode``, where every op
computes only its output's metadata (eager's strides, views sharing their
base's storage), draws no random number and touches no real memory. Each
fusion symbol whose callable offers ``prepare(example)`` is run as its torch
calls (its ``fn``) and noted with the fake inputs it met; afterwards, outside
the fake mode, each is handed real example tensors of those layouts (made,
never filled) and compiles for them. So the thread that rehearses compiles,
and calls on other threads then find the code ready::

    prepared = rehearse(lambda fakes, resolve: trace.python_callable(resolve)(*fakes), inputs)

``run(fakes, resolve)`` builds the program's callables with ``resolve`` (the
``resolve`` of ``Trace.python_callable``) and calls them as a real call would
(``DifferentiableProgram.rehearse`` runs its forward and backward). Inputs are
real tensors (only their metadata is read) or other values, passed as they are.
What the fake mode cannot run (an op without a fake implementation, a value
read from a tensor's data) raises, and the caller decides what that means.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from thunderlite.core.symbol import Symbol
from thunderlite.core.tags import Tag
from thunderlite.torch.ops.rng import manual_seed
from thunderlite.transforms.del_last_used import is_del


class _StandIn:
    """A fusion callable during a rehearsal: notes the inputs of each call, and
    computes the outputs' metadata with the region's torch calls."""

    def __init__(self, impl, met: list):
        self.impl = impl
        self.met = met

    def __call__(self, *args):
        box = args[0] if len(args) == 1 and type(args[0]) is list else list(args)
        flat = list(box)
        box.clear()         # as a boxed region empties its list
        self.met.append((self.impl, flat, torch.is_grad_enabled()))
        return self.impl.fn(*flat)


def rehearse(run: Callable[[list, Callable[[Symbol], Callable]], object], inputs: Sequence,
             later: Callable[[Callable[[], None]], None] | None = None) -> int:
    """Run ``run(fake_inputs, resolve)`` on fake tensors, then prepare every
    region call it met for its inputs' layouts. ``later``: where a region
    prepared hands the compile of a layout it meets unprepared (a rehearsal's
    miss: calls run its torch calls meanwhile), when it offers ``defer_to``.
    Returns how many calls were prepared."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    met: list = []

    def resolve(sym: Symbol) -> Callable:
        impl = sym.impl
        if Tag.FUSION in sym.tags and callable(getattr(impl, "prepare", None)) and getattr(impl, "fn", None):
            return _StandIn(impl, met)
        return impl
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fakes = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in inputs]
        run(fakes, resolve)
    # a region met an input of the call itself: its example is of that input's kind (a Parameter, requiring
    # grad), which compiled code may be specialized to (dynamo guards the type and requires_grad)
    kinds = {id(f): v for f, v in zip(fakes, inputs, strict=True) if isinstance(v, torch.Tensor)}
    prepared = 0
    for impl, args, grad in met:
        if grad and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            continue        # a call autograd records runs the torch calls: nothing to compile
        with torch.set_grad_enabled(grad):
            impl.prepare(examples_like(args, kinds))
        prepared += 1
        if later is not None and callable(getattr(impl, "defer_to", None)):
            impl.defer_to(later)
    return prepared


def examples_like(args: list, kinds: dict | None = None) -> list:
    """New real tensors with the layouts of the (fake or real) tensors in
    ``args`` (sizes, strides, storage offsets, dtypes, devices; those sharing a
    storage share one new one), their memory allocated and never written;
    other values as they are. ``kinds``: for an argument's ``id``, the tensor
    whose kind its example takes (``nn.Parameter``, ``requires_grad``)."""
    storages: dict[int, torch.UntypedStorage] = {}
    out = []
    for a in args:
        if not isinstance(a, torch.Tensor):
            out.append(a)
            continue
        fake = a.untyped_storage()
        real = storages.get(fake._cdata)
        if real is None:
            real = storages[fake._cdata] = torch.UntypedStorage(fake.nbytes(), device=a.device)
        example = torch.empty(0, dtype=a.dtype, device=a.device).set_(real, a.storage_offset(), a.shape, a.stride())
        like = kinds.get(id(a)) if kinds else None
        out.append(example if like is None else kind_of(like, example))
    return out


def kind_of(like: torch.Tensor, example: torch.Tensor) -> torch.Tensor:
    """``example`` as a tensor of ``like``'s kind: an ``nn.Parameter`` where it
    is one, requiring grad where it does."""
    if type(like) is torch.nn.Parameter:
        return torch.nn.Parameter(example, requires_grad=like.requires_grad)
    return example.requires_grad_(like.requires_grad) if like.requires_grad and example.is_leaf else example


_REPLAYABLE = frozenset({Tag.RANDOM, Tag.ORDER_BARRIER, Tag.SIZE_CHECK, Tag.RETURN})


def unrehearsable(traces: Sequence) -> str | None:
    """Why ``traces`` cannot be rehearsed (None: they can): a symbol with an
    effect beyond the tensors it makes (a collective, a print, a custom op's
    unseen write) would happen for real, and ``torch.manual_seed`` would
    reseed the process's generator. Random draws are fine: fake tensors draw nothing."""
    for t in traces:
        for b in t.bound_symbols:
            tags = b.sym.tags
            if b.sym.id == manual_seed.id or (Tag.DONT_DCE in tags and not tags & _REPLAYABLE
                                                    and not is_del(b)):
                where = f" (at {b.source[0]}:{b.source[1]})" if b.source else ""
                return f"{b.sym.id}{where} has an effect a rehearsal on fake tensors would make happen"
    return None
