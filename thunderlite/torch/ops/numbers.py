"""Python numbers the trace keeps symbolic: the number protocol on them,
recorded as operations that run with the program.

A *traced number* is a ``NumberProxy`` (``item()`` of a float or bool tensor,
``torch.equal``, a float argument under ``cache="symbolic values"``) or a
``SymInt`` that reads a symbol known only at run time (``item()`` of an int
tensor, core/symint.py). Its value does not exist while tracing, so Python's
operations on it cannot be evaluated then: each is recorded as a leaf symbol
``ltorch.number_<op>`` whose torch-executor implementation is the Python
operation itself (``n1 = torchex.number_add(n0, 1)``), run on the real
numbers when the program runs. The symbols are tagged ``Tag.UNBACKED`` (their
outputs exist only at run time): a composite calling one is recorded as its
decomposition (core/trace.py), so nothing hides where a number is made.

- Result types are Python's (int + float is float, int / int is float, ``//``
  of ints is int, ``abs`` of a complex is a float, ``round(x)`` is an int):
  ``_result_type`` runs the operation on sample values of the operand types,
  so the rules (and the TypeErrors, e.g. ``complex // int``) are Python's own.
  Every operation here has a result type fixed by its operand types except
  ``**``: an int to an int power is traced as an int when the exponent is not
  negative (``number_ipow``; checked when the program runs if tracing cannot
  tell), a float otherwise; a real power whose Python result would be complex
  (``(-8) ** (1/3)``) raises when the program runs.
- An int result is an unbacked ``SymInt`` of unknown sign, as ``item()`` of an
  int tensor: it takes part in size arithmetic and can be a size. Integer
  arithmetic that stays an integer expression (``n + 1``, ``n // 2``) is
  SymInt arithmetic, printed where it is used, not a symbol.
- Comparisons are symbolic bools (as ``torch.equal``): values a program can
  compute with (``x * (n > 0)``); branching on one (``bool``, ``if``) raises
  ``DataDependentError`` naming the comparison and where its numbers came
  from (``describe``).
- ``python_functions``: the builtins and ``math`` functions a program calls on
  numbers (``int``, ``float``, ``round``, ``max``, ``math.floor``,
  ``math.sqrt``...) -> their traced versions, which the jit calls in their place
  when an argument is a traced number (frontend/lookasides.py).

Example (``x.sum().item()`` is ``n0``)::

    n = x.sum().item() + 1     # n1 = ltorch.number_add(n0, 1)
    k = int(n)                 # n2 = ltorch.number_int(n1): an unbacked SymInt
    y = x * math.sqrt(n)       # n3 = ltorch.number_math_sqrt(n1); t2 = ltorch.mul(x, n3)
"""
from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Callable
from typing import Any

from thunderlite.core import prims, proxies
from thunderlite.core.proxies import DataDependentError, NumberProxy
from thunderlite.core.symbol import BoundSymbol, Symbol
from thunderlite.core.symint import SymInt, statically_known, sym_max, sym_min
from thunderlite.core.tags import Tag
from thunderlite.core.tracectx import current_trace
from thunderlite.torch.registry import register_leaf
from thunderlite.torch.sizes import as_unbacked, expect_size

_INTS = (bool, int)


def python_type(x: Any) -> type | None:
    """The Python number type ``x`` is or stands for (None: not a number)."""
    t = type(x)
    if t is NumberProxy:
        return x.python_type
    if t is SymInt:
        return int
    for pt in (bool, int, float, complex):
        if isinstance(x, pt):
            return pt
    return None


def is_traced(x: Any) -> bool:
    """Whether ``x`` is a number whose value tracing does not have (a SymInt
    of sizes known while tracing is not: Python decides on it with a guard)."""
    t = type(x)
    return t is NumberProxy or (t is SymInt and x.hint is None)


# --- the operations ----------------------------------------------------------------------------

def _real_pow(a, b):
    """``a ** b`` traced with a real result: a negative base to a fractional
    power is complex in Python, a value the trace cannot return in its place."""
    r = a ** b
    if type(r) is complex and not isinstance(a, complex) and not isinstance(b, complex):
        raise ValueError(f"({a!r}) ** {b!r} is the complex number {r!r} in Python, but the program was traced "
                         "with a real result; write complex(base) ** exponent to compute it in complex numbers")
    return r


# op -> (the Python operation run when the program runs, how it reads in messages)
_OPERATORS: dict[str, tuple[Callable, str]] = {
    "add": (operator.add, "{} + {}"), "sub": (operator.sub, "{} - {}"), "mul": (operator.mul, "{} * {}"),
    "truediv": (operator.truediv, "{} / {}"), "floordiv": (operator.floordiv, "{} // {}"),
    "mod": (operator.mod, "{} % {}"), "pow": (_real_pow, "{} ** {}"), "ipow": (operator.pow, "{} ** {}"),
    "and": (operator.and_, "{} & {}"), "or": (operator.or_, "{} | {}"), "xor": (operator.xor, "{} ^ {}"),
    "lshift": (operator.lshift, "{} << {}"), "rshift": (operator.rshift, "{} >> {}"),
    "lt": (operator.lt, "{} < {}"), "le": (operator.le, "{} <= {}"), "gt": (operator.gt, "{} > {}"),
    "ge": (operator.ge, "{} >= {}"), "eq": (operator.eq, "{} == {}"), "ne": (operator.ne, "{} != {}"),
    "neg": (operator.neg, "-{}"), "pos": (operator.pos, "+{}"), "invert": (operator.invert, "~{}"),
}
_BUILTINS: dict[str, Callable] = {"abs": builtins.abs, "int": builtins.int, "float": builtins.float,
                                  "complex": builtins.complex, "round": builtins.round, "powmod": builtins.pow,
                                  "max": builtins.max, "min": builtins.min}
_MATH = ("floor", "ceil", "trunc", "sqrt", "cbrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
         "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
         "erf", "erfc", "gamma", "lgamma", "fabs", "hypot", "copysign", "fmod", "remainder", "pow", "degrees",
         "radians", "isnan", "isinf", "isfinite")

_FUNCTIONS: dict[str, Callable] = {op: fn for op, (fn, _) in _OPERATORS.items()}
_FUNCTIONS.update(_BUILTINS)
_FUNCTIONS.update({f"math.{n}": getattr(math, n) for n in _MATH if hasattr(math, n)})   # cbrt, exp2: 3.11+

# sample values of each type: ``_result_type`` runs the operation on them
_SAMPLES = {bool: (True, False), int: (3, -2), float: (0.75, 2.5), complex: (0.5 + 1j, -2j)}


def _result_type(op: str, types: list[type]) -> type:
    """The Python type of ``op`` on operands of ``types``, by Python's own rules:
    the operation run on sample values of those types (a TypeError is Python's
    for these types; a domain error of one sample tries the next)."""
    if None in types:
        names = ", ".join(t.__name__ if t else "non-number" for t in types)
        raise TypeError(f"{op}: unsupported operand types {names}")
    if op == "ipow":
        return int
    if op == "pow" and all(t in _INTS for t in types):
        return float                           # an int to a negative int power (see _power)
    fn = _FUNCTIONS[op]
    for k in range(2):
        try:
            return type(fn(*(_SAMPLES[t][k] for t in types)))
        except (ArithmeticError, ValueError):
            continue
    return float


def _meta(op: str) -> Callable:
    def meta(*args):
        return NumberProxy(None, _result_type(op, [python_type(a) for a in args]))
    meta.__name__ = f"number_{op}_meta"
    return meta


_SYMBOLS: dict[str, Symbol] = {
    op: register_leaf(Symbol(f"number_{op.replace('.', '_')}", meta=_meta(op), module="ltorch",
                             tags={Tag.UNBACKED}, torch_fn=fn))
    for op, fn in _FUNCTIONS.items()}
_OP_OF = {sym: op for op, sym in _SYMBOLS.items()}


def apply(op: str, *args):
    """Record ``op`` (a key of ``_FUNCTIONS``) on ``args``; an int result is an
    unbacked SymInt (usable in size arithmetic and as a size)."""
    out = _SYMBOLS[op](*args)
    return as_unbacked(out, _text(op, args)) if out.python_type is int else out


def _binary(op: str) -> Callable:
    def run(a, b):
        if python_type(a) is None or python_type(b) is None:
            return NotImplemented          # a tensor operand: its reflected operator takes it
        return apply(op, a, b)
    run.__name__ = op
    return run


def _unary(op: str) -> Callable:
    def run(a, *rest):
        return apply(op, a, *rest)
    run.__name__ = op
    return run


def _power(a, b, mod=None):
    """``a ** b`` (``pow(a, b, mod)``), typed as Python types it (module docstring)."""
    if python_type(a) is None or python_type(b) is None:
        return NotImplemented
    if mod is not None:
        return apply("powmod", a, b, mod)
    if python_type(a) in _INTS and python_type(b) in _INTS and _exponent_not_negative(a, b):
        return apply("ipow", a, b)
    return apply("pow", a, b)


def _exponent_not_negative(a, b) -> bool:
    """Whether the int power ``a ** b`` is an int: known, guarded on a traced
    value, or assumed and checked when the program runs."""
    if type(b) is SymInt:
        known = statically_known(b, ">=", 0)
        if known is not None:
            return known
        if b.hint is not None:
            return bool(b >= 0)
        expect_size(b, ">=", 0, f"the int power {_text('pow', (a, b))} was traced as an int, for an exponent "
                                "that is not negative (a negative one gives a float in Python); write "
                                "float(base) ** exponent for a float", ValueError)
        return True
    if type(b) is NumberProxy:
        if b.python_type is bool:
            return True
        raise DataDependentError(f"whether {_text('pow', (a, b))} is an int or a float depends on the sign of the "
                                 f"traced number {b.name}; write float(base) ** exponent for a float")
    return b >= 0


def _divmod(a, b):
    if python_type(a) is None or python_type(b) is None:
        return NotImplemented
    return a // b, a % b


def _round(a, ndigits=None):
    return apply("round", a) if ndigits is None else apply("round", a, ndigits)


for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "and", "or", "xor", "lshift", "rshift",
            "lt", "le", "gt", "ge", "eq", "ne"):
    proxies.number_ops[_op] = _binary(_op)
for _op in ("neg", "pos", "abs", "invert"):
    proxies.number_ops[_op] = _unary(_op)
for _op in ("floor", "ceil", "trunc"):
    proxies.number_ops[_op] = _unary(f"math.{_op}")
proxies.number_ops.update(pow=_power, divmod=_divmod, round=_round)


# --- what a program calls on numbers: builtins and math ------------------------------------------

def to_int(x, *rest):
    """``int(x)``: a traced int is itself; anything else is converted when the program runs."""
    if rest or not is_traced(x):
        return int(x, *rest)
    if type(x) is SymInt:
        return x
    return apply("int", x)


def to_float(x=0.0):
    if type(x) is NumberProxy and x.python_type is float:
        return x
    return apply("float", x) if is_traced(x) else float(x)


def to_complex(*args, **kwargs):
    if kwargs or not any(is_traced(a) for a in args) or any(python_type(a) is None for a in args):
        return complex(*args, **kwargs)
    if len(args) == 1 and type(args[0]) is NumberProxy and args[0].python_type is complex:
        return args[0]
    return apply("complex", *args)


_COMPARISONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def compare(op: str, a, b):
    """``a <op> b`` in the user's program: a Python bool where tracing can tell
    (known facts; sizes with traced values decide with a guard, as before),
    else a symbolic bool. Library code's comparisons decide or raise instead
    (core/symint.py, core/proxies.py)."""
    if python_type(a) is None or python_type(b) is None:
        return NotImplemented
    if not (is_traced(a) or is_traced(b)):
        return _FUNCTIONS[op](a, b)
    if type(a) is not NumberProxy and type(b) is not NumberProxy and python_type(a) in _INTS \
            and python_type(b) in _INTS:
        known = statically_known(a, _COMPARISONS[op], b)
        if known is not None:
            return known
    return apply(op, a, b)


def as_text(x, spec: str = "") -> str:
    """``str``/``format`` of a number in the user's program: a size known while
    tracing specializes (guarded); a traced number's text needs its value."""
    if type(x) is SymInt and x.hint is not None:
        return format(x.specialize("formatting it as text"), spec)
    what = "formatting" if spec else "str()"
    if type(x) is SymInt:
        raise DataDependentError(f"{what} of the traced int {x} needs its value, known only when the program runs "
                                 f"({_origins_of(x)})")
    raise DataDependentError(f"{what} of the traced number {describe(x)} needs its value, which is not known "
                             "while tracing")


def _math(name: str) -> Callable:
    def run(*args):
        return apply(f"math.{name}", *args)
    run.__name__ = name
    return run


def _extremum(op: str) -> Callable:
    """``max``/``min`` of numbers: of ints, a ``max``/``min`` size expression
    (core/symint.py); of one other type, recorded. Of mixed types Python returns
    whichever argument wins, so the result's type would depend on the values."""
    native, fold = _BUILTINS[op], (sym_max if op == "max" else sym_min)

    def run(*args, **kwargs):
        if kwargs or len(args) < 2:
            return native(*args, **kwargs)
        types = {python_type(a) for a in args}
        if types <= {int}:
            out = args[0]
            for a in args[1:]:
                out = fold(out, a)
            return out
        if len(types) != 1 or None in types:
            names = ", ".join(sorted(t.__name__ if t else "non-number" for t in types))
            raise DataDependentError(f"{op}() of numbers of types {names} returns one of them as it is, so its "
                                     "type depends on values known only when the program runs; convert them to "
                                     "one type first (float(...))")
        out = args[0]
        for a in args[1:]:
            out = apply(op, out, a)
        return out
    run.__name__ = op
    return run


def python_functions() -> dict[Callable, Callable]:
    """Builtin or ``math`` function -> what the jit calls in its place when an
    argument is a traced number. ``abs``, ``round``, ``divmod``, ``pow`` and
    ``math.floor``/``ceil``/``trunc`` dispatch to the number's own methods."""
    table: dict[Callable, Callable] = {int: to_int, float: to_float, complex: to_complex,
                                       max: _extremum("max"), min: _extremum("min")}
    for fn in (abs, round, divmod, pow, math.floor, math.ceil, math.trunc):
        table[fn] = fn
    for name in _MATH:
        if name not in ("floor", "ceil", "trunc") and hasattr(math, name):
            table[getattr(math, name)] = _math(name)
    return table


# --- messages -----------------------------------------------------------------------------------

def _arg_text(x) -> str:
    text = x.name if isinstance(x, NumberProxy) else str(x) if type(x) is SymInt else repr(x)
    return text if text.isidentifier() or text.replace(".", "").isdigit() else f"({text})"


def _text(op: str, args) -> str:
    """How ``op`` on ``args`` reads in Python (``n0 > 3``, ``math.floor(n1)``)."""
    texts = [_arg_text(a) for a in args]
    template = _OPERATORS.get(op, (None, None))[1]
    if template is not None:
        return template.format(*texts)
    return f"{'pow' if op == 'powmod' else op}({', '.join(texts)})"


def _producer(n: NumberProxy) -> BoundSymbol | None:
    trc = current_trace()
    for scope in reversed(trc._scopes if trc is not None else ()):
        for b in reversed(scope):
            if any(o is n for o in b.flat_outs()):
                return b
    return None


def _made_by(bsym: BoundSymbol) -> str:
    op = _OP_OF.get(bsym.sym)
    if op is not None:
        return _text(op, bsym.args)
    if bsym.sym is prims.item:
        return f"{bsym.args[0].name}.item()"
    return f"{bsym.sym.id}({', '.join(_arg_text(a) for a in bsym.args)})"


def describe(n: NumberProxy) -> str:
    """How the trace made ``n``, for errors: ``b1 = n0 > 3`` and where the numbers
    it reads came from (``n0: t3.item() at prog.py:4``)."""
    bsym = _producer(n)
    if bsym is None:
        return n.name
    origins = []
    for a in bsym.args:
        if type(a) is SymInt:
            origins.append(_origins_of(a))
        elif type(a) is NumberProxy and (made := _producer(a)) is not None:
            origins.append(f"{a.name} = {_made_by(made)}")
    text = f"{n.name} = {_made_by(bsym)}"
    origins = [o for o in dict.fromkeys(origins) if o]
    return f"{text} ({'; '.join(origins)})" if origins else text


def _origins_of(x: SymInt) -> str:
    """Where the run-time symbols of ``x`` come from (``n0: t3.item() at prog.py:4``)."""
    atoms = x.env.atoms
    return "; ".join(f"{k}: {atoms[k].origin}" for k in sorted(x.atoms()) if k in atoms and atoms[k].hint is None)


proxies.number_ops["describe"] = describe
