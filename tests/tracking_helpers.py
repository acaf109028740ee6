"""Reading back what the experiment trackers wrote, with their own formats: a W&B offline run's
transaction log (run-<id>.wandb: LevelDB's log format of W&B's own protobuf Records, wandb.proto) and
trackio's local store (its SQLiteStorage, in trackio's own environment: trackio_side.py)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WANDB_FILE_HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version
RECORD_HEADER = struct.Struct("<IHB")  # checksum, length, type (1 full, 2 first, 3 middle, 4 last)
BLOCK = 32768  # LevelDB's log block; a record header never straddles one (the block's tail is padding)
ROOT = Path(__file__).resolve().parents[1]
# trackio lives beside the stack, not in it: every release needs pillow<13 and the stack pins 13.0.0.
# `make trackio-env` installs it there; its tests run its part in a process of its own (trackio_side.py).
TRACKIO_SITE = ROOT / ".trackio-site"
SIDE = Path(__file__).resolve().parent / "trackio_side.py"
HAS_TRACKIO = (TRACKIO_SITE / "trackio").is_dir()
needs_trackio = pytest.mark.skipif(not HAS_TRACKIO,
                                   reason=f"trackio is not installed beside the stack in {TRACKIO_SITE} "
                                          "(`make trackio-env`)")


def wandb_records(path: Path) -> list[Any]:
    """Every record of a W&B transaction log, parsed into wandb.proto's Record."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _ = WANDB_FILE_HEADER.unpack_from(data)
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B transaction log"
    position, pending, records = WANDB_FILE_HEADER.size, b"", []
    while position + RECORD_HEADER.size <= len(data):
        if BLOCK - position % BLOCK < RECORD_HEADER.size:
            position += BLOCK - position % BLOCK
            continue
        _, length, kind = RECORD_HEADER.unpack_from(data, position)
        if kind == 0:  # zero padding: the end of what was written
            break
        start = position + RECORD_HEADER.size
        pending += data[start:start + length]
        position = start + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_offline_run(wandb_dir: Path) -> Path:
    """The one offline run W&B wrote under `wandb_dir` (its `wandb/offline-run-*` folder)."""
    [run] = sorted((wandb_dir / "wandb").glob("offline-run-*"))
    return run


def wandb_history(run: Path) -> dict[int, dict[str, Any]]:
    """step -> {key: value} of an offline run's history rows (keys as logged: 'eval/pass@1_greedy')."""
    [log] = run.glob("run-*.wandb")
    rows = {}
    for record in wandb_records(log):
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows[int(row["_step"])] = row
    return rows


def wandb_config(run: Path) -> dict[str, Any]:
    """The config the run logged (its `run` record's config)."""
    [log] = run.glob("run-*.wandb")
    records = wandb_records(log)
    runs = [r for r in records if r.WhichOneof("record_type") == "run"]
    assert len(runs) == 1, f"{log}: {[r.WhichOneof('record_type') for r in records]}"
    [record] = runs
    return {item.key: json.loads(item.value_json) for item in record.run.config.update if item.key != "_wandb"}


def trackio_env() -> dict[str, str]:
    """This process's environment with trackio's side directory and the repo on PYTHONPATH, in that order:
    a process started with it imports trackio and its pillow<13 from .trackio-site, the rest from .venv."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRACKIO_SITE), str(ROOT)])}


def in_trackio_env(tmp: Path, command: str, *args: str) -> dict[str, Any]:
    """What `tests/trackio_side.py command *args` returns, run in trackio's environment (its stderr shown
    when it fails); `tmp` holds the answer's file."""
    out = tmp / f"trackio-{command}.json"
    done = subprocess.run([sys.executable, str(SIDE), command, *args, str(out)], env=trackio_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"trackio_side.py {command} failed:\n{done.stderr[-4000:]}"
    return json.loads(out.read_text())


def trackio_run(tmp: Path, project: str, run: str) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """(step -> {key: value}, config) of a trackio run in its local store ($TRACKIO_DIR), as trackio reads
    them."""
    found = in_trackio_env(tmp, "read", project, run)
    return {int(step): row for step, row in found["history"].items()}, found["config"]


def trackio_picture(entry: dict[str, Any]) -> bytes:
    """The file a history row's image entry ({_type: trackio.image, file_path}) names in the store's media."""
    return (Path(os.environ["TRACKIO_DIR"]) / "media" / entry["file_path"]).read_bytes()
