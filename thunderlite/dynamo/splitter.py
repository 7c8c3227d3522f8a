"""Split a dynamo FX graph into runs of nodes thunderlite takes and runs it
does not, in graph order (``torch.fx.passes.split_module`` carries grad-mode
and autocast regions into every piece that needs them)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from thunderlite.dynamo.support import _GLOBAL_STATE, Verdict, op_name, source_of, verdict


@dataclass
class Piece:
    """One partition of a graph: which executor family runs it and why."""
    name: str                          # submodule name in the split graph ("submod_0"...)
    thunder: bool                      # True: thunderlite; False: the fallback compiler
    ops: list[str] = field(default_factory=list)
    reasons: list[tuple[str, str]] = field(default_factory=list)   # (reason, user source line)


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


def partition(gm: torch.fx.GraphModule) -> tuple[dict[torch.fx.Node, int], list[Piece]]:
    """Assign each node a partition id; a new id starts wherever support changes.
    Grad-mode and autocast switches join the piece they stand in."""
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


def split(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule | None, list[Piece]]:
    """(split graph module or None when one piece covers the whole graph, pieces)."""
    ids, pieces = partition(gm)
    if len(pieces) <= 1:
        if not pieces:
            pieces.append(Piece(name="submod_0", thunder=True))
        return None, pieces
    for node in gm.graph.nodes:     # global-state switches before any op open the first piece
        if node not in ids and node.op == "call_function":
            ids[node] = 0
    split_gm = split_module(gm, None, lambda n: ids[n], keep_original_order=True)
    return split_gm, pieces
