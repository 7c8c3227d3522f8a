"""Every tensor a program reaches is traced with its provenance, whatever route
reaches it: container x route x use, each against eager.

Containers hold the tensors (module containers, plain lists and dicts on a
module, ``parameters()``/``buffers()``/``named_*()``/``state_dict()``); routes
walk them (a ``for`` loop, and the builtins and itertools functions that
iterate natively: ``zip``, ``map``, ``enumerate``, ``filter``, ``reversed``,
``sorted``, ``itertools.chain``, ``list()``/``tuple()``, ``functools.reduce``,
``iter``/``next``); uses are an in-place write under ``no_grad`` (the
container's state afterwards must equal eager's), a read, and a read after the
tensors changed between two calls (a tensor baked into the trace as a constant
shows up there). Each runs from a module's ``forward`` and from a function
taking the module, with the default executors, and (for a subset) a randomly
reordering fusion executor, ``torchcompile`` and ``triton``."""
from __future__ import annotations

import copy
import functools
import itertools

import pytest
import torch

import thunderlite
from thunderlite.tests.test_fuzz_inplace_jit import ShuffleFusion

# container -> (how the module holds it, the iterable a route walks, item -> tensor)
CONTAINERS = {
    "ParameterList": ("nn.ParameterList", "self.c", "x"),
    "ParameterDict": ("nn.ParameterDict", "self.c.values()", "x"),
    "ParameterDict.items": ("nn.ParameterDict", "self.c.items()", "x[1]"),
    "ModuleList": ("nn.ModuleList", "self.c", "x.weight"),
    "Sequential": ("nn.Sequential", "self.c", "x.weight"),
    "list": ("list", "self.c", "x"),
    "dict": ("dict", "self.c.values()", "x"),
    "parameters()": ("nn.ModuleList", "self.c.parameters()", "x"),
    "named_parameters()": ("nn.ModuleList", "self.c.named_parameters()", "x[1]"),
    "buffers()": ("buffers", "self.c.buffers()", "x"),
    "state_dict()": ("nn.ModuleList", "self.c.state_dict().values()", "x"),
}

# route -> statement walking ITER and calling use(item) on each item
ROUTES = {
    "for": "for x in ITER:\n    use(GET)",
    "zip": "for x, _ in zip(ITER, range(100)):\n    use(GET)",
    "map": "list(map(lambda x: use(GET), ITER))",
    "enumerate": "for _, x in enumerate(ITER):\n    use(GET)",
    "filter": "for x in filter(lambda x: True, ITER):\n    use(GET)",
    "sorted": "for x in sorted(ITER, key=lambda x: 0):\n    use(GET)",
    "chain": "for x in itertools.chain(ITER, ()):\n    use(GET)",
    "list()": "for x in list(ITER):\n    use(GET)",
    "tuple()": "for x in tuple(ITER):\n    use(GET)",
    "reduce": "functools.reduce(lambda acc, x: (use(GET), acc)[1], ITER, 0)",
    "iter/next": ("it = iter(ITER)\nwhile True:\n    try:\n        x = next(it)\n    except StopIteration:\n"
                  "        break\n    use(GET)"),
    "reversed": "for x in reversed(list(ITER) if isinstance(ITER, dict) else ITER):\n    use(GET)",
}
_REVERSIBLE = {"ParameterList", "ModuleList", "Sequential", "list"}

USES = ("write", "read", "changed")


def _make_container(kind: str):
    ts = [torch.randn(3) for _ in range(3)]
    if kind == "nn.ParameterList":
        return torch.nn.ParameterList([torch.nn.Parameter(t, requires_grad=False) for t in ts])
    if kind == "nn.ParameterDict":
        return torch.nn.ParameterDict({f"p{i}": torch.nn.Parameter(t, requires_grad=False)
                                       for i, t in enumerate(ts)})
    if kind in ("nn.ModuleList", "nn.Sequential"):
        layers = [torch.nn.Linear(3, 3, bias=False).requires_grad_(False) for _ in ts]
        return torch.nn.ModuleList(layers) if kind == "nn.ModuleList" else torch.nn.Sequential(*layers)
    if kind == "list":
        return ts
    if kind == "dict":
        return {f"t{i}": t for i, t in enumerate(ts)}
    holder = torch.nn.Module()
    for i, t in enumerate(ts):
        holder.register_buffer(f"b{i}", t)
    return holder


def _program(container: str, route: str, use: str, form: str):
    holds, iterable, get = CONTAINERS[container]
    stmt = ROUTES[route].replace("ITER", iterable).replace("GET", get)
    if use == "write":
        use_def = "def use(t):\n    with torch.no_grad():\n        t.mul_(0.5).add_(1.0)\n    return t"
        tail = "return None"
    else:
        use_def = "def use(t):\n    acc.append(t.sum())\n    return t"
        tail = "return torch.stack(acc).sum()"
    body = "acc = []\n" + use_def + "\n" + stmt + "\n" + tail
    indented = "\n".join("        " + line for line in body.splitlines())
    src = ("import functools, itertools, torch\n"
           "class M(torch.nn.Module):\n"
           "    def __init__(self, c):\n"
           "        super().__init__()\n"
           "        self.c = c\n"
           "    def forward(self):\n"
           f"{indented}\n"
           "def run(m):\n"
           "    return m()\n")
    if form == "function":
        src += "def run_fn(self):\n" + "\n".join("    " + line for line in body.splitlines()) + "\n"
    ns: dict = {}
    exec(compile(src, f"<provenance {container} {route} {use} {form}>", "exec"), ns)
    return ns, holds


def _tensors(m) -> list[torch.Tensor]:
    c = m.c
    if isinstance(c, dict):
        return list(c.values())
    if isinstance(c, list):
        return list(c)
    return [t for t in itertools.chain(c.parameters(), c.buffers())]


def _check(container: str, route: str, use: str, form: str, executors) -> None:
    ns, holds = _program(container, route, use, form)
    torch.manual_seed(0)
    eager_m = ns["M"](_make_container(holds))
    jit_m = copy.deepcopy(eager_m)
    if form == "module":
        eager_call, jitted = eager_m, thunderlite.jit(jit_m, executors=executors)
        jit_call = jitted
    else:
        f = ns["run_fn"]
        eager_call = functools.partial(f, eager_m)
        jitted = thunderlite.jit(f, executors=executors)
        jit_call = functools.partial(jitted, jit_m)
    for call in range(3):
        if use == "changed" and call:
            with torch.no_grad():
                for a, b in zip(_tensors(eager_m), _tensors(jit_m), strict=True):
                    a.add_(float(call))
                    b.add_(float(call))
        want = eager_call()
        got = jit_call()
        where = f"{container} x {route} x {use} ({form}, {executors}), call {call}"
        if want is None:
            assert got is None, where
        else:
            torch.testing.assert_close(got, want, msg=lambda m: f"{where}: {m}")
        for a, b in zip(_tensors(eager_m), _tensors(jit_m), strict=True):
            torch.testing.assert_close(b, a, msg=lambda m: f"{where}: state differs: {m}")


_CASES = [(c, r, u) for c in CONTAINERS for r in ROUTES for u in USES
          if r != "reversed" or c in _REVERSIBLE]


@pytest.mark.parametrize("form", ["module", "function"])
@pytest.mark.parametrize("container,route,use", _CASES)
def test_every_route_to_a_tensor_is_traced(container, route, use, form):
    _check(container, route, use, form, None)


# the executors that reorder and fuse see the same programs: writes and reads
# must stay where the program put them
_FUSION_ROUTES = ("zip", "map", "list()", "reduce")


@pytest.mark.parametrize("executors", ["shuffle", "torchcompile", "triton"])
@pytest.mark.parametrize("container", list(CONTAINERS))
@pytest.mark.parametrize("route", _FUSION_ROUTES)
def test_every_route_under_fusion_executors(container, route, executors):
    exs = [ShuffleFusion(7), "torch"] if executors == "shuffle" else [executors, "torch"]
    for use in ("write", "changed"):
        _check(container, route, use, "module", exs)


def test_a_real_tensor_reached_natively_joins_the_trace():
    """A tensor returned by natively run code (``operator.attrgetter``) is no
    constant: its in-place method is traced, runs on every call, and writes the
    caller's tensor (it used to run once at trace time and be dropped)."""
    import operator

    def f(m, x):
        w = operator.attrgetter("weight")(m)
        with torch.no_grad():
            w.mul_(0.5)
        return x * w.sum()
    m = torch.nn.Linear(3, 2)
    jm = copy.deepcopy(m)
    jf = thunderlite.jit(f)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(jf(jm, x), f(m, x))
        torch.testing.assert_close(jm.weight, m.weight)
    assert any("mul" in b.sym.name for b in thunderlite.last_traces(jf)[-1].bound_symbols)


def test_an_opaque_call_that_may_write_is_never_dead_code():
    """An opaque call whose schema has a mutable argument, or that binds no ATen
    schema at all, may write although its meta run wrote nothing: DCE keeps it."""
    from thunderlite.core.tags import Tag
    from thunderlite.torch.opaque import _may_write_unseen, opaque_symbol_for
    assert _may_write_unseen(torch.Tensor.index_put_) and _may_write_unseen(torch.Tensor.tolist)
    assert not _may_write_unseen(torch.histc) and not _may_write_unseen(torch.add)
    assert Tag.DONT_DCE in opaque_symbol_for(torch.Tensor.tolist).symbol.tags
    assert Tag.DONT_DCE not in opaque_symbol_for(torch.histc).symbol.tags


def test_a_tensor_reached_without_a_path_is_an_error_naming_the_line():
    """The invariant at the recording boundary: a real tensor whose way in the
    prologue cannot take again (handed over by natively run code: here a C
    ``queue.SimpleQueue``'s ``get``) is refused with the user's line, never baked into the trace;
    the caller's tensors are untouched."""
    import queue

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.queue = queue.SimpleQueue()
            self.queue.put(torch.ones(3))
            self.register_buffer("b", torch.zeros(3))

        def forward(self, x):
            with torch.no_grad():
                self.b.add_(x)
            w = self.queue.get()
            return x * w

    m = M()
    line = r"at .*test_provenance_routes.py:\d+: return x \* w comes from"
    with pytest.raises(RuntimeError, match=r"cannot tell where a tensor \(\(3,\), torch.float32\) " + line):
        thunderlite.jit(m)(torch.ones(3))
    assert torch.equal(m.b, torch.zeros(3))


def test_default_arguments_and_vars_keep_their_paths():
    """A tensor default argument is the same object on every call (its path is
    the function's ``__defaults__``); ``vars(obj)`` is ``obj.__dict__`` read
    through the attribute hooks, so a tensor replaced there is read afresh."""
    import types
    default = torch.ones(3)

    def f(x, w=default):
        with torch.no_grad():
            w.add_(1)
        return x * w
    jf = thunderlite.jit(f)
    for expected in (2.0, 3.0):
        torch.testing.assert_close(jf(torch.ones(3)), torch.full((3,), expected))
    assert torch.equal(default, torch.full((3,), 3.0))

    holder = types.SimpleNamespace(w=torch.zeros(3))

    def g(x):
        return x + vars(holder)["w"]
    jg = thunderlite.jit(g)
    torch.testing.assert_close(jg(torch.ones(3)), torch.ones(3))
    holder.w = torch.full((3,), 5.0)
    torch.testing.assert_close(jg(torch.ones(3)), torch.full((3,), 6.0))
