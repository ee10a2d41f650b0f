"""The label and unit of each field the views render that no rule's evidence type declares: a
finding's prediction's assumptions, the what-if's assumptions, the job's hardware section
(reports/prediction.py, reports/whatif_text.py, the HTML hardware and scaling tables). A rule's
evidence is declared by its type (analyzer.rules.evidence_types, issue 40: each field's label and
unit in its annotation), which the views render from; this table is also their fallback for a
saved finding of a rule this tracecliff no longer has (its other keys then show as words).

A field is a value (``unit``), a mapping keyed by data (``keys``: what its keys are, a rank, a
step, a collective...; its values in ``unit`` or records of declared fields), a list of rows
(``columns``: each position's heading and unit), or ``[key, {inner: value}]`` pairs (``keys``
and ``inner``: a table of, e.g., steps by rank). Units: ``us`` µs, ``bytes``, ``gbps`` GB/s,
``pct`` a percentage, ``share`` a fraction shown as %, ``mb`` MB, ``tflops`` TFLOP/s, ``None`` a
count or plain number, ``text``. ``tests/test_one_truth.py`` checks that every assumption and
hardware field on the sample jobs and the rules' cases is declared here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field as _field


@dataclass(frozen=True)
class Field:
    label: str
    unit: str | None = None
    keys: str | None = None  # a mapping keyed by data: what a key is ("rank", "step", "collective")
    inner: str | None = None  # [key, {inner: value}] pairs: what the inner mapping's keys are
    columns: tuple[tuple[str, str | None], ...] = ()  # rows as lists: each position's heading and unit
    # a record (a nested evidence type, or the records a mapping or list holds): its own fields'
    # declarations, which the views read inside it before the enclosing ones (a record's
    # ``peak_bytes`` is not the enclosing evidence's)
    record: Mapping[str, "Field"] | None = _field(default=None, compare=False, hash=False, repr=False)


F = Field
US, BYTES = "us", "bytes"

FIELDS: dict[str, Field] = {
    # a link's α-β fit (analyzer.model.link.Link.evidence), in the prediction's and the what-if's
    # assumptions (a rule's evidence declares it in its type: rules.evidence_types.AlphaBetaLink)
    "nodes": F("nodes"),
    "n": F("ranks"),
    "cross_node": F("crosses nodes"),
    "link": F("link (α-β)"),
    "intra_node_link": F("link inside a node (α-β)"),
    "alpha_us": F("α (latency)", US),
    "beta_gbps": F("β (bandwidth)", "gbps"),
    "s_star_bytes": F("S* = α·β (latency-bandwidth crossover)", BYTES),
    "source": F("source", "text"),
    # the job's hardware and the what-if's configuration
    "gpus_per_node": F("GPUs per node"),
}

# The assumptions of a finding's prediction (evidence ``prediction.assumptions``) and of a what-if
# projection (analyzer.whatif), and the job's hardware: the views render them with the same
# declarations (reports/prediction.py, reports/whatif_text.py, the HTML hardware and scaling tables).
FIELDS.update({
    # a finding's prediction
    "overlap": F("overlap", "text"),
    "waiting": F("waiting for late peers", US),
    "units": F("FSDP units"),
    "unit_sizes": F("unit sizes", "text"),
    "prefetch": F("prefetch", "text"),
    "sharding": F("sharding", "text"),
    "placement": F("placement", "text"),
    "work": F("work", "text"),
    "schedule": F("schedule", "text"),
    "transfers": F("transfers", "text"),
    "gradient_bytes": F("gradient bytes", BYTES),
    "gradient_bytes_scale": F("gradient bytes, × the measured"),
    "fixed": F("ranks fixed (their cause)", "text", keys="rank"),
    "steps_replayed": F("steps replayed"),
    "exposed_cut_us": F("exposed communication the model cuts", US),
    # a what-if projection's measured and target configuration
    "measured_gpus": F("measured GPUs"),
    "measured_gpus_per_node": F("measured GPUs per node"),
    "measured_nodes": F("measured nodes"),
    "measured_nic_alpha_us": F("measured NIC α (latency)", US),
    "measured_nic_gbps": F("measured NIC bandwidth", "gbps"),
    "measured_nics_per_node": F("measured NICs per node"),
    "measured_strategy": F("measured strategy", "text"),
    "intra_alpha_us": F("α inside a node (latency)", US),
    "intra_beta_gbps": F("β inside a node (bandwidth)", "gbps"),
    "intra_link": F("link inside a node"),
    "cross_node_link": F("link across nodes"),
    "gpus": F("GPUs"),
    "nics_per_node": F("NICs per node"),
    "nic_gbps": F("NIC bandwidth", "gbps"),
    "strategy": F("strategy", "text"),
    "bucket_cap_mb": F("bucket_cap_mb", "mb"),
    "fsdp_units": F("FSDP units"),
    "compute": F("compute", "text"),
    "model_params": F("model parameters"),
    "tokens_per_step": F("tokens per step"),
    "peak_tflops": F("peak", "tflops"),
    # the job's hardware (analyzer.job hardware section)
    "gpu_name": F("GPU", "text"),
    "gpu_profile": F("hardware profile", "text"),
    "hbm_gbps": F("HBM bandwidth", "gbps"),
    "intra_node_alpha_us": F("α inside a node (latency)", US),
    "intra_node_gbps": F("bandwidth inside a node", "gbps"),
    "memory_bytes": F("GPU memory", BYTES),
    "nic_alpha_us": F("NIC α (latency)", US),
    "nic_line_rate_gbit": F("NIC line rate (Gb/s)"),
    "peak_fp32_tflops": F("peak fp32", "tflops"),
    "peak_fp8_tflops": F("peak fp8", "tflops"),
    "peak_tf32_tflops": F("peak tf32", "tflops"),
})


def field(key: object) -> Field | None:
    """The declaration of evidence field ``key`` (None: not declared)."""
    return FIELDS.get(str(key))
