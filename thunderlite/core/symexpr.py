"""Integer expressions in a normal form: the values symbolic sizes stand for.

An expression (``Expr``) is a tuple of ``(monomial, coefficient)`` pairs, a
polynomial with integer coefficients over *atoms*: base symbols (their names)
and compound atoms for what does not simplify, ``("//", a, b)``,
``("%", a, b)``, ``("max", a, b)``, ``("min", a, b)``. Operations keep the
normal form, so equal polynomials are equal tuples and ``(B*s0*H) // (B*H)``
is ``s0``. Nothing here decides or guards anything: that is core/symint.py's
``ShapeEnv``.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable

# An expression is a tuple of (monomial, coefficient) sorted by monomial; a
# monomial is a sorted tuple of atom keys (a repeated key is a power). The
# constant term has the monomial (). An atom key is a base symbol's name (str)
# or a compound atom: ("//", expr, divisor_expr), ("%", expr, divisor_expr),
# ("max", a, b), ("min", a, b).

Expr = tuple


def const(c: int) -> Expr:
    return (((), c),) if c else ()


def atom(key) -> Expr:
    return (((key,), 1),)


def _normal(terms: dict) -> Expr:
    return tuple(sorted(((m, c) for m, c in terms.items() if c), key=lambda mc: _mono_order(mc[0])))


def _mono_order(m: tuple) -> tuple:
    return (not m, len(m), tuple(atom_order(k) for k in m))      # the constant prints last


def atom_order(k) -> str:
    return k if type(k) is str else repr(k)


def add(a: Expr, b: Expr, sign: int = 1) -> Expr:
    terms = dict(a)
    for m, c in b:
        terms[m] = terms.get(m, 0) + sign * c
    return _normal(terms)


def mul(a: Expr, b: Expr) -> Expr:
    terms: dict = {}
    for ma, ca in a:
        for mb, cb in b:
            m = tuple(sorted(ma + mb, key=atom_order))
            terms[m] = terms.get(m, 0) + ca * cb
    return _normal(terms)


def constant(e: Expr) -> int | None:
    if not e:
        return 0
    if len(e) == 1 and e[0][0] == ():
        return e[0][1]
    return None


def divide_exactly(e: Expr, d: Expr) -> Expr | None:
    """``e / d`` when ``d`` is one monomial dividing every term of ``e`` exactly."""
    if len(d) != 1:
        return None
    dm, dc = d[0]
    out: dict = {}
    for m, c in e:
        if c % dc:
            return None
        rest = list(m)
        for k in dm:
            if k not in rest:
                return None
            rest.remove(k)
        out[tuple(rest)] = c // dc
    return _normal(out)


def floordiv(a: Expr, b: Expr) -> Expr:
    ca, cb = constant(a), constant(b)
    if cb == 0:
        raise ZeroDivisionError("integer division or modulo by zero (a symbolic size)")
    if ca is not None and cb is not None:
        return const(ca // cb)
    if cb == 1:
        return a
    q = divide_exactly(a, b)
    if q is not None:
        return q
    a, b = _cancel(a, b)
    if constant(b) == 1:
        return a
    return atom(("//", a, b))


def _cancel(a: Expr, b: Expr) -> tuple[Expr, Expr]:
    """``a`` and ``b`` without the factor common to all their terms (their
    ratio is unchanged, so ``a // b`` is too)."""
    g, common = 0, None
    for m, c in a + b:
        g = math.gcd(g, c)
        if common is None:
            common = list(m)
        else:
            rest = list(m)
            common = [k for k in common if k in rest and (rest.remove(k) or True)]
    if g <= 1 and not common:
        return a, b
    d = (((tuple(sorted(common or (), key=atom_order))), max(g, 1)),)
    return divide_exactly(a, d), divide_exactly(b, d)


def mod(a: Expr, b: Expr) -> Expr:
    ca, cb = constant(a), constant(b)
    if cb == 0:
        raise ZeroDivisionError("integer division or modulo by zero (a symbolic size)")
    if ca is not None and cb is not None:
        return const(ca % cb)
    if cb == 1 or divide_exactly(a, b) is not None:
        return ()
    return atom(("%", a, b))


def substitute(e: Expr, rep: dict) -> Expr:
    """``e`` with base symbols replaced by expressions (compound atoms re-simplified)."""
    out: Expr = ()
    for m, c in e:
        term = const(c)
        for k in m:
            if type(k) is str:
                factor = rep.get(k)
                factor = atom(k) if factor is None else factor
            else:
                subs = [substitute(x, rep) for x in k[1:]]
                factor = _COMPOUND_BUILD[k[0]](*subs)
            term = mul(term, factor)
        out = add(out, term)
    return out


def free_atoms(e: Expr) -> set[str]:
    """The base symbols ``e`` reads."""
    out: set[str] = set()
    for m, _ in e:
        for k in m:
            if type(k) is str:
                out.add(k)
            else:
                for sub in k[1:]:
                    out |= free_atoms(sub)
    return out


def evaluate(e: Expr, values: dict[str, int]) -> int | None:
    """The value of ``e`` given each base symbol's value (None: one is unknown)."""
    total = 0
    for m, c in e:
        v = c
        for k in m:
            x = values.get(k) if type(k) is str else _eval_compound(k, values)
            if x is None:
                return None
            v *= x
        total += v
    return total


_COMPOUND = {"//": operator.floordiv, "%": operator.mod, "max": max, "min": min}
_COMPOUND_BUILD = {"//": lambda a, b: floordiv(a, b), "%": lambda a, b: mod(a, b),
                   "max": lambda a, b: atom(("max", a, b)), "min": lambda a, b: atom(("min", a, b))}


def _eval_compound(k: tuple, values: dict) -> int | None:
    args = [evaluate(sub, values) for sub in k[1:]]
    if any(a is None for a in args):
        return None
    return _COMPOUND[k[0]](*args)


def to_python(e: Expr, name: Callable[[str], str] = str) -> str:
    """``e`` as Python source; ``name`` spells each base symbol."""
    if not e:
        return "0"
    parts = []
    for m, c in e:
        factors = [_atom_python(k, name) for k in m]
        if not factors:
            parts.append((str(abs(c)), c < 0))
            continue
        text = "*".join(factors)
        if abs(c) != 1:
            text = f"{abs(c)}*{text}"
        parts.append((text, c < 0))
    out = ("-" if parts[0][1] else "") + parts[0][0]
    for text, neg in parts[1:]:
        out += (" - " if neg else " + ") + text
    return out


def _atom_python(k, name) -> str:
    if type(k) is str:
        return name(k)
    op, *subs = k
    if op in ("max", "min"):
        return f"{op}({', '.join(to_python(s, name) for s in subs)})"
    return f"({_wrap(to_python(subs[0], name))} {op} {_wrap(to_python(subs[1], name))})"


def _wrap(text: str) -> str:
    return text if text.isidentifier() or text.lstrip("-").isdigit() else f"({text})"
