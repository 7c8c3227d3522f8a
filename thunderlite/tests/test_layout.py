"""The shape of the package (docs/architecture.md §2): no import circles, no
import of a layer above, no crowded folder. Read from the source with ``ast``,
imports inside functions included, so a circle cannot hide behind a late import."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT.name
MAX_MODULES_PER_FOLDER = 16

# bottom to top; a module may import its own layer and the ones before it
LAYERS = ["interpreter", "core", "torch", "transforms", "executors", "distributed", "frontend", "api", "dynamo",
          "report", "extend", "demo"]


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent)
        if "tests" in rel.parts:
            continue
        name = ".".join(rel.with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the thunderlite modules it imports. ``from pkg import sub``
    imports ``pkg.sub``; ``pkg`` itself only when a name is not a submodule."""
    edges = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names]
                targets.update(s for s in subs if s in mods)
                if not all(s in mods for s in subs):
                    targets.add(base)
        resolved = set()
        for t in targets:
            while t and t not in mods:
                t = t.rpartition(".")[0]
            if t and t != name:
                resolved.add(t)
        edges[name] = resolved
    return edges


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return len(LAYERS)           # thunderlite/__init__.py: the public face, above everything
    return LAYERS.index(parts[1])


def test_no_import_circles():
    edges = _imports(_modules())
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):                    # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert circles == [], "import circles: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{a} -> {b}" for a in c for b in sorted(edges[a]) if b in c) + ")"
        for c in circles)


def test_imports_point_down():
    edges = _imports(_modules())
    upward = [f"{a} -> {b}" for a in sorted(edges) for b in sorted(edges[a])
              if _layer(b) > _layer(a) and b != PACKAGE]
    assert upward == [], "imports of a layer above: " + ", ".join(upward)


def test_interpreter_and_core_stay_below():
    edges = _imports(_modules())
    for a, targets in edges.items():
        if a.startswith(f"{PACKAGE}.interpreter"):
            assert all(t.startswith(f"{PACKAGE}.interpreter") for t in targets), (a, targets)
        if a.startswith(f"{PACKAGE}.core"):
            assert all(t.startswith((f"{PACKAGE}.core", f"{PACKAGE}.interpreter")) for t in targets), (a, targets)


def test_folders_are_not_crowded():
    crowded = {}
    for folder in [ROOT, *(p for p in ROOT.rglob("*") if p.is_dir())]:
        rel = folder.relative_to(ROOT)
        if "tests" in rel.parts or "__pycache__" in rel.parts:
            continue
        n = sum(1 for f in folder.glob("*.py") if f.name != "__init__.py")
        if n > MAX_MODULES_PER_FOLDER:
            crowded[str(rel)] = n
    assert crowded == {}, f"folders holding more than {MAX_MODULES_PER_FOLDER} modules directly: {crowded}"


def test_every_package_says_what_it_may_import():
    quiet = []
    for init in ROOT.rglob("__init__.py"):
        if "tests" in init.relative_to(ROOT).parts or init.parent == ROOT:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if "import" not in doc.lower():
            quiet.append(str(init.relative_to(ROOT)))
    assert quiet == [], f"package docstrings that do not say what the package may import: {quiet}"
