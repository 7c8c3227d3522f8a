"""Lines of generated code that stand for lines of the user's code.

Code that thunderlite traces is sometimes generated from the user's program
(an FX graph module's ``forward``, written by torch.fx from what dynamo
captured). Its lines mean little to the user; whoever generates such code
registers, per file name, which user line each generated line stands for, and
the tracer records that line instead (trace comments, errors, the report)."""
from __future__ import annotations

SourceTriple = tuple[str, int, str]          # (file, line number, line text)

_maps: dict[str, dict[int, SourceTriple]] = {}


def register_source_map(filename: str, mapping: dict[int, SourceTriple]) -> None:
    """``mapping``: generated line number -> the user's (file, line, text)."""
    _maps[filename] = dict(mapping)


def mapped_line(filename: str, lineno: int) -> SourceTriple | None:
    m = _maps.get(filename)
    return m.get(lineno) if m is not None else None
