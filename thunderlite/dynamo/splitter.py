"""Split a dynamo FX graph into runs of nodes thunderlite takes and runs it
does not, in graph order (``torch.fx.passes.split_module`` carries grad-mode
and autocast regions into every piece that needs them).

Splitting is sound only where every node is a function of the values it
reads (and writes): a graph holding a node the backend does not model
(``support.refusal``: a tensor hook, a ``BackwardState``, a higher-order op,
an unknown call) is not split at all but goes whole to the fallback."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from thunderlite.dynamo.support import _GLOBAL_STATE, _MISSING, Verdict, op_name, refusal, source_of, verdict


@dataclass
class Piece:
    """One partition of a graph: which executor family runs it and why."""
    name: str                          # submodule name in the split graph ("submod_0"...)
    thunder: bool                      # True: thunderlite; False: the fallback compiler
    ops: list[str] = field(default_factory=list)
    reasons: list[tuple[str, str]] = field(default_factory=list)   # (reason, user source line)
    whole: bool = False                # the whole graph, unsplit: it holds nodes the backend does not model


def _is_functorch(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    mod = getattr(node.target, "__module__", None) or ""
    return mod.startswith(("torch._functorch", "torch._C._functorch"))


def _is_tensor(v) -> bool:
    return isinstance(v, torch.Tensor)


def _scalar_only(node: torch.fx.Node) -> bool:
    """Size arithmetic and runtime asserts on sizes: no tensor in, no tensor out.
    They stay with the piece they stand in, so a split never isolates them."""
    if node.op != "call_function":
        return False
    vals = [a.meta.get("example_value") for a in node.all_input_nodes] + [node.meta.get("example_value")]
    return not any(_is_tensor(v) for v in torch.utils._pytree.tree_leaves(vals)) and \
        not any(_is_tensor(a.meta.get("example_value")) for a in node.all_input_nodes)


def refusals(gm: torch.fx.GraphModule, example_inputs: Sequence | None = None) -> list[Verdict]:
    """The nodes the backend does not model (``support.refusal``), in graph order."""
    examples = iter(example_inputs if example_inputs is not None else ())
    out = []
    for node in gm.graph.nodes:
        example = next(examples, _MISSING) if node.op == "placeholder" else _MISSING
        v = refusal(node, example)
        if v is not None:
            out.append(v)
    return out


def _first_per_reason(verdicts: list[Verdict]) -> list[tuple[str, str]]:
    """(reason, source) once per reason, at its first line: the report stays short."""
    seen: dict[str, str] = {}
    for v in verdicts:
        seen.setdefault(v.reason, v.source)
    return list(seen.items())


def _call_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]


def partition(gm: torch.fx.GraphModule, example_inputs: Sequence | None = None
              ) -> tuple[dict[torch.fx.Node, int], list[Piece]]:
    """Assign each node a partition id; a new id starts wherever support changes.
    Grad-mode and autocast switches join the piece they stand in. A graph with a
    node the backend does not model is one fallback piece (``Piece.whole``)."""
    whole = refusals(gm, example_inputs)
    if whole and all(v.unsplit_ok for v in whole):
        # tensor hooks: thunderlite applies them in its own backward, but a piece
        # boundary would lose them; only a graph thunderlite takes whole keeps them
        ids, pieces = _pieces(gm)
        if len(pieces) == 1 and pieces[0].thunder:
            return ids, pieces
        whole += [Verdict(False, "the graph would be split (" + "; ".join(r for p in pieces for r, _ in p.reasons)
                          + ")", whole=True)]
    if whole:
        piece = Piece(name="submod_0", thunder=False, whole=True,
                      ops=[op_name(n) for n in _call_nodes(gm)],
                      reasons=_first_per_reason(whole))
        return {n: 0 for n in _call_nodes(gm)}, [piece]
    return _pieces(gm)


def _pieces(gm: torch.fx.GraphModule) -> tuple[dict[torch.fx.Node, int], list[Piece]]:
    ids: dict[torch.fx.Node, int] = {}
    pieces: list[Piece] = []
    depth = 0                           # inside vmap/grad/jvp levels dynamo captured
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        name = getattr(node.target, "__name__", "")
        functorch = _is_functorch(node)
        depth += functorch and name.endswith("_increment_nesting")
        if depth or functorch:
            v = Verdict(False, "inside a torch.func transform (vmap/grad/jvp) that dynamo captured: "
                               "thunderlite does not run functorch levels", source_of(node))
        elif pieces and (node.op == "call_function" and node.target in _GLOBAL_STATE or _scalar_only(node)):
            ids[node] = len(pieces) - 1
            continue
        else:
            v = verdict(node)
        depth -= functorch and name.endswith("_decrement_nesting")
        if not pieces or pieces[-1].thunder != v.supported:
            pieces.append(Piece(name=f"submod_{len(pieces)}", thunder=v.supported))
        piece = pieces[-1]
        piece.ops.append(op_name(node))
        if not v.supported:
            piece.reasons.append((v.reason, v.source))
        ids[node] = len(pieces) - 1
    return ids, pieces


def split(gm: torch.fx.GraphModule, example_inputs: Sequence | None = None
          ) -> tuple[torch.fx.GraphModule | None, list[Piece]]:
    """(split graph module or None when one piece covers the whole graph, pieces).
    ``example_inputs``: the backend's, for placeholders without an example value."""
    ids, pieces = partition(gm, example_inputs)
    if len(pieces) <= 1:
        if not pieces:
            pieces.append(Piece(name="submod_0", thunder=True))
        return None, pieces
    for node in gm.graph.nodes:     # global-state switches before any op open the first piece
        if node not in ids and node.op == "call_function":
            ids[node] = 0
    split_gm = split_module(gm, None, lambda n: ids[n], keep_original_order=True)
    return split_gm, pieces
