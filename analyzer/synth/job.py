"""simulate() and write_job(): the generator's public entry points."""

from __future__ import annotations

import gzip as gzip_module
import io
import json
from dataclasses import dataclass
from pathlib import Path

from .kineto import render_rank
from .programs import build_program
from .spec import JobSpec
from .truth import build_truth


@dataclass(frozen=True)
class Simulation:
    spec: JobSpec
    truth: dict  # JSON-able
    rank_traces: dict[int, dict]  # rank -> Kineto trace object

    @property
    def step_time_us(self) -> float:
        """Mean over steps of the slowest rank's ProfilerStep duration."""
        return self.truth["step_time_us"]


def simulate(spec: JobSpec) -> Simulation:
    """Run the job's simulation (pure: no I/O, deterministic for a given spec)."""
    program = build_program(spec)
    traces = {r: render_rank(program, r) for r in range(spec.world_size)}
    return Simulation(spec, build_truth(program), traces)


def dumps(obj) -> bytes:
    """Deterministic JSON; ": " keeps tools that grep for `"rank": N` (HTA) working."""
    return json.dumps(obj, sort_keys=True, separators=(",", ": "), allow_nan=False).encode()


def write_job(spec: JobSpec, outdir: str | Path, gzip: bool = True) -> Path:
    """Write rank-{r}.json[.gz] per rank and truth.json into outdir; identical bytes every time."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    sim = simulate(spec)
    for rank, trace in sim.rank_traces.items():
        data = dumps(trace)
        if gzip:
            (out / f"rank-{rank}.json.gz").write_bytes(_gzip(data))
        else:
            (out / f"rank-{rank}.json").write_bytes(data)
    (out / "truth.json").write_bytes(json.dumps(sim.truth, sort_keys=True, indent=None, separators=(",", ":")).encode() + b"\n")
    return out


def _gzip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip_module.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(data)
    return buf.getvalue()
