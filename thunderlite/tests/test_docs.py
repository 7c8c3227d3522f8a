"""The docs live in the repo (issue 15): docs/architecture.md exists with its
sections, every reference to it names a section it has, and nothing in the
repository points at a design document outside it."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCH = ROOT / "docs" / "architecture.md"
OUTSIDE = re.compile(r"shared/|DESIGN\.md|STYLE\.md")


def _repo_text_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    for pattern in ("thunderlite/**/*.py", "thunderlite/**/*.md", "docs/*.md", "benchmarks/*.py",
                    "notebooks/*.ipynb"):
        files += ROOT.glob(pattern)
    return [p for p in files if p.resolve() != Path(__file__).resolve()]


def _sections() -> dict[int, str]:
    return {int(n): title for n, title in re.findall(r"^## (\d+)\. (.+)$", ARCH.read_text(), re.M)}


def test_architecture_has_one_section_per_area():
    titles = " / ".join(_sections().values()).lower()
    for area in ("layers", "life of a call", "ir", "aliasing", "executors", "pipeline", "cache",
                 "autodiff", "public api"):
        assert area in titles, area


def test_no_reference_to_a_document_outside_the_repo():
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in _repo_text_files()
                 for i, line in enumerate(p.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert offenders == []


def test_references_to_architecture_sections_exist():
    sections = _sections()
    refs = [(p, int(n)) for p in _repo_text_files()
            for n in re.findall(r"architecture\.md §(\d+)", p.read_text())]
    assert refs, "docstrings point to docs/architecture.md"
    assert [f"{p.relative_to(ROOT)} §{n}" for p, n in refs if n not in sections] == []


def test_readme_and_contributing_point_to_the_architecture():
    for name in ("README.md", "CONTRIBUTING.md"):
        assert "docs/architecture.md" in (ROOT / name).read_text(), name


def test_readme_lists_every_public_name_and_links_what_exists():
    import thunderlite
    readme = (ROOT / "README.md").read_text()
    api = readme[readme.index("## Public API"):readme.index("## How it compares")]
    missing = [n for n in thunderlite.__all__ if n != "__version__" and f"`{n}" not in api]
    assert missing == []
    for sub in ("thunderlite.extend", "thunderlite.dynamo", "thunderlite.distributed"):
        assert f"`{sub}`" in api
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    assert {"docs/architecture.md", "notebooks/getting_started.ipynb", "benchmarks/"} <= set(links)
    assert [link for link in links if not (ROOT / link).exists()] == []
    compares = readme[readme.index("## How it compares"):]
    assert "Lightning Thunder" in compares and "torch.compile" in compares and "bench_overhead.py" in compares
