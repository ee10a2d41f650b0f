"""--gpu / --nics-per-node / --nic-gbps reach every model that uses the hardware: the job
section, the groups' profile links, and each finding's model (the rules read the hardware the
job analysis resolved; they used to resolve it again without the overrides)."""

from __future__ import annotations

import pytest

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.job.facts import JobFacts
from analyzer.model.hardware import gpu_profile
from analyzer.model.link import cross_node_beta
from conftest import SAMPLES

JOBS = ["fsdp_fullshard_2node", "ddp_comm_bound", "ddp_bucket_oversized", "fsdp_no_prefetch"]
OVERRIDES = dict(gpu="a100-sxm4-40gb", nics_per_node=2, nic_gbps=10.0)


def _links(value, found):
    """Every evidence dict that describes a link (α, β, source), however deep."""
    if isinstance(value, dict):
        if "beta_gbps" in value and "source" in value:
            found.append(value)
        for v in value.values():
            _links(v, found)
    elif isinstance(value, list):
        for v in value:
            _links(v, found)
    return found


@pytest.mark.parametrize("job", JOBS)
def test_overrides_reach_every_findings_model(job):
    result = diagnose(str(SAMPLES / "synthetic" / job), DiagnoseOptions(workers=1, **OVERRIDES), report=False)
    hw = result.hardware
    a100 = gpu_profile("a100-sxm4-40gb")
    assert hw["gpu_profile"] == {"origin": "user", "source": "--gpu override", "value": a100.id}
    assert hw["nic_gbps"]["value"] == 10.0 and hw["nics_per_node"]["value"] == 2
    facts = JobFacts(result)
    assert facts.hardware.to_dict() == hw  # the rules' hardware is the job's, overrides included
    gpn = result.topology["gpus_per_node"]
    for finding in result.findings:
        for link in _links(finding["evidence"], []):
            if link["source"].startswith("profile") and link.get("cross_node"):
                per_node = link["n"] / link["nodes"]
                assert link["beta_gbps"] == pytest.approx(cross_node_beta(a100.intra_node_gbps, 2, 10.0, per_node, gpn))
                assert "2 x 10 GB/s" in link["source"]
            elif link["source"].startswith("profile"):
                assert link["beta_gbps"] == pytest.approx(a100.intra_node_gbps), finding["rule"]
            elif link["source"].startswith("fitted (α from the hardware profile"):
                assert "2 NIC(s) per node x 10.0 GB/s" in link["source"] or "intra-node" in link["source"]


def test_hybrid_shard_projection_follows_the_override():
    """fsdp-fullshard-cross-node projects HYBRID_SHARD on the intra-node link of the GPU given:
    the A100's NVLink (300 GB/s one-way), not the H100's 450 GB/s the trace's devices imply."""
    plain = diagnose(str(SAMPLES / "synthetic" / "fsdp_fullshard_2node"), DiagnoseOptions(workers=1), report=False)
    forced = diagnose(str(SAMPLES / "synthetic" / "fsdp_fullshard_2node"),
                      DiagnoseOptions(workers=1, gpu="a100-sxm4-40gb"), report=False)
    ev = {r.job["gpu"]: next(f["evidence"] for f in r.findings if f["rule"] == "fsdp-fullshard-cross-node")
          for r in (plain,)}
    (before,) = ev.values()
    after = next(f["evidence"] for f in forced.findings if f["rule"] == "fsdp-fullshard-cross-node")
    assert before["intra_node_link"]["beta_gbps"] == 450 and after["intra_node_link"]["beta_gbps"] == 300
    assert "whatif_step_time_us" not in after  # one projection per finding
    assert after["projection_source"].startswith("the what-if model")
