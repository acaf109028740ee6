"""The real RL loop, fed over real gRPC: DAPO dynamic sampling ('fill') and the jump guard.

An actor thread (a real LearnerClient on loopback) leases prompts and answers each with a group
whose rewards are all equal (zero signal) for every other prompt, mixed for the rest. With
`dynamic_sampling: fill` every step must train on exactly P groups with signal, the zero-signal
groups must be retired and counted once, and the exactly-once accounting must balance. The guard
must stop a run, or roll it back to its checkpoint, at the step whose update norm jumps.
"""

from __future__ import annotations

import threading

import pytest
from reliability_helpers import ENROLLMENT_KEY, GROUP_SIZE, PROMPTS_PER_STEP, build_learner, tiny_run
from wire_helpers import CAPABILITIES

import tests.user_policy_loss  # noqa: F401  (registers `user_reinforce`, as a user's import would)
from actors.learner_client import LearnerClient
from learner.algo.advantages import has_signal
from learner.rl_loop import RLLoop
from learner.service.accounting import balance_violations
from tandem_wire import WIRE_VERSION, enrollment, pb
from tests import user_estimator

STEPS = 3


def _group(lease, actor_id: str, version: int, zero_signal: bool) -> pb.ScoredGroup:
    group = pb.ScoredGroup(wire_version=WIRE_VERSION, group_id=lease.group_id, actor_id=actor_id,
                           policy_version=version, prompt_token_ids=lease.prompt_ids, metadata=lease.metadata,
                           timings=pb.Timings(sample_seconds=0.1, score_seconds=0.01))
    for i in range(GROUP_SIZE):
        group.completions.add(token_ids=[7, 8, 2], logprobs=[-1.0, -1.5, -0.5], token_versions=[version] * 3,
                              finish_reason=pb.FINISH_REASON_STOP, text="x",
                              reward=0.0 if zero_signal else float(i % 2))
    return group


def _actor(address: str, stop: threading.Event, latest_version) -> None:
    # build_learner's learner admits the ids enrolled under the tests' key, as a fleet's actors are
    client = LearnerClient(address, "actor-fill", enrollment=enrollment.token(ENROLLMENT_KEY, "actor-fill"))
    client.register({**CAPABILITIES, "group_size": GROUP_SIZE, "max_model_len": 64}, weight_version=0)
    served = 0
    try:
        while not stop.is_set():
            newest = latest_version()  # it samples with the newest weights, and says so as actors do
            if newest != served and client.report_weights(newest, applied=True):  # (refused until published)
                served = newest
            leases = client.lease_prompts(4).prompts
            for lease in leases:
                if client.is_unacked(lease.group_id):  # re-issued after its lease expired; already sent
                    continue
                zero = int(lease.group_id.split(":")[1]) % 2 == 0  # key "epoch:index": every other prompt
                try:
                    client.send_group(_group(lease, "actor-fill", latest_version(), zero), timeout=5)
                except TimeoutError:  # the learner is busy (compiling): the group stays queued in the client
                    pass
            if not leases:
                stop.wait(0.05)
    finally:
        client.close()


def _run_loop(run, on_step=None, jump_at_update: int | None = None) -> tuple[RLLoop, dict]:
    """Start the run's learner, feed it from an actor thread until the loop returns; on_step gets
    (loop, step, metrics). With
    jump_at_update=k the k-th update reports a 100× update norm (the real one otherwise)."""
    loop = build_learner(run)
    if jump_at_update is not None:
        real_step, calls = loop.trainer.rl_step, []

        def rl_step(batch):
            metrics = real_step(batch)
            calls.append(metrics)
            if len(calls) == jump_at_update:
                metrics["update_norm"] = 100 * calls[0]["update_norm"]
            return metrics

        loop.trainer.rl_step = rl_step
    address = loop.start("127.0.0.1:0")
    stop = threading.Event()
    actor = threading.Thread(target=_actor, args=(address, stop, lambda: loop.version), daemon=True)
    actor.start()
    try:
        accounting = loop.run(on_step=None if on_step is None else lambda step, m: on_step(loop, step, m))
    finally:
        stop.set()
        actor.join(timeout=30)
        loop.service.stop(grace=0)
        loop.checkpointer.close()
    return loop, accounting


@pytest.mark.parametrize("mode", ["fill", "off"])
def test_fill_trains_on_p_groups_with_signal_and_accounting_balances(tmp_path, mode):
    run = tiny_run(tmp_path / mode, steps=STEPS, checkpoint_every=10, overrides=[f"algo.dynamic_sampling='{mode}'"])
    trained: list[list[bool]] = []
    loop, accounting = _run_loop(run, on_step=lambda loop, step, m: trained.append(
        [has_signal([c.reward for c in g.completions]) for g in loop.last_groups]))

    assert balance_violations(accounting) == []
    assert len(trained) == STEPS
    dropped = loop.counts["groups_zero_signal_dropped"]
    if mode == "fill":
        assert all(len(step) == PROMPTS_PER_STEP and all(step) for step in trained)
        assert dropped > 0
        # every consumed group was either trained on or dropped as zero-signal, each counted once
        assert accounting["groups_consumed"] == STEPS * PROMPTS_PER_STEP + dropped
    else:
        assert dropped == 0
        assert accounting["groups_consumed"] == STEPS * PROMPTS_PER_STEP
        assert not all(all(step) for step in trained)  # zero-signal groups were trained on


GUARD = ["train.guard.min_history=2", "train.guard.window=3", "algo.dynamic_sampling=fill"]


def test_guard_stops_the_run_at_the_jump_and_keeps_the_checkpoint_before_it(tmp_path):
    run = tiny_run(tmp_path / "stop", steps=6, checkpoint_every=1, overrides=[*GUARD, "train.guard.action=stop"])
    loop, accounting = _run_loop(run, jump_at_update=4)
    assert balance_violations(accounting) == []
    (event,) = loop.guard_events
    assert event == {"step": 4, "action": "stop", "reason": event["reason"]}
    assert "update_norm jumped" in event["reason"] and loop.stopped_by_guard.startswith("stopped at step 4")
    assert loop.step == 4 and loop.checkpointer.latest_step() == 3  # the jumped params were not saved


def test_guard_rolls_back_to_the_last_checkpoint_and_goes_on(tmp_path):
    run = tiny_run(tmp_path / "rollback", steps=6, checkpoint_every=1,
                   overrides=[*GUARD, "train.guard.action=rollback"])
    rolled: dict[int, float] = {}
    loop, accounting = _run_loop(run, jump_at_update=4, on_step=lambda loop, step, m: rolled.update(
        {step: m["rolled_back_to_step"]} if "rolled_back_to_step" in m else {}))
    assert balance_violations(accounting) == []
    assert [(e["step"], e["action"]) for e in loop.guard_events] == [(4, "rollback")]
    assert rolled == {4: 3.0} and loop.counts["rollbacks"] == 1
    assert loop.step == 6 and not loop.stopped_by_guard
    assert int(loop.trainer.state.step) == 5  # 6 updates, the 4th undone


def test_finish_early_ends_the_run_after_that_step_checkpointed(tmp_path):
    """What train.stop_at does when an evaluation meets its target: the loop ends after the step whose
    on_step asked, with that step checkpointed although it is not due (checkpoint_every=10), and the
    exactly-once accounting balances as at a last step."""
    run = tiny_run(tmp_path / "early", steps=6, checkpoint_every=10, overrides=["algo.dynamic_sampling=fill"])
    loop, accounting = _run_loop(run, on_step=lambda loop, step, m: step == 2 and loop.finish_early("target met"))
    assert balance_violations(accounting) == []
    assert loop.step == 2 and loop.finished_early == "finished at step 2: target met"
    assert loop.checkpointer.all_steps() == [2]
    assert accounting["groups_consumed"] == 2 * PROMPTS_PER_STEP + loop.counts["groups_zero_signal_dropped"]


def test_num_iterations_reuses_each_batch_and_publishes_once_per_step(tmp_path):
    """train.num_iterations=3: three AdamW updates on each batch, the last two against a policy that
    has moved (its ratio to the behaviour logprobs differs from the first update's), one weight
    version per step; the accounting is the same as with one update."""
    run = tiny_run(tmp_path / "mu", steps=STEPS, checkpoint_every=10,
                   overrides=["algo.dynamic_sampling=fill", "train.num_iterations=3"])
    metrics: list[dict] = []
    loop, accounting = _run_loop(run, on_step=lambda loop, step, m: metrics.append(m))
    assert balance_violations(accounting) == []
    assert accounting["groups_consumed"] == STEPS * PROMPTS_PER_STEP + loop.counts["groups_zero_signal_dropped"]
    assert int(loop.trainer.state.step) == 3 * STEPS
    assert loop.version == STEPS  # published once per step, not per update
    for m in metrics:
        assert {"loss_last", "ratio_mean_last", "clip_frac_high_last", "update_norm_last"} <= m.keys()
        assert m["ratio_mean_last"] != pytest.approx(m["ratio_mean"], abs=1e-6)


def test_a_users_policy_loss_and_a_correction_run_in_the_loop(tmp_path):
    """`algo.algorithm: package.module:function` (a file of the user's, not registered anywhere) trains the
    run with its kwargs, beside an off-policy correction whose metrics every step reports."""
    run = tiny_run(tmp_path / "user", steps=STEPS, checkpoint_every=10, overrides=[
        "algo.dynamic_sampling=fill", "algo.algorithm=tests.user_policy_loss:reinforce",
        "algo.loss_kwargs={scale: 0.5}", "algo.correction={kind: icepop, low: 0.5, high: 2.0}"])
    metrics: list[dict] = []
    loop, accounting = _run_loop(run, on_step=lambda loop, step, m: metrics.append(m))
    assert balance_violations(accounting) == [] and len(metrics) == STEPS
    for m in metrics:
        assert m["reinforce_scale"] == pytest.approx(0.5)  # the user's loss computed the step
        assert {"is_ess", "kl_old_behaviour", "masked_token_frac", "is_ratio_p50"} <= m.keys()
        assert 0 < m["is_ess"] <= 1.0 + 1e-6


def test_a_registered_loss_by_name_and_a_users_estimator_run_rl_steps(tmp_path):
    """`algo.algorithm: user_reinforce` (registered with @policy_loss by the user's module) and
    `algo.estimator: package.module:function` (registered nowhere) are accepted when the config loads and
    compute the run's steps."""
    calls = len(user_estimator.CALLS)
    run = tiny_run(tmp_path / "plugins", steps=2, checkpoint_every=10, overrides=[
        "algo.dynamic_sampling=fill", "algo.algorithm=user_reinforce", "algo.loss_kwargs={scale: 0.5}",
        "algo.estimator=tests.user_estimator:median_baseline"])
    metrics: list[dict] = []
    loop, accounting = _run_loop(run, on_step=lambda loop, step, m: metrics.append(m))
    assert balance_violations(accounting) == [] and len(metrics) == 2
    assert len(user_estimator.CALLS) - calls == 2  # one call per step's batch
    for m in metrics:
        assert m["registered_reinforce_scale"] == pytest.approx(0.5) and not m.get("update_skipped")
