"""``tracecliff hang PATH...``: triage a hung or timed-out job from Flight Recorder dumps.
Exit 0 no hang found, 1 a hang found, 2 usage or input error (one line, never a traceback)."""

from __future__ import annotations

import click

from analyzer.cli.options import config_option, emit, output_option

EXIT_OK, EXIT_HANG = 0, 1


@click.command("hang")
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True)
@output_option
@config_option
def hang_command(paths, fmt, output, config, config_path) -> int:
    """Name the ranks a hung job waits on, and why, from its Flight Recorder dumps at PATHS
    (one per rank: files, directories or globs; JSON or pickle dumps)."""
    # No [tool.tracecliff] table configures the triage; --config / ./pyproject.toml are checked
    # as every command checks them, so that a typo there fails here too, not silently.
    from analyzer.hang import triage
    report = triage(list(paths))
    emit(_render(fmt, report.to_dict()), output, [i["path"] for i in report.inputs])
    return EXIT_HANG if report.hung else EXIT_OK


def _render(fmt: str, doc: dict) -> str:
    if fmt == "json":
        from analyzer.job.result import dumps
        return dumps(doc)
    if fmt == "html":
        from analyzer.reports.hang_html import render_html
        return render_html(doc)
    from analyzer.reports.hang_text import render_text
    return render_text(doc)
