"""Library API: everything the CLI does, callable from Python.

``diagnose(paths, **options)`` = find files -> analyze each rank in a worker (map) ->
``build_report``: combine the ranks into one job Result (reduce) -> job analyses -> rules ->
report sections, then frozen: nothing writes into a Result once it is built. The options are
the command line's, by the same names (``--nic-gbps 50`` is ``nic_gbps=50``, ``--steps 3-5`` is
``steps="3-5"``, ``--config FILE`` is ``config="FILE"``), or one ``DiagnoseOptions``.
``load_result(path)`` reads a saved ``diagnose --format json`` result back into a Result (checked
against its schema first).
"""

from __future__ import annotations

import shlex

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from analyzer.whatif.memory import memory_models
from analyzer.base.errors import ConfigError, InputError
from analyzer.base.gc_pause import paused_gc
from analyzer.ingest.catalog import comm_pattern
from analyzer.ingest.files import discover_trace_files
from analyzer.job.analysis import analyze_job
from analyzer.job.reduce import build_result, resolve_ranks
from analyzer.job import result as job_result
from analyzer.job.result import Result
from analyzer import reports  # noqa: F401  (registers the Result's rendered views: to_html, Jupyter's)
from analyzer.rank.analysis import RankAnalysis, RankOptions, forget_loaded
from analyzer.rules.engine import run_rules
from analyzer.whatif.gains import WHATIF_GAINS
from analyzer.run.executors import map_ranks, map_step_timelines, store_step_timelines

if TYPE_CHECKING:
    from analyzer.compare.gate import GateReport

Progress = Callable[[int, int, str], None]


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


# The command line's trace options, as keyword arguments (``--nic-gbps`` -> ``nic_gbps``).
OPTION_NAMES = ("steps", "gpus_per_node", "gpu", "nics_per_node", "nic_gbps", "model_params", "tokens_per_step",
                "comm_kernel", "workers", "executor", "scheduler", "cache_dir", "no_cache", "max_inflate_gb")
_POSITIVE_INTS = ("gpus_per_node", "nics_per_node", "workers")
_POSITIVE_NUMBERS = ("nic_gbps", "model_params", "tokens_per_step", "max_inflate_gb")


def options_from(options: DiagnoseOptions | None = None, **given: Any) -> DiagnoseOptions:
    """``DiagnoseOptions`` from the command line's option names (``steps="3-5"``, ``gpu="h100"``,
    ``comm_kernel=["my_a2a"]``, ``no_cache=True``, ``max_inflate_gb=32``), over ``options``;
    a name the command line does not have, or a value it would refuse, is a ConfigError."""
    from analyzer.base.config import check_patterns, parse_steps
    from analyzer.run import EXECUTORS
    unknown = sorted(set(given) - set(OPTION_NAMES))
    if unknown:
        import difflib
        close = difflib.get_close_matches(unknown[0], OPTION_NAMES, n=1)
        raise ConfigError(f"unknown option {unknown[0]!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                          + f"; the options: {', '.join(OPTION_NAMES)}")
    values: dict[str, Any] = {}

    def named(name: str) -> str:  # as the notebook and the command line spell it
        return f"{name}= (--{name.replace('_', '-')})"
    for name, value in given.items():
        if value is None or name in ("no_cache", "cache_dir"):
            continue
        if name in _POSITIVE_INTS and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{named(name)}: expected a whole number ≥ 1, got {value!r}")
        if name in _POSITIVE_NUMBERS and (not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0):
            raise ConfigError(f"{named(name)}: expected a number > 0, got {value!r}")
        if name == "steps":
            try:
                values["steps"] = parse_steps(value)
            except ValueError as exc:
                raise ConfigError(f"{named(name)}: {exc}") from None
        elif name == "comm_kernel":
            try:
                values["comm_kernels"] = check_patterns([value] if isinstance(value, str) else list(value))
            except ValueError as exc:
                raise ConfigError(f"{named(name)}: {exc}") from None
        elif name == "max_inflate_gb":
            values["max_inflate_bytes"] = int(value * 10**9)
        elif name == "executor" and value not in EXECUTORS:
            raise ConfigError(f"{named(name)}: expected one of {', '.join(EXECUTORS)}, got {value!r}")
        else:
            values[name] = value
    if given.get("no_cache"):
        values["cache_dir"] = None
    elif given.get("cache_dir") is not None:
        values["cache_dir"] = str(given["cache_dir"])
    merged = replace(options or DiagnoseOptions(), **values)
    if merged.scheduler and merged.executor != "dask":
        raise ConfigError("--scheduler needs --executor dask")
    return merged


def _config(config: dict[str, Any] | str | Path | None) -> dict[str, Any] | None:
    """The ``[tool.tracecliff]`` table, checked: given as such, or read from a file path, as
    ``--config FILE``."""
    if config is None:
        return None
    from analyzer.base.config import config_source, load_config
    table = config if isinstance(config, dict) else load_config(config)
    check_config(table, "configuration" if isinstance(config, dict) else config_source(config))
    return table


def check_config(table: dict[str, Any], source: str) -> None:
    """Every table and key of ``[tool.tracecliff]`` (``table``), whichever command reads it: the
    names under it, the rules (against the registry), the communication kernels and the gate.
    Any problem is one ConfigError line naming ``source`` and the key, with the closest valid name."""
    if not table:
        return
    from analyzer.base.config import check_tables, communication_kernels, rule_settings
    from analyzer.compare.gate import gate_keys, parse_gate_config
    from analyzer.rules.engine import all_rules
    rules = all_rules()
    check_tables(table, source, {"rules": sorted(rules), "communication": ("kernels",), "gate": gate_keys()})
    rule_settings(table, rules, source)
    communication_kernels(table, source)
    parse_gate_config(table, rule_names=sorted(rules), source=source)


def diagnose(paths: list[str] | tuple[str, ...] | str, options: DiagnoseOptions | None = None,
             progress: Progress | None = None, config: dict[str, Any] | str | Path | None = None, *,
             report: bool = True, html_step: int | None = None, step: int | None = None, hta: bool = False,
             empty_selection: bool = False, **cli_options: Any) -> Result:
    """``cli_options``: the command line's option names (``steps="3-5"``, ``gpu="h100"``,
    ``nic_gbps=50``, ...; see ``OPTION_NAMES``), over ``options``. ``config``: the
    ``[tool.tracecliff]`` table, or the file to read it from (``--config``). ``report``: also
    compute the report sections (the timeline of one step, ``step`` (``--step``) or the typical
    one, and the scaling what-if curve) so the Result renders to HTML on its own; ``hta``: add
    HTA's own breakdowns (needs the hta extra). ``steps`` that select no step of the traces are a
    ConfigError, unless ``empty_selection`` (the gate, which fails such a run in its report)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    options = options_from(options, **cli_options)
    config = _config(config)
    html_step = step if step is not None else html_step
    options = with_config_kernels(options, config)
    skipped: list[Path] = []
    files = discover_trace_files(paths, skipped)
    # The map keeps each rank's kernels for the report's step timeline (unless the ranks keep
    # whole timelines), so that it need not decode the shown ranks again.
    ranks = analyze_files(files, options, progress, keep_kernels=report and not options.keep_timeline)
    return build_report(ranks, options, config, report=report, step=html_step, hta=hta, skipped=skipped,
                        empty_selection=empty_selection)


def build_report(ranks: list[RankAnalysis], options: DiagnoseOptions, config: dict[str, Any] | None = None, *,
                 report: bool = True, step: int | None = None, hta: bool = False, skipped: list[Path] | None = None,
                 empty_selection: bool = False) -> Result:
    """The finished Result of the ranks' summaries (the map's), built once and frozen
    (``Result.freeze``): the reduce, the check of the step selection, the job analyses, the
    memory models, the rules (``config``: the checked ``[tool.tracecliff]`` table), the report
    sections (``report``; ``step``: the timeline's step) and HTA's deep dive (``hta``), in that
    order; nothing writes into the Result after. ``skipped``: the JSON files that were not
    traces (said in the first warning). The ranks become the Result's (their collective rows
    move into its table): build from a fresh map's."""
    with paused_gc():
        result = build_result(ranks, options)
        if not empty_selection:
            check_selection(result, options.steps)
        if skipped:
            result.warnings.insert(0, f"skipped {len(skipped)} JSON file(s) that are not traces: "
                                      + ", ".join(str(p) for p in skipped))
        analyze_job(result, options)
        if result.memory and result.memory.get("recorded"):  # measured against the models (docs/models.md §9)
            result.memory["models"] = memory_models(result)
        run_rules(result, config, gains=WHATIF_GAINS)
        if report:
            add_report_sections(result, options, step)
    if hta:
        from analyzer.job.hta import deep_dive
        result.hta = deep_dive({r.rank: r.path for r in result.ranks})
    return result.freeze()


def hang_trace_link(paths: list[str] | tuple[str, ...], options: DiagnoseOptions = DiagnoseOptions()) -> dict[str, Any]:
    """What the trace analysis says of a hung job's Kineto traces, for ``tracecliff hang`` (the
    ``traces`` of analyzer.hang.triage: was the culprit already the late rank?): the straggler
    summary, the straggler-rank rule's outcome, and the ranks the arrival order calls
    consistently last. Here because the hang layer does not import the trace analysis."""
    result = diagnose([str(p) for p in paths], options, report=False)
    rule = next((r for r in result.rules or [] if r.get("rule") == "straggler-rank"), {})
    finding = next((f for f in result.findings if f.get("rule") == "straggler-rank"), {})
    late = result.model.consistently_last()
    return {"traces": [str(r.path) for r in result.ranks], "world_size": result.job.get("world_size"),
            "stragglers": result.stragglers, "late_ranks": {str(r): why for r, why in late.items()},
            "rule": {"status": rule.get("status"), "reason": rule.get("reason"), "ranks": finding.get("ranks") or [],
                     "summary": finding.get("summary")}}


def check_selection(result: Result, steps: tuple[int, ...] | None) -> None:
    """A ``--steps`` that selects no step of the traces is the user's mistake, not an empty job:
    one ConfigError line, never a report of a run with nothing in it."""
    from analyzer.compare.metrics import requested_steps_missing, selected_nothing, steps_text
    if steps and selected_nothing(result, steps):
        missing = requested_steps_missing(result, steps)
        raise ConfigError(f"steps= (--steps): {steps_text(missing)} in none of the {len(result.ranks)} rank(s)' traces: "
                          "nothing selected; run without --steps to see the steps they hold")


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
    from analyzer.job.saved import read_result_file
    doc = read_result_file(Path(path))
    if doc is None:
        raise InputError(path, "not a tracecliff result (a `diagnose --format json` file)")
    return _saved(doc, path, path)


def _saved(doc: dict[str, Any], given: str | Path, path: str | Path) -> Result:
    """A saved result's document, checked, as a Result; every rule registered first, so that the
    views render its findings' evidence from their rules' types (analyzer.rules.evidence_types)."""
    from analyzer.job.plausible import check_result
    from analyzer.rules.engine import all_rules
    check_result(doc, given)
    all_rules()
    return Result.from_dict(doc, path)


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


def replay_fix_ranks(result: Result, ranks: str) -> dict[str, Any]:
    """``tracecliff whatif --fix-ranks 0,6``: the replay with those ranks' causes fixed
    (analyzer.whatif.replay.fix_ranks_doc); ``ranks``: comma-separated rank numbers."""
    from analyzer.whatif.replay import fix_ranks_doc
    parts = [p.strip() for p in ranks.split(",")]
    if not parts or not all(p.isdigit() and len(p) <= 7 for p in parts):
        raise InputError("--fix-ranks", f"expected comma-separated rank numbers, got {ranks!r}")
    return fix_ranks_doc(result, sorted({int(p) for p in parts}))


def load_run(paths: list[str] | str, options: DiagnoseOptions | None = None,
             config: dict[str, Any] | str | Path | None = None, progress: Progress | None = None,
             **keywords: Any) -> Result:
    """A run as a Result: one saved result file (checked), or the diagnosis of trace paths
    (``keywords``: diagnose's, the command line's option names among them)."""
    from analyzer.job.saved import read_result_file
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise InputError("<arguments>", "no trace or result path given")
    for raw in paths:
        path = Path(raw)
        if path.is_file() and (doc := read_result_file(path)) is not None:
            if len(paths) > 1:
                raise InputError(raw, "a saved result must be given alone, not with trace paths")
            return _saved(doc, raw, path)  # checked against the contract (analyzer.job.saved)
    return diagnose(paths, options, progress, config, **keywords)


def annotate(paths: list[str], outdir: str | Path, options: DiagnoseOptions | None = None,
             config: dict[str, Any] | str | Path | None = None, **cli_options: Any) -> list[dict[str, Any]]:
    """Annotated copies of each rank's trace in ``outdir`` (analyzer.export.annotate)."""
    from analyzer.export.annotate import output_paths, write_annotated
    files = discover_trace_files(paths)
    targets = output_paths(files, Path(outdir))
    options = replace(options_from(options, **cli_options), keep_timeline=True)
    result = diagnose(paths, options, config=config, report=False)
    return write_annotated(result, files, targets, Path(outdir))


def diff(base: str, new: str, options: DiagnoseOptions | None = None,
         config: dict[str, Any] | str | Path | None = None, **cli_options: Any) -> tuple[dict[str, Any], list[str]]:
    """``(diff document, input paths)`` of two runs (traces or saved results)."""
    from analyzer.compare.diff import diff_runs
    options = options_from(options, **cli_options)
    runs = [load_run([p], options, config, report=False) for p in (base, new)]
    inputs = [i["path"] for r in runs for i in r.inputs if i.get("path")]
    return diff_runs(runs[0], runs[1], base, new), inputs


def gate(paths: list[str] | str, config: dict[str, Any] | str | Path | None = None, baseline: str | None = None,
         options: DiagnoseOptions | None = None, preset: str | None = None,
         max_regression_pct: float | None = None,
         config_source: str = "./pyproject.toml", **cli_options: Any) -> tuple[GateReport, list[str]]:
    """``(GateReport, input paths)``: the run at ``paths`` checked against ``[tool.tracecliff.gate]``
    (``config``: the table, or the file to read it from) and, with ``baseline``, against that run."""
    from analyzer.compare.gate import evaluate, parse_gate_config, registered_rule_names
    if isinstance(config, (str, Path)):
        config_source = str(config)
    config = _config(config) or {}
    options = options_from(options, **cli_options)
    gate_config = parse_gate_config(config, preset, max_regression_pct, registered_rule_names(), config_source)
    if not gate_config.assertions and baseline is None:
        raise ConfigError(f"nothing to check: no [tool.tracecliff.gate] assertions in {config_source}, "
                          "no --preset and no --baseline")
    # an empty selection is the gate's failure to report (run_checks), not an error
    run = load_run(paths, options, config, report=False, empty_selection=True)
    base_run = load_run([baseline], options, config, report=False, empty_selection=True) if baseline else None
    inputs = [i["path"] for i in run.inputs if i.get("path")]
    label = shlex.join([paths] if isinstance(paths, str) else paths)
    return evaluate(run, gate_config, base_run, baseline, options.steps, label), inputs
