"""The one Result every consumer reads (rules, what-if, gate, diff, renderers) and its JSON
serialization, the contract of ``diagnose --format json``: schema_version 1 for a result with
every collective row in it, 2 for a large one (more than ``JSON_ROWS`` rows: its most exposed
rows and the digest of all of them in the JSON, every row in the rows file beside it;
analyzer.job.large). Other tools rely on it: add keys, never rename or remove them without a
new schema_version.

``Result.to_dict()`` and ``Result.from_dict()`` round-trip: a saved result is a Result again, so
``diagnose result.json --format html`` renders the very bytes the traces gave."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, TypeVar

import msgspec

from analyzer import __version__
from analyzer.base.errors import InputError
from analyzer.base.memo import memo
from analyzer.base.rowtable import RowTable
from analyzer.base.sanitize import shown
from analyzer.job.buckets import Bucket, BucketTable
from analyzer.job.large import LARGE_SCHEMA_VERSION, RowsSource, RowsWritten, is_large, rows_section, \
    saved_form, shown_rows
from analyzer.rank.analysis import RankAnalysis, rank_entry, rank_from_entry

if TYPE_CHECKING:  # pandas is imported only when a table is asked for
    import pandas as pd

    from analyzer.job.model import JobModel

SCHEMA_VERSION = 1  # a result with every collective row in its JSON
SCHEMA_VERSIONS = (SCHEMA_VERSION, LARGE_SCHEMA_VERSION)  # the ones this tracecliff reads
_R = TypeVar("_R", bound="Result")
Severity = Literal["error", "warning", "info"]
# How a rule ended (``Result.rules[].status``), in words (the views say it so): it found a
# problem; it checked and found nothing; its subject is absent from the job; the traces cannot
# show it; it was switched off.
STATUS_WORDS = {"fired": "fired", "passed": "passed", "not_applicable": "not applicable",
                "not_evaluated": "could not check", "disabled": "disabled"}


class _ReadsLikeADict:
    """``obj["key"]``, ``obj.get("key")`` and ``"key" in obj`` on a typed record, so code written
    for the finding dicts (rules, renderers, gate) reads the typed objects too."""

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:  # type: ignore[attr-defined]
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self.__dataclass_fields__ else default  # type: ignore[attr-defined]

    def __contains__(self, key: object) -> bool:
        return key in self.__dataclass_fields__  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


@dataclass(frozen=True)
class FindingFix(_ReadsLikeADict):
    text: str
    snippet: str | None = None


@dataclass(frozen=True)
class Finding(_ReadsLikeADict):
    """One finding of a rule (rules.engine.RuleContext.finding), typed. ``Result.findings`` keeps
    the plain dicts (the JSON contract every rule and renderer writes and reads);
    ``Result.typed_findings`` gives these."""

    rule: str
    code: str
    severity: Severity
    title: str
    summary: str
    ranks: list[int]
    steps: list[int | str]
    evidence: dict[str, Any]
    estimated_gain_us: float | None
    model: str | None
    fix: FindingFix
    references: list[str]
    # The leaves of the typical step the fix gives back, with the µs of the gain each holds
    # (analyzer.job.model.split_gain; None: the leaf, with no estimate of the gain).
    recovers: dict[str, float | None] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Finding":
        """Checks the types too: a malformed finding is a ``msgspec.ValidationError``."""
        return msgspec.convert(doc, cls)


class FrozenResultError(TypeError):
    """A public attribute of a frozen Result set or deleted (``Result.freeze``)."""


@dataclass
class Result:
    """Everything ``diagnose`` knows about one job. Sections are plain data (JSON types)."""

    inputs: list[dict[str, Any]]
    ranks: list[RankAnalysis]
    job: dict[str, Any]
    # the collective rows, kept by column (analyzer.base.rowtable: a sequence of the row dicts;
    # a list given here is made one)
    collectives: RowTable
    buckets: list[dict[str, Any]] | list[Bucket] | BucketTable
    fsdp_units: list[dict[str, Any]]
    findings: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # job analysis (analyzer.job.analysis)
    topology: dict[str, Any] | None = None
    hardware: dict[str, Any] | None = None
    groups: list[dict[str, Any]] | None = None
    stragglers: dict[str, Any] | None = None
    collective_summary: list[dict[str, Any]] | None = None
    mfu: dict[str, Any] | None = None
    # the typical step's time breakdown, mean over ranks (analyzer.job.attribution)
    attribution: dict[str, Any] | None = None
    # rules (analyzer.rules.engine)
    rules: list[dict[str, Any]] | None = None
    verdict: str | None = None
    # what the findings together recover per typical step (analyzer.job.model.Recoverable)
    recoverable: dict[str, Any] | None = None
    # report sections (analyzer.job.step_timeline, analyzer.whatif.scaling, analyzer.job.hta)
    timeline: dict[str, Any] | None = None
    scaling: dict[str, Any] | None = None
    hta: dict[str, Any] | None = None
    # measured memory per rank and step from the allocator's events, and the job's figures
    # (analyzer.job.memory; ``recorded`` false with the reason when the trace has none)
    memory: dict[str, Any] | None = None
    # What is derived from the sections is never a field: computed on first use and kept in the
    # private memo slot (analyzer.base.memo), never serialized: the collectives as columns
    # (analyzer.job.columns.CollectiveColumns.of), the job's typed facts (``model``), the digest
    # of the rows (analyzer.job.digest.collective_digest), the what-if replayer and projections.
    # A saved large result's digest (it has only its most exposed rows in the JSON): the one its
    # JSON holds; None for any other Result (collective_digest(result) computes it)
    collective_digest: Any = field(default=None, repr=False, compare=False)
    # a saved large result (analyzer.job.large): where its rows are (read on first use of
    # ``collectives``, ``buckets`` or ``fsdp_units``), and the rows its JSON holds
    rows_source: RowsSource | None = field(default=None, repr=False, compare=False)
    shown_collectives: list[dict[str, Any]] | None = field(default=None, repr=False, compare=False)

    # ---------------------------------------------------------------- built once, then frozen
    def freeze(self: _R) -> _R:
        """No public attribute is set or deleted from now on (``FrozenResultError``): the Result
        is finished (``analyzer.api.build_report``, or read back from a saved result). What is
        derived from it is kept in its private memo slot (analyzer.base.memo). Returns itself."""
        self.__dict__["_frozen"] = True
        return self

    @property
    def frozen(self) -> bool:
        return bool(self.__dict__.get("_frozen"))

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen") and not name.startswith("_"):
            raise FrozenResultError(f"Result.{name}: the Result is frozen (built once by analyzer.api.build_report, "
                                    "or read back from a saved result); build a new one "
                                    "(dataclasses.replace(result, ...)) instead of patching it")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if self.__dict__.get("_frozen") and not name.startswith("_"):
            raise FrozenResultError(f"Result.{name}: the Result is frozen; its attributes cannot be deleted")
        object.__delattr__(self, name)

    @property
    def model(self) -> "JobModel":
        """The job model every view reads (analyzer.job.model), built on first use and kept."""
        from analyzer.job.model import JobModel
        return memo(self, "job_model", lambda: JobModel(self))

    def to_dict(self) -> dict[str, Any]:
        return result_to_dict(self)

    @classmethod
    def from_dict(cls: type[_R], doc: dict[str, Any], source: str | Path | None = None) -> _R:
        """The Result of a checked document (analyzer.job.saved); ``source``: the file it was
        read from, beside which a large result's rows file is."""
        result = result_from_dict(doc, source)
        if cls is Result:
            return result  # type: ignore[return-value]
        typed = cls.__new__(cls)
        typed.__dict__.update(result.__dict__)  # as it is: a large result's rows stay unread
        return typed

    @property
    def collective_count(self) -> int:
        """The job's collective rows (a saved large result's without reading them)."""
        if self.rows_source is not None:
            return int(self.rows_source.section["count"])
        return len(self.collectives)

    def save(self, path: str | Path, inputs: list[str] | None = None) -> RowsWritten | None:
        """Write the result as ``diagnose --format json`` does to ``path`` (atomically, never over
        one of ``inputs``), and a large result's rows to its rows file beside it (needs the
        ``parquet`` extra; without it the JSON says why there is none). Returns where the rows
        went (None: a result with every row in its JSON)."""
        from analyzer.base.output import write_atomic
        from analyzer.job import rows_file
        if not is_large(self):
            write_atomic(path, self.json_chunks(), inputs)
            return None
        from analyzer.job.digest import collective_digest
        collective_digest(self)  # first: its working arrays are freed before the rows file's are made
        pending = _write_rows(self, rows_file.file_for(path), inputs)
        doc = saved_document(self)  # the steps by column while the rows file is encoded and written
        written = pending()
        doc["collective_rows"] = rows_section(self, written)
        write_atomic(path, iter_json(doc, compact=True), inputs)
        return written

    def to_html(self) -> str:
        """The self-contained report page of ``diagnose --format html``."""
        return _view("html")(self)

    def _repr_html_(self) -> str:
        """Jupyter's inline view: verdict, headline numbers and findings (escaped)."""
        return _view("summary-html")(self)

    @property
    def typed_findings(self) -> list[Finding]:
        return [Finding.from_dict(f) for f in self.findings]

    # Tables for notebooks (analyzer.job.frames; the columns are listed in docs/api.md).
    def ranks_df(self) -> "pd.DataFrame":
        from analyzer.job import frames
        return frames.ranks_df(self)

    def steps_df(self) -> "pd.DataFrame":
        from analyzer.job import frames
        return frames.steps_df(self)

    def breakdown_df(self) -> "pd.DataFrame":
        """One row per rank × step: role, step time, the five leaves and the finer ones."""
        from analyzer.job import frames
        return frames.breakdown_df(self)

    def compute_df(self) -> "pd.DataFrame":
        """One row per rank × step × distinct (op, shape, dtype) with FLOPs from recorded
        shapes: count, FLOPs, GPU time, TFLOP/s, % of the peak of its dtype."""
        from analyzer.job import frames
        return frames.compute_df(self)

    def memory_df(self) -> "pd.DataFrame":
        """One row per rank × step of measured memory (allocator events): peak allocated and
        reserved, start and end, cached at the peak, headroom, where the peak is."""
        from analyzer.job import frames
        return frames.memory_df(self)

    def collectives_df(self) -> "pd.DataFrame":
        from analyzer.job import frames
        return frames.collectives_df(self)

    def groups_df(self) -> "pd.DataFrame":
        from analyzer.job import frames
        return frames.groups_df(self)

    def findings_df(self) -> "pd.DataFrame":
        from analyzer.job import frames
        return frames.findings_df(self)

    def to_json(self, rows: RowsWritten | None = None) -> str:
        """The bytes of ``diagnose --format json`` (``rows``: where a large result's rows went)."""
        return b"".join(self.json_chunks(rows)).decode("utf-8")

    def json_chunks(self, rows: RowsWritten | None = None) -> Iterator[bytes]:
        """``to_json()`` in pieces, UTF-8 (``iter_json``): what ``diagnose`` streams to a file. A
        large result's JSON is written compact, a value per line (analyzer.job.large)."""
        doc = saved_document(self, rows)
        return iter_json(doc, compact=doc["schema_version"] == LARGE_SCHEMA_VERSION)

    def __repr__(self) -> str:
        world = self.job.get("world_size") or len(self.ranks)
        return (f"<Result {len(self.ranks)} of {world} rank(s), strategy {self.job.get('strategy')}, "
                f"{self.collective_count} collectives, {len(self.findings)} finding(s)>")


def _write_rows(result: Result, target: Path, inputs: list[str] | None) -> Callable[[], RowsWritten]:
    """A large result's rows to ``target``: written (pyarrow, the file itself on a thread), or
    copied from the rows file of the saved result it was read from; else why not. Returns the
    call that waits for the writing and says where the rows went."""
    written = _copied_or_why(result, target, inputs)
    if written is not None:
        return lambda: written
    from analyzer.job import rows_file
    from analyzer.job.columns import CollectiveColumns
    view = CollectiveColumns.of(result)
    view.written("exposed_us")  # read once, for the rows file and the digest
    wait = rows_file.start_write(target, result.collectives, view)
    return lambda: RowsWritten(target.name, wait())


def _copied_or_why(result: Result, target: Path, inputs: list[str] | None) -> RowsWritten | None:
    import shutil

    from analyzer.base.output import write_atomic
    from analyzer.job import rows_file
    if result.rows_source is not None:
        source = result.rows_source
        if source.path is None:
            return RowsWritten(None, None, source.section.get("why") or "the rows file was not found")
        path = source.checked_path()
        if path.resolve() != target.resolve():
            with open(path, "rb") as handle:
                write_atomic(target, iter(lambda: handle.read(1 << 22), b""), inputs)
            shutil.copymode(path, target)
        return RowsWritten(target.name, source.section.get("sha256"))
    if not rows_file.available():
        return RowsWritten(None, None, f"not written: pyarrow is not installed ({rows_file.EXTRA})")
    for given in inputs or []:
        if target.exists() and Path(given).exists() and target.samefile(given):
            raise InputError(target, "refusing to overwrite an input")
    return None


# The rendered views belong to the renderers (analyzer.reports), a layer above this one, which
# registers them here when it is imported (analyzer.api and the command line import it).
VIEWS: dict[str, Callable[[Result], str]] = {}


def _view(name: str) -> Callable[[Result], str]:
    if name not in VIEWS:
        raise RuntimeError(f"the {name} view is registered by analyzer.reports: `import analyzer.api` "
                           "(or use `analyzer.diagnose` / `analyzer.load_result`) first")
    return VIEWS[name]


_SECTIONS = ("topology", "hardware", "groups", "stragglers", "collective_summary", "mfu", "attribution", "rules", "verdict",
             "recoverable", "timeline", "scaling", "hta", "memory")


def result_to_dict(result: Result, plain: bool = True, rows: RowsWritten | None = None) -> dict[str, Any]:
    """The Result's document, as the views read it. ``plain``: JSON types only (the Buckets as
    dicts), else the Buckets as they are, for the encoder (the same bytes, without a dict per
    bucket). A large result's (analyzer.job.large): its most exposed rows, ``collective_rows``
    (``rows``: where the rows went) and the digest of every row; no buckets or FSDP units."""
    large = is_large(result)
    doc = {
        "schema_version": LARGE_SCHEMA_VERSION if large else SCHEMA_VERSION,
        "tool": {"name": "tracecliff", "version": __version__},
        "inputs": result.inputs,
        "job": result.job,
        "ranks": [rank_entry(r) for r in result.ranks],
        "findings": result.findings,
        "warnings": result.warnings,
    }
    if large:
        from analyzer.job.digest import collective_digest
        doc.update(collectives=shown_rows(result), collective_rows=rows_section(result, rows),
                   collective_digest=collective_digest(result))
    else:
        buckets = result.buckets
        if isinstance(buckets, BucketTable):  # the JSON's list
            buckets = buckets.tolist()
        if plain and buckets and isinstance(buckets[0], Bucket):
            buckets = msgspec.to_builtins(buckets)
        doc.update(collectives=result.collectives.dicts(), buckets=buckets, fsdp_units=result.fsdp_units)
    for key in _SECTIONS:
        value = getattr(result, key)
        if value is not None:
            doc[key] = value
    return doc


def saved_document(result: Result, rows: RowsWritten | None = None) -> dict[str, Any]:
    """The document as ``diagnose --format json`` writes it: a large result's steps by column."""
    doc = result_to_dict(result, plain=False, rows=rows)
    return saved_form(doc) if doc["schema_version"] == LARGE_SCHEMA_VERSION else doc


def result_from_dict(doc: dict[str, Any], source: str | Path | None = None) -> Result:
    """The Result a ``result_to_dict`` document holds (its rank entries carry every field),
    frozen (``Result.freeze``); a large result's rows stay in its rows file (beside ``source``)
    until they are asked for."""
    common: dict[str, Any] = {key: doc.get(key) for key in _SECTIONS}
    common.update(inputs=list(doc.get("inputs") or []), job=dict(doc.get("job") or {}),
                  findings=list(doc.get("findings") or []), warnings=list(doc.get("warnings") or []))
    if doc.get("schema_version") == LARGE_SCHEMA_VERSION:
        folder = None if source is None else Path(source).parent
        ranks = [rank_from_entry(entry, []) for entry in doc.get("ranks") or []]
        return Result(ranks=ranks, collectives=None, buckets=None, fsdp_units=None,  # type: ignore[arg-type]
                      collective_digest=doc["collective_digest"], shown_collectives=list(doc["collectives"]),
                      rows_source=RowsSource(dict(doc["collective_rows"]), folder, str(source or "the result")),
                      **common).freeze()
    rows_by_rank: dict[int, list[dict[str, Any]]] = {}
    for row in doc.get("collectives") or []:
        rows_by_rank.setdefault(row["rank"], []).append(row)
    ranks = [rank_from_entry(entry, rows_by_rank.get(entry["rank"], [])) for entry in doc.get("ranks") or []]
    return Result(ranks=ranks, collectives=RowTable.from_dicts(list(doc.get("collectives") or [])), buckets=list(doc.get("buckets") or []),
                  fsdp_units=list(doc.get("fsdp_units") or []), **common).freeze()


class _FromRows:
    """``Result.collectives``, ``buckets`` and ``fsdp_units`` of a saved large result: read from
    its rows file on first use (the buckets and units worked out from the rows as the reduce
    does), then kept. Of any other Result: the value it was given."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, "_" + name

    def __get__(self, result: Any, owner: type | None = None) -> Any:
        if result is None:
            return self
        value = result.__dict__.get(self.slot)
        if value is None and result.__dict__.get("rows_source") is not None:
            value = _from_rows(result, self.name)
            result.__dict__[self.slot] = value
        return value

    def __set__(self, result: Any, value: Any) -> None:
        if self.name == "collectives" and isinstance(value, list):  # the rows are kept by column
            value = RowTable.from_dicts(value)
        result.__dict__[self.slot] = value


def _from_rows(result: Result, name: str) -> Any:
    if name == "collectives":
        return RowTable.from_dicts(result.rows_source.rows())  # type: ignore[union-attr]
    from analyzer.job.buckets import derived_records
    buckets, units = derived_records(result)
    result.__dict__["_buckets"], result.__dict__["_fsdp_units"] = buckets, units
    return buckets if name == "buckets" else units


for _name in ("collectives", "buckets", "fsdp_units"):
    _descriptor = _FromRows()
    _descriptor.__set_name__(Result, _name)
    setattr(Result, _name, _descriptor)


def dumps(doc: dict[str, Any]) -> str:
    """Canonical bytes: sorted keys, no NaN/Infinity (they become null), one-space indent,
    trailing newline. msgspec's encoder: a 64-rank job's 300 MB result in seconds, not minutes."""
    try:
        raw = _ENCODER.encode(doc)
    except (TypeError, ValueError, msgspec.EncodeError):
        raw = _ENCODER.encode(_clean(doc))  # unusual keys or values: normalise, then encode
    return msgspec.json.format(raw, indent=1).decode("utf-8") + "\n"


_BATCH = 2000  # list items formatted per chunk when streaming


def iter_json(doc: dict[str, Any], compact: bool = False) -> Iterator[bytes]:
    """``dumps(doc)`` (UTF-8) in pieces, for writing a large result without holding its text
    twice (raw and indented): the same bytes, top-level values formatted one by one and long
    lists a batch of items at a time. The formatter indents each piece at its depth in the
    document (a value inside ``{key: value}``, a batch inside ``[[batch]]``): no re-indenting,
    no round trip through str. ``compact``: no indentation, each top-level value on a line of its
    own and each item of a top-level list too (a large result's JSON: a third smaller, and
    encoded once, never formatted)."""
    if compact:
        yield from _iter_compact(doc)
        return
    keys = sorted(doc)
    if not keys:
        yield b"{}\n"
        return
    yield b"{\n"
    for n, key in enumerate(keys):
        value = doc[key]
        if isinstance(value, list) and len(value) > _BATCH:
            yield b" " + _encode(key) + b": [\n"
            for i in range(0, len(value), _BATCH):
                # "[\n [\n" + the items two levels deep + "\n ]\n]"
                yield _formatted([value[i:i + _BATCH]])[5:-5]
                yield b",\n" if i + _BATCH < len(value) else b"\n"  # apart: no copy of the batch
            yield b" ]"
        else:
            yield _formatted({key: value})[2:-2]  # "{\n" + ' "key": value' + "\n}"
        yield b",\n" if n < len(keys) - 1 else b"\n"
    yield b"}\n"


def _iter_compact(doc: dict[str, Any]) -> Iterator[bytes]:
    keys = sorted(doc)
    yield b"{\n"
    for n, key in enumerate(keys):
        value = doc[key]
        if isinstance(value, list) and value:
            yield _encode(key) + b": [\n"
            last = len(value) - 1
            for i, item in enumerate(value):  # an item at a time: a rank's entry is ~60 KB
                yield _encode(item)
                yield b",\n" if i < last else b"\n"
            yield b"]"
        else:
            yield _encode(key) + b": " + _encode(value)
        yield b",\n" if n < len(keys) - 1 else b"\n"
    yield b"}\n"


def _encode(value: Any) -> bytes:
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError, msgspec.EncodeError):  # UnicodeEncodeError too: a file name's bytes
        return _ENCODER.encode(_clean(value))  # unusual keys or values: normalise, then encode


def _formatted(value: Any) -> bytes:
    return msgspec.json.format(_encode(value), indent=1)


def _numpy_scalar(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    raise TypeError(f"cannot encode {type(value).__name__}")


# order="sorted" sorts every dict's keys; NaN and ±Infinity encode as null.
_ENCODER = msgspec.json.Encoder(enc_hook=_numpy_scalar, order="sorted")


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return shown(value)  # a file name's undecodable bytes as \xff (UTF-8 holds no surrogate)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {shown(str(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return _clean(value.item())  # numpy scalar
    return value


# ---------------------------------------------------------------- read by the report sections and views
def unavailable(why: str) -> dict[str, Any]:
    """A report section (``timeline``, a view's) that could not be drawn, and why."""
    return {"available": False, "why": why}


STRAGGLER_RULE = "straggler-rank"


def straggler_ranks(doc: dict[str, Any]) -> dict[int, str]:
    """rank -> why it is called a straggler: the ranks a straggler-rank finding names, and only
    those (the report says only what the analysis concluded: a rank that is merely last at some
    collectives of a healthy job is no straggler)."""
    found: dict[int, str] = {}
    for finding in doc.get("findings") or []:
        if not isinstance(finding, dict) or finding.get("rule") != STRAGGLER_RULE:
            continue
        causes = (finding.get("evidence") or {}).get("causes") or {}
        for rank in finding.get("ranks") or []:
            if isinstance(rank, int) and not isinstance(rank, bool):
                cause = (causes.get(str(rank)) or {}).get("cause") if isinstance(causes, dict) else None
                found.setdefault(rank, f"{finding.get('code') or STRAGGLER_RULE}: late at the collectives"
                                 + (f" (cause: {cause})" if cause else ""))
    return dict(sorted(found.items()))
