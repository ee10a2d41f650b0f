"""``tracecliff diff BASE NEW``: what changed between two runs, and why."""

from __future__ import annotations

import click

from analyzer.cli.options import config_option, emit, output_option, trace_options


@click.command("diff")
@click.argument("base")
@click.argument("new")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True)
@output_option
@trace_options
@config_option
def diff_command(base, new, fmt, output, options, config, config_path) -> None:
    """Compare run BASE with run NEW (each: a trace file, directory or glob, or a saved
    `diagnose --format json` result). Options apply to both runs when they are traces."""
    from analyzer.api import diff
    from analyzer.reports import render_diff
    doc, inputs = diff(base, new, options, config)
    emit(render_diff(doc, fmt), output, inputs + [base, new])
