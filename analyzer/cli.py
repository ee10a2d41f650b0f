"""Thin Click commands over analyzer.api. Exit codes: 0 ok, 1 findings / gate failed,
2 usage, input or configuration error. Errors are one line on stderr, never a traceback."""

from __future__ import annotations

import os
import sys
import traceback

import click

from analyzer import __version__
from analyzer.api import DiagnoseOptions, diagnose
from analyzer.errors import TracecliffError
from analyzer.gc_pause import paused_gc
from analyzer.executors import scale_options
from analyzer.jobanalysis import job_options
from analyzer.output import write_atomic
from analyzer.progress import ProgressBar
from analyzer.reports.html_cli import html_document, html_options, render_html, wants_html
from analyzer.rules_cli import exit_code, explain_command, rules_command, rules_options

EXIT_OK, EXIT_FINDINGS, EXIT_INPUT = 0, 1, 2


def parse_steps(text: str | None) -> tuple[int, ...] | None:
    """'3', '3,5', '3-6' or '3-6,9' -> ProfilerStep numbers."""
    if not text:
        return None
    steps: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part[1:]:
                lo, hi = part.split("-", 1)
                steps.update(range(int(lo), int(hi) + 1))
            elif part:
                steps.add(int(part))
    except ValueError:
        raise click.BadParameter(f"expected step numbers like 3,5-7, got {text!r}") from None
    return tuple(sorted(steps))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracecliff")
def cli() -> None:
    """Explain distributed-training scaling cliffs from PyTorch profiler traces."""


@cli.command("diagnose")
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write to FILE (atomically) instead of stdout.")
@click.option("--steps", help="ProfilerStep numbers to analyze, e.g. 3,5-7 (default: all).")
@click.option("--gpus-per-node", type=click.IntRange(min=1), help="GPUs per node when traces lack host names.")
@click.option("--workers", type=click.IntRange(min=1), help="Parallel worker processes (default: CPU count).")
@scale_options
@job_options
@html_options
@rules_options
def diagnose_command(paths, fmt, output, steps, gpus_per_node, workers, scale, facts, html, rules) -> int:
    """Measure exposed communication per rank and step in the traces at PATHS
    (files, directories or globs)."""
    options = DiagnoseOptions(steps=parse_steps(steps), gpus_per_node=gpus_per_node, workers=workers, **scale, **facts)
    result = diagnose(list(paths), options, progress=ProgressBar("reading traces"), config=rules["config"])
    with paused_gc():
        doc = result.to_dict()
        inputs = [i["path"] for i in doc["inputs"]]
        html_text = (render_html(html_document(doc, result, html, options.rank_options()), html)
                     if wants_html(fmt, html) else None)
        text = html_text if fmt == "html" else _renderer(fmt).render(doc)
    _emit(text, output, inputs)
    if html.get("file"):
        write_atomic(html["file"], html_text, inputs)
    return exit_code(result.findings, rules["fail_on"])


def _renderer(fmt: str):
    if fmt == "json":
        from analyzer.reports.json_report import JsonRenderer
        return JsonRenderer()
    from analyzer.reports.text import TextRenderer
    return TextRenderer()


def _emit(text: str, output: str | None, inputs: list[str]) -> None:
    if output:
        write_atomic(output, text, inputs)
    else:
        click.echo(text, nl=False)


cli.add_command(rules_command)  # issue 4: diagnosis rules
cli.add_command(explain_command)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps every failure to one line and an exit code."""
    try:
        code = cli.main(args=argv, prog_name="tracecliff", standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.UsageError as exc:
        click.echo(f"tracecliff: {exc.format_message()}", err=True)
        code = EXIT_INPUT
    except click.Abort:
        click.echo("tracecliff: aborted", err=True)
        code = EXIT_INPUT
    except TracecliffError as exc:
        click.echo(f"tracecliff: {exc}", err=True)
        code = EXIT_INPUT
    except BrokenPipeError:
        code = EXIT_OK
    except Exception as exc:  # a bug: still one line, with a way to see more
        if os.environ.get("TRACECLIFF_DEBUG"):
            traceback.print_exc()
        click.echo(f"tracecliff: internal error: {type(exc).__name__}: {exc} "
                   "(set TRACECLIFF_DEBUG=1 for the traceback)", err=True)
        code = EXIT_INPUT
    sys.exit(code if isinstance(code, int) else EXIT_OK)


from analyzer.annotate import annotate_command  # noqa: E402  (issue 6: annotated traces)
from analyzer.diff import diff_command  # noqa: E402  (issue 6: run diff)
from analyzer.gate import gate_command  # noqa: E402  (issue 6: CI gate)

cli.add_command(gate_command)
cli.add_command(diff_command)
cli.add_command(annotate_command)

from analyzer.whatif import whatif_command  # noqa: E402  (issue 3: scaling what-if)

cli.add_command(whatif_command)

from analyzer.cli_hang import hang_command  # noqa: E402  (issue 16: hang triage from Flight Recorder dumps)

cli.add_command(hang_command)
