"""Library API: everything the CLI does, callable from Python.

``diagnose(paths, options)`` = find files -> analyze each rank in a worker (map) -> combine the
ranks into one job Result (reduce) -> job analyses -> rules -> report sections.
``load_result(path)`` reads a saved ``diagnose --format json`` result back into a Result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from analyzer.base.errors import InputError
from analyzer.base.gc_pause import paused_gc
from analyzer.ingest.catalog import comm_pattern
from analyzer.ingest.files import discover_trace_files
from analyzer.job.analysis import analyze_job
from analyzer.job.reduce import build_result, resolve_ranks
from analyzer.job import result as job_result
from analyzer.rank.analysis import RankAnalysis, RankOptions, forget_loaded
from analyzer.rules.engine import run_rules
from analyzer.run.executors import map_ranks, map_step_timelines, store_step_timelines

if TYPE_CHECKING:
    from analyzer.compare.gate import GateReport

Progress = Callable[[int, int, str], None]


class Result(job_result.Result):
    """The job's Result (analyzer.job.result: data, JSON, DataFrames) with its rendered views,
    which live up here because the renderers (analyzer.reports) read the Result."""

    def to_html(self) -> str:
        """The self-contained report page of ``diagnose --format html``."""
        from analyzer.reports import render
        return render(self, "html")

    def _repr_html_(self) -> str:
        """Jupyter's inline view: verdict, headline numbers and findings (escaped)."""
        from analyzer.reports import render_summary_html
        return render_summary_html(self)


@dataclass(frozen=True)
class DiagnoseOptions:
    steps: tuple[int, ...] | None = None
    gpus_per_node: int | None = None
    comm_pattern: str | None = None  # the whole communication regex; None: catalog + comm_kernels
    comm_kernels: tuple[str, ...] = ()  # user patterns added to the catalog (--comm-kernel)
    max_inflate_bytes: int = 8 * 10**9
    workers: int | None = None  # None: one per CPU, at most one per rank
    keep_timeline: bool = False
    executor: str = "local"  # local | dask (analyzer.run.executors)
    scheduler: str | None = None  # Dask scheduler address; None: a LocalCluster
    cache_dir: str | None = None  # per-rank summary cache (analyzer.run.cache); None: no cache
    # hardware and model facts the trace lacks (analyzer.job.analysis): None = trace/profile value
    gpu: str | None = None  # GPU profile id or name, e.g. "h100" (overrides deviceProperties)
    nics_per_node: int | None = None
    nic_gbps: float | None = None  # one NIC's achievable one-way GB/s (e.g. 45 for 400 Gb/s)
    model_params: float | None = None  # Ψ, for MFU
    tokens_per_step: float | None = None  # whole job's tokens per optimizer step, for MFU

    def rank_options(self) -> RankOptions:
        pattern = self.comm_pattern or comm_pattern(self.comm_kernels)
        return RankOptions(pattern, self.max_inflate_bytes, self.steps, self.keep_timeline)


def diagnose(paths: list[str] | tuple[str, ...] | str, options: DiagnoseOptions = DiagnoseOptions(),
             progress: Progress | None = None, config: dict[str, Any] | None = None, *,
             report: bool = True, html_step: int | None = None, hta: bool = False) -> Result:
    """``config``: the ``[tool.tracecliff]`` table (analyzer.base.config.load_config) for the
    rules. ``report``: also compute the report sections (the timeline of one step, ``html_step``
    or the median one, and the scaling what-if curve) so the Result renders to HTML on its own;
    ``hta``: add HTA's own breakdowns (needs the hta extra)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    options = with_config_kernels(options, config)
    skipped: list[Path] = []
    files = discover_trace_files(paths, skipped)
    # The map keeps each rank's kernels for the report's step timeline (unless the ranks keep
    # whole timelines), so that it need not decode the shown ranks again.
    ranks = analyze_files(files, options, progress, keep_kernels=report and not options.keep_timeline)
    with paused_gc():
        result = Result(**vars(build_result(ranks, options)))
        if skipped:
            result.warnings.insert(0, f"skipped {len(skipped)} JSON file(s) that are not traces: "
                                      + ", ".join(str(p) for p in skipped))
        analyze_job(result, options)
        run_rules(result, config)
        if report:
            add_report_sections(result, options, html_step)
    if hta:
        from analyzer.job.hta import deep_dive
        result.hta = deep_dive({r.rank: r.path for r in result.ranks})
    return result


def with_config_kernels(options: DiagnoseOptions, config: dict[str, Any] | None) -> DiagnoseOptions:
    """The options with ``[tool.tracecliff.communication] kernels`` before the --comm-kernel ones."""
    from analyzer.base.config import communication_kernels
    kernels = communication_kernels(config or {})
    return replace(options, comm_kernels=kernels + tuple(options.comm_kernels)) if kernels else options


def analyze_files(files: list[Path], options: DiagnoseOptions, progress: Progress | None = None,
                  keep_kernels: bool = False) -> list[RankAnalysis]:
    """The ranks' summaries; ``keep_kernels``: with the kernels of every step of the ranks the map
    decodes (``RankAnalysis.kernels``, within analyzer.run.executors.KEPT_KERNELS_BYTES), for the
    report's step timeline."""
    rank_options = replace(options.rank_options(), keep_kernels=keep_kernels)
    results = map_ranks(files, rank_options, options.executor, options.scheduler, options.workers,
                        options.cache_dir, progress)
    return resolve_ranks(results)


def add_report_sections(result: Result, options: DiagnoseOptions, step: int | None = None) -> None:
    """The sections only the HTML view draws, computed here so that renderers only render. The
    ranks the timeline shows come from the kernels the map kept, else are read again like the
    map (in parallel, through the cache); the kept kernels are let go after."""
    from analyzer.job.step_timeline import report_timeline
    from analyzer.whatif.scaling import scaling_data

    def read(paths: list[str], rank_options: RankOptions, origin_ns: int) -> list[dict[str, Any]]:
        return map_step_timelines(paths, rank_options, origin_ns, options.executor, options.scheduler,
                                  options.workers, options.cache_dir)

    def store(paths: list[str], rank_options: RankOptions, origin_ns: int, timelines: list[dict[str, Any]]) -> None:
        store_step_timelines(paths, rank_options, origin_ns, timelines, options.cache_dir)
    # the document without a dict per DDP bucket: the timeline never reads them
    doc = job_result.result_to_dict(result, plain=False)
    result.timeline = report_timeline(doc, result, step, options.rank_options(), read, store)
    for rank in result.ranks:
        rank.kernels = None
    forget_loaded()
    result.scaling = scaling_data(result)


def load_result(path: str | Path) -> Result:
    """A saved ``diagnose --format json`` result as a Result."""
    from analyzer.compare.metrics import read_result_file
    doc = read_result_file(Path(path))
    if doc is None:
        raise InputError(path, "not a tracecliff result (a `diagnose --format json` file)")
    from analyzer.job.plausible import check_result
    check_result(doc, path)
    return Result.from_dict(doc)


def result_schema() -> dict[str, Any]:
    """The JSON Schema of ``diagnose --format json`` (analyzer.job.schema)."""
    from analyzer.job.schema import result_schema as schema
    return schema()


def config_schema() -> dict[str, Any]:
    """The JSON Schema of the ``[tool.tracecliff]`` table: the rules (from the registry, with
    each threshold's default and range) and the gate, as their validator checks them."""
    import msgspec

    from analyzer.base.config import rules_struct
    from analyzer.compare.gate import GateTable
    from analyzer.job.schema import versioned_schema
    from analyzer.rules.engine import all_rules
    rules = rules_struct(all_rules())
    table = msgspec.defstruct("TracecliffConfig", [("rules", rules, msgspec.field(default_factory=rules)),
                                                   ("gate", GateTable, msgspec.field(default_factory=GateTable))])
    return versioned_schema(table, "config", "[tool.tracecliff] configuration")


def load_run(paths: list[str], options: DiagnoseOptions = DiagnoseOptions(),
             config: dict[str, Any] | None = None, progress: Progress | None = None, **report: Any) -> Result:
    """A run as a Result: one saved result file, or the diagnosis of trace paths."""
    from analyzer.compare.metrics import read_result_file
    if not paths:
        raise InputError("<arguments>", "no trace or result path given")
    for raw in paths:
        path = Path(raw)
        if path.is_file() and (doc := read_result_file(path)) is not None:
            if len(paths) > 1:
                raise InputError(raw, "a saved result must be given alone, not with trace paths")
            if not isinstance(doc.get("ranks"), list):
                raise InputError(raw, "result document has no 'ranks' list")
            from analyzer.job.plausible import check_result
            check_result(doc, raw)
            return Result.from_dict(doc)
    return diagnose(paths, options, progress, config, **report)


def annotate(paths: list[str], outdir: str | Path, options: DiagnoseOptions = DiagnoseOptions(),
             config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Annotated copies of each rank's trace in ``outdir`` (analyzer.export.annotate)."""
    from analyzer.export.annotate import output_paths, write_annotated
    files = discover_trace_files(paths)
    targets = output_paths(files, Path(outdir))
    result = diagnose(paths, replace(options, keep_timeline=True), config=config, report=False)
    return write_annotated(result, files, targets, Path(outdir))


def diff(base: str, new: str, options: DiagnoseOptions = DiagnoseOptions(),
         config: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """``(diff document, input paths)`` of two runs (traces or saved results)."""
    from analyzer.compare.diff import diff_runs
    runs = [load_run([p], options, config, report=False) for p in (base, new)]
    inputs = [i["path"] for r in runs for i in r.inputs if i.get("path")]
    return diff_runs(runs[0], runs[1], base, new), inputs


def gate(paths: list[str], config: dict[str, Any], baseline: str | None = None,
         options: DiagnoseOptions = DiagnoseOptions(), preset: str | None = None,
         max_regression_pct: float | None = None,
         config_source: str = "./pyproject.toml") -> tuple[GateReport, list[str]]:
    """``(GateReport, input paths)``: the run at ``paths`` checked against ``[tool.tracecliff.gate]``
    and, with ``baseline``, against that run."""
    from analyzer.base.errors import ConfigError
    from analyzer.compare.gate import evaluate, parse_gate_config, registered_rule_names
    gate_config = parse_gate_config(config, preset, max_regression_pct, registered_rule_names(), config_source)
    if not gate_config.assertions and baseline is None:
        raise ConfigError(f"nothing to check: no [tool.tracecliff.gate] assertions in {config_source}, "
                          "no --preset and no --baseline")
    run = load_run(paths, options, config, report=False)
    base_run = load_run([baseline], options, config, report=False) if baseline else None
    inputs = [i["path"] for i in run.inputs if i.get("path")]
    return evaluate(run, gate_config, base_run, baseline), inputs
