"""The audit of tracecliff's predicted gains against the generator: each finding whose fix the
generator can apply is re-simulated with the fix, and the step time the finding predicts (its
evidence's ``prediction``) is compared with the re-simulated one.

Two sets of jobs: the bundled samples (sample_traces/synthetic, whose fixes the rule case files
``tests/rule_cases/<rule>.toml`` state in ``[[fix]]``), and ``UNSEEN``, jobs generated here that
no rule was tuned on (other model sizes, layer counts, node counts, NICs and seeds).

    python tests/prediction_audit.py            # the table of docs/models.md ("Predictions audited")

tests/test_rules_gains.py checks every entry within TOLERANCE and that the table in
docs/models.md is this script's output.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from analyzer.api import DiagnoseOptions, diagnose  # noqa: E402
from analyzer.synth import SCENARIOS, write_job  # noqa: E402
from analyzer.synth.parallel import PARALLEL_SCENARIOS, build_parallel_truth, write_parallel_job  # noqa: E402
from analyzer.synth.programs import build_program  # noqa: E402
from analyzer.synth.truth import build_truth  # noqa: E402
from rule_cases_lib import diagnosed, load_cases  # noqa: E402

TOLERANCE = 0.10  # |predicted − re-simulated| / re-simulated
PIPELINE_WORK = ("forward_us", "backward_us", "transfer_us")


@dataclass(frozen=True)
class Fix:
    """One fix of a finding: the scenario, the generator changes that apply it, and which of
    the finding's predictions it checks."""

    rule: str
    scenario: str
    changes: dict[str, Any]
    alternative: str | None = None  # a what-if field: the finding's alternative that sets it
    predicted_key: str | None = None  # an evidence key holding the predicted step instead
    same_batch: bool = False  # pipeline: the micro-batches split the same batch
    spec: Any = None  # an unseen job's spec (None: the bundled sample's)
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.scenario


@dataclass
class Audit:
    fix: Fix
    fix_text: str
    predicted_us: float
    resimulated_us: float
    step_us: float
    notes: list[str] = field(default_factory=list)

    @property
    def error(self) -> float:
        return (self.predicted_us - self.resimulated_us) / self.resimulated_us


def case_fixes() -> list[Fix]:
    """The ``[[fix]]`` entries (or one ``[fix]``) of every rule case file."""
    out = []
    for rule, case in load_cases().items():
        fixes = case.get("fix") or []
        for entry in [fixes] if isinstance(fixes, dict) else fixes:
            key = entry.get("predicted_step_us")
            out.append(Fix(rule, entry["scenario"], dict(entry["changes"]), entry.get("alternative"),
                           key.split(":", 1)[1] if key else None, bool(entry.get("same_batch"))))
    return sorted(out, key=lambda f: (f.rule, f.scenario, f.alternative or "", str(sorted(f.changes.items()))))


def _unseen() -> list[Fix]:
    """Jobs no rule was tuned on, each with the fix of the finding it must show."""
    s, p = SCENARIOS, PARALLEL_SCENARIOS
    two_nodes = {"world_size": 16, "gpus_per_node": 8}
    return [
        Fix("fsdp-missing-wrap-policy", "fsdp1_no_wrap", {"fsdp_wrap": "per_layer"}, label="fsdp1 no wrap, d=8192, 8 blocks",
            spec=replace(s["fsdp1_no_wrap"], name="u1", seed=101, hidden=8192, n_layers=8)),
        Fix("fsdp-missing-wrap-policy", "fsdp2_no_wrap", {"fsdp_wrap": "per_layer"},
            label="fsdp2 no wrap, d=6144, 12 blocks, 2x8 GPUs, 4 NICs",
            spec=replace(s["fsdp2_no_wrap"], name="u2", seed=102, hidden=6144, n_layers=12, micro_batch=1,
                         nics_per_node=4, **two_nodes)),
        Fix("comm-bound-step", "ddp_comm_bound", {"nics_per_node": 8}, "nics_per_node",
            label="ddp 2x8 GPUs, 1 NIC, d=3072, 8 blocks",
            spec=replace(s["ddp_comm_bound"], name="u3", seed=103, hidden=3072, n_layers=8, **two_nodes)),
        Fix("comm-bound-step", "ddp_comm_bound", {"strategy": "fsdp2", "sharding": "hybrid_shard"}, "strategy",
            label="ddp 2x8 GPUs, 1 NIC, d=3072, 8 blocks",
            spec=replace(s["ddp_comm_bound"], name="u3", seed=103, hidden=3072, n_layers=8, **two_nodes)),
        Fix("comm-bound-step", "ddp_comm_bound", {"nics_per_node": 4}, "nics_per_node",
            label="ddp 4x4 GPUs, 1 NIC, d=2048, 10 blocks",
            spec=replace(s["ddp_comm_bound"], name="u4", seed=104, hidden=2048, n_layers=10, world_size=16,
                         gpus_per_node=4)),
        Fix("ddp-bucket-oversized", "ddp_bucket_oversized",
            {"bucket_cap_mb": "evidence:suggested_bucket_cap_mb", "first_bucket_mb": "evidence:suggested_bucket_cap_mb"},
            label="ddp bucket_cap_mb=512, d=3072, 8 blocks",
            spec=replace(s["ddp_bucket_oversized"], name="u5", seed=105, hidden=3072, n_layers=8, bucket_cap_mb=512.0)),
        Fix("fsdp-no-prefetch", "fsdp_no_prefetch", {"backward_prefetch": True, "forward_prefetch": True},
            label="fsdp1 no prefetch, d=8192, 8 blocks",
            spec=replace(s["fsdp_no_prefetch"], name="u6", seed=106, hidden=8192, n_layers=8)),
        Fix("fsdp-fullshard-cross-node", "fsdp_fullshard_2node", {"sharding": "hybrid_shard"},
            label="fsdp2 FULL_SHARD 2x8 GPUs, 2 NICs, d=8192, 8 blocks",
            spec=replace(s["fsdp_fullshard_2node"], name="u7", seed=107, hidden=8192, n_layers=8, nics_per_node=2)),
        Fix("fp32-gradient-comm", "ddp_fp32_grads", {"grad_dtype": "bf16"}, label="ddp fp32 gradients, 2x4 GPUs, 1 NIC",
            spec=replace(s["ddp_fp32_grads"], name="u8", seed=108, world_size=8, gpus_per_node=4, nics_per_node=1)),
        Fix("pipeline-bubble", "pp_gpipe_4stage", {"microbatches": "evidence:suggested_microbatches"}, same_batch=True,
            label="GPipe 8 stages, 4 micro-batches",
            spec=replace(p["pp_gpipe_4stage"], name="u9", world_size=8, pp=8, microbatches=4)),
        Fix("tp-cross-node", "megatron_tp8_2node", {"gpus_per_node": 8}, label="TP=8 over 4 nodes of 2 GPUs, 6 layers",
            spec=replace(p["megatron_tp8_2node"], name="u10", gpus_per_node=2, layers=6)),
        Fix("ep-alltoall-exposed", "ep_deepep_exposed", {"ep_overlapped": True}, label="DeepEP in line, 6 MoE layers",
            spec=replace(p["ep_deepep_exposed"], name="u11", layers=6)),
    ] + _masked()


# Masked causes (issue 38): each rank's fix alone (``alone:RANK``: its per_rank entry) and the
# named ranks' fixes together (the finding's prediction), each re-simulated.
_SLOW_HOSTS = ((0, 30000.0, 1), (6, 22000.0, 1))
_ROTATING = ((1, 25000.0, 4, 0), (4, 25000.0, 4, 1), (6, 25000.0, 4, 2))


def _masked() -> list[Fix]:
    dp8 = replace(SCENARIOS["ddp_healthy_8r"], n_layers=2, steps=5)
    hosts = replace(dp8, name="u12", seed=112, host_stalls=_SLOW_HOSTS)
    mixed = replace(dp8, name="u13", seed=113, straggler_rank=2, straggler_slowdown=1.3, host_stalls=((5, 20000.0, 1),))
    rotating = replace(dp8, name="u14", seed=114, steps=4, host_stalls=_ROTATING)  # one stall each, then none
    out = []
    for rank, left in ((0, _SLOW_HOSTS[1:]), (6, _SLOW_HOSTS[:1])):
        out.append(Fix("straggler-rank", "ddp_two_hosts_stall", {"host_stalls": left}, predicted_key=f"alone:{rank}",
                       spec=hosts, label=f"ranks 0, 6 stall 30, 22 ms (8 GPUs): rank {rank} alone"))
    out.append(Fix("straggler-rank", "ddp_two_hosts_stall", {"host_stalls": ()}, spec=hosts,
                   label="ranks 0, 6 stall 30, 22 ms (8 GPUs): both"))
    mixed_label = "rank 2 computes 1.3x slower, rank 5 stalls 20 ms (8 GPUs)"
    out += [Fix("straggler-rank", "ddp_straggler", {"host_stalls": ()}, predicted_key="alone:5", spec=mixed,
                label=f"{mixed_label}: rank 5 alone"),
            Fix("straggler-rank", "ddp_straggler", {"straggler_slowdown": 1.0}, predicted_key="alone:2", spec=mixed,
                label=f"{mixed_label}: rank 2 alone"),
            Fix("straggler-rank", "ddp_straggler", {"host_stalls": (), "straggler_slowdown": 1.0}, spec=mixed,
                label=f"{mixed_label}: both")]
    for k, stall in enumerate(_ROTATING):
        out.append(Fix("straggler-rank", "ddp_rotating_stall", {"host_stalls": _ROTATING[:k] + _ROTATING[k + 1:]},
                       predicted_key=f"alone:{stall[0]}", spec=rotating,
                       label=f"ranks 1, 4, 6 stall 25 ms in steps 1-3 of 4 (8 GPUs): rank {stall[0]} alone"))
    # a slow link (rank 6's ring at 90 GB/s) beside a slow GPU: fixing the GPU alone leaves the
    # slow transfers where they are (the replay keeps each collective's measured transfer)
    linked = replace(dp8, name="u15", seed=115, gpus_per_node=4, nics_per_node=4, straggler_rank=3,
                     straggler_slowdown=1.3, slow_link_rank=6, slow_link_gbps=90.0)
    linked_label = "rank 3 computes 1.3x slower, rank 6's link at 90 GB/s (2x4 GPUs)"
    out.append(Fix("straggler-rank", "ddp_straggler", {"straggler_slowdown": 1.0}, predicted_key="alone:3", spec=linked,
                   label=f"{linked_label}: rank 3 alone"))
    # the link alone: comm-bound-step's faster-link fix (the replay's link counterfactual, α-β)
    out.append(Fix("comm-bound-step", "ddp_straggler", {"slow_link_rank": None}, "nics_per_node", spec=linked,
                   label=f"{linked_label}: the link alone"))
    out.append(Fix("straggler-rank", "ddp_rotating_stall", {"host_stalls": ()}, spec=rotating,
                   label="ranks 1, 4, 6 stall 25 ms in steps 1-3 of 4 (8 GPUs): all three"))
    # every finding's fix at once: the verdict's joint estimate (all fixes together, replayed)
    for spec, changes, label in ((hosts, {"host_stalls": ()}, "ranks 0, 6 stall 30, 22 ms (8 GPUs)"),
                                 (mixed, {"host_stalls": (), "straggler_slowdown": 1.0}, mixed_label),
                                 (rotating, {"host_stalls": ()}, "ranks 1, 4, 6 stall 25 ms in steps 1-3 of 4 (8 GPUs)"),
                                 (linked, {"straggler_slowdown": 1.0, "slow_link_rank": None}, linked_label)):
        out.append(Fix("straggler-rank", "ddp_straggler", changes, predicted_key=JOINT, spec=spec,
                       label=f"{label}: every fix together (the verdict)"))
    return out


JOINT = "joint"  # predicted_key: the verdict's joint estimate, the typical step less ``recoverable.joint_us``


UNSEEN = _unseen()


def fixed_spec(fix: Fix, finding: dict[str, Any], spec: Any) -> Any:
    """``spec`` with the fix applied; ``evidence:KEY`` / ``alternative:FIELD`` values from the finding."""
    changes = {}
    for key, value in fix.changes.items():
        if isinstance(value, str) and value.startswith("evidence:"):
            value = finding["evidence"][value.split(":", 1)[1]]
        elif isinstance(value, str) and value.startswith("alternative:"):
            value = chosen_alternative(fix, finding)["changes"][value.split(":", 1)[1]]
        changes[key] = _frozen(value)
    if fix.same_batch:  # the same batch in more micro-batches: each one's work and transfer shrink
        scale = spec.microbatches / changes["microbatches"]
        changes.update({key: max(1, round(getattr(spec, key) * scale)) for key in PIPELINE_WORK})
    return replace(spec, **changes)


def _frozen(value: Any) -> Any:
    """A TOML array as the tuple a JobSpec field holds (host_stalls: tuples of (rank, µs, every))."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def chosen_alternative(fix: Fix, finding: dict[str, Any]) -> dict[str, Any]:
    alternatives = finding["evidence"]["prediction"].get("alternatives") or []
    return next(a for a in alternatives if fix.alternative in (a.get("changes") or {}))


def predicted_step_us(fix: Fix, finding: dict[str, Any]) -> float:
    """The finding's predicted step for the fix: its prediction, an alternative's, an evidence
    key's, or (``alone:RANK``) what fixing that rank alone predicts (straggler-rank's per_rank)."""
    if fix.predicted_key and fix.predicted_key.startswith("alone:"):
        rank = int(fix.predicted_key.split(":", 1)[1])
        return next(p["predicted_step_alone_us"] for p in finding["evidence"]["per_rank"] if p["rank"] == rank)
    if fix.alternative:
        return chosen_alternative(fix, finding)["projected_step_time_us"]
    if fix.predicted_key:
        return finding["evidence"][fix.predicted_key]
    return finding["evidence"]["prediction"]["predicted_step_time_us"]


def resimulated_step_us(spec: Any) -> float:
    """The step time the generator simulates (its truth alone, no trace rendering)."""
    if hasattr(spec, "layout"):  # a ParallelSpec
        return float(build_parallel_truth(spec)["step_time_us"])
    return float(build_truth(build_program(spec))["step_time_us"])


def _diagnose_unseen(spec: Any, folder: Path):
    out = write_parallel_job(spec, folder) if hasattr(spec, "layout") else write_job(spec, folder)
    return diagnose(sorted(str(p) for p in out.glob("rank-*.json.gz")), DiagnoseOptions(workers=1))


def audit(fix: Fix, result: Any) -> Audit:
    finding = next(f for f in result.findings if f["rule"] == fix.rule)
    spec = fix.spec or SCENARIOS.get(fix.scenario) or PARALLEL_SCENARIOS[fix.scenario]
    predicted = result.model.step_time_us - result.recoverable["joint_us"] if fix.predicted_key == JOINT \
        else predicted_step_us(fix, finding)
    return Audit(fix, ", ".join(f"{k}={_text(v)}" for k, v in fixed_spec(fix, finding, spec).__dict__.items()
                                if k in fix.changes or (fix.same_batch and k in PIPELINE_WORK)), float(predicted),
                 resimulated_step_us(fixed_spec(fix, finding, spec)), float(result.model.step_time_us))


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value).lower() if isinstance(value, bool) else str(value)


def sample_audits() -> list[Audit]:
    return [audit(fix, diagnosed(f"synthetic/{fix.scenario}")) for fix in case_fixes()]


def unseen_audits(root: Path | None = None) -> list[Audit]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        base = root or Path(tmp)
        results: dict[str, Any] = {}
        for fix in UNSEEN:
            if fix.spec.name not in results:
                results[fix.spec.name] = _diagnose_unseen(fix.spec, base / fix.spec.name)
            out.append(audit(fix, results[fix.spec.name]))
    return out


def markdown(samples: list[Audit], unseen: list[Audit]) -> str:
    """The table of docs/models.md: one row per audited fix."""
    lines = ["| job | rule | fix re-simulated (generator) | measured ms | predicted ms | re-simulated ms | error |",
             "|---|---|---|---|---|---|---|"]
    for kind, audits in (("sample", samples), ("unseen", unseen)):
        for a in audits:
            job = f"`{a.fix.scenario}`" if kind == "sample" else f"{a.fix.name} (unseen)"
            text = f"`{a.fix_text}`" + (f" (alternative `{a.fix.alternative}`)" if a.fix.alternative else "")
            lines.append(f"| {job} | `{a.fix.rule}` | {text} | {a.step_us / 1000:.1f} | {a.predicted_us / 1000:.1f} | "
                         f"{a.resimulated_us / 1000:.1f} | {100 * a.error:+.1f}% |")
    errors = sorted(abs(a.error) for a in samples + unseen)
    mid = errors[len(errors) // 2]
    lines += ["", f"{len(errors)} predictions: median |error| {100 * mid:.1f}%, largest {100 * errors[-1]:.1f}% "
                  f"(tolerance {100 * TOLERANCE:.0f}%)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(markdown(sample_audits(), unseen_audits()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
