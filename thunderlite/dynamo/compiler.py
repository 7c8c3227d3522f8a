"""``ThunderCompiler``: thunderlite as a ``torch.compile`` backend (ThunderFX).

Dynamo hands the backend one FX graph per captured region. The compiler
splits it (``splitter.split``) into pieces thunderlite traces and pieces it
cannot; thunderlite pieces run through ``thunderlite.jit`` (its own autodiff,
alias handling and executors: no AOTAutograd there), the others through
Inductor (or eagerly, ``fallback="eager"``). A graph holding a node the
backend does not model (a tensor hook, a ``BackwardState``, a higher-order
op: ``support.refusal``) is not split: it goes whole to the fallback. A
thunderlite piece whose tracing fails on its first call (an op the static
check could not judge, or a program eager refuses) runs eagerly once: if
eager raises, so does the piece (the program is wrong as written; Inductor
would not tell, it functionalizes writes eager refuses); if not, the piece is
handed to the fallback and the reason joins the report.

Example::

    from thunderlite.dynamo import ThunderCompiler
    backend = ThunderCompiler(executors=["torch"])
    model = torch.compile(model, backend=backend)
    model(x)
    print(backend.report())          # every split, its reason and source line
    backend.last_traces()            # per thunderlite piece: its stages
"""
from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from thunderlite.api import jit
from thunderlite.dynamo.splitter import Piece, split
from thunderlite.dynamo.support import user_frame
from thunderlite.frontend.source_map import register_source_map

FALLBACKS = ("inductor", "eager")


def _realize(gm: torch.fx.GraphModule) -> None:
    """Lazy graph modules generate ``forward`` on first call, through code the
    interpreter would have to trace; generate it now, and tell the tracer which
    user line each line of that code stands for (so traces name the user's lines)."""
    real = getattr(gm, "real_recompile", None)
    if real is not None:
        real()
    _register_lines(gm)


def _register_lines(gm: torch.fx.GraphModule) -> None:
    lineno_map = getattr(gm, "_lineno_map", None)
    code = getattr(getattr(gm, "forward", None), "__code__", None)
    if not lineno_map or code is None:
        return
    nodes = list(gm.graph.nodes)
    start = getattr(gm, "_prologue_start", 0)
    mapping = {}
    for line, idx in lineno_map.items():
        frame = user_frame(nodes[idx]) if idx is not None and idx < len(nodes) else None
        if frame is not None:
            mapping[line + start] = frame
    register_source_map(code.co_filename, mapping)


def _compile_fallback(gm: torch.fx.GraphModule, fallback: str, args: list, *, backend_time: bool = False
                      ) -> Callable:
    """The fallback's callable for a piece; ``backend_time``: compiling inside
    dynamo's call to the backend, where Inductor may ask dynamo to restart the
    capture (``TensorifyScalarRestartAnalysis``), which must reach dynamo as it
    would from ``backend="inductor"``."""
    if fallback == "inductor":
        from torch._dynamo.exc import TensorifyScalarRestartAnalysis
        try:
            from torch._inductor import compile as inductor_compile
            # Inductor may rewrite the graph it is given (outputs made a list): give it a copy
            return inductor_compile(torch.fx.GraphModule(gm, copy.deepcopy(gm.graph)), args)
        except TensorifyScalarRestartAnalysis:
            if backend_time:
                raise
            warnings.warn("thunderlite.dynamo: Inductor asked for a new capture of a fallback piece compiled "
                          "at call time; running it eagerly", stacklevel=2)
        except Exception as e:  # noqa: BLE001 - no working Inductor here: run the piece eagerly
            warnings.warn(f"thunderlite.dynamo: Inductor could not compile a fallback piece ({e}); "
                          "running it eagerly", stacklevel=2)
    return gm


class PieceRunner:
    """Runs one piece: thunderlite's jitted graph, or the fallback compiler's.
    A plain callable (not a module) and the graph's bound ``forward`` jitted,
    so a cached call pays for no ``nn.Module.__call__`` on the way."""

    def __init__(self, gm: torch.fx.GraphModule, piece: Piece, fallback: str, jit_options: dict,
                 example_inputs: list | None = None):
        _realize(gm)
        self.gm = gm
        self.piece = piece
        self.fallback = fallback
        self.jfn = jit(gm.forward, **jit_options) if piece.thunder else None
        self.fallback_fn: Callable | None = None
        if not piece.thunder and example_inputs is not None:
            # at backend time, under dynamo's fake mode: Inductor sees the sizes dynamo saw
            self.fallback_fn = _compile_fallback(gm, fallback, example_inputs, backend_time=True)

    def __call__(self, *args: Any) -> Any:
        if self.jfn is not None:
            return self._thunder_call(args)
        if self.fallback_fn is None:
            self.fallback_fn = _compile_fallback(self.gm, self.fallback, list(args))
        return self.fallback_fn(*args)

    def _thunder_call(self, args: tuple) -> Any:
        j = self.jfn
        misses, last = j.info.misses, j.last
        try:
            return j(*args)
        except Exception as e:
            if j.info.misses == misses or j.last is not last:
                raise                           # the compiled program itself raised: as eager would
            error = e
        # thunderlite did not trace the piece: a limit of thunderlite's, or a
        # program eager refuses (a write into an expanded tensor, as the jit
        # raises it). Eager decides: it runs the piece now. If eager raises, the
        # program is wrong as written: its error is the answer and the piece
        # stays with thunderlite for later calls (the fallback must not run it:
        # Inductor functionalizes the write and returns a result eager refuses).
        try:
            out = self.gm(*args)
        except Exception as eager_error:  # noqa: BLE001 - whatever eager raises is the answer
            raise _eager_answer(error, eager_error) from None
        first = (str(error).splitlines() or [type(error).__name__])[0]
        self.piece.reasons.append((f"thunderlite could not trace this piece: {type(error).__name__}: "
                                   f"{first[:200]}", ""))
        self.piece.thunder = False
        self.jfn = None
        warnings.warn(f"thunderlite.dynamo: {self.piece.name} runs on the {self.fallback} fallback: "
                      f"{type(error).__name__}: {first[:200]}", stacklevel=2)
        return out


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0]


def _eager_answer(thunder_error: Exception, eager_error: Exception) -> Exception:
    """The error to raise when eager refuses a piece thunderlite refused too:
    thunderlite's when it is eager's (same type, same first line), since it
    names the user's line; else eager's own."""
    same = type(thunder_error) is type(eager_error) and _first_line(eager_error) != "" \
        and str(thunder_error).startswith(_first_line(eager_error))
    return thunder_error if same else eager_error


def _examples(sub: torch.fx.GraphModule, by_name: dict) -> list | None:
    """A piece's example inputs: the example values dynamo recorded for the
    original nodes its placeholders stand for (None if any is missing)."""
    out = []
    for node in sub.graph.nodes:
        if node.op != "placeholder":
            continue
        orig = by_name.get(node.name)
        meta = orig.meta if orig is not None else {}
        if "example_value" not in meta:
            return None
        out.append(meta["example_value"])
    return out


@dataclass
class CompiledGraph:
    """One graph dynamo captured, as the backend compiled it."""
    index: int
    num_nodes: int
    pieces: list[Piece]
    runners: list[PieceRunner] = field(default_factory=list)
    split_gm: torch.fx.GraphModule | None = None
    dynamic: list[str] = field(default_factory=list)      # placeholders dynamo made symbolic sizes


class ThunderCompiler:
    """A ``torch.compile`` backend that runs what it can through thunderlite.

    ``jit_options`` go to ``thunderlite.jit`` for every piece (``executors=``,
    ``cache=``...; ``cache`` defaults to ``"symbolic values"`` here, since the
    numbers a piece receives change from call to call). ``fallback``: ``"inductor"`` (default) or ``"eager"`` for
    the pieces thunderlite does not take."""

    def __init__(self, *, fallback: str = "inductor", **jit_options: Any):
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback={fallback!r} is not one of {FALLBACKS}")
        self.fallback = fallback
        # numbers entering a piece come from dynamo (symbolic floats) or from a
        # split-out .item(): keep floats symbolic so a new value is no recompile
        self.jit_options = {"cache": "symbolic values", **jit_options}
        self.graphs: list[CompiledGraph] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        _realize(gm)
        split_gm, pieces = split(gm, example_inputs)
        dynamic = [n.name for n in gm.graph.nodes if n.op == "placeholder"
                   and isinstance(n.meta.get("example_value"), (torch.SymInt, torch.SymFloat))]
        graph = CompiledGraph(index=len(self.graphs), num_nodes=len(gm.graph.nodes), pieces=pieces,
                              split_gm=split_gm, dynamic=dynamic)
        if split_gm is None:
            runner = PieceRunner(gm, pieces[0], self.fallback, self.jit_options, example_inputs)
            graph.runners.append(runner)
            self.graphs.append(graph)       # only once compiled: a capture dynamo restarts is not reported
            return runner
        by_name = {n.name: n for n in gm.graph.nodes}
        for piece in pieces:
            sub = getattr(split_gm, piece.name)
            runner = PieceRunner(sub, piece, self.fallback, self.jit_options, _examples(sub, by_name))
            delattr(split_gm, piece.name)
            setattr(split_gm, piece.name, runner)
            graph.runners.append(runner)
        _realize(split_gm)
        self.graphs.append(graph)
        return split_gm

    # --- what it did ---------------------------------------------------------------------------
    def thunder_functions(self) -> list:
        """The ``thunderlite.jit`` callables of every piece thunderlite runs, in capture order."""
        return [r.jfn for g in self.graphs for r in g.runners if r.jfn is not None]

    def _traces(self, getter: Callable) -> list[list]:
        out = []
        for jfn in self.thunder_functions():
            try:
                out.append(getter(jfn))
            except RuntimeError:        # captured but never called
                continue
        return out

    def last_traces(self) -> list[list]:
        """Per thunderlite piece (that ran): every stage's trace of its last call."""
        from thunderlite.api import last_traces
        return self._traces(last_traces)

    def last_backward_traces(self) -> list[list]:
        from thunderlite.api import last_backward_traces
        return self._traces(last_backward_traces)

    def report(self) -> str:
        """Every graph dynamo captured, its pieces, who runs each, and why each split happened."""
        lines = [f"ThunderCompiler(fallback={self.fallback!r}): {len(self.graphs)} graph(s)"]
        for g in self.graphs:
            lines.append(f"graph {g.index}: {g.num_nodes} nodes, {len(g.pieces)} piece(s)")
            if g.dynamic:
                lines.append(f"  dynamic sizes {', '.join(g.dynamic)}: int inputs of thunderlite pieces, "
                             "traced as size symbols (one compile for every size)")
            for p in g.pieces:
                who = "thunderlite" if p.thunder else self.fallback
                ops = ", ".join(dict.fromkeys(p.ops))
                lines.append(f"  {p.name} [{who}] {len(p.ops)} op(s): {ops[:200]}")
                label = "whole graph to the fallback" if p.whole else "split"
                for reason, source in p.reasons:
                    lines.append(f"    {label}: {reason}" + (f"\n      at {source}" if source else ""))
        return "\n".join(lines)

    def splits(self) -> list[dict]:
        """The report as data: one dict per piece not run by thunderlite."""
        return [{"graph": g.index, "piece": p.name, "runs_on": self.fallback, "whole": p.whole,
                 "reasons": [r for r, _ in p.reasons], "sources": [s for _, s in p.reasons if s]}
                for g in self.graphs for p in g.pieces if not p.thunder]
