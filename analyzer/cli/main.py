"""The ``tracecliff`` command group and its entry point. Exit codes: 0 ok, 1 findings / gate
failed / hang found, 2 usage, input or configuration error. Errors are one line on stderr,
never a traceback."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from analyzer import __version__
from analyzer.base.errors import TracecliffError
from analyzer.base.gc_pause import paused_gc
from analyzer.base.sanitize import one_line

EXIT_OK, EXIT_FINDINGS, EXIT_INPUT = 0, 1, 2


class LazyGroup(click.Group):
    """A group that imports a command's module only when that command runs: ``diagnose`` need
    not import what ``whatif``, ``gate``, ``diff`` or ``hang`` are made of. The command list of
    ``--help`` reads each command's docstring from its source instead of importing it."""

    def __init__(self, *args: Any, lazy_commands: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands  # name -> "module:function"

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy_commands})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in self.lazy_commands:
            module, function = self.lazy_commands[name].split(":")
            # A command's module imports the analysis (~50,000 objects, all kept to the end):
            # with the collector on, its passes over them are ~10 ms of every run's imports.
            with paused_gc(long_lived=True):
                imported = importlib.import_module(module)
            self.add_command(getattr(imported, function), name)
        return self.commands.get(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        listed = [self.commands.get(name) or click.Command(name, help=_docstring(self.lazy_commands[name]))
                  for name in self.list_commands(ctx)]
        click.Group.format_commands(click.Group(commands=listed), ctx, formatter)


def _docstring(target: str) -> str | None:
    """The docstring of ``module:function``, read from the module's source without running it
    (its imports are the analysis stack); imported when there is no source to read."""
    import ast  # only for --help

    module, function = target.split(":")
    spec = importlib.util.find_spec(module)
    if spec is None or not str(spec.origin).endswith(".py"):
        return getattr(importlib.import_module(module), function).__doc__
    tree = ast.parse(Path(str(spec.origin)).read_text(encoding="utf-8"))
    return next((ast.get_docstring(node, clean=False) for node in tree.body
                 if isinstance(node, ast.FunctionDef) and node.name == function), None)


COMMANDS = {  # name -> "module:function" of its Click command (a command: add it here)
    "annotate": "analyzer.cli.annotate:annotate_command",
    "diagnose": "analyzer.cli.diagnose:diagnose_command",
    "diff": "analyzer.cli.diff:diff_command",
    "explain": "analyzer.cli.rules:explain_command",
    "gate": "analyzer.cli.gate:gate_command",
    "hang": "analyzer.cli.hang:hang_command",
    "rules": "analyzer.cli.rules:rules_command",
    "schema": "analyzer.cli.schema:schema_command",
    "whatif": "analyzer.cli.whatif:whatif_command",
}


@click.group(cls=LazyGroup, lazy_commands=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
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
        click.echo(f"tracecliff: {one_line(exc.format_message())}", err=True)
        code = EXIT_INPUT
    except click.Abort:
        click.echo("tracecliff: aborted", err=True)
        code = EXIT_INPUT
    except TracecliffError as exc:
        click.echo(f"tracecliff: {one_line(str(exc))}", err=True)
        code = EXIT_INPUT
    except BrokenPipeError:
        code = EXIT_OK
    except Exception as exc:  # a bug: still one line, with a way to see more
        if os.environ.get("TRACECLIFF_DEBUG"):
            traceback.print_exc()
        click.echo(f"tracecliff: internal error: {type(exc).__name__}: {one_line(str(exc))} "
                   "(set TRACECLIFF_DEBUG=1 for the traceback)", err=True)
        code = EXIT_INPUT
    sys.exit(code if isinstance(code, int) else EXIT_OK)


# What the commands hand to keep_until_exit(); a list only in a console() run, which ends with
# os._exit, so that it is never freed object by object.
_KEPT: list[Any] | None = None


def keep_until_exit(value: Any) -> None:
    """Hold ``value`` (a command's result) to the end of a :func:`console` run, which ends
    without freeing it: a 64-rank result is ~275,000 row dicts, ~0.15 s to free when the command
    returns. In-process callers of :func:`main` hold nothing."""
    if _KEPT is not None:
        _KEPT.append(value)


def console() -> None:
    """The ``tracecliff`` command and ``python -m analyzer``: :func:`main`, then the process ends
    without freeing the run's objects one by one (the result a command hands to
    :func:`keep_until_exit`, and the interpreter's own teardown). The output is flushed and the
    atexit handlers run first; while another thread still runs (a Dask client's) or a profiler
    or tracer is on, the usual exit instead.
    :func:`main` itself exits normally: it may run inside another program (tests, an API user)."""
    global _KEPT
    _KEPT = []
    try:
        main()
        code: Any = EXIT_OK
    except SystemExit as exc:
        code = exc.code
    import atexit
    import threading
    # A profiler or coverage tracer writes its data at the normal exit: keep it.
    traced = sys.getprofile() is not None or sys.gettrace() is not None
    if not isinstance(code, int) or threading.active_count() > 1 or traced:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach the reader
            pass
    atexit._run_exitfuncs()
    os._exit(code)
