"""Writing JSON files: rows as jsonl (one JSON object per line, what `datasets` loads) for the synthetic tasks'
generators and the tests that make their own data, and a benchmark's `--json` report."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    """Write `rows` to `path`, streaming (a generator of 400,000 rows is never held whole); returns `path`."""
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def write_report(path: Path | None, report: object) -> None:
    """Write a benchmark's numbers to `path` as indented JSON (its `--json`; None: not asked for). numpy scalars
    and arrays are written as numbers and lists, anything else JSON lacks as its str."""
    if path is not None:
        path.write_text(json.dumps(report, indent=2, default=_plain))


def _plain(value: object) -> object:
    return value.tolist() if hasattr(value, "tolist") else str(value)
