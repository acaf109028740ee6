"""A benchmark's `--json` report: numpy numbers read back as numbers, the rest JSON lacks as text, and no file
when none was asked for."""

import json
from pathlib import Path

import numpy as np

from launch.json_files import write_report


def test_a_report_keeps_numpy_numbers_as_numbers(tmp_path):
    path = tmp_path / "report.json"
    write_report(path, {"mfu": np.float32(0.5), "steps": np.int64(3), "losses": np.array([1.0, 2.0]),
                        "dir": Path("/x"), "rows": [{"ok": True}]})
    assert json.loads(path.read_text()) == {"mfu": 0.5, "steps": 3, "losses": [1.0, 2.0], "dir": "/x",
                                            "rows": [{"ok": True}]}


def test_no_path_writes_nothing(tmp_path):
    write_report(None, {"a": 1})
    assert list(tmp_path.iterdir()) == []
