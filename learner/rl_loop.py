"""The learner's RL loop: take scored groups from the service, update, publish weights, checkpoint.

    restore (params, optimizer, step, weight version, the service's exactly-once state)
    start the gRPC service; publish the current weights as the current version
    repeat until `steps` (or finish_early: train.stop_at met at a held-out evaluation):
        groups  ← service.next_batch(P)            validated, de-duplicated, fresh (≤ max_staleness)
                  (dynamic_sampling='fill': zero-signal groups are retired and counted, their lease
                   slots given back, and more are taken until P groups have signal or
                   max_fill_batches·P were taken)
        scored  ← group_advantages(rewards)        the estimator (algo.estimator), in plain sight here
        A       ← token_advantages(groups, scored)  each turn's advantage on its tokens (algo.advantage)
        batch   ← assemble_rl_batch(groups, A)     sequences packed into rows of train.row_tokens
        metrics ← trainer.rl_step(batch)           skipped (AdamW untouched) when nothing has signal;
                  train.num_iterations − 1 more updates on the batch, against its pre-update logprobs
        service.mark_consumed(groups)              prompts retired; actors told CONSUMED
        guard: an entropy / update-norm jump warns, stops the run, or rolls back to the last checkpoint
        every publish_every steps: version += 1; service.publish_weights(version, params)
        checkpoint (service.state_dict() inside, so params and retired prompts stay consistent)

Exactly-once holds per prompt along the checkpointed history: a checkpoint stores the params
and, with them, which prompts those params were trained on. A learner restored from it re-leases
every prompt consumed after it, so no prompt is lost and none is counted twice in the model.

A restored learner publishes its weights under a fresh version, RESTART_VERSION_STRIDE above the
checkpoint's: the crashed run may have published (and actors may serve) versions past the
checkpoint, and reusing those numbers for different weights would let actors keep the old
weights and make their groups look fresh. With the jump every actor re-syncs, and groups sampled
before the crash are older than max_staleness and dropped as stale (their prompts re-leased).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from learner.algo.advantages import group_advantages, has_signal, resolve_estimator
from learner.algo.rl_batch import RLBatch, assemble_rl_batch, group_statistics
from learner.algo.train_step import SKIPPED, Trainer
from learner.algo.turn_advantages import TurnAdvantageFn, resolve_turn_advantage, token_advantages
from learner.checkpoint import Checkpointer
from learner.compile_ahead import CompileAhead
from learner.compile_log import CompileLog, summarize
from learner.guard import JumpDetector
from learner.metrics import MetricsWriter, StepCallback
from learner.multihost import RunStopped, StepMessage, exchange, is_multiprocess
from learner.schema import LossConfig, RLLoopConfig
from learner.service.server import GroupRecord, LearnerService

log = logging.getLogger(__name__)
BATCH_LAYOUT = {name: np.dtype(np.int32 if name in ("input_ids", "attention_mask", "segment_ids", "positions")
                               else np.float32) for name in RLBatch._fields}

# Version jump on restore; larger than any number of versions a run publishes between checkpoints.
RESTART_VERSION_STRIDE = 1_000_000
WAITING_WARN_S = 60.0  # a learner waiting this long for groups says why, again every this many seconds
# With train.num_iterations > 1, these of the last update are logged too (as `<name>_last`).
ITERATION_METRICS = ("loss", "ratio_mean", "clip_frac_low", "clip_frac_high", "update_norm")


def group_rewards(groups: list[GroupRecord]) -> np.ndarray:
    """[N, G] rewards of a step's groups, NaN where a completion is unscorable."""
    sizes = {len(g.completions) for g in groups}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every group of a batch needs the same positive number of completions, got {sorted(sizes)}")
    return np.array([[np.nan if c.reward is None else c.reward for c in g.completions] for g in groups], np.float64)


def build_batch(groups: list[GroupRecord], loss: LossConfig, rule: TurnAdvantageFn, *, pad_id: int,
                row_tokens: int, row_multiple: int, current_version: int) -> tuple[RLBatch, dict[str, float]]:
    """A step's groups → its batch and statistics: the estimator's advantages (algo.estimator), each turn's
    on its tokens (algo.advantage), the sequences packed into rows of `row_tokens`."""
    estimator = resolve_estimator(loss.estimator)
    scored = group_advantages(group_rewards(groups), estimator=estimator.fn, dynamic_sampling=loss.dynamic_sampling)
    advantages = token_advantages(groups, scored, rule, std_normalize=estimator.divides_by_std)
    batch, stats = assemble_rl_batch(groups, advantages, scored.weights, pad_id=pad_id, row_tokens=row_tokens,
                                     row_multiple=row_multiple)
    return batch, {**stats, **group_statistics(groups, scored, current_version)}


class NoRolloutsError(RuntimeError):
    """No scored group reached the learner for `batch_timeout_s`, or the run was aborted because
    none will (actors dead or misconfigured)."""


class RLLoop:
    """Drives one RL run on the learner side; the actors and reward pool live elsewhere."""

    def __init__(self, trainer: Trainer, service: LearnerService | None, checkpointer: Checkpointer,
                 writer: MetricsWriter | None, config: RLLoopConfig, *, pad_id: int,
                 compile_ahead_len: int | None = None):
        """`service` is None on learner processes other than 0 (multi-host): they receive each step's
        batch from process 0 (learner.multihost) and run the same steps, gathers and checkpoints.
        `compile_ahead_len`: the sequence length the first batch is expected to need (the longest
        prompt plus max_tokens); `run` compiles the step for every row bucket a batch can fill
        (learner.compile_ahead), nearest first to the rows such sequences would fill, while the actors sample.
        None: the steps compile on first use."""
        self.trainer, self.service, self.checkpointer, self.writer = trainer, service, checkpointer, writer
        self.config, self.pad_id, self.compile_ahead_len = config, pad_id, compile_ahead_len
        self._compiling: CompileAhead | None = None
        self.compile_log = CompileLog.install()
        self._compile_marks: dict[str, int] = {}  # the compile log's marks at "start" and at the "first_step"'s end
        self._loop_thread = ""  # the thread that runs the steps
        self.row_tokens = config.train.row_tokens or config.max_sequence_len
        if self.row_tokens < config.max_sequence_len:
            raise ValueError(f"train.row_tokens={self.row_tokens} is shorter than the longest sequence "
                             f"({config.max_sequence_len} tokens: prompt + completion)")
        self.row_multiple = trainer.rl_row_multiple(self.row_tokens)
        self.step = 0
        self.version = 0
        self.last_groups: list[GroupRecord] = []  # what the last step trained on (for on_step hooks)
        self._abort_reason = ""
        # Learner-side counts (checkpointed): updates skipped for lack of signal, zero-signal groups
        # retired by dynamic_sampling='fill' (they are in groups_consumed too), guard events.
        self.counts = {"updates_skipped": 0, "groups_zero_signal_dropped": 0, "rollbacks": 0}
        self.guard_events: list[dict[str, Any]] = []
        self.stopped_by_guard = ""
        self.finished_early = ""  # why the run ended before train.steps at a target (finish_early)
        self._detector = JumpDetector(config.train.guard)
        self.advantage = resolve_turn_advantage(config.loss.advantage)

    def abort(self, reason: str) -> None:
        """Stop waiting for groups: ``run`` raises NoRolloutsError(reason) within seconds. Thread-safe
        (e.g. the fleet supervisor, when every actor slot was given up)."""
        self._abort_reason = reason

    def finish_early(self, reason: str) -> None:
        """End the run after the current step as if it were the last (checkpointed), e.g. from an
        on_step callback whose held-out evaluation met train.stop_at."""
        self.finished_early = f"finished at step {self.step}: {reason}"

    def start(self, address: str = "127.0.0.1:0") -> str:
        """Restore the newest checkpoint if any, start serving, publish the current weights."""
        restored = self.checkpointer.restore(self.trainer.state)
        if restored is not None:
            self.trainer.state = restored.state
            self.step, self.version = restored.step, restored.weight_version + RESTART_VERSION_STRIDE
            self.counts.update(restored.extra.get("loop", {}))
        if self.service is None:
            self._publish()
            return ""
        if restored is not None:
            self.service.load_state_dict(restored.extra["service"])
        bound = self.service.start(address)
        self.service.set_step(self.step)
        self._publish()
        return bound

    def _publish(self) -> None:
        """Export the current weights as `self.version` (every process gathers, process 0 serves them): with
        LoRA an adapter version (the adapters alone, in PEFT's names), else the full weights."""
        lora = self.trainer.lora
        tensors = self.trainer.hf_tensors() if lora is None else self.trainer.adapter_tensors()
        if self.service is None:
            deque(tensors, maxlen=0)  # take part in the gathers; only process 0 keeps the tensors
        else:
            adapter = None if lora is None else self.trainer.adapter_config()
            self.service.publish_weights(self.version, tensors, adapter=adapter)

    def run(self, on_step: StepCallback | None = None) -> dict[str, Any]:
        """Train until `config.train.steps` (or the guard stops it, or `finish_early`); returns the final
        accounting."""
        self._compile_marks = {"start": self.compile_log.mark()}
        self._loop_thread = threading.current_thread().name
        self._compile_ahead()
        try:
            return self._run(on_step)
        finally:
            if self._compiling is not None:
                self._compiling.stop()

    def _run(self, on_step: StepCallback | None) -> dict[str, Any]:
        started = time.monotonic()
        while self.step < self.config.train.steps:
            waited = time.perf_counter()
            groups = self._leader_groups()
            wait_s = time.perf_counter() - waited
            metrics = self._train_on(groups)
            metrics["learner_wait_s"] = wait_s  # idle: waiting for scored groups in next_batch
            metrics["wall_s"] = time.monotonic() - started  # since this process started training
            self._compile_marks.setdefault("first_step", self.compile_log.mark())
            self.step += 1
            self.last_groups = groups
            if self.service is not None:
                self.service.mark_consumed([g.group_id for g in groups])
                self.service.set_step(self.step)
            self.counts["updates_skipped"] += int(metrics.get("update_skipped", 0))
            stop = self._guard(metrics)
            if not stop:  # a run the guard stops keeps its last checkpoint, not the jumped params
                self._publish_and_checkpoint(metrics)
            metrics.update(self._live_counts())
            if on_step is not None:
                on_step(self.step, metrics)
            if self.writer is not None:
                self.writer.write(self.step, metrics)
            if stop:
                break
            if self.finished_early:
                self._checkpoint(force=True)
                break
        self.checkpointer.wait()
        return {} if self.service is None else self.service.accounting()

    def _compile_ahead(self) -> None:
        """Compile the rl step for every row bucket (train.compile_ahead: or the first batch's alone) on a
        background thread (learner.compile_ahead) while the first groups are sampled: the learner would
        otherwise wait idle for them, then compile (~10 s on the demo on one CPU core, minutes for a large
        model), and again at each new bucket."""
        if self.compile_ahead_len is None or self.step >= self.config.train.steps:
            return
        self._compiling = CompileAhead.for_run(
            self.trainer, sequences=self.config.train.prompts_per_step * self.config.group_size,
            row_tokens=self.row_tokens, max_sequence_len=self.config.max_sequence_len,
            expected_len=self.compile_ahead_len, row_multiple=self.row_multiple,
            again=self.config.train.num_iterations > 1, first_only=self.config.train.compile_ahead == "first").start()

    def compile_report(self) -> dict[str, float]:
        """This process's compilations since the run started (learner.compile_log.summarize) and the train
        steps compiled or loaded on the loop's own thread after its first step, which made a step wait
        (the target is 0: learner.compile_ahead compiles every bucket beforehand)."""
        marks = self._compile_marks
        after = self.compile_log.since(marks["first_step"]) if "first_step" in marks else []
        waited = [r for r in after if r.is_step and r.thread == self._loop_thread]
        return {**summarize(self.compile_log.since(marks.get("start", 0))),
                "step_compiles_after_first_step": float(len(waited))}

    def _leader_groups(self) -> list[GroupRecord]:
        """Process 0's groups for this step ([] on the others); a run process 0 stops is told to all."""
        if self.service is None:
            return []
        try:
            return self._next_groups()
        except NoRolloutsError as error:
            if is_multiprocess():
                exchange(StepMessage("stop", reason=str(error)), BATCH_LAYOUT)
            raise

    def _publish_and_checkpoint(self, metrics: dict[str, float]) -> None:
        if self.step % self.config.publish_every == 0 or self.step == self.config.train.steps:
            started = time.perf_counter()
            self.version += 1
            self._publish()
            metrics["publish_s"] = time.perf_counter() - started
        self._checkpoint(force=self.step == self.config.train.steps)

    def _checkpoint(self, force: bool) -> None:
        """Checkpoint this step if it is due (or `force` and it is not saved yet)."""
        if force:
            self.checkpointer.wait()  # a save of this step may still be in flight
            if self.checkpointer.latest_step() == self.step:
                return
        service_state = None if self.service is None else self.service.state_dict()  # written by process 0
        self.checkpointer.save(self.step, self.trainer.state, {"service": service_state, "loop": self.counts},
                               weight_version=self.version, force=force)

    def _guard(self, metrics: dict[str, float]) -> bool:
        """Apply the guard to this step's metrics; True when the run must stop now."""
        guard = self.config.train.guard
        jumps = [] if guard.action == "off" else self._detector.observe(self.step, metrics)
        metrics["guard_jumps"] = float(len(jumps))
        if not jumps:
            return False
        action = guard.action
        if action == "rollback" and self.counts["rollbacks"] >= guard.max_rollbacks:
            action = "stop"
        reason = "; ".join(j.reason for j in jumps)
        self.guard_events.append({"step": self.step, "reason": reason, "action": action})
        log.warning("guard: %s (action: %s)", reason, action)
        if action == "stop":
            self.stopped_by_guard = f"stopped at step {self.step}: {reason}"
            return True
        if action == "rollback":
            self.checkpointer.wait()
            restored = self.checkpointer.restore(self.trainer.state)
            if restored is None:
                self.stopped_by_guard = f"stopped at step {self.step} (no checkpoint to roll back to): {reason}"
                return True
            # Groups consumed since that checkpoint stay retired: their updates are what is undone.
            self.trainer.state = restored.state
            self.counts["rollbacks"] += 1
            self._detector.reset()
            metrics["rolled_back_to_step"] = float(restored.step)
        return False

    def _next_groups(self) -> list[GroupRecord]:
        """`prompts_per_step` groups; waits while actors sample. With dynamic_sampling='fill' only
        groups with signal count: the zero-signal ones are retired (marked consumed) and counted, and
        after max_fill_batches × P groups the step trains on the groups with signal it has."""
        fill = self.config.loss.dynamic_sampling == "fill"
        wanted = self.config.train.prompts_per_step
        groups: list[GroupRecord] = []
        taken = 0
        quiet_since = time.monotonic()  # when a group last arrived
        deadline = quiet_since + self.config.batch_timeout_s
        warn_at = quiet_since + WAITING_WARN_S
        while len(groups) < wanted:
            if fill and taken >= self.config.train.max_fill_batches * wanted:
                break
            if self._abort_reason:
                raise NoRolloutsError(f"run aborted: {self._abort_reason}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoRolloutsError(
                    f"only {len(groups)} of {wanted} groups arrived in {self.config.batch_timeout_s:.0f} s; "
                    f"accounting: {self.service.accounting()}\n{self.service.waiting_report()}")
            if time.monotonic() >= warn_at:
                log.warning("step %d: no group for %.0f s (%d of %d taken):\n%s", self.step + 1,
                            time.monotonic() - quiet_since, len(groups), wanted, self.service.waiting_report())
                warn_at = time.monotonic() + WAITING_WARN_S
            fresh = self.service.next_batch(wanted - len(groups), timeout=min(remaining, 5.0))
            if fresh:
                quiet_since = time.monotonic()
                deadline = quiet_since + self.config.batch_timeout_s
                warn_at = quiet_since + WAITING_WARN_S
            taken += len(fresh)
            if fill:
                zero = [g for g in fresh if not has_signal([c.reward for c in g.completions])]
                if zero:
                    self.service.mark_consumed([g.group_id for g in zero], trained=False)
                    self.counts["groups_zero_signal_dropped"] += len(zero)
                    fresh = [g for g in fresh if g not in zero]
            groups += fresh
        return groups

    def _train_on(self, groups: list[GroupRecord]) -> dict[str, float]:
        started = time.perf_counter()
        batch, stats = None, {}
        if groups:  # none: dynamic_sampling='fill' found no group with signal (or not process 0)
            batch, stats = build_batch(groups, self.config.loss, self.advantage, pad_id=self.pad_id,
                                       row_tokens=self.row_tokens, row_multiple=self.row_multiple,
                                       current_version=self.version)
        broadcast_s = 0.0
        if is_multiprocess():
            sent = time.perf_counter()
            batch = self._share(batch)
            broadcast_s = time.perf_counter() - sent
        if batch is None:
            return dict(SKIPPED)
        metrics = self._iterate(batch)
        metrics.update(stats)
        metrics["learner_step_s"] = time.perf_counter() - started
        if is_multiprocess():
            metrics["batch_broadcast_s"] = broadcast_s
        return metrics

    def _iterate(self, batch: RLBatch) -> dict[str, float]:
        """`train.num_iterations` updates on one batch (PPO's epochs, μ in GRPO). The later ones take the
        first update's pre-update logprobs as π_old (an off-policy correction's ratio, and the trust region
        of one that reweights; without a correction or with a mask the clip is against the behaviour
        logprobs, learner.algo.corrections.proximal_logps), so the clip keeps binding as the
        policy moves. The step's metrics are the first update's (the batch as it arrived, comparable
        across μ); `*_last` say where the last update started from."""
        metrics = self.trainer.rl_step(batch)
        iterations = self.config.train.num_iterations
        if iterations == 1 or metrics.get("update_skipped"):
            return metrics
        old_logps = self.trainer.last_logps
        for _ in range(iterations - 1):
            last = self.trainer.rl_step(batch, old_logps=old_logps)
        metrics.update({f"{key}_last": last[key] for key in ITERATION_METRICS if key in last})
        return metrics

    def _share(self, batch: RLBatch | None) -> RLBatch | None:
        """Process 0's batch on every process (None: this step makes no update)."""
        if self.service is None:
            message = exchange(None, BATCH_LAYOUT)
            if message.kind == "stop":
                raise RunStopped(f"process 0 stopped the run: {message.reason}")
        else:
            message = exchange(StepMessage("skip") if batch is None else StepMessage("batch", batch._asdict()),
                               BATCH_LAYOUT)
        return RLBatch(**message.arrays) if message.kind == "batch" else None

    def _live_counts(self) -> dict[str, float]:
        if self.service is None:
            return {**{k: float(v) for k, v in self.counts.items()}, "weight_version": float(self.version)}
        counts = self.service.accounting()
        actors = self.service.actors_status()
        keys = ("groups_consumed", "groups_stale", "groups_duplicate", "groups_invalid",
                "completions_unscorable", "prompts_too_long", "groups_in_queue", "lease_slots_in_use")
        live = {k: float(counts.get(k, 0)) for k in keys}
        live.update({k: float(v) for k, v in self.counts.items()})
        live["weight_version"] = float(self.version)
        live["actors"] = float(len(actors))
        live["actor_tokens_per_s"] = float(sum(a.tokens_per_second for a in actors))
        if actors:
            live["version_lag_max"] = float(max(self.version - a.weight_version for a in actors))
        # where each actor's time went over its last heartbeat interval, and the fleet's mean
        for share in ("busy", "lease_wait", "credit_wait", "weight_stall"):
            values = {a.actor_id: getattr(a.time_shares, share) for a in actors}
            live.update({f"actor_{share}_fraction/{actor_id}": v for actor_id, v in values.items()})
            if values:
                live[f"actor_{share}_fraction"] = sum(values.values()) / len(values)
        return live
