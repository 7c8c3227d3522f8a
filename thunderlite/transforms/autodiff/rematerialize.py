"""Rematerialization: recompute cheap values in the backward instead of saving them.

A value the backward reads is normally saved by the forward and kept alive
between the two. When it comes out of one cheap elementwise symbol whose own
inputs are saved anyway or are program arguments/outputs (which the caller
keeps alive regardless), recomputing it in the backward costs one memory-bound
kernel and saves its whole buffer for the time between forward and backward.
Recomputed symbols are placed right before their first use in the backward, so
their results live as briefly as possible.

Never recomputed: random draws (the backward would see different numbers),
on the CPU without a fusion executor a chain holding a transcendental prim
(``_COMPUTE_BOUND_ON_CPU``: silu, gelu, tanh... cost there what saving saves),
anything with a side effect, non-elementwise work (matmuls, reductions), a
chain whose inputs some later forward symbol writes into (``overwritten``:
after ``update_aliases`` the name of such an input means its value *before*
the write, but at backward time its memory holds the value after it, so the
recomputation would read the wrong numbers; the value itself is saved), and
values whose recomputation would need a value that is not saved anyway (that
trades bytes for bytes and adds a kernel).

A saved broadcast of a smaller value (``expand``, ``broadcast_in_dim``:
rotary embedding's cos and sin spread over batch and heads) is always
recomputed from its input, which is saved instead (``_spread_from``; with
the symbolic sizes of its shape, under ``dynamic=True``).

Under a fusion executor (``fusing``) a cheap value whose inputs are not saved
is recomputed too when they hold fewer bytes than it (``_smaller_inputs``: a
float32 widening of a bfloat16 intermediate); the recomputation is one more
step inside a fused backward kernel, where the torch executor would run it as
a kernel of its own.

Where forward and backward are one program (a whole training step,
autodiff/inline.py: ``norms=True``), a saved norm output (``native_layer_norm``,
``_fused_rms_norm``) is recomputed by the same kernel from its inputs when
they are saved anyway (the backward of the norm keeps its input) or visible:
its statistics come again with it, bit for bit what the forward computed, and
the output's buffer (the size of the activation) is not kept from the forward
to the weight gradient of the matmul that read it (``_norm_recompute``). One
pass over the input costs less than the step's gradient matmuls, and the
value is not alive between the loss and its first use in the backward, which
is where a training step's memory peaks.

Example: for ``y = sin(x * 2)`` the backward of ``sin`` needs ``x * 2``; since
``x`` is an argument, ``t0 = prims.mul(x, 2)`` is recomputed in the backward and
only ``x`` is saved. For ``gelu(x @ w1) @ w2`` on a GPU gelu's backward keeps
the matmul result, so gelu's output (which the second matmul's backward reads)
is recomputed from it rather than kept as well; on the CPU it is kept, as eager
keeps it (gelu's pass costs there a third of that matmul).
"""
from __future__ import annotations

from thunderlite.core import prims
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import BoundSymbol, walk
from thunderlite.core.symint import has_symbolic
from thunderlite.core.tags import Tag
from thunderlite.transforms.autodiff import kernels

_CHEAP = frozenset(prims.all_prims()[n] for n in (
    *prims.UNARY, *prims.BINARY, *prims.TERNARY, "where", "convert_element_type",
    "broadcast_in_dim", "reshape", "permute", "squeeze"))


def is_cheap(bsym: BoundSymbol) -> bool:
    """An elementwise/shape symbol, or a composite made only of them."""
    sym = bsym.sym
    if Tag.RANDOM in sym.tags or Tag.INPLACE in sym.tags or Tag.DONT_DCE in sym.tags:
        return False
    if sym in _CHEAP:
        return True
    return bool(bsym.subsymbols) and all(is_cheap(s) for s in bsym.subsymbols)


_NORMS = frozenset({kernels.native_layer_norm, kernels.fused_rms_norm})

_COMPUTE_BOUND_ON_CPU = frozenset(prims.all_prims()[n] for n in (
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
    "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "lgamma", "digamma", "sigmoid", "pow",
    "atan2", "zeta", "polygamma"))
"""Prims whose CPU kernels are bound by arithmetic, not memory: one pass costs
5-25x a copy (one thread, 512K floats: a copy 0.05 ms, silu and sigmoid 0.24,
exp 0.48, gelu 0.34 and with tanh 1.0, tanh 1.4). Recomputed by the torch
executor, each is a kernel of its own that costs about what eager saves by
not recomputing: a chain holding one is saved, as eager saves it, on the CPU
unless a fusion executor runs the program (there the recomputation is one
more step of a fused kernel)."""


def _compute_bound_on_cpu(chain: dict[str, BoundSymbol]) -> bool:
    for b in chain.values():
        outs = b.tensor_outs()
        if outs and outs[0].device.type == "cpu" and any(s.sym in _COMPUTE_BOUND_ON_CPU for s in walk(b)):
            return True
    return False


_MAX_CHAIN = 32


def _closure(name: str, producer: dict, keep: set[str], overwritten: frozenset | set = frozenset()):
    """The cheap symbols computing ``name`` back to values in ``keep`` or to
    outputs of non-cheap symbols: ``(symbols by output name, frontier)``, or
    None when the chain is too long or reads a value in ``overwritten``."""
    chain: dict[str, BoundSymbol] = {}
    frontier: dict[str, Proxy] = {}
    stack = [name]
    while stack:
        n = stack.pop()
        bsym = producer[n]
        chain[n] = bsym
        if len(chain) > _MAX_CHAIN:
            return None
        for a in bsym.proxy_args():
            if a.name in chain or a.name in frontier:
                continue
            src = producer.get(a.name)
            if a.name in overwritten:
                return None
            if a.name in keep or src is None or not is_cheap(src) or len(src.proxy_outs()) != 1:
                frontier[a.name] = a
            else:
                stack.append(a.name)
    return chain, frontier


_MAX_RECOMPUTE = 1
"""Longest chain recomputed for one saved value: each recomputed symbol is a
kernel the torch executor runs in the backward. Measured on nanoGPT and a tiny
Llama (benchmarks/bench_training.py): one symbol (gelu, silu, a product) keeps
peak memory at 0.66-0.72x eager for 1-6% more step time; none gives eager's
time at 0.91-1.11x its memory; four buys Llama 3% less memory for 4% more time."""


def rematerialize(fwd_bsyms: list[BoundSymbol], bwd_bsyms: list[BoundSymbol], saved: list[Proxy],
                  visible: set[str], overwritten: frozenset | set = frozenset(), fusing: bool = False,
                  norms: bool = False) -> tuple[list[BoundSymbol], list[Proxy]]:
    """Return the backward's symbols with recomputations inserted, and the new
    list of values to save. ``visible`` names the program's arguments and
    outputs (always alive, so free to save); ``overwritten`` names the values
    whose memory a later forward symbol writes (never recomputed from).
    ``fusing``: a fusion executor runs the program (``_smaller_inputs``).
    ``norms``: norm outputs are recomputed from their inputs (``_norm_recompute``).

    A saved intermediate made by a short cheap chain (``_MAX_RECOMPUTE``
    symbols) is recomputed in the backward when the chain's inputs (its
    *frontier*) are saved anyway or visible: that strictly lowers what is kept
    between forward and backward and never makes a new value be saved (``gelu``
    of a matmul: the backward needs the matmul's result for gelu's own
    backward, so gelu's output is recomputed from it instead of being kept too).
    Otherwise the value is saved, as eager saves it (recomputing a residual sum
    from its two summands would keep the same bytes and add a kernel)."""
    producer = {p.name: b for b in fwd_bsyms for p in b.proxy_outs()}
    keep = visible | {p.name for p in saved}
    candidates = [p for p in saved if p.name not in visible and p.name in producer
                  and is_cheap(producer[p.name]) and len(producer[p.name].proxy_outs()) == 1]
    recompute: dict[str, BoundSymbol] = {}
    inputs: dict[str, Proxy] = {}
    for p in candidates:
        src = _spread_from(producer[p.name], overwritten)
        if src is not None:
            recompute[p.name] = producer[p.name]
            # the input, and any symbolic size of the shape it is spread to (saved with it)
            inputs.update((a.name, a) for a in producer[p.name].proxy_args())
            continue
        found = _closure(p.name, producer, keep - {p.name}, overwritten)
        if found is None:
            continue
        chain, frontier = found
        if not fusing and _compute_bound_on_cpu(chain):
            continue
        if len(chain) <= _MAX_RECOMPUTE and all(n in keep for n in frontier):
            recompute.update(chain)
            inputs.update(frontier)
    if fusing:
        for p in candidates:
            if p.name in recompute or p.name in inputs:
                continue
            b = producer[p.name]
            new = _smaller_inputs(b, p, keep, overwritten, recompute)
            if new is not None:
                recompute[p.name] = b
                inputs.update((a.name, a) for a in b.proxy_args())
                keep |= new
    if norms:
        recompute.update(_norm_recompute(saved, producer, keep, overwritten))
    if not recompute:
        return bwd_bsyms, saved
    kept = [p for p in saved if p.name not in recompute]
    names = {p.name for p in kept}
    added = [q for n, q in inputs.items() if n not in names and n not in recompute]   # visible, or spread
    return _place(bwd_bsyms, recompute), kept + added


def _norm_recompute(saved: list[Proxy], producer: dict, keep: set[str], overwritten) -> dict[str, BoundSymbol]:
    """Every output of each norm symbol (``_NORMS``) a saved value comes out of,
    by name, where all its tensor inputs are kept anyway (saved or visible)
    and none is overwritten later: recomputed whole, so nothing it made is saved."""
    out: dict[str, BoundSymbol] = {}
    for p in saved:
        b = producer.get(p.name)
        if b is None or b.sym not in _NORMS or p.name in out:
            continue
        if all(a.name in keep and a.name not in overwritten for a in b.proxy_args()):
            out.update((o.name, b) for o in b.proxy_outs())
    return out


def _spread_from(bsym: BoundSymbol, overwritten) -> TensorProxy | None:
    """The input of a ``broadcast_in_dim`` spreading a smaller value (rotary
    embedding's cos and sin over batch and heads), or None: saving the input
    instead never keeps more bytes, and recomputing the broadcast costs no
    kernel (an ``expand`` view for the torch executor; a fusion executor reads
    the small input in place, where a saved broadcast is an output it writes
    in full)."""
    leaf = bsym
    while len(leaf.subsymbols) == 1:     # expand, broadcast_to: one broadcast_in_dim
        leaf = leaf.subsymbols[0]
    if leaf.sym.meta is not prims.broadcast_in_dim.meta or leaf.subsymbols or not leaf.args:
        return None
    src = leaf.args[0]
    if type(src) is not TensorProxy or src.name not in {p.name for p in bsym.proxy_args()} or \
            src.name in overwritten or src.numel() >= bsym.output.numel():
        return None
    return src


def _smaller_inputs(bsym: BoundSymbol, out: Proxy, keep: set[str], overwritten, recompute: dict) -> set[str] | None:
    """Under a fusion executor: the names ``bsym``'s inputs add to what is
    saved when ``out`` (its one output) is recomputed from them, or None when
    that saves no bytes. A widening (``x.float()`` of a bfloat16 ``x``: half
    precision models save float32 copies around their norms) is recomputed
    from its half the bytes; the recomputation is one more elementwise step
    of a fused backward kernel, not a kernel of its own, as torch.compile's
    partitioner recomputes such values."""
    if type(out) is not TensorProxy or has_symbolic(out.shape):
        return None
    new: dict[str, TensorProxy] = {}
    for a in bsym.proxy_args():
        if a.name in overwritten or a.name in recompute:
            return None
        if a.name in keep:
            continue
        if type(a) is not TensorProxy or has_symbolic(a.shape):
            return None
        new[a.name] = a
    if sum(a.nbytes for a in new.values()) >= out.nbytes:
        return None
    return set(new)


def _place(bwd_bsyms: list[BoundSymbol], recompute: dict[str, BoundSymbol]) -> list[BoundSymbol]:
    """Insert each recomputation right before the first symbol that reads it."""
    out: list[BoundSymbol] = []
    emitted: set[str] = set()

    def need(bsym: BoundSymbol) -> None:
        for a in bsym.proxy_args():
            src = recompute.get(a.name)
            if src is not None and a.name not in emitted:
                emitted.update(o.name for o in src.proxy_outs())     # a norm's statistics come with it
                need(src)
                out.append(src.replace(source=None))
    for bsym in bwd_bsyms:
        need(bsym)
        out.append(bsym)
    return out
