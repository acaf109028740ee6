"""RolloutActor: one vLLM engine that leases prompts, samples groups, scores them and streams them.

The learner's prompt service decides what is sampled, so actors can join and leave at any time:
a prompt leased by an actor that goes away is re-issued when its lease expires.

Threads: ``run()`` is the sampling loop. A weights thread watches the learner's latest version,
downloads and verifies a new version *while the engine keeps sampling*, then applies it under the
engine lock, i.e. between two generations (also while the loop waits for credits). A version that
fails its transfer or validation is reported and the actor keeps serving the one it has. A
heartbeat thread reports liveness, version and throughput until ``stop()``, also after ``run()``
returned (an idle actor is alive, not dead).

Create it as a Ray actor through ``actors.fleet`` (resources ``{"rollout": 1}``, several concurrent
calls so that ``stats()`` and ``stop()`` answer while ``run()`` loops).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from actors.config import ActorConfig
from actors.engine import RolloutEngine, SamplingSpec, WeightSetError
from actors.groups import PROMPT_TOO_LONG, rejected_group, scored_group
from actors.learner_client import LearnerClient, LearnerUnavailable, PromptLease, WeightTransferError
from actors.scoring import RewardScorer

log = logging.getLogger(__name__)

WEIGHT_POLL_S = 0.1  # how often the weights thread looks at the latest version (a local read)


@dataclass
class WeightUpdate:
    version: int
    transfer_s: float  # download + checksum, overlapped with sampling
    stall_s: float     # time the engine could not sample: validating + loading under the engine lock


@dataclass
class ActorCounters:
    tokens_generated: int = 0
    generate_seconds: float = 0.0
    groups_sent: int = 0
    prompts_filtered: int = 0
    weight_updates: list[WeightUpdate] = field(default_factory=list)
    weight_rejections: int = 0


class RolloutActor:
    """Owns a RolloutEngine and a LearnerClient; ``run()`` loops until the dataset is exhausted or
    ``stop()`` is called."""

    def __init__(self, actor_id: str, config: ActorConfig, learner_address: str, reward_handles: list):
        self.actor_id = actor_id
        self.config = config
        self.engine = RolloutEngine(Path(config.hf_dir), max_model_len=config.max_model_len,
                                    kv_cache_gib=config.kv_cache_gib, seed=config.seed, dtype=config.dtype)
        self.client = LearnerClient(learner_address, actor_id, auth_token=config.auth_token)
        self.scorer = RewardScorer(reward_handles)
        self.version = 0  # the HF dir the engine starts from is weight version 0
        self.max_prompt_tokens = min(config.max_prompt_tokens, self.engine.max_prompt_len)
        self.sampling = SamplingSpec(n=config.group_size, temperature=config.temperature, top_p=config.top_p,
                                     max_tokens=config.max_tokens, stop=list(config.stop),
                                     stop_token_ids=list(config.stop_token_ids))
        self.counters = ActorCounters()
        self._engine_lock = threading.Lock()  # one generate or one weight load at a time
        self._stop = threading.Event()
        self._idle = threading.Event()  # set while run() is not looping
        self._idle.set()
        self._fatal: BaseException | None = None
        self._retry_after: dict[int, float] = {}  # failed version -> monotonic time it may be retried
        self._heartbeat_s = 1.0
        self._blocked_on_credits = False
        self._threads: list[threading.Thread] = []  # weights + heartbeat, alive until stop()

    # ------------------------------------------------------------------ public

    def capabilities(self) -> dict:
        from vllm import __version__ as vllm_version
        from vllm.platforms import current_platform

        hf_config = self.engine.llm.llm_engine.model_config.hf_config
        return {"engine": f"vllm {vllm_version} ({current_platform.device_type})",
                "model_family": getattr(hf_config, "model_type", ""),
                "max_model_len": self.engine.max_model_len, "group_size": self.config.group_size,
                "host": socket.gethostname()}

    def run(self) -> dict:
        """Register, catch up to the learner's weights, then sample until exhausted or stopped.

        Returns ``stats()``; raises if the engine failed while loading weights (the actor must be
        replaced).
        """
        self._idle.clear()
        try:
            info = self.client.register(self.capabilities(), self.version)
            self._heartbeat_s = info.heartbeat_interval_s
            self._maybe_update_weights(info.latest_version)  # never sample with weights known to be old
            if not self._threads:
                self._threads = [threading.Thread(target=loop, name=f"{self.actor_id}{loop.__name__}",
                                                  daemon=True)
                                 for loop in (self._weights_loop, self._heartbeat_loop)]
                for thread in self._threads:
                    thread.start()
            while not self._stop.is_set():
                try:
                    leases, exhausted = self.client.lease_prompts(self.config.prompts_per_batch)
                except LearnerUnavailable as error:  # learner restarting: keep trying until stopped
                    log.warning("%s: lease failed: %s", self.actor_id, error)
                    leases, exhausted = [], False
                if not leases:
                    if exhausted:
                        break
                    self._stop.wait(self.config.idle_poll_s)
                    continue
                self._sample_and_send(leases)
        finally:
            self._idle.set()
        if self._fatal is not None:
            raise RuntimeError(f"{self.actor_id}: engine failed while loading weights") from self._fatal
        return self.stats()

    def stats(self) -> dict:
        c = self.counters
        return {
            "actor_id": self.actor_id,
            "version": self.version,
            "tokens_generated": c.tokens_generated,
            "tokens_per_second": c.tokens_generated / c.generate_seconds if c.generate_seconds else 0.0,
            "groups_sent": c.groups_sent,
            "prompts_filtered": c.prompts_filtered,
            "versions_applied": [u.version for u in c.weight_updates],
            "stall_seconds": [u.stall_s for u in c.weight_updates],
            "transfer_seconds": [u.transfer_s for u in c.weight_updates],
            "weight_rejections": c.weight_rejections,
            "unacked": self.client.unacked_count(),
            "rss_bytes": psutil.Process().memory_info().rss,
        }

    def stop(self, timeout_s: float = 60.0) -> dict:
        """Stop looping after the current generation and close the connection; returns ``stats()``.

        Groups not yet accepted by the learner are abandoned: their leases expire and the learner
        re-issues those prompts to other actors.
        """
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        # A loop blocked on credits (learner not consuming) would never notice: closing unblocks it.
        while not self._idle.wait(0.05) and not self._blocked_on_credits and time.monotonic() < deadline:
            pass
        self.client.close()
        self._idle.wait(max(0.0, deadline - time.monotonic()))
        return self.stats()

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """Greedy token ids under the weights currently served (for checks and evaluation)."""
        with self._engine_lock:
            return [s.token_ids for s in self.engine.greedy(prompts, max_tokens)]

    # ------------------------------------------------------------------ sampling loop

    def _sample_and_send(self, leases: list[PromptLease]) -> None:
        fits = [lease for lease in leases if len(lease.prompt_ids) <= self.max_prompt_tokens]
        for lease in leases:
            if len(lease.prompt_ids) > self.max_prompt_tokens:
                self.counters.prompts_filtered += 1
                self._send(rejected_group(
                    group_id=lease.group_id, actor_id=self.actor_id, policy_version=self.version,
                    prompt_ids=lease.prompt_ids, metadata=lease.metadata, reason=PROMPT_TOO_LONG))
        if not fits:
            return
        sampled_at = time.time()
        with self._engine_lock:
            version = self.version  # the weights these samples come from
            start = time.perf_counter()
            groups = self.engine.generate([lease.prompt_ids for lease in fits], self.sampling)
            sample_s = time.perf_counter() - start
        self.counters.generate_seconds += sample_s
        self.counters.tokens_generated += sum(len(s.token_ids) for g in groups for s in g)

        start = time.perf_counter()
        pending = [self.scorer.score_async(lease.text, [(c.text, c.token_ids) for c in group], lease.metadata)
                   for lease, group in zip(fits, groups, strict=True)]
        all_scores = self.scorer.gather(pending)
        score_s = time.perf_counter() - start
        for lease, samples, scores in zip(fits, groups, all_scores, strict=True):
            self._send(scored_group(
                group_id=lease.group_id, actor_id=self.actor_id, policy_version=version,
                prompt_ids=lease.prompt_ids, samples=samples, scores=scores, metadata=lease.metadata,
                sample_seconds=sample_s / len(fits), score_seconds=score_s / len(fits),
                sampled_at=sampled_at))
            self.counters.groups_sent += 1

    def _send(self, group) -> None:
        """Hand a group to the client; blocks while the learner has no credits for us (backpressure)."""
        if self._stop.is_set():
            return  # stopping: the lease expires and the prompt is sampled again elsewhere
        self._blocked_on_credits = True
        try:
            self.client.send_group(group)
        except RuntimeError:
            if not self._stop.is_set():  # only stop() may close the client under us
                raise
        finally:
            self._blocked_on_credits = False

    # ------------------------------------------------------------------ weights

    def _weights_loop(self) -> None:
        while not self._stop.wait(WEIGHT_POLL_S):
            try:
                self._maybe_update_weights(self.client.latest_version)
            except Exception as error:
                if self._stop.is_set():
                    return  # the client was closed mid-transfer
                log.exception("%s: weight update failed; stopping this actor", self.actor_id)
                self._fatal = error
                self._stop.set()
                self.client.close()  # unblocks a sampling loop waiting for credits
                return

    def _maybe_update_weights(self, latest: int) -> None:
        """Fetch, verify and apply the learner's newest version if it is newer than ours."""
        if latest <= self.version or time.monotonic() < self._retry_after.get(latest, 0.0):
            return
        start = time.perf_counter()
        try:
            staged = self.client.fetch_weights(0)  # 0 = newest: never apply an already superseded one
        except WeightTransferError as error:
            self._reject(latest, f"transfer failed: {error}", time.perf_counter() - start,
                         retry_after_s=self.config.weight_retry_s)
            return
        transfer_s = time.perf_counter() - start
        if staged.version <= self.version:
            return
        with self._engine_lock:
            try:
                stall_s = self.engine.load_weights(staged.tensors)
            except WeightSetError as error:
                # the same bytes would fail again: wait for a newer version
                self._reject(staged.version, str(error), transfer_s, retry_after_s=float("inf"))
                return
            self.version = staged.version
        self.counters.weight_updates.append(WeightUpdate(staged.version, transfer_s, stall_s))
        self.client.report_weights(staged.version, applied=True, detail="", stall_s=stall_s,
                                   transfer_s=transfer_s)
        log.info("%s: applied weight version %d (transfer %.3fs, stall %.3fs)", self.actor_id, staged.version,
                 transfer_s, stall_s)

    def _reject(self, version: int, detail: str, transfer_s: float, retry_after_s: float) -> None:
        log.warning("%s: weight version %d not applied, still serving %d: %s", self.actor_id, version,
                    self.version, detail)
        self.counters.weight_rejections += 1
        self._retry_after[version] = time.monotonic() + retry_after_s
        self.client.report_weights(version, applied=False, detail=detail, stall_s=0.0, transfer_s=transfer_s)

    # ------------------------------------------------------------------ liveness

    def _heartbeat_loop(self) -> None:
        tokens_per_second = 0.0
        while not self._stop.wait(self._heartbeat_s):
            c = self.counters
            if c.generate_seconds:
                tokens_per_second = c.tokens_generated / c.generate_seconds
            try:
                self.client.heartbeat(self.version, self.client.unacked_count(), tokens_per_second)
            except Exception as error:  # the learner may be restarting; keep beating
                log.warning("%s: heartbeat failed: %s", self.actor_id, error)
