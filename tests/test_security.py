"""Trace strings are untrusted: no code runs from input, outputs are atomic and never replace an
input, and every hostile name is escaped in the HTML and XML reports."""

from __future__ import annotations

import ast
import json
import os
import stat
from html.parser import HTMLParser
from pathlib import Path

import pytest

from analyzer.cli.main import main
from builders import AUTOGRAD, two_step_ddp
from conftest import REPO

SOURCE_DIRS = ("analyzer", "reports", "rules")
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle"}
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}
# Modules that may import pickle, with the reason; they may use nothing of it but a restricted
# Unpickler subclass (its find_class refuses every global) and its error class.
PICKLE_READERS = {"analyzer/hang/read.py": "Flight Recorder pickle dumps, through _PlainUnpickler"}
PICKLE_NAMES_ALLOWED = {"Unpickler", "UnpicklingError"}
# Modules that may import pickle to *write* plain data, and use nothing of it but pickle.dumps.
PICKLE_WRITERS = {"analyzer/synth/flight_recorder.py": "synthetic Flight Recorder dumps, as torch's pickle writer"}
# Modules that write files, each with the reason it may: everything else goes through
# analyzer.base.output.write_atomic.
WRITERS = {
    "analyzer/base/output.py": "write_atomic itself (temporary file + rename)",
    "analyzer/run/cache.py": "cache entries, temporary file + rename",
    "analyzer/capture.py": "profiler traces during training, temporary file + rename",
    "analyzer/cli/gate.py": "appends to the CI-provided $GITHUB_STEP_SUMMARY, as GitHub asks",
    "analyzer/synth/job.py": "the synthetic-trace generator's own output folder",
    "analyzer/synth/flight_recorder.py": "the synthetic Flight Recorder dump generator's own output folder",
}
PWN = "PWNED"
PAYLOADS = [f"<b id={PWN}1>x</b>", f'"><b id={PWN}2>', f"'><b id={PWN}3>", f"</script><b id={PWN}4>",
            f"</style><b id={PWN}5>", f"<!--<b id={PWN}6>-->", f"<svg onload=alert({PWN}7)>",
            f"javascript:alert({PWN}8)", f"&lt;b id={PWN}9&gt;", f"\u2028</title><b id={PWN}10>"]


def python_sources():
    for folder in SOURCE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_no_pickle_or_eval_of_input():
    problems = []
    for path, tree in python_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                problems += [f"{path}: import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES
                             and not (a.name == "pickle" and _relative(path) in {**PICKLE_READERS, **PICKLE_WRITERS})]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
                problems.append(f"{path}: from {node.module} import")
            elif isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if isinstance(func, ast.Name) and name in UNSAFE_CALLS:
                    problems.append(f"{path}:{node.lineno}: {name}()")
                if name == "load" and isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "yaml":
                    problems.append(f"{path}:{node.lineno}: yaml.load (use safe_load)")
                for kw in node.keywords:
                    if kw.arg in ("allow_pickle", "shell") and getattr(kw.value, "value", False) is True:
                        problems.append(f"{path}:{node.lineno}: {kw.arg}=True")
    assert problems == []


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_pickle_writers_only_dump():
    for name in PICKLE_WRITERS:
        tree = ast.parse((REPO / name).read_text(encoding="utf-8"))
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "pickle"}
        assert used == {"dumps"}, f"{name} uses pickle.{used - {'dumps'}}"


def test_pickle_readers_use_only_a_restricted_unpickler():
    for name in PICKLE_READERS:
        tree = ast.parse((REPO / name).read_text(encoding="utf-8"))
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "pickle"}
        assert used <= PICKLE_NAMES_ALLOWED, f"{name} uses pickle.{used - PICKLE_NAMES_ALLOWED}"
        unpicklers = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                      and any(getattr(b, "attr", "") == "Unpickler" for b in c.bases)]
        for cls in unpicklers:
            find_class = [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "find_class"]
            assert find_class and all(isinstance(s, ast.Raise) for s in find_class[0].body), \
                f"{name}: {cls.name}.find_class must refuse every global"


def test_files_are_written_only_through_known_writers():
    writers = set()
    for path, tree in python_sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            mode = next((a.value for a in node.args[1:2] if isinstance(a, ast.Constant)), None)
            mode = next((k.value.value for k in node.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)), mode)
            writes = name in ("write_text", "write_bytes", "mkstemp", "NamedTemporaryFile") or (
                name in ("open", "fdopen") and isinstance(mode, str) and any(c in mode for c in "wax+"))
            if writes:
                writers.add(path.relative_to(REPO).as_posix())
    assert writers <= set(WRITERS), writers - set(WRITERS)


def test_write_atomic_keeps_old_file_on_failure(tmp_path, monkeypatch):
    from analyzer.base import output
    target = tmp_path / "report.json"
    target.write_text("old")
    output.write_atomic(target, "new")
    assert target.read_text() == "new"

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(output.os, "replace", failing_replace)
    from analyzer.base.errors import InputError
    with pytest.raises(InputError, match="No space left"):
        output.write_atomic(target, "newer")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary left behind


def test_output_never_replaces_an_input(tmp_path, capsys):
    trace = two_step_ddp().write(tmp_path / "rank-0.json")
    original = trace.read_bytes()
    (tmp_path / "out").mkdir()
    alias = tmp_path / "out" / "alias.json"
    os.link(trace, alias)  # the same file under another name
    link = tmp_path / "out" / "link.json"
    link.symlink_to(trace)
    for target, args in ((trace, [str(trace)]), (alias, [str(trace)]), (link, [str(trace)]),
                         (trace, [str(tmp_path)])):  # input found by a directory scan
        for flag in ("-o", "--html"):
            with pytest.raises(SystemExit) as exit_info:
                main(["diagnose", "--no-cache", *args, flag, str(target)])
            err = capsys.readouterr().err
            assert exit_info.value.code == 2 and "refusing to overwrite" in err, (flag, target, err)
    assert trace.read_bytes() == original


def hostile_trace(tmp_path: Path, payload: str) -> Path:
    b = two_step_ddp(host=f"host{payload}")
    info = b.doc["distributedInfo"]
    info["pg_config"][0]["pg_desc"] = f"pg{payload}"
    info["pg_config"][0]["pg_name"] = f"name{payload}"
    b.doc["deviceProperties"][0]["name"] = f"gpu{payload}"
    for event in b.events:
        if event["cat"] == "kernel":
            event["name"] = event["name"].replace("<", payload, 1) if "<" in event["name"] else event["name"] + payload
        if event["name"] == "record_param_comms":
            event["args"]["Process Group Description"] = f"pg{payload}"
            event["args"]["Process Group Name"] = f"name{payload}"
            event["args"]["dtype"] = f"dt{payload}"
    b.cpu(f"FSDP::all_gather (layers.{payload})", 1095, 1, tid=AUTOGRAD)
    b.kernel("late" + payload, 5000, 1, launch_ts=4999)  # outside every step: its warning names the file
    directory = tmp_path / "d"
    directory.mkdir(exist_ok=True)
    name = "rank-0" + payload.replace("/", "_") + ".json"
    return b.write(directory / name)


class TagCollector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hostile = []

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if PWN in key or (key == "id" and value and PWN in value) or (key.startswith("on") and PWN in (value or "")):
                self.hostile.append((tag, key, value))
        if tag == "b":  # the payloads' tag: the report itself never uses <b>
            self.hostile.append((tag, attrs))


@pytest.mark.parametrize("payload", PAYLOADS)
def test_html_escapes_hostile_names_everywhere(tmp_path, capsys, payload):
    path = hostile_trace(tmp_path, payload)
    with pytest.raises(SystemExit) as exit_info:
        main(["diagnose", "--no-cache", "--format", "html", str(path)])
    page = capsys.readouterr().out
    assert exit_info.value.code == 0
    parser = TagCollector()
    parser.feed(page)
    assert parser.hostile == []
    assert payload not in page or payload.startswith("javascript:")  # shown, but only escaped
    assert f"javascript:alert({PWN}" not in page.split("<body", 1)[-1].split('href="')[-1][:40]
    # the page shows the hostile strings (escaped), it does not drop them
    import html as html_lib
    assert f"host{payload}" in html_lib.unescape(page) or f"host{payload}".replace("\u2028", "") in html_lib.unescape(page)


def test_text_and_json_keep_hostile_names_verbatim(tmp_path, capsys):
    path = hostile_trace(tmp_path, PAYLOADS[3])
    with pytest.raises(SystemExit):
        main(["diagnose", "--no-cache", "--format", "json", str(path)])
    doc = json.loads(capsys.readouterr().out)
    assert any(PAYLOADS[3] in (c["kernel"] or "") for c in doc["collectives"])
    assert doc["ranks"][0]["host"] == f"host{PAYLOADS[3]}"


def test_junit_is_well_formed_whatever_the_strings(tmp_path, capsys):
    import xml.etree.ElementTree as ET
    from analyzer.reports.junit import render_junit
    hostile = f"<x id={PWN}/>&amp;\"'\x00\x1b[31m\ufffe]]>"
    check = {"kind": "assertion", "name": hostile, "status": "fail", "level": "error",
             "message": hostile, "bound": hostile, "actual": 2.0}
    root = ET.fromstring(render_junit({"checks": [check, dict(check, status="warn")]}).encode())
    case = root.find("testsuite/testcase")
    assert case.get("name").startswith(f"<x id={PWN}/>&amp;\"'")  # the text survives, escaped
    assert not any(el.tag == "x" for el in root.iter())
    # end to end: the gate's file parses for a trace full of hostile names
    junit = tmp_path / "gate.xml"
    with pytest.raises(SystemExit):
        main(["gate", "--preset", "strict", str(hostile_trace(tmp_path, f"<x id={PWN}/>&amp;\"'\x1b")), "--junit", str(junit)])
    capsys.readouterr()
    ET.parse(junit)


def test_output_to_a_device_or_pipe_is_written_through(tmp_path):
    """`-o /dev/null` or a pipe: written into, never renamed over (as root, a rename would turn
    /dev/null into a plain file for the whole machine)."""
    import threading

    from analyzer.base.output import write_atomic
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, "through the pipe\n")
    reader.join(timeout=10)
    assert received == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    write_atomic(os.devnull, "discarded")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
