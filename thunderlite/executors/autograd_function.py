"""The bridge to PyTorch autograd: a compiled forward and backward behind one
``torch.autograd.Function``.

The jit calls one entry point::

    program = make_differentiable(trace, requires_grad_mask, finalize,
                                  input_alias_groups=None)
    out = program(*flat_args)          # same output pytree as ``trace``
    program.forward_traces             # every stage, the last the one that runs
    program.backward_traces            # likewise ([] in eager mode)

``trace`` is the computation trace after update_aliases and DCE;
``requires_grad_mask`` has one bool per ``trace.args``; ``finalize(trace) ->
trace`` is the jit's own "claim executors + del_last_used" (so nothing here
knows a concrete executor); it may instead return the list of every stage's
trace (the last one final), which then all appear in ``forward_traces`` and
``backward_traces``. Outputs carry ``requires_grad`` as in eager
(integer outputs and outputs that do not depend on a differentiable input are
marked non-differentiable), ``loss.backward()`` fills ``.grad`` and accumulates
across calls.

Saved values: program arguments and outputs go through ``ctx.save_for_backward``
(so eager's "modified by an inplace operation" check applies); intermediates
ride in a plain list that the backward trace empties on entry, so each is freed
after its last use in the backward instead of when the whole backward ends.

Double backward: a backward run with ``create_graph=True`` (grad mode on
inside the backward) returns gradients with a graph of their own. The
program's VJP is a program of its own (``transforms/autodiff/higher_order.py:
vjp_trace``: the forward recomputed from the arguments, the backward built of
symbols whose rules are exact), made differentiable here like any program
(one per set of its inputs requiring grad, built at the first such backward)
and called on the forward's arguments, kept by the Function (``ctx.flat_args``)
with their graph, and the output gradients; a later backward differentiates
it, and so on for higher orders. Arguments the forward did not save for the
backward (saved ones get eager's check when unpacked) are checked by version
counter: written since the forward, the recomputation would read new values,
so the backward raises eager's "modified by an inplace operation". A second
first-order backward through the same graph (``retain_graph=True``) is not
supported: the saved values are freed during the first one, and the second
raises saying so.

Inputs the program writes on a gradient path get their final values as extra
forward outputs, copied into them after the Function with autograd recording
(``_write_back``), so their history continues from the program's as in eager;
an input only written under no_grad or through ``detach()``/``.data`` keeps
its history, so its copy is not recorded.
Programs with writes functionalize.py cannot rewrite run in *eager mode* (see
transforms/autodiff/split.py): the finalized trace runs with autograd on and PyTorch
records the graph, so results and errors are eager's own.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from thunderlite.core import pytree
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.trace import Trace
from thunderlite.executors.torchex import torch_executor, writes_out
from thunderlite.transforms.autodiff.higher_order import NotDifferentiableAgain, vjp_trace
from thunderlite.transforms.autodiff.split import GradSplit, split_forward_backward
from thunderlite.transforms.autodiff.symbols import skip_graph
from thunderlite.transforms.claim import claim_executors
from thunderlite.transforms.reuse_buffers import reuse_buffers


def _stages(finalize: Callable, trace: Trace) -> list[Trace]:
    """``finalize`` returns the final trace, or every stage's trace (last = final)."""
    out = finalize(trace)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _reusing(stages: list[Trace]) -> list[Trace]:
    """``stages`` plus the final trace with dying buffers reused (``out=``): both
    sides run without autograd recording, as eager's backward accumulates."""
    return [*stages, reuse_buffers(stages[-1], writes_out)]


def _distinct(traces: list[Trace]) -> list[Trace]:
    """Each stage once: a pass that returned its input is not a new stage."""
    out: list[Trace] = []
    for t in traces:
        if not any(t is seen for seen in out):
            out.append(t)
    return out


def _zeros(p) -> torch.Tensor:
    return torch.zeros(p.shape, dtype=p.dtype, device=p.device)


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, program: DifferentiableProgram, box: list, *flat_args):
        out, saved_tensors, saved_other = program.forward_fn(*flat_args)
        ctx.program = program
        ctx.flat_args = flat_args      # double backward recomputes from them (their graph included)
        versions = ctx.versions = []    # a plain loop: no comprehension frame per call
        for i in program.unsaved_args:
            versions.append(flat_args[i]._version)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*saved_tensors)
        ctx.saved_other = list(saved_other)
        del saved_other
        # the common output, one tensor (a loss), without a pytree walk
        tensors = [out] if type(out) is torch.Tensor else [o for o in pytree.leaves(out) if isinstance(o, torch.Tensor)]
        unique, ctx.grad_slots, diff = program.plan_outputs(tensors)
        if not all(diff):
            ctx.mark_non_differentiable(*(t for t, d in zip(unique, diff, strict=True) if not d))
        box.append((out, unique))
        return tuple(unique)

    @staticmethod
    def backward(ctx, *grads):
        if torch.is_grad_enabled():      # create_graph=True
            return (None, None, *ctx.program.differentiable_backward(ctx, grads))
        saved_other, ctx.saved_other = ctx.saved_other, None
        if saved_other is None:
            raise RuntimeError(_SECOND_TIME)
        ctx.flat_args = None
        program = ctx.program
        per_arg, reached = program.grad_args(ctx, grads)
        for i in program.graph_slots:
            if program.split.saved_other[i].name not in reached:
                skip_graph(saved_other[i])
        if program.watch_grads:
            program.grad_layouts = [(tuple(g.shape), g.stride()) for g in per_arg]
        result = program.backward_fn(*ctx.saved_tensors, saved_other, *per_arg)
        if program.grads_all_given and len(reached) == len(result):
            return (None, None, *result)        # every argument reached and given a gradient: as it is
        return (None, None, *program.as_eager_grads(result, reached))


_SECOND_TIME = ("Trying to backward through the graph a second time: thunderlite frees the values saved for the "
                "backward while it runs, so retain_graph=True is not supported for a jitted function")


EAGER_MODE_STAGE = "autodiff fallback: eager mode"


def eager_mode_trace(trace: Trace, reason: str) -> Trace:
    """``trace`` under a stage header saying that PyTorch autograd, not
    thunderlite, differentiates it, and why."""
    named = trace.with_bound_symbols(EAGER_MODE_STAGE, trace.bound_symbols)
    named.header_comments = [
        "autodiff fallback: this program runs with PyTorch autograd on, which records its graph",
        "(no thunderlite backward trace) because of " + reason]
    return named


def no_backward_trace(forward: Trace, reason: str) -> Trace:
    """What ``last_backward_traces`` shows for an eager-mode program: an empty
    trace whose header says where the backward comes from."""
    t = Trace("backward", EAGER_MODE_STAGE, forward.names)
    t.args = []
    t.header_comments = [
        "no backward trace: PyTorch autograd differentiates this program from the graph it recorded",
        "while the forward ran (autodiff fallback: eager mode) because of " + reason]
    t.set_return(None)
    return t


class DifferentiableProgram:
    """A differentiable compiled program; see the module docstring."""

    def __init__(self, trace: Trace, split: GradSplit, finalize: Callable[[Trace], Trace],
                 after_split: Callable | None, differentiate: Callable[[list], DifferentiableProgram]):
        self.split = split
        self.trace_args = list(trace.args)
        self._differentiate = differentiate      # its input mask -> the VJP program (make_differentiable)
        self._vjps: dict[tuple, DifferentiableProgram] = {}     # its input mask -> the VJP program
        if split.mode == "eager":
            named = eager_mode_trace(split.eager_trace, split.eager_reason)
            stages = _stages(finalize, named)
            self.forward_traces = _distinct([named] + stages)
            self.backward_traces: list[Trace] = [no_backward_trace(named, split.eager_reason)]
            self._eager_fn = stages[-1].python_callable()
            return
        forward, backward = split.forward, split.backward
        if after_split is not None:       # user transforms' after_autodiff hook (transforms/user.py)
            forward, backward = after_split(forward, backward)
        fwd_stages, bwd_stages = _reusing(_stages(finalize, forward)), _reusing(_stages(finalize, backward))
        self.forward_traces = _distinct([*([split.functionalized] if split.functionalized is not None else []),
                                         split.forward, forward, *fwd_stages])
        self.backward_traces = _distinct([split.backward, backward, *bwd_stages])
        self.forward_fn = fwd_stages[-1].python_callable()
        self.graph_slots = [i for i, p in enumerate(split.saved_other) if getattr(p, "name", None) in split.graphs]
        self.backward_fn = bwd_stages[-1].python_callable()
        # every argument's gradient is a value of the backward (none is a constant None): a call
        # whose output gradients reach all arguments hands the backward's result on as it is
        ret = bwd_stages[-1].output
        self.grads_all_given = isinstance(ret, (tuple, list)) and all(r is not None for r in ret)
        saved = {p.name for p in split.saved_tensors}
        self.unsaved_args = [i for i, a in enumerate(trace.args) if type(a) is TensorProxy and a.name not in saved]
        self._eager_fn = None
        self.watch_grads = False     # note the layouts of the gradients the backward gets (``grad_layouts``)
        self.grad_layouts: list | None = None
        self._single_plan: tuple | None = None
        self._epilogue_fn = None
        if split.epilogue is not None:       # views: the torch executor makes them as eager does
            epilogue = claim_executors(split.epilogue[0], [torch_executor])
            self._epilogue_fn = epilogue.python_callable()

    def rehearse(self, flat_args: list, resolve: Callable, grad_layouts: list | None = None) -> None:
        """Run the forward and then the backward once as a call does, without
        autograd, with every symbol's callable from ``resolve`` (on fake tensors:
        executors/rehearsal.py). The backward's incoming gradients have the
        ``grad_layouts`` (sizes, strides) a program computing the same outputs
        met (``watch_grads``), else they are contiguous: autograd hands on what
        the ops after the call made (``out.sum()``'s gradient is expanded)."""
        if self._eager_fn is not None:
            raise NotImplementedError("an eager-mode program's regions run as torch calls while autograd "
                                      "records them: there is nothing to rehearse")
        with torch.no_grad():
            _, saved_tensors, saved_other = self.forward_traces[-1].python_callable(resolve)(*flat_args)
            grads = [_zeros(p) for p in self.split.grad_args]
            if grad_layouts is not None and [lay[0] for lay in grad_layouts] == [tuple(g.shape) for g in grads]:
                grads = [torch.empty_strided(g.shape, stride, dtype=g.dtype, device=g.device)
                         for g, (_, stride) in zip(grads, grad_layouts, strict=True)]
            self.backward_traces[-1].python_callable(resolve)(*saved_tensors, list(saved_other), *grads)

    @property
    def stride_inputs(self) -> tuple:
        """Arguments whose strides the compiled program relies on (the caller guards them)."""
        return self.split.stride_inputs

    @property
    def placed_inputs(self) -> tuple:
        """Arguments whose strides and storage offsets it relies on (guarded too)."""
        return self.split.placed_inputs

    def grad_args(self, ctx, grads) -> tuple[list, set]:
        """The backward's gradient arguments (zeros where autograd gave none)
        and the arguments eager's graph connects to the outputs given one."""
        per_arg, reached = [], set()
        for i, reach, p in zip(ctx.grad_slots, self.split.grad_reach, self.split.grad_args, strict=True):
            g = grads[i] if i >= 0 else None       # one plain loop: no comprehension frames per step
            if g is None:
                g = _zeros(p)
            else:
                reached |= reach
            per_arg.append(g)
        return per_arg, reached

    def differentiable_backward(self, ctx, grads) -> list:
        """The gradients of a backward run with ``create_graph=True``: the VJP
        program (module docstring) on the forward's arguments and ``grads``.
        The graph is kept, as eager keeps it under ``create_graph``."""
        args = ctx.flat_args
        if args is None:
            raise RuntimeError(_SECOND_TIME)
        ctx.saved_tensors       # noqa: B018 - eager's check of the saved tensors written since the forward
        for i, v in zip(self.unsaved_args, ctx.versions, strict=True):
            if args[i]._version != v:
                raise RuntimeError(
                    f"one of the variables needed for gradient computation has been modified by an inplace "
                    f"operation: argument {i} of a thunderlite-jitted function ({self.trace_args[i].name}) was "
                    f"written after the call (version {args[i]._version}; expected version {v}); its double "
                    "backward recomputes the function from its arguments")
        per_arg, reached = self.grad_args(ctx, grads)
        inputs = (*args, *per_arg)
        mask = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in inputs)
        vjp = self._vjps.get(mask)
        if vjp is None:
            try:
                vjp = self._differentiate(list(mask))
            except NotDifferentiableAgain as e:
                raise NotImplementedError(f"backward(create_graph=True) through a thunderlite-jitted function: "
                                          f"its backward cannot be differentiated again because {e}") from None
            self._vjps[mask] = vjp
        return self.as_eager_grads(list(vjp(*inputs)), reached)

    def as_eager_grads(self, result, reached: set) -> list:
        """None for arguments eager's graph does not connect to the outputs that
        got a gradient; zeros for connected ones the functional trace found no
        gradient for (eager fills ``.grad`` with zeros there)."""
        out = []
        for i, r in enumerate(result):
            if i not in reached:
                out.append(None)
            else:
                out.append(r if r is not None else _zeros(self.trace_args[i]))
        return out

    def plan_outputs(self, tensors: list[torch.Tensor]):
        """The distinct output tensors, which of them each backward grad argument
        takes its gradient from (-1: a second proxy naming the same tensor gets
        zeros, the first already carries the whole gradient), and which of
        them are differentiable."""
        if len(tensors) == 1:       # a loss: the plan is the same every call
            if self._single_plan is None:
                n = len(self.split.grad_positions)
                slots = [0] + [-1] * (n - 1) if n else []
                self._single_plan = (slots, [bool(slots)])
            return tensors, *self._single_plan
        index: dict[int, int] = {}
        unique = []
        for t in tensors:
            if id(t) not in index:
                index[id(t)] = len(unique)
                unique.append(t)
        slots, taken = [], set()
        for pos in self.split.grad_positions:
            u = index[id(tensors[pos])]
            slots.append(u if u not in taken else -1)
            taken.add(u)
        diff = [i in taken for i in range(len(unique))]
        return unique, slots, diff

    def __call__(self, *flat_args):
        if self._eager_fn is not None:
            return self._eager_fn(*flat_args)
        if not torch.is_grad_enabled():
            return self._write_back(flat_args, self.forward_fn(*flat_args)[0])
        box: list = []
        results = _Function.apply(self, box, *flat_args)
        out, unique = box[0]
        if len(unique) == 1 and out is unique[0]:     # (a program may return no tensor: a number)
            out = results[0]
        else:
            wrapped = {id(t): r for t, r in zip(unique, results, strict=True)}
            out = pytree.tree_map(lambda o: wrapped.get(id(o), o) if isinstance(o, torch.Tensor) else o, out)
        return self._write_back(flat_args, out) if self.split.write_backs else out

    def _write_back(self, flat_args, out):
        """Copy the final values of the inputs the program writes into them, as
        eager's in-place ops would have, recorded by autograd (so each input's
        history continues from the forward's output), then put what the program
        returns of those inputs (themselves, views of them) in place
        (transforms/aliasing/functionalize.py)."""
        if not self.split.write_backs:
            return out
        out, values = out
        for i, v in zip(self.split.write_backs, values, strict=True):
            if i in self.split.quiet_write_backs:     # written under no_grad or through detach(): history kept
                with torch.no_grad():
                    flat_args[i].copy_(v)
            else:
                flat_args[i].copy_(v)
        if self._epilogue_fn is None:
            return out
        where = dict(zip(self.split.epilogue[1], self._epilogue_fn(*flat_args), strict=True))
        position = -1

        def leaf(o):
            nonlocal position
            if not isinstance(o, torch.Tensor):
                return o
            position += 1
            return where.get(position, o)
        return pytree.tree_map(leaf, out)


def make_differentiable(trace: Trace, requires_grad_mask, finalize: Callable[[Trace], Trace],
                        input_alias_groups=None, *, after_split: Callable | None = None,
                        executors=None, input_strides: dict | None = None) -> DifferentiableProgram:
    """Split ``trace`` into forward and backward and wrap them for autograd.
    ``after_split(forward, backward) -> (forward, backward)`` runs between the
    split and ``finalize``; ``executors`` (priority order) may own the
    differentiation of the symbols they implement (see transforms/autodiff/split.py);
    ``input_strides`` (argument name -> strides) and the program's
    ``stride_inputs``: see ``split_forward_backward``."""
    split = split_forward_backward(trace, requires_grad_mask, input_alias_groups, executors=executors,
                                   input_strides=input_strides)

    vjp: list[Trace] = []

    def differentiate(mask: list) -> DifferentiableProgram:
        if not vjp:
            vjp.append(vjp_trace(trace, requires_grad_mask, split.grad_positions))
        return make_differentiable(vjp[0], mask, finalize, input_alias_groups, executors=executors,
                                   input_strides=input_strides)
    return DifferentiableProgram(trace, split, finalize, after_split, differentiate)
