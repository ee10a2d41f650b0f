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


def test_the_bench_scripts_run_on_the_code_as_it_is(tmp_path):
    """bench/ calls the build's stages one by one to time them: a change of their signatures (the
    rules' gain engine, issue 40) must not leave the issue-42 figures unmeasurable. Tiny sizes."""
    import subprocess
    import sys
    runs = [["bench/bench_reduce.py", "--ranks", "2", "--collectives", "40", "--output", str(tmp_path / "r.json")],
            ["bench/bench_targets.py", "--stages", "--rank-mb", "0.3", "--one-mb", "0.3", "--no-hta", "--no-reduce",
             "--repeat", "1", "--dir", str(tmp_path / "t")]]
    for args in runs:
        done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (args[0], done.stderr[-2000:])
        assert "CPU" in done.stdout or "reduce total" in done.stdout, done.stdout[-500:]
