"""How much of a weight version changes from one RL step to the next: would delta versions pay?

Issue 16 asks whether to send only the tensors or byte ranges that changed since the actor's version.
This runs launch/rl.py (any config, e.g. the demo's RL stage from its SFT checkpoint) with the
learner's publish wrapped: each version is compared with the one before, as published (the demo
publishes float32) and as bfloat16 (what a bf16 deployment publishes). Per version it records the
fraction of values that changed, the fraction of 4 KiB pages and of tensors with any change (what a
byte-range or a per-tensor delta would still have to send); the medians over the run are printed as
JSON and written next to the run's summary.

    .venv/bin/python tests/benchmarks/bench_weight_delta.py launch/configs/demo_rl.yaml [key=value ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PAGE = 4096


def changes(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> dict[str, float]:
    """Fractions of values, 4 KiB pages and tensors of `after` that differ from `before`, bit for bit."""
    values = pages = tensors = 0
    total_values = total_pages = 0
    for name, new in after.items():
        old = before[name]
        differ = new.reshape(-1).view(np.uint8 if new.itemsize == 1 else f"u{new.itemsize}") != \
            old.reshape(-1).view(np.uint8 if old.itemsize == 1 else f"u{old.itemsize}")
        values += int(differ.sum())
        total_values += differ.size
        per_page = PAGE // new.itemsize
        padded = np.pad(differ, (0, -differ.size % per_page))
        page_changed = padded.reshape(-1, per_page).any(axis=1)
        pages += int(page_changed.sum())
        total_pages += page_changed.size
        tensors += bool(differ.any())
    return {"values": values / total_values, "pages": pages / total_pages, "tensors": tensors / len(after)}


def main() -> int:
    from launch.run import setup_process

    setup_process()
    import learner.service.server as service_module
    from launch.stages import main_for

    steps: list[dict[str, dict[str, float]]] = []
    previous: dict[str, dict[str, np.ndarray]] = {}
    publish = service_module.LearnerService.publish_weights

    def measuring_publish(self, version, tensors):
        tensors = [(name, np.array(array)) for name, array in tensors]
        now = {"published": dict(tensors),
               "bfloat16": {name: array.astype(ml_dtypes.bfloat16) for name, array in tensors}}
        if previous:
            steps.append({kind: changes(previous[kind], now[kind]) for kind in now})
        previous.update(now)
        return publish(self, version, tensors)

    service_module.LearnerService.publish_weights = measuring_publish
    code = main_for("rl", sys.argv[1:])
    result = {kind: {what: float(np.median([s[kind][what] for s in steps])) for what in ("values", "pages", "tensors")}
              for kind in ("published", "bfloat16")} if steps else {}
    result["versions_compared"] = len(steps)
    result["per_version"] = steps
    print(json.dumps({k: v for k, v in result.items() if k != "per_version"}, indent=1))
    out = Path("weight_delta.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"written {out.resolve()}")
    return code


if __name__ == "__main__":
    sys.exit(main())
