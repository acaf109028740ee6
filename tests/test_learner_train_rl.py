"""RL batch assembly and the RL step: the packed layout, advantages, statistics; a GRPO step that raises the
likelihood of positive-advantage completions; packed equals padded; the learner's own old policy when a
batch takes several updates (train.num_iterations)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from learner.algo.logprobs import logprobs_from_hidden
from learner.algo.losses import LossConfig
from learner.algo.optim import OptimizerConfig
from learner.algo.rl_batch import bucket_rows, pack
from learner.algo.train_step import Trainer, packed_hidden
from learner.algo.turn_advantages import trajectory
from learner.mesh import shard_rows
from learner.rl_loop import build_batch
from learner.schema import TokenTIS
from learner.service.group_validation import CompletionRecord
from models.jax_model import load_model, make_mesh
from tandem_wire.turns import TurnRecord

PAD = 0


@dataclasses.dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    reward: float | None
    turns: tuple = ()
    versions: list[int] = dataclasses.field(default_factory=list)  # empty: the group's for every token

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


def _assemble(groups, *, row_tokens, row_multiple=1, current_version=4, dynamic_sampling="off"):
    """What the RL loop does with a step's groups (GRPO's estimator, the trajectory rule)."""
    return build_batch(groups, LossConfig(dynamic_sampling=dynamic_sampling), trajectory, pad_id=PAD,
                       row_tokens=row_tokens, row_multiple=row_multiple, current_version=current_version)


def test_packed_layout_advantages_and_statistics():
    groups = [
        _group("a", [1, 3, 7], [[8, 9, 2], [8, 2], [9, 9, 9, 2], [2]], [1.0, 0.0, None, 0.0], version=3),
        _group("b", [1, 3, 6, 6], [[5, 2], [5, 5], [6], [7, 2]], [1.0, 1.0, 1.0, 1.0], version=1),
    ]
    groups[0].completions[0].versions = [3, 4, 4]  # continued on version 4 after its first token
    batch, stats = _assemble(groups, row_tokens=16, row_multiple=2, dynamic_sampling="drop")
    # 8 sequences of 7, 6, 6, 6, 6, 5, 5, 4 tokens, first-fit decreasing into rows of 16: 3 rows, rounded to 4
    assert batch.input_ids.shape == (4, 16) and batch.advantages.shape == (4, 16)
    # row 0: a's third completion (7 tokens, the longest), then a's first; each its own segment, positions
    # restarting, mask and behaviour logprobs on completion tokens only
    np.testing.assert_array_equal(batch.input_ids[0], [1, 3, 7, 9, 9, 9, 2, 1, 3, 7, 8, 9, 2, PAD, PAD, PAD])
    np.testing.assert_array_equal(batch.segment_ids[0], [1] * 7 + [2] * 6 + [0] * 3)
    np.testing.assert_array_equal(batch.positions[0], [*range(7), *range(6), 0, 0, 0])
    np.testing.assert_array_equal(batch.attention_mask[0], [1] * 13 + [0] * 3)
    np.testing.assert_array_equal(batch.completion_mask[0], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0])
    np.testing.assert_allclose(batch.behaviour_logps[0, 10:13], [-1.0, -1.1, -1.2])
    # group a: scorable rewards [1, 0, 0] → baseline 1/3, std of [1,0,0]; the unscorable one is out
    scorable = np.array([1.0, 0.0, 0.0])
    expected = (scorable - scorable.mean()) / (scorable.std(ddof=1) + 1e-4)
    np.testing.assert_allclose(batch.advantages[0, 10:13], expected[0], rtol=1e-6)
    assert (batch.advantages[0, :7] == 0).all()  # the unscorable completion: no advantage, out of the loss
    # rows 1 and 2 hold b's four (equal rewards: zero signal, dropped) with a's second and fourth
    a_tokens = batch.completion_mask[1:3] > 0
    np.testing.assert_allclose(sorted(batch.advantages[1:3][a_tokens]), [expected[1]] * 3, rtol=1e-6)
    assert a_tokens.sum() == 2 + 1 and batch.segment_ids[1:3].max() == 3
    assert (batch.input_ids[3] == PAD).all() and batch.attention_mask[3].sum() == 0  # the rounding row
    assert stats["zero_signal_group_frac"] == 0.5
    assert stats["unscorable_completions"] == 1
    assert stats["reward_mean"] == pytest.approx(np.mean([1, 0, 0, 1, 1, 1, 1]))
    assert stats["pass_rate"] == pytest.approx(5 / 7)
    assert stats["staleness_mean"] == 2.0 and stats["staleness_max"] == 3.0
    # the histogram: one group 1 version behind (a), one 3 behind (b), none 0 or 2 behind
    assert {k: v for k, v in stats.items() if k.startswith("staleness_groups/")} == {
        "staleness_groups/0": 0, "staleness_groups/1": 1, "staleness_groups/2": 0, "staleness_groups/3": 1}
    # per token: a's first completion has 2 tokens of the current version, a's other 8 tokens are 1 behind, b's 7
    assert {k: v for k, v in stats.items() if k.startswith("staleness_tokens/")} == {
        "staleness_tokens/0": 2, "staleness_tokens/1": 8, "staleness_tokens/2": 0, "staleness_tokens/3": 7}
    assert stats["staleness_tokens_mean"] == pytest.approx((8 + 21) / 17)
    assert stats["loss_tokens"] == 3 + 2 + 1
    assert (stats["sequences"], stats["rows"]) == (8, 4)
    assert stats["padding_fraction"] == pytest.approx(1 - 45 / 64)
    assert "turns_mean" not in stats  # single-turn batches have no turn statistics


def test_row_counts_round_up_to_few_buckets_with_under_a_third_padding():
    """Packing gives another row count nearly every step and each count is an XLA compilation: counts
    round up to row_multiple × (2^k or 3·2^k), two shapes per doubling, padding under a third."""
    assert [bucket_rows(n) for n in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    assert [bucket_rows(n, 8) for n in (1, 8, 9, 54, 73, 99, 121)] == [8, 8, 16, 64, 96, 128, 128]
    for multiple in (1, 2, 8):
        buckets = set()
        for rows in range(1, 1025):
            bucket = bucket_rows(rows, multiple)
            units = -(-rows // multiple)  # what rounding to the multiple alone gave
            assert bucket % multiple == 0 and (bucket - units * multiple) / bucket < 1 / 3, (rows, multiple)
            buckets.add(bucket)
        assert len(buckets) <= 2 * np.log2(1024 / multiple) + 1, (multiple, sorted(buckets))
    # five groups (5 rows of 2 sequences of 4 tokens) and six (6 rows): one shape
    groups = [_group(f"g{i}", [1, 3], [[5, 2], [6, 2]], [1.0, 0.0]) for i in range(6)]
    five, _ = _assemble(groups[:5], row_tokens=8)
    six, stats = _assemble(groups, row_tokens=8)
    assert five.input_ids.shape == six.input_ids.shape == (6, 8) and stats["rows"] == 6  # 2 sequences a row
    assert five.attention_mask[5:].sum() == 0 and five.completion_mask[5:].sum() == 0  # the bucket's padding


def test_first_fit_decreasing_packs_longest_first_and_refuses_what_no_row_holds():
    assert pack([3, 9, 4, 6, 2], 10) == [[1], [3, 2], [0, 4]]  # 9 | 6+4 | 3+2
    assert pack([5, 5, 5], 10) == [[0, 1], [2]]  # ties keep their order
    with pytest.raises(ValueError, match="exceeds a row of 10"):
        pack([4, 11], 10)


def test_packing_pads_under_five_percent_on_gsm8k_shaped_lengths():
    """GSM8K-shaped RL batches (the qwen config's: prompts of ~60-250 tokens, 8 completions each of up to
    512, most short, a few truncated): packed into rows of the longest sequence, padding is under 5 % of
    the tokens; padded one per row to power-of-two buckets (what the learner did before) it was most."""
    rng = np.random.default_rng(0)
    prompts = rng.integers(60, 250, 32)
    completions = np.minimum(rng.lognormal(np.log(180), 0.6, (32, 8)).astype(int) + 1, 512)
    lengths = (prompts[:, None] + completions).ravel()
    row_tokens = 250 + 512
    rows = pack(list(lengths), row_tokens)
    packed_padding = 1 - lengths.sum() / (len(rows) * row_tokens)
    bucket = 2 ** int(np.ceil(np.log2(lengths.max())))
    padded_padding = 1 - lengths.sum() / (len(lengths) * bucket)
    assert packed_padding <= 0.05, packed_padding
    assert padded_padding > 0.5, padded_padding


def test_multi_turn_rows_hold_every_turn_and_observation_with_the_observations_out_of_the_loss():
    turns = [TurnRecord(2, 3, 3), TurnRecord(1, 0, 4, reward=1.0)]  # 2 sampled, 3 observed, 1 sampled
    multi = CompletionRecord([8, 2, 4, 5, 6, 9], [-0.1, -0.2, 0, 0, 0, -0.3], "stop", 1.0, None, turns=turns)
    single = CompletionRecord([9, 2], [-0.5, -0.6], "stop", 0.0, None)
    group = Group("m", 3, [1, 3], [multi, single])
    batch, stats = _assemble([group], row_tokens=8)
    np.testing.assert_array_equal(batch.input_ids[0], [1, 3, 8, 2, 4, 5, 6, 9])
    np.testing.assert_array_equal(batch.attention_mask[0], [1] * 8)
    advantage = 1 / np.sqrt(2)  # rewards [1, 0]: ±(0.5 / std) with the unbiased std √0.5
    np.testing.assert_allclose(batch.completion_mask[0], [0, 0, 1, 1, 0, 0, 0, 1])
    np.testing.assert_allclose(batch.behaviour_logps[0], [0, 0, -0.1, -0.2, 0, 0, 0, -0.3], rtol=1e-6)
    np.testing.assert_allclose(batch.advantages[0], advantage * batch.completion_mask[0], rtol=1e-3)
    np.testing.assert_allclose(batch.advantages[1], -advantage * batch.completion_mask[1], rtol=1e-3)
    assert stats["loss_tokens"] == 3 + 2
    assert (stats["turns_mean"], stats["turns_max"], stats["observation_tokens"]) == (1.5, 2.0, 3.0)


def test_a_trajectory_split_by_its_template_takes_a_sequence_per_sample_with_its_own_prompt():
    # turn 1 samples [8, 2]; the template could not extend the conversation, so turn 2 was sampled from
    # the conversation rendered afresh ([1, 3, 8, 2, 4, 5]) and its sample starts there
    turns = [TurnRecord(2, 0, 3, reward=0.0), TurnRecord(2, 0, 3, reward=1.0, context_ids=[1, 3, 8, 2, 4, 5])]
    split = CompletionRecord([8, 2, 6, 9], [-0.1, -0.2, -0.3, -0.4], "stop", 1.0, None, turns=turns)
    single = CompletionRecord([9, 2], [-0.5, -0.6], "stop", 0.0, None)
    group = Group("s", 3, [1, 3], [split, single])
    batch, stats = _assemble([group], row_tokens=8, row_multiple=2)
    assert batch.input_ids.shape == (2, 8)  # 8 + (4 + 4) tokens: two rows
    np.testing.assert_array_equal(batch.input_ids[0], [1, 3, 8, 2, 4, 5, 6, 9])
    np.testing.assert_array_equal(batch.input_ids[1], [1, 3, 8, 2, 1, 3, 9, 2])
    np.testing.assert_array_equal(batch.segment_ids[1], [1, 1, 1, 1, 2, 2, 2, 2])
    np.testing.assert_allclose(batch.completion_mask[0], [0, 0, 0, 0, 0, 0, 1, 1])
    np.testing.assert_allclose(batch.behaviour_logps[0], [0, 0, 0, 0, 0, 0, -0.3, -0.4], rtol=1e-6)
    advantage = 1 / np.sqrt(2)  # both samples of the trajectory carry its advantage
    np.testing.assert_allclose(batch.advantages[0], advantage * batch.completion_mask[0], rtol=1e-3)
    np.testing.assert_allclose(batch.advantages[1, :4], advantage * batch.completion_mask[1, :4], rtol=1e-3)
    assert stats["split_samples"] == 1 and stats["loss_tokens"] == 6 and stats["sequences"] == 3


def test_assembly_rejects_bad_groups():
    group = _group("a", [1, 3], [[5, 2], [6, 2]], [1.0, 0.0])
    with pytest.raises(ValueError, match="exceeds a row"):
        _assemble([group], row_tokens=3)
    with pytest.raises(ValueError, match="same positive number"):
        _assemble([group, _group("b", [1], [[5]], [1.0])], row_tokens=8)
    broken = _group("c", [1], [[5, 2], [6]], [1.0, 0.0])
    broken.completions[0].logprobs = [-1.0]
    with pytest.raises(ValueError, match="behaviour logprobs"):
        _assemble([broken], row_tokens=8)


@nnx.jit
def _logprobs(model, input_ids, segment_ids, positions):
    hidden = packed_hidden(model, input_ids, segment_ids, positions)[:, :-1]
    return logprobs_from_hidden(model, hidden, input_ids[:, 1:], chunk_tokens=None)[0]


def _batch_logprobs(model, mesh, batch) -> np.ndarray:
    """[B, T-1] log p(token t+1 | ≤ t within its sequence) under `model`, temperature 1."""
    with jax.set_mesh(mesh):
        return np.asarray(_logprobs(model, *(jnp.asarray(x) for x in (batch.input_ids, batch.segment_ids,
                                                                      batch.positions))))


def _on_policy_batch(model, mesh, row_tokens=16):
    """Two prompts × 4 completions, packed; behaviour logprobs = the model's own (on-policy, temperature 1)."""
    rng = np.random.default_rng(1)
    prompts = [[1, 3, 6, 15, 7, 4], [1, 3, 8, 15, 9, 4]]
    rewards = [[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]]
    groups = []
    for g, prompt in enumerate(prompts):
        completions = [list(rng.integers(5, 20, size=n)) + [2] for n in (3, 5, 4, 2)]
        groups.append(_group(f"g{g}", prompt, completions, rewards[g], version=0))
    batch, stats = _assemble(groups, row_tokens=row_tokens, current_version=0)
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


def _loss_and_grads(trainer, batch):
    """The rl loss of a whole batch (one micro-batch) and its gradient w.r.t. the master weights."""
    with jax.set_mesh(trainer.mesh):
        arrays = shard_rows(trainer.mesh, batch._asdict())
        norm = trainer._normalizer(arrays, "rl")
        (loss, (metrics, _)), grads = jax.value_and_grad(trainer._rl_loss, has_aux=True)(
            trainer.state.params, arrays, norm, None, trainer._frozen, np.float32(trainer.entropy_control.coef),
            given_old=False)
        return float(loss), metrics, [np.asarray(g) for g in jax.tree.leaves(grads)]


@pytest.mark.parametrize("loss", [LossConfig(), LossConfig(algorithm="gspo", aggregation="seq-mean-token-mean"),
                                  LossConfig(correction=TokenTIS(cap=1.1)), LossConfig(entropy_coef=0.1)],
                         ids=["grpo", "gspo", "token_tis", "entropy_bonus"])
def test_packed_and_padded_batches_give_the_same_loss_and_gradients(hf_dir, loss):
    """The same groups in rows of 16 tokens (one sequence a row: the padded layout) and of 64 (packed, four
    a row): every sequence attends only to itself with positions from 0, so loss and gradients agree."""
    mesh = make_mesh(1, 1)
    loaded = load_model(hf_dir, mesh=mesh)
    padded, _ = _on_policy_batch(loaded.model, mesh, row_tokens=16)
    groups_again, _ = _on_policy_batch(loaded.model, mesh, row_tokens=64)
    trainer = Trainer(loaded, mesh, OptimizerConfig(learning_rate=1e-3), loss=loss)
    results = []
    for batch in (padded, groups_again):  # off-policy: a behaviour that differs from the model, by token id
        shift = (0.3 * (batch.input_ids % 3) - 0.3).astype(np.float32) * (batch.completion_mask > 0)
        results.append(_loss_and_grads(trainer, batch._replace(behaviour_logps=batch.behaviour_logps + shift)))
    assert padded.segment_ids.max() == 1 and groups_again.segment_ids.max() >= 3
    assert groups_again.input_ids.shape[0] < padded.input_ids.shape[0]
    (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = results
    assert loss_a == pytest.approx(loss_b, abs=1e-6) and abs(loss_a) > 1e-3
    for name in ("ratio_mean", "clip_frac_high", "is_ratio_mean", "behaviour_gap"):
        assert float(metrics_a[name]) == pytest.approx(float(metrics_b[name]), abs=1e-6), name
    for a, b in zip(grads_a, grads_b, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert max(float(np.abs(g).max()) for g in grads_a) > 1e-3


def _three_updates(hf_dir, loss, *, given_old=True):
    """Three updates on one on-policy batch at a large learning rate, as train.num_iterations=3 runs them."""
    mesh = make_mesh(1, 1)
    loaded = load_model(hf_dir, mesh=mesh)
    batch, _ = _on_policy_batch(loaded.model, mesh)
    trainer = Trainer(loaded, mesh, OptimizerConfig(learning_rate=3e-2, max_grad_norm=None), loss=loss)
    updates = [trainer.rl_step(batch)]
    old = trainer.last_logps if given_old else None
    params_after_first = [np.asarray(x) for x in jax.tree.leaves(trainer.state.params)]
    updates += [trainer.rl_step(batch, old_logps=old) for _ in range(2)]
    return updates, params_after_first


def test_later_updates_of_a_batch_clip_against_the_learners_old_policy_under_a_correction(hf_dir):
    """With a reweighting correction the clip is taken against π_old, the learner's pre-update policy. Before
    the fix π_old was sg[π_θ] on every update: the ratio stayed 1 and the trust region was gone (0 % clipped
    where the same updates without the correction clip ~28 %)."""
    with_tis, _ = _three_updates(hf_dir, LossConfig(correction=TokenTIS(cap=2.0)))
    assert with_tis[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # the first update: π_old is π_θ
    for later in with_tis[1:]:
        assert later["clip_frac_low"] + later["clip_frac_high"] > 0.05, later
        assert abs(later["ratio_mean"] - 1.0) > 0.01, later
    broken, _ = _three_updates(hf_dir, LossConfig(correction=TokenTIS(cap=2.0)), given_old=False)
    assert all(u["clip_frac_low"] + u["clip_frac_high"] == 0 for u in broken)  # the defect, reproduced


def test_a_batchs_first_update_is_unchanged_by_the_later_ones(hf_dir):
    """train.num_iterations=1 runs exactly the first update of num_iterations=3: same parameters, to the bit."""
    mesh = make_mesh(1, 1)
    loaded = load_model(hf_dir, mesh=mesh)
    batch, _ = _on_policy_batch(loaded.model, mesh)
    single = Trainer(loaded, mesh, OptimizerConfig(learning_rate=3e-2, max_grad_norm=None), loss=LossConfig())
    single.rl_step(batch)
    _, first_of_three = _three_updates(hf_dir, LossConfig())
    for a, b in zip([np.asarray(x) for x in jax.tree.leaves(single.state.params)], first_of_three, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_entropy_bonus_reaches_the_compiled_step_and_its_adaptive_coefficient_moves(hf_dir):
    """The same on-policy batch, three updates each: with the bonus the policy's entropy ends higher than
    without it (same data, same optimizer); with an entropy target above the policy's entropy the
    coefficient each update reports climbs by Δ (the first update has none: c_0 = 0), and the compiled step is
    not rebuilt for a new value."""
    mesh = make_mesh(1, 1)
    entropies, coefs = {}, []
    for name, loss in [("plain", LossConfig()), ("bonus", LossConfig(entropy_coef=1.0)),
                       ("adaptive", LossConfig(entropy_target=50.0, entropy_coef_step=2.0))]:
        loaded = load_model(hf_dir, mesh=mesh)
        batch, _ = _on_policy_batch(loaded.model, mesh)
        trainer = Trainer(loaded, mesh, OptimizerConfig(learning_rate=2e-3, max_grad_norm=None), loss=loss)
        steps = [trainer.rl_step(batch) for _ in range(3)]
        entropies[name] = [s["entropy"] for s in steps]
        if name == "adaptive":
            coefs = [s["entropy_coef"] for s in steps]
            assert len(trainer._steps) == 1
    assert entropies["plain"][0] == pytest.approx(entropies["bonus"][0], rel=1e-6)  # the same start
    # the near-uniform tiny model (H ≈ ln 48 = 3.87): GRPO alone lowers H by ~0.005 in three updates
    assert entropies["plain"][-1] < entropies["plain"][0] - 2e-3, entropies
    assert entropies["bonus"][-1] > entropies["plain"][-1] + 2e-3, entropies
    assert coefs == [0.0, 2.0, 4.0]
    assert entropies["adaptive"][-1] > entropies["plain"][-1] + 5e-4, entropies
