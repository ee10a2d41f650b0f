"""The one Result every consumer reads (rules, what-if, gate, diff, renderers) and its JSON
serialization, the contract of ``diagnose --format json`` (schema_version 1). Other tools rely on
it: add keys, never rename or remove them without bumping SCHEMA_VERSION.

``Result.to_dict()`` and ``Result.from_dict()`` round-trip: a saved result is a Result again, so
``diagnose result.json --format html`` renders the very bytes the traces gave."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, TypeVar

import msgspec

from analyzer import __version__
from analyzer.rank.analysis import RankAnalysis, rank_entry, rank_from_entry

if TYPE_CHECKING:  # pandas is imported only when a table is asked for
    import pandas as pd

    from analyzer.job.model import JobModel

SCHEMA_VERSION = 1
_R = TypeVar("_R", bound="Result")
Severity = Literal["error", "warning", "info"]


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


class Bucket(msgspec.Struct, gc=False):
    """One DDP gradient bucket of ``Result.buckets`` (analyzer.job.reduce.gradient_buckets):
    read like the dict its JSON is (``b["bytes"]``, ``b.get("launch_us")``), at a sixth of a
    dict's memory (a 1,024-rank job has millions). Fields in sorted order: it encodes to the
    bytes of the dict; ``Result.to_dict()`` gives the dicts (plain JSON types)."""

    bytes: Any
    dtype: Any
    dur_us: Any
    exposed_us: Any
    group: Any
    index: int
    launch_offset_us: Any
    launch_us: Any
    rank: int
    start_us: Any
    step: Any

    def __getitem__(self, key: str) -> Any:
        if key in _BUCKET_FIELDS:
            return getattr(self, key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in _BUCKET_FIELDS else default

    def __contains__(self, key: object) -> bool:
        return key in _BUCKET_FIELDS


_BUCKET_FIELDS = frozenset(Bucket.__struct_fields__)


@dataclass
class Result:
    """Everything ``diagnose`` knows about one job. Sections are plain data (JSON types)."""

    inputs: list[dict[str, Any]]
    ranks: list[RankAnalysis]
    job: dict[str, Any]
    collectives: list[dict[str, Any]]
    buckets: list[dict[str, Any]] | list[Bucket]
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
    # the collectives as columns, shared by the job analyses and rules (analyzer.job.columns;
    # built on first use, never serialized: the rows above are the contract)
    collective_columns: Any = field(default=None, repr=False, compare=False)
    # the job's typed facts (analyzer.job.model.JobModel), built on first use after the job
    # analyses, never serialized: the sections above are what it is read from
    job_model: Any = field(default=None, repr=False, compare=False)

    @property
    def model(self) -> "JobModel":
        """The job model every view reads (analyzer.job.model)."""
        if self.job_model is None:
            from analyzer.job.model import JobModel
            self.job_model = JobModel(self)
        return self.job_model

    def to_dict(self) -> dict[str, Any]:
        return result_to_dict(self)

    @classmethod
    def from_dict(cls: type[_R], doc: dict[str, Any]) -> _R:
        return cls(**vars(result_from_dict(doc)))

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

    def collectives_df(self) -> "pd.DataFrame":
        from analyzer.job import frames
        return frames.collectives_df(self)

    def groups_df(self) -> "pd.DataFrame":
        from analyzer.job import frames
        return frames.groups_df(self)

    def findings_df(self) -> "pd.DataFrame":
        from analyzer.job import frames
        return frames.findings_df(self)

    def to_json(self) -> str:
        """The bytes of ``diagnose --format json``."""
        return dumps(result_to_dict(self, plain=False))

    def json_chunks(self) -> Iterator[bytes]:
        """``to_json()`` in pieces, UTF-8 (``iter_json``): what ``diagnose`` streams to a file."""
        return iter_json(result_to_dict(self, plain=False))

    def __repr__(self) -> str:
        world = self.job.get("world_size") or len(self.ranks)
        return (f"<Result {len(self.ranks)} of {world} rank(s), strategy {self.job.get('strategy')}, "
                f"{len(self.collectives)} collectives, {len(self.findings)} finding(s)>")


# The rendered views belong to the renderers (analyzer.reports), a layer above this one, which
# registers them here when it is imported (analyzer.api and the command line import it).
VIEWS: dict[str, Callable[[Result], str]] = {}


def _view(name: str) -> Callable[[Result], str]:
    if name not in VIEWS:
        raise RuntimeError(f"the {name} view is registered by analyzer.reports: `import analyzer.api` "
                           "(or use `analyzer.diagnose` / `analyzer.load_result`) first")
    return VIEWS[name]


_SECTIONS = ("topology", "hardware", "groups", "stragglers", "collective_summary", "mfu", "attribution", "rules", "verdict",
             "recoverable", "timeline", "scaling", "hta")


def result_to_dict(result: Result, plain: bool = True) -> dict[str, Any]:
    """The Result's document. ``plain``: JSON types only (the Buckets as dicts), else the Buckets
    as they are, for the encoder (the same bytes, without a dict per bucket)."""
    buckets = result.buckets
    if plain and buckets and isinstance(buckets[0], Bucket):
        buckets = msgspec.to_builtins(buckets)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "tracecliff", "version": __version__},
        "inputs": result.inputs,
        "job": result.job,
        "ranks": [rank_entry(r) for r in result.ranks],
        "collectives": result.collectives,
        "buckets": buckets,
        "fsdp_units": result.fsdp_units,
        "findings": result.findings,
        "warnings": result.warnings,
    }
    for key in _SECTIONS:
        value = getattr(result, key)
        if value is not None:
            doc[key] = value
    return doc


def result_from_dict(doc: dict[str, Any]) -> Result:
    """The Result a ``result_to_dict`` document holds (its rank entries carry every field)."""
    rows_by_rank: dict[int, list[dict[str, Any]]] = {}
    for row in doc.get("collectives") or []:
        rows_by_rank.setdefault(row["rank"], []).append(row)
    ranks = [rank_from_entry(entry, rows_by_rank.get(entry["rank"], [])) for entry in doc.get("ranks") or []]
    sections = {key: doc.get(key) for key in _SECTIONS}
    return Result(inputs=list(doc.get("inputs") or []), ranks=ranks, job=dict(doc.get("job") or {}),
                  collectives=list(doc.get("collectives") or []), buckets=list(doc.get("buckets") or []),
                  fsdp_units=list(doc.get("fsdp_units") or []), findings=list(doc.get("findings") or []),
                  warnings=list(doc.get("warnings") or []), **sections)


def dumps(doc: dict[str, Any]) -> str:
    """Canonical bytes: sorted keys, no NaN/Infinity (they become null), one-space indent,
    trailing newline. msgspec's encoder: a 64-rank job's 300 MB result in seconds, not minutes."""
    try:
        raw = _ENCODER.encode(doc)
    except (TypeError, ValueError, msgspec.EncodeError):
        raw = _ENCODER.encode(_clean(doc))  # unusual keys or values: normalise, then encode
    return msgspec.json.format(raw, indent=1).decode("utf-8") + "\n"


_BATCH = 2000  # list items formatted per chunk when streaming


def iter_json(doc: dict[str, Any]) -> Iterator[bytes]:
    """``dumps(doc)`` (UTF-8) in pieces, for writing a large result without holding its text
    twice (raw and indented): the same bytes, top-level values formatted one by one and long
    lists a batch of items at a time. The formatter indents each piece at its depth in the
    document (a value inside ``{key: value}``, a batch inside ``[[batch]]``): no re-indenting,
    no round trip through str."""
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


def _encode(value: Any) -> bytes:
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError, msgspec.EncodeError):
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
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return _clean(value.item())  # numpy scalar
    return value
