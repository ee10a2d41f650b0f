"""``tracecliff rules`` and ``tracecliff explain NAME``, and the ``--fail-on`` exit code."""

from __future__ import annotations

from typing import Any

import click

from analyzer.reports.wrap import WIDTH, wrap


EXIT_OK, EXIT_FINDINGS = 0, 1
FAIL_LEVELS = {"error": ("error",), "warning": ("error", "warning")}


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
    """List the diagnosis rules: code, name, default severity, what each detects."""
    rules = sorted(_rules().values(), key=lambda r: r.code)
    if fmt == "json":
        from analyzer.job.result import dumps
        click.echo(dumps({"rules": [_rule_dict(r) for r in rules]}), nl=False)
        return
    width = max(len(r.name) for r in rules)
    # what each detects, in the words a finding opens with (its title is the passing phrase,
    # "No rank holds the others back", which named nothing)
    click.echo(f"{'code':<6} {'name':<{width}}  {'severity':<8} detects")
    indent = " " * (6 + 1 + width + 2 + 8 + 1)
    for r in rules:
        lines = wrap(r.failure_title, WIDTH - len(indent)) or [""]
        click.echo(f"{r.code:<6} {r.name:<{width}}  {r.severity:<8} {lines[0]}")
        for line in lines[1:]:  # fits 100 columns, the rest of the phrase under it
            click.echo(indent + line)
    click.echo("\n`tracecliff explain NAME` prints a rule's documentation and thresholds.")


@click.command("explain")
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def explain_command(name: str, fmt: str) -> None:
    """Print a rule's documentation, thresholds and configuration (NAME or code, e.g. TC101);
    `explain communication` lists the kernels that count as communication."""
    if name.lower() == "communication":
        _explain_communication(fmt)
        return
    rules = _rules()
    rule = rules.get(name) or next((r for r in rules.values() if r.code.lower() == name.lower()), None)
    if rule is None:
        raise click.BadParameter(f"unknown rule {name!r}; known: {', '.join(sorted(rules))}, communication",
                                 param_hint="NAME")
    if fmt == "json":
        from analyzer.job.result import dumps
        click.echo(dumps(_rule_dict(rule)), nl=False)
        return
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



def _explain_communication(fmt: str) -> None:
    from analyzer.ingest.catalog import catalog
    entries = [{"id": k.id, "library": k.library, "collective": k.collective, "generic": k.generic,
                "pattern": k.pattern, "example": k.example, "note": k.note} for k in catalog()]
    if fmt == "json":
        from analyzer.job.result import dumps
        click.echo(dumps({"communication_kernels": entries}), nl=False)
        return
    click.echo(communication_text(entries))


def communication_text(entries: list[dict[str, Any]]) -> str:
    lines = ["GPU kernels that count as communication (case-insensitive regexes, first match wins):", ""]
    for e in entries:
        kind = e["collective"] or ("from the linked CPU op (generic name)" if e["generic"]
                                   else "from the CPU op, else the name")
        lines += [f"{e['id']}  library {e['library']}, collective {kind}", f"  pattern  {e['pattern']}",
                  f"  e.g.     {e['example']}", f"  {e['note']}"]
    lines += ["", "Add your own: --comm-kernel REGEX (repeatable) or in pyproject.toml",
              "  [tool.tracecliff.communication]", '  kernels = ["my_alltoall_kernel"]',
              "Rows of kernels matched only by your patterns say library \"user\"."]
    return "\n".join(lines)
