"""The layers show in the folders and data flows one way: no module imports a layer above its
own, there is no import cycle, and Click is imported only under analyzer/cli/. Imports are read
from the source (every ``import``, also inside functions), so a lazy import cannot hide a cycle."""

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


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    out = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
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


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(m, p, set(mods)) for m, p in mods.items()}


def test_every_module_is_in_a_layer():
    unknown = {m for m in modules() if layer_of(m) not in LAYERS and m != "analyzer"}
    assert not unknown, f"modules outside the known layers: {sorted(unknown)}"


def test_no_layer_imports_one_above_it():
    bad = []
    for module, deps in graph().items():
        if module == "analyzer":
            continue
        own = LAYERS.index(layer_of(module))
        bad += [f"{module} -> {d}" for d in deps if layer_of(d) in LAYERS and LAYERS.index(layer_of(d)) > own]
    assert not bad, "imports against the data flow:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    g = graph()
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
