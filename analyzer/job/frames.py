"""A Result as pandas DataFrames, one row per rank, step, collective, process group or finding.

The rows are the Result's own numbers (no analysis here); the column lists below are the
contract, documented in docs/api.md. pandas is imported only when a table is built, so
``import analyzer`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Protocol

from analyzer.job.model import LEAVES, JobSections, cached_at_peak_bytes, group_label
from analyzer.rank.analysis import RANK_METRICS, rank_entry
from analyzer.rank.attribution import IDLE_CAUSES
from analyzer.rank.timeline import PHASES

if TYPE_CHECKING:
    import pandas as pd


class TableSections(JobSections, Protocol):
    """What the tables read of a ``analyzer.job.result.Result`` (typed by shape: result.py
    imports this module for its ``*_df()`` methods, never the other way round)."""

    @property
    def memory(self) -> dict[str, Any] | None: ...
    @property
    def rows_source(self) -> Any: ...
    @property
    def collectives(self) -> Any: ...
    @property
    def findings(self) -> list[dict[str, Any]]: ...

RANK_COLUMNS = ("rank", "host", "path", "world_size", "backend", "n_steps", "step_time_us", *RANK_METRICS,
                "gpu_event_count")
STEP_METRICS = ("step_time_us", "span_us", "busy_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us",
                "idle_us", "overlap_pct", "cpu_step_us", "low_precision_compute_us")
# A step's exposed communication split by training phase (the step's ``phases`` entry).
PHASE_COLUMNS = tuple(f"exposed_{phase}_us" for phase in PHASES)
STEP_COLUMNS = ("rank", "step", *STEP_METRICS, *PHASE_COLUMNS)
BREAKDOWN_COLUMNS = ("rank", "step", "role", "step_time_us", *LEAVES, *(f"idle_{c}_us" for c in IDLE_CAUSES),
                     "idle_queued_us", *PHASE_COLUMNS, "waited_for")
COLLECTIVE_COLUMNS = ("rank", "step", "phase", "collective", "group", "group_name", "group_size", "group_description", "seq",
                      "comms_id", "dtype", "bytes", "in_nelems", "out_nelems", "size_source", "launch_us",
                      "start_us", "dur_us", "exposed_us", "wait_us", "algbw_gbps", "busbw_gbps", "bound",
                      "on_gpu", "stream", "module", "kernel")
GROUP_COLUMNS = ("group", "name", "description", "size", "ranks", "nodes", "cross_node", "kinds", "collectives",
                 "alpha_us", "beta_gbps", "s_star_bytes", "busbw_gbps", "busbw_basis", "fit_source", "fit")
COMPUTE_COLUMNS = ("rank", "step", "role", "op", "family", "dtype", "shape", "bucket", "count", "flops_each", "flops",
                   "timed_count", "gpu_us", "tflops_per_s", "pct_of_peak", "note")
MEMORY_COLUMNS = ("rank", "device", "relative", "device_bytes", "step", "events", "start_allocated_bytes",
                  "peak_allocated_bytes", "end_allocated_bytes", "peak_reserved_bytes", "reserved_at_peak_bytes",
                  "cached_at_peak_bytes", "headroom_bytes", "allocations", "frees", "segment_grows",
                  "segment_releases", "peak_phase", "peak_offset_us", "peak_op", "peak_fsdp_unit")
# Columns of whole numbers (ranks, steps, counts, sizes in bytes): pandas' nullable ``Int64``
# in every table, so a rank stays an integer where some rows have none (numpy would make the
# column float64, or object when the table is empty).
INTEGER_COLUMNS = frozenset({
    "rank", "step", "waited_for", "world_size", "n_steps", "gpu_event_count", "group_size", "seq", "bytes",
    "in_nelems", "out_nelems", "size", "nodes", "collectives", "count", "timed_count", "device_bytes", "events",
    "start_allocated_bytes", "peak_allocated_bytes", "end_allocated_bytes", "peak_reserved_bytes",
    "reserved_at_peak_bytes", "cached_at_peak_bytes", "headroom_bytes", "allocations", "frees", "segment_grows",
    "segment_releases"})
FINDING_COLUMNS = ("rule", "code", "severity", "title", "summary", "estimated_gain_us", "ranks", "steps",
                   "model", "fix_text", "fix_snippet", "references")


def memory_df(result: TableSections) -> "pd.DataFrame":
    """One row per rank and step of measured memory (the ``memory`` section; none when the
    traces hold no allocator events)."""
    rows = []
    for m in (result.memory or {}).get("ranks") or []:
        for s in m["steps"]:
            at = s.get("peak_at") or {}
            rows.append({"rank": m["rank"], "device": m["device"], "relative": m["relative"],
                         "device_bytes": m.get("device_bytes"), **s,
                         "cached_at_peak_bytes": cached_at_peak_bytes(s),  # the text memory table's too
                         "peak_phase": at.get("phase"), "peak_offset_us": at.get("offset_us"),
                         "peak_op": at.get("op"), "peak_fsdp_unit": at.get("fsdp_unit")})
    return _frame(rows, MEMORY_COLUMNS)


def ranks_df(result: TableSections) -> "pd.DataFrame":
    rows = []
    for r in result.ranks:
        entry = rank_entry(r)
        rows.append({**entry, "n_steps": len(r.steps)})
    return _frame(rows, RANK_COLUMNS)


def steps_df(result: TableSections) -> "pd.DataFrame":
    rows = []
    for r in result.ranks:
        for step in r.steps:
            phases = step.get("phases") or {}
            rows.append({"rank": r.rank, **step,
                         **{col: phases.get(phase) for col, phase in zip(PHASE_COLUMNS, PHASES)}})
    return _frame(rows, STEP_COLUMNS)


def breakdown_df(result: TableSections) -> "pd.DataFrame":
    """One row per rank and step: its role (typical, steady, warm-up, drain, outlier,
    unmeasured), its time and the five leaves that add up to it (analyzer.job.model), the idle by
    what the host was doing and the queued rest (together: the idle leaf), the exposed
    communication by phase, and the rank it waited for most. A step without a breakdown has its
    time and role, and None for the leaves."""
    model = result.model
    rows = []
    for rank in result.ranks:
        facts = model.rank(rank.rank)
        for entry, step in zip(rank.steps, facts.steps if facts else ()):
            row: dict[str, Any] = {"rank": rank.rank, "step": step.step, "role": step.role,
                                   "step_time_us": step.step_time_us}
            if step.leaves is not None:
                row.update({leaf: step.leaves.leaf(leaf) for leaf in LEAVES})
                row.update({f"idle_{c}_us": step.idle_by_host.get(c, 0.0) for c in IDLE_CAUSES})
                row["idle_queued_us"] = step.idle_queued_us
            phases = entry.get("phases") or {}
            row.update({col: phases.get(phase) for col, phase in zip(PHASE_COLUMNS, PHASES)})
            peers = {p: v for p, v in step.wait_by_peer.items() if p.isdigit() and v > 0}
            row["waited_for"] = int(max(peers, key=lambda p: (peers[p], p))) if peers else None
            rows.append(row)
    return _frame(rows, BREAKDOWN_COLUMNS)


def collectives_df(result: TableSections) -> "pd.DataFrame":
    """One row per collective on a rank; ``group`` is the group as every view names it
    (analyzer.job.model.group_label: its description, else its name), ``group_name`` the
    process group's own name."""
    if result.rows_source is not None:  # a saved large result: from its rows file, by column
        df = result.rows_source.frame(COLLECTIVE_COLUMNS)  # its ``group``: the group's name
        named = df["group_description"].where(df["group_description"].notna() & (df["group_description"] != ""))
        df["group_name"] = df["group"]
        df["group"] = named.fillna(df["group_name"]).where(df["group_name"].notna() | named.notna(), None)
        return _typed(df)
    rows = []
    for c in result.collectives:
        group = c.get("group")
        # a row's group is {name, size, description, ranks}; the member list stays in groups_df
        if isinstance(group, dict):
            c = {**c, "group": group_label(group), "group_name": group.get("name"), "group_size": group.get("size"),
                 "group_description": group.get("description")}
        rows.append(c)
    return _frame(rows, COLLECTIVE_COLUMNS)


def compute_df(result: TableSections) -> "pd.DataFrame":
    """One row per rank × step × distinct (op, shape, dtype) whose FLOPs the recorded shapes
    give: its count, FLOPs, the GPU time of its instances that launched kernels, TFLOP/s and % of
    the peak of its dtype (analyzer.job.compute)."""
    from analyzer.job.compute import shape_rows
    return _frame(shape_rows(result), COMPUTE_COLUMNS)


def groups_df(result: TableSections) -> "pd.DataFrame":
    """One row per process group; ``group`` is its name as every view writes it."""
    return _frame(({**g, "group": group_label(g)} for g in result.groups or []), GROUP_COLUMNS)


def findings_df(result: TableSections) -> "pd.DataFrame":
    rows = [{**f, "fix_text": (f.get("fix") or {}).get("text"), "fix_snippet": (f.get("fix") or {}).get("snippet")}
            for f in result.findings]
    return _frame(rows, FINDING_COLUMNS)


def _frame(rows: Iterable[dict[str, Any]], columns: tuple[str, ...]) -> "pd.DataFrame":
    """Exactly ``columns``, in that order (a key a row lacks is None), even with no rows."""
    import pandas as pd
    return _typed(pd.DataFrame([{col: row.get(col) for col in columns} for row in rows], columns=list(columns)))


def _typed(df: "pd.DataFrame") -> "pd.DataFrame":
    """The integer columns as ``Int64`` (those whose values are all whole numbers or missing)."""
    import pandas as pd
    for col in INTEGER_COLUMNS.intersection(df.columns):
        kind = pd.api.types.infer_dtype(df[col], skipna=True)
        if kind in ("floating", "mixed-integer-float"):  # a None made numpy's column float
            values = pd.to_numeric(df[col].dropna())
            kind = "integer" if bool((values % 1 == 0).all()) else kind
        if kind in ("integer", "empty"):
            df[col] = df[col].astype("Int64")
    return df
