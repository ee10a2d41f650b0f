"""Every `§N` the tool cites (rule docs, findings' references, templates, README) resolves to a
section of docs/models.md, which ships in the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CITE = re.compile(r"§\s?(\d+)")


def sections() -> set[str]:
    text = (REPO / "docs" / "models.md").read_text(encoding="utf-8")
    return set(re.findall(r"^## (\d+)\.", text, flags=re.M))


def citations() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for folder in ("analyzer", "rules", "reports", "docs"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".j2", ".md", ".json") and path.name != "models.md":
                for number in CITE.findall(path.read_text(encoding="utf-8")):
                    found.setdefault(number, set()).add(str(path.relative_to(REPO)))
    for number in CITE.findall((REPO / "README.md").read_text(encoding="utf-8")):
        found.setdefault(number, set()).add("README.md")
    return found


def test_models_md_has_its_sections():
    assert sections() == {"1", "2", "3", "4", "5", "6", "7", "8", "9"}


def test_every_cited_section_exists():
    cited = citations()
    assert cited, "no § citations found: the scan is broken"
    missing = {n: sorted(where) for n, where in cited.items() if n not in sections()}
    assert not missing, f"cited sections missing from docs/models.md: {missing}"


def test_rule_references_point_into_the_repository():
    from analyzer.rules.engine import all_rules
    for rule in all_rules().values():
        for ref in rule.references:
            if "models.md" in ref:
                assert ref.startswith("docs/models.md"), (rule.name, ref)
                assert all(n in sections() for n in CITE.findall(ref)), (rule.name, ref)
