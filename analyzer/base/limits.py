"""What a value read from a trace, a dump or a result can plausibly be (issue 30).

tracecliff's cost must follow the size of its input, never the values in it: a field that
claims a message of 2**50 elements, a rank of 2**70 or a step numbered 10**20 describes no job
that ran. The readers compare every such value with these limits; one beyond them is
*implausible*: it is left out of the models (read as unknown, exactly as a missing or
non-numeric value is) and one warning names the file and the field. The limits sit far
beyond any hardware or job, so that no real trace ever meets them.
"""

from __future__ import annotations

#: Ranks of one job (world size, group sizes; a rank is below it). The largest GPU clusters
#: built hold some 10**5 GPUs; 2**18 = 262,144 is beyond any of them.
MAX_WORLD = 1 << 18

#: Bytes of one device's memory, and so of one collective's message (its buffer lives there).
#: The largest accelerators hold 192-288 GB; 1 TiB is beyond every GPU and every CPU rank's
#: tensor. A trace's own ``deviceProperties.totalGlobalMem`` is the tighter bound when given.
MAX_DEVICE_BYTES = 1 << 40

#: Integer ids (correlation, External id, stream, Seq, sequence ids): an int64.
MAX_ID = (1 << 63) - 1

#: NCCL's ``Comms Id`` is a 64-bit hash, written unsigned.
MAX_COMMS_ID = (1 << 64) - 1

#: ProfilerStep numbers: exact in a double, so that every JSON reader (JavaScript included)
#: keeps them; at one step a microsecond, 2**53 steps take 285 years.
MAX_STEP = (1 << 53) - 1

#: One event's duration, µs: a week. A profiler trace covers seconds to hours.
MAX_DURATION_US = 7 * 24 * 3600 * 1e6


#: FSDP units of a projected wrap policy (``whatif --fsdp-units``): the projection replays each
#: unit's all-gather and reduce-scatter, so its cost follows the count. A unit per transformer
#: block is some 100-200 units for the largest models; 4,096 is beyond any wrap policy.
MAX_FSDP_UNITS = 1 << 12
