"""The diagnose command's outputs: deterministic bytes, 100-column text, --steps, -o files."""

import json
from pathlib import Path

import click
import pytest

from analyzer.cli.main import main
from builders import two_step_ddp


def run(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def test_json_is_deterministic_and_sorted(tmp_path, capsys):
    path = two_step_ddp().write(tmp_path / "rank-0.json")
    _, first, _ = run(capsys, "diagnose", str(path), "--format", "json")
    _, second, _ = run(capsys, "diagnose", str(path), "--format", "json")
    assert first == second
    doc = json.loads(first)
    assert list(doc) == sorted(doc)
    for key in ("schema_version", "tool", "inputs", "ranks", "collectives", "findings", "warnings"):
        assert key in doc
    rank = doc["ranks"][0]
    for key in ("rank", "host", "world_size", "span_us", "busy_us", "compute_us", "comm_us", "overlap_us",
                "exposed_comm_us", "idle_us", "overlap_pct", "steps", "phases"):
        assert key in rank
    assert doc["tool"]["name"] == "tracecliff"


def test_text_fits_100_columns(tmp_path, capsys):
    paths = [str(two_step_ddp(rank=r).write(tmp_path / f"rank-{r}.json")) for r in (0, 1)]
    code, out, _ = run(capsys, "diagnose", *paths)
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "Per rank" in out and "Top" in out and "allreduce" in out


def test_steps_option_selects_profiler_steps(tmp_path, capsys):
    path = two_step_ddp().write(tmp_path / "rank-0.json")
    _, out, _ = run(capsys, "diagnose", str(path), "--format", "json", "--steps", "2")
    doc = json.loads(out)
    assert [s["step"] for s in doc["ranks"][0]["steps"]] == [2]
    assert doc["ranks"][0]["compute_us"] == 75.0
    assert {c["step"] for c in doc["collectives"]} == {2}
    code, _, err = run(capsys, "diagnose", str(path), "--steps", "x-y")
    assert code == 2 and "step numbers" in err


def test_output_file_written_atomically(tmp_path, capsys):
    path = two_step_ddp().write(tmp_path / "rank-0.json")
    target = tmp_path / "out" / "result.json"
    target.parent.mkdir()
    code, out, _ = run(capsys, "diagnose", str(path), "--format", "json", "-o", str(target))
    assert code == 0 and out == ""
    assert json.loads(target.read_text())["schema_version"] == 1
    assert [p.name for p in target.parent.iterdir()] == ["result.json"]  # no temp file left behind


def imported_by(argv, names):
    """Which of ``names`` a fresh interpreter has imported after running ``tracecliff ARGV``."""
    import subprocess
    import sys
    code = ("import sys; from analyzer.cli.main import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            f"print([m for m in {names!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_commands_load_lazily_and_help_lists_them_all():
    """`tracecliff diagnose` imports no other command's module (a command that reads no trace,
    not the analysis); `--help` lists every command with the short help the command itself
    gives, still without importing it."""
    from analyzer.cli.main import COMMANDS, LazyGroup, cli
    needed = {"analyzer.cli.diagnose", "analyzer.cli.rules"}  # diagnose's --fail-on exit code is in rules
    others = sorted({target.split(":")[0] for target in COMMANDS.values()} - needed)
    assert imported_by(["diagnose", "--help"], others + ["analyzer.compare.gate", "analyzer.hang"]) == "[]"
    assert imported_by(["hang", "--help"], ["analyzer.api", "numpy"]) == "[]"

    lazy = LazyGroup(name="t", lazy_commands=COMMANDS)  # nothing imported yet: docstrings read
    eager = click.Group(name="t", commands=[cli.get_command(click.Context(cli), name) for name in COMMANDS])
    listing = lazy.get_help(click.Context(lazy))
    assert listing == eager.get_help(click.Context(eager)) and not lazy.commands
    assert all(f"\n  {name} " in listing for name in COMMANDS) and len(COMMANDS) >= 9


def test_a_text_run_imports_only_what_it_uses():
    """`diagnose --format text --no-cache` of a job to stdout (issue 42, a run's fixed cost)
    imports neither the HTML stack (jinja2, the templates, the step timeline it alone draws),
    nor the cache's hashing (hashlib, hmac), nor tempfile (a file written in place), nor the
    optional pandas, torch and HTA; it does import the rules it runs."""
    from conftest import SAMPLES
    job = str(SAMPLES / "cpu_gloo" / "ddp")
    lazy = ["jinja2", "analyzer.reports.html", "analyzer.reports.templating", "analyzer.job.step_timeline",
            "hashlib", "hmac", "tempfile", "pandas", "torch", "hta"]
    assert imported_by(["diagnose", job, "--format", "text", "--no-cache", "--workers", "1"],
                       ["analyzer.rules.engine", *lazy]) == "['analyzer.rules.engine']"


def test_console_exits_fast_with_full_output_exit_code_and_atexit(tmp_path, capsys):
    """``python -m analyzer`` ends without freeing the result (os._exit): the output written to
    a pipe is whole (the same bytes as main() prints), the exit code is main()'s, and atexit
    handlers still run."""
    import subprocess
    import sys
    path = two_step_ddp().write(tmp_path / "rank-0.json")
    code, expected, _ = run(capsys, "diagnose", str(path), "--format", "json", "--no-cache")
    assert sys.modules["analyzer.cli.main"]._KEPT is None  # main() in a process of its caller: no result held to the end
    script = ("import atexit, sys\nfrom analyzer.cli.main import console\n"
              "atexit.register(lambda: sys.stderr.write('atexit ran'))\n"
              f"sys.argv = ['tracecliff', 'diagnose', {str(path)!r}, '--format', 'json', '--no-cache']\nconsole()\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (code, expected) and out.stderr.endswith("atexit ran")
    bad = subprocess.run([sys.executable, "-m", "analyzer", "diagnose", str(tmp_path / "missing.json")],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("tracecliff:") and bad.stderr.count("\n") == 1
