"""``tracecliff hang PATH...``: triage a hung or timed-out job from Flight Recorder dumps.
Exit 0 no hang found, 1 a hang found, 2 usage or input error (one line, never a traceback)."""

from __future__ import annotations

import click

from analyzer.cli.options import COUNT, config_option, emit, output_option

EXIT_OK, EXIT_HANG = 0, 1


@click.command("hang")
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True)
@click.option("--world-size", type=COUNT,
              help="Ranks in the job, when the dumps do not say (every rank without a dump is then "
                   "not-reporting, the highest included).")
@click.option("--traces", "trace_paths", multiple=True, metavar="PATH",
              help="Kineto traces of the same job (files, directories or globs; repeatable): say whether the "
                   "culprit was already the late rank in the profiled steps. Default: the traces found "
                   "beside the dumps.")
@output_option
@config_option
def hang_command(paths, fmt, world_size, trace_paths, output, config, config_path) -> int:
    """Name the ranks a hung job waits on, and why, from its Flight Recorder dumps at PATHS
    (one per rank: files, directories or globs; JSON or pickle dumps; a rank with both is read
    from the pickle)."""
    # No [tool.tracecliff] table configures the triage; --config / ./pyproject.toml are checked
    # as every command checks them, so that a typo there fails here too, not silently.
    from analyzer.base.errors import InputError
    from analyzer.hang import find_inputs, triage
    found = find_inputs(list(paths))
    traces, warning = None, None
    if trace_paths or found.traces:
        from analyzer.api import hang_trace_link
        try:
            traces = hang_trace_link(list(trace_paths) or [str(p) for p in found.traces])
        except InputError as exc:
            if trace_paths:
                raise  # named on purpose: a bad one is an error
            warning = f"the Kineto traces beside the dumps could not be read ({exc}): no straggler history"
    report = triage(found, world_size=world_size, traces=traces)
    if warning:
        report.warnings.append(warning)
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
