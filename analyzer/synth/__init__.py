"""Synthetic multi-rank Kineto traces of DDP / FSDP jobs, from a physical simulation, with truth.

    from analyzer.synth import JobSpec, simulate, write_job, SCENARIOS
    sim = simulate(JobSpec(strategy="fsdp2", world_size=16))
    sim.truth, sim.rank_traces[3], sim.step_time_us
    write_job(SCENARIOS["ddp_straggler"], "out/ddp_straggler")   # rank-{r}.json.gz + truth.json
"""

from .job import Simulation, simulate, write_job
from .scenarios import SCENARIOS
from .spec import JobSpec

__all__ = ["JobSpec", "SCENARIOS", "Simulation", "simulate", "write_job"]
