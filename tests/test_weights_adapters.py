"""Adapter versions on the weight path, without an engine: the ADAPTER kind and its adapter config travel
in the header over every transport, the config is a bounded JSON object refused at the door (before the
blob), the learner publishes adapters through the same publish_weights (version 0 only as the zero
update), an actor's config check, and the sweep of adapter dirs a killed actor left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from wire_helpers import connected_client, running_service

from actors.weights.adapter_check import check_adapter, config_problems
from actors.weights.adapters import ADAPTER_DIR_PREFIX, LoadedAdapters
from actors.weights.apply import APPLIERS, applier
from actors.weights.checks import WeightSetError
from actors.weights.staged import StagedWeights, WeightTransferError
from actors.weights.staging import stage_weights
from learner.weights.publisher import pack_weights
from learner.weights.shared_memory import SharedMemoryHalf, SharedWeightFiles
from models.peft import LoraConfig, adapter_config
from tandem_wire import pb
from tandem_wire.weights.manifest import ADAPTER, FULL, MAX_ADAPTER_CONFIG_BYTES
from tandem_wire.weights.shared_memory import SHM_DIR

LORA = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
CONFIG = adapter_config(LORA, "runs/base")
ADAPTERS = [("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", np.full((4, 8), 0.5, np.float32)),
            ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", np.full((8, 4), 0.25, np.float32))]


def _messages(blob_messages) -> list[pb.WeightMessage]:
    return [pb.WeightMessage.FromString(m) for m in blob_messages]


def test_an_adapter_version_carries_its_kind_and_config_over_the_stream_and_shared_memory():
    files = SharedWeightFiles()
    try:
        weights = pack_weights(3, ADAPTERS, adapter=CONFIG, keep=[SharedMemoryHalf(files, "xxh3_128", print).packed])
        assert weights.header.kind == ADAPTER == pb.WEIGHT_KIND_ADAPTER
        assert json.loads(weights.header.adapter_config) == CONFIG
        for messages, shared in ((weights.messages, False), (weights.extra["shared"], True)):
            staged = stage_weights(_messages(messages), allow_shared=shared)
            assert (staged.version, staged.kind, staged.adapter) == (3, ADAPTER, CONFIG)
            assert [name for name, _ in staged.tensors] == [name for name, _ in ADAPTERS]
            assert all(np.array_equal(got, want) for (_, got), (_, want) in zip(staged.tensors, ADAPTERS, strict=True))
            assert applier(staged.kind) is APPLIERS[ADAPTER] and not APPLIERS[ADAPTER].drains
        full = stage_weights(_messages(pack_weights(4, ADAPTERS).messages))
        assert (full.kind, full.adapter) == (FULL, None) and APPLIERS[FULL].drains
    finally:
        files.close()


def _header_only(**fields) -> list[pb.WeightMessage]:
    """A stream of one header and nothing after it: a check of the header fails before the blob is read
    (the blob's absence would fail as 'truncated')."""
    header = pb.WeightHeader(version=1, checksum_algorithm="blake3", total_bytes=0, **fields)
    return [pb.WeightMessage(header=header)]


@pytest.mark.parametrize(("fields", "why"), [
    ({"kind": ADAPTER}, "needs one of 1 to"),
    ({"kind": ADAPTER, "adapter_config": '{"r": 8'}, "not JSON"),
    ({"kind": ADAPTER, "adapter_config": "[" * 5000 + "]" * 5000}, "not JSON"),  # deeper than Python's stack
    ({"kind": ADAPTER, "adapter_config": '{"r": NaN}'}, "not JSON"),
    ({"kind": ADAPTER, "adapter_config": "[8, 16]"}, "not an object"),
    ({"kind": ADAPTER, "adapter_config": json.dumps({"base_model_name_or_path": "x" * MAX_ADAPTER_CONFIG_BYTES})},
     "needs one of 1 to"),
    ({"kind": FULL, "adapter_config": json.dumps(CONFIG)}, "WEIGHT_KIND_FULL version carries an adapter config"),
])
def test_a_malformed_or_oversized_adapter_config_is_refused_at_the_door(fields, why):
    with pytest.raises(WeightTransferError, match=why):
        stage_weights(_header_only(**fields))
    assert "truncated" in str(pytest.raises(WeightTransferError, stage_weights,
                                            _header_only(kind=ADAPTER, adapter_config=json.dumps(CONFIG))).value)


def test_the_learner_publishes_adapters_through_publish_weights_and_version_0_only_as_the_zero_update():
    with pytest.raises(ValueError, match="exceeds"):
        pack_weights(1, ADAPTERS, adapter={**CONFIG, "base_model_name_or_path": "x" * MAX_ADAPTER_CONFIG_BYTES})
    with running_service() as (service, address):
        with pytest.raises(ValueError, match="lora_B tensor"):
            service.publish_weights(0, iter(ADAPTERS), adapter=CONFIG)  # B != 0 would not be the base
        zero_b = [ADAPTERS[0], (ADAPTERS[1][0], np.zeros_like(ADAPTERS[1][1]))]
        service.publish_weights(0, iter(zero_b), adapter=CONFIG)
        service.publish_weights(1, iter(ADAPTERS), adapter=CONFIG)
        client = connected_client(address, "a", shared_memory=False)
        try:
            staged = client.fetch_weights()
        finally:
            client.close()
        assert (staged.version, staged.kind, staged.adapter) == (1, ADAPTER, CONFIG)


def test_an_actor_takes_only_the_runs_adapter_config():
    assert config_problems(CONFIG, LORA) == []
    assert config_problems({**CONFIG, "base_model_name_or_path": "elsewhere", "lora_dropout": 0.1}, LORA) == []
    assert config_problems({**CONFIG, "target_modules": ["v_proj", "q_proj"], "lora_alpha": 8}, LORA) == []
    assert config_problems(None, LORA) == ["no adapter config in its header"]
    for changed, needle in ((dict(r=8), "r=8"), (dict(lora_alpha=16.0), "lora_alpha=16.0"),
                            (dict(target_modules=["q_proj"]), "target_modules"), (dict(peft_type="IA3"), "IA3"),
                            (dict(fan_in_fan_out=0), "fan_in_fan_out"), (dict(use_dora=True), "unknown ['use_dora']")):
        [problem] = config_problems({**CONFIG, **changed}, LORA)
        assert needle in problem, problem
    no_lora = SimpleNamespace(lora=None)  # the one branch that needs no engine: an actor without LoRA
    with pytest.raises(WeightSetError, match="serves full weights"):
        check_adapter(no_lora, StagedWeights(1, ADAPTERS, "", 0, kind=ADAPTER, adapter=CONFIG))


def test_the_adapter_dirs_of_a_killed_actor_are_removed_by_the_next_one():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = SHM_DIR / f"{ADAPTER_DIR_PREFIX}{int(dead.stdout)}-00ff"
    (left / "1-policy-v1").mkdir(parents=True)
    (left / "1-policy-v1" / "adapter_model.safetensors").write_bytes(b"x")
    live = SHM_DIR / f"{ADAPTER_DIR_PREFIX}{os.getpid()}-00ee"
    live.mkdir()
    adapters = LoadedAdapters(engine=None, kept=2)  # an engine is not needed to start: nothing loaded yet
    try:
        assert not left.exists() and live.exists() and adapters.root.is_dir()
        assert adapters.root.name.startswith(f"{ADAPTER_DIR_PREFIX}{os.getpid()}-")
        assert (adapters.current, adapters.names) == (None, ())
    finally:
        adapters.close()
        live.rmdir()
    assert not adapters.root.exists()
