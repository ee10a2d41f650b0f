"""Per-rank summary cache: hits give the same bytes as a fresh run, any change misses,
damage is recomputed, entries are plain data (MessagePack), never pickle."""

import json
import os

import msgspec
import numpy as np
import pytest

from analyzer.run import cache
from analyzer.api import DiagnoseOptions, diagnose
from analyzer.rank.analysis import RankOptions
from analyzer.job.result import dumps
from builders import two_step_ddp


def run(paths, cache_dir, **kw):
    options = DiagnoseOptions(cache_dir=str(cache_dir) if cache_dir else None, workers=1, **kw)
    return dumps(diagnose([str(p) for p in paths], options).to_dict())


@pytest.fixture
def job(tmp_path):
    return [two_step_ddp(rank=r).write(tmp_path / f"rank-{r}.json") for r in (0, 1)]


def opened(entry):
    """An entry's bytes behind its seal (the cache's own key)."""
    return cache.unseal(cache.cache_secret(entry.parent.parent), entry.name, entry.read_bytes())


def sealed(entry, raw):
    """``raw`` written at ``entry`` as the cache itself would (validly sealed): damage behind the seal."""
    entry.write_bytes(cache.seal(cache.cache_secret(entry.parent.parent), entry.name, raw))


def entries(cache_dir, kind=cache.ENTRY_SUFFIX):
    """The rank entries (kind ".timeline.json": the report's step timelines)."""
    return sorted(p for p in cache_dir.rglob(f"*{kind}") if p.parent.name != "stat")


def test_hit_is_identical_and_skips_analysis(job, tmp_path, monkeypatch):
    store = tmp_path / "cache"
    fresh = run(job, None)
    assert run(job, store) == fresh
    assert len(entries(store)) == 2 and len(entries(store, ".timeline.json")) == 2  # both ranks shown

    def boom(*args, **kwargs):
        raise AssertionError("a cache hit must not re-analyze the trace")
    monkeypatch.setattr(cache, "analyze_rank_file", boom)
    monkeypatch.setattr(cache, "step_timeline_file", boom)
    assert run(job, store) == fresh


def test_key_changes_with_content_name_and_options(job, tmp_path):
    options = RankOptions()
    key = cache.cache_key(job[0], options)
    assert cache.cache_key(job[0], options) == key
    assert cache.cache_key(job[0], RankOptions(steps=(1,))) != key
    assert cache.cache_key(job[0], RankOptions(comm_pattern="nccl")) != key
    assert cache.cache_key(job[0], RankOptions(keep_timeline=True)) != key
    # max_inflate_bytes only decides refusals, which are never cached
    assert cache.cache_key(job[0], RankOptions(max_inflate_bytes=10**6)) == key
    renamed = tmp_path / "rank-7.json"  # the rank may come from the name
    renamed.write_bytes(job[0].read_bytes())
    assert cache.cache_key(renamed, options) != key
    changed = json.loads(job[0].read_text())
    changed["traceEvents"][2]["dur"] += 1
    job[0].write_text(json.dumps(changed))
    assert cache.cache_key(job[0], options) != key


def test_edit_misses_and_gives_new_numbers(job, tmp_path):
    store = tmp_path / "cache"
    before = json.loads(run(job, store))
    doc = json.loads(job[0].read_text())
    for event in doc["traceEvents"]:
        if event["name"].startswith("ncclDevKernel"):
            # all-reduce [60,100): compute covers [60,70) and the optimizer [90,95), so 25 µs
            # per step are exposed instead of 20
            event["dur"] = 40
    job[0].write_text(json.dumps(doc))
    after = json.loads(run(job, store))
    assert after == json.loads(run(job, None))
    assert before["ranks"][0]["exposed_comm_us"] == 40.0 and after["ranks"][0]["exposed_comm_us"] == 50.0


def test_same_bytes_at_another_path_report_that_path(job, tmp_path):
    store = tmp_path / "cache"
    run(job, store)
    other = tmp_path / "copy"
    other.mkdir()
    copies = []
    for path in job:
        copies.append(other / path.name)
        copies[-1].write_bytes(path.read_bytes())
    doc = json.loads(run(copies, store))
    assert [i["path"] for i in doc["inputs"]] == [str(p) for p in copies]
    assert run(copies, store) == run(copies, None)


def _columns_damaged(doc, damage):
    """The entry ``doc`` with its collective columns (analyzer.run.entry.StoredRows: each column
    [form, dtype, data, none, table, by_value]) damaged in one of several ways."""
    rows = doc["rows"]
    numbers = next(c for c in rows["columns"] if c[0] == "numbers")
    coded = next(c for c in rows["columns"] if c[0] == "coded")
    if damage == "short column":
        numbers[2] = numbers[2][:-8]  # one value fewer
    elif damage == "code out of range":
        coded[1], coded[2] = "<u4", np.full(rows["count"], len(coded[4]), dtype="<u4").tobytes()
    elif damage == "negative code":
        coded[1], coded[2] = "<i8", np.full(rows["count"], -1, dtype="<i8").tobytes()
    elif damage == "code not an int":
        coded[1], coded[2] = "<f8", np.zeros(rows["count"], dtype="<f8").tobytes()
    elif damage == "key missing":
        rows["keys"] = rows["keys"][1:]
    return msgspec.msgpack.encode(doc)


MSGPACK_DAMAGE = ["short column", "code out of range", "negative code", "code not an int", "key missing"]


@pytest.mark.parametrize("damage", [b"", b"{not json", b"\x92\x01\x02", b'{"format": 1, "rank": {}}',
                                    msgspec.msgpack.encode({"format": 999, "rank": {}}),
                                    msgspec.msgpack.encode({"format": cache.CACHE_FORMAT, "rank": {"path": 1}}),
                                    *MSGPACK_DAMAGE])
def test_damaged_entry_is_recomputed(job, tmp_path, damage):
    store = tmp_path / "cache"
    fresh = run(job, store)
    for entry in entries(store):
        if isinstance(damage, str):
            sealed(entry, _columns_damaged(msgspec.msgpack.decode(opened(entry)), damage))
        else:
            sealed(entry, damage)
    assert run(job, store) == fresh
    assert all(msgspec.msgpack.decode(opened(e))["format"] == cache.CACHE_FORMAT for e in entries(store))


def test_entries_are_plain_data_not_pickle(job, tmp_path):
    store = tmp_path / "cache"
    run(job, store)
    for entry in entries(store):
        raw = opened(entry)
        assert not raw.startswith(b"\x80")  # pickle protocol header
        assert msgspec.msgpack.decode(raw)["rank"]["rank"] in (0, 1)  # no extension types


def test_unwritable_cache_never_fails_the_run(job, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    assert run(job, blocker) == run(job, None)


def test_input_errors_are_not_cached(tmp_path):
    store = tmp_path / "cache"
    bad = tmp_path / "rank-0.json"
    bad.write_text('{"traceEvents": [')
    from analyzer.base.errors import InputError
    for _ in range(2):
        with pytest.raises(InputError, match="invalid JSON"):
            diagnose([str(bad)], DiagnoseOptions(cache_dir=str(store)))
    assert entries(store) == []


def test_cli_flags(job, tmp_path, monkeypatch, capsys):
    from analyzer.cli.main import main
    monkeypatch.setenv("TRACECLIFF_CACHE_DIR", str(tmp_path / "env-cache"))
    for args, where in ((["--cache-dir", str(tmp_path / "flag-cache")], "flag-cache"),
                        ([], "env-cache")):
        with pytest.raises(SystemExit) as exit_info:
            main(["diagnose", *args, *map(str, job)])
        assert exit_info.value.code == 0
        assert len(entries(tmp_path / where)) == 2
    with pytest.raises(SystemExit):
        main(["diagnose", "--no-cache", "--cache-dir", str(tmp_path / "unused"), *map(str, job)])
    assert not (tmp_path / "unused").exists()
    capsys.readouterr()


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.delenv("TRACECLIFF_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.default_cache_dir() == tmp_path / "tracecliff"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.default_cache_dir() == tmp_path / "home" / ".cache" / "tracecliff"


def test_prune_keeps_the_most_recently_used(job, tmp_path):
    import os
    store = tmp_path / "cache"
    run(job, store)
    old, recent = entries(store)
    os.utime(old, (1, 1))
    total = sum(p.stat().st_size for p in store.glob("??/*.*"))
    assert cache.prune(store, max_bytes=total - old.stat().st_size) == 1
    assert entries(store) == [recent] and len(entries(store, ".timeline.json")) == 2
    assert cache.prune(store, max_bytes=10**9) == 0


# -- the digest memo: a re-run does not re-read unchanged traces ------------------------------

def test_digest_memo_skips_rereading_an_unchanged_file(job, tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "RACY_SECONDS", -1.0)  # the test's files are seconds old
    store, options = tmp_path / "cache", RankOptions()
    key = cache.cache_key(job[0], options, store)
    assert key == cache.cache_key(job[0], options)  # the memo changes nothing but the speed
    assert len(list((store / "stat").glob("*.json"))) == 1

    def no_reading(path):
        raise AssertionError("an unchanged file must not be hashed again")
    monkeypatch.setattr(cache, "file_digest", no_reading)
    assert cache.cache_key(job[0], options, store) == key


def test_digest_memo_never_hides_a_change(job, tmp_path, monkeypatch):
    """A same-size rewrite with its mtime put back still changes ctime: the memo misses."""
    monkeypatch.setattr(cache, "RACY_SECONDS", -1.0)
    store, options = tmp_path / "cache", RankOptions()
    key = cache.cache_key(job[0], options, store)
    before = os.stat(job[0])
    data = job[0].read_bytes()
    job[0].write_bytes(data.replace(b'"dur": 40', b'"dur": 41', 1) if b'"dur": 40' in data
                       else data[:-2] + (b" " if data[-2:-1] != b" " else b"\n") + data[-1:])
    assert job[0].stat().st_size == before.st_size
    os.utime(job[0], ns=(before.st_atime_ns, before.st_mtime_ns))
    assert cache.cache_key(job[0], options, store) != key


def test_freshly_written_files_are_not_remembered(job, tmp_path):
    store = tmp_path / "cache"
    key = cache.cache_key(job[0], RankOptions(), store)
    assert key == cache.cache_key(job[0], RankOptions())
    assert not list((store / "stat").glob("*.json")) if (store / "stat").exists() else True


def test_damaged_digest_memo_is_ignored(job, tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "RACY_SECONDS", -1.0)
    store, options = tmp_path / "cache", RankOptions()
    key = cache.cache_key(job[0], options, store)
    (memo,) = (store / "stat").glob("*.json")
    doc = json.loads(memo.read_bytes()[32:])
    for damage in ("not json", json.dumps({**doc, "sha256": "../../etc"}), json.dumps({"stat": doc["stat"]})):
        memo.write_text(damage)
        assert cache.cache_key(job[0], options, store) == key


@pytest.mark.parametrize("edited", ["rank/comms.py", "ingest/columns.py", "run/cache.py", "data/comm_kernels.toml"])
def test_code_fingerprint_covers_the_whole_package(tmp_path, edited):
    """An edit anywhere in the analyzer (not only next to the cache module) or in its data
    files changes the fingerprint, so no summary of the old code is served."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    source = Path(cache.__file__).resolve().parents[1]
    copy = tmp_path / "analyzer"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))

    def fingerprint() -> str:
        code = "from analyzer.run.cache import code_fingerprint; print(code_fingerprint())"
        env = {**os.environ, "PYTHONPATH": str(tmp_path)}
        out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True,
                             capture_output=True, text=True).stdout.strip()
        assert len(out) == 32
        return out

    before = fingerprint()
    assert fingerprint() == before
    with open(copy / edited, "a") as handle:
        handle.write("\n# edited\n")
    assert fingerprint() != before


def test_a_pool_worker_stores_the_entry_one_process_stores(job, tmp_path):
    """A pool worker's path (cache.analyze_and_pack: the rows by column, as a table the parent
    gets pickled) writes the bytes the one-process path writes, and its rows, pickled and back,
    are that path's rows."""
    import pickle

    from analyzer.base.rowtable import RowTable
    options = RankOptions()
    one, pooled = tmp_path / "one", tmp_path / "pooled"
    key = cache.cache_key(job[0], options, one)
    alone = cache.analyze_and_store(str(job[0]), options, str(one), key)
    summary = pickle.loads(pickle.dumps(cache.analyze_and_pack(str(job[0]), options, str(pooled), key)))
    assert isinstance(summary.collectives, RowTable) and len(summary.collectives)
    assert [opened(p) for p in entries(one)] == [opened(p) for p in entries(pooled)]  # each cache its own key
    assert summary == alone


def test_cache_owns_only_its_folder_and_names(job, tmp_path):
    """Issue 41, 0: a --cache-dir holding the user's files gets a tagged folder of its own;
    pruning to nothing deletes no file the cache did not name, and no link is followed."""
    user = tmp_path / "cd2"
    (user / "ci").mkdir(parents=True)
    (user / "ci" / "settings.json").write_text("{}")
    (user / "db").mkdir()
    (user / "db" / "dump.json").write_text("{}")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "results.json").write_text("{}")
    fresh = run(job, user)
    root = cache.cache_root(user)
    assert root == user / "tracecliff-cache" and (root / cache.CACHEDIR_TAG).read_bytes().startswith(b"Signature: 8a477f")
    assert oct((root / "key").stat().st_mode & 0o777) == "0o600"
    (root / "zz").symlink_to(victim)  # a planted link, named as no shard is
    # and one named as a shard (a shard name this run's entries do not use: theirs follow their content)
    shard = next(name for name in (f"{i:02x}" for i in range(256)) if not (root / name).exists())
    (root / shard).symlink_to(victim)
    (root / "stat").mkdir(exist_ok=True)
    (root / "stat" / "settings.json").write_text("{}")
    stored = len(entries(user)) + len(entries(user, ".timeline.json"))
    assert stored == 4 and cache.prune(user, max_bytes=0) == stored
    for kept in (user / "ci" / "settings.json", user / "db" / "dump.json", victim / "results.json",
                 root / "stat" / "settings.json"):
        assert kept.exists(), kept
    assert not entries(user) and run(job, user) == fresh


def test_planted_memo_or_entry_is_not_trusted(job, tmp_path, monkeypatch):
    """A digest memo or an entry written by anyone but this cache (no valid seal) is ignored:
    a memo mapping a trace to another file's digest changes nothing."""
    monkeypatch.setattr(cache, "RACY_SECONDS", -1.0)
    store, options = tmp_path / "cache", RankOptions()
    key = cache.cache_key(job[0], options, store)
    (memo,) = (store / "stat").glob("*.json")
    identity = json.loads(memo.read_bytes()[32:])["stat"]
    other = cache.file_digest(job[1])
    memo.write_bytes(json.dumps({"stat": identity, "sha256": other}).encode())  # unsealed plant
    assert cache.cache_key(job[0], options, store) == key
    memo.write_bytes(b"\0" * 32 + json.dumps({"stat": identity, "sha256": other}).encode())  # forged seal
    assert cache.cache_key(job[0], options, store) == key


def test_wrong_shape_timeline_is_recomputed(job, tmp_path):
    """A step-timeline entry of valid JSON but another shape (even behind a valid seal) is
    recomputed, never a KeyError in the report."""
    store = tmp_path / "cache"
    fresh = run(job, store)
    timelines = entries(store, ".timeline.json")
    assert timelines
    for entry in timelines:
        sealed(entry, json.dumps({"format": cache.CACHE_FORMAT, "timeline": {"stream": [1]}}).encode())
    assert cache.cached_timeline(timelines[0]) is None
    assert run(job, store) == fresh


def test_runs_claiming_one_new_folder_at_once_share_it(tmp_path):
    """Concurrent first runs on one new --cache-dir all take it (the tag appears whole, once),
    none falls back to a subfolder."""
    from concurrent.futures import ThreadPoolExecutor
    store = tmp_path / "shared-new"
    with ThreadPoolExecutor(8) as pool:
        roots = set(pool.map(lambda _: cache.cache_root(store), range(16)))
    assert roots == {store} and not (store / "tracecliff-cache").exists()
    assert sorted(p.name for p in store.iterdir()) == [cache.CACHEDIR_TAG]
