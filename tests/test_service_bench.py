"""Smoke test of the benchmark's service rows at a tiny size: the measurement drives a real server of
this tree (every group QUEUED, then every re-send DUPLICATE, or it raises) and fills the table. No
timing assertions; the baseline export needs git history and runs only in `launch/bench.py`."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

import bench_service  # noqa: E402

from launch import bench  # noqa: E402


def test_the_service_rows_measure_a_real_server_and_fill_the_table():
    groups = 300
    with bench_service.server(ROOT, groups) as (address, process):
        result = bench_service.measure_variant(address, process, groups)
    assert set(result) == {"groups_per_s", "acks_per_s", "groups_per_cpu_s", "acks_per_cpu_s"}
    assert all(value > 0 for value in result.values())
    rows = bench.table({"service": {"median": {"after": result, "before": result}}})
    assert len(rows) == 4 and all(ours == base for _, ours, base, _ in rows)
    assert "1.00x" in bench.format_table(rows)
