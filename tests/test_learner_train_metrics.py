"""Metrics logging: TensorBoard event files (read back record by record) and the JSONL log."""

from __future__ import annotations

import json
import math
import struct

import jax.numpy as jnp
import pytest
from tensorboardX.proto.event_pb2 import Event

from learner.metrics import MetricsWriter, Throughput, to_host


def _tfrecords(path):
    """The payloads of a TFRecord file: [len u64][crc u32][payload][crc u32] repeated."""
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset:offset + 8])
        yield data[offset + 12: offset + 12 + length]
        offset += 12 + length + 4


def test_writer_logs_scalars_to_tensorboard_and_jsonl(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        writer.write(1, to_host({"loss": jnp.float32(2.5), "grad_norm": 0.75}))
        writer.write(2, {"loss": 1.5, "grad_norm": float("nan")})
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "loss": 2.5, "grad_norm": 0.75},
                     {"step": 2, "loss": 1.5, "grad_norm": "nan"}]
    (events_file,) = tmp_path.glob("events.out.tfevents.*")
    scalars = {}
    for record in _tfrecords(events_file):
        event = Event.FromString(record)
        for value in event.summary.value:
            scalars[(event.step, value.tag)] = value.simple_value
    assert scalars[(1, "loss")] == 2.5 and scalars[(2, "loss")] == 1.5 and scalars[(1, "grad_norm")] == 0.75
    assert math.isnan(scalars[(2, "grad_norm")])


def test_throughput():
    with Throughput() as meter:
        sum(range(10000))
    metrics = meter.metrics(num_tokens=1000)
    assert metrics["step_time_s"] > 0
    assert metrics["tokens_per_s"] == pytest.approx(1000 / metrics["step_time_s"])
