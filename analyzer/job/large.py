"""A large result: one of more than ``JSON_ROWS`` collective rows, saved as two files.

``result.json`` (schema_version 3) holds what every view quotes: the job, each rank's summary
and steps, the groups, the findings, the digest of every collective row (analyzer.job.digest)
and the ``JSON_ROWS`` collectives with the most exposed time, with ``collective_rows`` saying
how many rows the job has, how many were left out, and where they are: the rows file beside it
(analyzer.job.rows_file), named with its SHA-256. The DDP buckets and FSDP units, one per
collective row of their kind, are not written: they are the reduce's functions of the rows
(analyzer.job.reduce), worked out again from the rows file when asked for. A result of at most
``JSON_ROWS`` rows is written as before (schema_version 1, every row in the JSON): its bytes do
not change.

Each rank's steps are written by column (``step_columns``): a 1,024-rank job of 78 steps a
rank has 80,000 of them, a third of its JSON as one object per step. The per-step list of the
ops that queued idle waited on (``time_breakdown.idle_queued_ops``, kernel names) is left out of
the steps; each rank's typical step keeps it (its ``time_breakdown``), which is what the views
and rules read.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.base.errors import InputError

JSON_ROWS = 10_000  # collective rows a result's JSON holds at most (the most exposed ones)
# 3: the digest's ``busbw`` holds each group label's sums (analyzer.job.busbw); version 2 (the
# first large results) held per-collective aggregates of another definition: not read
LARGE_SCHEMA_VERSION = 3
RETIRED_SCHEMA_VERSIONS = {2: "a large result of an earlier tracecliff, whose bus-bandwidth digest has "
                                  "another definition"}
KEEP_WHOLE = frozenset({"wait_by_peer"})  # dicts keyed by peer rank: kept as one value per step
LEFT_OUT_OF_STEPS = ("time_breakdown.idle_queued_ops",)


@dataclass(frozen=True)
class RowsWritten:
    """Where a result's rows went when it was saved: the rows file's name (beside the JSON)
    and SHA-256, or why none was written."""

    file: str | None
    sha256: str | None
    why: str | None = None


@dataclass
class RowsSource:
    """The rows of a saved large result: its ``collective_rows`` section and the folder of its
    JSON (None: unknown, a document given without its path)."""

    section: dict[str, Any]
    folder: Path | None
    source: str

    @property
    def path(self) -> Path | None:
        name = self.section.get("file")
        if name is None or self.folder is None:
            return None
        return self.folder / name

    def rows(self) -> list[dict[str, Any]]:
        from analyzer.job import rows_file
        from analyzer.job.plausible import check_rows
        path = self.checked_path()
        rows = rows_file.read(path, int(self.section["count"]))
        check_rows(rows, path)
        return rows

    def frame(self, columns: tuple[str, ...]) -> Any:
        """The rows as a DataFrame of ``columns``, read from the rows file column by column."""
        from analyzer.job import rows_file
        return rows_file.frame(self.checked_path(), int(self.section["count"]), columns)

    def checked_path(self) -> Path:
        from analyzer.job import rows_file
        name = self.section.get("file")
        if name is None:
            why = self.section.get("why") or "none was written"
            raise InputError(self.source, f"its {self.section['left_out']:,} collective rows beyond the JSON's "
                                          f"{self.section['in_json']:,} are not available: {why}")
        if self.folder is None:
            raise InputError(self.source, f"the rows file {name} is found beside the result's JSON: read the "
                                          "result with load_result(path)")
        path = self.folder / name
        rows_file.check(path, self.section.get("sha256"), self.source)
        return path


def is_large(result: Any) -> bool:
    return result.rows_source is not None or len(result.collectives) > JSON_ROWS


def shown_rows(result: Any) -> list[dict[str, Any]]:
    """The ``JSON_ROWS`` collectives with the most exposed time (ties: rank, start, row order;
    rows without exposed time last), in row order."""
    if result.rows_source is not None:
        return result.shown_collectives
    from analyzer.job.columns import CollectiveColumns
    view = CollectiveColumns.of(result)
    exposed = view.written("exposed_us")
    key = np.where(np.isnan(exposed), -np.inf, exposed)
    rows = np.arange(view.n)
    if view.n > JSON_ROWS:  # the rows at least as exposed as the JSON_ROWS-th: the chosen are among them
        rows = rows[key >= np.partition(key, view.n - JSON_ROWS)[view.n - JSON_ROWS]]
    order = np.lexsort((rows, view.start[rows], view.rank[rows], -key[rows]))[:JSON_ROWS]
    return result.collectives.dicts(np.sort(rows[order]))


def rows_section(result: Any, written: RowsWritten | None) -> dict[str, Any]:
    """The ``collective_rows`` section of a large result's JSON."""
    if result.rows_source is not None:
        section = dict(result.rows_source.section)
        if written is not None:
            section.update(file=written.file, sha256=written.sha256, why=written.why)
        return section
    count, shown = len(result.collectives), min(len(result.collectives), JSON_ROWS)
    written = written or RowsWritten(None, None, "not written: the JSON went to standard output or a string "
                                                 "(`diagnose --format json -o FILE` and Result.save(path) write "
                                                 "the rows file beside it)")
    return {"count": count, "in_json": shown, "left_out": count - shown, "chosen_by": "exposed_us",
            "file": written.file, "sha256": written.sha256, "why": written.why,
            "buckets": len(result.buckets), "fsdp_units": len(result.fsdp_units)}


# ---------------------------------------------------------------- steps by column
def step_columns(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A rank's steps by column: each field a list of one value per step; nested dicts
    flattened to dotted paths (``time_breakdown.idle_us``) except those kept whole; ``absent``:
    the steps that lack a path. None when a key has a dot (the rank keeps its list of steps).
    Steps of one shape (a rank's usually are) are read a column at a time in C-level passes."""
    if not steps:
        return {"count": 0, "columns": {}, "absent": {}}
    flat: dict[str, Any] = {}
    if not _flatten(steps[0], "", flat):
        return None
    fast = _same_shape_columns(steps, [tuple(path.split(".")) for path in flat])
    if fast is not None:
        return {"count": len(steps), "columns": fast, "absent": {}}
    flats = []
    for step in steps:
        flat = {}
        if not _flatten(step, "", flat):
            return None
        flats.append(flat)
    paths = list(dict.fromkeys(path for flat in flats for path in flat))
    columns, absent = {}, {}
    for path in paths:
        values = list(map(dict.get, flats, repeat(path)))
        columns[path] = values
        if None in values:
            missing = [i for i, flat in enumerate(flats) if path not in flat]
            if missing:
                absent[path] = missing
    return {"count": len(steps), "columns": columns, "absent": absent}


def _flatten(value: dict[str, Any], prefix: str, out: dict[str, Any]) -> bool:
    for key, item in value.items():
        if not isinstance(key, str) or "." in key:
            return False
        path = prefix + key
        if path in LEFT_OUT_OF_STEPS:
            continue
        if _flattened(key, item):
            _flatten(item, path + ".", out)
        else:
            out[path] = item
    return True


def _flattened(key: str, item: Any) -> bool:
    """Whether a nested dict is written as one column per key (else as one value)."""
    return isinstance(item, dict) and bool(item) and key not in KEEP_WHOLE and \
        all(isinstance(k, str) and "." not in k for k in item)


def _same_shape_columns(steps: list[dict[str, Any]], paths: list[tuple[str, ...]]) -> dict[str, list[Any]] | None:
    """The columns of ``paths`` (the first step's) when every step has the first one's shape:
    the same keys in each flattened dict, no value flattened in one step and not in another.
    None otherwise."""
    nodes: dict[tuple[str, ...], list[Any]] = {(): steps}
    shape = {(): steps[0].keys()}
    for path in paths:
        for depth in range(1, len(path)):
            node = path[:depth]
            if node not in nodes:
                children = list(map(dict.get, nodes[node[:-1]], repeat(node[-1])))
                if set(map(type, children)) != {dict}:
                    return None
                nodes[node], shape[node] = children, children[0].keys()
    for node, keys in shape.items():  # the same keys, in the same order (a tuple of each: C-level)
        if set(map(tuple, nodes[node])) != {tuple(keys)}:
            return None
    columns = {}
    for path in paths:
        values = list(map(dict.get, nodes[path[:-1]], repeat(path[-1])))
        if dict in set(map(type, values)) and any(_flattened(path[-1], v) for v in values):
            return None
        columns[".".join(path)] = values
    return columns


def steps_of(table: Any, where: str) -> list[dict[str, Any]]:
    """The steps ``step_columns`` wrote, each dict with its keys in sorted order (as a JSON step
    reads back). A malformed table is a ValueError naming ``where``."""
    if not isinstance(table, dict) or not isinstance(table.get("columns"), dict):
        raise ValueError(f"{where}: expected an object with `count` and `columns`")
    count, columns, absent = table.get("count"), table["columns"], table.get("absent") or {}
    if not isinstance(count, int) or isinstance(count, bool) or count < 0 or not isinstance(absent, dict):
        raise ValueError(f"{where}.count: expected a whole number")
    for path, values in columns.items():
        if not isinstance(values, list) or len(values) != count:
            raise ValueError(f"{where}.columns.{path}: expected {count} values")
    if not absent:
        built = _built(columns, count)
        if built is not None:
            return built
    steps: list[dict[str, Any]] = [{} for _ in range(count)]
    for path in sorted(columns):
        skip = absent.get(path) or []
        if not isinstance(skip, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < count
                                                 for i in skip):
            raise ValueError(f"{where}.absent.{path}: expected step positions below {count}")
        parts = path.split(".")
        missing = set(skip)
        for i, (step, value) in enumerate(zip(steps, columns[path])):
            if i in missing:
                continue
            node = step
            for part in parts[:-1]:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ValueError(f"{where}.columns.{path}: a value where a table of values is")
            node[parts[-1]] = value
    return steps


def _built(columns: dict[str, list[Any]], count: int) -> list[dict[str, Any]] | None:
    """The steps of a table without absent values, built a level at a time in C-level passes
    (each dict from its keys, sorted, and its children's columns); None when a path is both a
    value and a table of values (left to the general reader to refuse)."""
    tree: dict[str, Any] = {}
    for path, values in columns.items():
        node = tree
        parts = path.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                return None
        if parts[-1] in node:
            return None
        node[parts[-1]] = values

    def build(node: dict[str, Any]) -> list[dict[str, Any]]:
        keys = sorted(node)
        children = [build(node[k]) if isinstance(node[k], dict) else node[k] for k in keys]
        if not keys:
            return [{} for _ in range(count)]
        return list(map(dict, map(zip, repeat(keys), zip(*children))))
    return build(tree)


def saved_form(doc: dict[str, Any]) -> dict[str, Any]:
    """A large result's document as written: each rank's steps by column."""
    tables = _all_step_columns([entry.get("steps") or [] for entry in doc["ranks"]])
    ranks = []
    for entry, table in zip(doc["ranks"], tables):
        if table is not None:
            entry = {k: v for k, v in entry.items() if k != "steps"}
            entry["step_columns"] = table
        ranks.append(entry)
    return {**doc, "ranks": ranks}


def _all_step_columns(ranks: list[list[dict[str, Any]]]) -> list[dict[str, Any] | None]:
    """``step_columns`` of each rank's steps: when every step of the job has one shape, read a
    column at a time over all of them (80,000 at 1,024 ranks) and cut per rank."""
    steps = [step for rank in ranks for step in rank]
    flat: dict[str, Any] = {}
    fast = None
    if steps and _flatten(steps[0], "", flat):
        fast = _same_shape_columns(steps, [tuple(path.split(".")) for path in flat])
    if fast is None:
        return [step_columns(rank) for rank in ranks]
    out, start = [], 0
    for rank in ranks:
        end = start + len(rank)
        out.append({"count": len(rank), "columns": {path: values[start:end] for path, values in fast.items()},
                    "absent": {}})
        start = end
    return out


def read_form(doc: dict[str, Any]) -> None:
    """The document ``saved_form`` wrote, each rank's steps as a list again (in place)."""
    for n, entry in enumerate(doc.get("ranks") or []):
        if isinstance(entry, dict) and "step_columns" in entry:
            entry["steps"] = steps_of(entry.pop("step_columns"), f"ranks[{n}].step_columns")
