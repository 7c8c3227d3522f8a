"""Printing traces as Python source, and compiling that source.

Printing is how users debug (docs/architecture.md §4): one line per bound symbol with the
output's metadata in a comment, decompositions as indented comments, the user's
source line above each group of symbols it produced. Values Python cannot spell
(tensors captured as constants, arbitrary objects) are printed as names bound
in the compiled function's globals.

An implementation function may carry ``direct_source(bsym, repr) -> str |
None``: the same computation spelled as the torch calls it makes
(``torch.Tensor.expand(t0, (2, 3))``, ``t0[:, 0:4]``), printed in place of a
call of the function itself, so the generated code runs it without a Python
frame; None keeps the plain call. It may name only ``torch`` (always bound)."""
from __future__ import annotations

import itertools
import keyword
import linecache
import types
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core.proxies import Proxy
from thunderlite.core.pytree import leaves
from thunderlite.core.symint import SymInt
from thunderlite.core.tags import Tag
from thunderlite.core.tracectx import tables_lock

INDENT = "  "


def value_repr(x: Any, consts: dict) -> str:
    """Python source that evaluates to ``x`` given ``consts`` in the globals."""
    if isinstance(x, Proxy):
        return x.name
    t = type(x)
    if t is SymInt:
        text = x.python()
        return text if text.isidentifier() else f"({text})"
    if x is None or t is bool or t is int or t is str:
        return repr(x)
    if t is float or t is complex:
        r = repr(x)
        return r if r not in ("inf", "-inf", "nan", "infj", "nanj") else f"{t.__name__}({r!r})"
    if t is tuple or t is torch.Size:
        inner = ", ".join(value_repr(y, consts) for y in x)
        return f"({inner},)" if len(x) == 1 else f"({inner})"
    if isinstance(x, tuple) and hasattr(t, "n_fields"):     # torch.return_types structseqs
        return f"{_const_name(t, consts)}(({''.join(value_repr(y, consts) + ', ' for y in x)}))"
    if t is list:
        return "[" + ", ".join(value_repr(y, consts) for y in x) + "]"
    if t is dict and all(type(k) is str for k in x):
        return "{" + ", ".join(f"{k!r}: {value_repr(v, consts)}" for k, v in x.items()) + "}"
    if t is slice:
        return f"slice({value_repr(x.start, consts)}, {value_repr(x.stop, consts)}, {value_repr(x.step, consts)})"
    if x is Ellipsis:
        return "..."
    if t is torch.dtype:
        return str(x)
    if t is torch.device:
        return f"torch.device({str(x)!r})"
    if t is torch.memory_format or t is torch.layout:
        return str(x)
    return _const_name(x, consts)


def _const_name(x: Any, consts: dict) -> str:
    for name, v in consts.items():
        if v is x:
            return name
    base = getattr(x, "__name__", None) or type(x).__name__
    base = "".join(c if c.isalnum() else "_" for c in base).lower() or "c"
    name = f"_{base}_{len(consts)}"
    consts[name] = x
    return name


def _lhs(out: Any, consts: dict) -> str | None:
    """Assignment target for a bound symbol's output, or None if nothing to bind."""
    if isinstance(out, Proxy):
        return out.name
    if isinstance(out, (tuple, list)) and out:     # torch.return_types structseqs are tuples
        parts = [_lhs(o, consts) or "_" for o in out]
        if all(p == "_" for p in parts):
            return None
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return None


def _meta_text(out: Any) -> str:
    return ", ".join(f'{p.name}: "{p.type_string()}"' for p in leaves(out) if isinstance(p, Proxy))


def call_source(bsym, consts: dict) -> str:
    sym = bsym.sym
    direct = getattr(sym.impl, "direct_source", None) if type(sym.impl) is types.FunctionType else None
    if direct is not None:        # the implementation spelled as the torch calls it makes: no frame of its own
        text = direct(bsym, lambda x: value_repr(x, consts))
        if text is not None:
            return text
    args = [value_repr(a, consts) for a in bsym.args]
    args += [f"{k}={value_repr(v, consts)}" for k, v in bsym.kwargs.items()]
    name = f"{sym.module}.{sym.name}" if sym.module else sym.name
    return f"{name}({', '.join(args)})"


def bsym_parts(bsym, consts: dict) -> tuple[str, str]:
    """One bound symbol as (statement, its outputs' metadata): for printers that
    lay the two out apart (the trace report)."""
    if Tag.RETURN in bsym.sym.tags:
        return "return " + value_repr(bsym.args[0] if bsym.args else None, consts), ""
    call = call_source(bsym, consts)
    lhs = _lhs(bsym.output, consts)
    return (f"{lhs} = {call}" if lhs else call), _meta_text(bsym.output)


def bsym_line(bsym, consts: dict) -> str:
    """One bound symbol as a statement, without indentation."""
    code, meta = bsym_parts(bsym, consts)
    return f"{code}  # {meta}" if meta else code


def _source_comment(source) -> str:
    fname, lineno, text = source
    return f"# {fname}:{lineno}: {text.strip()}" if text else f"# {fname}:{lineno}"


def trace_source(trace, *, subsymbols: bool = True, consts: dict | None = None) -> str:
    """The trace as a Python module defining one function named ``trace.name``."""
    return "\n".join(full for full, _ in _trace_lines(trace, subsymbols, consts)) + "\n"


def trace_sources(trace, consts: dict) -> tuple[str, str]:
    """``(printed, code)``: the trace's source without decompositions, and the
    same lines with every comment blanked out (the text programs that differ
    only in comments, such as metadata and source lines, share)."""
    lines = _trace_lines(trace, False, consts)
    return ("\n".join(full for full, _ in lines) + "\n", "\n".join(code for _, code in lines) + "\n")


def _trace_lines(trace, subsymbols: bool, consts: dict | None) -> list[tuple[str, str]]:
    """Each line of the printed trace with its code alone (comments blanked)."""
    consts = {} if consts is None else consts
    lines = [(f"# Constructed by {trace.stage}", "")] if trace.stage else []
    lines += [(f"# {c}", "") for c in trace.header_comments]
    params = ", ".join(p.name if isinstance(p, Proxy) else f"_unused{i}" for i, p in enumerate(trace.args))
    head = f"def {trace.name}({params}):"
    lines.append((head, head))
    for p in trace.args:
        if isinstance(p, Proxy):
            lines.append((f'{INDENT}# {p.name}: "{p.type_string()}"', ""))
    last_source = None
    for bsym in trace.bound_symbols:
        if bsym.source is not None and bsym.source != last_source:
            lines.append((INDENT + _source_comment(bsym.source), ""))
            last_source = bsym.source
        if bsym.header:
            lines.append((f"{INDENT}# {bsym.header}", ""))
        code, meta = bsym_parts(bsym, consts)
        lines.append((INDENT + (f"{code}  # {meta}" if meta else code), INDENT + code))
        if subsymbols:
            sub: list[str] = []
            _append_subsymbols(sub, bsym, consts, 2)
            lines += [(line, "") for line in sub]
    if not trace.bound_symbols:
        lines.append((INDENT + "pass", INDENT + "pass"))
    return lines


def _append_subsymbols(lines: list, bsym, consts: dict, depth: int) -> None:
    for sub in bsym.subsymbols:
        lines.append(INDENT * depth + "# " + bsym_line(sub, consts))
        _append_subsymbols(lines, sub, consts, depth + 1)


_compile_counter = itertools.count(1)      # next() is atomic: each generated file name is unique across threads
# source -> code object, for small sources: the key functions, entries and
# guards of programs with the same argument structure are the same text, and
# compile() is most of what making one costs. Bounded: the oldest goes first.
_CODE_CACHE: dict[str, Any] = {}
_CODE_CACHE_MAX_ENTRIES = 1024
_CODE_CACHE_MAX_SOURCE = 4096


def compile_source(src: str, fn_name: str, globs: dict, code_text: str | None = None) -> Callable:
    """exec ``src`` and return the function it defines. The source is registered
    with linecache so tracebacks through generated code show its lines.
    ``code_text``: ``src`` with its comments blanked (same lines), the key under
    which its code object is kept and reused by sources differing only in comments."""
    key = src if code_text is None else code_text
    code = _CODE_CACHE.get(key)
    if code is not None and code_text is None:
        return _run(code, fn_name, globs)
    filename = f"<thunderlite {fn_name} {next(_compile_counter)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    if code is not None:
        return _run(_with_filename(code, filename), fn_name, globs)     # this text in tracebacks
    code = compile(src, filename, "exec")
    if len(key) <= _CODE_CACHE_MAX_SOURCE:
        with tables_lock:
            if len(_CODE_CACHE) >= _CODE_CACHE_MAX_ENTRIES:
                del _CODE_CACHE[next(iter(_CODE_CACHE))]
            _CODE_CACHE[key] = code
    return _run(code, fn_name, globs)


def _run(code: types.CodeType, fn_name: str, globs: dict) -> Callable:
    exec(code, globs)
    return globs[fn_name]


def _with_filename(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_with_filename(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def bind_path(globs: dict, path: str, obj: Any) -> None:
    """Make the dotted ``path`` evaluate to ``obj`` in ``globs``. A root that names
    a real module (``torch``) must already resolve to ``obj`` there."""
    parts = path.split(".")
    root = parts[0]
    if len(parts) == 1:
        _bind_leaf(globs, root, obj, path)
        return
    ns = globs.get(root)
    if ns is None:
        ns = globs[root] = types.SimpleNamespace()
    for part in parts[1:-1]:
        nxt = getattr(ns, part, None)
        if nxt is None:
            if not isinstance(ns, types.SimpleNamespace):
                raise ValueError(f"cannot bind {path!r}: {part!r} is missing from a real module")
            nxt = types.SimpleNamespace()
            setattr(ns, part, nxt)
        ns = nxt
    leaf = parts[-1]
    if isinstance(ns, types.SimpleNamespace):
        cur = getattr(ns, leaf, None)
        if cur is not None and cur is not obj:
            raise ValueError(f"two different callables print as {path!r}")
        setattr(ns, leaf, obj)
    elif getattr(ns, leaf, None) is not obj:
        raise ValueError(f"{path!r} names a real module attribute that is not the callable bound to it")


def _bind_leaf(globs: dict, name: str, obj: Any, path: str) -> None:
    cur = globs.get(name)
    if cur is not None and cur is not obj:
        raise ValueError(f"two different values print as {path!r}")
    globs[name] = obj


RESERVED_NAMES = frozenset(keyword.kwlist) | frozenset({"torch", "ltorch", "prims", "math", "builtins",
                                                       "torchex", "opaque"})
