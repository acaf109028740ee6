"""Writing rows as a jsonl file (one JSON object per line, what `datasets` loads), for the synthetic tasks'
generators and the tests that make their own data."""

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
