"""``tracecliff annotate``: copies of the rank traces with tracecliff's tracks added."""

from __future__ import annotations

import click

from analyzer.cli.options import config_option, trace_options


@click.command("annotate")
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--output", "outdir", required=True, type=click.Path(file_okay=False),
              help="Directory for the annotated copies (created; never an input's directory).")
@trace_options
@config_option
def annotate_command(paths, outdir, options, config, config_path) -> None:
    """Write each rank's trace at PATHS to OUTDIR with extra tracks (exposed communication,
    findings, steps, phases) for Perfetto UI and chrome://tracing."""
    from analyzer.api import annotate
    from analyzer.base.sanitize import one_line
    for item in annotate(list(paths), outdir, options, config):
        counts = ", ".join(f"{n} {k}" for k, n in item["windows"].items())
        click.echo(one_line(f"rank {item['rank']}: {item['output']} ({counts})"))  # a file name: shown, not obeyed
