"""gloo ranks on one host read one clock (issue 26): no clock offsets between them, so the latest
arrival is the rank that really arrives last; across hosts, each host's offset (analyzer.synth
.gloo: arrivals and offsets known by construction)."""

from __future__ import annotations

import json

import pytest

from analyzer.api import diagnose
from analyzer.reports.text import TextRenderer
from analyzer.synth.gloo import GlooSpec, write_gloo_job


def _run(tmp_path, spec):
    out = write_gloo_job(spec, tmp_path / spec.name)
    result = diagnose(sorted(str(p) for p in out.glob("rank-*.json.gz")), report=False)
    return result, json.loads((out / "truth.json").read_text())


def test_same_host_ranks_share_one_clock(tmp_path):
    result, truth = _run(tmp_path, GlooSpec(name="one_host", world_size=4, seed=3))
    by_rank = {b["rank"]: b for b in result.stragglers["by_rank"]}
    assert all(b["clock_offset_us"] == 0.0 for b in by_rank.values())
    # the latest to start each collective is the generator's last arrival
    assert {r: b["times_last"] for r, b in by_rank.items()} == {int(r): n for r, n in truth["times_last"].items()}
    text = TextRenderer().render(result)
    assert "one clock (ranks on one host)" in " ".join(text.split())  # wrapped where the line ends
    assert "Host-side collectives (gloo)" in text and "No exposed communication." not in text
    assert "allreduce 8 (1.0 MB)" in text  # 8 all-reduces of 131 KB per rank and step
    assert all(len(line) <= 100 for line in text.splitlines())


def test_two_hosts_get_one_offset_each(tmp_path):
    spec = GlooSpec(name="two_hosts", world_size=4, hosts=2, clock_offset_us=(0.0, 5000.0), seed=4,
                    finish_spread_us=200.0)
    result, truth = _run(tmp_path, spec)
    offsets = {b["rank"]: b["clock_offset_us"] for b in result.stragglers["by_rank"]}
    assert offsets[0] == offsets[1] and offsets[2] == offsets[3]  # one per host
    assert offsets[2] - offsets[0] == pytest.approx(5000.0, abs=spec.finish_spread_us)
    by_rank = {b["rank"]: b["times_last"] for b in result.stragglers["by_rank"]}
    assert by_rank == {int(r): n for r, n in truth["times_last"].items()}
