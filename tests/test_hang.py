"""tracecliff hang: verdicts on real gloo dumps (sample_traces/flight_recorder, expected.json) and
on synthetic dumps with built-in truth; the CLI contract (exit codes, JSON keys, determinism)."""

from __future__ import annotations

import json
import shutil

import pytest

from analyzer.base.errors import InputError
from analyzer.hang import triage
from hang_dumps import SAMPLES, SCENARIOS, config, dump, entry, run, write_job

EXPECTED = json.loads((SAMPLES / "expected.json").read_text())


def summary(report) -> list[dict]:
    return [{"kind": h.kind, "group": h.group.name, "seq": h.seq, "op": h.op, "ranks": h.ranks,
             "waiting_ranks": h.waiting_ranks} for h in report.hangs]


@pytest.mark.parametrize("fmt", ["json", "pickle"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_recorded_samples_give_their_expected_verdict(scenario, fmt):
    report = triage([str(SAMPLES / scenario / fmt)])
    expected = EXPECTED[scenario]["hangs"]
    assert summary(report) == [{k: v for k, v in h.items() if k != "differs_in"} for h in expected]
    for hang, truth in zip(report.hangs, expected):
        assert hang.detail.get("differs_in", None) == truth.get("differs_in")
    # gloo dumps carry no membership for the default group: it is inferred, and the output says so
    assert report.groups[0]["membership_inferred"] is True
    assert any("membership inferred" in n for n in report.notes)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_cli_exit_code_and_verdict_first(scenario, capsys):
    code, out, err = run(capsys, "hang", str(SAMPLES / scenario / "pickle"))
    assert (code, err) == (EXPECTED[scenario]["exit"], "")
    first = out.splitlines()[0]
    assert first.startswith("VERDICT: ")
    if scenario == "skip_collective":
        assert "rank 2 never entered all_reduce #4 of group default_pg (pg 0) (3 of 4 members waiting" in first
        assert "its last completed collective was all_reduce #3" in first
        assert "last seen in _worker (" in first and "record_fr_dumps.py" in first  # the pickle's stack


def test_pickle_and_json_dumps_of_one_run_agree_but_only_pickle_has_frames():
    for scenario in SCENARIOS:
        a, b = triage([str(SAMPLES / scenario / "json")]), triage([str(SAMPLES / scenario / "pickle")])
        assert summary(a) == summary(b)
    culprit = triage([str(SAMPLES / "sleep_past_timeout" / "pickle")]).hangs[0].detail["culprits"]["2"]
    assert culprit["newest_entry_any_group"]["frames"][0]["name"] == "all_reduce"
    assert culprit["last_completed"]["seq"] == 3


def test_json_contract_and_determinism(tmp_path, capsys):
    out_a, out_b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (out_a, out_b):
        code, _, _ = run(capsys, "hang", str(SAMPLES / "size_mismatch" / "json"), "--format", "json", "-o", str(out))
        assert code == 1
    assert out_a.read_bytes() == out_b.read_bytes()
    doc = json.loads(out_a.read_text())
    assert {"verdict", "hangs", "ranks"} <= set(doc)
    hang = doc["hangs"][0]
    assert {"group", "seq", "kind", "ranks", "waiting_ranks", "detail"} <= set(hang)
    assert {"name", "description", "ranks"} <= set(hang["group"])
    assert hang["group"] == {**hang["group"], "name": "0", "description": "default_pg", "ranks": [0, 1, 2, 3]}
    assert hang["detail"]["issued"]["2"]["input_sizes"] == [[5]]
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]


def test_html_is_self_contained_and_deterministic(tmp_path, capsys):
    html = [tmp_path / "a.html", tmp_path / "b.html"]
    for out in html:
        run(capsys, "hang", str(SAMPLES / "different_collectives" / "pickle"), "--format", "html", "-o", str(out))
    text = html[0].read_text()
    assert html[0].read_bytes() == html[1].read_bytes()
    assert "default-src 'none'" in text and "http://" not in text.replace("http-equiv", "")
    assert "broadcast" in text and "desync" in text


def test_html_escapes_dump_strings(tmp_path, capsys):
    evil = "<script>alert(1)</script>"
    per_rank = {0: dump([entry(1, state="scheduled", group=("0", evil))]), 1: dump([])}
    job = write_job(tmp_path / "job", per_rank)
    out = tmp_path / "r.html"
    code, _, _ = run(capsys, "hang", str(job), "--format", "html", "-o", str(out))
    assert code == 1
    assert evil not in out.read_text()


# --- synthetic dumps with built-in truth -------------------------------------------------------

def triage_job(tmp_path, per_rank, fmt="json"):
    return triage([str(write_job(tmp_path / "job", per_rank, fmt))])


def test_stuck_when_every_member_entered_and_none_completed(tmp_path):
    cfg = config("0", "default_pg", [0, 1, 2])
    per_rank = {r: dump([entry(1), entry(2, state="started")], cfg) for r in range(3)}
    report = triage_job(tmp_path, per_rank)
    assert summary(report) == [{"kind": "stuck", "group": "0", "seq": 2, "op": "all_reduce", "ranks": [0, 1, 2],
                                "waiting_ranks": []}]
    assert report.hangs[0].detail["started"] == [0, 1, 2]
    assert report.groups[0]["membership"] == "pg_config"
    assert "never completed on ranks 0, 1, 2 although every member entered it" in report.verdict


def test_not_reporting_rank_of_a_configured_group(tmp_path):
    cfg = config("5", "dp_shard", [0, 1, 2, 3])
    per_rank = {r: dump([entry(1, group=("5", "dp_shard")), entry(2, group=("5", "dp_shard"), state="scheduled")],
                        cfg) for r in (0, 1, 3)}
    report = triage_job(tmp_path, per_rank)
    assert summary(report) == [{"kind": "not-reporting", "group": "5", "seq": 2, "op": "all_reduce", "ranks": [2],
                                "waiting_ranks": [0, 1, 3]}]
    assert report.verdict.startswith("rank 2 wrote no dump")
    assert any("no dump for rank(s) 2" in w for w in report.warnings)


def test_not_reporting_from_a_real_dump_set_with_one_file_removed(tmp_path):
    job = tmp_path / "job"
    shutil.copytree(SAMPLES / "sleep_past_timeout" / "json", job)
    (job / "fr_rank_2.json").unlink()
    report = triage([str(job)])
    assert [(h.kind, h.ranks, h.waiting_ranks) for h in report.hangs] == [("not-reporting", [2], [0, 1, 3])]


def test_missing_rank_in_a_subgroup_names_where_the_culprit_is(tmp_path):
    """Rank 1 never joins tp #7 because it waits in dp #3: the dp hang is the root cause."""
    tp, dp = ("1", "tp"), ("2", "dp")
    cfg = {**config("1", "tp", [0, 1]), **config("2", "dp", [1, 3])}
    per_rank = {
        0: dump([entry(6, group=tp, pg_id=1), entry(7, group=tp, pg_id=1, state="scheduled", t=5 * 10**18)], cfg),
        1: dump([entry(6, group=tp, pg_id=1), entry(3, group=dp, pg_id=2, state="scheduled", t=4 * 10**18)], cfg),
        3: dump([entry(2, group=dp, pg_id=2)], cfg),
    }
    report = triage_job(tmp_path, per_rank)
    assert [(h.kind, h.group.name, h.seq, h.ranks, h.waiting_ranks) for h in report.hangs] == [
        ("missing-rank", "2", 3, [3], [1]), ("missing-rank", "1", 7, [1], [0])]
    assert report.hangs[1].detail["culprits"]["1"]["newest_entry_any_group"]["group"] == "2"


def test_desync_in_dtype_and_collective_and_p2p_kept_apart(tmp_path):
    per_rank = {0: dump([entry(1), entry(2, dtype="BFloat16", state="scheduled"),
                         entry(1, "send", peer="0->1", state="completed")], config("0", "default_pg", [0, 1, 2])),
                1: dump([entry(1), entry(2, state="scheduled"), entry(1, "recv", peer="1<-0")]),
                2: dump([entry(1), entry(2, state="scheduled")])}
    report = triage_job(tmp_path, per_rank)
    assert [(h.kind, h.seq, h.ranks, h.detail["differs_in"]) for h in report.hangs] == [("desync", 2, [0], ["dtypes"])]


def test_p2p_recv_without_send(tmp_path):
    cfg = config("0", "default_pg", [0, 1])
    per_rank = {0: dump([entry(1)], cfg),
                1: dump([entry(1), entry(1, "recv", peer="1<-0", state="scheduled")], cfg)}
    report = triage_job(tmp_path, per_rank, "pickle")
    assert summary(report) == [{"kind": "p2p-unmatched", "group": "0", "seq": 1, "op": "recv", "ranks": [0],
                                "waiting_ranks": [1]}]
    assert "rank 0 never posted the matching send" in report.verdict


def test_p2p_matched_pairs_and_sizes(tmp_path):
    cfg = config("0", "default_pg", [0, 1])
    ok = {0: dump([entry(1, "send", peer="0->1", state="scheduled")], cfg),
          1: dump([entry(1, "recv", peer="1<-0", state="scheduled")], cfg)}
    assert triage_job(tmp_path / "ok", ok).hangs == []
    bad = {0: dump([entry(1, "send", peer="0->1", state="scheduled")], cfg),
           1: dump([entry(1, "recv", peer="1<-0", state="scheduled", sizes=((8,),))], cfg)}
    report = triage_job(tmp_path / "bad", bad)
    hang = report.hangs[0]
    assert (hang.kind, hang.ranks, hang.detail["reason"]) == ("p2p-unmatched", [0, 1], "sizes differ")
    from analyzer.reports.hang_html import render_html
    assert "sizes differ" in render_html(report.to_dict())  # a hang without culprit details renders (found by the fuzzer)


def test_ring_buffer_eviction_is_not_a_missing_rank(tmp_path):
    """Rank 1's buffer lost #1-#3: matching starts where every rank still has entries."""
    per_rank = {0: dump([entry(s) for s in range(1, 6)]), 1: dump([entry(s) for s in range(4, 6)])}
    assert triage_job(tmp_path, per_rank).hangs == []


def test_legacy_format_with_one_seq_id(tmp_path):
    def legacy(seq, state="completed"):
        e = entry(seq, state=state)
        for key in ("collective_seq_id", "p2p_seq_id", "is_p2p", "process_group"):
            del e[key]
        return {**e, "seq_id": seq}
    per_rank = {0: dump([legacy(1), legacy(2, "scheduled")], version="1.5"),
                1: dump([legacy(1)], version="1.5")}
    report = triage_job(tmp_path, per_rank)
    assert [(h.kind, h.seq, h.ranks) for h in report.hangs] == [("missing-rank", 2, [1])]
    assert report.groups[0]["name"] == "0"


def test_tie_takes_lowest_rank_as_expected_and_says_so(tmp_path):
    per_rank = {0: dump([entry(1, state="scheduled")]), 1: dump([entry(1, "broadcast", state="scheduled")])}
    hang = triage_job(tmp_path, per_rank).hangs[0]
    assert (hang.kind, hang.ranks, hang.detail["tie"]) == ("desync", [1], True)


@pytest.mark.parametrize("mutate, problem", [
    (lambda d: d.pop("version"), "not a Flight Recorder dump"),
    (lambda d: d["entries"][0].update(collective_seq_id="x"), "entries[0].collective_seq_id: expected an integer"),
    (lambda d: d["pg_config"].update({"0": {"ranks": "__import__('os')"}}), "pg_config['0'].ranks"),
    (lambda d: d["pg_config"].update({"0": {"ranks": "[-1, 0]"}}), "pg_config['0'].ranks: a rank cannot be negative"),
    (lambda d: d.update(entries={"a": 1}), "entries: expected a list"),
])
def test_bad_dump_fields_are_one_line_errors(tmp_path, capsys, mutate, problem):
    doc = dump([entry(1)])
    mutate(doc)
    job = write_job(tmp_path / "job", {0: doc})
    code, out, err = run(capsys, "hang", str(job))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "nccl_trace_rank_0.json" in err and problem in err


@pytest.mark.parametrize("name, content, problem", [
    ("fr_rank_0.json", b'{"version": "2.10", "entries": [', "neither a Flight Recorder pickle nor valid JSON"),
    ("fr_rank_0", b"\x80\x04\x95", "pickle"),
    ("fr_rank.json", b"{}", "cannot tell the rank"),
    ("fr_rank_0.json", b"", "empty file"),
])
def test_bad_files_are_one_line_errors(tmp_path, capsys, name, content, problem):
    path = tmp_path / name
    path.write_bytes(content)
    code, _, err = run(capsys, "hang", str(path))
    assert code == 2 and len(err.strip().splitlines()) == 1 and problem in err and name in err


def test_two_dumps_of_one_format_for_one_rank_is_an_error(tmp_path):
    other = tmp_path / "fr_rank_0.json"
    shutil.copy(SAMPLES / "skip_collective" / "json" / "fr_rank_0.json", other)
    with pytest.raises(InputError, match="rank 0 already has a dump"):
        triage([str(SAMPLES / "healthy" / "json" / "fr_rank_0.json"), str(other)])


def test_directory_without_dumps_and_missing_path(tmp_path, capsys):
    (tmp_path / "README.md").write_text("x")
    assert run(capsys, "hang", str(tmp_path))[0] == 2
    assert run(capsys, "hang", str(tmp_path / "nope"))[0] == 2
