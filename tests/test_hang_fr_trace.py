"""tracecliff hang against torch's own Flight Recorder analyzer (``fr_trace``) on the recorded
pickle dumps. torch 2.13's gloo dumps list no member for the default group (pg_config has only
an unnamed entry), and fr_trace stops with KeyError ('0', 0) on them; the test checks that, then
runs it again with pg_config filled in (the default group = every rank) and compares culprits."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from analyzer.hang import triage
from hang_dumps import JOBS, SAMPLES, SCENARIOS

pytest.importorskip("torch.distributed.flight_recorder.components.builder")

# Runs in a child process: fr_trace's loader disables the garbage collector and reads with
# pickle.load (these are our own committed dumps), neither of which belongs in the test process.
ORACLE = r"""
import json, sys
from torch.distributed.flight_recorder.components.builder import build_db
from torch.distributed.flight_recorder.components.config_manager import JobConfig
from torch.distributed.flight_recorder.components.loader import read_dir
args = JobConfig().parse_args([sys.argv[1], "--allow-incomplete-ranks"])
details, version = read_dir(args)
if sys.argv[2] == "fill":
    world = str(sorted(d["rank"] for d in details.values()))
    for d in details.values():
        d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": world}}
elif sys.argv[2] != "raw":  # the groups as JSON: name -> [desc, ranks]
    groups = json.loads(sys.argv[2])
    for d in details.values():
        d["pg_config"] = {n: {"name": n, "desc": desc, "ranks": str(ranks)} for n, (desc, ranks) in groups.items()}
try:
    db = build_db(details, args, version)
except KeyError as exc:
    print(json.dumps({"error": "KeyError " + repr(exc.args[0])}))
    sys.exit(0)
print(json.dumps([{"group": c.group_id, "seq": c.collective_seq_id, "missing": sorted(c.missing_ranks or []),
                   "mismatch": sorted(int(r) for r in (c.mismatch_collectives or {}))}
                  for c in db.collectives if not c.pass_check or c.missing_ranks]))
"""


def fr_trace(directory, mode, log=None):
    done = subprocess.run([sys.executable, "-c", ORACLE, str(directory), mode], capture_output=True, text=True,
                          timeout=120, check=True)
    if log is not None:
        log.append(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_culprit_agrees_with_fr_trace(scenario):
    dumps = SAMPLES / scenario / "pickle"
    assert fr_trace(dumps, "raw") == {"error": "KeyError ('0', 0)"}
    theirs = fr_trace(dumps, "fill")
    ours = triage([str(dumps)]).hangs
    if not theirs:
        assert ours == []
        return
    first = theirs[0]
    assert first["group"].startswith("0")  # fr_trace's group id: the name and a hash of the ranks
    assert len(ours) == 1 and ours[0].seq == first["seq"]
    assert ours[0].ranks == (first["missing"] or first["mismatch"])
    assert ours[0].kind == ("missing-rank" if first["missing"] else "desync")


# The later jobs (both formats in one folder): fr_trace reads every file of a folder as a pickle,
# so it gets the pickles alone; gloo lists no members, so pg_config is filled with the jobs' groups.
GROUPS = {"subgroups_skip": {"0": ["default_pg", list(range(8))], "1": ["undefined", [0, 1, 2, 3]],
                             "2": ["undefined", [4, 5, 6, 7]]},
          "status_lag": {"0": ["default_pg", [0, 1, 2, 3]]}, "silent_highest": {"0": ["default_pg", [0, 1, 2, 3]]},
          "async_buckets": {"0": ["default_pg", [0, 1, 2, 3]]}}


@pytest.mark.parametrize("job", JOBS)
def test_later_jobs_against_fr_trace(job, tmp_path):
    for pickle_dump in (SAMPLES / job).glob("fr_rank_[0-9]"):
        shutil.copy(pickle_dump, tmp_path / pickle_dump.name)
    log: list[str] = []
    theirs = fr_trace(tmp_path, json.dumps(GROUPS[job]), log)
    ours = triage([str(SAMPLES / job)]).hangs
    if job == "silent_highest":
        # fr_trace cannot decide without rank 3's dump, at every collective; tracecliff names it at #4
        assert "missed FR dumps from ranks ({3})" in log[0] and theirs == []
        assert [(h.kind, h.seq, h.ranks) for h in ours] == [("not-reporting", 4, [3])]
        return
    if job == "async_buckets":
        # fr_trace lists every collective rank 3 never entered (#4-#6); tracecliff the earliest, #4
        assert [(t["seq"], t["missing"]) for t in theirs] == [(4, [3]), (5, [3]), (6, [3])]
        assert [(h.kind, h.seq, h.ranks) for h in ours] == [("missing-rank", 4, [3])]
        return
    assert [(t["group"][:1], t["seq"], t["missing"] or t["mismatch"]) for t in theirs] == [
        (h.group.name, h.seq, h.ranks) for h in ours]  # subgroups_skip: group 2, #7, rank 5; status_lag: none
