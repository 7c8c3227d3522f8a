"""The trace verifier, run after every pass in tests (CONTRIBUTING.md, style 9): SSA names,
defined-before-use, a single return that comes last."""
from __future__ import annotations

from thunderlite.core.proxies import Proxy
from thunderlite.core.tags import Tag


class TraceVerificationError(AssertionError):
    pass


def verify_trace(trace) -> None:
    """Raise ``TraceVerificationError`` naming the offending line, or return None."""
    defined: set[str] = set()
    for a in trace.args:
        if isinstance(a, Proxy):
            _check(a.name not in defined, trace, None, f"argument {a.name} appears twice")
            defined.add(a.name)
    bsyms = trace.bound_symbols
    for i, bsym in enumerate(bsyms):
        is_return = Tag.RETURN in bsym.sym.tags
        _check(not is_return or i == len(bsyms) - 1, trace, bsym, "return is not the last symbol")
        for p in bsym.proxy_args():
            _check(p.name in defined, trace, bsym, f"{p.name} is used before it is defined")
        for p in bsym.proxy_outs():
            _check(p.name not in defined, trace, bsym, f"{p.name} is assigned twice (not SSA)")
            defined.add(p.name)
    _check(bool(bsyms) and Tag.RETURN in bsyms[-1].sym.tags, trace, None, "the trace has no return")


def _check(cond: bool, trace, bsym, msg: str) -> None:
    if cond:
        return
    where = f"\n  at: {bsym!r}" if bsym is not None else ""
    raise TraceVerificationError(f"{msg} in trace {trace.name!r} ({trace.stage}){where}\n"
                                 f"{trace.python(subsymbols=False)}")
