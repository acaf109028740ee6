"""Multi-turn groups end to end: a RolloutActor in this process (real vLLM engine) runs episodes of an
environment on a real reward pool (Ray, the environment in its isolated child) and streams them to a
real learner service over loopback gRPC, whose gate (parse_group) accepts them.

Checked against independent oracles: every observation's tokens are what the model's chat template
writes between two assistant turns (``<eos>`` when the turn was cut at max_tokens, then ``<user>no<asst>``),
every sampled token's behaviour logprob is transformers' under the weight version that sampled its
turn, also when a new version is loaded between two turns of one trajectory, and the learner's loss mask
covers exactly the sampled tokens. An environment that raises makes its trajectories unscorable, with
the reason, and the group still arrives."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from actors_helpers import (
    chat_prompt,
    hf_model,
    in_process_actor,
    load_tensors,
    make_base_model,
    random_weights,
    sampled_token_logprobs,
    write_weights_dir,
)
from config_helpers import actor_config, service_config
from transformers import AutoTokenizer

from actors.rollout_actor import RolloutActor
from learner.algo.losses import LossConfig
from learner.algo.turn_advantages import trajectory as trajectory_rule
from learner.rl_loop import build_batch
from learner.service.prompt_source import Prompt, PromptSource
from learner.service.server import LearnerService
from models.tokenizer import ASST_ID, USER_ID, vocab_size_for
from rewards.pool import RewardPool, RewardSpec, WeightedReward
from rewards.spec import EnvironmentSpec

pytestmark = pytest.mark.slow  # Ray and vLLM actors

ROOT = Path(__file__).resolve().parents[1]
G = 3
TEMPERATURE = 0.8
MAX_TURNS = 3
TURN_TOKENS = 5

USER_MODULE = '''
from rewards.retry_environment import AnswerRetry

class RetryOrRaise(AnswerRetry):
    """answer_retry, except on the rows whose `mode` is "raise"."""

    def reset(self, row):
        super().reset(row)
        self.mode = row.get("mode", "")

    def step(self, reply):
        if self.mode == "raise":
            raise RuntimeError("the environment failed")
        return super().step(reply)
'''


# The character template, except that it drops the assistant turns before the last user message (as
# reasoning templates drop earlier thoughts): a conversation's rendering is then no prefix of the next's.
REWRITING_TEMPLATE = (
    "{{ '<bos>' }}{% set ns = namespace(last_user=-1) %}"
    "{% for message in messages %}{% if message['role'] == 'user' %}{% set ns.last_user = loop.index0 %}"
    "{% endif %}{% endfor %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '<user>' + message['content'] }}"
    "{% elif loop.index0 > ns.last_user %}{{ '<asst>' + message['content'] + '<eos>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<asst>' }}{% endif %}"
)


def _use_template(hf_dir: Path, template: str) -> None:
    path = hf_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "chat_template": template}))


@pytest.fixture(params=["plain"])
def rig(request, ray_session, tmp_path):
    base = make_base_model(tmp_path / "base")
    if request.param == "rewriting":
        _use_template(base, REWRITING_TEMPLATE)
    sharp = write_weights_dir(base, tmp_path / "sharp", random_weights(load_tensors(base), seed=1))
    (tmp_path / "user_episodes.py").write_text(textwrap.dedent(USER_MODULE))
    environment = EnvironmentSpec(ref="user_episodes:RetryOrRaise", max_turns=MAX_TURNS, max_total_tokens=40)
    pool = RewardPool(RewardSpec(functions=[WeightedReward(ref="exact_match")], environment=environment),
                      num_workers=1, actor_options={"runtime_env": {"env_vars": {"PYTHONPATH": f"{tmp_path}:{ROOT}"}}})
    prompts = [Prompt(chat_prompt("12+30"), "12+30", {"answer": "42"}),
               Prompt(chat_prompt("7+8"), "7+8", {"answer": "15"}),
               Prompt(chat_prompt("5+5"), "5+5", {"answer": "10", "mode": "raise"})]
    service = LearnerService(PromptSource(prompts, epochs=None), service_config(
        queue_capacity=8, max_staleness=1000, group_size=G, lease_seconds=60.0, vocab_size=vocab_size_for(),
        max_sequence_tokens=64))
    config = actor_config(base, group_size=G, temperature=TEMPERATURE, max_tokens=TURN_TOKENS, max_model_len=64,
                          kv_cache_gib=0.125, prompts_per_batch=3, num_cpus=0, environment=environment,
                          weight_drain_steps=0)  # a version loads at once: the turns in flight are sampled again
    with in_process_actor(config, service, pool) as actor:
        yield actor, service, {0: base, 1: sharp}


def _sample_episodes(actor: RolloutActor, service: LearnerService, dirs: dict, load_after_turns: int):
    """Lease the three prompts and run the streaming loop's calls until their groups are sent; once
    `load_after_turns` turns were sampled, publish version 1 (what the weights thread does; with no
    drain allowed it is loaded after the next engine step, the turns then in the engine aborted and
    sampled again on it)."""
    actor._submit(actor.client.lease_prompts(3).prompts)
    published = False
    for _ in range(2000):
        if not actor.sampler.held():
            break
        actor.sampler.step()
        if not published and actor.sampler.episodes.counts.turns >= load_after_turns:
            service.publish_weights(1, load_tensors(dirs[1]).items())
            actor._maybe_update_weights(1)
            published = True
        actor._load_when_drained()
        actor.sampler.collect(wait_s=0.05)
    assert not actor.sampler.held() and actor.version == 1
    records = service.next_batch(3, timeout=30)
    assert len(records) == 3, service.accounting()  # none refused (e.g. trajectories that start on two versions)
    return sorted(records, key=lambda record: record.metadata["answer"])


def test_episodes_carry_exact_tokens_per_turn_versions_and_rewards_and_a_failing_environment_is_unscorable(rig):
    actor, service, dirs = rig
    tokenizer = AutoTokenizer.from_pretrained(dirs[0])
    eos, feedback = tokenizer.eos_token, "<user>no<asst>"
    raising, *retried = _sample_episodes(actor, service, dirs, load_after_turns=2 * G)
    models = {version: hf_model(path) for version, path in dirs.items()}
    spanning, multi_turn = 0, 0
    for record in retried:
        turn_versions = [[turn.policy_version for turn in c.turns] for c in record.completions]
        assert len(record.completions) == G and record.policy_version == min(min(v) for v in turn_versions)
        spanning += sum(v[0] < v[-1] for v in turn_versions)  # versions only grow along a trajectory
        assert all(v == sorted(v) for v in turn_versions)
        for completion in record.completions:
            assert completion.unscorable_reason is None and completion.reward in (0.0, 1.0)
            assert 1 <= len(completion.turns) <= MAX_TURNS and completion.turns[-1].observation_tokens == 0
            multi_turn += len(completion.turns) > 1
            mask = completion.loss_mask
            context = list(record.prompt_ids)
            position = 0
            for turn in completion.turns:
                sampled = completion.token_ids[position:position + turn.sampled_tokens]
                observed = completion.token_ids[position + turn.sampled_tokens:
                                                 position + turn.sampled_tokens + turn.observation_tokens]
                # the behaviour logprobs are the sampling version's, given everything before the turn
                expected = sampled_token_logprobs(models[turn.policy_version], context, sampled, TEMPERATURE)
                got = completion.logprobs[position:position + turn.sampled_tokens]
                np.testing.assert_allclose(got, expected, atol=1e-3)
                assert mask[position:position + turn.sampled_tokens].all()
                if turn.observation_tokens:
                    text = tokenizer.decode(observed, skip_special_tokens=False)
                    ended_with_eos = sampled[-1] == tokenizer.eos_token_id
                    assert text == (feedback if ended_with_eos else eos + feedback), text
                    assert turn.reward == 0.0 and not mask[position + turn.sampled_tokens:][:len(observed)].any()
                context += sampled + observed
                position += turn.sampled_tokens + turn.observation_tokens
            assert position == len(completion.token_ids)
            assert completion.reward == sum(turn.reward or 0.0 for turn in completion.turns)
    assert multi_turn > 0 and spanning > 0  # a trajectory went on with the version loaded mid-episode
    assert [c.unscorable_reason for c in raising.completions] == ["environment:raised:RuntimeError"] * G
    assert all(len(c.turns) == 1 for c in raising.completions)

    counts = actor.stats().episodes
    turns = sum(len(c.turns) for r in (raising, *retried) for c in r.completions)
    assert counts["trajectories"] == 3 * G and counts["turns"] == turns
    assert counts["ended/unscorable"] == G
    assert sum(n for key, n in counts.items() if key.startswith("ended/")) == 3 * G


@pytest.mark.parametrize("rig", ["rewriting"], indirect=True)
def test_a_template_that_rewrites_earlier_turns_splits_trajectories_into_the_samples_the_engine_saw(rig):
    """Each retry is sampled from the conversation rendered afresh (the earlier replies dropped); the
    learner accepts the split trajectories, and each sample's behaviour logprobs are transformers' given
    that sample's own prompt, so the rows it assembles are what the engine sampled from."""
    actor, service, dirs = rig
    tokenizer = AutoTokenizer.from_pretrained(dirs[0])
    _, *retried = _sample_episodes(actor, service, dirs, load_after_turns=G)
    models = {version: hf_model(path) for version, path in dirs.items()}
    no = tokenizer.encode("no", add_special_tokens=False)
    splits = 0
    for record in retried:
        for completion in record.completions:
            for k, turn in enumerate(completion.turns):
                assert turn.observation_tokens == 0  # every observation is in a new sample's context
                # turn k's context: the question and k "no"s; the replies before it are dropped
                expected = [] if k == 0 else list(record.prompt_ids[:-1]) + ([USER_ID, *no] * k) + [ASST_ID]
                assert turn.context_ids == expected
                splits += k > 0
            for prompt, start, end in completion.samples(list(record.prompt_ids)):
                position = 0
                for turn in completion.turns:
                    if start <= position < end:
                        sampled = completion.token_ids[position:position + turn.sampled_tokens]
                        before = completion.token_ids[start:position]
                        expected = sampled_token_logprobs(models[turn.policy_version], prompt + before, sampled,
                                                          TEMPERATURE)
                        np.testing.assert_allclose(completion.logprobs[position:position + len(sampled)], expected,
                                                   atol=1e-3)
                    position += turn.sampled_tokens
    assert splits > 0 and actor.stats().episodes["samples_split"] == splits
    batch, stats = build_batch(retried, LossConfig(), trajectory_rule, pad_id=0, row_tokens=64, row_multiple=1,
                               current_version=1)
    assert stats["split_samples"] == splits
    assert stats["sequences"] == 2 * G + splits and batch.segment_ids.max(1).sum() == 2 * G + splits  # a sample each


def test_held_out_evaluation_plays_whole_greedy_episodes_the_model_would_play(weight_dirs):
    """launch.evaluation with an environment: greedy episodes are the model's argmax at every sampled
    position (transformers, teacher-forced on the whole trajectory), and the figures count episodes."""
    import torch

    from actors.learner_client import Prompt as EnginePrompt
    from actors.trajectory import ObservationRenderer
    from launch.evaluation import Episodes, Evaluator
    from rewards.environment_host import IsolatedEnvironment
    from rewards.isolation import IsolatedScorer

    base = weight_dirs["sharp_a"]  # sharp weights: greedy tokens free of near-ties
    tokenizer = AutoTokenizer.from_pretrained(base)
    environment = EnvironmentSpec(ref="answer_retry", max_turns=MAX_TURNS, max_total_tokens=40)
    spec = RewardSpec(functions=[WeightedReward(ref="exact_match")], environment=environment)
    examples = [EnginePrompt(chat_prompt(f"{a}+{b}"), f"{a}+{b}", {"answer": str(a + b)})
                for a, b in [(12, 30), (7, 8), (5, 5)]]
    episodes = Episodes(IsolatedEnvironment(spec), environment, ObservationRenderer(tokenizer))
    evaluator = Evaluator(base, examples, IsolatedScorer(spec), k=2, max_tokens=TURN_TOKENS, temperature=1.0,
                          max_model_len=64, kv_cache_gib=0.125, dtype="float32", seed=0, episodes=episodes)
    try:
        greedy = episodes.play(evaluator.engine, examples, 1, 0.0, TURN_TOKENS)
        figures = evaluator.evaluate()
    finally:
        evaluator.close()
    model = hf_model(base)
    for example, [trajectory] in zip(examples, greedy, strict=True):
        assert trajectory.ended in ("done", "max_turns") and 1 <= len(trajectory.turns) <= MAX_TURNS
        ids = torch.tensor([trajectory.context])
        with torch.no_grad():
            argmax = model(input_ids=ids).logits[0].argmax(-1).tolist()
        position = len(example.prompt_ids)
        for turn in trajectory.turns:  # each sampled token is the argmax given everything before it
            for at in range(position, position + turn.sampled_tokens):
                assert trajectory.context[at] == argmax[at - 1]
            position += turn.sampled_tokens + turn.observation_tokens
    passes = [t.reward > 0.5 for [t] in greedy]
    assert figures["pass@1_greedy"] == np.mean(passes) and figures["examples"] == 3
    assert 1 <= figures["turns_mean"] <= MAX_TURNS and 0 <= figures["pass@2"] <= 1
