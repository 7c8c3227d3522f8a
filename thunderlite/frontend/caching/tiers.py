"""Tiered compilation: every cache entry starts on the executors it was
compiled with, which compile in milliseconds; an entry called
``TierPolicy.after_calls`` times gets a hot tier, its fusible regions compiled
by a fusing executor (``torchcompile``: Inductor, with its on-disk caches), off
the calling thread, and swapped in when ready (docs/architecture.md §8,
*Tiers*)::

    jm = thunderlite.jit(model)                 # tiering on: TierPolicy() (after 20 calls, torchcompile)
    for batch in data:
        loss = jm(batch); loss.backward()       # calls 1-20 and on run the fast tier until the hot one is in
    thunderlite.wait_for_tiers(jm)              # benchmarks and tests: block until it is
    thunderlite.cache_info(jm)["tiers"]         # [{"tier": "hot", "seconds_to_tier": 14.2, ...}]

The hot tier re-lowers the entry's own trace, as its alias passes left it
(``compile.Lowering``): nothing is traced again, and the prologue (guards),
epilogue (write-backs) and key stay the entry's, so the hot entry accepts
exactly the calls the fast one did and has the same effects. Its regions
compile lazily per input layout; a rehearsal on fake tensors
(executors/rehearsal.py) meets every layout a call will give them, so the
worker compiles them all before the swap and the first hot call compiles
nothing. The swap replaces the entry in the function's cache in one step
(``ThunderliteFunction._replace``): a call runs either entry whole.

Whatever fails in the worker (a region Inductor cannot compile, an op fake
tensors cannot run) keeps the fast tier and records why (``Tier.reason``).
Entries whose trace a rehearsal must not run (collectives, prints, a reseed),
symbolic sizes (torch.compile would compile their regions on the calling
thread), user transforms (they would run again, off their thread) or an
executor list that fuses already stay fast, with the reason.
"""
from __future__ import annotations

import atexit
import dataclasses
import queue
import threading
import time
import types
import weakref

from thunderlite.core.proxies import NumberProxy, TensorProxy
from thunderlite.core.symint import has_symbolic
from thunderlite.core.tags import Tag
from thunderlite.executors.autograd_function import EAGER_MODE_STAGE
from thunderlite.executors.base import Executor
from thunderlite.executors.registry import get_executor
from thunderlite.executors.rehearsal import unrehearsable
from thunderlite.frontend.caching.entries import CompiledEntry, read_input

DEFAULT_AFTER_CALLS = 20
"""Calls after which an entry is hot: enough that a function called a handful
of times (a test, a script's one evaluation) never pays a background compile,
few next to a training run's or a server's calls."""


@dataclasses.dataclass(frozen=True)
class TierPolicy:
    """When and how an entry tiers up (``jit(fn, tiering=...)``).
    ``after_calls``: calls of one entry that make it hot (the compiling call
    counts); ``executor``: the fusing executor of the hot tier, put ahead of
    the entry's own; ``background``: compile on the tier worker thread (False:
    on the calling thread, inside the call that made the entry hot)."""
    after_calls: int = DEFAULT_AFTER_CALLS
    executor: str | Executor = "torchcompile"
    background: bool = True

    def __post_init__(self):
        if type(self.after_calls) is not int or self.after_calls < 1:
            raise ValueError(f"TierPolicy(after_calls={self.after_calls!r}): a number of calls, at least 1")


DEFAULT_POLICY: TierPolicy | None = TierPolicy()
"""What ``jit(fn)`` gets when ``tiering`` is not given (None: tiering off)."""


def policy_of(option) -> TierPolicy | None:
    """``jit``'s ``tiering=``: None (the default policy), True, False, a number
    of calls, or a ``TierPolicy``."""
    if option is None:
        return DEFAULT_POLICY
    if option is True:
        return TierPolicy()
    if option is False:
        return None
    if type(option) is int:
        return TierPolicy(after_calls=option)
    if isinstance(option, TierPolicy):
        return option
    raise TypeError(f"jit(tiering={option!r}): expected True, False, a number of calls or a TierPolicy")


class Tier:
    """Which tier one cache entry runs and how it got there (``cache_info``'s
    ``tiers``). ``name``: "fast" (its first compile's executors), "compiling"
    (the hot tier is being made), "hot" (swapped in), or "fast (final)" (it
    stays fast: ``reason`` says why)."""
    __slots__ = ("name", "reason", "made", "fast_s", "hot_at", "compile_s", "regions", "executor", "done")

    def __init__(self, fast_ms: float, executor: str):
        self.name = "fast"
        self.reason = ""
        self.made = time.perf_counter()
        self.fast_s = fast_ms / 1e3
        self.hot_at: float | None = None
        self.compile_s: float | None = None
        self.regions = 0
        self.executor = executor
        self.done: threading.Event | None = None    # set when a tier-up under way ends

    def stay(self, reason: str) -> None:
        self.name, self.reason = "fast (final)", reason

    def as_dict(self, calls: int) -> dict:
        out = {"tier": self.name, "calls": calls, "seconds_to_fast": round(self.fast_s, 4)}
        if self.hot_at is not None:
            out["seconds_to_hot"] = round(self.hot_at - self.made + self.fast_s, 3)
            out["hot_compile_seconds"] = round(self.compile_s or 0.0, 3)
            out["hot_regions"] = self.regions
            out["hot_executor"] = self.executor
        if self.reason:
            out["reason"] = self.reason
        return out

    def describe(self, after_calls: int | None) -> str:
        """One line for ``examine`` and the trace report."""
        if self.name == "hot":
            return (f"hot: {self.regions} regions compiled by {self.executor} off the calling thread "
                    f"({self.compile_s:.1f} s), in {self.hot_at - self.made + self.fast_s:.1f} s from the first call")
        if self.name == "compiling":
            return f"fast; the hot tier ({self.executor}) is compiling off the calling thread"
        if self.name == "fast (final)":
            return f"fast, and stays so: {self.reason}"
        when = f"after {after_calls} calls" if after_calls else "never (tiering off)"
        return f"fast (compiled in {self.fast_s * 1e3:.0f} ms); hot tier ({self.executor}) {when}"


class Tiers:
    """One jitted function's tiering: its policy and its tier-ups under way.
    ``after_calls`` is what the function's call counting compares with (0:
    never)."""

    def __init__(self, policy: TierPolicy | None):
        self.policy = policy
        self.after_calls = policy.after_calls if policy is not None else 0
        self._pending: list[threading.Event] = []

    def start(self, entry: CompiledEntry) -> None:
        """A new entry runs the fast tier."""
        if self.policy is None:
            return
        ex = self.policy.executor
        entry.tier = Tier(entry.total_ms, ex if isinstance(ex, str) else ex.name)

    def due(self, jfn, entry: CompiledEntry, args: tuple, kwargs: dict) -> None:
        """``entry`` was called ``after_calls`` times (on the calling thread):
        start its tier-up, or record why it stays fast."""
        tier = entry.tier
        if tier is None or tier.name != "fast":
            return
        try:
            hot_ex = _executor(self.policy.executor)
            why = _why_not(entry, hot_ex)
            inputs = None if why else [read_input(p, args, kwargs) if p is not None else c for p, c in entry.inputs]
        except Exception as e:  # noqa: BLE001 - deciding a tier-up must never break the user's call
            why = f"{type(e).__name__}: {e}"
        if why:
            tier.stay(why)
            return
        tier.name = "compiling"
        tier.done = threading.Event()
        self._pending.append(tier.done)
        job = (weakref.ref(jfn), entry, inputs, hot_ex)
        if self.policy.background:
            _worker().submit(job)
        else:
            _tier_up(*job)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every tier-up started so far has ended (swapped in or
        stayed fast); False if ``timeout`` seconds passed first."""
        end = None if timeout is None else time.perf_counter() + timeout
        for done in list(self._pending):
            left = None if end is None else max(0.0, end - time.perf_counter())
            if not done.wait(left):
                return False
        self._pending = [d for d in self._pending if not d.is_set()]
        return True


def _executor(ex: str | Executor) -> Executor:
    return get_executor(ex) if isinstance(ex, str) else ex


def _why_not(entry: CompiledEntry, hot: Executor) -> str:
    """Why ``entry`` cannot get a hot tier ("" when it can), decided from what
    it holds, before any work."""
    low = entry.lowering
    if low is None:
        return "the entry keeps no lowering to start again from"
    ok, reason = hot.is_available()
    if not ok:
        return f"the hot tier's executor {hot.name!r} is unavailable: {reason}"
    if hot in low.executors:
        return f"its executors already include {hot.name!r}"
    if low.transforms:
        return "user transforms run once, when the entry compiles: a hot tier would run them again off that thread"
    if entry.sym_guards or any(type(p) is NumberProxy or (type(p) is TensorProxy and has_symbolic(p.shape))
                               for p in low.trace.args):
        return ("it has symbolic sizes or numbers: torch.compile would compile its regions on the first call "
                "of each size, on the calling thread")
    if any(t.stage == EAGER_MODE_STAGE for t in entry.traces):
        return "PyTorch autograd records this program (eager-mode autodiff): its regions would run as torch calls"
    return unrehearsable([low.trace, entry.traces[-1], *entry.backward_traces[-1:]]) or ""


def _tier_up(jfn_ref, entry: CompiledEntry, inputs: list, hot: Executor) -> None:
    """Make ``entry``'s hot tier and swap it in; on any failure the entry stays fast, with the reason."""
    tier = entry.tier
    start = time.perf_counter()
    try:
        low = entry.lowering
        traces = list(entry.traces[:low.front])
        done = low.lower([hot, *low.executors], traces)
        regions = sum(1 for t in [done.final, *done.backward[-1:]] for b in t.bound_symbols
                      if Tag.FUSION in b.sym.tags and b.sym.executor is hot)
        if not regions:
            tier.stay(f"{hot.name} found no region to fuse")
            return
        if low.placed_by(done) != low.placed:
            tier.stay("the hot lowering relies on other input strides than the entry's guards check")
            return
        low.rehearse(done, inputs)
        inputs = None
        jfn = jfn_ref()
        tier.compile_s = time.perf_counter() - start
        tier.regions = regions
        if jfn is None or not jfn._replace(entry, _hot_entry(entry, done, traces)):
            tier.stay("the entry left the cache while its hot tier compiled")
            return
        tier.hot_at = time.perf_counter()
        tier.name = "hot"
    except Exception as e:  # noqa: BLE001 - a failed hot tier keeps the fast one, with the reason
        tier.compile_s = time.perf_counter() - start
        tier.stay(f"the hot tier failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                  "the fast tier runs")
    finally:
        tier.done.set()


def _hot_entry(entry: CompiledEntry, done, traces: list) -> CompiledEntry:
    """``entry`` with the computation ``done``: the same generated entry code
    (prologue, epilogue) bound to the new computation, the stages up to the
    lowering shared, the hot lowering's after them."""
    old = entry.fn
    fn = types.FunctionType(old.__code__, {**old.__globals__, "_comp": done.comp}, old.__name__)
    fn.__thunderlite_source__ = old.__thunderlite_source__
    stage_ms = {**entry.stage_ms, **{t.stage: t.pass_time_ms for t in traces[entry.lowering.front:]
                                     if t.pass_time_ms is not None}}
    hot = CompiledEntry(fn, traces, done.backward, entry.prologue_traces, stage_ms, entry.total_ms, entry.guards)
    for slot in ("alias_guard", "inputs", "sym_guards", "input_names", "gradients", "calls", "key", "lowering",
                 "tier"):
        setattr(hot, slot, getattr(entry, slot))
    return hot


class _Worker:
    """The process's one tier worker: a thread compiling hot tiers in the
    order they became due, one at a time (Inductor's compile is not meant to
    run twice at once in a process). At exit it starts no more compiles and
    the interpreter waits for the one under way (a thread killed inside torch
    can abort the process), as ``concurrent.futures`` workers are waited for."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="thunderlite-tiers", daemon=_AT_EXIT is None)
        self._thread.start()

    def submit(self, job: tuple) -> None:
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self._closing:
                tier = job[1].tier
                tier.stay("the process exited before its hot tier compiled")
                tier.done.set()
                continue
            _tier_up(*job)

    def close(self) -> None:
        """At exit: drop the jobs not started, and let the thread end."""
        self._closing = True
        self._jobs.put(None)


# run before the interpreter joins its threads (what concurrent.futures registers its workers' exit with)
_AT_EXIT = getattr(threading, "_register_atexit", None)
_WORKER: _Worker | None = None
_WORKER_LOCK = threading.Lock()


def _worker() -> _Worker:
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = _Worker()
            (_AT_EXIT or atexit.register)(_WORKER.close)
        return _WORKER
