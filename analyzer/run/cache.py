"""Per-rank summary cache: a re-run on unchanged traces skips decoding them.

The key is a content hash: the file's bytes (as stored, compressed or not), its base name (the
rank may come from it), the tool version and every option that changes a rank's summary. A
changed file, option or tool release therefore misses; nothing is keyed by path or mtime.
Entries are MessagePack of plain data (``analyzer.run.entry``; never pickle: loading must not
run code), written atomically, and a damaged entry is simply recomputed. The cache never fails a
run: an unwritable directory only costs the speed-up.

Safety (issue 41): the cache owns one folder, marked by a ``CACHEDIR.TAG`` it wrote (``--cache-dir``
naming a folder that already holds other files gets a ``tracecliff-cache/`` folder inside it).
It reads, counts and deletes only the files it names itself (hex names, its own suffixes), never
through a symbolic link. Every entry and digest memo is sealed with an HMAC under a secret key
the cache creates (``key``, mode 0600): an entry anyone else wrote, moved or edited fails the
seal and is recomputed, so a planted memo cannot map a trace to another job's digest. A cache
shared between users is opt-in (``TRACECLIFF_CACHE_SHARED=1`` accepts a key file that others can
read) and trusts every writer who can read its key.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import stat as stat_mode
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


CACHEDIR_TAG = "CACHEDIR.TAG"
# https://bford.info/cachedir/: backup tools skip a folder holding this; its first line is fixed.
_TAG_TEXT = (b"Signature: 8a477f597d28d172789f06886806bc55\n"
             b"# This file is a cache directory tag created by tracecliff.\n")
_SUBFOLDER = "tracecliff-cache"  # the cache's own folder inside a --cache-dir that holds other files
_KEY_FILE = "key"
_SEAL_BYTES = 32  # HMAC-SHA256 tag before each entry's bytes
# The only files the cache reads, counts or deletes: its own hex names and suffixes.
_ENTRY_NAME = re.compile(r"[0-9a-f]{40}(?:\.msgpack|\.timeline\.json)\Z")
_SHARD_NAME = re.compile(r"[0-9a-f]{2}\Z")
_MEMO_NAME = re.compile(r"[0-9a-f]{32}\.json\Z")


def default_cache_dir() -> Path:
    """``$TRACECLIFF_CACHE_DIR``, else ``$XDG_CACHE_HOME/tracecliff``, else ``~/.cache/tracecliff``."""
    if os.environ.get("TRACECLIFF_CACHE_DIR"):
        return Path(os.environ["TRACECLIFF_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracecliff"


def cache_root(cache_dir: str | Path) -> Path | None:
    """The folder the cache owns under ``cache_dir`` (created and tagged on first use), or None
    when there is none it may use: ``cache_dir`` itself when it is the cache's (tagged) or new
    or empty, else its ``tracecliff-cache/`` subfolder on the same terms."""
    base = Path(cache_dir)
    for folder in (base, base / _SUBFOLDER):
        owned = _claim(folder)
        if owned is not None:
            return folder if owned else None
    return None


def _claim(folder: Path) -> bool | None:
    """True: ``folder`` is the cache's (tagged by it, or new/empty and now tagged); None: it is
    someone else's (try the next); False: it cannot be used (not a folder, unwritable)."""
    try:
        if folder.is_symlink() and folder.name == _SUBFOLDER:
            return False  # the subfolder is the cache's own: never a link out of it
        if _read_small(folder / CACHEDIR_TAG, len(_TAG_TEXT)) == _TAG_TEXT:
            return True
        folder.mkdir(parents=True, exist_ok=True)
        with os.scandir(folder) as listing:
            others = [i.name for i in listing if not i.name.startswith(".tag.")]
        if others:  # a concurrent run may just have tagged it: then it is the cache's after all
            return True if CACHEDIR_TAG in others and _tag_settles(folder) else None
        _publish_tag(folder)
        return True
    except FileExistsError:
        return True if _tag_settles(folder) else None
    except OSError:
        return False


def _publish_tag(folder: Path) -> None:
    _publish(folder, CACHEDIR_TAG, _TAG_TEXT, 0o644)


def _publish(folder: Path, name: str, raw: bytes, mode: int) -> None:
    """``folder/name`` appears whole or not at all (written aside, then hard-linked: raises
    FileExistsError when another run published it first)."""
    tmp = folder / f".tag.{os.getpid()}.{os.urandom(4).hex()}"
    _create_exclusive(tmp, raw, mode)
    try:
        os.link(tmp, folder / name)
    finally:
        os.unlink(tmp)


def _tag_settles(folder: Path) -> bool:
    return _read_small(folder / CACHEDIR_TAG, len(_TAG_TEXT)) == _TAG_TEXT


def _read_small(path: Path, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a regular file, never through a symbolic link (None: absent)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat_mode.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        return handle.read(limit + 1)


def _create_exclusive(path: Path, raw: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(raw)


def cache_secret(root: Path) -> bytes | None:
    """The cache's secret key (created, 0600, on first use); None when the key file is not the
    user's own and private (a shared cache is opt-in: TRACECLIFF_CACHE_SHARED=1)."""
    path = root / _KEY_FILE
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            try:
                _publish(root, _KEY_FILE, os.urandom(32).hex().encode(), 0o600)
            except FileExistsError:
                pass  # another run made it first: read theirs
            except OSError:
                return None
            continue
        except OSError:
            return None
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            raw = handle.read(65)
        shared = os.environ.get("TRACECLIFF_CACHE_SHARED") == "1"
        owner = os.getuid() if hasattr(os, "getuid") else info.st_uid
        private = info.st_mode & 0o077 == 0 and info.st_uid == owner
        if not stat_mode.S_ISREG(info.st_mode) or not (private or shared) or len(raw) != 64:
            return None
        return raw
    return None


def seal(secret: bytes, name: str, raw: bytes) -> bytes:
    """``raw`` with its HMAC (bound to the entry's own name: an entry moved to another key fails)."""
    import hashlib  # hashlib, hmac: where a cache is used (~2 ms of a --no-cache run's imports)
    import hmac
    return hmac.new(secret, name.encode() + b"\0" + raw, hashlib.sha256).digest() + raw


def unseal(secret: bytes, name: str, sealed: bytes) -> bytes | None:
    """The entry's bytes when its seal holds, else None (written by someone else, or damaged)."""
    import hashlib
    import hmac
    tag, raw = sealed[:_SEAL_BYTES], sealed[_SEAL_BYTES:]
    expected = hmac.new(secret, name.encode() + b"\0" + raw, hashlib.sha256).digest()
    return raw if len(tag) == _SEAL_BYTES and hmac.compare_digest(tag, expected) else None


def file_digest(path: str | Path) -> str:
    import hashlib
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
    import hashlib
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
    root = cache_root(cache_dir) if cache_dir else None
    secret = cache_secret(root) if root else None
    if not (root and secret):
        return file_digest(path)
    import hashlib
    before = os.stat(path)
    memo = root / "stat" / (hashlib.blake2b(os.fsencode(os.path.abspath(path)),
                                            digest_size=16).hexdigest() + ".json")
    identity = _stat_identity(before)
    doc = _read_json(memo, secret)
    if doc is not None and doc.get("stat") == identity and _is_sha256(doc.get("sha256")):
        return doc["sha256"]
    digest = file_digest(path)
    after = os.stat(path)
    settled = time.time() - max(after.st_mtime_ns, after.st_ctime_ns) / 1e9 > RACY_SECONDS
    if _stat_identity(after) == identity and settled:
        _write_json_atomic(memo, {"stat": identity, "sha256": digest}, secret)
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
    import hashlib
    return hashlib.blake2b(json.dumps(facts, sort_keys=True).encode(), digest_size=20).hexdigest()


def entry_path(cache_dir: str | Path, key: str) -> Path:
    """Where the entry of ``key`` lies: in the folder the cache owns (``cache_root``)."""
    root = cache_root(cache_dir)
    return (root if root else Path(cache_dir) / _SUBFOLDER) / key[:2] / f"{key}{ENTRY_SUFFIX}"


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
    import hashlib
    key = hashlib.blake2b(f"{key} timeline {origin_ns}".encode(), digest_size=20).hexdigest()
    # Beside the rank entries (the same pruning), named apart from them.
    return entry_path(cache_dir, key).with_suffix(".timeline.json")


_TIMELINE_COLUMNS = ("start_us", "dur_us", "stream", "kind", "name", "step", "phase")


def cached_timeline(entry: Path | None) -> dict[str, Any] | None:
    """The step timeline stored at ``entry``; None (recomputed) when missing, unsealed or of any
    other shape than ``kernels_timeline`` writes."""
    doc = _read_json(entry, _entry_secret(entry)) if entry else None
    if doc is None or doc.get("format") != CACHE_FORMAT or not _timeline_shape_ok(doc.get("timeline")):
        return None
    return doc["timeline"]


def _timeline_shape_ok(timeline: Any) -> bool:
    if not isinstance(timeline, dict) or not all(isinstance(timeline.get(k), list)
                                                 for k in (*_TIMELINE_COLUMNS, "strings", "phases")):
        return False
    columns = [timeline[k] for k in _TIMELINE_COLUMNS]
    if len({len(c) for c in columns}) != 1:
        return False
    numbers = all(type(v) in (int, float) for c in columns for v in c)
    names = all(type(v) is int and 0 <= v < len(timeline["strings"]) for v in timeline["name"])
    return numbers and names and all(isinstance(v, str) for v in (*timeline["strings"], *timeline["phases"]))


def step_timeline_and_store(path: str, options: RankOptions, origin_ns: int, entry: Path | None) -> dict[str, Any]:
    """``step_timeline_file``, stored at ``entry`` (from ``timeline_entry``) when there is one:
    a re-run's report then reads no trace at all."""
    timeline = step_timeline_file(path, options, origin_ns)
    store_timeline(entry, timeline)
    return timeline


def store_timeline(entry: Path | None, timeline: dict[str, Any]) -> None:
    """A step timeline stored at ``entry`` (from ``timeline_entry``; None: no cache)."""
    secret = _entry_secret(entry) if entry else None
    if entry and secret:
        _write_json_atomic(entry, {"format": CACHE_FORMAT, "timeline": timeline}, secret)


def _entry_secret(entry: Path | None) -> bytes | None:
    """The key of the cache holding ``entry`` (a shard's file: the root is two levels up)."""
    return cache_secret(entry.parent.parent) if entry else None


def _read_json(entry: Path, secret: bytes | None) -> dict[str, Any] | None:
    """A cache entry's JSON document (None when missing, unsealed or damaged), marked recently used."""
    raw = _read_bytes(entry, secret)
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


def _read_bytes(entry: Path, secret: bytes | None) -> bytes | None:
    """A cache entry's bytes (None when missing, not a regular file, or its seal fails), marked
    recently used: pruned last. Never through a symbolic link (the entry or its shard)."""
    if secret is None or entry.parent.is_symlink():
        return None
    try:
        fd = os.open(entry, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat_mode.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            sealed = handle.read()
        raw = unseal(secret, entry.name, sealed)
        if raw is not None:
            os.utime(entry)
    except OSError:
        return None
    return raw


def load_entry(entry: Path) -> RankAnalysis | None:
    raw = _read_bytes(entry, _entry_secret(entry))
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
    secret = _entry_secret(entry)
    raw = entry_codec.encode({name: getattr(analysis, name) for name in _FIELDS}, CACHE_FORMAT) if secret else None
    if raw is not None and secret:
        _write_atomic(entry, seal(secret, entry.name, raw))


def _write_json_atomic(target: Path, doc: Any, secret: bytes) -> None:
    try:
        raw = json.dumps(doc, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        return
    _write_atomic(target, seal(secret, target.name, raw))


def _write_atomic(target: Path, raw: bytes) -> None:
    """Temporary file + rename; a failure only costs the cache entry. Only inside the folder the
    cache owns, never into a shard that is a symbolic link."""
    tmp = None
    try:
        if target.parent.is_symlink():
            return
        target.parent.mkdir(exist_ok=True)
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
    stores new entries, so the cache cannot grow forever). Only the cache's own files count:
    its hex-named shards and entries in the folder it owns, never through a symbolic link."""
    root = cache_root(cache_dir)
    if root is None:
        return 0
    _prune_stat_memos(root / "stat")
    return _prune_entries(root, max_bytes)


def _own_files(folder: Path, name: re.Pattern) -> list[tuple[float, int, str]]:
    """(mtime, size, path) of the regular files in ``folder`` whose names the cache gives."""
    found = []
    try:
        with os.scandir(folder) as listing:
            for item in listing:
                if name.match(item.name) and item.is_file(follow_symlinks=False):
                    info = item.stat(follow_symlinks=False)
                    found.append((info.st_mtime, info.st_size, item.path))
    except OSError:
        pass
    return found


def _own_shards(root: Path) -> list[Path]:
    try:
        with os.scandir(root) as listing:
            return [Path(i.path) for i in listing if _SHARD_NAME.match(i.name) and i.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _prune_stat_memos(folder: Path, keep: int = MAX_STAT_MEMOS) -> None:
    if folder.is_symlink():
        return
    memos = sorted(_own_files(folder, _MEMO_NAME))
    for _, _, memo in memos[:max(0, len(memos) - keep)]:
        try:
            os.unlink(memo)
        except OSError:
            pass


def _prune_entries(root: Path, max_bytes: int) -> int:
    entries = [found for shard in _own_shards(root) for found in _own_files(shard, _ENTRY_NAME)]
    total = sum(size for _, size, _ in entries)
    deleted = 0
    for _, size, entry in sorted(entries):
        if total <= max_bytes:
            break
        try:
            os.unlink(entry)
        except OSError:
            continue
        total -= size
        deleted += 1
    return deleted
