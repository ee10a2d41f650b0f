"""The layers show in the folders and data flows one way: no module imports a layer above its
own, there is no import cycle (``if TYPE_CHECKING:`` imports included: a circle of types is a
circle the next reader has to untangle), no class name is defined in two modules, the views
import no analysis, the rules import no facts from the what-if models, and Click is imported
only under analyzer/cli/. Imports are read from the source (every ``import``, also inside
functions), so a lazy import cannot hide a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Bottom to top. A module may import its own layer and the ones before it.
LAYERS = ["data", "base", "model", "synth", "capture", "ingest", "rank", "run", "job", "whatif", "rules",
          "compare", "export", "hang", "reports", "api", "cli", "__main__"]
ROOTS = {"analyzer": REPO / "analyzer", "analyzer.rules": REPO / "rules", "analyzer.reports": REPO / "reports"}


def modules() -> dict[str, Path]:
    found = {}
    for package, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _runtime_nodes(tree: ast.AST):
    """Every node but those under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def imports_of(module: str, path: Path, known: set[str], typing_too: bool = False) -> set[str]:
    """The package modules ``module`` imports; ``typing_too``: with those imported for
    annotations only (under ``if TYPE_CHECKING:``)."""
    out = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in (ast.walk(tree) if typing_too else _runtime_nodes(tree)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level if not path.name == "__init__.py" else len(module.split(".")) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # ``from pkg import mod`` depends on the module; ``from mod import name`` on mod
            names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != "analyzer":
                out.add(name)
    return out - {module}


def graph(typing_too: bool = False) -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(m, p, set(mods), typing_too) for m, p in mods.items()}


def test_every_module_is_in_a_layer():
    unknown = {m for m in modules() if layer_of(m) not in LAYERS and m != "analyzer"}
    assert not unknown, f"modules outside the known layers: {sorted(unknown)}"


def test_no_layer_imports_one_above_it():
    bad = []
    for module, deps in graph(typing_too=True).items():
        if module == "analyzer":
            continue
        own = LAYERS.index(layer_of(module))
        bad += [f"{module} -> {d}" for d in deps if layer_of(d) in LAYERS and LAYERS.index(layer_of(d)) > own]
    assert not bad, "imports against the data flow:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    g = graph(typing_too=True)
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(g.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep] if dep in stack else [node, dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


def classes_by_name() -> dict[str, list[str]]:
    """Every class name defined at a module's top level (also under an ``if``/``try``), with
    the modules that define it."""
    found: dict[str, list[str]] = {}
    for module, path in sorted(modules().items()):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        pending = list(tree.body)
        while pending:
            node = pending.pop()
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(module)
            elif isinstance(node, (ast.If, ast.Try)):
                pending += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
    return found


# Left for now, each with why: a ratchet (an entry no longer defined twice fails too).
DEFINED_TWICE_FOR_NOW: dict[str, set[str]] = {}


def test_no_class_name_defined_in_two_modules():
    """A name means one thing: ``Bucket`` is the job's bucket, not also the schema's document
    or the generator's layout (those are ``BucketDoc``, ``LayoutBucket``)."""
    found = classes_by_name()
    twice = {name: sorted(set(where)) for name, where in found.items()
             if len(set(where)) > 1 and set(where) != DEFINED_TWICE_FOR_NOW.get(name)}
    stale = sorted(name for name, where in DEFINED_TWICE_FOR_NOW.items() if set(found.get(name, ())) != where)
    assert not twice, f"class names defined in more than one module: {twice}"
    assert not stale, f"no longer defined twice as DEFINED_TWICE_FOR_NOW says (remove them): {stale}"


# What a view may import: the base helpers, the other views, and the types it renders (the
# Result and its model, the saved document's schema, the declared label and unit of every
# evidence field: the evidence's type, which the renderer reads rather than guess from a key).
VIEW_MAY_IMPORT = ("analyzer.base", "analyzer.reports", "analyzer.job.result", "analyzer.job.model",
                   "analyzer.job.schema", "analyzer.rules.evidence_fields",
                   # each rule's evidence type's declarations (types only; the rules register theirs)
                   "analyzer.rules.evidence_types",
                   # the gate's report: the checks and their thresholds as data types, which
                   # analyzer.compare.gate fills and reports.gate_text renders (no analysis in it)
                   "analyzer.compare.gate_report",
                   # the words of the hang report (an op, a group, a call, a time): the verdict's
                   # sentences say them too, so they live below the views; labels only
                   "analyzer.hang.words")
# What the views still import from the analyses, each with why. A ratchet: an import not
# listed here fails, and an entry nothing uses any more fails too, so the list only shrinks.
# Empty since issue 40: the views import only what VIEW_MAY_IMPORT names.
VIEW_IMPORTS_LEFT: dict[str, set[str]] = {}


def test_views_import_no_analysis():
    g = graph(typing_too=True)
    analysis = {module: ["not a module any more"] for module in VIEW_IMPORTS_LEFT if module not in g}
    for module, deps in g.items():
        if layer_of(module) != "reports":
            continue
        other = {d for d in deps if not any(d == a or d.startswith(a + ".") for a in VIEW_MAY_IMPORT)
                 or d in VIEW_IMPORTS_LEFT.get(module, ())}
        if other != VIEW_IMPORTS_LEFT.get(module, set()):
            analysis[module] = sorted(other ^ VIEW_IMPORTS_LEFT.get(module, set()))
    assert not analysis, ("views importing analysis modules not listed in VIEW_IMPORTS_LEFT (or listed "
                          f"and no longer imported: remove them from the list): {analysis}")


# The rules import nothing from ``analyzer.whatif``, typing imports included: a fact a rule reads
# (the measured DDP and FSDP steps, the typical step, the waiting by rank, the links) lives in
# ``analyzer.job``, and so do the prediction documents (``job.prediction_doc``); what a fix is
# worth by the what-if projection or the replay comes from the gain engine the caller hands to
# ``run_rules`` (``ctx.gains``: the ``job.gains.GainEngine`` protocol, implemented by
# ``whatif.gains``, handed in by ``analyzer.api``).
def test_rules_import_nothing_from_whatif():
    bad = sorted(f"{module} -> {d}" for module, deps in graph(typing_too=True).items() if layer_of(module) == "rules"
                 for d in deps if layer_of(d) == "whatif")
    assert not bad, ("rules import analyzer.whatif (facts and prediction documents belong in analyzer.job; "
                     "gains come from ctx.gains):\n" + "\n".join(bad))


def test_click_only_under_cli():
    users = sorted(m for m, p in modules().items()
                   if layer_of(m) != "cli" and _imports_click(p))
    assert not users, f"click imported outside analyzer/cli/: {users}"


def _imports_click(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "click" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "click":
            return True
    return False


def test_the_checks_catch_a_planted_violation(tmp_path, monkeypatch):
    """The checker itself: an upward import, a cycle and a click import are all reported."""
    fake = tmp_path / "analyzer"
    for sub in ("base", "job"):
        (fake / sub).mkdir(parents=True)
        (fake / sub / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "base" / "a.py").write_text("from analyzer.job.b import x\nimport click\n")
    (fake / "job" / "b.py").write_text("from analyzer.base.a import y\n")
    monkeypatch.setitem(ROOTS, "analyzer", fake)
    monkeypatch.setitem(ROOTS, "analyzer.rules", tmp_path / "none")
    monkeypatch.setitem(ROOTS, "analyzer.reports", tmp_path / "none")
    g = graph()
    assert g["analyzer.base.a"] == {"analyzer.job.b"} and g["analyzer.job.b"] == {"analyzer.base.a"}
    for check in (test_no_layer_imports_one_above_it, test_no_import_cycles, test_click_only_under_cli):
        try:
            check()
        except AssertionError:
            continue
        raise AssertionError(f"{check.__name__} missed the planted violation")


def test_the_new_checks_catch_planted_violations(tmp_path, monkeypatch):
    """A cycle made only of TYPE_CHECKING imports, a class defined twice, a view importing an
    analysis and a rule importing a whatif module (a typing import of the gain engine's, once
    allowed) are each reported."""
    fake, rules, views = tmp_path / "analyzer", tmp_path / "rules", tmp_path / "reports"
    for sub in ("job", "whatif"):
        (fake / sub).mkdir(parents=True)
        (fake / sub / "__init__.py").write_text("")
    for folder in (rules, views):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from analyzer.job.{} import X\n"
    (fake / "job" / "a.py").write_text(typing_only.format("b") + "class Bucket:\n    pass\n")
    (fake / "job" / "b.py").write_text(typing_only.format("a") + "class Bucket:\n    pass\n")
    (fake / "whatif" / "prediction.py").write_text("class WhatIf:\n    pass\n")
    (rules / "r.py").write_text(typing_only.replace("job.{}", "whatif.prediction").replace(" X", " WhatIf"))
    (views / "v.py").write_text("from analyzer.job.a import Bucket\n")
    monkeypatch.setitem(ROOTS, "analyzer", fake)
    monkeypatch.setitem(ROOTS, "analyzer.rules", rules)
    monkeypatch.setitem(ROOTS, "analyzer.reports", views)
    assert graph()["analyzer.job.a"] == set() and graph(typing_too=True)["analyzer.job.a"] == {"analyzer.job.b"}
    for check in (test_no_import_cycles, test_no_class_name_defined_in_two_modules, test_views_import_no_analysis,
                  test_rules_import_nothing_from_whatif):
        try:
            check()
        except AssertionError:
            continue
        raise AssertionError(f"{check.__name__} missed the planted violation")


# ---------------------------------------------------------------- docs/architecture.md
DOC = REPO / "docs" / "architecture.md"
BEGIN, END = "<!-- modules: begin (generated: python tests/test_architecture.py) -->", "<!-- modules: end -->"


def _short(module: str) -> str:
    return module.removeprefix("analyzer.") if module != "analyzer" else "analyzer"


def _summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line (``|`` escaped for the table)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    text = " ".join(doc.split()) or ("(the package)" if path.name == "__init__.py" else "(no docstring)")
    cut = next((i + 1 for i, c in enumerate(text) if c == "." and (i + 1 == len(text) or text[i + 1] == " ")), len(text))
    text = text[:cut]
    # cut at a space: a name cut mid-way (``analyzer.whatif.predi``) reads as a module that is not there
    return (text if len(text) <= 160 else text[:157].rsplit(" ", 1)[0].rstrip(",;:") + " …").replace("|", "\\|")


def module_table() -> str:
    """Every module of the package by layer, what it holds and the modules it imports (every
    import, those for annotations only and inside functions included), from the code."""
    mods, g = modules(), graph(typing_too=True)
    order = {layer: i for i, layer in enumerate(LAYERS)}
    lines = []
    for layer in sorted({layer_of(m) or "" for m in mods}, key=lambda x: order.get(x, -1)):
        members = sorted(m for m in mods if (layer_of(m) or "") == layer)
        lines += ["", f"### {layer or 'analyzer'}", "", "| module | holds | imports |", "|---|---|---|"]
        for m in members:
            deps = ", ".join(f"`{_short(d)}`" for d in sorted(g[m])) or "–"
            lines.append(f"| `{_short(m)}` | {_summary(mods[m])} | {deps} |")
    return "\n".join([BEGIN, *lines, "", END])


def _doc_block() -> str:
    text = DOC.read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    assert start >= 0 and end > start, f"{DOC} lacks its generated module list (markers {BEGIN!r} … {END!r})"
    return text[start:end + len(END)]


def test_the_architecture_doc_lists_every_module_and_import():
    """docs/architecture.md's module list is the code's: every module and every import arrow.
    After adding a module or an import: ``python tests/test_architecture.py`` rewrites it."""
    block = _doc_block()
    missing = sorted(_short(m) for m in modules() if f"| `{_short(m)}` |" not in block)
    assert not missing, f"modules missing from docs/architecture.md: {missing} (run python tests/test_architecture.py)"
    assert block == module_table(), ("docs/architecture.md's module list differs from the code's imports: "
                                     "run python tests/test_architecture.py to rewrite it")


if __name__ == "__main__":
    text = DOC.read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    new = module_table()
    text = text[:start] + new + text[end + len(END):] if start >= 0 and end > start else text.rstrip("\n") + "\n\n" + new + "\n"
    tmp = DOC.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(DOC)  # atomically: a reader never sees half a doc
    print(f"wrote {DOC}")
