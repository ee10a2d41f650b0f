"""Saved results are input too: a ``diagnose --format json`` file read back (``load_result``,
``diagnose result.json``, ``gate``, ``diff``) is checked against the published contract
(analyzer.job.schema) and its ``schema_version`` before any view reads it. A wrong one is one
line naming the file and the key (``InputError``, exit 2), never a traceback or a page drawn from
a document the tool did not write."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any

import msgspec

from analyzer.base.errors import InputError
from analyzer.job import large
from analyzer.job.large import LARGE_SCHEMA_VERSION, RETIRED_SCHEMA_VERSIONS
from analyzer.job.result import SCHEMA_VERSIONS


def is_result_doc(doc: Any) -> bool:
    """A tracecliff result rather than a trace: it carries ``schema_version``, no event list."""
    return isinstance(doc, dict) and "schema_version" in doc and "traceEvents" not in doc


def read_result_file(path: Path) -> dict[str, Any] | None:
    """The result document in ``path``, checked (``check_document``); None when the file is a
    trace (decided by content: traces name their event list within the first MB, results never
    contain that key)."""
    from analyzer.ingest.files import read_trace_bytes
    # The profiler writes a few header keys before the event list: the first 64 KB decide a
    # trace without inflating a whole MB (2.4 ms of an 11 MB gzip); the MB when they do not.
    if b'"traceEvents"' in _head(path, 1 << 16):
        return None
    head = _head(path, 1 << 20)
    if b'"traceEvents"' in head or _first_key(head) not in RESULT_KEYS:
        return None  # a trace (or a bare array, or not JSON): the trace reader streams it
    data = read_trace_bytes(path)
    _check_row_count(data, path)
    try:
        doc = json.loads(data)
    except RecursionError:
        raise InputError(path, "not a tracecliff result: JSON nested deeper than any result") from None
    except (ValueError, UnicodeDecodeError):
        if _looks_like_result(head):
            raise InputError(path, "not valid JSON: a truncated or damaged tracecliff result") from None
        return None  # let the trace reader give its own error
    if not is_result_doc(doc):
        return None
    check_document(doc, path, data)
    return doc


class _Rows(msgspec.Struct):
    """The two keys the row limit needs; every other key is skipped, not built."""
    schema_version: Any = None
    collectives: list[msgspec.Raw] = []


def _check_row_count(data: bytes, source: Any) -> None:
    """A result past its version's row limit refused before it is parsed whole (issue 41: 192,000
    rows took 855 MB of dicts to refuse): its rows counted as raw spans of the bytes. A document
    this cannot read (not JSON, collectives not a list) is left to the full check's message."""
    try:
        head = msgspec.json.decode(data, type=_Rows)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return
    if head.schema_version in SCHEMA_VERSIONS and not isinstance(head.schema_version, bool):
        _refuse_rows(len(head.collectives), head.schema_version, source)  # other versions: check_document says


def _refuse_rows(count: int, version: Any, source: Any) -> None:
    # read at call time, not bound at import: a module imported while a test lowers the limit
    # (tests/test_large_result.py) would otherwise keep the lowered one for every later test
    limit = large.JSON_ROWS
    if count > limit:  # each version's own limit (issue 41)
        raise InputError(source, f"not a valid tracecliff result: collectives holds {count:,} rows, and a "
                                 f"schema_version {version} result holds at most {limit:,} (the rest go to its "
                                 "rows file)")


def check_document(doc: dict[str, Any], source: Any, data: bytes | None = None) -> None:
    """Raise ``InputError(source, ...)`` unless ``doc`` is a result of a schema version this
    tracecliff reads, every key of the contract of its type (``data``: the document's bytes, when
    the caller has them: checked straight from them, faster than from the dicts). A large
    result's steps (by column) are read back into lists (in place) and checked as steps."""
    from analyzer.job.schema import AnyResultDocument
    version = doc.get("schema_version")
    if version in RETIRED_SCHEMA_VERSIONS and not isinstance(version, bool):
        raise InputError(source, f"schema_version {version} ({RETIRED_SCHEMA_VERSIONS[version]}) is not one this "
                                 f"tracecliff reads (it reads {' and '.join(map(str, SCHEMA_VERSIONS))}); re-run "
                                 "`tracecliff diagnose` on the traces")
    if version not in SCHEMA_VERSIONS or isinstance(version, bool):
        raise InputError(source, f"schema_version {json.dumps(version)} is not one this tracecliff reads "
                                 f"(it reads {' and '.join(map(str, SCHEMA_VERSIONS))}); re-run `tracecliff diagnose` "
                                 "on the traces")
    rows = doc.get("collectives")
    if isinstance(rows, list):
        _refuse_rows(len(rows), version, source)
    try:
        if data is not None:
            msgspec.json.decode(data, type=AnyResultDocument)
        else:
            msgspec.convert(doc, AnyResultDocument)
    except msgspec.ValidationError as exc:
        raise InputError(source, f"not a valid tracecliff result: {_where(exc)}") from None
    except msgspec.DecodeError:  # what json read, msgspec does not (NaN tokens): check the dicts
        check_document(doc, source)
        return
    if version == LARGE_SCHEMA_VERSION:
        _read_step_columns(doc, source)


def _read_step_columns(doc: dict[str, Any], source: Any) -> None:
    """A large result's steps by column as lists of steps again (analyzer.job.large), each
    checked as a ``Step``."""
    from analyzer.job.large import read_form
    from analyzer.job.schema import Step
    try:
        read_form(doc)
    except ValueError as exc:
        raise InputError(source, f"not a valid tracecliff result: {exc}") from None
    for n, entry in enumerate(doc["ranks"]):
        try:
            msgspec.convert(entry["steps"], list[Step])
        except msgspec.ValidationError as exc:
            where = _where(exc)
            where = f"ranks[{n}].steps{where}" if where.startswith("[") else f"ranks[{n}].steps: {where}"
            raise InputError(source, f"not a valid tracecliff result: {where}") from None


def _where(exc: msgspec.ValidationError) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.ranks[0].rank`" as "ranks[0].rank: expected
    `int`, got `str`"."""
    text = str(exc)
    problem, _, where = text.partition(" - at `")
    where = where.rstrip("`").removeprefix("$").lstrip(".")
    problem = problem[:1].lower() + problem[1:]
    return f"{where}: {problem}" if where else problem


# Every key a result's document opens with: sorted (the tool's writer: "attribution" first) or
# in the order Result.to_dict() makes them ("schema_version" first). A trace opens with none.
RESULT_KEYS = frozenset(("schema_version", "tool", "inputs", "job", "ranks", "findings", "warnings",
                         "attribution", "buckets", "collective_summary", "collective_digest",
                         "collective_rows", "collectives"))
_FIRST_KEY = re.compile(rb'[ \t\r\n]*\{[ \t\r\n]*"([a-z_]{1,40})"[ \t\r\n]*:')


def _first_key(head: bytes) -> str | None:
    """The document's first key, when it opens as an object (never a whole parse)."""
    match = _FIRST_KEY.match(head)
    return match.group(1).decode() if match else None


def _looks_like_result(head: bytes) -> bool:
    """The first bytes of a result document: its sorted keys begin with one of these."""
    start = head.lstrip()[:40]
    return start.startswith(b"{") and any(key in start for key in (b'"attribution"', b'"buckets"',
                                                                    b'"collective_summary"', b'"collectives"'))


def _head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of the (possibly gzip) file's content, without reading it all."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(size)
        if raw[:2] != b"\x1f\x8b":
            return raw
        with gzip.open(path, "rb") as handle:
            return handle.read(size)
    except (OSError, EOFError, zlib.error):
        return b""  # unreadable or corrupt: the full reader reports it
