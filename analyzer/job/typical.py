"""Which step the job's figures are of: the one place a step is chosen.

The typical step (``analyzer.job.attribution`` applies it to every step's time, mean over
ranks): the steady steps are those left once the drain (the last step) and the steps whose time
lies more than ``OUTLIER_FRACTION`` from the median (a warm-up, an outlier) are set aside, and
the typical one is the steady step closest to their median (``median_step``). Where a view must
quote a step and the job has none (a saved result without the step breakdown, CPU-only
ProfilerSteps with FLOPs but no GPU time), it is ``median_step`` over the steps it has, said as
such where quoted.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping

# A step's role in the job (re-exported by analyzer.job.model, the types every view reads).
TYPICAL, STEADY, WARM_UP, DRAIN, OUTLIER, UNMEASURED = "typical", "steady", "warm-up", "drain", "outlier", "unmeasured"
# A steady step's time lies within this fraction of the median step (real jobs jitter ~10%).
OUTLIER_FRACTION = 0.3


def median_step(times: Mapping[Any, float]) -> Any:
    """The step whose time is closest to the median of ``times`` (ties: the lower step)."""
    middle = statistics.median(times.values())
    return min(times, key=lambda s: (abs(times[s] - middle), s))


def steady_steps(times: dict[Any, float], last_step: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    """(steady step numbers, excluded [{step, reason}]) from each step's time."""
    steps = sorted(times)
    excluded = []
    kept = list(steps)
    if len(kept) > 1 and last_step in kept:
        kept.remove(last_step)
        excluded.append({"step": last_step, "role": DRAIN,
                         "reason": "drain: the last step of the trace (no next step closes it: its time is its GPU span)"})
    if len(kept) > 2:
        middle = statistics.median(times[s] for s in kept)
        for s in list(kept):
            ratio = times[s] / middle if middle else 1.0
            if abs(ratio - 1.0) > OUTLIER_FRACTION and len(kept) > 1:
                kept.remove(s)
                what = WARM_UP if s == steps[0] else OUTLIER
                excluded.append({"step": s, "role": what, "reason": f"{what}: {ratio:.2f}x the median step time"})
    return kept, sorted(excluded, key=lambda e: e["step"])


def choose_typical(times: dict[Any, float]) -> tuple[Any, list[Any], list[dict[str, Any]]]:
    """(the typical step, the steady steps, the excluded ones) from each step's time."""
    kept, excluded = steady_steps(times, max(times))
    return median_step({s: times[s] for s in kept}), kept, excluded
