"""What a bound symbol does to memory (docs/architecture.md §5): which of its outputs
may share storage with which of its inputs (``views``), which tensors it
writes (``writes``), and which proxies name them afterwards.

Facts come from their source of truth, never from a hand-kept list:

- a torch-language symbol (and an executor's symbol for it) mirrors a torch
  callable: its facts are the alias annotations of that op's ATen schemas
  (``torch.ops.aten.<name>``, every overload): a return annotated ``Tensor(a)``
  may alias the argument annotated ``Tensor(a)``, ``Tensor(*)`` any argument;
  an unannotated return is fresh memory;
- a prim names the ATen op whose contract its torch implementation has
  (``make_prim(..., aten="reshape")``, prims.py), and the same rule applies;
- opaque ops and custom ops register a rule built from their own call
  (torch/opaque.py: the meta run's storage sharing joined with the schema;
  torch/custom_ops.py: the op's schema);
- a leaf symbol nothing can decide (an executor's implementation of a symbol
  without a torch counterpart, a hand-built symbol) *may alias every tensor it
  reads*: never fresh memory by default. A composite without a torch
  counterpart is described by its decomposition, which callers walk
  (``core.symbol.walk``).

Writes: ``prims.copy_(src, dst)`` writes ``dst``, its output names ``dst``
afterwards; any other leaf tagged ``Tag.INPLACE`` writes its first tensor
argument and its first tensor output (if any) names it. A symbol whose writes
follow another pattern (several ``Tensor(a!)`` arguments, a collective)
registers a rule::

    register_write_rule(my_op, lambda bsym: [(bsym.args[0], bsym.output[0])])

Rules are keyed by symbol and by meta function, so an executor's symbol for a
prim (executors/base.py ``executor_symbol``, which shares the prim's meta)
shares the prim's rules. The barrier symbol ``update_aliases`` inserted by
``transforms/aliasing/update_aliases.py`` lives here because every layer that runs or
analyses traces must know it."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from thunderlite.core import prims
from thunderlite.core.proxies import TensorProxy
from thunderlite.core.symbol import BoundSymbol, Symbol, walk
from thunderlite.core.tags import Tag
from thunderlite.core.tracectx import made_once

WriteRule = Callable[[BoundSymbol], list]
ViewRule = Callable[[BoundSymbol], list]
_write_rules: dict[Any, WriteRule] = {}
_view_rules: dict[Any, ViewRule] = {}


def register_write_rule(sym: Symbol, rule: WriteRule) -> None:
    """``rule(bsym)`` lists ``(dst, new)`` pairs: the proxy written and the output
    proxy naming it after the write (or None)."""
    if sym in _write_rules:
        raise ValueError(f"a write rule for {sym.id} is already registered")
    if Tag.INPLACE not in sym.tags:
        raise ValueError(f"{sym.id} has a write rule but is not tagged Tag.INPLACE")
    _write_rules[sym] = rule
    if sym.meta is not None:
        _write_rules.setdefault(sym.meta, rule)


# symbols whose outputs may alias an input only through these keyword arguments
# (``out``), from their schema facts: ``views`` is asked of every symbol by
# several passes per compile, and most symbols alias nothing when not given ``out=``
_view_kwargs: dict[Symbol, frozenset] = {}


def register_view_rule(sym: Symbol, rule: ViewRule) -> None:
    """``rule(bsym)`` lists ``(out, base)`` pairs: an output proxy and an input
    proxy whose storage it may share. For symbols whose facts depend on the
    call (opaque ops) or come from a schema the symbol itself carries (custom ops)."""
    if sym in _view_rules:
        raise ValueError(f"a view rule for {sym.id} is already registered")
    _view_kwargs.clear()
    _view_rules[sym] = rule
    if sym.meta is not None:
        _view_rules.setdefault(sym.meta, rule)


def writes(bsym: BoundSymbol) -> list[tuple[TensorProxy, TensorProxy | None]]:
    """The ``(dst, new)`` pairs a leaf in-place bound symbol writes; [] otherwise."""
    sym = bsym.sym
    if Tag.INPLACE not in sym.tags or not sym.is_leaf:
        return []
    rule = _write_rules.get(sym) or _write_rules.get(sym.meta)
    if rule is not None:
        return rule(bsym)
    tensors = bsym.tensor_args()
    if not tensors:
        return []
    outs = bsym.tensor_outs()
    return [(tensors[0], outs[0] if outs else None)]


def _copy_writes(bsym: BoundSymbol) -> list:
    dst = bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs["dst"]
    return [(dst, bsym.output)]


register_write_rule(prims.copy_, _copy_writes)


# --- schemas --------------------------------------------------------------------------------

def _schema_facts(schema) -> tuple[frozenset[int], frozenset[str]]:
    """The positions and keyword names of ``schema``'s arguments some return may alias."""
    sets: set[str] = set()
    wildcard = listed = False
    for r in schema.returns:
        info = r.alias_info
        if info is not None:
            sets |= set(info.before_set)
            wildcard |= "*" in info.before_set
            # ``Tensor(a)[]``: the binding shows the list's annotation, not its elements'
            listed |= not info.before_set
    positions: set[int] = set()
    names: set[str] = set()
    if not sets and not listed:
        return frozenset(), frozenset()
    for i, a in enumerate(schema.arguments):
        info = a.alias_info
        if (wildcard and "Tensor" in str(a.type)) or (info is not None and (listed or sets & set(info.before_set))):
            names.add(a.name)
            if a.name == "self":
                names.add("input")       # torch's Python spelling of ``self``
            if not a.kwarg_only:
                positions.add(i)
    return frozenset(positions), frozenset(names)


_facts_by_signature: dict[str, tuple[frozenset[int], frozenset[str]]] = {}


class SchemaAliases:
    """The arguments some return of an op may alias, read off its schemas' alias
    annotations (the union over the given overloads). ``positions``: positional
    indices; ``names``: keyword names (``out`` of an ``.out`` overload is
    keyword-only, so it matches by name only). ``fresh`` is True when no return
    aliases anything.

    Example::

        facts = schema_aliases("narrow")   # narrow(Tensor(a) self, ...) -> Tensor(a)
        facts.positions                    # {0}: the output may alias argument 0
        schema_aliases("sin").positions    # set(): fresh (sin.out's ``out`` is in ``names``)

    ``texts``: the schemas printed; one whose returns carry no annotation
    (``returns_annotated``) is skipped without walking its objects, and the
    facts of the others are read once per signature (the text after the op's
    name, which holds every name, type and annotation they come from): the
    ``out=`` overloads of all unary ops share one.
    """
    __slots__ = ("positions", "names")

    def __init__(self, schemas=(), texts: tuple[str, ...] | None = None):
        self.positions: set[int] = set()
        self.names: set[str] = set()
        for i, schema in enumerate(schemas):
            if texts is None:
                positions, names = _schema_facts(schema)
            elif returns_annotated(texts[i]):
                positions, names = made_once(_facts_by_signature, texts[i].partition("(")[2],
                                             lambda s=schema: _schema_facts(s))
            else:
                continue
            self.positions |= positions
            self.names |= names

    @property
    def fresh(self) -> bool:
        return not self.positions and not self.names

    def bases_of(self, args: tuple, kwargs: dict) -> list[TensorProxy]:
        """The tensors among a call's arguments that its outputs may alias."""
        out = []
        for i, a in enumerate(args):
            if i in self.positions:
                out.extend(_tensor_leaves(a))
        for k, v in kwargs.items():
            if k in self.names:
                out.extend(_tensor_leaves(v))
        return out


def _tensor_leaves(x) -> list[TensorProxy]:
    if type(x) is TensorProxy:
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for e in x for t in _tensor_leaves(e)]
    return []


def torch_overloads(name: str) -> list | None:
    """The ATen overloads named ``name`` that take a tensor (TorchScript's list
    and string overloads share some names), or None when ATen has no such op."""
    packet = getattr(torch.ops.aten, name, None) if name.isidentifier() else None
    if packet is None or not hasattr(packet, "overloads"):
        return None
    found = [getattr(packet, o) for o in packet.overloads()]
    found = [o for o in found if any("Tensor" in str(a.type) for a in o._schema.arguments)]
    return found or None


def returns_annotated(text: str) -> bool:
    """Whether some return of the printed schema ``text`` has an alias
    annotation (``Tensor(a!)``, ``Tensor(a)[]``, ``t(*)``): one is printed in
    parentheses after its type, and a return without one has none but a
    tuple of returns' own. A schema without one adds no facts, and reading
    the printed text is much cheaper than walking its returns' objects (a
    new op's facts are read on the first call of every program using it)."""
    returns = text.rpartition(") -> ")[2]
    if returns.startswith("(") and returns.endswith(")"):
        returns = returns[1:-1]
    return "(" in returns


@functools.cache
def _aten_schemas(name: str) -> tuple[tuple, tuple[str, ...]] | None:
    """``aten_schemas(name)`` and their printed texts."""
    if not name.isidentifier():
        return None
    # takes a tensor: "Tensor" among its arguments, read off the printed schema (one
    # string, where asking each argument's type makes a Python object per argument)
    found = [(s, text) for s in torch._C._jit_get_schemas_for_operator(f"aten::{name}")
             if "Tensor" in (text := str(s)).partition("(")[2].rpartition(") -> ")[0]]
    return (tuple(s for s, _ in found), tuple(t for _, t in found)) if found else None


def aten_schemas(name: str) -> tuple | None:
    """The schemas of ``torch_overloads(name)``, read in one call without
    making their ``OpOverload`` objects (a new op's facts are read on the
    first call of every program using it), or None."""
    found = _aten_schemas(name)
    return None if found is None else found[0]


def aten_name(fn: Callable) -> str | None:
    """The ATen op a torch callable binds: its name, with Python's dunder
    spellings undone (``__iadd__`` is ``add_``, ``__radd__`` is ``add``)."""
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str):
        return None
    if name.startswith("__") and name.endswith("__") and len(name) > 4:
        core = name[2:-2]
        if aten_schemas(name) is None:
            if core.startswith("i") and aten_schemas(core[1:] + "_") is not None:
                return core[1:] + "_"
            if core.startswith("r") and aten_schemas(core[1:]) is not None:
                return core[1:]
            return core
    return name


@functools.cache
def schema_aliases(name: str) -> SchemaAliases | None:
    """``SchemaAliases`` of ``torch.ops.aten.<name>`` (all overloads), or None
    when ATen has no op of that name."""
    found = _aten_schemas(name)
    return None if found is None else SchemaAliases(*found)


def callable_aliases(fn: Callable) -> SchemaAliases | None:
    """The schema facts of the ATen op a torch callable binds, or None when it
    binds none that can be found (then nothing can be decided from schemas)."""
    try:
        return _callable_aliases(fn)
    except TypeError:              # unhashable callable
        name = aten_name(fn)
        return schema_aliases(name) if name else None


@functools.cache
def _callable_aliases(fn: Callable) -> SchemaAliases | None:
    name = aten_name(fn)
    return schema_aliases(name) if name else None


# --- views ----------------------------------------------------------------------------------

def _may_alias_all(bsym: BoundSymbol) -> list:
    ins = bsym.tensor_args()
    return [(o, i) for o in bsym.tensor_outs() for i in ins]


def _from_schema(bsym: BoundSymbol, facts: SchemaAliases) -> list:
    if facts.fresh:
        return []
    bases = facts.bases_of(bsym.args, bsym.kwargs)
    return [(o, b) for o in bsym.tensor_outs() for b in bases]


def views(bsym: BoundSymbol) -> list[tuple[TensorProxy, TensorProxy]]:
    """``(out, base)`` pairs: the outputs of ``bsym`` itself (not of its
    decomposition, which callers walk) that may share storage with an input.
    See the module docstring for where the facts come from."""
    sym = bsym.sym
    names = _view_kwargs.get(sym)
    if names is not None and (not names or not bsym.kwargs or names.isdisjoint(bsym.kwargs)):
        return []
    if Tag.ALIAS_BARRIER in sym.tags:
        return []                              # its members already share a group (AliasGroups)
    rule = _view_rules.get(sym)
    if rule is None and sym.meta is not None:
        rule = _view_rules.get(sym.meta)
    if rule is not None:
        pairs = rule(bsym)
    else:
        facts = prim_aliases(sym)
        if facts is None and sym.torch_fn is not None:
            facts = callable_aliases(sym.torch_fn)
        if facts is not None:
            if not facts.positions and Tag.VIEW not in sym.tags:
                # decided by the symbol and the keywords given: only ``out=`` may alias
                _view_kwargs[sym] = frozenset(facts.names)
            pairs = _from_schema(bsym, facts)
        elif not sym.is_leaf or bsym.subsymbols or Tag.PRIM in sym.tags:
            pairs = []                         # its decomposition (walked by callers) says it
        else:
            return _may_alias_all(bsym)        # nothing decides: may alias what it reads
    if Tag.VIEW in sym.tags:                   # declared by an executor for its implementation
        ins = bsym.tensor_args()
        if ins:
            pairs = pairs + [(o, ins[0]) for o in bsym.tensor_outs()]
    return pairs


def call_views(bsym: BoundSymbol) -> list[tuple[TensorProxy, TensorProxy]]:
    """The ``(out, base)`` pairs of this call as it ran: a symbol with a
    decomposition is described by its leaves, exact for these arguments (``to``
    with a new dtype is fresh although its schema says it may alias), a leaf by
    ``views``. For decisions a "may alias" must not make (eager's errors on
    writes into views of leaves, whether a fused kernel would return a view)."""
    return [pair for b in walk(bsym) if not b.subsymbols for pair in views(b)]


def output_aliases_input(bsym: BoundSymbol) -> bool:
    """Whether some output of this call may share storage with one of its inputs."""
    reach = {a.name for a in bsym.tensor_args()}
    for out, base in call_views(bsym):
        if base.name in reach:
            reach.add(out.name)
    return any(o.name in reach for o in bsym.tensor_outs())


def prim_aliases(sym: Symbol) -> SchemaAliases | None:
    """The schema facts of the ATen op a prim (or an executor's symbol for it)
    follows, or None when ``sym`` is not a prim."""
    name = prims.aten_op_of(sym)
    if name is None:
        return None
    facts = schema_aliases(name)
    prims.check(facts is not None, lambda: f"prim {sym.name} names the ATen op {name!r}, which does not exist")
    return facts


def may_view(bsym: BoundSymbol) -> bool:
    """Whether some output of ``bsym`` itself may share storage with an input."""
    return bool(views(bsym))


register_view_rule(prims.copy_, lambda bsym: [(bsym.output, _copy_writes(bsym)[0][0])])


def _barrier_meta(members, after):
    return tuple(m.replace() for m in members)


def _barrier_impl(members, after):
    """The identity. Where it runs with autograd recording (the eager-mode
    replay), the views of the written memory get the history PyTorch
    regenerates for a view whose base changed: eager does so the next time the
    view is used, and a use the replay dropped as dead (``v.as_strided(...)``
    never read) would otherwise leave ``v.neg_()`` raising "a leaf Variable
    that requires grad" where eager did not (``v`` made of a leaf before a
    write made the leaf require grad)."""
    if torch.is_grad_enabled():
        for m in members:
            if isinstance(m, torch.Tensor) and m.requires_grad and m._is_view():
                try:
                    m.grad_fn                # noqa: B018 - the access regenerates it
                except RuntimeError:         # a view eager refuses to use now (one of unbind's
                    pass                     # outputs): eager raises where the program uses it
    return members


BARRIER = Symbol("update_aliases", meta=_barrier_meta, impl=_barrier_impl, module="prims",
                 tags={Tag.ALIAS_BARRIER})
"""``(a1, v1) = prims.update_aliases((a, v), (t2,))``: after a write into the
alias group of ``a`` and ``v`` (whose result is ``t2``), ``a1`` and ``v1`` name the
same tensors as ``a`` and ``v``. At run time the identity on ``members``; in the
trace, the data dependency that orders later reads after the write."""
