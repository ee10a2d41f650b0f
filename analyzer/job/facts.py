"""Facts shared by the rules, computed once per run from the Result: per-step views with the
phase windows in job time, the typical step, each process group's α/β (fitted by the job
analysis when it ran, else from the hardware profile), and which analyses are available."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from functools import cached_property
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from analyzer.base.arrays import unique_ints
from analyzer.base.rowtable import RowSubset, RowTable
from analyzer.job.buckets import BucketTable
from analyzer.job.columns import CollectiveColumns, distinct_rows, sequential_sums
from analyzer.job.model import RankStep
from analyzer.job.parallelism import data_parallel_mask, role_key
from analyzer.job.result import Bucket
from analyzer.model import formulas as models
from analyzer.job.topology import Topology
from analyzer.model.link import Link, group_link, profile_link

POINT_TO_POINT = ("send", "recv", "sendrecv")
# Needs whose absence hides a problem rather than rule it out.
_CANNOT_SEE = frozenset({"gpu_steps", "multi_rank", "all_ranks"})


class JobFacts:
    def __init__(self, result: Any):
        self.result = result
        self.job = result.job
        # The data-parallel strategy (ddp, fsdp1, fsdp2, fsdp, unknown) the DDP/FSDP rules
        # test; results saved before job.dp_strategy existed had it in job.strategy.
        self.strategy = result.job.get("dp_strategy") or result.job.get("strategy") or "unknown"

    @cached_property
    def model(self):
        """The job's typed facts (analyzer.job.model): the figures every rule quotes."""
        return self.result.model

    # ---------------------------------------------------------------- steps
    @cached_property
    def steps(self) -> list[RankStep]:
        """Every rank's every step (the job model's), in rank order."""
        return list(self.model.rank_steps())

    def steady_view(self, rank: int, step: Any) -> RankStep | None:
        """``step_view`` of a steady step only (the typical step or another steady one; any step
        when the job has no typical step): the warm-up, drain and outlier steps are left out of
        the rules as out of every figure."""
        if self.model.typical is not None and self.model.step_role(step) not in ("typical", "steady"):
            return None
        return self.step_view(rank, step)

    def step_view(self, rank: int, step: Any) -> RankStep | None:
        return self._step_index.get((rank, step))

    @cached_property
    def _step_index(self) -> dict[tuple[int, Any], RankStep]:
        return {(s.rank, s.step): s for s in self.steps}

    # ---------------------------------------------------------------- collectives
    def collectives_of(self, rank: int, step: Any) -> list[dict[str, Any]]:
        index = self._collectives_index.get((rank, step))
        return [] if index is None else self._table.dicts(index)

    @property
    def _table(self) -> RowTable:
        """The rows by column (a list of row dicts given is read into the view's table)."""
        return CollectiveColumns.of(self.result).rows

    @cached_property
    def backward_allreduce_groups(self) -> dict[tuple[int, Any], Any]:
        """{(rank, step): the ``group`` of its first backward all-reduce row, in row order}: the
        first such row of ``collectives_of``, found for every step in one pass over the columns."""
        pair, keys = self._step_pairs
        view = CollectiveColumns.of(self.result)
        rows = np.flatnonzero(view.kind.isin(("allreduce",)) & view.phase.isin(("backward",)))
        pairs, first = unique_ints(pair[rows], return_index=True)
        groups = self._table.values("group")
        return {keys[p]: groups[row] for p, row in zip(pairs.tolist(), rows[first].tolist())}

    @cached_property
    def _step_pairs(self) -> tuple[np.ndarray, list[tuple[int, Any]]]:
        """Each row's (rank, step) number and the pairs by number, in order of first appearance."""
        view = CollectiveColumns.of(self.result)
        if not view.n:
            return np.zeros(0, dtype=np.int64), []
        first, _, pair = distinct_rows([view.rank, view.step.codes])
        return pair, [(int(view.rank[i]), view.step.at(i)) for i in first.tolist()]

    @cached_property
    def _collectives_index(self) -> dict[tuple[int, Any], np.ndarray]:
        """{(rank, step): its rows' positions, in row order} (the dicts made when asked for)."""
        pair, keys = self._step_pairs
        order = np.argsort(pair, kind="stable")
        bounds = np.searchsorted(pair[order], np.arange(len(keys) + 1)).tolist()
        return {key: order[lo:hi] for key, lo, hi in zip(keys, bounds[:-1], bounds[1:])}

    @cached_property
    def backward_allreduce_transfer_us(self) -> dict[tuple[int, Any], float | int]:
        """{(rank, step): the summed ``transfer_time`` of its backward all-reduces (T_comm of a
        DDP step)}, summed as ``sum()`` over the rows in order gives it."""
        return self._backward_allreduce_sums(self.transfer_times)

    @cached_property
    def backward_allreduce_upper_us(self) -> dict[tuple[int, Any], float | int]:
        """``backward_allreduce_transfer_us`` with no α-β cap: on a partial job, the most the
        transfer can be (the kernels less the waits the given ranks measure)."""
        return self._backward_allreduce_sums(self.transfer_upper_times)

    def _backward_allreduce_sums(self, times: np.ndarray) -> dict[tuple[int, Any], float | int]:
        view = CollectiveColumns.of(self.result)
        pair, keys = self._step_pairs
        rows = np.flatnonzero(view.kind.isin(("allreduce",)) & view.phase.isin(("backward",)))
        sums = sequential_sums(times[rows], pair[rows], len(keys))
        return {key: total for key, total in zip(keys, sums)}

    @cached_property
    def transfer_upper_times(self) -> np.ndarray:
        """Each row's duration less the wait the cross-rank matching measured: its transfer time
        when every member is given, at most that when some are not (their wait is unseen)."""
        view = CollectiveColumns.of(self.result)
        waits = view.written("wait_us")
        matched = ~np.isnan(waits) & view.on_gpu & ~view.kind.isin(POINT_TO_POINT)
        return np.where(matched, view.dur - np.where(matched, waits, 0.0), view.dur)

    @cached_property
    def transfer_times(self) -> np.ndarray:
        """``transfer_time`` of every row, as an array (the α-β cap row by row, only where it
        applies: some ranks missing, size and kind known)."""
        view = CollectiveColumns.of(self.result)
        times = self.transfer_upper_times.copy()
        if not self._every_rank:
            capped = np.flatnonzero(view.kind.isin(tuple(models.COLLECTIVE_KINDS)) & (view.size != 0)
                                    & ~np.isnan(view.size))
            times[capped] = [self.transfer_time(row) for row in self._table.dicts(capped)]
        return times

    def transfer_time(self, row: dict[str, Any]) -> float:
        """A collective's transfer time (µs): the shortest duration across the ranks given.
        When some ranks are missing that minimum may still include waiting for one of them, so
        it is capped by the α-β model time when the group's link is known."""
        measured = self.transfer_upper_time(row)
        if self._every_rank or not row.get("bytes") or row["collective"] not in models.COLLECTIVE_KINDS:
            return measured
        link = self.link(row.get("group") or {})
        return min(measured, link.time_us(row["collective"], row["bytes"])) if link else measured

    @staticmethod
    def transfer_upper_time(row: dict[str, Any]) -> float:
        """A row's ``transfer_upper_times``: its duration less the wait the matching measured."""
        wait = row.get("wait_us")  # the cross-rank matching's (analyzer.job.crossrank): dur − the set's shortest
        if wait is not None and row.get("on_gpu") and row["collective"] not in POINT_TO_POINT:
            return row["dur_us"] - wait
        return row["dur_us"]

    @cached_property
    def _every_rank(self) -> bool:
        return len(self.result.ranks) >= self.world_size

    @cached_property
    def members_missing(self) -> str | None:
        """On a partial job (fewer ranks' traces than ``world_size``), how many are given, in the
        words a rule that cannot check says it: "needs every member's trace (1 of 8 given)";
        None when every rank's trace is given."""
        if self._every_rank:
            return None
        return f"needs every member's trace ({len(self.result.ranks)} of {self.world_size} given)"

    def transfer_bound(self, rows: Iterable[dict[str, Any]]) -> tuple[bool, str | None]:
        """(whether the transfer time of these collective rows is bounded, what bounds it or
        why nothing does) on a job whose traces are a subset: a kernel's duration is its
        transfer plus waiting for the members not given, and only the link model (hardware
        profile or --gpu / --nics-per-node / --nic-gbps) bounds the transfer
        (``transfer_time``); nothing does where a row's size, kind model or group link is
        unknown. (True, None) when every rank's trace is given (the cross-rank matching
        measures it)."""
        if self._every_rank:
            return True, None
        sources = set()
        for row in rows:
            link = self.link(row.get("group") or {})
            if not row.get("bytes"):
                return False, "a collective's message size is not recorded"
            if row["collective"] not in models.COLLECTIVE_KINDS:
                return False, f"no α-β model of a {row['collective']} collective"
            if link is None:
                return False, "no link model (hardware profile or --gpu, --nics-per-node, --nic-gbps) for its group"
            sources.add(link.source)
        return True, (f"transfer bounded by the link model ({'; '.join(sorted(sources))}), the rest of each "
                      f"kernel being waiting or contention (the other members' traces are missing: "
                      f"{len(self.result.ranks)} of {self.world_size} given)")

    @cached_property
    def data_parallel_collectives(self) -> RowSubset:
        """The collectives of data-parallel groups (analyzer.job.parallelism): what gradient
        and parameter rules may read; a tensor-parallel all-reduce is no gradient all-reduce.
        A sequence of the row dicts, made as they are read."""
        return RowSubset(self._table, self._data_parallel_rows)

    @cached_property
    def _data_parallel_rows(self) -> np.ndarray:
        keep = data_parallel_mask(CollectiveColumns.of(self.result), self.job.get("group_roles") or {})
        return np.flatnonzero(keep)

    def data_parallel_of(self, kind: str, phase: str) -> RowSubset:
        """``[c for c in data_parallel_collectives if c["collective"] == kind and c["phase"] ==
        phase]``, chosen from the columns (no row is read)."""
        view, index = CollectiveColumns.of(self.result), self._data_parallel_rows
        chosen = index[view.kind.isin((kind,))[index] & view.phase.isin((phase,))[index]]
        return RowSubset(self._table, chosen)

    def rows_of_kinds(self, kinds: tuple[str, ...]) -> RowSubset:
        """The rows of these collective kinds, in row order (chosen from the kinds' column; the
        dicts made as they are read)."""
        view = CollectiveColumns.of(self.result)
        return RowSubset(self._table, np.flatnonzero(view.kind.isin(kinds)))

    def all_gather_dtypes(self) -> list[Any]:
        """The ``dtype`` of every all-gather row, in row order (read from its column)."""
        view = CollectiveColumns.of(self.result)
        dtypes = self._table.values("dtype")
        return [dtypes[i] for i in np.flatnonzero(view.kind.isin(("allgather",))).tolist()]

    def role_of(self, row: dict[str, Any]) -> str:
        """The role of a collective's process group (analyzer.job.parallelism)."""
        return (self.job.get("group_roles") or {}).get(role_key(row), "unknown")

    def rows_by_step(self, role: str) -> dict[tuple[int, Any], list[dict[str, Any]]]:
        """GPU collectives of one role per (rank, step) that have a step."""
        out: dict[tuple[int, Any], list[dict[str, Any]]] = {}
        view = CollectiveColumns.of(self.result)
        if not view.n:
            return out
        codes, roles = view.group_keys(self.role_of)  # a role depends on the group and kind only
        chosen = np.flatnonzero(np.array([r == role for r in roles], dtype=bool)[codes] & view.on_gpu)
        for row in self._table.dicts(chosen):
            if row["step"] is not None:
                out.setdefault((row["rank"], row["step"]), []).append(row)
        return out

    @cached_property
    def parallelism(self) -> dict[str, dict[str, Any]]:
        return self.job.get("parallelism") or {}

    def buckets_by_step(self) -> dict[tuple[int, Any], list[Any]]:
        """{(rank, step): its DDP buckets by index}."""
        buckets = self.result.buckets
        if isinstance(buckets, BucketTable):  # made once here (iterated twice below)
            buckets = buckets.tolist()
        # a Bucket's fields as attributes: its b["key"] is a Python call, millions of them here
        read = attrgetter if buckets and isinstance(buckets[0], Bucket) else itemgetter
        out: dict[tuple[int, Any], list[Any]] = {}
        # a step's buckets mostly lie together (the reduce's order): a run at a time
        for key, run in groupby(zip(map(read("rank", "step"), buckets), buckets), key=itemgetter(0)):
            out.setdefault(key, []).extend(map(itemgetter(1), run))
        index = read("index")
        for rows in out.values():
            rows.sort(key=index)
        return out

    @staticmethod
    def bucket_fields(buckets: list[Any], keys: tuple[str, ...]) -> list[tuple[Any, ...]]:
        """``[tuple(b.get(key) for b in buckets) for key in keys]``, a Bucket's fields read as
        attributes (its ``b[key]`` is a Python call)."""
        if not buckets:
            return [() for _ in keys]
        if isinstance(buckets[0], Bucket) and len(keys) > 1:  # attrgetter of 2+ names gives tuples
            return list(zip(*map(attrgetter(*keys), buckets)))
        return [tuple(b.get(key) for b in buckets) for key in keys]

    def units_by_pass(self) -> dict[tuple[int, Any, str, str], list[dict[str, Any]]]:
        """FSDP units per (rank, step, phase, collective), in order."""
        out: dict[tuple[int, Any, str, str], list[dict[str, Any]]] = {}
        for u in self.result.fsdp_units:
            out.setdefault((u["rank"], u["step"], u["phase"], u["collective"]), []).append(u)
        for rows in out.values():
            rows.sort(key=lambda u: u["index"])
        return out

    # ---------------------------------------------------------------- topology and links
    @cached_property
    def world_size(self) -> int:
        return int(self.job.get("world_size") or len(self.result.ranks) or 1)

    @property
    def hardware(self):
        """The hardware the job analysis resolved (analyzer.job.model): never worked out again."""
        return self.model.hardware

    @property
    def topology(self) -> Topology:
        return self.model.topology

    @property
    def gpus_per_node(self) -> int:
        return self.topology.gpus_per_node

    def node_of(self, rank: int) -> str:
        """The rank's host name when the traces say, else its node under the torchrun layout."""
        return self.topology.node_of(rank)

    def group_ranks(self, group: dict[str, Any]) -> list[int]:
        ranks = group.get("ranks")
        return list(ranks) if ranks else list(range(self.world_size))

    def group_nodes(self, group: dict[str, Any]) -> int:
        return len(self.topology.nodes_of(self.group_ranks(group)))

    def link(self, group: dict[str, Any]) -> Link | None:
        """α/β of a collective's process group: the job analysis's fit when present, else the
        hardware profile (None when neither is known, e.g. CPU-only traces). Once per group
        object (rows share them; the group is kept so that its id is never reused): finding a
        group's nodes reads all its members, per step and rule otherwise."""
        if not group:
            return self._link(group)
        known = self._links.get(id(group))
        if known is None:
            known = self._links[id(group)] = (group, self._link(group))
        return known[1]

    @cached_property
    def _links(self) -> dict[int, tuple[dict[str, Any], Link | None]]:
        return {}

    def _link(self, group: dict[str, Any]) -> Link | None:
        n = int(group.get("size") or len(self.group_ranks(group)))
        return group_link(self._fitted_groups.get(group.get("name")), self.hardware, n, self.group_nodes(group),
                          len(self.group_ranks(group)))

    def profile_link(self, n: int, nodes: int, members: int | None = None) -> Link | None:
        return profile_link(self.hardware, n, nodes, members)

    @cached_property
    def _fitted_groups(self) -> dict[Any, dict[str, Any]]:
        return {g.get("name"): g for g in self.result.groups or [] if isinstance(g, dict)}

    # ---------------------------------------------------------------- applicability
    def group_size(self, group: dict[str, Any] | None) -> int:
        """Members of a collective's process group: its size, else its ranks, else the world."""
        group = group or {}
        size = group.get("size") or (len(group["ranks"]) if group.get("ranks") else None)
        return int(size) if size else self.world_size

    @cached_property
    def communicating(self) -> bool:
        """Whether any collective runs among two or more processes (a group of one, as DDP on
        one GPU issues, moves nothing)."""
        view = CollectiveColumns.of(self.result)
        return any(self.group_size(g) >= 2 for g in view.group.names) if view.n else False

    @cached_property
    def gradient_collectives(self) -> bool:
        """Whether the job reduces gradients across ranks: a data-parallel all-reduce or
        reduce-scatter launched in backward, in a group of two or more."""
        view, index = CollectiveColumns.of(self.result), self._data_parallel_rows
        if not len(index):
            return False
        rows = index[view.kind.isin(("allreduce", "reduce_scatter"))[index] & view.phase.isin(("backward",))[index]]
        sizes = {code: self.group_size(view.group.names[code]) for code in unique_ints(view.group.codes[rows]).tolist()}
        return any(size >= 2 for size in sizes.values())

    def _no_gpu_steps(self) -> str:
        if self.model.gpu_events:
            return "no GPU steps in the traces"
        if self.model.unread_device_events:
            return "no GPU work read (events under unknown categories look like device work: see warnings)"
        return "no GPU work in the traces (CPU-only): no GPU timeline to measure"

    # ---------------------------------------------------------------- the job's kind
    @cached_property
    def kind(self) -> str:
        """``training`` or ``inference``: the job model's workload (analyzer.rank.workload: inference
        only where every rank's host side is in the trace and none shows a backward pass, an
        optimizer step or their kernels). A job that cannot tell is taken as training, the tool's
        subject: absence of evidence counts only where the evidence could have been recorded."""
        return "inference" if self.model.workload == "inference" else "training"

    # ---------------------------------------------------------------- what a fix needs
    def fix_precondition(self, name: str) -> str | None:
        """Whether the job is one a fix requiring ``name`` (FIX_PRECONDITIONS) applies to: None
        when it holds, else why not (one clause)."""
        return _PRECONDITIONS[name](self)

    @cached_property
    def gradient_dtypes(self) -> dict[str, int]:
        """{dtype: rows} of the gradient collectives (data-parallel all-reduces and
        reduce-scatters in backward) whose dtype is recorded."""
        view, index = CollectiveColumns.of(self.result), self._data_parallel_rows
        rows = index[view.kind.isin(("allreduce", "reduce_scatter"))[index] & view.phase.isin(("backward",))[index]]
        among_two = np.array([self.group_size(g) >= 2 for g in view.group.names], dtype=bool)
        rows = rows[among_two[view.group.codes[rows]]] if len(among_two) else rows[:0]
        dtypes = self._table.values("dtype")  # read from the column, no row dict made
        counts = Counter(dtypes[i] for i in rows.tolist())
        return {str(d): n for d, n in sorted(counts.items(), key=lambda kv: str(kv[0])) if d is not None}

    @cached_property
    def host_idle_leaders(self) -> set[str]:
        """The host activities (analyzer.rank.attribution's idle by host) that lead some rank's
        typical-step idle: where the host time goes on that rank."""
        leaders = set()
        for r in self.result.ranks:
            by_host = ((r.time_breakdown or {}).get("details") or {}).get("idle_by_host") or {}
            times = {str(k): float(v or 0.0) for k, v in by_host.items()}
            best = max(times.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0.0))
            if best[1] > 0:
                leaders.add(best[0])
        return leaders

    def missing(self, needs: tuple[str, ...]) -> tuple[str, str] | None:
        """(status, reason) when a rule with these needs cannot run on this job, None when it
        can: ``not_evaluated`` when the job may have the problem but the traces cannot show it
        (no GPU steps, ranks missing), ``not_applicable`` when the job cannot have it."""
        checks = {
            "gpu_steps": (lambda: any(s.windows for s in self.steps),
                          self._no_gpu_steps()),
            "ddp": (lambda: self.strategy in ("ddp", "unknown") and bool(self.result.buckets),
                    "not a DDP job with gradient all-reduces"),
            "fsdp": (lambda: self.strategy.startswith("fsdp") and bool(self.result.fsdp_units), self._no_fsdp_units()),
            "multi_process": (lambda: self.world_size >= 2,
                              "one process (world size 1): no rank to wait for"),
            "communication": (lambda: self.communicating,
                              "no communication: one process (world size 1)" if self.world_size < 2
                              else "no communication: no collective among two or more processes"),
            "gradient_collectives": (lambda: self.gradient_collectives,
                                     "no gradient collectives (a data-parallel all-reduce or reduce-scatter "
                                     "in backward, among two or more processes)"),
            "multi_rank": (lambda: len(self.result.ranks) >= 2, "needs at least 2 ranks' traces"),
            "all_ranks": (lambda: len(self.result.ranks) >= max(2, self.world_size),
                          "needs every rank's trace (the last arrival may be a rank not given)"),
            "collectives": (lambda: bool(self.result.collectives), "no collectives in the traces"),
            "tensor_parallel": (lambda: "tp" in self.parallelism, "no tensor-parallel process group"),
            "pipeline_parallel": (lambda: "pp" in self.parallelism, "no pipeline-parallel process group"),
            "expert_parallel": (lambda: "ep" in self.parallelism, "no expert-parallel communication"),
        }
        # What rules the problem out first: a DDP rule on an FSDP job is not applicable even
        # when the traces have no GPU steps.
        for need in sorted(needs, key=lambda n: n in _CANNOT_SEE):
            ok, reason = checks[need]
            if not ok():
                unseen = need in _CANNOT_SEE or (need == "fsdp" and self._fsdp_units_unseen)
                return ("not_evaluated" if unseen else "not_applicable"), reason
        return None

    @property
    def _fsdp_units_unseen(self) -> bool:
        """An FSDP job among two or more processes whose units the traces do not show."""
        return self.strategy.startswith("fsdp") and self.world_size >= 2

    def _no_fsdp_units(self) -> str:
        """Why there are no FSDP units to check: not FSDP, FSDP on one process (nothing sharded:
        no all-gather, no reduce-scatter), or units the traces do not show."""
        if not self.strategy.startswith("fsdp"):
            return "not an FSDP job"
        if self.world_size < 2:
            return "FSDP on one process (world size 1): nothing is sharded, no all-gather or reduce-scatter"
        return "an FSDP job whose units the traces do not show (no parameter all-gathers matched to them)"


LOW_PRECISION_DTYPES = ("bf16", "f16", "fp16", "bfloat16", "float16", "f8", "fp8")


def _needs_training(facts: JobFacts) -> str | None:
    return None if facts.kind == "training" else "an inference job (no backward pass, no optimizer step)"


def _needs_ddp(facts: JobFacts) -> str | None:
    if facts.strategy == "ddp" or (facts.strategy == "unknown" and facts.result.buckets):
        return None
    return f"not a DDP job ({facts.strategy})"


def _needs_fsdp(facts: JobFacts) -> str | None:
    return None if facts.strategy.startswith("fsdp") else f"not an FSDP job ({facts.strategy})"


def _needs_wide_gradients(facts: JobFacts) -> str | None:
    dtypes = facts.gradient_dtypes
    if not dtypes:
        return "no gradient collective's dtype is recorded" if facts.gradient_collectives else "no gradient collectives"
    if all(d.lower() in LOW_PRECISION_DTYPES or d.lower().startswith(("f8", "fp8", "float8"))
           for d in dtypes):
        return "the gradient collectives already travel in " + ", ".join(f"{d} ({n})" for d, n in dtypes.items())
    return None


def _needs_loader_bound(facts: JobFacts) -> str | None:
    if "input" in facts.host_idle_leaders:
        return None
    return "the data loader is not where the host's idle time goes on any rank"


#: What a fix may require of the job (a rule's ``fix_requires``, or a ``Fix``'s ``requires``),
#: each checked before the fix is printed: the words say what must hold.
FIX_PRECONDITIONS = {
    "training": "the job trains (a backward pass or an optimizer step)",
    "ddp": "a DistributedDataParallel job",
    "fsdp": "an FSDP job",
    "gradients_wide": "the gradient collectives travel wider than 16 bits (fp32)",
    "loader_bound": "the data loader is where the host's idle time goes (on some rank)",
}
_PRECONDITIONS = {"training": _needs_training, "ddp": _needs_ddp, "fsdp": _needs_fsdp,
                  "gradients_wide": _needs_wide_gradients, "loader_bound": _needs_loader_bound}


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
