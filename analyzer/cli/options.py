"""Options shared by the commands. Each option means the same in every command that has it:
the measured job's facts (--gpu, --gpus-per-node, --nics-per-node, --nic-gbps, --model-params,
--tokens-per-step), --steps, --config, -o FILE, and the cache / executor options wherever
traces are read. ``whatif`` names its projected-job options distinctly (--target-...)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

import click

from analyzer.base.limits import MAX_WORLD
from analyzer.run import EXECUTORS


# Counts of the measured or projected job (GPUs, nodes, GPUs or NICs per node): no cluster has more.
COUNT = click.IntRange(min=1, max=MAX_WORLD)
# A link between 1 MB/s and 1 PB/s one way; model sizes and token counts up to 10**15.
GBPS = click.FloatRange(min=1e-3, max=1e6)
HUGE_COUNT = click.FloatRange(min=0, min_open=True, max=1e15)


def _stack(options: list[Callable]) -> Callable:
    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


_TRACE_OPTIONS = [
    click.option("--steps", help="ProfilerStep numbers to analyze, e.g. 3,5-7 (default: all)."),
    click.option("--gpus-per-node", type=COUNT,
                 help="GPUs per node of the measured job when the traces lack host names."),
    click.option("--gpu", help="GPU profile (e.g. h100, a100-sxm4-40gb) when deviceProperties is "
                               "missing or wrong."),
    click.option("--nics-per-node", type=COUNT,
                 help="NICs per node (default: one per GPU, an assumption the output states)."),
    click.option("--nic-gbps", type=GBPS,
                 help="One NIC's achievable one-way GB/s (default: 45 = a 400 Gb/s NIC)."),
    click.option("--model-params", type=HUGE_COUNT,
                 help="Model parameters Ψ (e.g. 7e9), for MFU."),
    click.option("--tokens-per-step", type=HUGE_COUNT,
                 help="Tokens per optimizer step of the whole job (global batch x sequence), for MFU."),
    click.option("--comm-kernel", "comm_kernel", multiple=True, metavar="REGEX",
                 help="Kernels that also count as communication (regex, repeatable); the built-in "
                      "catalog: `tracecliff explain communication`."),
    click.option("--workers", type=click.IntRange(min=1), help="Parallel worker processes (default: CPU count)."),
    click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
                 help="Run the per-rank analysis in local processes or on Dask distributed."),
    click.option("--scheduler", metavar="ADDRESS",
                 help="Dask scheduler (e.g. tcp://10.0.0.1:8786); default: a local Dask cluster."),
    click.option("--cache-dir", type=click.Path(file_okay=False),
                 help="Per-rank summary cache (default: ~/.cache/tracecliff or $TRACECLIFF_CACHE_DIR)."),
    click.option("--no-cache", is_flag=True, help="Neither read nor write the per-rank cache."),
    click.option("--max-inflate-gb", type=click.FloatRange(min=0, min_open=True, max=1e6), default=8.0,
                 show_default=True, help="Refuse a trace that inflates past this size (gzip bombs)."),
]
_TRACE_KEYS = ("steps", "gpus_per_node", "gpu", "nics_per_node", "nic_gbps", "model_params",
               "tokens_per_step", "comm_kernel", "workers", "executor", "scheduler", "cache_dir", "no_cache", "max_inflate_gb")


def trace_options(command):
    """Every option of reading and measuring traces; the command receives one ``options``
    (DiagnoseOptions, made by analyzer.api.options_from: the library takes the same names)."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        # Imported when a command reads traces: `hang` or `schema` need not import the analysis.
        from analyzer.api import options_from
        from analyzer.base.errors import ConfigError
        from analyzer.run.cache import default_cache_dir
        given = {k: kwargs.pop(k) for k in _TRACE_KEYS}
        if not given["no_cache"] and not given["cache_dir"]:
            given["cache_dir"] = default_cache_dir()  # the command line caches by default
        try:
            options = options_from(**given)
        except ConfigError as exc:  # a usage error of the command line (exit 2)
            raise click.UsageError(str(exc)) from None
        return command(*args, options=options, **kwargs)
    return _stack(_TRACE_OPTIONS)(wrapper)


def config_option(command):
    """``--config FILE``: the [tool.tracecliff] tables (default ./pyproject.toml), every table and
    key checked (analyzer.api.check_config) before any input is read, by every command that takes
    it; the command receives the table as ``config``."""
    @click.option("--config", "config_path", type=click.Path(dir_okay=False),
                  help="TOML file with [tool.tracecliff] tables (default: ./pyproject.toml).")
    @functools.wraps(command)
    def wrapper(*args, config_path=None, **kwargs):
        from analyzer.base.config import config_source, load_config
        config = load_config(config_path)
        if config:  # the checks import the rule registry: only when there is a table to check
            from analyzer.api import check_config
            check_config(config, config_source(config_path))
        return command(*args, config=config, config_path=config_path, **kwargs)
    return wrapper


def output_option(command):
    return click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True),
                        callback=lambda ctx, param, value: None if value == "-" else value,  # "-": stdout
                        help="Write to FILE (atomically) instead of stdout ('-': stdout).")(command)


def html_options(command):
    """--html, --timeline-step, --hta, --timestamp; the command receives them as one ``html``
    dict. ``--step`` is kept as a hidden alias of --timeline-step: next to ``--steps`` (the
    steps analysed) it read as the same option."""
    @functools.wraps(command)
    def wrapper(*args, html_file, step, step_alias, hta, timestamp, **kwargs):
        if step is not None and step_alias is not None and step != step_alias:
            raise click.UsageError("--step is --timeline-step: give one of them")
        step = step if step is not None else step_alias
        return command(*args, html={"file": html_file, "step": step, "hta": hta, "timestamp": timestamp},
                       **kwargs)
    return _stack([
        click.option("--html", "html_file", type=click.Path(dir_okay=False),
                     help="Also write the self-contained HTML report to FILE (next to the chosen --format)."),
        click.option("--timeline-step", "step", type=int,
                     help="ProfilerStep the HTML timeline draws (default: the typical step); --steps selects "
                          "the steps analysed."),
        click.option("--step", "step_alias", type=int, hidden=True),
        click.option("--hta", is_flag=True,
                     help="HTML: add HTA's idle-time and kernel-type breakdowns (needs the optional hta extra)."),
        click.option("--timestamp", is_flag=True,
                     help="HTML: print the generation time (off by default so the bytes are reproducible)."),
    ])(wrapper)


def emit(text: str | Iterable[str], output: str | None, inputs: list[Any]) -> None:
    """``text`` (or its pieces) to ``output`` (atomically, never over an input) or to stdout."""
    from analyzer.base.output import write_atomic
    from analyzer.base.sanitize import terminal, terminal_bytes
    # Every piece through the one sanitiser: trace strings never drive a terminal (issue 41).
    pieces = (terminal(piece) if isinstance(piece, str) else terminal_bytes(bytes(piece))
              for piece in ([text] if isinstance(text, (str, bytes)) else text))
    if output:
        write_atomic(output, pieces, [str(i) for i in inputs])
        return
    for piece in pieces:
        click.echo(piece, nl=False)
