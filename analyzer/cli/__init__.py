"""Every Click command and shared option; nothing outside this package imports Click."""

from analyzer.cli.main import cli, console, main

__all__ = ["cli", "console", "main"]
