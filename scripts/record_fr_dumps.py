"""Record real Flight Recorder dumps of hung jobs in sample_traces/flight_recorder/ (torch + gloo
on CPU, no GPU needed).

    python scripts/record_fr_dumps.py                       # every scenario
    python scripts/record_fr_dumps.py --scenarios skip_collective subgroups_skip

Each scenario runs WORLD_SIZE ranks (torch.multiprocessing, gloo over 127.0.0.1, process-group
timeout TIMEOUT_S) that all-reduce a few times and then break in one way. Every rank writes its
dump both ways torch offers: ``json/fr_rank_<r>.json`` (``_dump_fr_trace_json``: no stack
frames) and ``pickle/fr_rank_<r>`` (``_dump_fr_trace``: the default format, with frames). A rank
dumps when its collective fails, when it has nothing left to do, or (the sleeping rank) from a
timer thread at the moment the others time out, as the dump-on-timeout signal would make it;
then it exits at once, as a killed job would.

The later scenarios (JOBS: subgroups_skip, status_lag, silent_highest, async_buckets) have their own world
size and write both formats side by side in one folder (``<scenario>/fr_rank_<r>.json`` and the
pickle ``<scenario>/fr_rank_<r>``), as a job does with both dumps enabled; they dump from a timer
thread at one moment on every rank (the dump signal), while the hung ranks still wait, and exit
only when every rank has dumped (so that no rank's exit breaks a peer's pending collective before
that peer dumped). Each checks after recording that the dumps show what it is meant to show (a
lagging ``pg_status``, an in-flight collective) and records again when a race went the other way.

Not recorded: p2p hangs. torch 2.13's gloo backend does not log send/recv in the flight
recorder (a recv that never matches leaves no entry), so the p2p checks are tested on
synthetic dumps (tests/test_hang.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD_SIZE = 4
TIMEOUT_S = 3
HEALTHY_STEPS = 3
BAD_RANK = 2
OUT = Path(__file__).resolve().parents[1] / "sample_traces" / "flight_recorder"

SCENARIOS = {
    "healthy": "every rank all-reduces 4 times and finishes (no hang: the control)",
    "skip_collective": f"rank {BAD_RANK} skips the 4th all-reduce (a rank-dependent branch)",
    "different_collectives": f"rank {BAD_RANK} broadcasts where the others all-reduce (4th collective)",
    "sleep_past_timeout": f"rank {BAD_RANK} sleeps {2 * TIMEOUT_S} s before the 4th all-reduce "
                          f"(timeout {TIMEOUT_S} s); it dumps when the others time out",
    "size_mismatch": f"rank {BAD_RANK} all-reduces 5 elements where the others all-reduce 4",
}

# The later jobs: their own world size, both formats in one folder, one dump moment.
LATE_RANK = 5        # subgroups_skip: the rank that is slow in the profiled steps, then skips #7
SLOW_INPUT_S = 0.2   # its "data loader" stall in each step
BIG = 1 << 24        # 64 MB of float32: an all-reduce that takes a few hundred ms here
DUMP_AFTER_S = 2.0   # the dump moment after the ranks last met (within the 3 s timeout)
IN_FLIGHT_LEAD_S = 0.15  # group [0-3] launches its #7 this long before the dump
SILENT_RANK = 3      # silent_highest: the highest rank dies without a dump
STALLED_RANK = 3     # async_buckets: the rank that never reaches its next collective
BUCKETS = 3          # async_buckets: the async all-reduces the others issue at once, as DDP does
JOBS = {
    "subgroups_skip": (8, f"8 ranks, groups [0-3] and [4-7]: rank {LATE_RANK} is late to each step's "
                          f"all-reduce of the default group ({SLOW_INPUT_S} s in its input pipeline; 3 profiled "
                          "steps, Kineto traces beside the dumps), then skips the 7th all-reduce of its group; #5 of each group is an async 64 MB "
                          "all-reduce that finishes after #6 (so pg_status lags behind the retired #6), and group "
                          "[0-3] launches its #7 (async, 256 MB) "
                          f"{IN_FLIGHT_LEAD_S} s before the dump: in flight"),
    "status_lag": (4, "4 ranks: #4 is an async 64 MB all-reduce that finishes after the small #5; every "
                      "rank then waits for it and dumps: nothing hangs, pg_status says #4 is the last completed"),
    "silent_highest": (4, f"4 ranks: rank {SILENT_RANK} (the highest) dies after #3 without a dump; the "
                          "others fail in #4 and dump"),
    "async_buckets": (4, f"4 ranks: rank {STALLED_RANK} stalls before its 4th collective; the others issue "
                         f"#4-#{3 + BUCKETS} at once as async all-reduces (DDP's gradient buckets) and wait in "
                         "them; every rank dumps at one moment, before the timeout"),
}


def _dump(out: Path, rank: int) -> None:
    json_dir, pickle_dir = out / "json", out / "pickle"
    json_dir.mkdir(parents=True, exist_ok=True)
    pickle_dir.mkdir(parents=True, exist_ok=True)
    c10d = torch._C._distributed_c10d
    (json_dir / f"fr_rank_{rank}.json").write_bytes(c10d._dump_fr_trace_json(True, False))
    (pickle_dir / f"fr_rank_{rank}").write_bytes(c10d._dump_fr_trace(True, True, False))


def _last_step(scenario: str, rank: int, tensor: torch.Tensor, out: Path) -> None:
    """The fourth collective, broken the scenario's way on BAD_RANK."""
    bad = rank == BAD_RANK
    if scenario == "skip_collective" and bad:
        return
    if scenario == "different_collectives" and bad:
        dist.broadcast(tensor, src=0)
    elif scenario == "size_mismatch" and bad:
        dist.all_reduce(torch.ones(5))
    elif scenario == "sleep_past_timeout" and bad:
        # The dump-on-timeout signal reaches the sleeper while it sleeps; the job is then killed.
        threading.Timer(TIMEOUT_S + 1.0, lambda: (_dump(out, rank), os._exit(0))).start()
        time.sleep(2 * TIMEOUT_S)
    else:
        dist.all_reduce(tensor)


def _worker(rank: int, scenario: str, out: Path, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=TIMEOUT_S))
    tensor = torch.ones(4)
    try:
        for _ in range(HEALTHY_STEPS):
            dist.all_reduce(tensor)
        _last_step(scenario, rank, tensor, out)
    except RuntimeError:
        pass  # the timeout (or gloo's own error): the moment the watchdog would dump
    _dump(out, rank)
    os._exit(0)  # no destroy_process_group: a hung job does not shut down cleanly


# --- the later jobs -------------------------------------------------------------------------

def _dump_flat(out: Path, rank: int) -> None:
    """Both formats side by side: ``fr_rank_<r>.json`` and the pickle ``fr_rank_<r>``."""
    c10d = torch._C._distributed_c10d
    (out / f"fr_rank_{rank}.json").write_bytes(c10d._dump_fr_trace_json(True, False))
    (out / f"fr_rank_{rank}").write_bytes(c10d._dump_fr_trace(True, True, False))


def _dump_then_exit(out: Path, rank: int, when: float, dumping: list[int], after: tuple[str, ...] = ()) -> None:
    """From a timer thread at ``when`` (the dump signal), once the marker files ``after`` exist:
    dump, then exit once every rank in ``dumping`` has dumped, so that no exit breaks a peer's
    pending collective before it dumps."""
    def wait_for(names: list[str], seconds: float) -> None:
        deadline = time.time() + seconds
        while time.time() < deadline and not all((out / n).exists() for n in names):
            time.sleep(0.01)

    def fire() -> None:
        wait_for(list(after), 10)
        _dump_flat(out, rank)
        (out / f".dumped_{rank}").touch()
        wait_for([f".dumped_{r}" for r in dumping], 20)
        os._exit(0)
    threading.Timer(max(0.0, when - time.time()), fire).start()


def _subgroups_skip(rank: int, out: Path, world: int) -> None:
    from analyzer.capture import profile_steps
    groups = dist.new_group([0, 1, 2, 3]), dist.new_group([4, 5, 6, 7])
    mine = groups[rank // 4]
    small = torch.ones(4)
    with profile_steps(out, wait=0, warmup=1, active=3) as prof:
        for _ in range(4):  # default group #1-#4
            if rank == LATE_RANK:
                time.sleep(SLOW_INPUT_S)  # a slow input pipeline: every other rank waits for it
            dist.all_reduce(small)
            prof.step()
    for _ in range(4):
        dist.all_reduce(small, group=mine)  # group #1-#4
    work = dist.all_reduce(torch.ones(BIG), group=mine, async_op=True)  # #5: the long one
    dist.all_reduce(small, group=mine)  # #6 completes first (gloo runs two works at once)
    work.wait()
    dist.all_reduce(small)  # default group #5: every rank leaves it at about the same moment
    dump_at = time.time() + DUMP_AFTER_S
    # The dump waits until group [0-3] has launched its #7, so that it is in flight at the dump.
    _dump_then_exit(out, rank, dump_at, list(range(world)), after=tuple(f".launched_{r}" for r in range(4)))
    if rank < 4:
        bigger = torch.ones(4 * BIG)  # allocated now: the launch must not wait for 256 MB of pages
        time.sleep(max(0.0, dump_at - IN_FLIGHT_LEAD_S - time.time()))
        dist.all_reduce(bigger, group=mine, async_op=True)  # #7: in flight at the dump
        (out / f".launched_{rank}").touch()
    elif rank != LATE_RANK:
        try:
            dist.all_reduce(small, group=mine)  # #7: rank 5 never joins
        except RuntimeError:
            pass
    time.sleep(60)  # the timer dumps and exits


def _status_lag(rank: int, out: Path, world: int) -> None:
    small = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(small)
    work = dist.all_reduce(torch.ones(BIG), async_op=True)  # #4: the long one
    dist.all_reduce(small)  # #5 completes first
    work.wait()
    _dump_then_exit(out, rank, time.time() + 0.5, list(range(world)))  # an on-demand dump, a moment later
    time.sleep(60)


def _silent_highest(rank: int, out: Path, world: int) -> None:
    small = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(small)
    if rank == SILENT_RANK:
        time.sleep(0.3)  # let the others finish #3, then die as a killed host would: no dump
        os._exit(0)  # (a nonzero code would stop torch.multiprocessing from waiting for the others)
    try:
        dist.all_reduce(small)  # #4 fails once rank 3 is gone (or times out)
    except RuntimeError:
        pass
    _dump_then_exit(out, rank, time.time(), [r for r in range(world) if r != SILENT_RANK])
    time.sleep(60)


def _async_buckets(rank: int, out: Path, world: int) -> None:
    small = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(small)  # #1-#3: every rank
    _dump_then_exit(out, rank, time.time() + 1.0, list(range(world)))  # before the 3 s timeout
    if rank == STALLED_RANK:
        time.sleep(60)  # stalls before its next collective (an input pipeline, a host-side hang)
    works = [dist.all_reduce(torch.ones(4), async_op=True) for _ in range(BUCKETS)]  # #4-#6, DDP-style
    for work in works:
        try:
            work.wait()
        except RuntimeError:
            pass
    time.sleep(60)


_JOB_BODIES = {"subgroups_skip": _subgroups_skip, "status_lag": _status_lag, "silent_highest": _silent_highest,
               "async_buckets": _async_buckets}


def _job_worker(rank: int, job: str, out: Path, port: int, world: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # up to 8 ranks on a small machine
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=TIMEOUT_S))
    _JOB_BODIES[job](rank, out, world)
    os._exit(0)


def _job_problems(job: str, out: Path) -> list[str]:
    """What the recording must show, read back through tracecliff's own (restricted) reader;
    an empty list when it does."""
    from analyzer.hang.read import read_dump
    world = JOBS[job][0]
    problems = []
    for path in sorted(out.glob("fr_rank_*")):
        dump = read_dump(path)
        status = {pg: s.completed for pg, s in dump.pg_status.items()}
        by_seq = {(e.group, e.collective_seq): e for e in dump.entries if not e.is_p2p}
        if job == "subgroups_skip" and dump.rank < 4:
            group = next(e.group for e in dump.entries if e.group != "0")
            last = by_seq.get((group, 7))
            if last is None or last.retired or status.get(last.pg_id, -1) >= 7:
                problems.append(f"{path.name}: group [0-3]'s #7 is not in flight")
        if job == "subgroups_skip" and dump.rank >= 4:
            group = next(e.group for e in dump.entries if e.group != "0")
            six = by_seq.get((group, 6))
            if six is None or not six.retired or status.get(six.pg_id, -1) >= 6:
                problems.append(f"{path.name}: pg_status does not lag behind the retired #6")
        if job == "status_lag":
            five = by_seq.get(("0", 5))
            if five is None or not five.retired or status.get(0, -1) != 4:
                problems.append(f"{path.name}: pg_status does not lag behind the retired #5")
        if job == "async_buckets":
            issued = sorted(e.collective_seq for e in dump.entries)
            pending = [e.collective_seq for e in dump.entries if not e.retired]
            want = (list(range(1, 4)), []) if dump.rank == STALLED_RANK else \
                (list(range(1, 4 + BUCKETS)), list(range(4, 4 + BUCKETS)))
            if (issued, pending) != want:
                problems.append(f"{path.name}: issued {issued}, pending {pending}; expected {want}")
    expected_dumps = world - (1 if job == "silent_highest" else 0)
    if len(list(out.glob("fr_rank_*.json"))) != expected_dumps:
        problems.append(f"{len(list(out.glob('fr_rank_*.json')))} JSON dumps, expected {expected_dumps}")
    return problems


def record_job(job: str, port: int, attempts: int = 4) -> None:
    world = JOBS[job][0]
    out = OUT / job
    for attempt in range(attempts):
        out.mkdir(parents=True, exist_ok=True)
        for old in [*out.glob("fr_rank_*"), *out.glob(".dumped_*"), *out.glob(".launched_*"),
                    *out.glob("*.pt.trace.json*")]:
            old.unlink()
        os.environ["TORCH_FR_BUFFER_SIZE"] = "64"
        mp.start_processes(_job_worker, args=(job, out, port + attempt, world), nprocs=world,
                           start_method="spawn", join=True)
        for marker in [*out.glob(".dumped_*"), *out.glob(".launched_*")]:
            marker.unlink()
        problems = _job_problems(job, out)
        if not problems:
            print(f"{job}: {sorted(p.name for p in out.iterdir())}")
            return
        print(f"{job}: attempt {attempt + 1} did not show the scenario ({'; '.join(problems)}); recording again")
    raise SystemExit(f"{job}: the races did not go the scenario's way in {attempts} attempts")


def record(scenario: str, port: int) -> None:
    out = OUT / scenario
    for old in [*out.glob("json/*"), *out.glob("pickle/*")]:
        old.unlink()
    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"  # turns the flight recorder on
    mp.start_processes(_worker, args=(scenario, out, port), nprocs=WORLD_SIZE, start_method="spawn")
    print(f"{scenario}: {sorted(p.name for p in out.glob('*/*'))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", choices=sorted([*SCENARIOS, *JOBS]),
                        default=[*SCENARIOS, *JOBS])
    args = parser.parse_args()
    for offset, scenario in enumerate(args.scenarios):
        if scenario in JOBS:
            record_job(scenario, 29700 + 10 * offset)
        else:
            record(scenario, 29650 + offset)
    print(f"torch {torch.__version__}; descriptions: {SCENARIOS} {({k: v[1] for k, v in JOBS.items()})}")


if __name__ == "__main__":
    main()
