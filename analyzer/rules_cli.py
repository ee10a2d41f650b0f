"""Command-line pieces of the rules: ``diagnose --config/--fail-on``, ``tracecliff rules`` and
``tracecliff explain NAME``."""

from __future__ import annotations

import functools
from typing import Any

import click

from analyzer.config import config_source, load_config, rule_settings

EXIT_OK, EXIT_FINDINGS = 0, 1
FAIL_LEVELS = {"error": ("error",), "warning": ("error", "warning")}


def rules_options(command):
    """Add ``--config FILE`` and ``--fail-on LEVEL``; the command receives them as ``rules``."""
    @click.option("--config", "config_path", type=click.Path(dir_okay=False),
                  help="TOML file with [tool.tracecliff] tables (default: ./pyproject.toml).")
    @click.option("--fail-on", type=click.Choice(["error", "warning"]),
                  help="Exit 1 when a finding of this severity (or worse) exists.")
    @functools.wraps(command)
    def wrapper(*args, config_path=None, fail_on=None, **kwargs):
        config = load_config(config_path)
        rule_settings(config, _rules(), config_source(config_path))  # bad config: fail before reading
        kwargs["rules"] = {"config": config, "fail_on": fail_on}
        return command(*args, **kwargs)
    return wrapper


def exit_code(findings: list[dict[str, Any]], fail_on: str | None) -> int:
    """1 when ``--fail-on`` was given and a finding at that level or worse exists, else 0."""
    if fail_on and any(f.get("severity") in FAIL_LEVELS[fail_on] for f in findings):
        return EXIT_FINDINGS
    return EXIT_OK


def _rules():
    from analyzer.rules.engine import all_rules
    return all_rules()


@click.command("rules")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def rules_command(fmt: str) -> None:
    """List the diagnosis rules: name, code, default severity, what each checks."""
    rules = sorted(_rules().values(), key=lambda r: r.code)
    if fmt == "json":
        from analyzer.result_json import dumps
        click.echo(dumps({"rules": [_rule_dict(r) for r in rules]}), nl=False)
        return
    width = max(len(r.name) for r in rules)
    click.echo(f"{'code':<6} {'name':<{width}}  {'severity':<8} title")
    for r in rules:
        click.echo(f"{r.code:<6} {r.name:<{width}}  {r.severity:<8} {r.title}")
    click.echo("\n`tracecliff explain NAME` prints a rule's documentation and thresholds.")


@click.command("explain")
@click.argument("name")
def explain_command(name: str) -> None:
    """Print a rule's documentation, thresholds and configuration (NAME or code, e.g. TC101)."""
    rules = _rules()
    rule = rules.get(name) or next((r for r in rules.values() if r.code.lower() == name.lower()), None)
    if rule is None:
        raise click.BadParameter(f"unknown rule {name!r}; known: {', '.join(sorted(rules))}",
                                 param_hint="NAME")
    click.echo(explain_text(rule))


def explain_text(rule) -> str:
    lines = [f"{rule.name} ({rule.code}, default severity {rule.severity})",
             f"Checks: {rule.title}", f"Fails as: {rule.failure_title}", "", rule.docs(), ""]
    if rule.thresholds:
        lines.append("Thresholds (default):")
        for key, spec in rule.thresholds.items():
            lines.append(f"  {key} = {spec.default:g}  {spec.help}")
        lines.append("")
    lines.append("Configure in pyproject.toml (or a file given with --config):")
    lines.append(f"  [tool.tracecliff.rules.{rule.name}]")
    lines.append("  enabled = true")
    lines.append(f'  severity = "{rule.severity}"')
    for key, spec in rule.thresholds.items():
        lines.append(f"  {key} = {spec.default:g}")
    return "\n".join(lines)


def _rule_dict(rule) -> dict[str, Any]:
    return {"name": rule.name, "code": rule.code, "severity": rule.severity, "title": rule.title,
            "failure_title": rule.failure_title, "needs": list(rule.needs),
            "thresholds": {k: {"default": v.default, "help": v.help, "min": v.minimum,
                               "max": None if v.maximum == float("inf") else v.maximum}
                           for k, v in rule.thresholds.items()},
            "references": list(rule.references), "docs": rule.doc_sections()}

