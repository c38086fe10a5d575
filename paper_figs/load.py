"""Reading results documents written by `einsummable-bench`."""
from __future__ import annotations

import json
from pathlib import Path


def load_results(results_dir: Path) -> dict[str, dict]:
    """Config name -> results document, for every *.json in the directory."""
    out = {}
    for p in sorted(Path(results_dir).glob("*.json")):
        try:
            doc = json.loads(p.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and "rows" in doc and "config" in doc:
            out[doc["config"]] = doc
    return out


def ok_rows(doc: dict) -> list[dict]:
    return [r for r in doc["rows"] if r.get("time_s") is not None and not r.get("unavailable")]
