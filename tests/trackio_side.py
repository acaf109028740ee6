"""trackio's half of the tracking tests, run by tracking_helpers in a process of its own: `.venv`'s Python
with PYTHONPATH=.trackio-site:<repo>, so that trackio and its pillow<13 come from the side directory
`make trackio-env` fills and everything else from `.venv` (whose pillow is 13; docs/tracking.md).

    python tests/trackio_side.py write SPEC.json OUT.json   # a run through the project's own trackers
    python tests/trackio_side.py read PROJECT RUN OUT.json  # a run's rows and config from trackio's store

`write` takes {logging, name, config, steps: {step: scalars}, final_step, final: scalars, images:
{name: path}, logdir}, opens the trackers as a run does (learner.tracking.open_trackers, MetricsWriter),
and writes {pil, pillow, trackio, failed}: where PIL and trackio were imported from, PIL's version and the
trackers that failed. `read` writes {history: {step: {key: value}}, config} as trackio's own SQLiteStorage
reads them; a step's rows (one a log call) merged, the config without trackio's own `_` keys.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def write(spec: dict[str, Any]) -> dict[str, Any]:
    import PIL
    import trackio

    from learner.metrics import MetricsWriter
    from learner.tracking.config import LoggingConfig, open_trackers

    logdir = Path(spec["logdir"])
    trackers = open_trackers(LoggingConfig.model_validate(spec["logging"]), name=spec["name"],
                             config=spec["config"], run_dir=logdir)
    with MetricsWriter(logdir, trackers=trackers) as writer:
        for step, scalars in spec["steps"].items():
            writer.write(int(step), scalars)
        writer.report(spec["final_step"], spec["final"], {k: Path(v) for k, v in spec["images"].items()})
    return {"pil": PIL.__file__, "pillow": PIL.__version__, "trackio": trackio.__file__,
            "failed": [tracker.name for tracker in trackers if tracker.failed]}


def read(project: str, run: str) -> dict[str, Any]:
    from trackio.sqlite_storage import SQLiteStorage

    history: dict[int, dict[str, Any]] = {}
    for row in SQLiteStorage.get_logs(project, run):
        history.setdefault(int(row["step"]), {}).update(row)
    config = {k: v for k, v in SQLiteStorage.get_run_config(project, run).items() if not k.startswith("_")}
    return {"history": history, "config": config}


if __name__ == "__main__":
    command, *args, out = sys.argv[1:]
    result = {"write": lambda: write(json.loads(Path(args[0]).read_text())), "read": lambda: read(*args)}[command]()
    Path(out).write_text(json.dumps(result, default=str))  # NaN stays NaN (json's own extension)
