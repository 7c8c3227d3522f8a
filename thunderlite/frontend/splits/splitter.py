"""One interpretation of a split program: where it splits, and what runs there.

The interpreter cannot suspend a frame and resume it later, so a program is
split *while it is interpreted*: when Python needs a traced value (``if
loss > 0``, ``bool(t)``, ``lst[i]`` of a tensor, ``f"{n:.3f}"``), the
symbols recorded since the last split become a piece of their own, compiled
and run at once on the call's values; its result gives the Python value the
program asked for, and the interpretation goes on with it, recording the next
piece. The value is *pinned*: the next piece is valid only where the split
gives that value again, which the tree checks on every call (tree.py).

A call whose path leaves the tree (a value never seen at a split) has already
run the pieces up to there: it *resumes*. The program is interpreted again
from its start with the values of the splits it passed pinned (``replay``:
the pieces are not compiled or run again, their symbols must come out the
same), and from the split where the new value was seen on, pieces are
compiled and run as on a first call. Interpreting again keeps the interpreter
simple (DESIGN §12): it never needs to save a frame.

What a piece hands on (``Node.exports``, ``Node.keep``): every value the
program can still read after the split (liveness.py), and, for a backward
inside the program that may come later, the values its graph saves (a
backward after a split differentiates the symbols before it, which a piece
already ran: training/traced_autograd.py ``freeze``).
"""
from __future__ import annotations

import linecache
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from thunderlite.core import pytree
from thunderlite.core.proxies import Proxy, TensorProxy
from thunderlite.core.symbol import free_proxies
from thunderlite.core.symint import ShapeEnv, SymInt, active_env
from thunderlite.core.trace import Trace
from thunderlite.core.tracectx import current_trace
from thunderlite.frontend.caching.entries import CompiledEntry
from thunderlite.frontend.entry import MISS
from thunderlite.frontend.provenance import Prov
from thunderlite.frontend.splits.liveness import (
    interpreter_frame_values,
    module_dict_ids,
    native_frame_values,
    reachable_proxies,
)
from thunderlite.frontend.splits.tree import Node, Site, SplitBudget, SplitEntry, SplitTree
from thunderlite.frontend.state import Input
from thunderlite.interpreter import active_frames, source_locations
from thunderlite.transforms.autodiff.inline import graph_of

PIECE_STAGE = "interpretation"


class SplitRefused(NotImplementedError):
    """A split thunderlite cannot make here (the reason names the line)."""


def mark_after_split(e: BaseException) -> None:
    """``e`` was raised once a piece of the call ran: compiling the call again
    (another cache mode, static sizes: api.py) would run that piece twice."""
    try:
        e.__thunderlite_after_split__ = True
    except AttributeError:
        pass


def after_split(e: BaseException) -> bool:
    return getattr(e, "__thunderlite_after_split__", False)


@dataclass
class Resume:
    """A call whose path left its tree: the nodes it ran, the values their
    splits gave, and the values it holds for the rest (``env``)."""
    tree: SplitTree
    path: list[Node]
    values: list
    env: dict


@dataclass
class _Cut:
    index: int          # symbols recorded before the split
    inputs: int         # state.inputs, guards and size guards made before it
    guards: int
    sym_guards: int
    grad_enabled: bool  # grad mode after it (when the next piece starts)


class Splitter:
    """The splits of one interpretation (module docstring). ``compile_piece(
    trace, inputs, guards, sym_guards)`` is compile.py's pipeline for a piece
    that ends at a split; ``resume_fn`` compiles the rest of a later call."""

    def __init__(self, hooks, budget: SplitBudget, compile_piece: Callable, resume_fn: Callable,
                 fn: Callable, args: tuple, kwargs: dict, resume: Resume | None, env: ShapeEnv | None):
        self.hooks = hooks
        self.state = hooks.state
        self.trace: Trace = hooks.trace
        self.budget = budget
        self.compile_piece = compile_piece
        self.resume_fn = resume_fn
        self.fn = fn
        self.args, self.kwargs = args, kwargs
        self.shape_env = env
        self.replay = list(resume.path) if resume is not None else []
        self.values = list(resume.values) if resume is not None else []
        self.env: dict = dict(resume.env) if resume is not None else {}
        self.tree: SplitTree | None = resume.tree if resume is not None else None
        self.node: Node | None = None       # the last piece of this call's path so far
        self.cuts: list[_Cut] = []
        self.start_grad = torch.is_grad_enabled()
        self.ran = resume is not None       # a piece of this call ran
        # by identity: holding the frame (whose locals hold this splitter) would keep the
        # compile's frames and everything they hold alive until a cyclic collection
        self.base_frame = id(sys._getframe(1))
        self.sites: list[Site] = []

    # --- the split ---------------------------------------------------------------------------
    def allowed(self, asked: list[Proxy]) -> bool:
        """Splits happen between the program's own statements (not inside a
        composite being recorded, nor in a scratch trace: torch.func), on values
        the data decides: a decision on numbers passed in alone (``cache=
        'symbolic values'``, floats made inputs automatically) specializes them
        instead (api.py compiles again), unless the program split already
        (compiling again would run a piece twice)."""
        return current_trace() is self.trace and len(self.trace._scopes) == 1 \
            and (bool(self.cuts) or self._from_data(asked))

    def _from_data(self, asked: list[Proxy]) -> bool:
        """Whether a tensor's values reach ``asked`` (not only number inputs)."""
        todo = [p.name for p in asked if type(p) is not TensorProxy]
        if len(todo) < len(asked):
            return True
        producer = {o.name: b for b in self.trace.bound_symbols for o in b.proxy_outs()}
        seen: set[str] = set()
        while todo:
            b = producer.get(todo.pop())
            if b is None or id(b) in seen:
                continue
            seen.add(id(b))
            for a in b.proxy_args():
                if type(a) is TensorProxy:
                    return True
                todo.append(a.name)
        return False

    def value(self, asked: list[Proxy], compute: Callable[[list], Any], what: str) -> Any:
        """The Python value the program needs (``compute`` applied to the values
        of ``asked`` when the program runs), splitting the program here."""
        i = len(self.cuts)
        caller = sys._getframe(1)
        site = self._site(what)
        if self.trace.rebound:
            raise SplitRefused(f"thunderlite cannot split the program at {site}: an input changed shape or "
                               "storage in place before it (t_(), resize_(), set_(), .data =)")
        self.hooks.autograd.freeze()
        cut = _Cut(len(self.trace.bound_symbols), len(self.state.inputs), len(self.state.guards),
                   len(self.shape_env.guards) if self.shape_env is not None else 0, self.hooks.grad_enabled)
        self.trace.writes += 1          # memos of values (nonzero's) do not reach across pieces
        if i < len(self.replay):
            node = self.replay[i]
            names = tuple(p.name for p in asked)
            if node.cut != cut.index or node.asked != names:
                raise RuntimeError(f"thunderlite: the program traced differently on a later call before the split "
                                   f"at {site} ({cut.index} symbols, reading {names}; first {node.cut}, reading "
                                   f"{node.asked}): it must trace the same way for the values it saw")
            self.cuts.append(cut)
            self.sites.append(site)
            self.node = node
            return self.values[i]
        node = self._compile(asked, compute, site, cut, caller)
        del caller
        self.cuts.append(cut)
        self.sites.append(site)
        asked_values, exported = self._run(node)
        value = compute(list(asked_values))
        self.env = node.advance(self.env, exported)
        self._attach(node)
        self.values.append(value)
        return value

    def _site(self, what: str) -> Site:
        """The user's line, and the library line that asked when it is not the
        user's (``if opt_cond:`` in torch.optim.LBFGS.step)."""
        loc = self.hooks.user_location()
        frames = source_locations()
        if frames and (loc is None or tuple(frames[-1]) != (loc[0], loc[1])):
            file, line = frames[-1]
            what += f", in {file}:{line} ({linecache.getline(file, line).strip()})"
        if loc is None:
            return Site("<unknown>", 0, "", what)
        return Site(loc[0], loc[1], loc[2], what)

    def _run(self, node: Node):
        torch._C._set_grad_enabled(node.grad_enabled)
        try:
            out = node.entry.fn(self.args, self.kwargs, self.env)
        finally:
            torch._C._set_grad_enabled(self.hooks.grad_enabled)
        self.ran = True
        if out is MISS:
            raise RuntimeError("thunderlite: a piece of a split program rejected the call it was compiled for "
                               "(a guard reads a value that changes on every read)")
        return out

    def _attach(self, node: Node) -> None:
        if self.node is not None:
            if self.tree is None:
                raise RuntimeError("thunderlite: a split program's pieces lost their tree")
            self.tree.attach(self.node, self.values[-1], node)
        self.node = node

    # --- compiling a piece ---------------------------------------------------------------------
    def _compile(self, asked: list[Proxy], compute: Callable, site: Site, cut: _Cut, caller) -> Node:
        prev = self.cuts[-1] if self.cuts else None
        start = prev.index if prev is not None else 0
        bsyms = list(self.trace.bound_symbols[start:cut.index])
        defined = {p.name for b in self.trace.bound_symbols[:cut.index] for p in b.proxy_outs()}
        mine = {p.name: p for b in bsyms for p in b.proxy_outs()}
        keep = self._live(defined, caller)
        exports = tuple(sorted(n for n in keep if n in mine))
        asked = [self._current(p, mine) for p in asked]
        ret = (tuple(asked), tuple(mine[n] for n in exports))
        sym_guards = self._sym_guards(prev, cut)
        trace, inputs = self._piece(bsyms, ret, prev, cut, sizes=sym_guards)
        guards = self.state.guards[prev.guards if prev else 0:cut.guards]
        grad = prev.grad_enabled if prev is not None else self.start_grad
        with _grad_mode(grad):
            entry = self.compile_piece(trace, inputs, guards, sym_guards)
        _label(entry, f"piece {len(self.cuts) + 1}: runs {self._after(prev)}up to the split at {site}; "
                      f"it returns {', '.join(p.name for p in asked)} for that")
        node = Node(entry, grad, self.node, self.values[-1] if self.node is not None else None)
        node.site, node.decide, node.exports, node.keep = site, compute, exports, frozenset(keep)
        node.asked, node.cut = tuple(p.name for p in asked), cut.index
        if self.tree is None:
            self.tree = SplitTree(node, self.budget, self.resume_fn, self.fn)
        return node

    def _after(self, prev: _Cut | None) -> str:
        if prev is None:
            return "from the start "
        return f"after the split at {self.sites[-1]} (value {self.values[len(self.cuts) - 1]!r}) "

    def _current(self, p: Proxy, mine: dict) -> Proxy:
        """The trace's proxy named like ``p`` (a backward may have replaced the
        object the program holds by one of the same name)."""
        return mine.get(p.name, p)

    def _sym_guards(self, prev: _Cut | None, cut: _Cut) -> list:
        if self.shape_env is None:
            return []
        return list(self.shape_env.guards[prev.sym_guards if prev else 0:cut.sym_guards])

    def _piece(self, bsyms: list, ret: Any, prev: _Cut | None, cut: _Cut | None,
               trace: Trace | None = None, sizes: list = ()) -> tuple[Trace, list[Input]]:
        """The trace of a piece (``bsyms`` returning ``ret``) and its inputs: the
        program's inputs it reads, that entered during it or that its size guards
        (``sizes``) read, then the values of earlier pieces it reads
        (``Prov.split``, from ``env``)."""
        read = free_proxies([*bsyms, _Return(ret)])
        names = {p.name for p in read} | {n for g in sizes for n in g.atoms()}
        first = prev.inputs if prev is not None else 0
        last = cut.inputs if cut is not None else len(self.state.inputs)
        inputs = [inp for k, inp in enumerate(self.state.inputs[:last]) if k >= first or inp.proxy.name in names]
        own = {inp.proxy.name for inp in self.state.inputs}
        for p in read:
            if p.name in own:
                continue
            if p.name not in self.env:
                raise RuntimeError(f"thunderlite: {p.name}, computed before a split, is read after it but was not "
                                   "kept (an internal error of the splitting; please report it)")
            inputs.append(Input(p, Prov.split(p.name), self.env[p.name], guard_meta=False))
        if trace is None:
            trace = self._trace(bsyms)
        trace.args = [inp.proxy for inp in inputs]
        trace.set_return(ret)
        return trace, inputs

    def _trace(self, bsyms: list) -> Trace:
        # the passes name what they make from a copy of the names taken so far: the
        # interpretation's own names must come out the same when it is replayed
        names = type(self.trace.names)()
        names.taken, names.counters = set(self.trace.names.taken), dict(self.trace.names.counters)
        trace = Trace("computation", stage=PIECE_STAGE, names=names)
        trace.bound_symbols = list(bsyms)
        trace._scopes = [trace.bound_symbols]
        trace.pass_time_ms = self.trace.pass_time_ms
        return trace

    def tail(self) -> Trace:
        """The last piece's trace, from the last split to the end (its end
        processing, write-backs and output plan, is compile.py's)."""
        trace = self._trace(self.trace.bound_symbols[self.cuts[-1].index:])
        trace.rebound = self.trace.rebound
        return trace

    def seal_tail(self, trace: Trace, ret: Any) -> tuple[list[Input], list, list]:
        """The last piece's arguments and return (``ret``); its inputs, guards
        and size guards."""
        prev = self.cuts[-1]
        sym = list(self.shape_env.guards[prev.sym_guards:]) if self.shape_env is not None else []
        _, inputs = self._piece(trace.bound_symbols, ret, prev, None, trace, sizes=sym)
        return inputs, self.state.guards[prev.guards:], sym

    def run_last(self, leaf: CompiledEntry) -> None:
        """The last piece of a call whose program raised its own exception after
        a split: its writes run, as eager's did before the raise; nothing is
        kept (each such call traces again)."""
        torch._C._set_grad_enabled(self.cuts[-1].grad_enabled)
        try:
            leaf.fn(self.args, self.kwargs, self.env)
        except Exception:  # noqa: BLE001 - this failing must not hide the program's exception
            pass
        finally:
            torch._C._set_grad_enabled(self.start_grad)

    def finish(self, leaf: CompiledEntry) -> tuple[Any, CompiledEntry | None]:
        """Run the last piece; returns its output and, for the call that compiled
        the tree's root, the cache entry of the whole program."""
        prev = self.cuts[-1]
        _label(leaf, f"piece {len(self.cuts) + 1}: runs {self._after(prev)}to the end")
        node = Node(leaf, prev.grad_enabled, self.node, self.values[-1])
        self._attach(node)
        self.budget.add_path(str(self.sites[-1]), bool(self.replay))
        torch._C._set_grad_enabled(node.grad_enabled)
        try:
            out = leaf.fn(self.args, self.kwargs, self.env)
        finally:
            torch._C._set_grad_enabled(self.start_grad)
        if out is MISS:
            raise RuntimeError("thunderlite: a piece of a split program rejected the call it was compiled for "
                               "(a guard reads a value that changes on every read)")
        path = []
        n = node
        while n is not None:
            path.append(n)
            n = n.parent
        self.tree.last_path = path[::-1]
        if self.replay:
            return out, None
        entry = SplitEntry(self.tree, self.tree.root.entry, MISS)
        entry.set_first_output(out)
        return out, entry

    # --- what the rest of the program may read --------------------------------------------------
    def _live(self, defined: set[str], caller) -> set[str]:
        """Names of the values computed so far that the program may read after
        the split: reachable from its live objects, and those a later backward
        through the graph of a reachable value needs."""
        state, auto = self.state, self.hooks.autograd
        roots: list = [interpreter_frame_values(f) for f in active_frames()]
        roots.append(native_frame_values(caller, self.base_frame))
        roots += [[v for _, v in d.values()] for d in (state.attr_writes, state.global_writes, state.cell_writes)]
        roots += [m.copy for m in state.mirror_of.values()]
        roots += list(state.tuple_copies.values())
        roots += [auto.grads, auto.entry_grads, auto.value_grads, auto.retains, auto.made, auto.input_hooks]
        stop = module_dict_ids() | set(state.prov_of) | {id(x) for x in (
            self, self.hooks, state, auto, self.trace, self.shape_env, getattr(self.hooks, "_lookasides", None))}
        stop -= {id(m.copy) for m in state.mirror_of.values()}
        stop_types = tuple({type(f.rt) for f in active_frames()} | {ShapeEnv})
        found = reachable_proxies(roots, stop, stop_types)
        if found is None:           # too much to walk: keep everything
            return set(defined)
        live = {n for n in found if n in defined}
        live |= self._graph_values(found, defined)
        sizes = active_env()        # run-time sizes: a later shape may name one through a guarded equality
        if sizes is not None:
            live |= {n for n in sizes.atoms if n in defined}
        return live

    def _graph_values(self, found: dict, defined: set[str]) -> set[str]:
        """The values (arguments and outputs of its symbols) of the graph of
        each reachable value that requires grad: what a backward through it,
        inside the program after the split, differentiates."""
        auto = self.hooks.autograd
        wanted = [p for p in found.values() if type(p) is TensorProxy and p.requires_grad and p.name in defined]
        if not wanted or not auto.retained:
            return set()
        graph = graph_of(auto.retained, wanted, frozenset(auto.made))
        out: set[str] = set()
        for b in auto.retained:
            if any(o.name in graph for o in b.proxy_outs()):
                out.update(p.name for p in b.proxy_args() + b.proxy_outs() if p.name in defined)
        return out


class _Return:
    """``free_proxies`` of a piece's return value."""

    def __init__(self, value):
        self.value = value

    def proxy_args(self) -> list:
        out = []
        for x in pytree.leaves(self.value):
            if isinstance(x, Proxy):
                out.append(x)
            elif type(x) is SymInt:
                out += x.proxies()
        return out

    def proxy_outs(self) -> list:
        return []


class _grad_mode:
    def __init__(self, mode: bool):
        self.mode = mode

    def __enter__(self):
        self.prev = torch.is_grad_enabled()
        torch._C._set_grad_enabled(self.mode)

    def __exit__(self, *exc):
        torch._C._set_grad_enabled(self.prev)


def _label(entry: CompiledEntry, text: str) -> None:
    for t in [*entry.traces, *entry.backward_traces, *entry.prologue_traces]:
        if text not in t.header_comments:
            t.header_comments.insert(0, text)
