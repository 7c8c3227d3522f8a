"""Execute the notebooks in place so they are committed with their outputs.

    python scripts/execute_notebooks.py [notebooks/getting_started.ipynb ...]

Runs every cell with a real Jupyter kernel (nbclient), from the repository root
so the notebooks import this checkout's thunderlite, and writes nbformat 4.5
(every cell has an id). Exits 1 if a cell raises."""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.nbformat, nb.nbformat_minor = 4, max(5, nb.get("nbformat_minor", 0))
    _, nb = nbformat.validator.normalize(nb)          # adds missing cell ids
    nb = nbformat.from_dict(nb)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    nbformat.validate(nb)
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in paths:
        print(f"executing {path.relative_to(ROOT) if path.is_absolute() else path}", flush=True)
        execute(path.resolve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
