"""simulate() and write_job(): the generator's public entry points."""

from __future__ import annotations

import gzip as gzip_module
import io
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .kineto import render_rank
from .programs import Program, build_program
from .spec import JobSpec
from .truth import build_truth


class RankTraces(Mapping):
    """rank -> Kineto trace object, rendered on first access (what-if checks need only the truth)."""

    def __init__(self, program: Program):
        self._program = program
        self._cache: dict[int, dict] = {}

    def __getitem__(self, rank: int) -> dict:
        if not isinstance(rank, int) or not 0 <= rank < len(self):
            raise KeyError(rank)
        if rank not in self._cache:
            self._cache[rank] = render_rank(self._program, rank)
        return self._cache[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self)))

    def __len__(self) -> int:
        return self._program.spec.world_size


@dataclass(frozen=True)
class Simulation:
    spec: JobSpec
    truth: dict  # JSON-able
    rank_traces: Mapping[int, dict]  # rank -> Kineto trace object (rendered lazily)

    @property
    def step_time_us(self) -> float:
        """Mean over steps of the slowest rank's ProfilerStep duration."""
        return self.truth["step_time_us"]


def simulate(spec: JobSpec) -> Simulation:
    """Run the job's simulation (pure: no I/O, deterministic for a given spec)."""
    program = build_program(spec)
    return Simulation(spec, build_truth(program), RankTraces(program))


def dumps(obj) -> bytes:
    """Deterministic JSON; ": " keeps tools that grep for `"rank": N` (HTA) working."""
    return json.dumps(obj, sort_keys=True, separators=(",", ": "), allow_nan=False).encode()


def write_job(spec: JobSpec, outdir: str | Path, gzip: bool = True, ranks: Iterable[int] | None = None) -> Path:
    """Write rank-{r}.json[.gz] per rank and truth.json into outdir; identical bytes every time.
    ``ranks``: only these ranks' traces (a partial job: the traces a user has of a larger run);
    the truth is the whole job's, every rank's, with ``ranks_written`` naming those written."""
    sim = simulate(spec)
    if ranks is None:
        return write_folder(outdir, sim.rank_traces, sim.truth, gzip)
    chosen = sorted(set(ranks))
    return write_folder(outdir, {r: sim.rank_traces[r] for r in chosen}, {**sim.truth, "ranks_written": chosen}, gzip)


def write_folder(outdir: str | Path, rank_traces: Mapping[int, dict], truth: dict, gzip: bool = True) -> Path:
    """rank-{r}.json[.gz] per rank and truth.json into outdir (also analyzer.synth.parallel's)."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    for rank, trace in rank_traces.items():
        data = dumps(trace)
        if gzip:
            (out / f"rank-{rank}.json.gz").write_bytes(_gzip(data))
        else:
            (out / f"rank-{rank}.json").write_bytes(data)
    text = json.dumps(truth, sort_keys=True, separators=(",", ":"), allow_nan=False)
    (out / "truth.json").write_bytes(text.encode() + b"\n")
    return out


def _gzip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip_module.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(data)
    return buf.getvalue()
