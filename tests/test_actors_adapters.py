"""Adapter versions in a real vLLM engine (RolloutEngine with LoRA), checked against peft and transformers
on the same files: the PEFT dir an actor writes is the adapter (peft's logits are the hand-merged
weights'), vLLM serves each version as its merged weights (greedy tokens and behaviour logprobs), a
version that fails its check changes nothing, and a group in flight keeps its adapter while newer ones
load, the oldest being unloaded once no group uses it."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import torch
from actors_helpers import (
    chat_prompt,
    greedy_tokens,
    hf_model,
    load_tensors,
    merged_weights,
    random_adapter,
    sampled_token_logprobs,
    write_weights_dir,
)

from actors.engine import RolloutEngine, SamplingSpec
from actors.weights.adapters import write_peft_dir
from actors.weights.apply import applier
from actors.weights.checks import WeightSetError
from actors.weights.staging import stage_weights
from learner.weights.publisher import pack_weights
from models.peft import LoraConfig, adapter_config
from tandem_wire import pb

pytestmark = pytest.mark.slow  # a real vLLM engine, peft and transformers

LORA = LoraConfig(rank=4, alpha=8.0)
KEPT = 2
EOS_ID = 2
TEMPERATURE = 0.7
PROMPTS = [chat_prompt("12+30"), chat_prompt("7+8"), chat_prompt("250+250")]


@pytest.fixture(scope="module")
def base(weight_dirs):
    """A tiny qwen2 with sharp random weights (greedy outputs free of near-ties)."""
    return weight_dirs["sharp_a"]


@pytest.fixture(scope="module")
def engine(base):
    eng = RolloutEngine(base, max_model_len=48, kv_cache_gib=0.125, seed=0, lora=LORA, lora_versions_kept=KEPT)
    yield eng
    eng.shutdown()
    assert not eng.adapters.root.exists()


@pytest.fixture(scope="module")
def versions():
    return itertools.count(1)


def merged_model(base, adapter, tmp_path, name: str):
    """transformers over the adapter's weights merged by hand: the reference each version is checked against."""
    return hf_model(write_weights_dir(base, tmp_path / name, merged_weights(load_tensors(base), adapter, LORA.scale)))


def publish(version: int, tensors, config=None):
    """An adapter version as an actor stages it: packed by the learner, streamed, verified, scanned."""
    blob = pack_weights(version, tensors.items(), adapter=config or adapter_config(LORA, "learner/base"))
    return stage_weights(pb.WeightMessage.FromString(m) for m in blob.messages)


def load(engine, staged) -> None:
    row = applier(staged.kind)
    row.load(engine, row.check(engine, staged), staged.version)


def test_the_peft_dir_an_actor_writes_is_the_adapter_peft_and_transformers_load(base, tmp_path):
    from peft import PeftModel

    adapter = random_adapter(base, LORA, seed=10)
    peft_dir = write_peft_dir(tmp_path / "peft", adapter_config(LORA, str(base)), adapter)
    ids = torch.tensor([PROMPTS[0] + PROMPTS[2]])
    with torch.no_grad():
        plain = hf_model(base)(input_ids=ids).logits
        peft_logits = PeftModel.from_pretrained(hf_model(base), str(peft_dir)).eval()(input_ids=ids).logits
        merged = merged_model(base, adapter, tmp_path, "merged")(input_ids=ids).logits
    assert (peft_logits - plain).abs().max() > 1.0  # the adapter changes the model
    assert (peft_logits - merged).abs().max() < 1e-4  # W + (alpha / r) B A, merged by hand


def test_vllm_serves_each_adapter_version_as_its_merged_weights(engine, base, versions, tmp_path):
    """Greedy tokens equal transformers' over the merged weights, version after version on the same prompts
    (a fixed adapter name would let vLLM's prefix cache serve an older version's KV), and the behaviour
    logprobs match transformers' over the merged weights, tighter than full versions are held to."""
    before = [s.token_ids for s in engine.greedy(PROMPTS, 8)]
    gaps = []
    for seed in (11, 12):
        version = next(versions)
        adapter = random_adapter(base, LORA, seed=seed)
        load(engine, publish(version, adapter))
        assert engine.adapters_loaded[-1] == f"policy-v{version}"
        model = merged_model(base, adapter, tmp_path, f"v{version}")
        now = [s.token_ids for s in engine.greedy(PROMPTS, 8)]
        assert now == [greedy_tokens(model, p, 8, EOS_ID) for p in PROMPTS] and now != before
        before = now
        groups = engine.generate(PROMPTS, SamplingSpec(n=4, temperature=TEMPERATURE, max_tokens=8))
        gaps += [np.abs(np.asarray(s.logprobs) - sampled_token_logprobs(model, p, s.token_ids, TEMPERATURE))
                 for p, group in zip(PROMPTS, groups, strict=True) for s in group]
    gap = np.concatenate(gaps)
    # full versions: mean < 1e-3 (tests/test_actors_rollout.py); measured here ~5e-6, max ~7e-5
    assert gap.mean() < 1e-4 and gap.max() < 1e-3, (gap.mean(), gap.max())


def test_a_version_that_fails_its_check_changes_nothing(engine, base, versions):
    version = next(versions)
    load(engine, publish(version, random_adapter(base, LORA, seed=20)))
    loaded, served = engine.adapters_loaded, [s.token_ids for s in engine.greedy(PROMPTS, 8)]
    good = random_adapter(base, LORA, seed=21)
    a_name = next(iter(good))
    rank8 = random_adapter(base, LoraConfig(rank=8, alpha=16.0), seed=22)
    nan = {**good, a_name: np.where(np.arange(good[a_name].size).reshape(good[a_name].shape) == 3, np.nan,
                                    good[a_name]).astype(np.float32)}
    refused = {
        "missing 1 tensor": publish(version + 1, {k: v for k, v in good.items() if k != a_name}),
        "unknown 1 tensor": publish(version + 1, {**good, "base_model.model.lm_head.lora_A.weight": good[a_name]}),
        # the run's rank in the header, not in the tensors
        "shape (8, 64) != expected (4, 64)": publish(version + 1, rank8),
        "adapter config r=8": publish(version + 1, rank8, adapter_config(LoraConfig(rank=8, alpha=16.0), "b")),
        "contains non-finite values": publish(version + 1, nan),
    }
    for why, staged in refused.items():
        with pytest.raises(WeightSetError, match=re.escape(why)):
            applier(staged.kind).check(engine, staged)
    with pytest.raises(WeightSetError, match="would replace that base"):  # a full version on a LoRA engine
        engine.check_weights(load_tensors(base).items())
    assert engine.adapters_loaded == loaded and [s.token_ids for s in engine.greedy(PROMPTS, 8)] == served


def test_a_group_in_flight_keeps_its_adapter_and_the_oldest_unloads_once_unused(engine, base, versions, tmp_path):
    first = next(versions)
    adapters = {first: random_adapter(base, LORA, seed=30)}
    load(engine, publish(first, adapters[first]))
    reference = {first: greedy_tokens(merged_model(base, adapters[first], tmp_path, "first"), PROMPTS[1], 12, EOS_ID)}
    assert len(reference[first]) > 3, "the check needs a completion that outlives two loads"
    greedy = SamplingSpec(n=1, temperature=0.0, max_tokens=12)
    engine.submit("old", PROMPTS[1], greedy)
    assert engine.poll() == []  # its first token, on `first`
    [first_dir] = [d for d in engine.adapters.root.iterdir() if d.name.endswith(f"-policy-v{first}")]
    newer = [next(versions), next(versions)]
    for version in newer:  # two loads while "old" samples: `first` leaves the KEPT newest
        adapters[version] = random_adapter(base, LORA, seed=30 + version)
        load(engine, publish(version, adapters[version]))
    assert engine.adapters_loaded == (f"policy-v{first}", *(f"policy-v{v}" for v in newer))  # held by "old"
    engine.submit("new", PROMPTS[1], greedy)  # takes the newest
    done = {}
    while engine.in_flight:
        done.update({key: samples[0].token_ids for key, samples in engine.poll()})
    assert done["old"] == reference[first]
    newest = merged_model(base, adapters[newer[-1]], tmp_path, "newest")
    assert done["new"] == greedy_tokens(newest, PROMPTS[1], 12, EOS_ID)
    assert engine.adapters_loaded == tuple(f"policy-v{v}" for v in newer)  # unloaded once "old" finished
    assert len(engine.llm.llm_engine.list_loras()) == KEPT and not first_dir.exists()
