"""Per-rank summary cache: a re-run on unchanged traces skips decoding them.

The key is a content hash: the file's bytes (as stored, compressed or not), its base name (the
rank may come from it), the tool version and every option that changes a rank's summary. A
changed file, option or tool release therefore misses; nothing is keyed by path or mtime.
Entries are MessagePack of plain data (``analyzer.run.entry``; never pickle: a cache directory
may be shared, and loading must not run code), written atomically, and a damaged entry is simply
recomputed. The cache never fails a run: an
unwritable directory only costs the speed-up.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from analyzer import __version__
from analyzer.base.gc_pause import paused_gc
from analyzer.run import entry as entry_codec
from analyzer.rank.analysis import RankAnalysis, RankOptions, analyze_rank_file, step_timeline_file

# 2: MessagePack, collective rows by column (analyzer.run.entry); 3: flat exposed intervals;
# 4: the rows' table (analyzer.base.rowtable) as its arrays
CACHE_FORMAT = 4
RACY_SECONDS = 2.0  # coarser than any file system's timestamp tick (FAT: 2 s)
MAX_CACHE_BYTES = int(os.environ.get("TRACECLIFF_CACHE_MAX_BYTES", 2 * 10**9))
_HASH_BLOCK = 8 << 20
ENTRY_SUFFIX = ".msgpack"  # rank entries; the report's step timelines are ".timeline.json"
# The fields an entry holds: all but the kernels the map keeps for this run's report
# (RankAnalysis.kernels), which a hit does without (the report then reads its timeline as before).
_FIELDS = tuple(f.name for f in dataclasses.fields(RankAnalysis) if f.name != "kernels")


def default_cache_dir() -> Path:
    """``$TRACECLIFF_CACHE_DIR``, else ``$XDG_CACHE_HOME/tracecliff``, else ``~/.cache/tracecliff``."""
    if os.environ.get("TRACECLIFF_CACHE_DIR"):
        return Path(os.environ["TRACECLIFF_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracecliff"


def file_digest(path: str | Path) -> str:
    digest = hashlib.sha256()  # hardware-accelerated on x86 and ARM: ~1.3 GB/s here
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Digest of the analyzer's own source: an edited checkout (same version number, different
    code) must not be served summaries computed by the old code. The whole package (this module
    lives in analyzer/run/) with its data files: the communication catalog and the hardware
    table change summaries too."""
    digest = hashlib.blake2b(__version__.encode(), digest_size=16)
    package = Path(__file__).resolve().parents[1]
    data = package / "data"
    for source in sorted([*package.rglob("*.py"), *data.glob("*.toml"), *data.glob("*.json")]):
        digest.update(str(source.relative_to(package)).encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def content_digest(path: str | Path, cache_dir: str | Path | None = None) -> str:
    """sha256 of the file's bytes. With a cache directory, the digest of a file is remembered
    by its stat identity (device, inode, size, mtime, ctime), as git's index and Bazel do, so a
    re-run of a 3 GB job does not read 3 GB again. Any write changes mtime and ctime (ctime
    cannot be set back); a file changed less than RACY_SECONDS before it was hashed is not
    remembered, since a rewrite within the same timestamp tick would look unchanged."""
    if not cache_dir:
        return file_digest(path)
    before = os.stat(path)
    memo = Path(cache_dir) / "stat" / (hashlib.blake2b(os.fsencode(os.path.abspath(path)),
                                                       digest_size=16).hexdigest() + ".json")
    identity = _stat_identity(before)
    try:
        doc = json.loads(memo.read_bytes())
        if doc["stat"] == identity and _is_sha256(doc["sha256"]):
            return doc["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = file_digest(path)
    after = os.stat(path)
    settled = time.time() - max(after.st_mtime_ns, after.st_ctime_ns) / 1e9 > RACY_SECONDS
    if _stat_identity(after) == identity and settled:
        _write_json_atomic(memo, {"stat": identity, "sha256": digest})
    return digest


def _stat_identity(info: os.stat_result) -> list[int]:
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def cache_key(path: str | Path, options: RankOptions, cache_dir: str | Path | None = None) -> str:
    # max_inflate_bytes is left out on purpose: it only decides whether a file is refused,
    # and refusals (InputError) are never cached.
    facts = {
        "format": CACHE_FORMAT,
        "tool": __version__,
        "code": code_fingerprint(),
        "content": content_digest(path, cache_dir),
        "name": Path(path).name,
        "comm_pattern": options.comm_pattern,
        "steps": list(options.steps) if options.steps is not None else None,
        "keep_timeline": options.keep_timeline,
    }
    return hashlib.blake2b(json.dumps(facts, sort_keys=True).encode(), digest_size=20).hexdigest()


def entry_path(cache_dir: str | Path, key: str) -> Path:
    return Path(cache_dir) / key[:2] / f"{key}{ENTRY_SUFFIX}"


def analyze_rank_cached(path: str, options: RankOptions, cache_dir: str | None) -> RankAnalysis:
    """``analyze_rank_file`` through the cache (``cache_dir`` None: no cache)."""
    if not cache_dir:
        return analyze_rank_file(path, options)
    key, cached = lookup(path, options, cache_dir)
    return cached if cached is not None else analyze_and_store(path, options, cache_dir, key)


def lookup(path: str, options: RankOptions, cache_dir: str) -> tuple[str | None, RankAnalysis | None]:
    """(key, cached summary or None). An unreadable file gives (None, None): the analysis
    itself then reports the problem."""
    key = key_or_none(path, options, cache_dir)
    return key, cached_entry(path, key, cache_dir)


def key_or_none(path: str, options: RankOptions, cache_dir: str | None = None) -> str | None:
    try:
        return cache_key(path, options, cache_dir)
    except OSError:
        return None


def cached_entry(path: str, key: str | None, cache_dir: str) -> RankAnalysis | None:
    cached = load_entry(entry_path(cache_dir, key)) if key else None
    if cached is not None:
        cached = dataclasses.replace(cached, path=str(path))  # same bytes may sit at another path
    return cached


def analyze_and_store(path: str, options: RankOptions, cache_dir: str | None, key: str | None,
                      two_cores: bool = False) -> RankAnalysis:
    analysis = analyze_rank_file(path, options, two_cores=two_cores)
    if cache_dir and key:
        store_entry(entry_path(cache_dir, key), analysis)
    return analysis


def analyze_and_pack(path: str, options: RankOptions, cache_dir: str | None, key: str | None) -> RankAnalysis:
    """``analyze_and_store`` in a worker process: the summary goes back to the parent with its
    collective rows by column (a RowTable pickles as its arrays: a fifth of the rows as dicts)."""
    return analyze_and_store(path, options, cache_dir, key)


def analyze_rank_cached_packed(path: str, options: RankOptions, cache_dir: str | None) -> RankAnalysis:
    """``analyze_rank_cached`` on a Dask worker (its rows by column, as ``analyze_and_pack``)."""
    return analyze_rank_cached(path, options, cache_dir)


def timeline_entry(path: str, options: RankOptions, origin_ns: int, cache_dir: str | None) -> Path | None:
    """Where a rank's step timeline (``step_timeline_file``) is cached: under the rank's key for
    these options (their ``steps``: the step shown) and the time origin. None: no cache, or the
    file cannot be read (the read then reports it)."""
    key = key_or_none(path, options, cache_dir) if cache_dir else None
    if not (cache_dir and key):
        return None
    key = hashlib.blake2b(f"{key} timeline {origin_ns}".encode(), digest_size=20).hexdigest()
    # Beside the rank entries (the same pruning), named apart from them.
    return entry_path(cache_dir, key).with_suffix(".timeline.json")


def cached_timeline(entry: Path | None) -> dict[str, Any] | None:
    doc = _read_json(entry) if entry else None
    if doc is None or doc.get("format") != CACHE_FORMAT or not isinstance(doc.get("timeline"), dict):
        return None
    return doc["timeline"]


def step_timeline_and_store(path: str, options: RankOptions, origin_ns: int, entry: Path | None) -> dict[str, Any]:
    """``step_timeline_file``, stored at ``entry`` (from ``timeline_entry``) when there is one:
    a re-run's report then reads no trace at all."""
    timeline = step_timeline_file(path, options, origin_ns)
    store_timeline(entry, timeline)
    return timeline


def store_timeline(entry: Path | None, timeline: dict[str, Any]) -> None:
    """A step timeline stored at ``entry`` (from ``timeline_entry``; None: no cache)."""
    if entry:
        _write_json_atomic(entry, {"format": CACHE_FORMAT, "timeline": timeline})


def _read_json(entry: Path) -> dict[str, Any] | None:
    """A cache entry's JSON document (None when missing or damaged), marked recently used."""
    raw = _read_bytes(entry)
    if raw is None:
        return None
    try:
        with paused_gc():  # tens of thousands of fresh dicts, no cycles
            try:
                doc = msgspec.json.decode(raw)  # faster than json for the common case
            except msgspec.DecodeError:
                doc = json.loads(raw)  # NaN literals (json.dump writes them), huge ints
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _read_bytes(entry: Path) -> bytes | None:
    """A cache entry's bytes (None when missing), marked recently used: pruned last."""
    try:
        with open(entry, "rb") as handle:
            raw = handle.read()
        os.utime(entry)
    except OSError:
        return None
    return raw


def load_entry(entry: Path) -> RankAnalysis | None:
    raw = _read_bytes(entry)
    fields = entry_codec.decode(raw, CACHE_FORMAT) if raw is not None else None
    try:
        if fields is None or set(fields) != set(_FIELDS):
            return None
        return RankAnalysis(**fields)
    except TypeError:
        return None  # damaged: recompute


def store_entry(entry: Path, analysis: RankAnalysis) -> None:
    # The fields as they are (no deep copy: encoding reads them); numpy scalars and tuples
    # become numbers and arrays in the encoder.
    raw = entry_codec.encode({name: getattr(analysis, name) for name in _FIELDS}, CACHE_FORMAT)
    if raw is not None:
        _write_atomic(entry, raw)


def _write_json_atomic(target: Path, doc: Any) -> None:
    try:
        raw = json.dumps(doc, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        return
    _write_atomic(target, raw)


def _write_atomic(target: Path, raw: bytes) -> None:
    """Temporary file + rename; a failure only costs the cache entry."""
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        import tempfile  # only when an entry is written (issue 13: not in --no-cache runs)

        fd, tmp = tempfile.mkstemp(prefix=".entry.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
        os.replace(tmp, target)
    except OSError:
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


MAX_STAT_MEMOS = 100_000  # ~200 bytes each


def prune(cache_dir: str | Path, max_bytes: int = MAX_CACHE_BYTES) -> int:
    """Delete the least recently used entries until the cache holds at most ``max_bytes``, and
    the oldest digest memos beyond MAX_STAT_MEMOS; return how many entries were deleted (a run
    stores new entries, so the cache cannot grow forever)."""
    _prune_stat_memos(Path(cache_dir) / "stat")
    return _prune_entries(cache_dir, max_bytes)


def _prune_stat_memos(folder: Path, keep: int = MAX_STAT_MEMOS) -> None:
    memos = []
    for memo in folder.glob("*.json") if folder.is_dir() else ():
        try:
            memos.append((memo.stat().st_mtime, str(memo)))
        except OSError:
            continue
    for _, memo in sorted(memos)[:max(0, len(memos) - keep)]:
        try:
            os.unlink(memo)
        except OSError:
            pass


def _prune_entries(cache_dir: str | Path, max_bytes: int) -> int:
    entries = []
    found = [*Path(cache_dir).glob(f"??/*{ENTRY_SUFFIX}"), *Path(cache_dir).glob("??/*.json")]
    for entry in found:  # ".json": the step timelines, and rank entries of format 1
        try:
            info = entry.stat()
        except OSError:
            continue
        entries.append((info.st_mtime, info.st_size, entry))
    total = sum(size for _, size, _ in entries)
    deleted = 0
    for _, size, entry in sorted(entries, key=lambda e: (e[0], str(e[2]))):
        if total <= max_bytes:
            break
        try:
            entry.unlink()
        except OSError:
            continue
        total -= size
        deleted += 1
    return deleted
