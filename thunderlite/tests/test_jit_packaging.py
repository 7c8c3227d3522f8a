"""The repository as a product: the README's two commands, .ci/run running the
README's test command, the demo, and the getting-started notebook (issue 4)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)[:2]


def test_readme_opens_with_demo_and_test_commands():
    demo, tests = _readme_commands()
    assert "torch==2.13.0" in demo and "thunderlite.demo" in demo
    assert "torch==2.13.0" in tests and "pytest -n 2 thunderlite/tests" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci
    tests = _readme_commands()[1]
    for part in tests.split(" && "):
        assert part in ci
    assert "-eq 5" in ci          # "no tests ran" is a failure


def _setup_keyword(name: str):
    import ast
    tree = ast.parse((ROOT / "setup.py").read_text())
    return next(ast.literal_eval(kw.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                for kw in node.keywords if kw.arg == name)


def test_install_brings_numpy_and_the_test_extra_brings_the_linter():
    """Without numpy ``import torch`` itself warns "Failed to initialize NumPy" on a
    fresh install (torch's wheel does not require it); CI lints with the ruff pinned here."""
    assert "numpy" in _setup_keyword("install_requires")
    test_extra = _setup_keyword("extras_require")["test"]
    assert any(r.startswith("ruff==") for r in test_extra)
    assert "ruff check ." in _readme_commands()[1]


def test_demo_prints_its_summary_after_a_short_trace_excerpt(capsys):
    from thunderlite.demo import main
    assert main(["--layers", "1", "--iters", "2", "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    excerpt, summary = out.split("\nGPT (1 layers)", 1)
    assert excerpt.startswith("# Constructed by") and "--full prints them all" in excerpt
    assert len(excerpt.splitlines()) < 40 and excerpt.rstrip().splitlines()[-1].startswith("  return ")
    assert "matches eager" in summary and "median of 3 interleaved rounds" in summary
    assert "torch.compile" in summary and "what ran where:" in summary and "torch executor" in summary
    # a time per variant; the others also as a ratio to eager's
    timed = dict(re.findall(r"^  (eager|thunderlite|torch\.compile) forward.*?:\s+([0-9.]+) ms", summary, re.M))
    ratios = dict(re.findall(r"^  (thunderlite|torch\.compile) forward.*\(([0-9.]+)x eager\)", summary, re.M))
    assert {"eager", "thunderlite"} <= set(timed) and all(float(v) > 0 for v in timed.values()), summary
    assert set(ratios) == set(timed) - {"eager"} and all(float(v) > 0 for v in ratios.values()), summary


def test_demo_times_every_variant_warm_and_interleaved():
    # as benchmarks/bench_training.py: no variant is timed before all are warm, the order rotates
    # each round, and a ratio is the median of the per-round ratios
    from thunderlite.demo import paired_ratio, time_interleaved
    calls = []
    fns = {n: (lambda n=n: calls.append(n)) for n in ("a", "b", "c")}
    times = time_interleaved(fns, rounds=3, iters=2, warmup=1)
    assert calls == ["a", "b", "c"] + ["a", "a", "b", "b", "c", "c"] + ["b", "b", "c", "c", "a", "a"] \
        + ["c", "c", "a", "a", "b", "b"]
    assert {n: len(t) for n, t in times.items()} == {"a": 3, "b": 3, "c": 3}
    # a round under load slows both sides of its ratio alike: the paired ratio stays 0.5
    assert paired_ratio([1.0, 10.0, 1.1], [2.0, 20.0, 2.0]) == 0.5


def test_demo_full_prints_the_whole_trace(capsys):
    from thunderlite.demo import main
    assert main(["--layers", "1", "--iters", "1", "--full", "--no-torch-compile"]) == 0
    out = capsys.readouterr().out
    trace = out.split("\nGPT (1 layers)", 1)[0]
    assert "more lines" not in trace and len(trace.splitlines()) > 100
    assert "torch.compile" not in out.split("\nGPT (1 layers)", 1)[1]


def _code_cells() -> list[str]:
    nb = json.loads((ROOT / "notebooks" / "getting_started.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_are_committed_executed_with_outputs_and_cell_ids(path):
    """Readable on a web viewer: nbformat 4.5+, every cell has an id, every code
    cell ran in order (scripts/execute_notebooks.py) and none raised."""
    nb = json.loads(path.read_text())
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5)
    assert all(c.get("id") for c in nb["cells"])
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), \
        "run python scripts/execute_notebooks.py and commit the result"
    assert all(c["outputs"] for c in code), "every code cell shows what it did"
    assert all(o["output_type"] != "error" for c in code for o in c["outputs"])


def test_getting_started_notebook_executes():
    nbformat = pytest.importorskip("nbformat", reason="nbformat is in the test extra")
    try:
        import ipykernel  # noqa: F401
        from nbclient import NotebookClient
    except ImportError:
        NotebookClient = None
    if NotebookClient is not None:
        nb = nbformat.read(ROOT / "notebooks" / "getting_started.ipynb", as_version=4)
        try:
            NotebookClient(nb, timeout=300, kernel_name="python3",
                           resources={"metadata": {"path": str(ROOT)}}).execute()
            return
        except Exception as e:  # no usable kernel here: run the same cells in-process below
            if "kernel" not in str(e).lower():
                raise
    namespace: dict = {}
    for src in _code_cells():
        exec(compile(src, "getting_started.ipynb", "exec"), namespace)
