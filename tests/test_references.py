"""Names a reader follows must exist: every ``analyzer.x.y`` a docstring, comment or document
names is a module or an attribute of one, and every source or document path it names
(``whatif/projection.py``, ``docs/scale.md``) is a file of the repository."""

from __future__ import annotations

import importlib
import re

import pytest

from conftest import REPO

DOTTED = re.compile(r"\banalyzer(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
LAYERS = "analyzer|rules|reports|docs|tests|bench|scripts|whatif|job|rank|ingest|model|compare|base|run|cli|hang|export|synth"
# a repository path (not an absolute one, such as a fake user frame's "/job/train.py")
PATH = re.compile(rf"(?<![/\w.])((?:{LAYERS})/[A-Za-z0-9_/.-]+\.(?:py|md|toml|json|j2|js|css))")
SOURCES = sorted([*REPO.glob("analyzer/**/*.py"), *REPO.glob("rules/*.py"), *REPO.glob("reports/**/*.py"),
                  *(p for p in REPO.glob("reports/templates/*") if p.is_file()), *REPO.glob("docs/*.md"), REPO / "README.md",
                  *REPO.glob("bench/*.py"), *REPO.glob("scripts/*.py")])


def resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def exists(path: str) -> bool:
    return any((base / path).exists() for base in (REPO, REPO / "analyzer", REPO / "tests"))


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_named_modules_and_files_exist(source):
    text = source.read_text(encoding="utf-8")
    missing = sorted({m.group(0).rstrip(".") for m in DOTTED.finditer(text) if not resolves(m.group(0).rstrip("."))}
                     | {m.group(1) for m in PATH.finditer(text) if not exists(m.group(1))})
    assert not missing, f"{source.relative_to(REPO)} names what does not exist: {missing}"
