"""RolloutEngine on a real vLLM engine, checked against transformers on the same HF files; batch
(generate) and streaming (submit/poll/abort_all) sampling."""

from __future__ import annotations

import numpy as np
import pytest
from actors_helpers import (
    greedy_tokens,
    hf_model,
    load_tensors,
    sampled_token_logprobs,
)

from actors.engine import PromptTooLongError, RolloutEngine, Sample, SamplingSpec
from actors.weights.checks import WeightSetError

pytestmark = pytest.mark.slow  # a real vLLM engine

EOS_ID = 2
PROMPTS = [[1, 3, 5, 6, 7], [1, 3, 8, 9, 10, 11, 4], [1, 20, 4]]
MAX_MODEL_LEN = 48


@pytest.fixture(scope="module")
def dirs(weight_dirs):
    """base: the tiny checkpoint the engine starts from; sharp_a/sharp_b: two other weight versions."""
    return weight_dirs


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
    engine.abort_all()  # a failed streaming test may leave groups in flight, which block a load
    engine.load_weights(load_tensors(dirs["base"]).items(), version=0)


@pytest.fixture
def streaming(engine):
    """The shared engine, with nothing left in flight after the test (pass or fail)."""
    yield engine
    engine.abort_all()


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


# --- streaming: submit / poll / abort_all ---------------------------------------------------------

def drain(engine: RolloutEngine, max_polls: int = 500) -> list[list[tuple[str, list[Sample]]]]:
    """Poll until nothing is in flight; what each poll returned, in order."""
    polls = []
    while engine.in_flight:
        assert len(polls) < max_polls, "groups never finished"
        polls.append(engine.poll())
    return polls


def finished_at(polls: list[list[tuple[str, list[Sample]]]]) -> dict[str, int]:
    """Key -> index of the poll that returned its group (each key at most once)."""
    at: dict[str, int] = {}
    for i, groups in enumerate(polls):
        for key, _ in groups:
            assert key not in at, f"group {key} returned twice"
            at[key] = i
    return at


def test_streaming_returns_each_group_once_with_all_n_completions(streaming):
    engine = streaming
    for i, prompt in enumerate(PROMPTS):
        engine.submit(f"p{i}", prompt, SamplingSpec(n=4, temperature=1.0, max_tokens=12))
    assert engine.in_flight == len(PROMPTS)
    polls = drain(engine)
    assert set(finished_at(polls)) == {f"p{i}" for i in range(len(PROMPTS))}
    for _, group in (g for groups in polls for g in groups):
        assert len(group) == 4
        for s in group:
            assert 1 <= len(s.token_ids) <= 12
            assert len(s.logprobs) == len(s.token_ids)
            assert all(np.isfinite(lp) and lp <= 0.0 for lp in s.logprobs)
            assert s.finish_reason in ("stop", "length")
    assert engine.poll() == [] and engine.in_flight == 0


def test_streaming_greedy_equals_batch_llm_generate(engine_on):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = engine_on("sharp_a")
    params = SamplingParams(n=1, temperature=0.0, max_tokens=16, logprobs=0)
    batch = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params, use_tqdm=False)
    for i, prompt in enumerate(PROMPTS):
        engine.submit(str(i), prompt, SamplingSpec(n=1, temperature=0.0, max_tokens=16))
    streamed = dict(g for groups in drain(engine) for g in groups)
    for i, out in enumerate(batch):
        [s] = streamed[str(i)]
        assert s.token_ids == list(out.outputs[0].token_ids)
        want = [step[tok].logprob for tok, step in zip(out.outputs[0].token_ids, out.outputs[0].logprobs,
                                                       strict=True)]
        np.testing.assert_allclose(s.logprobs, want, atol=1e-5)


def test_a_short_group_is_returned_before_a_long_one_finishes(streaming):
    engine = streaming
    # greedy on the base weights never ends early on PROMPTS (it repeats 25, 6): 40 tokens
    engine.submit("long", PROMPTS[0], SamplingSpec(n=1, temperature=0.0, max_tokens=40))
    engine.submit("short", PROMPTS[1], SamplingSpec(n=3, temperature=1.0, max_tokens=2))
    polls = drain(engine)
    at = finished_at(polls)
    assert at["short"] < at["long"]
    assert at["short"] <= 2  # prefill + one decode step, not the long group's 40
    assert len(dict(polls[at["long"]])["long"][0].token_ids) == 40


def test_a_prompt_submitted_between_polls_joins_the_running_batch(streaming):
    engine = streaming
    engine.submit("first", PROMPTS[0], SamplingSpec(n=1, temperature=0.0, max_tokens=40))
    polls = [engine.poll() for _ in range(3)]
    assert polls == [[], [], []] and engine.in_flight == 1
    engine.submit("joiner", PROMPTS[1], SamplingSpec(n=2, temperature=1.0, max_tokens=4))
    engine.submit("joiner2", PROMPTS[2], SamplingSpec(n=1, temperature=1.0, max_tokens=4))
    polls += drain(engine)
    at = finished_at(polls)
    assert set(at) == {"first", "joiner", "joiner2"}
    # the joiners ran alongside the first group instead of waiting for it to end
    assert max(at["joiner"], at["joiner2"]) < at["first"]
    assert at["first"] == 39  # 40 tokens, one per step, not delayed by the joiners


def test_abort_all_then_load_resamples_every_group_on_the_new_weights(engine_on, dirs):
    engine = engine_on("sharp_a")
    old = [s.token_ids for s in engine.greedy(PROMPTS, max_tokens=10)]
    keys = [f"k{i}" for i in range(len(PROMPTS))]
    # vLLM refuses n > 1 at temperature 0; at 0.01 the sharp weights' argmax is all but certain
    spec = SamplingSpec(n=2, temperature=0.01, max_tokens=10)
    for key, prompt in zip(keys, PROMPTS, strict=True):
        engine.submit(key, prompt, spec)
    assert engine.poll() == []  # one step: every child has one token
    with pytest.raises(RuntimeError, match="in flight"):
        engine.load_weights(load_tensors(dirs["sharp_b"]).items())
    wasted_before = engine.aborted_tokens
    assert engine.abort_all() == keys
    assert engine.in_flight == 0 and not engine.llm.llm_engine.has_unfinished_requests()
    assert engine.aborted_tokens - wasted_before == len(keys) * 2  # one token per child
    assert engine.abort_all() == [] and engine.poll() == []

    engine.load_weights(load_tensors(dirs["sharp_b"]).items())
    for key, prompt in zip(keys, PROMPTS, strict=True):  # the same keys again: fresh vLLM requests
        engine.submit(key, prompt, spec)
    resampled = dict(g for groups in drain(engine) for g in groups)
    new = [s.token_ids for s in engine.greedy(PROMPTS, max_tokens=10)]
    assert new != old
    for key, want in zip(keys, new, strict=True):
        assert [s.token_ids for s in resampled[key]] == [want, want]


def test_update_in_flight_continues_every_group_on_each_new_version(engine_on, dirs):
    """Three versions load while groups are in flight (vLLM's pause in keep mode): nothing is aborted, every
    token carries the version that sampled it, and its behaviour logprob is transformers' log_softmax of that
    version's logits given the same prompt and prefix (the KV recomputed on the new weights, not kept)."""
    engine = engine_on("base")
    names = ["base", "sharp_a", "sharp_b", "sharp_c"]  # version k = names[k]
    spec = SamplingSpec(n=2, temperature=2.0, max_tokens=24)  # T = 2 flattens the sharp versions' distributions
    keys = [f"k{i}" for i in range(len(PROMPTS))]
    for key, prompt in zip(keys, PROMPTS, strict=True):
        engine.submit(key, prompt, spec)
    aborted_before, recomputed_before = engine.aborted_tokens, engine.recomputed_tokens
    done: dict[str, list[Sample]] = {}
    updates = []
    for version in (1, 2, 3):
        for _ in range(5):  # one token per child and step
            done.update(engine.poll())
        updates.append(engine.update_in_flight(engine.check_weights(load_tensors(dirs[names[version]]).items()),
                                               version))
    assert not done, "a group finished before the last update: make the test's completions longer"
    done.update(g for groups in drain(engine) for g in groups)
    assert engine.aborted_tokens == aborted_before
    # a child still running at update k (after 5k steps: more than 5k tokens) had its prompt and 5k - 1 tokens
    # in the KV cache (the last one sampled is computed by the next step), recomputed on the new weights
    children = [(len(prompt), len(s.token_ids)) for key, prompt in zip(keys, PROMPTS, strict=True)
                for s in done[key]]
    running = [[(p, n) for p, n in children if n > 5 * k] for k in (1, 2, 3)]
    assert [u.sequences for u in updates] == [len(r) for r in running]
    assert [u.tokens_recomputed for u in updates] == [sum(p + 5 * k - 1 for p, _ in r)
                                                      for k, r in enumerate(running, start=1)]
    assert engine.recomputed_tokens - recomputed_before == sum(u.tokens_recomputed for u in updates)
    assert max(n for _, n in children) > 15, "no child spans all four versions"
    oracles = {k: hf_model(dirs[name]) for k, name in enumerate(names)}
    for key, prompt in zip(keys, PROMPTS, strict=True):
        for sample in done[key]:
            assert sample.versions == [min(i // 5, 3) for i in range(len(sample.token_ids))]
            for version, oracle in oracles.items():
                at = [i for i, v in enumerate(sample.versions) if v == version]
                want_lp = sampled_token_logprobs(oracle, prompt, sample.token_ids, 2.0)[at]
                np.testing.assert_allclose(np.array(sample.logprobs)[at], want_lp, rtol=0, atol=2e-4,
                                           err_msg=f"{key} version {version}")


def test_tokens_carry_the_version_loaded_between_groups(engine_on, dirs):
    engine = engine_on("base")
    engine.load_weights(load_tensors(dirs["sharp_a"]).items(), version=7)
    [[sample]] = engine.generate([PROMPTS[0]], SamplingSpec(n=1, max_tokens=6))
    assert sample.versions == [7] * len(sample.token_ids)


def test_aborted_tokens_count_finished_children_of_unfinished_groups(streaming):
    engine = streaming
    # half the vocabulary stops a completion: after the first step many children have finished
    # (one token each) while their groups wait for siblings that are still running
    spec = SamplingSpec(n=8, temperature=1.0, max_tokens=20, stop_token_ids=list(range(0, engine.vocab_size, 2)))
    for i in range(4):
        engine.submit(f"g{i}", PROMPTS[i % len(PROMPTS)], spec)
    returned = engine.poll()
    wasted_before = engine.aborted_tokens
    aborted = engine.abort_all()
    assert aborted and len(aborted) + len(returned) == 4
    assert engine.aborted_tokens - wasted_before == 8 * len(aborted)  # every child had one token


def test_invalid_submissions_raise_before_anything_reaches_vllm(streaming):
    engine = streaming
    engine.submit("ok", PROMPTS[0], SamplingSpec(n=1, max_tokens=4))
    with pytest.raises(PromptTooLongError, match="'long'"):
        engine.submit("long", [1] + [5] * MAX_MODEL_LEN, SamplingSpec(n=1))
    with pytest.raises(ValueError, match="empty"):
        engine.submit("empty", [], SamplingSpec(n=1))
    with pytest.raises(ValueError, match="outside"):
        engine.submit("oov", [1, 10_000], SamplingSpec(n=1))
    with pytest.raises(ValueError, match="already in flight"):
        engine.submit("ok", PROMPTS[1], SamplingSpec(n=1))
    with pytest.raises(ValueError, match="invalid sampling"):
        engine.submit("n0", PROMPTS[1], SamplingSpec(n=0))
    with pytest.raises(ValueError, match="greedy"):
        engine.submit("greedy_n2", PROMPTS[1], SamplingSpec(n=2, temperature=0.0))
    with pytest.raises(RuntimeError, match="idle"):
        engine.generate(PROMPTS, SamplingSpec(n=1))
    assert engine.in_flight == 1 and engine.llm.llm_engine.get_num_unfinished_requests() == 1
    assert list(finished_at(drain(engine))) == ["ok"]
