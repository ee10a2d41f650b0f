"""The notebook API: lazy top-level exports, DataFrames checked against the synthetic truth,
typed findings, JSON/HTML views and the inline summary."""

import json
import subprocess
import sys

import pytest

import analyzer as tc
from analyzer.job import frames
from conftest import REPO, SAMPLES

JOB = SAMPLES / "synthetic" / "ddp_bucket_oversized"
TRUTH = json.loads((JOB / "truth.json").read_text())


@pytest.fixture(scope="module")
def result():
    return tc.diagnose(str(JOB))


def test_import_is_cheap_and_exports_are_lazy():
    code = ("import sys, analyzer, analyzer.capture; heavy = [m for m in ('numpy', 'pandas', 'msgspec', 'torch', "
            "'click') if m in sys.modules]; "
            "from analyzer import diagnose, load_result, Result, Finding; print(heavy, Result.__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] Result"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tc.nope  # noqa: B018
    assert {"diagnose", "load_result", "Result", "Finding"} <= set(dir(tc))
    assert set(tc.__all__) == {"__version__", *tc._EXPORTS}
    for name in tc._EXPORTS:
        assert getattr(tc, name).__name__ == name


def test_ranks_df_matches_the_truth(result):
    df = result.ranks_df().set_index("rank")
    assert list(result.ranks_df().columns) == list(frames.RANK_COLUMNS)
    assert sorted(df.index) == [t["rank"] for t in TRUTH["ranks"]]
    for t in TRUTH["ranks"]:
        for key in ("span_us", "busy_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us", "idle_us"):
            assert df.loc[t["rank"], key] == pytest.approx(t[key], abs=0.002), (t["rank"], key)
        assert df.loc[t["rank"], "host"] == t["host"]
        assert df.loc[t["rank"], "n_steps"] == len(t["steps"])


def test_steps_df_matches_the_truth_per_step_and_phase(result):
    df = result.steps_df()
    assert list(df.columns) == list(frames.STEP_COLUMNS)
    assert len(df) == sum(len(t["steps"]) for t in TRUTH["ranks"])
    rows = df.set_index(["rank", "step"])
    for t in TRUTH["ranks"]:
        for ts in t["steps"]:
            row = rows.loc[(t["rank"], ts["step"])]
            assert row["exposed_comm_us"] == pytest.approx(ts["exposed_comm_us"], abs=0.002)
            # the generator's step_time_us is the ProfilerStep (CPU) span
            assert row["cpu_step_us"] == pytest.approx(ts["step_time_us"], abs=0.002)
            for phase, value in ts["phases"].items():
                assert row[f"exposed_{phase}_us"] == pytest.approx(value, abs=0.002), (t["rank"], ts["step"], phase)


def test_collectives_and_groups_df(result):
    df = result.collectives_df()
    assert list(df.columns) == list(frames.COLLECTIVE_COLUMNS)
    truth_rows = TRUTH["collectives"]["rows"]
    assert len(df) == len(truth_rows)
    cols = TRUTH["collectives"]["columns"]
    want = sorted((dict(zip(cols, r)) for r in truth_rows), key=lambda r: (r["rank"], r["start_us"]))
    got = df.sort_values(["rank", "start_us"]).to_dict("records")
    for g, w in zip(got, want):
        assert (g["group_name"], g["bytes"], g["step"]) == (w["group"], w["bytes"], w["step"])
        assert g["group"] == (g["group_description"] or g["group_name"])  # as every view names it
        assert g["exposed_us"] == pytest.approx(w["exposed_us"], abs=0.002)
    assert set(df["group_size"]) == {8}
    groups = result.groups_df()
    assert list(groups.columns) == list(frames.GROUP_COLUMNS)
    assert groups["name"].tolist() == [g["name"] for g in TRUTH["groups"]]
    assert groups["cross_node"].tolist() == [g["cross_node"] for g in TRUTH["groups"]]


def test_typed_findings_and_findings_df(result):
    typed = result.typed_findings
    assert [f.rule for f in typed] == ["ddp-bucket-oversized"] == [f["rule"] for f in result.findings]
    f, raw = typed[0], result.findings[0]
    assert isinstance(f, tc.Finding) and f.to_dict() == raw
    # reads like the dict it came from
    assert f["rule"] == f.rule and f.get("model") == raw["model"] and f.get("nope", 7) == 7
    assert f["fix"]["snippet"] == raw["fix"]["snippet"] == f.fix.snippet and "evidence" in f
    with pytest.raises(KeyError):
        f["nope"]
    df = result.findings_df()
    assert list(df.columns) == list(frames.FINDING_COLUMNS)
    assert df.loc[0, "estimated_gain_us"] == raw["estimated_gain_us"]
    assert df.loc[0, "fix_text"] == raw["fix"]["text"]


def test_malformed_finding_is_a_validation_error():
    import msgspec
    with pytest.raises(msgspec.ValidationError, match="severity"):
        tc.Finding.from_dict({"rule": "x", "code": "X", "severity": "fatal", "title": "", "summary": "",
                              "ranks": [], "steps": [], "evidence": {}, "estimated_gain_us": None,
                              "model": None, "fix": {"text": ""}, "references": []})


def test_empty_tables_keep_their_columns(result):
    empty = tc.Result(inputs=[], ranks=[], job={}, collectives=[], buckets=[], fsdp_units=[])
    for name in ("ranks_df", "steps_df", "collectives_df", "groups_df", "findings_df"):
        df = getattr(empty, name)()
        assert df.empty and len(df.columns) > 3, name


def test_json_html_and_round_trip(result, tmp_path):
    text = result.to_json()
    saved = tmp_path / "r.json"
    saved.write_text(text)
    again = tc.load_result(saved)
    assert again.to_json() == text
    assert again.ranks_df().equals(result.ranks_df())
    html = result.to_html()
    assert html.startswith("<!DOCTYPE html>") and result.verdict.split(":")[0] in html


def test_repr_is_short_and_html_repr_is_the_escaped_summary(result):
    assert len(repr(result)) < 200 and "8 of 8 rank(s)" in repr(result)
    html = result._repr_html_()
    assert len(html) < 20_000 and "<script" not in html
    assert "ddp-bucket-oversized" in html and "exposed communication" in html
    doc = json.loads(result.to_json())
    doc["verdict"] = "<script>alert(1)</script>"
    doc["findings"][0]["summary"] = "<img src=x onerror=alert(2)>"
    hostile = tc.Result.from_dict(doc)
    out = hostile._repr_html_()
    assert "<script>alert" not in out and "<img" not in out and "&lt;img src=x" in out


def test_dataframes_of_a_hand_worked_job(tmp_path):
    """two_step_ddp (tests/builders.py): per step, compute 75 µs (forward 30, backward 40,
    optimizer 5); the all-reduce [60, 90) is launched in backward and hidden 10 µs under the
    backward kernel [30, 70): comm 30, overlap 10, exposed 20, all of it in backward."""
    from builders import two_step_ddp
    for rank in (0, 1):
        two_step_ddp(rank=rank).write(tmp_path / f"rank-{rank}.json")
    result = tc.diagnose(str(tmp_path))
    steps = result.steps_df()
    assert len(steps) == 4 and sorted(set(steps["step"])) == [1, 2]
    for _, row in steps.iterrows():
        assert (row["compute_us"], row["comm_us"], row["overlap_us"]) == (75.0, 30.0, 10.0)
        assert row["exposed_comm_us"] == row["exposed_backward_us"] == 20.0
        assert row["exposed_forward_us"] == row["exposed_optimizer_us"] == 0.0
    ranks = result.ranks_df().set_index("rank")
    assert ranks.loc[0, "exposed_comm_us"] == 40.0 and ranks.loc[1, "n_steps"] == 2
    coll = result.collectives_df()
    assert len(coll) == 4 and set(coll["bytes"]) == {2000} and set(coll["group_size"]) == {2}
    assert set(coll["phase"]) == {"backward"} and set(coll["exposed_us"]) == {20.0}
