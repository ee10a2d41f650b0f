"""What a saved result (``diagnose --format json``) may hold, checked when one is read back.

A result tracecliff wrote holds only what its readers let in (analyzer.base.limits); one edited
by hand or damaged may not, and the models, the what-if and the gate would take its numbers at
their word (a negative message size, a rank of 2**70, a step numbered 10**20). The fields they
read are checked here in one C-level conversion (msgspec), and the first one out of range is a
one-line error naming it. Other fields are not read by any model and are not checked.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from analyzer.base.errors import InputError
from analyzer.base.limits import MAX_DEVICE_BYTES, MAX_STEP, MAX_WORLD

Rank = Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORLD)]
World = Annotated[int, msgspec.Meta(ge=1, le=MAX_WORLD)]
Bytes = Annotated[float, msgspec.Meta(ge=0, le=MAX_DEVICE_BYTES)]
Step = Annotated[int, msgspec.Meta(ge=0, le=MAX_STEP)]
Duration = Annotated[float, msgspec.Meta(ge=0, le=2.0**53)]  # µs
Time = Annotated[float, msgspec.Meta(ge=-2.0**53, le=2.0**53)]  # µs from the job's origin


class _GroupBounds(msgspec.Struct):
    size: World | None = None
    ranks: list[Rank] | None = None


class _Collective(msgspec.Struct):
    rank: Rank
    bytes: Bytes | None = None
    in_nelems: Bytes | None = None
    out_nelems: Bytes | None = None
    dur_us: Duration | None = None
    start_us: Time | None = None
    launch_us: Time | None = None
    step: Step | None = None
    group: _GroupBounds | None = None


class _Bucket(msgspec.Struct):
    rank: Rank
    bytes: Bytes | None = None
    dur_us: Duration | None = None
    start_us: Time | None = None
    launch_us: Time | None = None
    step: Step | None = None


class _Leaves(msgspec.Struct):
    """A step's time and its five leaves (µs): what the job model's shares, the gate's metrics
    and the diff's split and scaling efficiency divide and subtract (NaN or a negative time would
    come out as a wrong number, or as an error from a model's own checks)."""

    step_time_us: Duration | None = None
    compute_only_us: Duration | None = None
    exposed_wait_us: Duration | None = None
    exposed_transfer_us: Duration | None = None
    other_gpu_us: Duration | None = None
    idle_us: Duration | None = None


class _StepBounds(msgspec.Struct):
    step: Step | None = None
    step_time_us: Duration | None = None
    time_breakdown: _Leaves | None = None


class _Rank(msgspec.Struct):
    rank: Rank
    world_size: World | None = None
    steps: list[_StepBounds] = []
    time_breakdown: _Leaves | None = None


class _Job(msgspec.Struct):
    world_size: World | None = None


class _Result(msgspec.Struct):
    job: _Job = msgspec.field(default_factory=_Job)
    attribution: _Leaves | None = None
    ranks: list[_Rank] = []
    collectives: list[_Collective] = []
    buckets: list[_Bucket] = []


def check_result(doc: dict[str, Any], path: Any) -> None:
    """Raise an InputError naming the first field of a saved result that no job can have."""
    try:
        msgspec.convert(doc, _Result)
    except msgspec.ValidationError as exc:
        raise InputError(path, f"not a plausible tracecliff result: {exc}") from None


def check_rows(rows: list[dict[str, Any]], path: Any) -> None:
    """The same checks for the collective rows a large result keeps in its rows file."""
    try:
        msgspec.convert(rows, list[_Collective])
    except msgspec.ValidationError as exc:
        raise InputError(path, f"not plausible collective rows: {exc}") from None
