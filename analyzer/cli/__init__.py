"""Every Click command and shared option; nothing outside this package imports Click."""

from analyzer.cli.main import cli, main

__all__ = ["cli", "main"]
