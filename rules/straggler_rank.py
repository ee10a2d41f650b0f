"""straggler-rank (TC302)."""

from __future__ import annotations

from collections import Counter

from analyzer.rules.engine import NotEvaluated, Rule, Threshold, register
from analyzer.job.facts import median


@register
class StragglerRank(Rule):
    """One rank arrives last at the collectives, step after step, and the others wait for it.

    What it detects:
        For every collective matched across ranks (by group and sequence number, else by order),
        the rank whose kernel is shortest arrived last: a collective ends on all members together,
        so every other rank's duration is its wait plus the transfer. The rule fires when one
        rank is the last arrival in most collectives and the wait it causes on the median other
        rank (the part of each wait not hidden under that rank's own compute) is a material
        share of the step. It needs every rank's trace (with a subset, the shortest kernel
        belongs to the last rank *given*, not necessarily the last to arrive) and leaves out
        point-to-point transfers. Clock offsets between hosts do not matter: only
        durations are compared.

    Why it matters:
        Synchronous data parallelism runs at the pace of its slowest rank. Every other GPU idles
        inside NCCL for the straggler's extra time, on every step, and the loss grows with the
        number of ranks (the chance that some GPU is slow, throttled or shares a bad link).

    Evidence:
        The straggler's share of last arrivals, the wait per step it causes on the others, and
        its compute time per step against the median of the other ranks.

    Fix:
        Look at the straggler's host: GPU clocks and temperature (``nvidia-smi -q -d
        CLOCK,PERFORMANCE``), other processes, its data loader and input shapes (uneven
        batches), its NIC / PCIe link. Replace or drain the node; balance the input.

    References:
        docs/models.md §2 (collectives end together; transfer time vs wait);
        NVIDIA nccl-tests doc/PERFORMANCE.md; Li et al., VLDB 2020.
    """

    name = "straggler-rank"
    code = "TC302"
    title = "No rank holds the others back"
    failure_title = "A straggler rank consistently arrives last and makes the others wait"
    severity = "warning"
    needs = ("gpu_steps", "all_ranks", "collectives")
    thresholds = {
        "consistency": Threshold(0.6, "share of the collectives with a material wait in which the "
                                 "same rank arrives last", 0.0, 1.0),
        "wait_fraction": Threshold(0.03, "wait caused on the median other rank per step, as a "
                                   "fraction of the step time", 0.0, 1.0),
        "min_wait_us": Threshold(5.0, "a collective's largest wait (µs) below which it is noise "
                                 "and not counted", 0.0, 1e9),
    }
    references = ("docs/models.md §2", "NVIDIA nccl-tests doc/PERFORMANCE.md",
                  "Li et al., PyTorch Distributed, VLDB 2020")

    def check(self, ctx):
        facts = ctx.facts
        step_us = facts.typical_step_us
        if not step_us:
            raise NotEvaluated("no GPU step times")
        last: Counter = Counter()
        waits: dict[tuple[int, object], float] = {}  # (rank, step) -> wait
        material = 0
        for rows in facts.matched.values():
            if len(rows) < 2:
                continue
            durations = {rank: row["dur_us"] for rank, row in rows.items()}
            shortest = min(durations.values())
            if max(durations.values()) - shortest < ctx.thresholds["min_wait_us"]:
                continue
            material += 1
            latest = min(durations, key=lambda r: (durations[r], r))
            last[latest] += 1
            for rank, row in rows.items():
                # Waiting under the rank's own compute costs nothing: count the exposed part.
                exposed = row["exposed_us"] if row.get("exposed_us") is not None else row["dur_us"]
                key = (rank, row["step"])
                waits[key] = waits.get(key, 0.0) + min(durations[rank] - shortest, exposed)
        if not material:
            return []
        straggler, count = min(last.items(), key=lambda kv: (-kv[1], kv[0]))
        share = count / material
        others = sorted({rank for rank, _ in waits} - {straggler})
        steps = sorted({step for _, step in waits if step is not None}, key=str)
        per_step = [median(waits.get((rank, step), 0.0) for rank in others) for step in steps]
        wait = median(per_step) or 0.0
        if share < ctx.thresholds["consistency"] or wait < ctx.thresholds["wait_fraction"] * step_us:
            return []
        own = median(v.compute_us for v in facts.steps if v.rank == straggler)
        rest = median(v.compute_us for v in facts.steps if v.rank != straggler)
        slower = (own / rest - 1.0) if own and rest else None
        compute_text = f"; its compute takes {100 * slower:+.0f}% vs the median rank" if slower is not None else ""
        summary = (f"Rank {straggler} arrives last at {count} of {material} collectives ({100 * share:.0f}%) "
                   f"and the other ranks wait {wait:,.0f} µs per step for it ({100 * wait / step_us:.1f}% of "
                   f"the step){compute_text}.")
        model = (f"wait_r = min(dur_r − min_ranks(dur), exposed_r) per collective; per step, median over the other "
                 f"{len(others)} ranks of Σ wait = {wait:,.0f} µs = {100 * wait / step_us:.1f}% of "
                 f"{step_us:,.0f} µs")
        evidence = {
            "straggler": straggler, "last_arrivals": count, "collectives_with_wait": material,
            "share": round(share, 3), "wait_per_step_us": round(wait, 1),
            "wait_per_step_us_by_step": [[s, round(w, 1)] for s, w in zip(steps, per_step)],
            "straggler_compute_us": round(own, 1) if own else None,
            "others_compute_us_median": round(rest, 1) if rest else None,
            "last_arrivals_by_rank": {str(r): c for r, c in sorted(last.items())},
            "step_time_us": round(step_us, 1),
            "collectives": "all matched GPU collectives",
        }
        return [ctx.finding(summary=summary, ranks=[straggler], steps=steps, evidence=evidence,
                            estimated_gain_us=wait, model=model,
                            fix_text=(f"Inspect rank {straggler}'s host ({facts.node_of(straggler)}): GPU "
                                      "clocks/thermals, competing processes, data loading and input sizes, "
                                      "its network link; drain or replace the node."),
                            fix_snippet=f"nvidia-smi -q -d CLOCK,PERFORMANCE   # on {facts.node_of(straggler)}")]
