"""tracecliff hang on the later real gloo jobs (scripts/record_fr_dumps.py JOBS, torch 2.13): an
8-rank job with two subgroups where rank 5 skips a collective while pg_status lags and the other
group's last collective is in flight; a job whose pg_status lags and nothing hangs; a silent
highest rank. Each in its folder (JSON and pickle side by side), and each format alone."""

from __future__ import annotations

import json
import shutil

import pytest

from analyzer.base.errors import InputError
from analyzer.hang import load, triage
from analyzer.hang.analyze import Job, find_hangs
from analyzer.hang.read import discover, read_dump
from hang_dumps import JOBS, SAMPLES, hang_summary, run

EXPECTED = json.loads((SAMPLES / "expected.json").read_text())
# Each format alone: the JSON dumps, or the pickles (named fr_rank_<r>, no suffix).
FORMATS = {"both": "", "json": "fr_rank_*.json", "pickle": "fr_rank_[0-9]"}


def paths(job: str, fmt: str) -> list[str]:
    folder = SAMPLES / job
    return [str(folder / FORMATS[fmt]) if FORMATS[fmt] else str(folder)]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("job", JOBS)
def test_recorded_jobs_give_their_expected_verdict(job, fmt):
    report = triage(paths(job, fmt))
    truth = EXPECTED[job]
    assert hang_summary(report) == truth["hangs"]
    assert [{k: f[k] if k != "group" else f["group"]["name"] for k in ("group", "seq", "op", "ranks")}
            for f in report.in_flight] == truth["in_flight"]
    assert report.world["size"] == truth["world_size"]
    used = {i["format"] for i in report.inputs}
    assert used == ({"json"} if fmt == "json" else {"pickle"})  # both given: the pickle, which has frames


@pytest.mark.parametrize("job", JOBS)
def test_cli_exit_code_and_no_old_verdict(job, capsys):
    code, out, err = run(capsys, "hang", str(SAMPLES / job))
    assert (code, err) == (EXPECTED[job]["exit"], "")
    verdict = out.splitlines()[0]
    assert EXPECTED[job]["before"] not in verdict  # what tracecliff said before issue 27


@pytest.mark.parametrize("job", [j for j in JOBS if "lagging_status" in EXPECTED[j]])
def test_the_recordings_really_lag(job):
    """Ground truth of the scenario, from the dumps themselves: pg_status names an earlier
    collective than the last retired entry of the group."""
    for rank, fact in EXPECTED[job]["lagging_status"].items():
        dump = read_dump(SAMPLES / job / f"fr_rank_{rank}")
        mine = [e for e in dump.entries if e.group == fact["group"]]
        assert max(e.collective_seq for e in mine if e.retired) == fact["retired_up_to"]
        assert dump.pg_status[mine[0].pg_id].completed == fact["pg_status_completed"]


def test_subgroups_skip_names_rank_5_at_7_not_a_lagging_rank_at_6():
    report = triage([str(SAMPLES / "subgroups_skip")])
    hang = report.hangs[0]
    assert (hang.kind, hang.group.name, hang.seq, hang.ranks) == ("missing-rank", "2", 7, [5])
    assert report.verdict.startswith("rank 5 never entered all_reduce #7 of group 2 (3 of 4 members waiting")
    assert "#6" not in report.verdict.split(";")[0]
    # rank 4's #6: its pg_status says #5, but its entry is retired and it went on to issue #7
    evidence = report.ranks[4]
    assert evidence["pending"] == 1 and evidence["last_entry"]["seq"] == 7
    assert hang.detail["evidence"]["4"]["done"] is False  # #7 itself is pending on the waiting ranks
    job = Job(load(discover([str(SAMPLES / "subgroups_skip")]).dumps)[0])
    find_hangs(job)
    six = job.progress[(4, "2", 6)]
    assert six.done and six.strong and six.how.startswith("retired, and the rank went on to issue #7")
    assert job.dumps[4].pg_status[1].completed == 5  # the lag that made the old verdict


def test_async_calls_still_running_prove_nothing():
    """async_buckets (recorded): ranks 0-2 issued #4-#6 as async all-reduces (DDP's buckets) and
    rank 3 never reached #4. Issuing #5 does not prove #4 returned (an async call does not
    block): the hang is #4, and no note claims rank 3's record of #4 or #5 is missing. Before,
    a later call counted as proof on gloo and the verdict named #6."""
    for rank, seqs in EXPECTED["async_buckets"]["async_pending"].items():  # the recording's own truth
        dump = read_dump(SAMPLES / "async_buckets" / f"fr_rank_{rank}")
        assert [e.collective_seq for e in dump.entries if not e.retired] == seqs
    report = triage([str(SAMPLES / "async_buckets")])
    hang = report.hangs[0]
    assert (hang.kind, hang.seq, hang.ranks) == ("missing-rank", 4, [3])
    assert report.verdict.startswith("rank 3 never entered all_reduce #4 of group default_pg (pg 0)")
    assert not any("record of it is missing" in n for n in report.notes)
    evidence = hang.detail["evidence"]["0"]
    assert evidence["done"] is False and "went on to issue #5: an async call (async_op=True), still running" in \
        evidence["how"]


def test_subgroups_skip_group_0_3_is_in_flight_not_stuck():
    report = triage([str(SAMPLES / "subgroups_skip")])
    assert [h.kind for h in report.hangs] == ["missing-rank"]
    flying = report.in_flight[0]
    assert flying["group"]["name"] == "1" and flying["pending"] == [0, 1, 2, 3]
    # new_group() without a timeout gives the subgroups gloo's default 30 min (the job's 3 s is
    # the default group's): pending ~0.15 s at the dump, well under it either way
    assert flying["timeout_s"] == 1800.0 and flying["pending_at_least_s"] < 1.0
    assert flying["pending_estimate_s"] < flying["timeout_s"]
    assert "after group 2's all_reduce #7 began waiting" in flying["reason"]
    assert "all_reduce #7 of group 1 was in flight at the dump, not hung" in report.verdict


def test_subgroups_skip_culprit_was_already_the_late_rank(capsys):
    """The Kineto traces beside the dumps (rank 5 stalls 0.2 s before each profiled step's
    all-reduce): found by the CLI on its own, and named with --traces."""
    code, out, _ = run(capsys, "hang", str(SAMPLES / "subgroups_skip"), "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["history"]["culprits"]["5"]["already_late"] is True
    assert doc["history"]["culprits"]["5"]["late_steps"] == [1, 2, 3]
    assert ("rank 5 was already the late rank in the profiled steps (the last in 3 of 3 steps: last to arrive at "
            "100% of matched collectives") in doc["verdict"]
    assert doc["history"]["source"].startswith("the cross-rank arrival order (the straggler-rank rule did not run")
    assert doc["world"] == {"size": 8, "source": "the Kineto traces' distributedInfo (world_size)", "silent": []}
    code, out, _ = run(capsys, "hang", str(SAMPLES / "subgroups_skip" / "fr_rank_*.json"),
                       "--traces", str(SAMPLES / "subgroups_skip" / "*.pt.trace.json.gz"))
    assert code == 1 and "rank 5 was already the late rank" in out.splitlines()[0]


def test_json_only_dumps_say_the_world_size_is_inferred():
    report = triage(paths("subgroups_skip", "json"))
    assert report.world["source"].startswith("inferred")  # gloo's pg_config lists no member here
    assert any("--world-size" in n for n in report.notes)


def test_status_lag_is_not_a_hang():
    report = triage([str(SAMPLES / "status_lag")])
    assert report.hangs == [] and report.in_flight == [] and report.verdict.startswith("no hang found")
    assert all(r["pending"] == 0 for r in report.ranks)


def test_silent_highest_rank_is_not_reporting():
    report = triage([str(SAMPLES / "silent_highest")])
    assert report.world == {"size": 4, "silent": [3], "source": "pg_config (an unnamed group listing every rank "
                                                              "with a dump: gloo's default group)"}
    # ranks 0-2 returned from #4 (retired: gloo's call came back, with the error rank 3's death caused)
    assert report.verdict.startswith("rank 3 wrote no dump (dead host?); the others returned from all_reduce #4 "
                                     "of group default_pg (pg 0) but nothing proves it completed (3 of 4 members "
                                     "entered it at ")
    assert "nothing proves it completed" in report.hangs[0].detail["reason"]


def test_both_formats_per_rank_are_compared_and_the_choice_is_said():
    report = triage([str(SAMPLES / "subgroups_skip")])
    assert all(i["format"] == "pickle" and i["also"]["format"] == "json" and i["also"]["agree"] for i in report.inputs)
    assert report.notes[0].startswith("rank(s) 0-7 have a JSON and a pickle dump: the pickles are used")
    assert report.hangs[0].detail["culprits"]["5"]["newest_entry_any_group"]["frames"]  # the pickle's stack


def test_disagreeing_json_and_pickle_are_a_warning_and_the_pickle_is_used(tmp_path):
    job = tmp_path / "job"
    shutil.copytree(SAMPLES / "status_lag", job)
    doc = json.loads((job / "fr_rank_2.json").read_text())
    doc["entries"][1]["input_sizes"] = [[5]]
    (job / "fr_rank_2.json").write_text(json.dumps(doc))
    report = triage([str(job)])
    assert report.warnings == [f"rank 2: its JSON and pickle dumps disagree (1 entries differ in what was issued "
                               f"(first: record 1)): the pickle {job / 'fr_rank_2'} is used"]
    assert report.hangs == []  # the pickle (unchanged) decides


def test_the_old_layout_folder_reads_json_and_pickle_subfolders():
    report = triage([str(SAMPLES / "skip_collective")])
    assert [(h.kind, h.seq, h.ranks) for h in report.hangs] == [("missing-rank", 4, [2])]
    assert {i["format"] for i in report.inputs} == {"pickle"}


@pytest.mark.parametrize("size, problem", [(3, "--world-size: 3 ranks, but there is a dump for rank 3"),
                                           (10**9, "--world-size: 1000000000 ranks is beyond any job"),
                                           (0, "--world-size: 0 ranks is beyond any job")])
def test_world_size_smaller_than_the_dumps_or_beyond_any_job_is_an_error(size, problem):
    with pytest.raises(InputError, match=problem):
        triage([str(SAMPLES / "status_lag")], world_size=size)


def test_world_size_beyond_any_job_is_a_usage_error_not_a_memory_error(capsys):
    """The world is listed rank by rank: --world-size 10**9 once allocated it (MemoryError)."""
    code, out, err = run(capsys, "hang", str(SAMPLES / "status_lag"), "--world-size", str(10**9))
    assert code == 2 and out == "" and "--world-size" in err and "262144" in err and "Traceback" not in err


def test_world_size_names_every_silent_rank(capsys):
    code, out, _ = run(capsys, "hang", str(SAMPLES / "silent_highest"), "--world-size", "6", "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["world"] == {"size": 6, "source": "--world-size", "silent": [3, 4, 5]}
    assert doc["hangs"][0]["ranks"] == [3, 4, 5]


def test_text_and_html_show_the_world_the_flight_and_the_history(tmp_path, capsys):
    code, text, _ = run(capsys, "hang", str(SAMPLES / "subgroups_skip"))
    assert code == 1
    for line in ("World: 8 ranks (from the Kineto traces' distributedInfo (world_size))",
                 "  #7 on ranks 4, 6, 7: not retired, pg_status at #5",
                 "[in flight] all_reduce #7 of group 1: members 0, 1, 2, 3",
                 "Trace history (8 Kineto trace(s), late ranks by the cross-rank arrival order"):
        assert any(row.startswith(line) for row in text.splitlines()), line
    pages = [tmp_path / "a.html", tmp_path / "b.html"]
    for page in pages:
        assert run(capsys, "hang", str(SAMPLES / "subgroups_skip"), "--format", "html", "-o", str(page))[0] == 1
    html = pages[0].read_text()
    assert pages[0].read_bytes() == pages[1].read_bytes()
    assert 'id="in-flight"' in html and 'id="history"' in html and "rank 5 was already the late rank" in html


def test_json_with_traces_is_deterministic(tmp_path, capsys):
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        run(capsys, "hang", str(SAMPLES / "subgroups_skip"), "--format", "json", "-o", str(out))
    assert outs[0].read_bytes() == outs[1].read_bytes()
    doc = json.loads(outs[0].read_text())
    assert {"verdict", "hangs", "ranks", "groups", "inputs", "notes", "warnings", "in_flight", "world",
            "history"} <= set(doc)
