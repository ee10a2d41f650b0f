"""HTML report: numbers against hand-worked traces, hostile strings, missing data, size, determinism.

The browser-side checks (console, network, hover, screenshots) are in test_html_browser.py."""

from __future__ import annotations

import dataclasses
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from analyzer.api import DiagnoseOptions, Result, diagnose
from analyzer.cli.main import main
from analyzer.reports.html import TEMPLATES, HtmlRenderer, build_view
from analyzer.job.step_timeline import MAX_MARKS_PER_LANE, _downsample, timeline_data
from builders import AUTOGRAD, TraceBuilder, two_step_ddp

HOSTILE = "</script><script>alert(1)</script><img src=x onerror=alert(2)>\u2028\u2029'\"&amp;"
SECTION_IDS = ("verdict", "ranks", "timeline", "findings", "collectives", "scaling", "models", "deep-dive")


class PageParser(HTMLParser):
    """Collects what an attacker would need to change: elements, script bodies, attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.scripts: list[tuple[dict, str]] = []
        self.attrs: list[tuple[str, str]] = []
        self._in_script: dict | None = None
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(k, v or "") for k, v in attrs]
        self.ids |= {v for k, v in attrs if k == "id"}
        if tag == "script":
            self._in_script = dict(attrs)
            self.scripts.append((self._in_script, ""))

    def handle_data(self, data):
        if self._in_script is not None:
            attrs, body = self.scripts[-1]
            self.scripts[-1] = (attrs, body + data)

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = None


def parse(html: str) -> PageParser:
    parser = PageParser()
    parser.feed(html)
    return parser


def render(doc: dict) -> str:
    """A document as the page of the Result it holds (the renderer reads a Result)."""
    return HtmlRenderer().render(Result.from_dict(doc))


def html_for(paths, step=None, **options) -> tuple[str, dict, object]:
    result = diagnose([str(p) for p in paths], DiagnoseOptions(keep_timeline=True, workers=1, **options),
                      html_step=step)
    doc = result.to_dict()
    return render(doc), doc, result


@pytest.fixture()
def ddp_pair(tmp_path):
    return [two_step_ddp(rank=r).write(tmp_path / f"rank-{r}.json") for r in (0, 1)]


# ----------------------------------------------------------------------------- numbers
def test_bars_split_each_rank_step_into_its_parts(ddp_pair):
    """two_step_ddp, worked by hand: the typical step is step 1 (step 2, the last, is the drain):
    compute [0,70)+[90,95) = 75, all-reduce [60,90) on both ranks at once (no waiting), 20 µs of
    it exposed; idle [95,100) = 5: the leaves add up to the 100 µs step."""
    _, doc, _ = html_for(ddp_pair)
    bars = build_view(Result.from_dict(doc))["bars"]
    assert bars["available"] and [r["rank"] for r in bars["rows"]] == [0, 1]
    parts = bars["rows"][0]["parts"]
    assert parts == pytest.approx({"compute_only": 75.0, "wait": 0.0, "transfer": 20.0,
                                   "other": 0.0, "idle": 5.0})
    assert bars["rows"][0]["total"] == pytest.approx(100.0)
    assert [seg["key"] for seg in bars["legend"]] == ["compute_only", "wait", "transfer", "other", "idle"]


def test_timeline_typical_step_lanes_exposed_and_phases(ddp_pair):
    """Step 1 is the typical step (step 2, the last, is the drain), the one every figure quotes:
    the timeline shows it by default. Its kernels span [0,95); the all-reduce [60,90) is under
    backward compute until 70, so [70,90) is exposed."""
    html, doc, _ = html_for(ddp_pair)
    tl = doc["timeline"]
    assert tl["available"] and tl["step"] == doc["attribution"]["step"] == 1
    assert tl["span_us"] == pytest.approx(95.0) and "the typical step" in tl["note"]
    rank = tl["ranks"][0]
    assert [(lane["stream"], lane["kind"]) for lane in rank["lanes"]] == [(7, "compute"), (20, "NCCL")]
    assert rank["exposed"] == [[70.0, 90.0]]
    phases = {p["phase"]: (p["s"], p["e"]) for p in rank["phases"]}
    assert phases == {"forward": (0.0, 30.0), "backward": (30.0, 90.0), "optimizer": (90.0, 95.0)}
    names = [tl["names"][m["n"]] for lane in rank["lanes"] for m in lane["marks"]]
    assert names[0] == "sm90_xmma_gemm_bf16<128, 64>" and names[-1].startswith("ncclDevKernel_AllReduce")
    assert {r["role"] for r in tl["ranks"]} == {"slowest", "median"}
    assert "(drain step)" not in html


def test_cli_path_rereads_only_the_planned_ranks_and_step(ddp_pair):
    """Without kept timelines (the CLI's memory-saving path) the chosen ranks are read again,
    keeping only the planned step: the section is the same as from kept timelines."""
    from analyzer.rank.analysis import RankOptions
    from analyzer.job.step_timeline import report_timeline
    _, kept, _ = html_for(ddp_pair)
    result = diagnose([str(p) for p in ddp_pair], DiagnoseOptions(workers=1), report=False)
    assert all(r.timeline is None for r in result.ranks)
    doc = result.to_dict()
    assert report_timeline(doc, result, None, RankOptions()) == kept["timeline"]
    assert report_timeline(doc, result, 1, RankOptions())["step"] == 1
    ddp_pair[1].unlink()  # gone since diagnose read it: the section says so, the page stands
    gone = report_timeline(doc, result, None, RankOptions())
    assert not gone["available"] and gone["why"].startswith("could not read the kernels again: ")


def test_step_option_chooses_labels_and_explains_a_missing_step(ddp_pair):
    _, doc, _ = html_for(ddp_pair, step=1)
    assert doc["timeline"]["step"] == 1 and doc["timeline"]["note"] == "chosen with --step"
    html, doc, _ = html_for(ddp_pair, step=2)  # the drain step, on request: labelled as such
    assert doc["timeline"]["step"] == 2 and "not the typical step 1: drain" in doc["timeline"]["note"]
    assert "Step 2 (drain step)" in html
    _, doc, _ = html_for(ddp_pair, step=9)
    assert doc["timeline"]["step"] == 1 and "step 9 is not in the traces" in doc["timeline"]["note"]


def test_downsampling_is_deterministic_and_conserves_kernels():
    rng = np.random.default_rng(7)
    start = np.sort(rng.uniform(0, 10_000, 20_000))
    dur = rng.uniform(0.05, 2.0, 20_000)
    dur[::997] = 400.0  # a few wide kernels stay individual
    kind = np.zeros(20_000, dtype=int)
    name = np.arange(20_000) % 5
    marks, merge_px = _downsample(start, dur, kind, name, 10_500.0)
    again, _ = _downsample(start, dur, kind, name, 10_500.0)
    assert marks == again and len(marks) <= MAX_MARKS_PER_LANE and merge_px >= 1
    assert sum(m["c"] for m in marks) == 20_000
    assert sum(m["d"] for m in marks) == pytest.approx(dur.sum(), rel=1e-6)
    wide = [m for m in marks if m["c"] == 1 and m["d"] == 400.0]
    assert len(wide) == len(dur[::997])


def test_models_appendix_reproduces_the_worked_examples():
    """Figures stated in docs/models.md (the independent check): 25 MB all-reduce on 8 GPUs over
    NVLink 4 = 11.2 + 97.2 ≈ 108 µs; S* 360 KB and 540 KB; 7B: 112 / 38.5 / 26.25 / 14 GB static
    memory; 70B on 64: 17.5 GB, HSDP g=8: 140 GB; 4,200 tokens/s on 7B: 176.4 TFLOPS, 17.8% MFU."""
    text = re.sub(r"<[^>]+>", "", render({}))
    for expected in ("11.2 µs + 97.2 µs ≈ 108 µs", "S* = 360.0 KB", "S* = 540.0 KB",
                     "DDP 112.00 GB, ZeRO-1 38.50 GB, ZeRO-2 26.25 GB, ZeRO-3 14.00 GB",
                     "ZeRO-3 17.50 GB", "needs 140.00 GB", "176.4 TFLOPS per GPU = 17.8% MFU",
                     "DDP sends 24.50 GB per GPU per step, FULL_SHARD 36.75 GB"):
        assert expected in text, expected


# ----------------------------------------------------------------------------- robustness
def test_empty_document_renders_every_section_as_not_available():
    html = render({})
    page = parse(html)
    assert set(SECTION_IDS) <= page.ids
    assert html.count("Not available:") >= 5
    assert "could not read" not in html


def test_a_section_it_cannot_read_says_so_in_place(ddp_pair):
    """Malformed documents never reach the page (analyzer.job.saved refuses them, one line);
    a report section whose drawn data lacks what the page needs says so in that section and
    the rest of the page stands."""
    _, doc, _ = html_for(ddp_pair)
    doc["timeline"] = {"available": True}
    doc["scaling"] = {"available": True, "series": [{"points": [{"gpus": "x"}]}]}
    html = render(doc)
    assert set(SECTION_IDS) <= parse(html).ids
    assert html.count("could not read this section") == 2 and "Headline numbers" in html


def test_hostile_strings_cannot_open_tags_or_scripts(tmp_path):
    """Kernel names, host names, file paths, group descriptions and finding text all carry markup,
    quotes and U+2028/U+2029; the page keeps exactly its own two script elements."""
    b = TraceBuilder(rank=0, world_size=2, host=HOSTILE)
    b.doc["distributedInfo"]["pg_config"][0]["pg_desc"] = HOSTILE
    b.cpu("ProfilerStep#1", 990, 200, cat="user_annotation")
    b.kernel(HOSTILE, 1000, 50, launch_ts=991)
    b.cpu("record_param_comms", 992, 1, tid=AUTOGRAD, **{
        "Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000, "Group size": 2,
        "dtype": "BFloat16", "Process Group Name": "0", "Process Group Description": HOSTILE,
        "Process Group Ranks": "[0, 1]"})
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL" + HOSTILE, 1040, 30, stream=20, launch_ts=993, tid=AUTOGRAD)
    folder = tmp_path / "d'<b>x\u2028"
    folder.mkdir()
    _, doc, _ = html_for([b.write(folder / "rank-0.json")])
    doc["findings"] = [{"rule": HOSTILE, "severity": "warning", "title": HOSTILE, "summary": HOSTILE,
                        "evidence": {HOSTILE: HOSTILE, "n": [HOSTILE]}, "model": HOSTILE,
                        "fix": {"text": HOSTILE, "snippet": HOSTILE}, "references": [HOSTILE],
                        "estimated_gain_us": 5.0, "ranks": [0]}]
    doc["verdict"] = HOSTILE
    doc["stragglers"] = {"top_rank": 0, "top_rank_last_share": 1.0}
    doc["groups"] = [{"name": "0", "description": HOSTILE, "fit": HOSTILE, "alpha_us": 1.0, "beta_gbps": 10.0}]
    html = render(doc)
    page = parse(html)
    own_script = (TEMPLATES / "report.js").read_text(encoding="utf-8")
    assert [(a.get("type"), a.get("id")) for a, _ in page.scripts] == [
        ("application/json", "tc-timeline-names"), (None, None)]
    assert page.scripts[1][1] == own_script
    assert "img" not in page.tags and not any(k.startswith("on") for k, _ in page.attrs)
    names_json = page.scripts[0][1]
    assert "\u2028" not in names_json and "\u2029" not in names_json and "<" not in names_json
    assert HOSTILE in json.loads(names_json)
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown as text
    # Every field shows up as text, escaped: verdict, host, path, group, finding parts.
    assert html.count("&lt;img src=x onerror=alert(2)&gt;") >= 10


def test_bytes_are_deterministic_and_timestamp_only_on_request(ddp_pair):
    first, doc, _ = html_for(ddp_pair)
    second, _, _ = html_for(ddp_pair)
    assert first == second
    assert " on " not in first.split("<footer>")[1].split("</footer>")[0]
    stamped = HtmlRenderer(timestamp="2030-01-02 03:04 UTC").render(Result.from_dict(doc))
    assert "on 2030-01-02 03:04 UTC" in stamped


def test_no_reference_to_anything_outside_the_file(ddp_pair):
    html, _, _ = html_for(ddp_pair)
    page = parse(html)
    for key, value in page.attrs:
        if key in ("src", "href", "action", "xlink:href"):
            assert value.startswith("#"), (key, value)
    assert "@import" not in html and "url(" not in html
    assert "default-src 'none'" in html  # and the page's own policy forbids any fetch


# ----------------------------------------------------------------------------- real data, size, CLI
def test_cpu_only_traces_render_with_reasons():
    html, doc, _ = html_for(sorted((Path(__file__).parents[1] / "sample_traces/cpu_gloo/ddp").glob("*.json.gz")))
    assert "Not available: the traces hold no GPU kernels (CPU-only profile?)" in html
    assert "Not available: no GPU activity in the traces (CPU-only profile): nothing to break down" in html
    assert "CPU-side operations only" in html
    assert build_view(Result.from_dict(doc))["collectives"]["available"]


@pytest.fixture(scope="module")
def synthetic_straggler(tmp_path_factory):
    from analyzer.synth import SCENARIOS, write_job
    spec = dataclasses.replace(SCENARIOS["ddp_straggler"], n_layers=2, steps=3)
    out = tmp_path_factory.mktemp("straggler")
    write_job(spec, out)
    return sorted(out.glob("rank-*.json.gz")), spec


def test_synthetic_straggler_job_marks_the_straggler_and_stays_small(synthetic_straggler):
    paths, spec = synthetic_straggler
    html, doc, _ = html_for(paths)
    assert len(paths) == 8 and len(html.encode()) < 2_000_000
    view = build_view(Result.from_dict(doc))
    assert view["bars"]["stragglers"].keys() == {spec.straggler_rank}
    assert doc["timeline"]["ranks"][0] == dict(doc["timeline"]["ranks"][0], rank=spec.straggler_rank,
                                               role="straggler")
    group = view["collectives"]["groups"][0]
    assert group["fit"]["beta_gbps"] and group["scatter"]["line"] and group["scatter"]["s_star"]
    # the hardware table heads each value with its declared label, the key only as its tooltip
    table = html[html.index('<table class="hardware">'):html.index("</table>", html.index('<table class="hardware">'))]
    assert "<th>" not in table and '<th title="hbm_gbps">HBM bandwidth</th>' in table
    assert '<th title="memory_bytes">GPU memory</th>' in table and ">peak_tflops<" not in table


def test_cli_writes_html_alone_and_next_to_the_text_view(ddp_pair, tmp_path, capsys):
    out = tmp_path / "report.html"
    with pytest.raises(SystemExit) as done:
        main(["diagnose", *map(str, ddp_pair), "--format", "html", "-o", str(out), "--no-cache", "--workers", "1"])
    assert done.value.code == 0 and out.read_text().startswith("<!DOCTYPE html>")
    beside = tmp_path / "beside.html"
    with pytest.raises(SystemExit) as done:
        main(["diagnose", *map(str, ddp_pair), "--html", str(beside), "--step", "1", "--no-cache", "--workers", "1"])
    assert done.value.code == 0
    assert "tracecliff" in capsys.readouterr().out  # the text view still goes to stdout
    assert "Step 1 (chosen with --step)" in beside.read_text()


# ----------------------------------------------------------------------------- HTA deep dive
def test_hta_deep_dive_comes_from_hta_and_agrees_with_our_kernel_sums(tmp_path):
    """HTA's COMMUNICATION kernel time per rank is the sum of the NCCL kernel durations, which
    tracecliff measures independently (collective rows)."""
    pytest.importorskip("hta")
    from analyzer.job.hta import deep_dive
    from analyzer.synth import SCENARIOS, write_job
    spec = dataclasses.replace(SCENARIOS["ddp_healthy_8r"], world_size=2, n_layers=1, steps=2)
    write_job(spec, tmp_path)
    paths = sorted(tmp_path.glob("rank-*.json.gz"))
    result = diagnose([str(p) for p in paths], DiagnoseOptions(workers=1))
    data = deep_dive({r.rank: r.path for r in result.ranks})
    assert data["available"], data.get("why")
    assert data["source"].startswith("HolisticTraceAnalysis") and data["seconds"] > 0
    comm = {row["rank"]: row["sum_us"] for row in data["kernel_types"] if row["kernel_type"] == "COMMUNICATION"}
    ours = {r: sum(c["dur_us"] for c in result.collectives if c["rank"] == r and c["on_gpu"]) for r in (0, 1)}
    assert comm == pytest.approx(ours, rel=1e-3)
    streams = {(c["rank"], c["stream"]) for c in result.collectives}
    assert streams <= {(row["rank"], row["stream"]) for row in data["idle"]}
    assert all(row[k] >= 0 for row in data["idle"] for k in ("host_wait_us", "kernel_wait_us", "other_wait_us"))
    html = render({"hta": data})
    assert "Computed by HolisticTraceAnalysis" in html and "get_idle_time_breakdown" in html


def test_hta_missing_is_a_clear_line(monkeypatch):
    import sys
    from analyzer.job.hta import deep_dive
    monkeypatch.setitem(sys.modules, "hta.trace_analysis", None)  # import now raises ImportError
    data = deep_dive({0: "rank-0.json"})
    assert data == {"available": False,
                    "why": "HTA is not installed: pip install 'tracecliff[hta]' (holistictraceanalysis)"}
    assert "Not available: HTA is not installed" in render({"hta": data})


# ----------------------------------------------------------------------------- scaling what-if
def test_scaling_curve_from_the_whatif_model_with_the_suggested_fix(tmp_path):
    """The measured point is 100% by definition; the what-if projection of the trace onto its own
    size reproduces it (issue 3: within 5%); the suggested bucket_cap_mb, which shortens the
    exposed cross-node all-reduce tail, projects a higher efficiency than the configuration as
    measured at the measured size and beyond (below it, 4 GPUs fit in one node and the tail is
    short either way)."""
    pytest.importorskip("analyzer.whatif.projection")
    from analyzer.whatif.scaling import scaling_data
    from analyzer.synth import SCENARIOS, write_job
    write_job(SCENARIOS["ddp_bucket_oversized"], tmp_path)
    result = diagnose([str(p) for p in sorted(tmp_path.glob("rank-*.json.gz"))], DiagnoseOptions(workers=1))
    data = scaling_data(result)
    assert data["available"], data
    series = {s["kind"]: {p["gpus"]: p["efficiency"] for p in s["points"]} for s in data["series"]}
    assert series["measured"] == {8: 1.0}
    assert series["projection"][8] == pytest.approx(1.0, abs=0.05)
    assert set(series["fix"]) == set(series["projection"]) and len(series["fix"]) >= 3
    assert all(series["fix"][g] > series["projection"][g] for g in series["fix"] if g >= 8)
    view = build_view(Result.from_dict({"scaling": data}))["scaling"]
    assert view["available"] and [s["kind"] for s in view["series"]] == ["measured", "projection", "fix"]


# ----------------------------------------------------------------------------- size bounds
def _fake_rank(rank: int, timeline: dict) -> object:
    from types import SimpleNamespace
    steps = [{"step": s, "step_time_us": 100_000.0 + rank + s, "span_us": 100_000.0} for s in (1, 2, 3)]
    return SimpleNamespace(rank=rank, host=f"node{rank // 8}", timeline=timeline, steps=steps,
                           metrics={"span_us": 300_000.0})


def test_worst_case_64_rank_page_stays_under_5_mb():
    """64 ranks, 8 streams each with 30,000 kernels per step (mostly sub-pixel), 64 process
    groups of 400 collectives, 20 findings: the timeline and scatter budgets keep it small."""
    rng = np.random.default_rng(1)
    n = 240_000
    start = np.sort(rng.uniform(0, 300_000, n))
    kinds = rng.integers(0, 2, n)
    timeline = {"start_us": start.round(3).tolist(), "dur_us": rng.uniform(0.5, 40, n).round(3).tolist(),
                "stream": (7 + rng.integers(0, 8, n)).tolist(), "kind": kinds.tolist(),
                "name": rng.integers(0, 500, n).tolist(), "step": (1 + (start // 100_000)).astype(int).tolist(),
                "phase": rng.integers(0, 4, n).tolist(), "phases": ["forward", "backward", "optimizer", "other"],
                "strings": [f"kernel_{i}_" + "x" * 150 for i in range(500)]}
    ranks = [_fake_rank(r, timeline) for r in range(64)]
    doc = {"ranks": [{"rank": r.rank, "host": r.host, "steps": r.steps, "span_us": 300_000.0} for r in ranks],
           "findings": [{"rule": f"rule-{i}", "title": "t" * 100, "evidence": {f"k{j}": list(range(200)) for j in range(20)},
                         "model": "m" * 1000, "estimated_gain_us": float(i)} for i in range(20)],
           "collectives": [{"rank": g % 64, "collective": "allreduce", "bytes": int(2 ** (10 + i % 18)),
                            "start_us": 10.0 * i, "dur_us": 5.0 + i, "exposed_us": 1.0, "on_gpu": True,
                            "group": {"name": str(g), "size": 8}}
                           for g in range(64) for i in range(400)]}
    doc["timeline"] = timeline_data(ranks, doc)
    html = render(doc)
    assert len(html.encode()) < 5_000_000, len(html.encode())
    lanes = [lane for rank in doc["timeline"]["ranks"] for lane in rank["lanes"]]
    assert len(lanes) == 3 * 6 and all(len(lane["marks"]) <= MAX_MARKS_PER_LANE for lane in lanes)
    assert "Downsampled:" in html and "more stream(s) not drawn" in html
