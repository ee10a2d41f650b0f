"""``tracecliff diagnose``: traces (or a saved JSON result) -> text, JSON or HTML."""

from __future__ import annotations

import click

from analyzer.api import load_run
from analyzer.base.gc_pause import paused_gc
from analyzer.base.progress import ProgressBar
from analyzer.cli.main import keep_until_exit
from analyzer.base.output import is_special
from analyzer.job.large import is_large
from analyzer.cli.options import config_option, emit, html_options, output_option, trace_options
from analyzer.cli.rules import exit_code


@click.command("diagnose")
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True)
@output_option
@click.option("--fail-on", type=click.Choice(["error", "warning"]),
              help="Exit 1 when a finding of this severity (or worse) exists.")
@trace_options
@html_options
@config_option
def diagnose_command(paths, fmt, output, fail_on, options, html, config, config_path) -> int:
    """Measure exposed communication per rank and step in the traces at PATHS (files,
    directories or globs), or re-render a saved `diagnose --format json` result."""
    from analyzer.reports import render, render_chunks
    # The report sections (timeline, scaling curve) go into every saved result, so that it
    # renders to the same HTML later; the text view does not draw them.
    report = fmt != "text" or bool(html.get("file"))
    result = load_run(list(paths), options, config, progress=ProgressBar("reading traces"),
                      report=report, html_step=html["step"], hta=html["hta"])
    with paused_gc():
        inputs = [i["path"] for i in result.inputs] + list(paths)
        if fmt == "json" and output and not is_special(output):
            save(result, output, inputs)  # a large result's rows file beside it
        else:
            emit(render_chunks(result, fmt, timestamp=html["timestamp"]), output, inputs)
            if fmt == "json" and is_large(result):
                click.echo("tracecliff: the collective rows beyond the JSON's are not written: write the result "
                           "with -o FILE to have its rows file beside it", err=True)
        if html.get("file"):
            emit(render(result, "html", timestamp=html["timestamp"]), html["file"], inputs)
    keep_until_exit(result)
    return exit_code(result.findings, fail_on)


def save(result, output, inputs) -> None:
    """The JSON to ``output``; a large result's rows to the rows file beside it, else a line on
    stderr saying why there is none (the JSON says it too)."""
    written = result.save(output, [str(i) for i in inputs])
    if written is not None and written.file is None:
        click.echo(f"tracecliff: {output}: the collective rows beyond the JSON's are {written.why}", err=True)
