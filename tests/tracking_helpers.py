"""Reading back what the experiment trackers wrote, with their own formats: a W&B offline run's
transaction log (run-<id>.wandb: LevelDB's log format of W&B's own protobuf Records, wandb.proto) and
trackio's local store (its SQLiteStorage)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

WANDB_FILE_HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version
RECORD_HEADER = struct.Struct("<IHB")  # checksum, length, type (1 full, 2 first, 3 middle, 4 last)
BLOCK = 32768  # LevelDB's log block; a record header never straddles one (the block's tail is padding)


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


def trackio_history(project: str, run: str) -> dict[int, dict[str, Any]]:
    """step -> {key: value} of a trackio run in its local store ($TRACKIO_DIR); a step's rows (one a log
    call) merged."""
    from trackio.sqlite_storage import SQLiteStorage

    history: dict[int, dict[str, Any]] = {}
    for row in SQLiteStorage.get_logs(project, run):
        history.setdefault(int(row["step"]), {}).update(row)
    return history


def trackio_config(project: str, run: str) -> dict[str, Any]:
    from trackio.sqlite_storage import SQLiteStorage

    return {k: v for k, v in SQLiteStorage.get_run_config(project, run).items() if not k.startswith("_")}
