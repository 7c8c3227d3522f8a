"""Symbolic integers: tensor sizes (and int arguments) a trace keeps as variables.

A ``SymInt`` is an integer expression over *atoms*: size symbols bound from the
inputs (``s0 = x.shape[1]``, trace inputs), symbolic int arguments, and
*unbacked* symbols that an op produces at run time (the length of
``x[x > 0]``). Expressions are kept in a normal form (core/symexpr.py), so
``view(B, -1, H)`` of a ``[B, s0 * H]`` tensor infers ``s0``, not
``(B * s0 * H) // (B * H)``.

Python code that *decides* something about a SymInt (``if n == 1``,
``max(a, b)``, ``range(n)``) gets the answer for the value seen while tracing
(its *hint*), and the decision is recorded as a guard in the active
``ShapeEnv``; the prologue re-checks every guard on each call and a failed one
recompiles. What the facts known about every atom decide (a dynamic size is at
least 2: sizes 0 and 1 are specialized by the cache key) needs no guard. A
decision about an unbacked symbol has no hint: it raises
``DataDependentError``. Nothing concretizes silently: ``int(n)`` and
``operator.index(n)`` (what C code calls) specialize with an equality guard.

Example::

    env = ShapeEnv()
    with env:
        s0 = env.size_symbol(proxy_s0, hint=128)     # proxy_s0: the trace input
        n = s0 * 4 // 2                              # SymInt 2*s0
        n == 1                                       # False, no guard (s0 >= 2)
        n == 256                                     # True, guard "2*s0 == 256"
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from thunderlite.core.proxies import DataDependentError, NumberProxy, number_ops
from thunderlite.core.symexpr import (
    Expr,
    add,
    atom,
    atom_order,
    const,
    constant,
    divide_exactly,
    evaluate,
    floordiv,
    free_atoms,
    mod,
    mul,
    substitute,
    to_python,
)
from thunderlite.core.tracectx import ThreadStack

# --- the environment: atoms, guards, replacements -----------------------------------------

class Atom:
    """What is known about one base symbol: its proxy (the trace value that holds
    it), its hint (None: unbacked), bounds, and where it came from."""
    __slots__ = ("proxy", "hint", "lower", "upper", "origin")

    def __init__(self, proxy: NumberProxy, hint: int | None, lower: int | None, origin: str):
        self.proxy = proxy
        self.hint = hint
        self.lower = lower
        self.upper: int | None = None
        self.origin = origin


class SymGuard:
    """``lhs op rhs``, true for the traced values, re-checked on every call."""
    __slots__ = ("lhs", "op", "rhs", "why")

    def __init__(self, lhs: Expr, op: str, rhs: Expr, why: str = ""):
        self.lhs = lhs
        self.op = op
        self.rhs = rhs
        self.why = why

    def python(self, name: Callable[[str], str] = str) -> str:
        return f"{to_python(self.lhs, name)} {self.op} {to_python(self.rhs, name)}"

    def holds(self, values: dict[str, int]) -> bool:
        return _OPS[self.op](evaluate(self.lhs, values), evaluate(self.rhs, values))

    def atoms(self) -> set[str]:
        return free_atoms(self.lhs) | free_atoms(self.rhs)

    def __repr__(self):
        return f"<SymGuard {self.python()}>"


_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
        ">": operator.gt, ">=": operator.ge}
_NEGATE = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_SIGNS = {"==": {0}, "!=": {-1, 1}, "<": {-1}, "<=": {-1, 0}, ">": {1}, ">=": {0, 1}}   # of diff, op true

_active = ThreadStack()     # the ShapeEnv of the compile this thread runs, innermost last


def active_env() -> ShapeEnv | None:
    stack = _active.items
    return stack[-1] if stack else None


class ShapeEnv:
    """The symbols and guards of one compilation (active inside ``with env:``)."""

    def __init__(self):
        self.atoms: dict[str, Atom] = {}
        self.guards: list[SymGuard] = []
        self._guard_keys: set = set()
        self.specialized: list[str] = []      # why a symbol was made a constant
        self.replacements: dict[str, Expr] = {}   # a symbol guarded equal to an expression of older ones
        # facts the program checks when it runs (``assume``): normal-form difference -> ops known true of it
        self.facts: dict[Expr, set[str]] = {}
        # called as hook(proxy, origin) when ``n >= 0`` is assumed of an unbacked int of unknown
        # sign (an ``item()`` used as a size): records the check the program makes when it runs
        self.assume_hook: Callable[[NumberProxy, str], None] | None = None

    def __enter__(self):
        _active.items.append(self)
        return self

    def __exit__(self, *exc):
        _active.items.remove(self)

    def size_symbol(self, proxy: NumberProxy, hint: int, origin: str, lower: int | None = 2) -> SymInt:
        """A backed symbol (its value is known while tracing) held by ``proxy``."""
        self.atoms[proxy.name] = Atom(proxy, hint, lower, origin)
        return SymInt(atom(proxy.name), self)

    def unbacked_symbol(self, proxy: NumberProxy, origin: str, lower: int | None = 0) -> SymInt:
        """A symbol an op produces at run time: a data-dependent size (``lower``
        0), or an int read from a tensor (``.item()``: ``lower`` None)."""
        self.atoms[proxy.name] = Atom(proxy, None, lower, origin)
        return SymInt(atom(proxy.name), self)

    def canon(self, e: Expr) -> Expr:
        """``e`` in terms of the symbols left after the guarded equalities."""
        if not self.replacements or not (free_atoms(e) & self.replacements.keys()):
            return e
        return substitute(e, self.replacements)

    def _learn(self, diff: Expr) -> None:
        """``diff == 0`` was guarded: a symbol appearing alone (coefficient 1 or
        -1, not elsewhere) in it is replaced by the rest, the newest such first."""
        order = {n: i for i, n in enumerate(self.atoms)}
        for (m, c) in sorted(diff, key=lambda mc: -order.get(mc[0][0], -1) if len(mc[0]) == 1 and
                             type(mc[0][0]) is str else 1):
            if len(m) != 1 or type(m[0]) is not str or c not in (1, -1) or m[0] not in self.atoms:
                continue
            rest = add(diff, ((m, c),), -1)
            if m[0] in free_atoms(rest):
                continue
            value = rest if c == -1 else add((), rest, -1)
            self.replacements = {k: substitute(v, {m[0]: value}) for k, v in self.replacements.items()}
            self.replacements[m[0]] = value
            return

    def _learn_bound(self, diff: Expr, op: str) -> None:
        """``symbol + c >= 0`` (``>``, ``<=``, ``<``) was guarded: a bound of the symbol."""
        terms = [(m, c) for m, c in diff if m]
        if op not in (">=", ">", "<=", "<") or len(terms) != 1 or terms[0][1] != 1 or len(terms[0][0]) != 1:
            return
        name = terms[0][0][0]
        atom = self.atoms.get(name) if type(name) is str else None
        if atom is None:
            return
        c = constant(add(diff, (terms[0],), -1)) or 0
        if op in (">=", ">"):
            lb = -c + (op == ">")
            atom.lower = lb if atom.lower is None else max(atom.lower, lb)
        else:
            ub = -c - (op == "<")
            atom.upper = ub if atom.upper is None else min(atom.upper, ub)

    def assume(self, lhs: Expr, op: str, rhs: Expr) -> None:
        """``lhs op rhs`` holds from now on: the program checks it when it runs
        (a run-time size the facts cannot decide, e.g. ``start + length <= size``
        of ``narrow`` with an ``item()`` length)."""
        diff, op = self._normal_diff(lhs, op, rhs)
        self.facts.setdefault(diff, set()).add(op)
        self._learn_bound(diff, op)

    def hints(self) -> dict[str, int]:
        return {n: a.hint for n, a in self.atoms.items() if a.hint is not None}

    def add_guard(self, lhs: Expr, op: str, rhs: Expr, why: str = "") -> None:
        key = (lhs, op, rhs)
        if key not in self._guard_keys:
            self._guard_keys.add(key)
            self.guards.append(SymGuard(lhs, op, rhs, why))

    def _content_free(self, diff: Expr) -> Expr:
        """``diff`` divided by the positive factor common to its terms (the gcd of
        the coefficients, symbols known to be positive): ``diff op 0`` is the same
        fact, and ``s0*s1*(a - b)`` becomes ``a - b``, which can be learned."""
        if not diff or constant(diff) is not None:
            return diff
        g = 0
        for _, c in diff:
            g = math.gcd(g, c)
        common = None
        for m, _ in diff:
            mc = list(m)
            common = mc if common is None else [k for k in common if k in mc and (mc.remove(k) or True)]
        common = [k for k in (common or ()) if (self._atom_lower(k) or 0) > 0]
        if g <= 1 and not common:
            return diff
        divisor = mul(const(max(g, 1)), tuple([(tuple(sorted(common, key=atom_order)), 1)]))
        q = divide_exactly(diff, divisor)
        return q if q is not None else diff

    def lower_bound(self, e: Expr) -> int | None:
        """A lower bound of ``e`` from the atoms' bounds (None: unknown). A
        ``max`` atom added (or a ``min`` subtracted) is at least (at most) each
        of its arguments: ``max(a, b) - a >= 0``."""
        best = self._termwise_lower(e)
        for m, c in e:
            if len(m) == 1 and type(m[0]) is tuple and m[0][0] == ("max" if c > 0 else "min"):
                rest = add(e, ((m, c),), -1)
                for arg in m[0][1:]:
                    lb = self.lower_bound(add(rest, mul(const(c), arg)))
                    best = lb if best is None or (lb is not None and lb > best) else best
        return best

    def upper_bound(self, e: Expr) -> int | None:
        lb = self.lower_bound(add((), e, -1))
        return None if lb is None else -lb

    def _termwise_lower(self, e: Expr) -> int | None:
        total = 0
        for m, c in e:
            if not m:
                total += c
                continue
            if c < 0:
                ub = self._atom_upper(m[0]) if len(m) == 1 else None
                if ub is None:
                    return None
                total += c * ub
                continue
            prod = c
            for k in m:
                lb = self._atom_lower(k)
                if lb is None or lb < 0:
                    return None
                prod *= lb
            total += prod
        return total

    def _atom_lower(self, k) -> int | None:
        if type(k) is str:
            a = self.atoms.get(k)
            return a.lower if a is not None else None
        if k[0] == "%":                   # Python's modulo takes the divisor's sign
            return 0 if (self.lower_bound(k[2]) or 0) > 0 else None
        if k[0] == "//":
            return 0 if self.lower_bound(k[1]) is not None and (self.lower_bound(k[2]) or 0) > 0 else None
        lbs = [self.lower_bound(s) for s in k[1:]]
        if k[0] == "max":
            known = [lb for lb in lbs if lb is not None]
            return max(known) if known else None
        return None if None in lbs else min(lbs)

    def _atom_upper(self, k) -> int | None:
        if type(k) is str:
            a = self.atoms.get(k)
            return a.upper if a is not None else None
        if k[0] == "%":
            d = constant(k[2])
            return d - 1 if d is not None and d > 0 else None
        if k[0] == "//":
            return None
        ubs = [self.upper_bound(s) for s in k[1:]]
        if k[0] == "min":
            known = [ub for ub in ubs if ub is not None]
            return min(known) if known else None
        return None if None in ubs else max(ubs)

    def _normal_diff(self, lhs: Expr, op: str, rhs: Expr) -> tuple[Expr, str]:
        """``lhs op rhs`` as ``diff op 0``, one spelling per fact (the first coefficient positive)."""
        diff = self._content_free(self.canon(add(lhs, rhs, -1)))
        if diff and diff[0][1] < 0:
            diff, op = add((), diff, -1), _FLIP[op]
        return diff, op

    def known(self, diff: Expr, op: str) -> bool | None:
        """``diff op 0`` (normal form) when the facts decide it, else None."""
        c = constant(diff)
        if c is not None:
            return _OPS[op](c, 0)
        known = _decide_by_bounds(op, self.lower_bound(diff), self.upper_bound(diff))
        if known is not None:
            return known
        for fact in self.facts.get(diff, ()):
            if _SIGNS[fact] <= _SIGNS[op]:
                return True
            if not _SIGNS[fact] & _SIGNS[op]:
                return False
        return None

    def decide(self, lhs: Expr, op: str, rhs: Expr) -> bool:
        """``lhs op rhs``, from the facts if they decide it, else from the hints
        (recording a guard)."""
        diff, op = self._normal_diff(lhs, op, rhs)
        lhs = tuple((m, c) for m, c in diff if c > 0 and m)
        rhs = add((), tuple((m, c) for m, c in diff if c < 0 or not m), -1)
        known = self.known(diff, op)
        if known is not None:
            return known
        hints = self.hints()
        a, b = evaluate(lhs, hints), evaluate(rhs, hints)
        if a is None or b is None:
            assumed = self._assume_size(diff, op)
            if assumed is not None:
                return assumed
            unknown = sorted(n for n in free_atoms(diff) if self.atoms.get(n) and self.atoms[n].hint is None)
            origins = "; ".join(f"{n}: {self.atoms[n].origin}" for n in unknown)
            raise DataDependentError(
                f"deciding {to_python(lhs)} {op} {to_python(rhs)} needs a size known only when the program "
                f"runs ({origins}); thunderlite cannot branch on it while tracing")
        result = _OPS[op](a, b)
        self.add_guard(lhs, op if result else _NEGATE[op], rhs)
        if (op == "==" and result) or (op == "!=" and not result):
            self._learn(diff)
        else:
            self._learn_bound(diff, op if result else _NEGATE[op])
        return result

    def _assume_size(self, diff: Expr, op: str) -> bool | None:
        """``n + c >= 0`` (or ``n + c < 0``; ``c >= 0`` a constant, ``n`` an
        unbacked int of unknown sign, ``torch.zeros(n + 1)``): true, ``n`` being
        assumed non-negative (the int is used as a size, as torch's size-oblivious
        reasoning assumes) when ``assume_hook`` records a run-time check of it;
        None: not such a question."""
        c0 = constant(diff[-1:]) if diff and not diff[-1][0] else 0
        terms = diff[:-1] if c0 else diff
        if self.assume_hook is None or len(terms) != 1 or c0 < 0 or op not in (">=", "<"):
            return None
        (m, c), = terms
        atom = self.atoms.get(m[0]) if len(m) == 1 and type(m[0]) is str and c > 0 else None
        if atom is None or atom.hint is not None or atom.lower is not None:
            return None
        atom.lower = 0
        self.assume_hook(atom.proxy, atom.origin)
        return op == ">="


def _decide_by_bounds(op: str, lo: int | None, hi: int | None) -> bool | None:
    """``diff op 0`` when ``lo <= diff <= hi`` decides it."""
    if lo is not None and lo > 0:
        return {"==": False, "!=": True, "<": False, "<=": False, ">": True, ">=": True}[op]
    if hi is not None and hi < 0:
        return {"==": False, "!=": True, "<": True, "<=": True, ">": False, ">=": False}[op]
    if lo == 0 and op in (">=", "<"):
        return op == ">="
    if hi == 0 and op in ("<=", ">"):
        return op == "<="
    return None


# --- the value programs see ---------------------------------------------------------------

class SymInt:
    """An integer expression over trace symbols (module docstring). Behaves
    like an int in arithmetic; comparisons and conversions are guarded."""
    __slots__ = ("expr", "env")

    def __init__(self, expr: Expr, env: ShapeEnv):
        self.expr = expr
        self.env = env

    # -- what it reads, how it prints
    def atoms(self) -> set[str]:
        return free_atoms(self.expr)

    def proxies(self) -> list[NumberProxy]:
        """The trace values (base symbols) this expression reads."""
        return [self.env.atoms[n].proxy for n in sorted(self.atoms())]

    @property
    def hint(self) -> int | None:
        return evaluate(self.expr, self.env.hints())

    def python(self, name: Callable[[str], str] = str) -> str:
        """Source reading the very symbols ``proxies`` names (printed code)."""
        return to_python(self.expr, name)

    def __repr__(self):
        """The canonical form (metadata comments: equal sizes print alike)."""
        return to_python(self.env.canon(self.expr))

    __str__ = __repr__

    def __format__(self, spec):
        return format(str(self), spec)

    def __hash__(self):
        return hash(self.env.canon(self.expr))

    # -- arithmetic (never guards)
    def _bin(self, other, fn, name: str, swap=False):
        o = _expr_of(other)
        if o is None:
            return self._leave_ints(name, other, swap)
        a, b = (o, self.expr) if swap else (self.expr, o)
        return wrap(fn(a, b), self.env)

    def _leave_ints(self, name: str, other, swap: bool = False):
        """``self <name> other`` where the result is no integer expression (a
        float operand, ``/``, ``**`` of a symbolic exponent): on the traced
        values (guarded) when every symbol has one, as before; else recorded as
        a number operation that runs with the program (core/proxies.py:
        ``number_ops``, filled by the torch language)."""
        if not isinstance(other, (int, float, complex, SymInt, NumberProxy)):
            return NotImplemented
        if type(other) is not NumberProxy and self.hint is not None and \
                (type(other) is not SymInt or other.hint is not None):
            a, b = int(self), (int(other) if type(other) is SymInt else other)
            return _PY_OPS[name](b, a) if swap else _PY_OPS[name](a, b)
        op = number_ops[name]
        return op(other, self) if swap else op(self, other)

    def __add__(self, o):
        return self._bin(o, add, "add")

    def __radd__(self, o):
        return self._bin(o, add, "add", True)

    def __sub__(self, o):
        return self._bin(o, _sub, "sub")

    def __rsub__(self, o):
        return self._bin(o, _sub, "sub", True)

    def __mul__(self, o):
        return self._bin(o, mul, "mul")

    def __rmul__(self, o):
        return self._bin(o, mul, "mul", True)

    def __floordiv__(self, o):
        return self._bin(o, floordiv, "floordiv")

    def __rfloordiv__(self, o):
        return self._bin(o, floordiv, "floordiv", True)

    def __mod__(self, o):
        return self._bin(o, mod, "mod")

    def __rmod__(self, o):
        return self._bin(o, mod, "mod", True)

    def __divmod__(self, o):
        return self // o, self % o

    def __rdivmod__(self, o):
        return o // self, o % self

    def __neg__(self):
        return wrap(add((), self.expr, -1), self.env)

    def __pos__(self):
        return self

    def __invert__(self):
        return -self - 1

    def __abs__(self):
        return sym_max(self, -self)

    def __trunc__(self):
        return self

    __floor__ = __ceil__ = __trunc__

    def __round__(self, ndigits=None):
        if ndigits is None or (type(ndigits) is int and ndigits >= 0):
            return self
        return self._leave_ints("round", ndigits)

    def __pow__(self, p, modulo=None):
        if modulo is None and type(p) is int and p >= 0:
            out: Expr = const(1)
            for _ in range(p):
                out = mul(out, self.expr)
            return wrap(out, self.env)
        if modulo is not None:
            if self.hint is not None and not any(type(x) is NumberProxy or (type(x) is SymInt and x.hint is None)
                                                 for x in (p, modulo)):
                return pow(int(self), int(p), int(modulo))
            return number_ops["pow"](self, p, modulo)
        return self._leave_ints("pow", p)

    def __rpow__(self, o):
        return self._leave_ints("pow", o, True)

    def __truediv__(self, o):
        return self._leave_ints("truediv", o)

    def __rtruediv__(self, o):
        return self._leave_ints("truediv", o, True)

    # -- decisions (guarded)
    def _cmp(self, other, op):
        o = _expr_of(other)
        if o is None:
            if isinstance(other, float):
                return _OPS[op](int(self), other)
            return NotImplemented
        return self.env.decide(self.expr, op, o)

    def __bool__(self):
        return self._cmp(0, "!=")

    def __int__(self):
        return self.specialize("int()")

    def __index__(self):
        return self.specialize("using it as a Python int")

    def __float__(self):
        return float(self.specialize("float()"))

    def specialize(self, why: str) -> int:
        """The traced value, guarded to stay the same (the trace no longer
        varies with it)."""
        env = self.env
        v = evaluate(self.expr, env.hints())
        if v is None:
            origins = "; ".join(env.atoms[n].origin for n in sorted(self.atoms()) if n in env.atoms)
            raise DataDependentError(f"{why} needs the value of {self}, known only when the program runs ({origins})")
        env.add_guard(self.expr, "==", const(v), why)
        env.specialized.append(f"{self} = {v}: {why}")
        return v


for _name, _op in (("__eq__", "=="), ("__ne__", "!="), ("__lt__", "<"), ("__le__", "<="), ("__gt__", ">"),
                   ("__ge__", ">=")):
    setattr(SymInt, _name, lambda self, o, _op=_op: self._cmp(o, _op))
# bitwise operators have no integer-expression form: traced values (guarded), else recorded
for _name in ("and", "or", "xor", "lshift", "rshift"):
    setattr(SymInt, f"__{_name}__", lambda self, o, _n=_name: self._leave_ints(_n, o))
    setattr(SymInt, f"__r{_name}__", lambda self, o, _n=_name: self._leave_ints(_n, o, True))

_PY_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
           "mod": operator.mod, "truediv": operator.truediv, "pow": operator.pow, "and": operator.and_,
           "or": operator.or_, "xor": operator.xor, "lshift": operator.lshift, "rshift": operator.rshift,
           "round": round}


def _sub(a: Expr, b: Expr) -> Expr:
    return add(a, b, -1)


def _expr_of(x) -> Expr | None:
    if type(x) is SymInt:
        return x.expr
    if type(x) is int or type(x) is bool:
        return const(int(x))
    if isinstance(x, int) and not isinstance(x, float):
        return const(operator.index(x))
    return None


def wrap(e: Expr, env: ShapeEnv) -> SymInt | int:
    """A plain int when ``e`` is a constant, else a SymInt."""
    e = env.canon(e)
    c = constant(e)
    return c if c is not None else SymInt(e, env)


def _env_of(*xs) -> ShapeEnv | None:
    return next((x.env for x in xs if type(x) is SymInt), None)


def _ordered(env: ShapeEnv, ea: Expr, eb: Expr) -> int:
    """1 when ``a >= b``, -1 when ``b >= a`` (the facts say so, or the traced
    values with a guard), 0 when only the run-time values can tell."""
    if env.known(*env._normal_diff(ea, ">=", eb)):
        return 1
    if env.known(*env._normal_diff(eb, ">=", ea)):
        return -1
    if evaluate(add(ea, eb, -1), env.hints()) is not None:
        return 1 if env.decide(ea, ">=", eb) else -1
    return 0


def sym_max(a, b):
    """``max`` of sizes: decided as Python's ``max`` would when the facts or
    the traced values can (the latter guarded), else a ``max`` atom (a run-time
    size: ``x[:n]`` of an ``item()`` n is ``min(n, size)`` long)."""
    return _extreme(a, b, "max")


def sym_min(a, b):
    """``min`` of sizes, as ``sym_max``."""
    return _extreme(a, b, "min")


def _extreme(a, b, which: str):
    """``sym_max`` (``which`` "max") or ``sym_min`` ("min"): ``a`` or ``b``
    when their order is known, else a ``which`` atom; plain ``max``/``min``
    when either is not a size expression."""
    ea, eb = _expr_of(a), _expr_of(b)
    env = _env_of(a, b)
    if env is not None and ea is not None and eb is not None:
        order = _ordered(env, ea, eb)
        if order:
            return a if (order > 0) == (which == "max") else b
        return SymInt(atom((which, ea, eb)), env)
    return max(a, b) if which == "max" else min(a, b)


def assume(a, op: str, b) -> None:
    """``a op b`` (ints or SymInts) holds from now on (``ShapeEnv.assume``)."""
    env = _env_of(a, b)
    if env is not None:
        env.assume(_expr_of(a), op, _expr_of(b))


def statically_known(a, op: str, b) -> bool | None:
    """``a op b`` when the facts alone decide it (no guard, no assumption), else None."""
    ea, eb, env = _expr_of(a), _expr_of(b), _env_of(a, b)
    if env is None:
        return _OPS[op](a, b)
    return env.known(*env._normal_diff(ea, op, eb))


def known_or(decision: Callable[[], bool], default: bool) -> bool:
    """``decision()`` (a question about sizes) when tracing can answer it,
    ``default`` when it needs a size known only at run time: for questions
    whose answer only picks a shortcut (``is this slice the whole dim?``), the
    general path being right for every size."""
    try:
        return bool(decision())
    except DataDependentError:
        return default


def is_symbolic(x: Any) -> bool:
    return type(x) is SymInt


def has_symbolic(shape) -> bool:
    return any(type(s) is SymInt for s in shape)


def hint_of(x) -> int | None:
    """The traced value of an int or SymInt (None: unbacked)."""
    return x.hint if type(x) is SymInt else x


def is_int(x: Any) -> bool:
    """An int (not a bool) or a symbolic int: what a size argument may be."""
    return (isinstance(x, int) and not isinstance(x, bool)) or type(x) is SymInt


def mentions_symbolic(bsym) -> bool:
    """Whether a bound symbol reads or makes a value of symbolic size, or takes a
    symbolic int (what an executor compiling for static shapes must refuse)."""
    for p in bsym.flat_args() + bsym.flat_outs():
        if type(p) is SymInt or (hasattr(p, "shape") and type(p).__name__ == "TensorProxy" and has_symbolic(p.shape)):
            return True
    return False
