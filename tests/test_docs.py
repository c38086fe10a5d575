"""The README's module table and docs/ARCHITECTURE.md match the tree: every path they name
exists, and every module of the library is named in the architecture (or its package is)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "einsummable"
DOCS = ("README.md", "docs/ARCHITECTURE.md")
# packages the architecture describes as a whole (their modules need not be named one by one)
WHOLE = ("models/", "commands/", "capture/")
# `pkg/`, `pkg/file.py`, `einsummable/pkg/file.py`, `file.py` in backticks
PATH = re.compile(r"`((?:[a-z_]+/)*(?:[a-z_]+/|[a-z_]+\.py))`")


def _named(doc: str) -> set[str]:
    """Paths a doc names, relative to the library where they are inside it."""
    return {p.removeprefix("einsummable/") for p in PATH.findall((ROOT / doc).read_text())}


def _exists(path: str) -> bool:
    if (ROOT / path).exists():
        return True
    # a path inside a package's row of a table: the end of some path in the library
    tail = "/" + path.rstrip("/")
    return any(("/" + str(q.relative_to(LIBRARY))).endswith(tail) for q in LIBRARY.rglob("*"))


def test_every_path_the_docs_name_exists():
    missing = {doc: sorted(p for p in _named(doc) if not _exists(p)) for doc in DOCS}
    assert not any(missing.values()), f"paths named in the docs but not in the tree: {missing}"


def test_the_architecture_names_every_module_of_the_library():
    named = _named("docs/ARCHITECTURE.md")
    unnamed = []
    for path in sorted(LIBRARY.rglob("*.py")):
        rel = path.relative_to(LIBRARY)
        if path.name == "__init__.py":
            continue
        # the module by its path or its file name, or a package described as a whole
        spelled = {str(rel), path.name, "/".join(rel.parts[-2:])}
        whole = any(f"{part}/" in WHOLE for part in rel.parts[:-1])
        if not (whole or spelled & named):
            unnamed.append(str(rel))
    assert not unnamed, f"modules docs/ARCHITECTURE.md does not name: {unnamed}"
