"""``tracecliff schema``: the JSON Schema of ``diagnose --format json`` (or, with --config, of the
``[tool.tracecliff]`` configuration), generated from the typed definitions."""

from __future__ import annotations

import click

from analyzer.cli.options import emit, output_option


@click.command("schema")
@click.option("--config", "of_config", is_flag=True,
              help="The schema of the [tool.tracecliff] configuration (rules, gate) instead.")
@click.option("--format", "fmt", type=click.Choice(["json"]), default="json", show_default=True)
@output_option
def schema_command(of_config: bool, fmt: str, output: str | None) -> None:
    """Print the JSON Schema (draft 2020-12) of the result, versioned by schema_version."""
    from analyzer.api import config_schema, result_schema
    from analyzer.job.result import dumps
    emit(dumps(config_schema() if of_config else result_schema()), output, [])
