"""RolloutEngine on a real vLLM engine, checked against transformers on the same HF files."""

from __future__ import annotations

import numpy as np
import pytest
from actors_helpers import (
    greedy_tokens,
    hf_model,
    load_tensors,
    make_base_model,
    random_weights,
    sampled_token_logprobs,
    write_weights_dir,
)

from actors.engine import PromptTooLongError, RolloutEngine, SamplingSpec, WeightSetError

EOS_ID = 2
PROMPTS = [[1, 3, 5, 6, 7], [1, 3, 8, 9, 10, 11, 4], [1, 20, 4]]
MAX_MODEL_LEN = 48


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """base: the tiny checkpoint the engine starts from; sharp_a/sharp_b: two other weight versions."""
    root = tmp_path_factory.mktemp("engine")
    base = make_base_model(root / "base")
    base_tensors = load_tensors(base)
    return {
        "base": base,
        "sharp_a": write_weights_dir(base, root / "sharp_a", random_weights(base_tensors, seed=1)),
        "sharp_b": write_weights_dir(base, root / "sharp_b", random_weights(base_tensors, seed=2)),
    }


@pytest.fixture(scope="module")
def engine(dirs):
    eng = RolloutEngine(dirs["base"], max_model_len=MAX_MODEL_LEN, kv_cache_gib=0.125, seed=0)
    yield eng
    eng.shutdown()


@pytest.fixture
def engine_on(engine, dirs):
    """Load a named weight version into the shared engine; restores the base weights afterwards."""
    def load(name: str) -> RolloutEngine:
        engine.load_weights(load_tensors(dirs[name]).items())
        return engine
    yield load
    engine.load_weights(load_tensors(dirs["base"]).items())


def test_engine_refuses_an_out_of_process_core(dirs, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        RolloutEngine(dirs["base"], max_model_len=MAX_MODEL_LEN, kv_cache_gib=0.125)


def test_generate_samples_g_completions_per_prompt(engine):
    groups = engine.generate(PROMPTS, SamplingSpec(n=4, temperature=1.0, max_tokens=12))
    assert len(groups) == len(PROMPTS)
    for group in groups:
        assert len(group) == 4
        for s in group:
            assert 1 <= len(s.token_ids) <= 12
            assert len(s.logprobs) == len(s.token_ids)
            assert all(lp <= 0.0 for lp in s.logprobs)
            assert s.finish_reason in ("stop", "length")
            assert (s.finish_reason == "stop") == (s.token_ids[-1] == EOS_ID)
    # n samples of one prompt are not all the same sequence (sampling, not greedy)
    assert len({tuple(s.token_ids) for s in groups[0]}) > 1


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_behaviour_logprobs_equal_transformers_log_softmax_of_scaled_logits(engine_on, dirs, temperature):
    engine = engine_on("sharp_a")
    groups = engine.generate(PROMPTS, SamplingSpec(n=3, temperature=temperature, max_tokens=16))
    oracle = hf_model(dirs["sharp_a"])
    deltas = []
    for prompt, group in zip(PROMPTS, groups, strict=True):
        for s in group:
            ref = sampled_token_logprobs(oracle, prompt, s.token_ids, temperature)
            deltas.append(np.abs(np.asarray(s.logprobs) - ref))
    deltas = np.concatenate(deltas)
    assert deltas.mean() < 1e-3, deltas.mean()
    assert deltas.max() < 1e-2, deltas.max()


def test_stop_strings_and_ids_end_completions(engine):
    stop_id, seven_id = 7, 12  # "7" is token 5 + 7 in models.tokenizer's alphabet
    groups = engine.generate(PROMPTS, SamplingSpec(n=8, max_tokens=24, stop_token_ids=[stop_id], stop=["7"]))
    samples = [s for g in groups for s in g]
    for s in samples:
        assert stop_id not in s.token_ids[:-1] and seven_id not in s.token_ids[:-1]
        assert "7" not in s.text
        if s.token_ids[-1] in (stop_id, seven_id):
            assert s.finish_reason == "stop"
    # both kinds of stop happened (the tiny model is close to uniform over 48 tokens)
    assert any(s.token_ids[-1] == stop_id for s in samples)
    assert any(s.token_ids[-1] == seven_id for s in samples)


def test_too_long_prompt_is_rejected_before_anything_runs(engine):
    too_long = [1] + [5] * MAX_MODEL_LEN
    with pytest.raises(PromptTooLongError, match=r"\[1\]"):
        engine.generate([PROMPTS[0], too_long], SamplingSpec(n=2))
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[1, 10_000]], SamplingSpec(n=1))
    # the longest allowed prompt still works; generation stops at max_model_len
    [[s]] = engine.generate([[1] + [5] * (engine.max_prompt_len - 1)], SamplingSpec(n=1, max_tokens=8))
    assert len(s.token_ids) == 1 and s.finish_reason in ("length", "stop")
    assert len(engine.generate(PROMPTS, SamplingSpec(n=2))) == len(PROMPTS)


def test_load_weights_switches_greedy_outputs_to_the_new_weights(engine_on, dirs):
    for name in ("sharp_a", "sharp_b"):
        engine = engine_on(name)
        oracle = hf_model(dirs[name])
        got = [s.token_ids for s in engine.greedy(PROMPTS, max_tokens=10)]
        want = [greedy_tokens(oracle, p, 10, EOS_ID) for p in PROMPTS]
        assert got == want, name
    a = [s.token_ids for s in engine_on("sharp_a").greedy(PROMPTS, 10)]
    b = [s.token_ids for s in engine_on("sharp_b").greedy(PROMPTS, 10)]
    assert a != b


def _corrupt(tensors: dict[str, np.ndarray], how: str) -> dict[str, np.ndarray]:
    bad = dict(tensors)
    name = "model.layers.0.mlp.down_proj.weight"
    if how == "wrong_shape":
        bad[name] = bad[name][:, :-1]
    elif how == "missing_name":
        del bad[name]
    elif how == "unknown_name":
        bad["model.layers.9.mlp.down_proj.weight"] = bad[name]
    elif how == "nan":
        bad[name] = bad[name].copy()
        bad[name][0, 0] = np.nan
    elif how == "int_dtype":
        bad[name] = bad[name].astype(np.int32)
    return bad


@pytest.mark.parametrize("how", ["wrong_shape", "missing_name", "unknown_name", "nan", "int_dtype"])
def test_bad_weight_set_is_rejected_and_old_weights_keep_serving(engine_on, dirs, how):
    engine = engine_on("sharp_a")
    before = [s.token_ids for s in engine.greedy(PROMPTS, 10)]
    # every other tensor is a valid new version: a partial apply would change the outputs
    bad = _corrupt(load_tensors(dirs["sharp_b"]), how)
    with pytest.raises(WeightSetError, match="down_proj"):
        engine.load_weights(bad.items())
    assert [s.token_ids for s in engine.greedy(PROMPTS, 10)] == before
