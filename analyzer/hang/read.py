"""Read PyTorch Flight Recorder dumps (one file per rank): the JSON writer's output and the
default pickle, across format versions, into plain dataclasses.

Fields and versions, as read in torch's ``NCCLUtils.hpp`` / ``TraceUtils.h`` /
``FlightRecorder.hpp`` of versions 1.1, 1.4, 2.2, 2.3, 2.4, 2.7 and 2.10, and in
``torch/distributed/flight_recorder`` (the torch release each first shipped in is approximate;
2.10 is what torch 2.13 writes):

- "1.x" (torch 2.2-2.3): one ``seq_id`` for collectives and p2p alike, ``record_id`` / ``op_id``
  from 1.4, no ``process_group`` (entries are grouped by ``pg_id``), no dtypes, no timeout;
  ``pg_config`` maps each ``pg_id`` to the list of its ranks.
- "2.2" (torch 2.4): ``process_group`` = (name, description), ``collective_seq_id`` and
  ``p2p_seq_id`` apart, ``is_p2p``, ``input_dtypes`` / ``output_dtypes``, ``timeout_ms``;
  ``pg_config`` maps each group's name to ``{"name", "desc", "ranks": "[0, 1, ...]"}``.
- "2.3"-"2.7" (torch 2.5-2.7): ``pg_status`` (each group's last enqueued, started and completed
  sequence id: strings in JSON, integers in pickle), ``nccl_version``, the JSON writer; from
  2.7 each collective of a coalescing block has its own entry (before, its end marker alone).
- "2.8"-"2.10" (torch 2.8-2.13): ``comm_lib_version`` instead of ``nccl_version``,
  ``thread_id`` / ``thread_name``.

An entry's ``state`` is "scheduled", "started" or "completed" (from its CUDA events; backends
without events, gloo, leave it "scheduled"); ``retired`` says the work left the watchdog's list
(for NCCL, retired without completing = timed out or aborted; for gloo, the call returned, with
or without an error). ``time_discovered_*`` are null (pickle) or 0 (JSON) when not seen. Stack
``frames`` are only in the pickle. A dump does not name its rank: it comes from the file name, as
``fr_trace`` takes it (``<prefix><rank>``).

A pickle is read by an unpickler that refuses every global (class or function), so nothing in it
can run; only plain containers and scalars can come out.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from analyzer.base.errors import InputError
from analyzer.base.limits import MAX_ID, MAX_WORLD
from analyzer.ingest.files import (DEFAULT_MAX_INFLATE_BYTES, discover_trace_files, iter_trace_chunks,
                                   looks_like_trace, read_trace_bytes)

PICKLE_PROTO = b"\x80"
KNOWN_MAJOR_VERSIONS = (1, 2)
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle))?(?:\.gz)?$")
_SCALARS = frozenset({str, bytes, int, float, bool, type(None)})
_SEQUENCES = frozenset({list, tuple, set, frozenset})
SNIFF_BYTES = 64 << 10
# Keys a Flight Recorder JSON dump starts with (nlohmann writes them sorted).
_FR_JSON_KEYS = (b'"comm_lib_version"', b'"entries"', b'"nccl_comm_state"', b'"nccl_version"', b'"pg_config"',
                 b'"pg_status"', b'"version"')
MAX_DEPTH = 6          # folders below a given directory that are searched for dumps
MAX_DIR_ENTRIES = 100_000


@dataclass(frozen=True)
class Frame:
    name: str
    filename: str
    line: int


@dataclass(frozen=True)
class DumpEntry:
    """One Flight Recorder entry: a collective or p2p operation as one rank issued it."""
    record_id: int
    pg_id: int
    group: str            # process group name (its guid: "0" is the default group)
    description: str      # pg_desc, e.g. "default_pg", "dp_shard"; "" when unknown
    collective_seq: int
    p2p_seq: int
    is_p2p: bool
    backend: str          # "nccl", "gloo", ...
    op: str               # "all_reduce", "send", ...
    peer: str             # "0->1" for send, "1<-0" for recv; "" otherwise
    input_sizes: list
    output_sizes: list
    input_dtypes: list
    output_dtypes: list
    state: str            # "scheduled" | "started" | "completed"
    time_created_ns: int
    time_started_ns: int | None
    time_completed_ns: int | None
    timeout_ms: int | None
    frames: tuple[Frame, ...]
    retired: bool | None = None   # None: the format has no such field
    op_id: int | None = None

    @property
    def seq(self) -> int:
        return self.p2p_seq if self.is_p2p else self.collective_seq

    @property
    def newest_ns(self) -> int:
        """The latest moment this entry records (created, or seen started / completed)."""
        return max(self.time_created_ns, self.time_started_ns or 0, self.time_completed_ns or 0)


@dataclass(frozen=True)
class GroupStatus:
    """``pg_status``: the last sequence ids the rank's watchdog saw (-1: not tracked)."""
    enqueued: int
    started: int
    completed: int


@dataclass
class RankDump:
    path: str
    rank: int
    version: str
    comm_lib_version: str
    pg_config: dict[str, dict[str, Any]]  # group name -> {"desc": str, "ranks": [int] | None}
    pg_status: dict[int, GroupStatus]     # pg_id -> status
    entries: list[DumpEntry]
    warnings: list[str] = field(default_factory=list)
    format: str = "json"                  # "json" | "pickle"

    @property
    def newest_ns(self) -> int:
        return max((e.newest_ns for e in self.entries), default=0)


@dataclass
class Found:
    """What a set of paths holds: Flight Recorder dumps, Kineto traces (for the straggler
    history), and the files in directories that are neither."""
    dumps: list[Path]
    traces: list[Path]
    skipped: list[Path]


class _PlainUnpickler(pickle.Unpickler):
    """Admits no global at all: a dump is dicts, lists, tuples, strings and numbers."""

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle's hook
        raise pickle.UnpicklingError(f"refused to load {module}.{name} (only plain data is read)")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused a persistent id (only plain data is read)")


def discover_dumps(paths: list[str] | tuple[str, ...]) -> list[Path]:
    return discover(paths).dumps


def discover(paths: list[str] | tuple[str, ...]) -> Found:
    """Files, directories and globs, sorted. A directory is searched down to MAX_DEPTH levels
    (a job's dumps may sit in json/ and pickle/ folders) for Kineto traces (by content) and
    dumps (the other files whose name ends in a rank number: a damaged one is an error); the
    rest is left out. A file named on purpose (directly or by a glob) is always taken: as a
    trace when it looks like one, else as a dump."""
    if not paths:
        raise InputError("<arguments>", "no dump path given")
    found = Found([], [], [])
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            for named in discover_trace_files([raw]):  # a file or a glob: the same rules as traces
                (found.traces if _kind(named) == "trace" else found.dumps).append(named)
            continue
        inside = Found([], [], [])
        for candidate in _walk(path):
            kind = _kind(candidate)
            if kind == "trace":
                inside.traces.append(candidate)
            elif _RANK_IN_NAME.search(candidate.name):
                inside.dumps.append(candidate)  # named like a dump: read as one (a damaged one is an error)
            else:
                inside.skipped.append(candidate)
        if not inside.dumps:
            raise InputError(path, "directory holds no Flight Recorder dumps (files named <prefix><rank>)")
        for name in ("dumps", "traces", "skipped"):
            getattr(found, name).extend(getattr(inside, name))
    unique = {name: sorted({p.resolve(): p for p in getattr(found, name)}.values(), key=str)
              for name in ("dumps", "traces", "skipped")}
    return Found(**unique)


def _walk(top: Path) -> list[Path]:
    """Every regular file under ``top`` (hidden ones and folders left out), in sorted order."""
    files: list[Path] = []
    seen = 0
    for root, dirs, names in os.walk(top):
        depth = len(Path(root).relative_to(top).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < MAX_DEPTH else []
        seen += len(names) + len(dirs)
        if seen > MAX_DIR_ENTRIES:
            raise InputError(top, f"more than {MAX_DIR_ENTRIES:,} entries below this directory: "
                                  "name the dump folder itself")
        files.extend(Path(root) / n for n in sorted(names) if not n.startswith(".") and (Path(root) / n).is_file())
    return files


def _kind(path: Path) -> str:
    """"dump", "trace" or "other", from the first bytes (gzip inflated)."""
    try:
        head = next(iter_trace_chunks(path, chunk_bytes=SNIFF_BYTES), b"")
    except InputError:
        return "dump"  # unreadable or damaged: reading it reports the problem
    if head[:1] == PICKLE_PROTO:
        return "dump"
    text = head[:SNIFF_BYTES]
    if any(key in text for key in _FR_JSON_KEYS) and b'"traceEvents"' not in text:
        return "dump"
    return "trace" if looks_like_trace(path) else "other"


def rank_of(path: Path) -> int:
    match = _RANK_IN_NAME.search(path.name)
    if not match:
        raise InputError(path, "cannot tell the rank: a dump's file name must end in its rank "
                               "(e.g. nccl_trace_rank_3, fr_rank_3.json)")
    if len(match.group(1)) > 7 or int(match.group(1)) >= MAX_WORLD:
        raise InputError(path, f"the file name's rank {match.group(1)[:40]} is beyond any job "
                               f"(ranks are below {MAX_WORLD:,})")
    return int(match.group(1))


def read_dump(path: Path, max_inflate_bytes: int = DEFAULT_MAX_INFLATE_BYTES) -> RankDump:
    raw = read_trace_bytes(path, max_inflate_bytes, limit=MAX_DUMP_BYTES)
    is_pickle = raw[:1] == PICKLE_PROTO
    doc = _unpickle(path, raw) if is_pickle else _decode_json(path, raw)
    dump = _parse(path, rank_of(path), doc)
    dump.format = "pickle" if is_pickle else "json"
    return dump


def _unpickle(path: Path, raw: bytes) -> Any:
    try:
        doc = _PlainUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as exc:
        raise InputError(path, f"unsafe or damaged pickle: {exc}") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, MemoryError,
            RecursionError, OverflowError) as exc:
        raise InputError(path, f"damaged pickle ({type(exc).__name__}: {exc})") from None
    _check_plain(path, doc, len(raw))
    return doc


# Objects a dump may expand to (each shared reference counted as its own copy, as the reader
# walks them) per byte of the file: a plain pickle spends a byte or more on every object it
# holds; shared references (pickle's memo: two bytes each) are the only way past this.
EXPANSION_PER_BYTE = 4
MAX_DUMP_BYTES = 256 << 20  # a dump's JSON text or pickle, inflated: real ones are MBs


def _check_plain(path: Path, doc: Any, size: int) -> None:
    """Every object in the document is a plain container or scalar (exact types: with every
    global refused, nothing else can come out of the unpickler; this says so for certain), no
    container holds itself (a cycle), and the document expanded (a shared object counted at
    each reference) stays within EXPANSION_PER_BYTE objects per byte of the file: the reading
    that follows costs what the file's size allows, never what its references multiply. Each
    container is walked once (its expanded size remembered), so this check is linear too."""
    if not _shares_containers(path, doc):
        return  # a tree: as many objects as the file holds
    budget = EXPANSION_PER_BYTE * size + 100_000
    sizes: dict[int, int] = {}  # id -> expanded size of a container fully walked
    active: set[int] = set()  # the containers on the path being walked
    stack: list[tuple[Any, dict[int, Any] | None]] = [(doc, None)]
    while stack:
        item, inner = stack.pop()
        if type(item) in _SCALARS:
            continue
        key = id(item)
        if inner is not None:  # its children walked: its size, each shared one times its references
            active.discard(key)
            children = _children(path, item)
            counts: dict[int, int] = {}
            for child in children:
                if type(child) not in _SCALARS:
                    counts[id(child)] = counts.get(id(child), 0) + 1
            total = 1 + len(children) - sum(counts.values()) + sum(n * sizes[i] for i, n in counts.items())
            if total > budget:
                raise InputError(path, f"pickle expands to more than {budget:,} objects through shared references "
                                       f"(the file is {size:,} bytes): refused")
            sizes[key] = total
        elif key in active:
            raise InputError(path, "pickle holds a container inside itself (a cycle), not plain data")
        elif key not in sizes:
            active.add(key)
            # each distinct container child once (a list of a million references to one: one walk)
            inner = {id(c): c for c in _children(path, item) if type(c) not in _SCALARS and id(c) not in sizes}
            stack.append((item, inner))
            stack.extend((child, None) for child in inner.values())


def _shares_containers(path: Path, doc: Any) -> bool:
    """Whether a container is reached twice (shared or in a cycle); one fast walk, each
    container once, that also refuses anything but plain data."""
    seen: set[int] = set()
    stack = [doc]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _SCALARS:
            continue
        if id(item) in seen:
            return True
        seen.add(id(item))
        if kind is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        elif kind in _SEQUENCES:
            stack.extend(item)
        else:
            raise InputError(path, f"pickle holds a {kind.__name__}, not plain data")
    return False


def _children(path: Path, item: Any):
    kind = type(item)
    if kind is dict:
        return [*item.keys(), *item.values()]
    if kind in _SEQUENCES:
        return item
    raise InputError(path, f"pickle holds a {kind.__name__}, not plain data")


def _decode_json(path: Path, raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError, ValueError) as exc:
        raise InputError(path, f"neither a Flight Recorder pickle nor valid JSON ({exc})") from None


# --- fields --------------------------------------------------------------------------------

class _Bad(Exception):
    """A field that is not what the format says: becomes one InputError naming the field."""


def _int(value: Any, where: str, optional: bool = False, low: int = 0, high: int = MAX_ID) -> int | None:
    """An integer field in ``[low, high]`` (ids, sequence numbers, times and sizes are int64s
    at or above 0 in torch's writer): anything else is bad input, named."""
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,20}", value.strip()):
        value = int(value)  # JSON pg_status writes numbers as strings
    if isinstance(value, int) and not isinstance(value, bool):
        if not low <= value <= high:
            raise _Bad(f"{where}: {str(value)[:40]} is out of range ({low} to {high})")
        return value
    if optional and value is None:
        return None
    raise _Bad(f"{where}: expected an integer, got {_show(value)}")


def _str(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    raise _Bad(f"{where}: expected a string, got {_show(value)}")


def _seq(value: Any, where: str) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    raise _Bad(f"{where}: expected a list, got {_show(value)}")


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def _sizes(value: Any, where: str) -> list[list[int]]:
    out = []
    for i, shape in enumerate(_seq(value, where)):
        if type(shape) in (list, tuple) and all(type(d) is int and 0 <= d <= MAX_ID for d in shape):
            out.append(list(shape))  # the common case, without building a field name per number
        else:
            out.append([_int(d, f"{where}[{i}]") for d in _seq(shape, f"{where}[{i}]")])
    return out


def _dtypes(value: Any, where: str) -> list[str]:
    return [_str(d, f"{where}[{i}]") for i, d in enumerate(_seq(value, where))]


def _parse(path: Path, rank: int, doc: Any) -> RankDump:
    try:
        return _parse_doc(path, rank, doc)
    except _Bad as exc:
        raise InputError(path, str(exc)) from None


def _parse_doc(path: Path, rank: int, doc: Any) -> RankDump:
    if not isinstance(doc, dict) or "version" not in doc:
        raise _Bad("not a Flight Recorder dump (no 'version' key at the top level)")
    raw_version = doc["version"]
    version = str(raw_version) if isinstance(raw_version, (int, float)) else _str(raw_version, "version")
    dump = RankDump(path=str(path), rank=rank, version=version,
                    comm_lib_version=str(doc.get("comm_lib_version", doc.get("nccl_version", "")) or ""),
                    pg_config=_pg_config(doc.get("pg_config", {})), pg_status=_pg_status(doc.get("pg_status", {})),
                    entries=[])
    major = re.match(r"(\d+)", version)
    if not major or int(major.group(1)) not in KNOWN_MAJOR_VERSIONS:
        dump.warnings.append(f"{path}: format version {version!r} is not one this reader knows (1.x, 2.x); "
                             "read as 2.x")
    if "entries" not in doc:
        dump.warnings.append(f"{path}: no 'entries' (dumped without collectives?)")
    entries = _seq(doc.get("entries", []), "entries")
    frames: dict[tuple, Frame] = {}
    dump.entries = [_entry(e, i, frames) for i, e in enumerate(entries)]
    return dump


def _tables(value: Any, name: str) -> list[tuple[Any, str, dict]]:
    """(key, where, table) for a mapping of mappings such as ``pg_config`` and ``pg_status``."""
    if not isinstance(value, dict):
        raise _Bad(f"{name}: expected a mapping, got {_show(value)}")
    for key, table in value.items():
        if not isinstance(table, dict):
            raise _Bad(f"{name}[{key!r}]: expected a mapping, got {_show(table)}")
    return [(key, f"{name}[{key!r}]", table) for key, table in value.items()]


def _pg_config(value: Any) -> dict[str, dict[str, Any]]:
    """2.x: group name -> {"name", "desc", "ranks"}; 1.x: pg_id -> [ranks]."""
    if not isinstance(value, dict):
        raise _Bad(f"pg_config: expected a mapping, got {_show(value)}")
    out = {}
    for key, cfg in value.items():
        where = f"pg_config[{key!r}]"
        if isinstance(cfg, (list, tuple)):
            out[str(_int(key, f"{where} key"))] = {"desc": "", "ranks": _ranks(cfg, where)}
        elif isinstance(cfg, dict):
            out[str(key)] = {"desc": str(cfg.get("desc", "") or ""), "ranks": _ranks(cfg.get("ranks"), where)}
        else:
            raise _Bad(f"{where}: expected a mapping or a list of ranks, got {_show(cfg)}")
    return out


def _ranks(value: Any, where: str) -> list[int] | None:
    """``ranks`` is written as the text "[0, 1, 2]" (fr_trace evaluates it; here it is parsed
    as a list of integers and nothing else)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"\[\s*(-?\d+\s*(,\s*-?\d+\s*)*,?)?\s*\]", text):
            raise _Bad(f"{where}.ranks: expected a list of integers, got {_show(value)}")
        value = [int(x) if len(x) <= 20 else x for x in re.findall(r"-?\d+", text)]
    members = _seq(value, f"{where}.ranks")
    if any(isinstance(x, int) and not isinstance(x, bool) and x < 0 for x in members):
        raise _Bad(f"{where}.ranks: a rank cannot be negative, got {min(x for x in members if isinstance(x, int))}")
    return sorted({_int(x, f"{where}.ranks", high=MAX_WORLD - 1) for x in members})


def _pg_status(value: Any) -> dict[int, GroupStatus]:
    out = {}
    for key, where, status in _tables(value, "pg_status"):
        last = [_int(status.get(f"last_{name}_collective", -1), f"{where}.last_{name}_collective", low=-1)
                for name in ("enqueued", "started", "completed")]
        out[_int(key, f"{where} key")] = GroupStatus(*last)
    return out


def _entry(e: Any, index: int, frames: dict[tuple, Frame]) -> DumpEntry:
    where = f"entries[{index}]"
    if not isinstance(e, dict):
        raise _Bad(f"{where}: expected a mapping, got {_show(e)}")
    name = _str(e.get("profiling_name", ""), f"{where}.profiling_name")
    backend, _, op_text = name.rpartition(":") if ":" in name else ("", "", name)
    op, _, peer = op_text.partition(" ")
    group, desc = _process_group(e, where)
    legacy_seq = e.get("seq_id")  # 1.x: one sequence for everything
    is_p2p = e.get("is_p2p", op in ("send", "recv"))
    if not isinstance(is_p2p, bool):
        raise _Bad(f"{where}.is_p2p: expected true/false, got {_show(is_p2p)}")
    return DumpEntry(
        record_id=_int(e.get("record_id", 0), f"{where}.record_id"),
        pg_id=_int(e.get("pg_id", 0), f"{where}.pg_id"),
        group=group, description=desc,
        collective_seq=_int(e.get("collective_seq_id", legacy_seq if not is_p2p else 0) or 0, f"{where}.collective_seq_id"),
        p2p_seq=_int(e.get("p2p_seq_id", legacy_seq if is_p2p else 0) or 0, f"{where}.p2p_seq_id"),
        is_p2p=is_p2p, backend=backend, op=op, peer=peer.strip(),
        input_sizes=_sizes(e.get("input_sizes", []), f"{where}.input_sizes"),
        output_sizes=_sizes(e.get("output_sizes", []), f"{where}.output_sizes"),
        input_dtypes=_dtypes(e.get("input_dtypes", []), f"{where}.input_dtypes"),
        output_dtypes=_dtypes(e.get("output_dtypes", []), f"{where}.output_dtypes"),
        state=_str(e.get("state", "scheduled"), f"{where}.state"),
        time_created_ns=_int(e.get("time_created_ns", 0), f"{where}.time_created_ns") or 0,
        time_started_ns=_int(e.get("time_discovered_started_ns"), f"{where}.time_discovered_started_ns", True) or None,
        time_completed_ns=_int(e.get("time_discovered_completed_ns"), f"{where}.time_discovered_completed_ns",
                               True) or None,
        timeout_ms=_int(e.get("timeout_ms"), f"{where}.timeout_ms", True),
        frames=_frames(e.get("frames", []), f"{where}.frames", frames),
        retired=_bool(e.get("retired"), f"{where}.retired"),
        op_id=_int(e.get("op_id"), f"{where}.op_id", True),
    )


def _bool(value: Any, where: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise _Bad(f"{where}: expected true/false, got {_show(value)}")


def _process_group(e: dict, where: str) -> tuple[str, str]:
    """``process_group`` is (name, desc); dumps without it are grouped by ``pg_id``."""
    value = e.get("process_group")
    if value is None:
        return str(_int(e.get("pg_id", 0), f"{where}.pg_id")), ""
    parts = _seq(value, f"{where}.process_group")
    if len(parts) != 2:
        raise _Bad(f"{where}.process_group: expected [name, description], got {_show(value)}")
    desc = _str(parts[1], f"{where}.process_group[1]")
    return _str(parts[0], f"{where}.process_group[0]"), "" if desc == "undefined" else desc


def _frames(value: Any, where: str, seen: dict[tuple, Frame] | None = None) -> tuple[Frame, ...]:
    """``seen``: the frames already read from this dump (entries share most of their stack)."""
    out = []
    seen = {} if seen is None else seen
    for i, f in enumerate(_seq(value, where)):
        if type(f) is dict:
            key = (f.get("name", "?"), f.get("filename", "?"), f.get("line", 0))
            if type(key[0]) is str and type(key[1]) is str and type(key[2]) is int:
                known = seen.get(key)
                if known is None:
                    known = seen[key] = Frame(*key)
                out.append(known)
                continue
        if not isinstance(f, dict):
            raise _Bad(f"{where}[{i}]: expected a mapping, got {_show(f)}")
        out.append(Frame(name=_str(f.get("name", "?"), f"{where}[{i}].name"),
                         filename=_str(f.get("filename", "?"), f"{where}[{i}].filename"),
                         line=_int(f.get("line", 0), f"{where}[{i}].line") or 0))
    return tuple(out)
