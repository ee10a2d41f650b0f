"""The HTML report in a real browser: headless Chromium (Debian package) driven by playwright.

No console errors, no request leaves file://, every section is there, the timeline has the
expected lanes, hover shows a kernel's name and duration, hostile names stay text. Screenshots
(light, dark, print) go to test-artifacts/ for a human to look at."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from analyzer.api import DiagnoseOptions, Result, diagnose
from analyzer.reports.html import HtmlRenderer
from builders import TraceBuilder

CHROMIUM = os.environ.get("TRACECLIFF_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces" / "synthetic"
SECTIONS = {"verdict": "Verdict", "ranks": "Where the time went", "timeline": "Timeline",
            "findings": "Findings", "collectives": "Collectives", "scaling": "Scaling what-if",
            "models": "Models appendix", "deep-dive": "Deep dive"}
STRAGGLER = 5  # SCENARIOS["ddp_straggler"].straggler_rank
HOSTILE = "</script><script>alert(1)</script><img src=x onerror=alert(2)>\u2028"


def _browser_or_skip():
    if not (os.path.exists(CHROMIUM) and shutil.which(CHROMIUM)):
        if os.environ.get("CI"):
            pytest.fail(f"chromium missing at {CHROMIUM}: CI must install it (apt-get install chromium)")
        pytest.skip(f"chromium not installed at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("playwright is not installed")
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield instance
        instance.close()


class Page:
    """A loaded report with everything the page did on the way: console, requests, dialogs."""

    def __init__(self, browser, path: Path, color_scheme: str = "light"):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900}, color_scheme=color_scheme)
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

        def route(r):
            self.requests.append(r.request.url)
            r.continue_() if r.request.url.startswith("file://") else r.abort()

        self.page.route("**/*", route)
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")

    def close(self):
        self.page.close()


def _write_report(tmp: Path, paths, name: str, **doc_changes) -> Path:
    result = diagnose([str(p) for p in paths], DiagnoseOptions(workers=1))
    doc = result.to_dict()
    doc.update(doc_changes)
    out = tmp / f"{name}.html"
    out.write_text(HtmlRenderer().render(Result.from_dict(doc)), encoding="utf-8")
    return out


def _sample_job(tmp: Path, name: str) -> list[Path]:
    """The committed synthetic sample, else the same scenario generated afresh."""
    paths = sorted((SAMPLES / name).glob("rank-*.json.gz"))
    if paths:
        return paths
    from analyzer.synth import SCENARIOS, write_job
    write_job(SCENARIOS[name], tmp / name)
    return sorted((tmp / name).glob("rank-*.json.gz"))


@pytest.fixture(scope="module")
def straggler_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("straggler")
    return _write_report(tmp, _sample_job(tmp, "ddp_straggler"), "straggler")


@pytest.fixture(scope="module")
def oversized_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("oversized")
    return _write_report(tmp, _sample_job(tmp, "ddp_bucket_oversized"), "oversized")


def test_report_loads_offline_with_every_section(browser, straggler_report):
    view = Page(browser, straggler_report)
    try:
        assert view.errors == [] and view.dialogs == []
        assert view.requests == [straggler_report.as_uri()]  # the file itself, nothing else
        for section_id, heading in SECTIONS.items():
            section = view.page.locator(f"section#{section_id}")
            assert section.count() == 1 and heading in section.locator("h2").inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        view.page.screenshot(path=str(ARTIFACTS / "html-report-light.png"), full_page=True)
        view.page.locator("section#timeline").screenshot(path=str(ARTIFACTS / "html-timeline.png"))
    finally:
        view.close()


def test_timeline_lanes_and_hover(browser, straggler_report):
    """Three ranks (straggler, typical, fastest), each with its compute and its NCCL stream."""
    view = Page(browser, straggler_report)
    try:
        ranks = view.page.locator("#timeline-svg g.tl-rank")
        assert ranks.count() == 3
        assert ranks.first.get_attribute("data-rank") == str(STRAGGLER)  # the scenario's straggler, first
        kinds = [ranks.nth(i).locator("g.lane").evaluate_all("els => els.map(e => e.dataset.kind)")
                 for i in range(3)]
        assert kinds == [["compute", "NCCL"]] * 3
        nccl = view.page.locator("#timeline-svg g.lane[data-kind=NCCL] rect[data-n]").first
        nccl.hover()
        tip = view.page.locator("#tc-tip")
        assert tip.is_visible()
        text = tip.inner_text()
        assert text.startswith("ncclDevKernel_AllReduce") and ("µs" in text or " ms" in text)
        assert view.page.locator("#timeline-svg rect.shade").count() > 0  # exposed comm shaded
        assert view.errors == []
    finally:
        view.close()


def test_dark_and_print_renderings(browser, straggler_report):
    view = Page(browser, straggler_report, color_scheme="dark")
    try:
        background = view.page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
        assert background == "rgb(20, 23, 29)"
        ARTIFACTS.mkdir(exist_ok=True)
        view.page.screenshot(path=str(ARTIFACTS / "html-report-dark.png"), full_page=True)
        view.page.emulate_media(media="print", color_scheme="light")
        assert view.page.locator("nav").is_hidden()
        view.page.evaluate("window.dispatchEvent(new Event('beforeprint'))")
        assert view.page.locator("details").count() > 0
        assert view.page.locator("details:not([open])").count() == 0  # folded parts print open
        view.page.screenshot(path=str(ARTIFACTS / "html-report-print.png"), full_page=True)
        assert view.errors == []
    finally:
        view.close()


def test_hostile_names_stay_text(browser, tmp_path):
    b = TraceBuilder(rank=0, world_size=1, pg_ranks=(0,), host=HOSTILE)
    b.doc["distributedInfo"]["pg_config"][0]["pg_desc"] = HOSTILE
    b.cpu("ProfilerStep#1", 990, 200, cat="user_annotation")
    b.kernel(HOSTILE, 1000, 50, launch_ts=991)
    b.kernel("ncclDevKernel_AllReduce" + HOSTILE, 1040, 30, stream=20, launch_ts=993)
    finding = {"rule": "x", "severity": "error", "title": HOSTILE, "summary": HOSTILE, "model": HOSTILE,
               "evidence": {HOSTILE: HOSTILE}, "fix": {"text": HOSTILE, "snippet": HOSTILE}, "references": [HOSTILE]}
    report = _write_report(tmp_path, [b.write(tmp_path / "rank-0.json")], "hostile", verdict=HOSTILE,
                           findings=[finding])
    view = Page(browser, report)
    try:
        assert view.dialogs == [] and view.errors == []
        assert view.requests == [report.as_uri()]  # <img src=x> never became an element
        assert view.page.locator("img").count() == 0 and view.page.locator("script").count() == 2
        assert "</script><script>alert(1)</script>" in view.page.locator("#findings").inner_text()
        view.page.locator("#timeline-svg g.lane[data-kind=compute] rect[data-n]").first.hover()
        assert view.page.locator("#tc-tip").inner_text().startswith(HOSTILE.replace("\u2028", ""))
    finally:
        view.close()


def test_findings_cards_and_scaling_chart(browser, oversized_report):
    """ddp_bucket_oversized: the bucket finding's card links to the bucket model in the appendix;
    the what-if chart (when the what-if model is present) draws measured, projection and fix."""
    view = Page(browser, oversized_report)
    try:
        card = view.page.locator("article.card[data-rule=ddp-bucket-oversized]")
        assert card.count() == 1 and "Predicted gain" in card.inner_text()
        assert "bucket_cap_mb=" in card.locator("pre.fix").inner_text()
        card.locator("a[href='#model-buckets']").first.click()
        assert view.page.locator("#model-buckets").is_visible()
        if view.page.locator("#scaling-svg").count():
            kinds = view.page.locator("#scaling-svg g[class^=series-]").evaluate_all(
                "els => els.map(e => e.getAttribute('class'))")
            assert kinds == ["series-measured", "series-projection", "series-fix"]
        assert view.errors == [] and view.requests == [oversized_report.as_uri()]
        ARTIFACTS.mkdir(exist_ok=True)
        view.page.locator("#findings").screenshot(path=str(ARTIFACTS / "html-findings.png"))
        view.page.locator("#scaling").screenshot(path=str(ARTIFACTS / "html-scaling.png"))
    finally:
        view.close()


def test_real_cpu_only_traces(browser, tmp_path):
    """Real gloo traces (no GPU): every section renders, the GPU ones say why they are empty."""
    report = _write_report(tmp_path, sorted((SAMPLES.parent / "cpu_gloo" / "fsdp2").glob("*.json.gz")), "gloo")
    view = Page(browser, report)
    try:
        assert view.errors == [] and view.requests == [report.as_uri()]
        assert "no GPU kernels" in view.page.locator("#timeline").inner_text()
        assert view.page.locator("#collectives table.buckets").count() >= 1
        assert view.page.locator("#collectives table.groups a").count() >= 1
    finally:
        view.close()


def test_group_links_open_folded_groups(browser, tmp_path):
    """HSDP on 16 ranks has 10 process groups: 2 open, the others folded until their link is used."""
    report = _write_report(tmp_path, _sample_job(tmp_path, "fsdp_hybrid_2node"), "hsdp")
    view = Page(browser, report)
    try:
        groups = view.page.locator("details.group")
        assert groups.count() == 10 and view.page.locator("details.group[open]").count() == 2
        folded = view.page.locator("details.group:not([open])").first
        group_id = folded.get_attribute("id")
        view.page.locator(f"table.groups a[href='#{group_id}']").click()
        # The page opens it on the hash change, which fires after the click returns: wait for it
        # (a timeout here is the failure).
        view.page.wait_for_selector(f"details#{group_id}[open]", state="attached", timeout=5000)
        assert view.page.locator(f"details#{group_id}").get_attribute("open") is not None
        # Folded again by hand, the same link (no hash change now) opens it again.
        view.page.evaluate(f"document.getElementById('{group_id}').open = false")
        view.page.locator(f"table.groups a[href='#{group_id}']").click()
        view.page.wait_for_selector(f"details#{group_id}[open]", state="attached", timeout=5000)
        assert view.errors == []
    finally:
        view.close()


# Raw structured data a reader should never see in a card: JSON objects or lists, nulls.
RAW = ("{\"", "\": ", "[[", "null", "None", "NaN")


@pytest.mark.parametrize("name", ["ddp_straggler", "ddp_host_sync_stall", "ddp_bucket_oversized",
                                  "fsdp_fullshard_2node", "ddp_healthy_8r"])
def test_finding_cards_show_no_raw_data_and_stragglers_only_where_found(browser, tmp_path, name):
    """Each finding card renders its evidence as tables and lists with units (no raw JSON, no
    null); the straggler mark ▲ and the timeline's straggler role appear on a rank only when a
    straggler-rank finding names it, so a healthy job shows none."""
    paths = _sample_job(tmp_path, name)
    result = diagnose([str(p) for p in paths], DiagnoseOptions(workers=1))
    report = tmp_path / f"{name}.html"
    report.write_text(HtmlRenderer().render(result), encoding="utf-8")
    named = sorted({r for f in result.findings if f["rule"] == "straggler-rank" for r in f["ranks"]})
    view = Page(browser, report)
    try:
        cards = view.page.locator("article.card")
        assert cards.count() == len(result.findings)
        for i in range(cards.count()):
            text = cards.nth(i).inner_text()
            assert not any(raw in text for raw in RAW), (name, i, [raw for raw in RAW if raw in text])
        marked = view.page.locator("#ranks text.straggler-label").evaluate_all(
            "els => els.map(e => e.closest('g.rank-row').dataset.rank)")
        assert sorted(map(int, marked)) == named
        roles = view.page.locator("#timeline-svg g.tl-rank text.straggler-label").count()
        assert roles == (1 if named else 0)
        if name == "ddp_healthy_8r":
            assert not result.findings and not marked and "No scaling problem found" in result.verdict
        assert view.errors == []
    finally:
        view.close()
