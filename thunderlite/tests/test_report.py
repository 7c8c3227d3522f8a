"""thunderlite.trace_report: the HTML file's content, and the page in a real
headless browser (Debian's ``chromium`` driven by Playwright; skipped with the
reason where either is missing)."""
from __future__ import annotations

import json
import re
import shutil
from itertools import pairwise

import pytest
import torch

import thunderlite
from thunderlite.core.tags import Tag
from thunderlite.executors.torchcompile import torchcompile_executor


def _mlp_step(x, w1, w2):
    h = torch.tanh(x @ w1)                 # the user's lines the report links to
    return ((h @ w2) * 0.5 + 1.0).sum()


def _run(executors=None):
    torch.manual_seed(0)
    w1 = torch.randn(16, 32, requires_grad=True)
    w2 = torch.randn(32, 8, requires_grad=True)
    jf = thunderlite.jit(_mlp_step, executors=executors)
    jf(torch.randn(4, 16), w1, w2).backward()
    return jf


def _data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def _stage_ids(jf) -> list[str]:
    out = []
    for group, traces in (("forward", thunderlite.last_traces(jf)), ("backward", thunderlite.last_backward_traces(jf)),
                          ("prologue", thunderlite.last_prologue_traces(jf))):
        out += [f"{group}-{i}" for i in range(len(traces))]
    return out


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    """The report of a call whose traces have fusion regions (torchcompile) when a
    C++ compiler is there for Inductor; else of a call run by the torch executor."""
    ok, reason = torchcompile_executor.is_available()
    jf = _run(["torchcompile"] if ok else None)
    path = thunderlite.trace_report(jf, tmp_path_factory.mktemp("report") / "fused.html")
    return jf, path, reason


def _fusion_of(jf):
    fusions = [b for b in thunderlite.last_traces(jf)[-1].bound_symbols if Tag.FUSION in b.sym.tags]
    if not fusions:
        reason = torchcompile_executor.is_available()[1] or "available, but it formed no region"
        pytest.skip(f"no fusion region to show (torchcompile executor: {reason})")
    return fusions[0]


def test_report_file_is_self_contained_and_holds_every_stage(tmp_path):
    jf = _run()
    path = thunderlite.trace_report(jf, tmp_path / "r.html")
    html = open(path, encoding="utf-8").read()
    # nothing to fetch: no external script, style sheet, image or font
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert "<link" not in html and "@import" not in html and "url(http" not in html
    data = _data(html)
    stages = [s for g in data["groups"] for s in g["stages"]]
    assert [s["id"] for s in stages] == _stage_ids(jf)
    for s, trc in zip(stages, thunderlite.last_traces(jf) + thunderlite.last_backward_traces(jf)
                      + thunderlite.last_prologue_traces(jf), strict=True):
        assert s["stage"] == trc.stage and len(s["rows"]) == len(trc.bound_symbols)
    # every symbol of the final forward trace is claimed by the torch executor or runs its own impl
    final = stages[len(thunderlite.last_traces(jf)) - 1]
    for row in final["rows"]:
        assert row["kind"] in ("del", "return") or row["ex"] == "torch" or row.get("own"), row
    # the user's lines are linked: the source table names this file and its line text
    lines = {(s["file"], s["text"]) for s in data["sources"]}
    assert (__file__, "h = torch.tanh(x @ w1)                 # the user's lines the report links to") in lines
    assert set(data["memory"]) == {"forward", "backward"}
    assert "<svg" in html and 'class="memchart"' in html


def test_report_diff_to_previous_stage_matches_the_traces(tmp_path):
    jf = _run()
    data = _data(open(thunderlite.trace_report(jf, tmp_path / "r.html"), encoding="utf-8").read())
    fw = data["groups"][0]["stages"]
    for prev, cur in pairwise(fw):
        a, b = [r["code"] for r in prev["rows"]], [r["code"] for r in cur["rows"]]
        rebuilt = []
        for tag, i1, i2, j1, j2 in cur["diff"]:
            if tag == "equal":
                assert a[i1:i2] == b[j1:j2]
            rebuilt += b[j1:j2]
        assert rebuilt == b


def test_report_colours_fusion_regions_in_every_stage(fused):
    jf, path, _ = fused
    fusion = _fusion_of(jf)
    data = _data(open(path, encoding="utf-8").read())
    rid = fusion.sym.id
    assert rid in data["regions"]
    [before] = [s for s in data["groups"][0]["stages"] if s["stage"] == "split_forward_backward (forward)"]
    tagged = [r for r in before["rows"] if r["region"] == rid]
    assert len(tagged) == len(fusion.subsymbols) > 0
    assert all(r["ex"] is None for r in tagged)        # not claimed yet there
    final = data["groups"][0]["stages"][-1]
    [row] = [r for r in final["rows"] if r["region"] == rid]
    assert row["kind"] == "fusion" and row["ex"] == "torchcompile" and len(row["members"]) == len(fusion.subsymbols)


def test_trace_report_refuses_what_is_not_jitted(tmp_path):
    with pytest.raises(TypeError, match="thunderlite.jit"):
        thunderlite.trace_report(lambda x: x, tmp_path / "r.html")
    with pytest.raises(RuntimeError, match="not been called"):
        thunderlite.trace_report(thunderlite.jit(lambda x: x), tmp_path / "r.html")


# --- in a real browser -----------------------------------------------------------------------------

def _chromium():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright)")
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
    if exe is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium); the report is not checked in a browser")
    return sync_playwright, exe


@pytest.fixture(scope="module")
def page_of(fused):
    sync_playwright, exe = _chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        problems, fetched = [], []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("request", lambda r: fetched.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
        page.goto("file://" + str(fused[1]))
        page.wait_for_selector("#view table.diff")
        yield page, problems, fetched
        browser.close()


def test_page_loads_without_console_errors_or_network(page_of):
    page, problems, fetched = page_of
    assert problems == []
    assert fetched == []
    assert page.locator("#legend .chip").count() >= 2        # executors, then the region count


def test_every_stage_is_present_and_renders_all_its_symbols(page_of, fused):
    page, problems, _ = page_of
    jf = fused[0]
    ids = _stage_ids(jf)
    assert page.eval_on_selector_all("nav button", "bs => bs.map(b => b.dataset.stage)") == ids
    traces = thunderlite.last_traces(jf) + thunderlite.last_backward_traces(jf) + thunderlite.last_prologue_traces(jf)
    page.uncheck("#opt-changes")
    for sid, trc in zip(ids, traces, strict=True):
        page.click(f'nav button[data-stage="{sid}"]')
        assert page.get_attribute("#view", "data-stage") == sid
        assert trc.stage in page.inner_text("#view .stagehead h2")
        assert page.locator("#view td.c.R[data-i]").count() == len(trc.bound_symbols)
    assert problems == []


def test_clicking_a_region_highlights_its_symbols(page_of, fused):
    page, problems, _ = page_of
    jf = fused[0]
    traces = thunderlite.last_traces(jf)
    fusion = _fusion_of(jf)
    rid = fusion.sym.id
    stages = [t.stage for t in traces]
    claimed = f"forward-{stages.index('claim_executors')}"     # the claiming stage, next to the one before it
    page.click(f'nav button[data-stage="{claimed}"]')
    assert page.locator("#view td.c.hl").count() == 0
    page.click(f'#view .region-chip[data-region="{rid}"]')
    right = page.locator("#view td.c.R.hl")
    left = page.locator("#view td.c.L.hl")
    # this stage: the fusion symbol and, expanded under it, every symbol of the region;
    # the stage before: the same symbols, not yet fused
    assert right.count() == 1 + len(fusion.subsymbols)
    assert rid.split(".")[-1] in right.first.inner_text()
    assert left.count() == len(fusion.subsymbols)
    member_code = {b.sym.name for b in fusion.subsymbols}
    assert all(any(n in t for n in member_code) for t in left.all_inner_texts())
    page.click(f'#view .region-chip[data-region="{rid}"]')        # a second click clears it
    assert page.locator("#view td.c.hl").count() == 0
    assert problems == []


def test_memory_chart_and_source_lines_link_to_symbols(page_of, fused):
    page, problems, _ = page_of
    jf = fused[0]
    bw = thunderlite.last_backward_traces(jf)
    hit = page.locator(f'.memchart rect.hit[data-stage="backward-{len(bw) - 1}"]').last
    row = int(hit.get_attribute("data-row"))
    hit.click()
    assert page.get_attribute("#view", "data-stage") == f"backward-{len(bw) - 1}"
    assert page.locator(f'#view tr.flash td.c.R[data-i="{row}"]').count() == 1
    # the first stage: each group of symbols under the user's line it came from; clicking the
    # line marks exactly the symbols recorded from it
    page.click('nav button[data-stage="forward-0"]')
    src = page.locator("#view tr.src", has_text="torch.tanh(x @ w1)")
    assert src.count() == 1 and "test_report.py:" in src.inner_text()
    src.click()
    from_line = [b for b in thunderlite.last_traces(jf)[0].bound_symbols
                 if b.source is not None and b.source[2].startswith("h = torch.tanh(x @ w1)")]
    assert len(from_line) == 2                          # matmul and tanh
    assert page.locator("#view td.c.srchl").count() == len(from_line)
    title = page.locator("#view td.c.srchl").first.get_attribute("title")
    assert f"from {__file__}:{from_line[0].source[1]}" in title       # each symbol names its line
    assert problems == []


def test_library_lines_name_the_users_line_that_called_them(tmp_path):
    # F.linear is recorded from torch's nn.Linear.forward; the report also names the line here
    lin = torch.nn.Linear(4, 3)

    def f(x):
        return lin(x).relu()                    # the line the report must find
    jf = thunderlite.jit(f)
    jf(torch.randn(2, 4))
    data = _data(open(thunderlite.trace_report(jf, tmp_path / "r.html"), encoding="utf-8").read())
    lib = [s for s in data["sources"] if s["library"] and "linear" in s["text"]]
    assert lib, data["sources"]
    assert lib[0]["user"][0] == __file__
    assert lib[0]["user"][2] == "return lin(x).relu()                    # the line the report must find"
    assert lib[0]["stack"][-1][:2] == [lib[0]["file"], lib[0]["line"]]
