"""RL batch assembly and the RL step: padded layout, advantages, statistics, and a GRPO step that
raises the likelihood of positive-advantage completions."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from learner_train_helpers import tiny_model_dir

from learner.algo.logprobs import per_token_logprobs
from learner.algo.losses import LossConfig
from learner.algo.optim import OptimizerConfig
from learner.algo.rl_batch import assemble_rl_batch, pow2_buckets
from learner.algo.train_step import Trainer
from learner.service.group_validation import CompletionRecord, TurnRecord
from models.jax_model import load_model, make_mesh

PAD = 0


@dataclasses.dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    reward: float | None
    turns: tuple = ()

    @property
    def loss_mask(self) -> np.ndarray:
        return np.ones(len(self.token_ids), np.float32)

    def samples(self, prompt_ids: list[int]) -> list[tuple[list[int], int, int]]:
        return [(prompt_ids, 0, len(self.token_ids))]


@dataclasses.dataclass
class Group:
    group_id: str
    policy_version: int
    prompt_ids: list[int]
    completions: list[Completion]


def _group(gid: str, prompt: list[int], completions: list[list[int]], rewards: list[float | None],
           version: int = 3) -> Group:
    return Group(gid, version, prompt, [Completion(c, [-1.0 - 0.1 * i for i in range(len(c))], r)
                                        for c, r in zip(completions, rewards, strict=True)])


def test_assembly_layout_advantages_and_statistics():
    groups = [
        _group("a", [1, 3, 7], [[8, 9, 2], [8, 2], [9, 9, 9, 2], [2]], [1.0, 0.0, None, 0.0], version=3),
        _group("b", [1, 3, 6, 6], [[5, 2], [5, 5], [6], [7, 2]], [1.0, 1.0, 1.0, 1.0], version=1),
    ]
    batch, stats = assemble_rl_batch(groups, pad_id=PAD, current_version=4, length_buckets=(8, 16),
                                     num_rows=10, dynamic_sampling="drop")
    assert batch.input_ids.shape == (10, 8) and batch.advantages.shape == (10, 8)
    # row 2: prompt then completion, right-padded; mask and behaviour logprobs on completion tokens only
    np.testing.assert_array_equal(batch.input_ids[2], [1, 3, 7, 9, 9, 9, 2, PAD])
    np.testing.assert_array_equal(batch.attention_mask[0], [1, 1, 1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(batch.completion_mask[0], [0, 0, 0, 1, 1, 1, 0, 0])
    np.testing.assert_allclose(batch.behaviour_logps[0], [0, 0, 0, -1.0, -1.1, -1.2, 0, 0])
    # group a: scorable rewards [1, 0, 0] → baseline 1/3, std of [1,0,0]; the unscorable one is out
    scorable = np.array([1.0, 0.0, 0.0])
    expected = (scorable - scorable.mean()) / (scorable.std(ddof=1) + 1e-4)
    np.testing.assert_allclose(batch.advantages[[0, 1, 3], 3], expected, rtol=1e-6)
    # a completion's advantage is on each of its tokens, and nowhere else
    np.testing.assert_allclose(batch.advantages[0], expected[0] * batch.completion_mask[0], rtol=1e-6)
    assert (batch.advantages[2] == 0).all() and batch.completion_mask[2].sum() == 0
    # group b has equal rewards: zero signal, dropped from the loss; padding rows are empty
    assert (batch.advantages[4:] == 0).all() and batch.completion_mask[4:].sum() == 0
    assert (batch.input_ids[8:] == PAD).all() and batch.attention_mask[8:].sum() == 0
    assert stats["zero_signal_group_frac"] == 0.5
    assert stats["unscorable_completions"] == 1
    assert stats["reward_mean"] == pytest.approx(np.mean([1, 0, 0, 1, 1, 1, 1]))
    assert stats["pass_rate"] == pytest.approx(5 / 7)
    assert stats["staleness_mean"] == 2.0 and stats["staleness_max"] == 3.0
    # the histogram: one group 1 version behind (a), one 3 behind (b), none 0 or 2 behind
    assert {k: v for k, v in stats.items() if k.startswith("staleness_groups/")} == {
        "staleness_groups/0": 0, "staleness_groups/1": 1, "staleness_groups/2": 0, "staleness_groups/3": 1}
    assert stats["loss_tokens"] == 3 + 2 + 1
    assert "turns_mean" not in stats  # single-turn batches have no turn statistics


def test_multi_turn_rows_hold_every_turn_and_observation_with_the_observations_out_of_the_loss():
    turns = [TurnRecord(2, 3, 3), TurnRecord(1, 0, 4, reward=1.0)]  # 2 sampled, 3 observed, 1 sampled
    multi = CompletionRecord([8, 2, 4, 5, 6, 9], [-0.1, -0.2, 0, 0, 0, -0.3], "stop", 1.0, None, turns=turns)
    single = CompletionRecord([9, 2], [-0.5, -0.6], "stop", 0.0, None)
    group = Group("m", 3, [1, 3], [multi, single])
    batch, stats = assemble_rl_batch([group], pad_id=PAD, current_version=4, length_buckets=(8,))
    np.testing.assert_array_equal(batch.input_ids[0], [1, 3, 8, 2, 4, 5, 6, 9])
    np.testing.assert_array_equal(batch.attention_mask[0], [1] * 8)
    advantage = 1 / np.sqrt(2)  # rewards [1, 0]: ±(0.5 / std) with the unbiased std √0.5
    np.testing.assert_allclose(batch.completion_mask[0], [0, 0, 1, 1, 0, 0, 0, 1])
    np.testing.assert_allclose(batch.behaviour_logps[0], [0, 0, -0.1, -0.2, 0, 0, 0, -0.3], rtol=1e-6)
    np.testing.assert_allclose(batch.advantages[0], advantage * batch.completion_mask[0], rtol=1e-3)
    np.testing.assert_allclose(batch.advantages[1], -advantage * batch.completion_mask[1], rtol=1e-3)
    assert stats["loss_tokens"] == 3 + 2
    assert (stats["turns_mean"], stats["turns_max"], stats["observation_tokens"]) == (1.5, 2.0, 3.0)


def test_a_trajectory_split_by_its_template_takes_a_row_per_sample_with_its_own_prompt():
    # turn 1 samples [8, 2]; the template could not extend the conversation, so turn 2 was sampled from
    # the conversation rendered afresh ([1, 3, 8, 2, 4, 5]) and its sample's row starts there
    turns = [TurnRecord(2, 0, 3, reward=0.0), TurnRecord(2, 0, 3, reward=1.0, context_ids=[1, 3, 8, 2, 4, 5])]
    split = CompletionRecord([8, 2, 6, 9], [-0.1, -0.2, -0.3, -0.4], "stop", 1.0, None, turns=turns)
    single = CompletionRecord([9, 2], [-0.5, -0.6], "stop", 0.0, None)
    group = Group("s", 3, [1, 3], [split, single])
    batch, stats = assemble_rl_batch([group], pad_id=PAD, current_version=3, length_buckets=(8,), num_rows=2)
    assert batch.input_ids.shape == (4, 8)  # 3 samples: the rows round up to a multiple of num_rows
    np.testing.assert_array_equal(batch.input_ids[0], [1, 3, 8, 2, PAD, PAD, PAD, PAD])
    np.testing.assert_array_equal(batch.input_ids[1], [1, 3, 8, 2, 4, 5, 6, 9])
    np.testing.assert_array_equal(batch.input_ids[2], [1, 3, 9, 2, PAD, PAD, PAD, PAD])
    np.testing.assert_allclose(batch.completion_mask[1], [0, 0, 0, 0, 0, 0, 1, 1])
    np.testing.assert_allclose(batch.behaviour_logps[1], [0, 0, 0, 0, 0, 0, -0.3, -0.4], rtol=1e-6)
    advantage = 1 / np.sqrt(2)  # both samples of the trajectory carry its advantage
    np.testing.assert_allclose(batch.advantages[0], advantage * batch.completion_mask[0], rtol=1e-3)
    np.testing.assert_allclose(batch.advantages[1], advantage * batch.completion_mask[1], rtol=1e-3)
    assert not batch.attention_mask[3].any() and stats["split_samples"] == 1 and stats["loss_tokens"] == 6


def test_assembly_picks_the_smallest_bucket_and_rejects_bad_groups():
    assert pow2_buckets(100, 16) == (16, 32, 64, 100)
    group = _group("a", [1, 3], [[5, 2], [6, 2]], [1.0, 0.0])
    batch, _ = assemble_rl_batch([group], pad_id=PAD, current_version=3, length_buckets=(16, 4, 8))
    assert batch.input_ids.shape == (2, 4)
    with pytest.raises(ValueError, match="largest length bucket"):
        assemble_rl_batch([group], pad_id=PAD, current_version=3, length_buckets=(3,))
    with pytest.raises(ValueError, match="same positive number"):
        assemble_rl_batch([group, _group("b", [1], [[5]], [1.0])], pad_id=PAD, current_version=3,
                          length_buckets=(8,))
    broken = _group("c", [1], [[5, 2], [6]], [1.0, 0.0])
    broken.completions[0].logprobs = [-1.0]
    with pytest.raises(ValueError, match="behaviour logprobs"):
        assemble_rl_batch([broken], pad_id=PAD, current_version=3, length_buckets=(8,))
    with pytest.raises(ValueError, match="num_rows"):
        assemble_rl_batch([group], pad_id=PAD, current_version=3, length_buckets=(8,), num_rows=1)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny"))


@nnx.jit
def _logprobs(model, input_ids, attention_mask):
    return per_token_logprobs(model, input_ids, attention_mask, chunk_tokens=None)[0]


def _batch_logprobs(model, mesh, batch) -> np.ndarray:
    """[B, T-1] log p(token t+1 | ≤ t) under `model`, temperature 1."""
    with jax.set_mesh(mesh):
        return np.asarray(_logprobs(model, jnp.asarray(batch.input_ids),
                                    jnp.asarray(batch.attention_mask)))


def _on_policy_batch(model, mesh):
    """Two prompts × 4 completions; behaviour logprobs = the model's own (on-policy, temperature 1)."""
    rng = np.random.default_rng(1)
    prompts = [[1, 3, 6, 15, 7, 4], [1, 3, 8, 15, 9, 4]]
    rewards = [[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]]
    groups = []
    for g, prompt in enumerate(prompts):
        completions = [list(rng.integers(5, 20, size=n)) + [2] for n in (3, 5, 4, 2)]
        groups.append(_group(f"g{g}", prompt, completions, rewards[g], version=0))
    batch, stats = assemble_rl_batch(groups, pad_id=PAD, current_version=0, length_buckets=(16,))
    logps = _batch_logprobs(model, mesh, batch)
    behaviour = np.zeros_like(batch.behaviour_logps)
    behaviour[:, 1:] = np.where(batch.completion_mask[:, 1:] > 0, logps, 0.0)
    return batch._replace(behaviour_logps=behaviour), stats


def _completion_logprob_sums(trainer, batch) -> np.ndarray:
    logps = _batch_logprobs(trainer.model, trainer.mesh, batch)
    return (logps * (batch.completion_mask[:, 1:] > 0)).sum(-1)


def test_grpo_steps_raise_the_likelihood_of_positive_advantage_completions(hf_dir):
    mesh = make_mesh(1, 1)
    loaded = load_model(hf_dir, mesh=mesh)
    batch, stats = _on_policy_batch(loaded.model, mesh)
    trainer = Trainer(loaded, mesh, OptimizerConfig(learning_rate=2e-3, max_grad_norm=None),
                      loss=LossConfig(beta=0.05))
    before = _completion_logprob_sums(trainer, batch)
    first = trainer.rl_step(batch)
    # On-policy first step: ratio 1, no clipping, KL 0; token-mean loss = −Σ_i A_i·n_i / N_tok.
    tokens = (batch.completion_mask[:, 1:] > 0).sum(-1)
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first["clip_frac_low"] == 0 and first["clip_frac_high"] == 0
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)
    assert first["loss"] == pytest.approx(-(batch.advantages * batch.completion_mask).sum() / tokens.sum(),
                                          abs=1e-5)
    for _ in range(4):
        last = trainer.rl_step(batch)
    after = _completion_logprob_sums(trainer, batch)
    delta = after - before
    row_advantage = batch.advantages.sum(1)
    assert (delta[row_advantage > 0] > 0.05).all(), delta
    assert (delta[row_advantage < 0] < 0).all(), delta
    assert last["kl"] > 0 and stats["zero_signal_group_frac"] == 0


def test_per_token_advantages_move_each_turn_its_own_way(hf_dir):
    """A row's first half (turn 1) gets +1 and its second half (turn 2) −1: the steps raise the one and
    lower the other within the same completion, so per-turn credit reaches the gradient."""
    mesh = make_mesh(1, 1)
    loaded = load_model(hf_dir, mesh=mesh)
    batch, _ = _on_policy_batch(loaded.model, mesh)
    positions = np.cumsum(batch.completion_mask, axis=1) * batch.completion_mask
    first_half = (positions > 0) & (positions <= batch.completion_mask.sum(1, keepdims=True) / 2)
    second_half = (positions > 0) & ~first_half
    batch = batch._replace(advantages=(first_half.astype(np.float32) - second_half).astype(np.float32))
    trainer = Trainer(loaded, mesh, OptimizerConfig(learning_rate=2e-3, max_grad_norm=None), loss=LossConfig())
    before = _batch_logprobs(trainer.model, mesh, batch)
    for _ in range(3):
        trainer.rl_step(batch)
    delta = _batch_logprobs(trainer.model, mesh, batch) - before
    assert (delta * first_half[:, 1:]).sum() > 0.5 and (delta * second_half[:, 1:]).sum() < -0.5, delta


def test_a_step_compiled_ahead_starts_without_compiling_and_updates_as_before(hf_dir):
    """RLLoop compiles the step while the first groups are sampled (Trainer.compile_rl_step); the
    first step of that shape then neither compiles nor loads anything, and makes the update a cold
    step makes. (A load is a hit in JAX's persistent compilation cache, which the suite turns on.)"""
    mesh = make_mesh(1, 1)
    batch, _ = _on_policy_batch(load_model(hf_dir, mesh=mesh).model, mesh)
    built: list[str] = []  # executables compiled, or loaded from the persistent cache

    def on_compile(event: str, duration_secs: float, **_: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            built.append(event)

    def on_event(event: str, **_: object) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            built.append(event)

    jax.monitoring.register_event_duration_secs_listener(on_compile)
    jax.monitoring.register_event_listener(on_event)
    try:
        params = {}
        for ahead in (True, False):
            trainer = Trainer(load_model(hf_dir, mesh=mesh), mesh, OptimizerConfig(learning_rate=2e-3))
            built.clear()
            if ahead:
                trainer.compile_rl_step(*batch.input_ids.shape)
                assert built  # it compiled
                built.clear()
            trainer.rl_step(batch)
            params[ahead] = [np.asarray(x) for x in jax.tree.leaves(trainer.state.params)]
            assert bool(built) != ahead, (ahead, built)  # compiled ahead: nothing left to build
        shorter = batch._replace(**{k: v[:, :-1] for k, v in batch._asdict().items() if v.ndim == 2})
        trainer.rl_step(shorter)
        assert built  # another shape still compiles on first use
    finally:
        jax.monitoring.unregister_event_duration_listener(on_compile)
        jax.monitoring.unregister_event_listener(on_event)
    for cold, warm in zip(params[False], params[True], strict=True):
        np.testing.assert_array_equal(cold, warm)
