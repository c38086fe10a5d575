"""The shape of the tree: data flows one way (no import cycles, imports inside functions
counted), the generic MIP knows nothing of einsummable, the library never imports the harness,
and no module grows past what one reader can hold."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("einsummable", "formulations", "experiments", "paper_figs")
HARNESS = ("experiments", "paper_figs")
MAX_LINES = 600
# The pipeline's stages, bottom first: a stage may import only stages below it (and itself).
STAGES = ("einsummable.core", "einsummable.frontend", "einsummable.topology",
          "einsummable.planning", "einsummable.optimizer", "einsummable.backend",
          "einsummable.selection")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        getattr(node.test, "id", None) == "TYPE_CHECKING"
        or getattr(node.test, "attr", None) == "TYPE_CHECKING")


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every internal module `name` imports, at any depth of its code. `from P import x`
    imports the module P.x where there is one, else P itself."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block)
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:  # never run: names a type for annotations only
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import a.b.c` of a package path: its nearest module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    known = _modules()
    g = nx.DiGraph()
    for name, path in known.items():
        g.add_node(name)
        for target in _imports(name, path, known):
            g.add_edge(name, target)
    return g


def test_the_walker_sees_imports_inside_functions(tmp_path):
    # the cycle test below is only as good as this: a function-level import is an edge
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n    return g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nfrom . import a\n"
                              "if TYPE_CHECKING:\n    from . import c\n")
    known = {"p": pkg / "__init__.py", "p.a": pkg / "a.py", "p.b": pkg / "b.py"}
    assert _imports("p.a", pkg / "a.py", known) == {"p.b"}
    assert _imports("p.b", pkg / "b.py", known) == {"p.a"}


def test_no_import_cycles(graph):
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, f"modules that import each other (directly or round a loop): {cycles}"


def test_stages_import_only_the_stages_below(graph):
    def stage(module: str) -> int | None:
        for i, s in enumerate(STAGES):
            if module == s or module.startswith(s + "."):
                return i
        return None
    upward = [(a, b) for a, b in graph.edges
              if stage(a) is not None and stage(b) is not None and stage(b) > stage(a)]
    assert not upward, f"a stage imports a later one: {upward}"


def test_the_generic_mip_knows_nothing_of_einsummable(graph):
    bad = [(a, b) for a, b in graph.edges
           if a.startswith("formulations") and not b.startswith("formulations")]
    assert not bad, bad


def test_the_library_never_imports_the_harness(graph):
    bad = [(a, b) for a, b in graph.edges
           if a.startswith("einsummable") and b.split(".")[0] in HARNESS]
    assert not bad, bad


def test_the_library_imports_nothing_by_name():
    # an import by string is an arrow no reader (and no test above) can see
    found = []
    for path in sorted((ROOT / "einsummable").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                fn = node.func
                called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                if called in ("import_module", "__import__"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


def test_no_module_is_longer_than_a_reader_can_hold():
    long = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0].startswith(".") or "build" in rel.parts:
            continue
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            long[str(rel)] = n
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_name_hides_a_module():
    # `es.optimize` once hid the module of the same name: a package's attribute that shares a
    # submodule's name must be that submodule
    import importlib
    import types
    hidden = []
    for pkg, path in _modules().items():
        if path.name != "__init__.py" or not pkg.startswith("einsummable"):
            continue
        mod = importlib.import_module(pkg)
        for sub in path.parent.iterdir():
            name = sub.stem if sub.suffix == ".py" else sub.name
            if sub.name == "__init__.py" or not (sub.suffix == ".py" or (sub / "__init__.py").exists()):
                continue
            value = getattr(mod, name, None)
            if value is not None and not isinstance(value, types.ModuleType):
                hidden.append(f"{pkg}.{name}")
    assert not hidden, f"names that hide a module of the same name: {hidden}"
