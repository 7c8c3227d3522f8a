"""Write-backs of a functionalized trace: the ``copy_`` into each written
program input that functionalize.py puts right before the return are taken
off (``take_write_backs``), for the caller to run after the differentiated
forward, and what the program returns of written inputs is made from the
inputs then (the epilogue)."""
from __future__ import annotations

from thunderlite.core import prims, pytree
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import tracectx
from thunderlite.transforms.aliasing.functionalize import NotFunctionalizable
from thunderlite.transforms.aliasing.update_aliases import AliasGroups


def take_write_backs(trace: Trace, input_alias_groups=None):
    """Split a functionalized trace's write-backs off for autodiff: the caller
    copies each written input's final value into it *after* the differentiated
    forward, under autograd (as eager's in-place op, the input's history then
    reaches the forward's output), so those values become extra outputs.

    Returns the trace (output ``(output, final_values)``), the ``copy_``
    symbols taken off, and the *epilogue*: None, or a trace of the program's
    arguments that the caller runs after the write-backs, returning what the
    output returns of the written inputs (the inputs themselves, views of
    them), with their tensor-leaf positions in the output (in the trace's
    output these hold the input's final value). Raises ``NotFunctionalizable``
    when an output may share memory with a written input when the forward runs
    (a reshape eager copies, that runs as a view here): the write-back would
    change it."""
    *body, ret = trace.bound_symbols
    inputs = {a.name for a in trace.args if isinstance(a, TensorProxy)}
    views: list[BoundSymbol] = []
    while body and not (body[-1].sym is prims.copy_ and body[-1].args[1].name in inputs):
        if not any(b.sym is prims.copy_ for b in body):
            break
        views.insert(0, body.pop())
    tail: list[BoundSymbol] = []
    while body and body[-1].sym is prims.copy_ and body[-1].args[1].name in inputs:
        tail.insert(0, body.pop())
    if not tail:
        return trace, [], None
    final = {b.args[1].name: b.args[0] for b in tail}
    made = {p.name: b for b in views for p in b.tensor_outs()}
    picked, positions, position = [], [], 0

    def leaf(x):
        nonlocal position
        if not isinstance(x, TensorProxy):
            return x
        position += 1
        if x.name not in final and x.name not in made:
            return x
        picked.append(x)
        positions.append(position - 1)
        return final[x.name] if x.name in final else final[_input_of(x, made, inputs)]
    output = pytree.tree_map(leaf, trace.output)
    out = trace.with_bound_symbols(trace.stage, body)
    _check_apart(out, (output, tuple(final.values())), final, input_alias_groups)
    with tracectx(out):
        out.set_return((output, tuple(b.args[0] for b in tail)))
    epilogue = trace.with_bound_symbols("functionalize (epilogue)", views)
    epilogue.name = "epilogue"
    with tracectx(epilogue):
        epilogue.set_return(tuple(picked))
    return out, tail, (epilogue, tuple(positions)) if picked else None


def _input_of(x: TensorProxy, made: dict, inputs: set[str]) -> str:
    """The input a view computed in the epilogue is made from."""
    while x.name not in inputs:
        x = made[x.name].tensor_args()[0]
    return x.name


def _check_apart(trace: Trace, output, written: dict, input_alias_groups) -> None:
    groups = AliasGroups.of_trace(trace, input_alias_groups)
    for o in pytree.leaves(output):
        near = isinstance(o, TensorProxy) and next((n for n in written if groups.same(o.name, n)), None)
        if near:
            raise NotFunctionalizable(f"the output {o.name} may share memory with the input {near} the program "
                                      "writes")
