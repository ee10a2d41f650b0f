""".ci/run lints and type-checks first (ruff, mypy: configured in pyproject.toml), then runs
the README's test command verbatim."""

import re

from conftest import REPO


def test_ci_runs_lint_then_the_readme_test_command():
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text("utf-8"), re.S)
    command = [line for line in blocks[1].splitlines() if line and not line.startswith("#")][0]
    lines = [line for line in (REPO / ".ci" / "run").read_text("utf-8").splitlines()
             if line and not line.startswith("#")]
    # the README creates its venv in the same line; .ci/run made .venv-ci above
    assert command.endswith(" && " + lines[-1]) and lines[-1].startswith("pip install")
    assert lines.index("ruff check .") < lines.index("mypy") < len(lines) - 1
    # the speed check (issue 42) runs after the tests, from the same command
    assert lines[-1].endswith(" tests && python bench/speed_check.py")
    assert (REPO / "bench" / "speed_check.py").exists() and (REPO / "bench" / "speed_figures.json").exists()
