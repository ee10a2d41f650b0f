"""The ``tracecliff`` command group and its entry point. Exit codes: 0 ok, 1 findings / gate
failed / hang found, 2 usage, input or configuration error. Errors are one line on stderr,
never a traceback."""

from __future__ import annotations

import os
import sys
import traceback

import click

from analyzer import __version__
from analyzer.base.errors import TracecliffError

EXIT_OK, EXIT_FINDINGS, EXIT_INPUT = 0, 1, 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracecliff")
def cli() -> None:
    """Explain distributed-training scaling cliffs from PyTorch profiler traces."""


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


def _register() -> None:
    from analyzer.cli.annotate import annotate_command
    from analyzer.cli.diagnose import diagnose_command
    from analyzer.cli.diff import diff_command
    from analyzer.cli.gate import gate_command
    from analyzer.cli.hang import hang_command
    from analyzer.cli.rules import explain_command, rules_command
    from analyzer.cli.schema import schema_command
    from analyzer.cli.whatif import whatif_command
    for command in (diagnose_command, rules_command, explain_command, gate_command, diff_command,
                    annotate_command, whatif_command, hang_command, schema_command):
        cli.add_command(command)


_register()
