"""Which line of the user's code a traced symbol came from.

The user's line is the innermost interpreted frame that is not library code:
thunderlite's own frames (``jit(module)`` interprets ``api._call_module``) and
torch's (``F.linear`` inside ``nn.Linear.forward``) never are; everything else
is the user's program, installed packages included (a transformers model's
``modeling_llama.py``). ``source_line`` decides it once, when a symbol is
recorded, and trace comments, errors and the report read the result.

Code that thunderlite traces is sometimes generated from the user's program
(an FX graph module's ``forward``, written by torch.fx from what dynamo
captured). Its lines mean little to the user; whoever generates such code
registers, per file name, which user line each generated line stands for, and
the tracer records that line instead."""
from __future__ import annotations

import functools
import linecache
import os
import sys
import sysconfig
import types
from collections.abc import Sequence

import torch

from thunderlite.core.symbol import SourceLine

SourceTriple = tuple[str, int, str]          # (file, line number, line text)
Frame = tuple[str, int]                      # (file, line number) of an interpreted frame

_maps: dict[str, dict[int, SourceTriple]] = {}


def register_source_map(filename: str, mapping: dict[int, SourceTriple]) -> None:
    """``mapping``: generated line number -> the user's (file, line, text)."""
    _maps[filename] = dict(mapping)


def mapped_line(filename: str, lineno: int) -> SourceTriple | None:
    m = _maps.get(filename)
    return m.get(lineno) if m is not None else None


def _package_dir(init_file: str) -> str:
    return os.path.realpath(os.path.dirname(os.path.abspath(init_file))) + os.sep


_TORCH_DIR = _package_dir(torch.__file__)
_THUNDERLITE_DIR = _package_dir(os.path.dirname(os.path.abspath(__file__)))   # thunderlite/, above frontend/
# code inside the package that is the user's: the tests' programs and the demo's model
_THUNDERLITE_USER = (os.path.join(_THUNDERLITE_DIR, "tests") + os.sep, os.path.join(_THUNDERLITE_DIR, "demo.py"))
_kinds: dict[str, str | None] = {}


def library_kind(filename: str) -> str | None:
    """``"thunderlite"`` or ``"torch"`` when ``filename`` is that library's own
    code, else None (the user's). Cached per file name: asked for every frame
    of every recorded symbol."""
    if filename in _kinds:
        return _kinds[filename]
    # "<string>", FX code; a path already inside torch's or thunderlite's directory is
    # decided as it is (resolving it asks the file system for every part of the path)
    inside = filename.startswith((_TORCH_DIR, _THUNDERLITE_DIR)) and os.sep + ".." not in filename
    path = filename if inside or filename.startswith("<") else os.path.realpath(filename)
    kind = None
    if path.startswith(_THUNDERLITE_DIR) and not path.startswith(_THUNDERLITE_USER):
        kind = "thunderlite"
    elif path.startswith(_TORCH_DIR):
        kind = "torch"
    _kinds[filename] = kind
    return kind


_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def is_stdlib(filename: str) -> bool:
    return filename.startswith(_STDLIB)


@functools.lru_cache(maxsize=4096)
def user_file(filename: str) -> bool:
    """Code of the user's: not torch's, thunderlite's or the standard library's
    (whose module and class state the program does not change between calls)."""
    return library_kind(filename) is None and not is_stdlib(filename)


def defined_by_user(obj) -> bool:
    """``obj`` (a module, class or function) comes from a file of the user's."""
    mod = obj if isinstance(obj, types.ModuleType) else sys.modules.get(getattr(obj, "__module__", None) or "")
    f = getattr(mod, "__file__", None)
    return f is not None and user_file(f)


def source_line(frames: Sequence[Frame]) -> SourceLine | None:
    """The user's line for a symbol recorded under the interpreted ``frames``
    (outermost first): the innermost frame that is not library code, mapped
    through the generated-code maps, with the frames that led there and the
    torch frames below it (``via``). thunderlite's own frames are dropped
    altogether. When every frame is torch's (``jit(nn.Linear(...))``) the
    innermost one is the line; when every frame is thunderlite's, None."""
    frames = [f for f in frames if library_kind(f[0]) != "thunderlite"]
    if not frames:
        return None
    i = next((i for i in range(len(frames) - 1, -1, -1) if library_kind(frames[i][0]) is None), len(frames) - 1)
    fname, lineno = frames[i]
    line = mapped_line(fname, lineno) or (fname, lineno, linecache.getline(fname, lineno).strip())
    return SourceLine(line, frames[:i], frames[i + 1:])
