"""``tracecliff gate``: a CI performance gate over a run (and a baseline)."""

from __future__ import annotations

import os

import click

from analyzer.cli.options import config_option, emit, output_option, trace_options
from analyzer.compare.gate import PRESETS


@click.command("gate")
@click.argument("paths", nargs=-1, required=True)
@click.option("--baseline", type=click.Path(),
              help="Saved `diagnose --format json` result (or traces) to compare against.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False),
              help="Write JUnit XML (one testcase per check).")
@click.option("--github-summary", is_flag=True, help="Append a markdown summary to $GITHUB_STEP_SUMMARY.")
@click.option("--preset", type=click.Choice(PRESETS), help="Start from a preset (overrides the file's).")
@click.option("--max-regression-pct", type=click.FloatRange(min=0, max=1e6),
              help="Allowed regression against the baseline, % of its figure (overrides the file's; a "
                   "threshold is never below the metric's floor or the runs' noise: docs/ci.md).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@output_option
@trace_options
@config_option
@click.pass_context
def gate_command(ctx, paths, baseline, junit_path, github_summary, preset, max_regression_pct, fmt,
                 output, options, config, config_path) -> None:
    """Check a run (trace PATHS or a saved JSON result) against the assertions of
    [tool.tracecliff.gate] and, with --baseline, against a previous run; a run that selected no
    step or has no GPU steps, or lacks a metric the baseline has, fails.
    Exit 0 pass, 1 failed, 2 usage/input/config error."""
    from analyzer.api import gate
    from analyzer.base.config import config_source
    from analyzer.reports.gate_text import render_markdown, render_text
    report, inputs = gate(list(paths), config, baseline, options, preset, max_regression_pct,
                          config_source=config_source(config_path))
    inputs = inputs + list(paths) + ([baseline] if baseline else [])
    if fmt == "json":
        from analyzer.job.result import dumps
        emit(dumps(report.to_dict()), output, inputs)
    else:
        emit(render_text(report), output, inputs)
    if junit_path:
        from analyzer.reports.junit import render_junit
        emit(render_junit(report.to_dict()), junit_path, inputs)
    if github_summary:
        target = os.environ.get("GITHUB_STEP_SUMMARY")
        if target:
            with open(target, "a", encoding="utf-8") as handle:
                handle.write(render_markdown(report))
        else:
            click.echo("tracecliff: --github-summary: $GITHUB_STEP_SUMMARY is not set, summary skipped", err=True)
    ctx.exit(report.exit_code)
