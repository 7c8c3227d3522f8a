"""Regenerate docs/trace_report.png: the trace report of one training step
(forward + backward) of the nanoGPT in benchmarks/bench_training.py, shown in
headless chromium.

    python scripts/report_screenshot.py [--out docs/trace_report.png] [--html report.html]

Needs Playwright (``pip install playwright``) and a chromium on PATH (Debian:
``apt-get install chromium``); the torchcompile executor is used when available
so fusion regions show.
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))        # this checkout's thunderlite, not another installed one

import thunderlite  # noqa: E402
from thunderlite.executors.torchcompile import torchcompile_executor  # noqa: E402


def _nanogpt_module():
    spec = importlib.util.spec_from_file_location("bench_training", ROOT / "benchmarks" / "bench_training.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_report(html: Path) -> None:
    torch.manual_seed(0)
    model = _nanogpt_module().NanoGPT(vocab=96, d=64, heads=4, layers=2, ctx=32)
    executors = ["torchcompile"] if torchcompile_executor.is_available()[0] else None
    jm = thunderlite.jit(model, executors=executors)
    idx, targets = torch.randint(0, 96, (4, 32)), torch.randint(0, 96, (4, 32))
    jm(idx, targets).backward()
    thunderlite.trace_report(jm, html)


def screenshot(html: Path, out: Path, stage: str, region: str | None) -> None:
    from playwright.sync_api import sync_playwright
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        sys.exit("no chromium on PATH (Debian: apt-get install chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"file://{html}#{stage}")
        page.wait_for_selector("#view table.diff")
        if region == "auto":      # a region small enough to show whole, next to the symbols it fused
            region = page.evaluate("""() => {
                const chips = [...document.querySelectorAll('#view .region-chip')];
                const n = c => parseInt(c.textContent.split('·')[1]);
                const pick = chips.find(c => n(c) >= 4 && n(c) <= 12) || chips[0];
                return pick ? pick.dataset.region : null; }""")
        if region:
            page.click(f'#view .region-chip[data-region="{region}"]')
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(out))
        browser.close()
    if errors:
        sys.exit(f"the page logged errors: {errors}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "trace_report.png")
    ap.add_argument("--html", type=Path, default=None, help="also keep the report here")
    ap.add_argument("--stage", default="backward-1", help="stage shown (its id, e.g. forward-3)")
    ap.add_argument("--region", default="auto", help="region highlighted (its id; 'auto'; '' for none)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        html = (args.html or Path(tmp) / "report.html").resolve()
        write_report(html)
        screenshot(html, args.out.resolve(), args.stage, args.region or None)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
