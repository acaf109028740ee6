"""RolloutActor: one vLLM engine that leases prompts, samples groups, scores them and streams them.

The learner's prompt service decides what is sampled, so actors can join and leave at any time:
a prompt leased by an actor that goes away is re-issued when its lease expires.

The sampling loop (``_sample``) leases room for up to ``prompts_per_batch`` groups and drives the
sampler of the actor's mode (actors/samplers/): ``streaming`` (async: the engine stepped one step at a
time, each group scored as soon as its last completion finishes and sent once scored, the room it
leaves leased again), ``episodes`` (async multi-turn: G episodes per prompt, turn by turn) or
``batch`` (sync, below). The actor does not branch on the mode.

Threads: ``run()`` is the sampling loop. A weights thread watches the learner's latest version,
downloads and checks a new version *while the engine keeps sampling*, then it is applied between
two engine steps. An idle engine loads it at once. A busy one (async mode) follows
``rollout.weight_update``, the sampler's policy (actors/samplers/updates.py). ``keep`` (PipelineRL's
and AReaL's in-flight update): it is loaded at once, the groups in flight continue on it
(RolloutEngine.update_in_flight: vLLM's pause in keep mode, their KV recomputed on the new weights) and
no sampled token is lost. ``abort``: the actor stops taking new
prompts and drains: the groups in flight finish on the weights they started with, and the version is
loaded when none is left, or after ``weight_drain_steps`` engine steps, when the rest are aborted and
sampled again on the new weights (their tokens counted in ``tokens_aborted``); an actor blocked on the
learner's credits does not step its engine, so nothing drains, and loads it at once. Either way every
token carries the version that sampled it and the behaviour logprob of the distribution it was drawn
from; a group's ``policy_version`` is its oldest token's, which the learner's staleness rule counts. A
version that fails its transfer or validation is reported and the actor keeps serving the one it has.
The swap's state (what is pending, when it is due, what was rejected) is
``actors.weights.pending.PendingWeights``: the threads tell it what happened (a version fetched, an
engine step, a credit wait) and load what it says is due (``_swap``). A heartbeat thread reports
liveness, version and throughput until ``stop()``, also after ``run()`` returned (an idle actor is
alive, not dead).

Synchronous mode (``ActorConfig.sync``, with the learner's ``max_staleness=0``; actors/samplers/batch.py):
the actor samples whole batches, and the lease budget with η = 0 paces it: after a batch sampled with
version v it is refused until the learner has trained on it and the engine serves the newer version, so
sampling and training alternate instead of overlapping (the baseline the asynchronous mode is measured
against). It samples with v again only when groups the learner rejected, or retired without signal (dynamic
sampling), gave their slots back. Each actor then contributes one batch per version (plus those
refills), so set ``prompts_per_step = num_actors × prompts_per_batch``.

Idle time is counted (``stats()``): blocked on credits, waiting for prompts (the learner's lease
budget allows (max_staleness + step + 1)·prompts_per_step prompts in use; a refused actor sleeps for
the retry hint the learner sends, or until it loaded newer weights or the learner announced on the
group stream that the budget grew: a step, or slots given back; never spins).

Create it as a Ray actor through ``actors.fleet`` (resources ``{"rollout": 1}``, several concurrent
calls so that ``stats()`` and ``stop()`` answer while ``run()`` loops).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from actors.config import ActorConfig
from actors.engine import RolloutEngine, SamplingSpec
from actors.groups import PROMPT_TOO_LONG, rejected_group
from actors.learner_client import (
    LearnerBusy,
    LearnerClient,
    LearnerUnavailable,
    LeaseReply,
    Prompt,
    RegisterInfo,
    WeightTransferError,
)
from actors.samplers.base import SamplerRig
from actors.samplers.modes import sampler_for
from actors.scoring import RewardScorer
from actors.stats import ActorCounters, ActorStats, TimeShareMeter, UnionClock, WeightUpdate
from actors.weights.apply import Applier, applier
from actors.weights.checks import WeightSetError
from actors.weights.pending import PendingWeights
from actors.weights.relay import WeightRelayServer, relay_host_towards

log = logging.getLogger(__name__)

ACK_WAIT_S = 1.0  # the longest a re-issued lease waits for our earlier copy's final ack
CREDIT_POLL_S = 0.5  # while blocked on credits, how often a waiting weight version is looked at
WEIGHT_POLL_S = 0.1  # how often the weights thread looks at the latest version (a local read)


@dataclass(frozen=True)
class _Fetched:
    """A version's weights, fetched and checked, as they wait in PendingWeights."""

    weights: object  # what its kind's applier checked
    transfer_s: float
    applier: Applier  # how its kind is loaded


class RolloutActor:
    """Owns a RolloutEngine and a LearnerClient; ``run()`` loops until the dataset is exhausted or
    ``stop()`` is called."""

    def __init__(self, actor_id: str, config: ActorConfig, learner_address: str, reward_handles: list,
                 enrollment: str | None = None):
        """`enrollment`: the token the fleet minted for `actor_id`, presented when registering."""
        self.actor_id = actor_id
        self.config = config
        self.engine = RolloutEngine(Path(config.hf_dir), max_model_len=config.max_model_len,
                                    kv_cache_gib=config.kv_cache_gib, seed=config.seed, dtype=config.dtype,
                                    lora=config.lora, lora_versions_kept=config.lora_versions_kept)
        # set when our lease budget may have grown: we loaded a version, or the learner announced one, a
        # step or slots given back on the group stream; it ends a wait for prompts
        self._ask_again = threading.Event()
        # Versions streamed from the learner are relayed to the actors it sends here (plaintext: not for TLS).
        self.relay = None
        if config.weight_relay and not config.tls_ca_path:
            host = relay_host_towards(learner_address)
            try:
                self.relay = WeightRelayServer(config.auth_token, bind=f"{host}:0")
            except RuntimeError as error:  # no port to serve on: fetch everything from the learner
                log.warning("%s: no weight relay on %s (%s); streaming versions from the learner", actor_id, host,
                            error)
        self.client = LearnerClient(learner_address, actor_id, auth_token=config.auth_token,
                                    tls_ca_path=config.tls_ca_path, on_announcement=self._ask_again.set,
                                    relay=self.relay, enrollment=enrollment)
        self.scorer = RewardScorer(reward_handles)
        # the swap: the version served (the HF dir the engine starts from is version 0), the one pending
        self._weights: PendingWeights[_Fetched] = PendingWeights(0, config.weight_drain_steps)
        self.max_prompt_tokens = min(config.max_prompt_tokens, self.engine.max_prompt_len)
        self.sampling = SamplingSpec(n=config.group_size, temperature=config.temperature, top_p=config.top_p,
                                     max_tokens=config.max_tokens, stop=list(config.stop),
                                     stop_token_ids=list(config.stop_token_ids))
        self.counters = ActorCounters()
        # A fresh vLLM engine's first step carries one-time setup (2.2 s against 0.3 s for the next ones
        # on the test model, on this CPU): taken here, not in the first lease, whose groups would reach
        # the learner several versions late and be dropped as stale.
        self.engine.greedy([[0, 0]], max_tokens=1)
        # one engine step, generate or weight load at a time (re-entrant: a load pauses the engine)
        self._engine_lock = threading.RLock()
        self._update_lock = threading.Lock()  # one fetch-and-apply at a time (weights thread, run()'s catch-up)
        self._credit_wait = UnionClock()  # blocked in send_group: the learner's queue is full
        self._prompt_wait = UnionClock()  # no prompt to lease
        self._idle_clock = UnionClock()  # either wait or a weight load running: ActorStats.idle_seconds
        self._stop = threading.Event()
        self._idle = threading.Event()  # set while run() is not looping
        self._idle.set()
        self._fatal: BaseException | None = None
        self._heartbeat_s = 1.0
        self._blocked_on_credits = False
        self._threads: list[threading.Thread] = []  # weights + heartbeat, alive until stop()
        # the groups between lease and send, sampled as the mode says (actors/samplers/)
        self.sampler = sampler_for(config, SamplerRig(
            actor_id, self.engine, self._engine_lock, self.scorer, self.sampling, self.counters,
            version=lambda: self.version, send=self._send), reward_handles)

    # ------------------------------------------------------------------ public

    @property
    def version(self) -> int:
        """The weight version the engine serves."""
        return self._weights.served

    def capabilities(self) -> dict:
        from vllm import __version__ as vllm_version
        from vllm.platforms import current_platform

        hf_config = self.engine.llm.llm_engine.model_config.hf_config
        return {"engine": f"vllm {vllm_version} ({current_platform.device_type})",
                "model_family": getattr(hf_config, "model_type", ""),
                "max_model_len": self.engine.max_model_len, "group_size": self.config.group_size,
                "max_prompt_tokens": self.max_prompt_tokens,  # the learner checks prompt_too_long claims
                "host": socket.gethostname()}

    def run(self) -> ActorStats:
        """Register, catch up to the learner's weights, then sample until exhausted or stopped.

        Returns ``stats()``; raises if the engine failed while loading weights (the actor must be
        replaced).
        """
        self._idle.clear()
        try:
            info = self._register()
            if info is None:
                return self.stats()
            self._heartbeat_s = info.heartbeat_interval_s
            with self._update_lock:
                self._maybe_update_weights(info.latest_version)  # never sample with weights known to be old
            if not self._threads:
                self._threads = [threading.Thread(target=loop, name=f"{self.actor_id}{loop.__name__}",
                                                  daemon=True)
                                 for loop in (self._weights_loop, self._heartbeat_loop)]
                for thread in self._threads:
                    thread.start()
            self._sample()
        finally:
            self._idle.set()
        if self._fatal is not None:
            raise RuntimeError(f"{self.actor_id}: engine failed while loading weights") from self._fatal
        return self.stats()

    def stats(self) -> ActorStats:
        """The counters so far, a wait or generate still running included."""
        c = self.counters
        started = self.sampler.generating_since
        return ActorStats(
            actor_id=self.actor_id,
            version=self.version,
            tokens_generated=c.tokens_generated,
            tokens_per_second=c.tokens_generated / c.generate_seconds if c.generate_seconds else 0.0,
            groups_sent=c.groups_sent,
            prompts_filtered=c.prompts_filtered,
            versions_applied=tuple(u.version for u in c.weight_updates),
            stall_seconds=tuple(u.stall_s for u in c.weight_updates),
            transfer_seconds=tuple(u.transfer_s for u in c.weight_updates),
            weight_rejections=c.weight_rejections,
            tokens_aborted=self.engine.aborted_tokens,
            tokens_recomputed=self.engine.recomputed_tokens,
            recompute_seconds=self.engine.recompute_s,
            generate_seconds=c.generate_seconds,
            credit_wait_seconds=self._credit_wait.seconds(),
            prompt_wait_seconds=self._prompt_wait.seconds(),
            idle_seconds=self._idle_clock.seconds(),
            unacked=self.client.unacked_count(),
            engine_busy_s=time.monotonic() - started if started else 0.0,
            rss_bytes=psutil.Process().memory_info().rss,
            weight_sources=dict(self.client.weight_fetches),
            relay_bytes_served=self.relay.bytes_served if self.relay else 0,
            calls_refused=dict(self.client.calls_refused),
            episodes=self.sampler.episode_counts(),
            adapters=self.engine.adapters_loaded,
        )

    def stop(self, timeout_s: float = 60.0) -> ActorStats:
        """Stop looping after the current generation and close the connection; returns ``stats()``.

        Groups not yet accepted by the learner are abandoned: their leases expire and the learner
        re-issues those prompts to other actors.
        """
        self._stop.set()
        self._ask_again.set()  # ends a wait for prompts
        deadline = time.monotonic() + timeout_s
        # A loop blocked on credits (learner not consuming) would never notice: closing unblocks it.
        while not self._idle.wait(0.05) and not self._blocked_on_credits and time.monotonic() < deadline:
            pass
        self.client.close()
        self._idle.wait(max(0.0, deadline - time.monotonic()))
        if self.relay is not None:
            self.relay.stop()
        return self.stats()

    def retarget(self, learner_address: str) -> None:
        """Serve the learner at a new address (a restarted driver's learner): re-register there and
        re-send the unacknowledged groups."""
        self.client.retarget(learner_address)

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """Greedy token ids under the weights currently served (for checks and evaluation)."""
        with self.sampler.paused():
            return [s.token_ids for s in self.engine.greedy(prompts, max_tokens)]

    # ------------------------------------------------------------------ sampling loops

    def _register(self) -> RegisterInfo | None:
        """Register with the learner, asking again while it refuses us as busy (the client has logged and
        counted each refusal) until stopped (None)."""
        while not self._stop.is_set():
            try:
                return self.client.register(self.capabilities(), self.version)
            except LearnerBusy:
                self._stop.wait(self.config.idle_poll_s)
        return None

    def _lease(self, max_prompts: int) -> LeaseReply:
        self._ask_again.clear()  # set again by a load, an announcement (or stop)
        try:
            return self.client.lease_prompts(max_prompts)
        except LearnerUnavailable as error:  # learner restarting or busy: keep trying until stopped
            # the client logs a busy learner's refusals itself, at most once a minute
            log.log(logging.DEBUG if isinstance(error, LearnerBusy) else logging.WARNING, "%s: lease failed: %s",
                    self.actor_id, error)
            return LeaseReply([], False, 0.0)

    def _wait_for_prompts(self, seconds: float) -> None:
        """The lease budget counts from the version we serve and grows with the learner's steps: wait
        as long as the learner says, or until we load newer weights or the learner announces room."""
        with self._idle_time(self._prompt_wait):
            self._ask_again.wait(seconds)

    def _sample(self) -> None:
        """Keep up to prompts_per_batch groups sampling: lease the room there is (once half the batch is
        free, or all of it), let the sampler advance them one engine call at a time and send what is done,
        so in async mode nothing waits for the longest completion of a batch. A new weight version
        waiting to be loaded (weight_update=abort: for the groups in flight to drain) stops the leasing
        until it is loaded (``_load_when_drained``)."""
        batch = self.config.prompts_per_batch
        ask_after = 0.0  # monotonic time before which the learner told us not to ask again
        exhausted = False
        while not self._stop.is_set():
            if self._ask_again.is_set():
                ask_after = 0.0  # our lease budget may have grown
            room = batch - self.sampler.sampling_count
            draining = self._weights.pending_version is not None  # new prompts wait for the new weights
            if (not exhausted and not draining and time.monotonic() >= ask_after
                    and (room >= max(1, batch // 2) or room == batch)):
                reply = self._lease(room)
                exhausted = reply.exhausted
                if reply.prompts:
                    self._submit(reply.prompts)
                else:
                    ask_after = time.monotonic() + (reply.retry_after_s or self.config.idle_poll_s)
            if not self.sampler.held():
                if exhausted:
                    break
                self._wait_for_prompts(max(0.0, ask_after - time.monotonic()))
                continue
            self.sampler.step()
            self._load_when_drained()
            self.sampler.collect()

    def _submit(self, leases: list[Prompt]) -> None:
        """Refuse the prompts too long for us, and hand the others to the sampler."""
        self.sampler.submit(self._fitting(leases))

    def _fitting(self, leases: list[Prompt]) -> list[Prompt]:
        """The leases worth sampling: a prompt too long for us is refused (the learner retires it); a
        lease that expired while we sampled it may come back to us while our group for it is still in
        the engine, being scored, or on its way (or queued), and that copy will reach the learner, so
        sampling it again is waste (and a second copy of one group is refused by the engine and the
        client). A prompt the learner re-issues because it dropped our group (stale) comes back before
        that drop's ack may have reached us: wait briefly for the ack, or the lease would sit
        unsampled until it expires (lease_seconds; the learner held steps back for it)."""
        with self._engine_lock:
            ours = self.sampler.held()
        leases = [lease for lease in leases if lease.group_id not in ours
                  and self.client.wait_for_final_ack(lease.group_id, ACK_WAIT_S)]
        for lease in leases:
            if len(lease.prompt_ids) > self.max_prompt_tokens:
                self.counters.prompts_filtered += 1
                self._send(rejected_group(
                    group_id=lease.group_id, actor_id=self.actor_id, policy_version=self.version,
                    prompt_ids=lease.prompt_ids, metadata=lease.metadata, reason=PROMPT_TOO_LONG))
        return [lease for lease in leases if len(lease.prompt_ids) <= self.max_prompt_tokens]

    def _send(self, group) -> None:
        """Hand a group to the client; blocks while the learner has no credits for us (backpressure).
        While blocked the engine is not stepped, so a pending version cannot drain: ``_force_load``
        loads it instead of letting it wait for the learner's queue."""
        if self._stop.is_set():
            return  # stopping: the lease expires and the prompt is sampled again elsewhere
        self._blocked_on_credits = True
        try:
            with self._idle_time(self._credit_wait):
                try:
                    self.client.send_group(group, timeout=CREDIT_POLL_S)
                except TimeoutError:  # queued, and the learner's queue is full
                    while not self.client.wait_for_credits(CREDIT_POLL_S):
                        self._force_load()
        except RuntimeError:
            if not self._stop.is_set():  # only stop() may close the client under us
                raise
        finally:
            self._blocked_on_credits = False

    @contextlib.contextmanager
    def _idle_time(self, wait: UnionClock) -> Iterator[None]:
        """Time the block on its own wait's clock and on the idle clock; stats() includes a running wait."""
        with wait.running(), self._idle_clock.running():
            yield

    # ------------------------------------------------------------------ weights

    def _weights_loop(self) -> None:
        while not self._stop.wait(WEIGHT_POLL_S):
            try:
                with self._update_lock:
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
        """Fetch and check the learner's newest version whenever it differs from ours, and offer it
        to the swap: an idle engine loads it at once, a busy one once drained (``_load_when_drained``).

        Usually it is newer; it is older after the learner restarted from a checkpoint taken before
        the version we serve, and then we must go back to it (a group sampled with a version the
        learner never published would be refused as from the future)."""
        if not self._weights.wants(latest, time.monotonic()):
            return
        start = time.perf_counter()
        try:
            staged = self.client.fetch_weights(0)  # 0 = newest: never apply an already superseded one
        except WeightTransferError as error:
            self._reject(latest, f"transfer failed: {error}", time.perf_counter() - start,
                         retry_after_s=self.config.weight_retry_s)
            return
        if staged.version == self.version:
            return
        try:
            apply = applier(staged.kind)  # its kind decides how it is checked and loaded
            checked = apply.check(self.engine, staged)  # while the engine samples
        except WeightSetError as error:
            # the same bytes would fail again: wait for a newer version
            self._reject(staged.version, str(error), time.perf_counter() - start, retry_after_s=float("inf"))
            return
        fetched = _Fetched(checked, time.perf_counter() - start, apply)
        # the sampler's policy says how many requests in flight it waits for (0: due at once)
        self._swap(lambda: self._weights.offer(staged.version, fetched, self.sampler.waits_for(apply)))

    def _load_when_drained(self) -> None:
        """After an engine step (streaming): the pending version is loaded once the groups in flight
        have finished on the weights they started with, or after weight_drain_steps engine steps (the
        rest is aborted and sampled again on it). Draining instead of aborting at once wastes no
        tokens when completions are short; the bound keeps long ones from holding new weights back."""
        self._swap(lambda: self._weights.stepped(self.engine.in_flight))

    def _force_load(self) -> None:
        """Blocked on the learner's credits, the engine is not stepped and cannot drain: the pending
        version is loaded now rather than wait for the learner's queue."""
        self._swap(self._weights.force)

    def _swap(self, event: Callable[[], None]) -> None:
        """Tell the swap state what happened (``event``, under the engine lock) and load the version
        it says is due, between two engine steps; the load is reported after the lock is released."""
        with self._engine_lock:
            event()
            due = self._weights.due()
            if due is None:
                return
            apply, weights = due.staged.applier, due.staged.weights
            with self._idle_clock.running():
                stall_s = self.sampler.load(apply, weights, due.version)
                self._weights.loaded(due.version)
        transfer_s = due.staged.transfer_s
        self.counters.weight_updates.append(WeightUpdate(due.version, transfer_s, stall_s))
        self._report_weights(due.version, applied=True, detail="", stall_s=stall_s, transfer_s=transfer_s)
        self._ask_again.set()  # reported: the learner's lease budget for us has grown
        log.debug("%s: applied weight version %d (transfer %.3fs, stall %.3fs)", self.actor_id, due.version,
                  transfer_s, stall_s)

    def _reject(self, version: int, detail: str, transfer_s: float, retry_after_s: float) -> None:
        log.warning("%s: weight version %d not applied, still serving %d: %s", self.actor_id, version,
                    self.version, detail)
        self.counters.weight_rejections += 1
        self._weights.reject(version, time.monotonic(), retry_after_s)
        self._report_weights(version, applied=False, detail=detail, stall_s=0.0, transfer_s=transfer_s)

    def _report_weights(self, version: int, **report) -> None:
        """Tell the learner what we serve; a learner that is down (restarting) learns it from the
        next heartbeat instead, so this must not stop the weights thread."""
        try:
            self.client.report_weights(version, **report)
        except LearnerUnavailable as error:
            log.warning("%s: could not report weight version %d: %s", self.actor_id, version, error)

    # ------------------------------------------------------------------ liveness

    def _time_totals(self) -> dict[str, float]:
        """Cumulative seconds per activity, as pb.TimeShares names them (waits still running included)."""
        return {"busy": self.counters.generate_seconds,
                "lease_wait": self._prompt_wait.seconds(),
                "credit_wait": self._credit_wait.seconds(),
                "weight_stall": sum(u.stall_s for u in self.counters.weight_updates)}

    def _heartbeat_loop(self) -> None:
        tokens_per_second = 0.0
        meter = TimeShareMeter(time.perf_counter(), self._time_totals())
        while not self._stop.wait(self._heartbeat_s):
            c = self.counters
            if c.generate_seconds:
                tokens_per_second = c.tokens_generated / c.generate_seconds
            shares = meter.read(time.perf_counter(), self._time_totals())
            try:
                self.client.heartbeat(self.version, self.client.unacked_count(), tokens_per_second, shares)
            except Exception as error:  # the learner may be restarting; keep beating
                log.warning("%s: heartbeat failed: %s", self.actor_id, error)
