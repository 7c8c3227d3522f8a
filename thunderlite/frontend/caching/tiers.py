"""Tiered compilation: every cache entry starts on the executors it was
compiled with, which compile in milliseconds; an entry called
``TierPolicy.after_calls`` times gets a hot tier, its fusible regions compiled
by a fusing executor (``torchcompile``: Inductor, with its on-disk caches), off
the calling thread, and swapped in when ready (docs/architecture.md §8,
*Tiers*)::

    jm = thunderlite.jit(model)                 # tiering on: TierPolicy() (after 20 calls, torchcompile)
    for batch in data:
        loss = jm(batch); loss.backward()       # the fast tier runs until the hot one is in and kept
    thunderlite.wait_for_tiers(jm)              # benchmarks and tests: block until it is compiled
    thunderlite.cache_info(jm)["tiers"]         # [{"tier": "hot", "seconds_to_hot": 14.2, ...}]

The hot tier re-lowers the entry's own trace, as its alias passes left it
(``compile.Lowering``): nothing is traced again, and the prologue (guards),
epilogue (write-backs) and key stay the entry's, so the hot entry accepts
exactly the calls the fast one did and has the same effects. Its regions
compile lazily per input layout; a rehearsal on fake tensors
(executors/rehearsal.py) meets every layout a call will give them, so the
worker compiles them all before the swap and the first hot call compiles
nothing. The swap replaces the entry in the function's cache in one step
(``ThunderliteFunction._replace``): a call runs either entry whole. The hot
tier is then on trial: kept when a call costs no more time with it than with
the fast tier (``_clock``), else the fast entry goes back.

Whatever fails in the worker (a region Inductor cannot compile, an op fake
tensors cannot run) keeps the fast tier and records why (``Tier.reason``).
Entries of symbolic sizes or numbers tier up where the hot executor compiles
their regions once for every size, off the calling thread
(``prepares_symbolic``: torchcompile's ``SymbolicRegion``). Entries whose
trace a rehearsal must not run (collectives, prints, a reseed), symbolic
sizes where it does not (a ``torchcompile`` whose user chose ``dynamic=``),
user transforms (they would run again, off their thread) or an
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
from collections.abc import Callable

import torch

from thunderlite.core.proxies import NumberProxy, TensorProxy
from thunderlite.core.symint import has_symbolic
from thunderlite.core.tags import Tag
from thunderlite.executors.autograd_function import EAGER_MODE_STAGE, DifferentiableProgram
from thunderlite.executors.base import Executor, FusionExecutor
from thunderlite.executors.cost import estimated_seconds
from thunderlite.executors.fx_beside import compiling_beside_others
from thunderlite.executors.registry import get_executor
from thunderlite.executors.rehearsal import unrehearsable
from thunderlite.frontend.caching.entries import CompiledEntry, read_path
from thunderlite.frontend.entry import MISS

DEFAULT_AFTER_CALLS = 20
"""Calls after which an entry is hot: enough that a function called a handful
of times (a test, a script's one evaluation) never pays a background compile,
few next to a training run's or a server's calls."""

TRIAL_CALLS = 8
"""Calls measured on each tier to decide whether the hot one is kept."""

TRIAL_WARMUP = 2
"""The trial's first intervals after the swap, not measured (first uses)."""


@dataclasses.dataclass(frozen=True)
class TierPolicy:
    """When and how an entry tiers up (``jit(fn, tiering=...)``).
    ``after_calls``: calls of one entry that make it hot (the compiling call
    counts): its hot tier starts compiling then. ``executor``: the fusing
    executor of the hot tier, put ahead of the entry's own. ``background``:
    compile on the tier worker thread (False: on the calling thread, inside
    the call that made the entry hot). ``trial_calls``: the hot tier is kept
    only if, over this many calls, a call costs no more time with it than with
    the fast tier over as many calls before the compile (measured from one
    call's start to the next's, so a training step's backward counts:
    ``_clock``); 0 keeps it untried."""
    after_calls: int = DEFAULT_AFTER_CALLS
    executor: str | Executor = "torchcompile"
    background: bool = True
    trial_calls: int = TRIAL_CALLS

    def __post_init__(self):
        if type(self.after_calls) is not int or self.after_calls < 1:
            raise ValueError(f"TierPolicy(after_calls={self.after_calls!r}): a number of calls, at least 1")
        if type(self.trial_calls) is not int or self.trial_calls < 0:
            raise ValueError(f"TierPolicy(trial_calls={self.trial_calls!r}): a number of calls, 0 or more")

    @property
    def measure_from(self) -> int:
        """The call after which the fast tier is measured (the next call's start
        begins the first interval; the compiling call is never measured), so
        that the compile starts at call ``after_calls`` where there were calls enough."""
        if not self.trial_calls:
            return self.after_calls
        return max(2, self.after_calls - self.trial_calls - 1)


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
    ``tiers``). ``name``: "fast" (its first compile's executors), "measuring"
    (the fast tier's cost per call, before the compile), "compiling" (the hot
    tier is being made), "trial" (the hot tier runs, measured), "hot" (kept),
    or "fast (final)" (it stays fast: ``reason`` says why)."""
    __slots__ = ("name", "reason", "made", "fast_s", "hot_at", "compile_s", "regions", "executor", "done",
                 "fast_ms_per_call", "hot_ms_per_call")

    def __init__(self, fast_ms: float, executor: str):
        self.name = "fast"
        self.reason = ""
        self.made = time.perf_counter()
        self.fast_s = fast_ms / 1e3
        self.hot_at: float | None = None
        self.compile_s: float | None = None
        self.regions = 0
        self.executor = executor
        self.done: threading.Event | None = None    # set when a compile under way ends
        self.fast_ms_per_call: float | None = None  # time per call, measured (``_clock``)
        self.hot_ms_per_call: float | None = None

    def stay(self, reason: str) -> None:
        self.name, self.reason = "fast (final)", reason

    def as_dict(self, calls: int) -> dict:
        out = {"tier": self.name, "calls": calls, "seconds_to_fast": round(self.fast_s, 4)}
        if self.compile_s is not None:
            out["hot_compile_seconds"] = round(self.compile_s, 3)
        if self.hot_at is not None:
            out["seconds_to_hot"] = round(self.hot_at - self.made + self.fast_s, 3)
            out["hot_regions"] = self.regions
            out["hot_executor"] = self.executor
        for name in ("fast_ms_per_call", "hot_ms_per_call"):
            if getattr(self, name) is not None:
                out[name] = round(getattr(self, name), 4)
        if self.reason:
            out["reason"] = self.reason
        return out

    def describe(self, after_calls: int | None) -> str:
        """One line for ``examine`` and the trace report."""
        if self.name in ("hot", "trial"):
            kept = "" if self.name == "hot" else ", on trial against the fast tier"
            return (f"{self.name}: {self.regions} regions compiled by {self.executor} off the calling thread "
                    f"({self.compile_s:.1f} s), in {self.hot_at - self.made + self.fast_s:.1f} s from the first "
                    f"call{kept}")
        if self.name in ("measuring", "compiling"):
            return f"fast; the hot tier ({self.executor}) is {self.name}"
        if self.name == "fast (final)":
            return f"fast, and stays so: {self.reason}"
        when = f"after {after_calls} calls" if after_calls else "never (tiering off)"
        return f"fast (compiled in {self.fast_s * 1e3:.0f} ms); hot tier ({self.executor}) {when}"


class Tiers:
    """One jitted function's tiering: its policy and its compiles under way.
    ``after_calls`` is what the function's call counting compares with (0:
    never): the call that starts an entry's tier-up."""

    def __init__(self, policy: TierPolicy | None):
        self.policy = policy
        self.after_calls = policy.measure_from if policy is not None else 0
        self._pending: list[threading.Event] = []
        self._lock = threading.Lock()

    @property
    def hot_after(self) -> int | None:
        """The policy's ``after_calls`` (None: tiering off), for the words ``Tier.describe`` says."""
        return self.policy.after_calls if self.policy is not None else None

    def start(self, entry: CompiledEntry) -> None:
        """A new entry runs the fast tier."""
        if self.policy is None:
            return
        ex = self.policy.executor
        entry.tier = Tier(entry.total_ms, ex if isinstance(ex, str) else ex.name)

    def due(self, jfn, entry: CompiledEntry, args: tuple, kwargs: dict) -> None:
        """``entry`` reached ``after_calls`` calls (on the calling thread): measure
        its cost per call, then compile its hot tier; or record why it stays fast."""
        tier = entry.tier
        with self._lock:
            if tier is None or tier.name != "fast":
                return
            tier.name = "measuring"
        try:
            hot = _executor(self.policy.executor)
            why = _why_not(entry, hot)
        except Exception as e:  # noqa: BLE001 - deciding a tier-up must never break the user's call
            why = f"{type(e).__name__}: {e}"
        if why:
            tier.stay(why)
            return
        if not self.policy.trial_calls:
            self._compile(jfn, entry, hot, args, kwargs)
            return

        program = _program_of(entry)
        if program is not None:     # the backward's gradients: their layouts are rehearsed
            program.watch_grads = True

        def measured(ms: float, args: tuple, kwargs: dict) -> None:
            tier.fast_ms_per_call = ms
            if program is not None:
                program.watch_grads = False
            jfn._replace(timed, entry)
            self._compile(jfn, entry, hot, args, kwargs)
        timed = _timed(entry, self.policy.trial_calls, measured)
        if not jfn._replace(entry, timed):
            tier.stay("the entry left the cache")

    def _compile(self, jfn, entry: CompiledEntry, hot: Executor, args: tuple, kwargs: dict) -> None:
        tier = entry.tier
        try:
            inputs = [read_path(p, args, kwargs) if p is not None else c for p, c in entry.inputs]
        except Exception as e:  # noqa: BLE001 - a tier-up must never break the user's call
            tier.stay(f"its inputs could not be read again ({type(e).__name__}: {e})")
            return
        tier.name = "compiling"
        tier.done = threading.Event()
        self._pending.append(tier.done)
        job = (weakref.ref(jfn), entry, inputs, hot, self.policy.trial_calls)
        if self.policy.background:
            _worker().submit(lambda: _tier_up(*job), lambda: _dropped(tier))
        else:
            _tier_up(*job)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every hot tier being compiled is swapped in (for its
        trial, when it has one) or has stayed fast, and the worker has
        compiled the layouts handed to it so far (regions' unforeseen ones);
        False if ``timeout`` seconds passed first."""
        end = None if timeout is None else time.perf_counter() + timeout
        if _WORKER is not None:
            barrier = threading.Event()
            _WORKER.submit(barrier.set, barrier.set)
            self._pending.append(barrier)
        for done in list(self._pending):
            left = None if end is None else max(0.0, end - time.perf_counter())
            if not done.wait(left):
                return False
        self._pending = [d for d in self._pending if not d.is_set()]
        return True


def _clock(entry: CompiledEntry) -> Callable[[], float]:
    """What a trial measures between one call's start and the next's (per
    thread: each thread's own calls): everything the program costs the caller
    between calls, a training step's backward included. The calling thread's
    CPU time where it does all of the program's work (CPU tensors, one
    intra-op thread): other processes' load and the worker's compile do not
    count. Else wall time: with several intra-op threads the caller's CPU time
    misses theirs and counts its spinning at their barriers, and a GPU's work
    is not the host's."""
    cpu_only = all(p.device.type == "cpu" for p in entry.lowering.trace.args if type(p) is TensorProxy)
    return time.thread_time if cpu_only and torch.get_num_threads() == 1 else time.perf_counter


def _timed(entry: CompiledEntry, calls: int, measured: Callable) -> CompiledEntry:
    """A copy of ``entry`` whose calls are measured (``_clock``): the fast
    tier before its compile, which also lets the program note the layouts of
    its backward's gradients (``watch_grads``). After ``calls`` intervals
    ``measured(ms, args, kwargs)`` runs, once, inside the call that completed
    them (the hot tier's trial then measures both tiers again, alternating:
    ``_alternating``). Entries measured have no fast guard (it would inline
    the entry's code past the timer), so they pay a key."""
    run = entry.fn
    clock = _clock(entry)
    last: dict[int, float] = {}
    samples: list[float] = []
    once = threading.Lock()     # threads completing the samples at once: one of them decides

    def fn(args: tuple, kwargs: dict):
        now = clock()
        before = last.get(threading.get_ident())
        last[threading.get_ident()] = now
        out = run(args, kwargs)
        if before is not None and out is not MISS and len(samples) < calls:
            samples.append(now - before)
            if len(samples) >= calls and once.acquire(blocking=False):
                try:
                    measured(_typical(samples[:calls]) * 1e3, args, kwargs)
                except Exception as e:  # noqa: BLE001 - a tier decision must never break the user's call
                    entry.tier.stay(f"{type(e).__name__} while deciding: {e}")
        return out
    return _with(entry, fn)


def _typical(samples: list[float]) -> float:
    """A call's cost from its intervals: their lower quartile. What disturbs an
    interval (the worker's compile sharing the process, another thread's
    calls, a GC pass) only adds to it, so the lower samples are the program's
    own cost; a median let a few disturbed calls decide a trial."""
    ordered = sorted(samples)
    return ordered[(len(ordered) - 1) // 4]


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
    fusing = [ex.name for ex in low.executors if isinstance(ex, FusionExecutor)]
    if fusing:
        return f"its executors fuse already ({', '.join(repr(n) for n in fusing)})"
    if low.transforms:
        return "user transforms run once, when the entry compiles: a hot tier would run them again off that thread"
    if not getattr(hot, "prepares_symbolic", False) and (
            entry.sym_guards or any(type(p) is NumberProxy or (type(p) is TensorProxy and has_symbolic(p.shape))
                                    for p in low.trace.args)):
        return ("it has symbolic sizes or numbers: the hot tier's executor would compile its regions on the "
                "first call of each size, on the calling thread")
    if any(t.stage == EAGER_MODE_STAGE for t in entry.traces):
        return "PyTorch autograd records this program (eager-mode autodiff): its regions would run as torch calls"
    return unrehearsable([low.trace, entry.traces[-1], *entry.backward_traces[-1:]]) or ""


def _tier_up(jfn_ref, entry: CompiledEntry, inputs: list, hot: Executor, trial_calls: int) -> None:
    """Make ``entry``'s hot tier and swap it in (on trial when ``trial_calls``);
    on any failure the entry stays fast, with the reason."""
    tier = entry.tier
    start = time.perf_counter()
    try:
        low = entry.lowering
        traces = list(entry.traces[:low.front])
        done = low.lower([hot, *low.executors], traces)
        fusions = [b for t in [done.final, *done.backward[-1:]] for b in t.bound_symbols
                   if Tag.FUSION in b.sym.tags and b.sym.executor is hot]
        small = _too_small(fusions)
        if small:
            tier.stay(small)
            return
        if low.placed_by(done) != low.placed:
            tier.stay("the hot lowering relies on other input strides than the entry's guards check")
            return
        fast_program = _program_of(entry)
        low.rehearse(done, inputs, fast_program.grad_layouts if fast_program is not None else None,
                     later=_worker().submit)
        inputs = None
        tier.compile_s = time.perf_counter() - start
        tier.regions = len(fusions)
        hot_entry = _hot_entry(entry, done, traces)
        installed = hot_entry
        if trial_calls:
            installed = _alternating(entry, hot_entry, trial_calls,
                                     lambda fast_ms, hot_ms: _judge(jfn_ref, entry, hot_entry, installed,
                                                                    fast_ms, hot_ms))
        jfn = jfn_ref()
        if jfn is None or not jfn._replace(entry, installed):
            tier.stay("the entry left the cache while its hot tier compiled")
            return
        tier.hot_at = time.perf_counter()
        tier.name = "trial" if trial_calls else "hot"
    except Exception as e:  # noqa: BLE001 - a failed hot tier keeps the fast one, with the reason
        tier.compile_s = time.perf_counter() - start
        tier.stay(f"the hot tier failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                  "the fast tier runs")
    finally:
        tier.done.set()


def _alternating(fast: CompiledEntry, hot: CompiledEntry, calls: int,
                 decide: Callable[[float, float], None]) -> CompiledEntry:
    """The hot tier's trial: an entry whose calls alternate between the fast
    and the hot entry (the hot one first), each interval (``_clock``, from a
    call's start to the next's on its thread) counted for the tier of the call
    that began it. Alternating compares the tiers under the same conditions:
    the fast tier measured before the compile, in a program's first calls and
    apart from what came later (a benchmark's other variants between steps),
    measured half a training step's cost and kept the fast tier of steps whose
    hot tier was a third faster. After ``calls`` intervals of each,
    ``decide(fast ms, hot ms)`` (lower quartiles, ``_typical``) runs once, in
    the call that completed them. The first ``TRIAL_WARMUP`` intervals are not
    counted (first uses), nor, up to ``3 * calls`` of them, intervals ending
    while the tier worker compiles."""
    runs = (fast.fn, hot.fn)
    clock = _clock(hot)
    last: dict[int, tuple[float, int]] = {}
    samples: tuple[list[float], list[float]] = ([], [])
    turn = [0]
    passed = [0, 0]             # intervals not counted: warming up, while the worker was busy
    once = threading.Lock()

    def fn(args: tuple, kwargs: dict):
        now = clock()
        which = turn[0] = 1 - turn[0]
        prev = last.get(threading.get_ident())
        last[threading.get_ident()] = (now, which)
        out = runs[which](args, kwargs)
        if prev is None or out is MISS:
            return out
        if passed[0] < TRIAL_WARMUP:
            passed[0] += 1
        elif _WORKER is not None and _WORKER.busy and passed[1] < 3 * calls:
            passed[1] += 1
        elif len(samples[prev[1]]) < calls:
            samples[prev[1]].append(now - prev[0])
        if min(map(len, samples)) >= calls and once.acquire(blocking=False):
            try:
                decide(_typical(samples[0]) * 1e3, _typical(samples[1]) * 1e3)
            except Exception as e:  # noqa: BLE001 - a tier decision must never break the user's call
                fast.tier.stay(f"{type(e).__name__} while deciding: {e}")
        return out
    return _with(hot, fn)


def _judge(jfn_ref, fast: CompiledEntry, hot: CompiledEntry, on_trial: CompiledEntry, fast_ms: float,
           ms: float) -> None:
    """The hot tier's trial is over (on the calling thread): keep it if it cost
    no more per call than the fast tier did, else put the fast entry back."""
    tier = fast.tier
    tier.fast_ms_per_call = fast_ms
    tier.hot_ms_per_call = ms
    jfn = jfn_ref()
    if jfn is None:
        return
    if ms <= tier.fast_ms_per_call:
        jfn._replace(on_trial, hot)         # untimed, so a fast guard can inline its code again
        tier.name = "hot"
    else:
        jfn._replace(on_trial, fast)
        tier.stay(f"the hot tier was slower: {ms:.3f} ms per call against the fast tier's "
                  f"{tier.fast_ms_per_call:.3f} ms")


MIN_FUSED_SYMBOLS = 8
"""A hot tier fusing fewer symbols than this, of little work, stays fast:
each region call costs more on the host (tens of microseconds) than the few
torch calls it replaces."""


def _too_small(fusions: list) -> str:
    """Why the hot tier's regions are not worth compiling ("" if they are)."""
    if not fusions:
        return "the hot tier's executor found no region to fuse"
    fused = sum(max(1, len(b.subsymbols)) for b in fusions)
    work = estimated_seconds(b for f in fusions for b in f.subsymbols)
    if fused < MIN_FUSED_SYMBOLS and work is not None and work < 1e-3:
        return (f"its regions hold {fused} symbols of about {work * 1e6:.0f} us of work: "
                "fewer torch calls than a region call costs")
    return ""


def _program_of(entry: CompiledEntry) -> DifferentiableProgram | None:
    """The differentiable program the entry's computation runs (None without autodiff)."""
    comp = entry.fn.__globals__.get("_comp") if hasattr(entry.fn, "__globals__") else None
    comp = getattr(comp, "program", comp)       # under autocast: its wrapper (compile.Lowering.lower)
    return comp if isinstance(comp, DifferentiableProgram) else None


def _hot_entry(entry: CompiledEntry, done, traces: list) -> CompiledEntry:
    """``entry`` with the computation ``done``: the same generated entry code
    (prologue, epilogue) bound to the new computation, the stages up to the
    lowering shared, the hot lowering's after them."""
    old = entry.fn
    fn = types.FunctionType(old.__code__, {**old.__globals__, "_comp": done.comp}, old.__name__)
    fn.__thunderlite_source__ = old.__thunderlite_source__
    # the fast guard's C++ check of the parameters (frontend/entry.py ``_tensor_guard``)
    fn.__thunderlite_tensor_guard__ = getattr(old, "__thunderlite_tensor_guard__", None)
    hot = _with(entry, fn, traces, done.backward)
    hot.stage_ms = {**entry.stage_ms, **{t.stage: t.pass_time_ms for t in traces[entry.lowering.front:]
                                         if t.pass_time_ms is not None}}
    return hot


def _with(entry: CompiledEntry, fn: Callable, traces: list | None = None,
          backward: list | None = None) -> CompiledEntry:
    """A copy of ``entry`` running ``fn`` (and showing ``traces``/``backward``)."""
    new = CompiledEntry(fn, entry.traces if traces is None else traces,
                        entry.backward_traces if backward is None else backward, entry.prologue_traces,
                        entry.stage_ms, entry.total_ms, entry.guards)
    for slot in CompiledEntry.__slots__:
        if slot not in _OWN_SLOTS and hasattr(entry, slot):
            setattr(new, slot, getattr(entry, slot))
    return new


_OWN_SLOTS = frozenset({"fn", "traces", "backward_traces", "__weakref__"})


class _Worker:
    """The process's one tier worker: a thread compiling hot tiers (and the
    layouts their regions meet that the rehearsal did not foresee) in the
    order they were handed over, one at a time (Inductor's compile is not
    meant to run twice at once in a process). At exit it starts no more jobs
    and the interpreter waits for the one under way (a thread killed inside
    torch can abort the process), as ``concurrent.futures`` workers are waited for."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = False
        self._unfinished = 0        # jobs handed over and not yet done
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="thunderlite-tiers", daemon=_AT_EXIT is None)
        self._thread.start()

    def submit(self, run: Callable[[], None], drop: Callable[[], None] | None = None) -> None:
        """Run ``run()`` on the worker; ``drop()`` instead if the process exits first."""
        with self._count_lock:
            self._unfinished += 1
        self._jobs.put((run, drop))

    @property
    def busy(self) -> bool:
        """Jobs are queued or running."""
        return self._unfinished > 0

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            run, drop = job
            try:
                if self._closing:
                    if drop is not None:
                        drop()
                    continue
                with compiling_beside_others():     # the caller's torch.compile'd calls run meanwhile
                    run()
            except Exception:  # noqa: BLE001 - a compile for later calls failed: they keep the torch calls
                pass
            finally:
                with self._count_lock:
                    self._unfinished -= 1

    def close(self) -> None:
        """At exit: drop the jobs not started, and let the thread end."""
        self._closing = True
        self._jobs.put(None)


def _dropped(tier: Tier) -> None:
    tier.stay("the process exited before its hot tier compiled")
    tier.done.set()


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
