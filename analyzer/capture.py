"""Record PyTorch profiler traces that tracecliff can read, from your own training loop.

This module imports nothing heavy at import time: torch is loaded only when
:func:`profile_steps` is called, so ``import analyzer.capture`` works where torch is absent.
Install the extra with ``pip install tracecliff[capture]``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

TORCH_MISSING_MESSAGE = "torch is required: pip install tracecliff[capture]"
TRACE_SUFFIX = ".pt.trace.json"


def trace_file_name(rank: int, use_gzip: bool = True) -> str:
    """File name of one rank's trace: ``rank-{rank}.pt.trace.json[.gz]``.

    tracecliff's ingest recognises the rank in this name when a trace has no
    ``distributedInfo`` (a single-process run, or a process group created after the
    profiler started).
    """
    return f"rank-{rank}{TRACE_SUFFIX}" + (".gz" if use_gzip else "")


def current_rank() -> int:
    """This process's rank: the initialized default process group, else env ``RANK``, else 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def profile_steps(
    out_dir: str | os.PathLike[str],
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    skip_first: int = 0,
    record_shapes: bool = True,
    with_stack: bool = False,
    profile_memory: bool = False,
    gzip: bool = True,
    activities: Iterable[Any] | None = None,
    rank: int | None = None,
) -> Any:
    """A ``torch.profiler.profile`` set up to record a few training steps for tracecliff.

    Use it as a context manager around the training loop and call ``prof.step()`` once at
    the end of every iteration; the schedule does the rest::

        from analyzer.capture import profile_steps

        with profile_steps("traces/run1", wait=1, warmup=1, active=3) as prof:
            for batch in loader:
                train_step(batch)
                prof.step()

        # then:  tracecliff diagnose traces/run1

    The profiler skips ``skip_first`` steps, then repeats ``repeat`` times a cycle of ``wait``
    idle steps, ``warmup`` steps (profiler on, results dropped: keeps start-up cost out) and
    ``active`` recorded steps. Each recorded step appears in the trace as ``ProfilerStep#N``.
    Run at least ``skip_first + wait + warmup + active`` steps per cycle; if the loop ends
    early, the steps recorded so far are still written when the ``with`` block exits.

    Output: one file per rank, ``out_dir/rank-{rank}.pt.trace.json.gz`` (no ``.gz`` when
    ``gzip=False``). With ``repeat != 1`` every cycle goes to its own folder,
    ``out_dir/cycle-{k}/rank-{rank}...`` (k = 0, 1, ...), so that each folder holds exactly
    one trace per rank and can be passed to ``tracecliff diagnose`` as is. Files are written
    to a hidden temporary name and renamed into place, so a reader never sees half a trace.

    Args:
        out_dir: folder for the traces; created if missing. All ranks may share it.
        wait, warmup, active, repeat, skip_first: the ``torch.profiler.schedule`` arguments
            (``repeat=0`` repeats until the loop ends).
        record_shapes: record input shapes and dtypes of ops; tracecliff uses them (and the
            ``record_param_comms`` arguments they enable) to size collectives. Keep it on.
        with_stack: record Python stacks (large traces; off by default).
        profile_memory: record the allocator's events (off by default): one ``[memory]`` instant
            event per allocation and free, with the device's ``Total Allocated`` / ``Total
            Reserved`` after it. tracecliff then measures each rank's memory per step (peak
            allocated and reserved, where the peak is, growth across steps, headroom to the
            GPU) and checks that every fix that changes memory still fits: turn it on to ask
            "will it fit?". It adds an event per allocation (a few % more trace).
        gzip: write ``.json.gz`` (typically 10-20x smaller) instead of ``.json``.
        activities: profiler activities; default CPU, plus CUDA when ``torch.cuda`` is
            available.
        rank: rank used in the file name; default :func:`current_rank` at the time the trace
            is written (the default process group's rank, else env ``RANK``, else 0).

    Returns:
        The ``torch.profiler.profile`` object (not yet started): ``with`` starts and stops it.

    Torch adds a ``distributedInfo`` entry to the trace (backend, rank, world_size, pg_count,
    pg_config) only when the default process group is initialized *before* the profiler
    starts: call ``torch.distributed.init_process_group`` first.

    Raises:
        ImportError: torch is not installed.
        ValueError: a schedule argument is out of range.
    """
    torch = _import_torch()
    _check_schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
    if activities is None:
        activities = _default_activities(torch)
    return torch.profiler.profile(
        activities=list(activities),
        schedule=torch.profiler.schedule(
            skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat
        ),
        on_trace_ready=rank_trace_writer(out_dir, gzip=gzip, rank=rank, one_cycle=repeat == 1),
        record_shapes=record_shapes,
        with_stack=with_stack,
        profile_memory=profile_memory,
    )


def rank_trace_writer(
    out_dir: str | os.PathLike[str],
    *,
    gzip: bool = True,
    rank: int | None = None,
    one_cycle: bool = True,
) -> Callable[[Any], None]:
    """An ``on_trace_ready`` handler that writes one trace per rank (see :func:`profile_steps`).

    Usable on its own with a hand-built ``torch.profiler.profile``. With ``one_cycle=False``
    the k-th call writes into ``out_dir/cycle-{k}/``.
    """
    cycles_written = 0

    def write_trace(prof: Any) -> None:
        nonlocal cycles_written
        folder = os.fspath(out_dir)
        if not one_cycle:
            folder = os.path.join(folder, f"cycle-{cycles_written}")
        cycles_written += 1
        file_rank = current_rank() if rank is None else rank
        _export_atomically(prof, os.path.join(folder, trace_file_name(file_rank, gzip)))

    return write_trace


def _export_atomically(prof: Any, final_path: str) -> None:
    folder, name = os.path.split(final_path)
    os.makedirs(folder, exist_ok=True)
    # Same folder (so os.replace is atomic), hidden (so `*.json.gz` globs skip it), same suffix
    # (export_chrome_trace gzips when the name ends with .gz).
    temp_path = os.path.join(folder, f".tmp-{os.getpid()}-{name}")
    try:
        prof.export_chrome_trace(temp_path)
        os.replace(temp_path, final_path)
    finally:
        if os.path.exists(temp_path):
            os.remove(temp_path)


def _import_torch() -> Any:
    try:
        import torch
        import torch.profiler  # noqa: F401  (a submodule: make sure it loads)
    except ImportError as error:
        raise ImportError(TORCH_MISSING_MESSAGE) from error
    return torch


def _default_activities(torch: Any) -> list[Any]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def _check_schedule(**counts: int) -> None:
    negative = sorted(name for name, value in counts.items() if value < 0)
    if negative:
        raise ValueError(f"schedule arguments must be >= 0: {', '.join(negative)}")
    if counts["active"] < 1:
        raise ValueError("active must be >= 1: at least one step has to be recorded")
