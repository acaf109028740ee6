"""Multi-turn groups: G episodes of an environment per leased prompt, sampled turn by turn.

The rollout actor owns the engine and the loop; this module owns the episodes. A leased prompt starts G
episodes on one reward worker (every call of a group goes to the same worker, where the environment's
instances live). Each trajectory's turn is one engine request (n = 1) whose prompt is the trajectory's
context so far; when it finishes, the environment steps on the reply (a Ray call, in flight while the
engine samples other turns), and its observation extends the context token for token
(actors/trajectory.py). A group is done when its G trajectories have ended; it goes to the learner as one
ScoredGroup whose completions are the trajectories, with their turns, the weight version of each turn
(a weight load between two turns, or one that aborts a turn, moves the rest to the new version), and the
reward of each step.

Stop conditions (``Trajectory.apply_step``): the environment says done; ``max_turns``; more tool errors
than ``max_tool_errors``; ``max_total_tokens`` after the prompt; the engine's context; a chat template
that refuses the observation (``template_refused``). A template that cannot extend the tokens so far
starts a new training sample instead (``samples_split``). An environment that fails (raises, hangs,
crashes, returns a bad Step) ends its trajectory unscorable.
"""

from __future__ import annotations

import collections
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import ray

from actors.engine import Sample, SamplingSpec
from actors.groups import group_message
from actors.learner_client import Prompt
from actors.trajectory import ObservationRenderer, Trajectory
from rewards.environments import Step
from rewards.spec import EnvironmentSpec
from tandem_wire import tandem_pb2 as pb

Submit = Callable[[str, list[int], SamplingSpec], None]  # engine key, prompt ids, sampling


@dataclass
class _Group:
    lease: Prompt
    worker: ray.actor.ActorHandle
    trajectories: list[Trajectory]
    sampled_at: float
    started: float  # perf_counter at start
    sample_s: float = 0.0


@dataclass
class _Key:
    group_id: str
    index: int
    version: int = 0  # the weight version of its turn in the engine


@dataclass
class EpisodeCounts:
    """What the episodes did (rollout actor stats; docs/environments.md lists them)."""

    trajectories: int = 0
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    samples_split: int = 0  # new training samples started where the chat template broke the token prefix
    ended: dict[str, int] = field(default_factory=collections.Counter)  # why: done, max_turns, ...


class EpisodeRunner:
    """The multi-turn groups of one rollout actor; not thread-safe (the actor's sampling loop calls it)."""

    def __init__(self, actor_id: str, workers: Sequence[ray.actor.ActorHandle], renderer: ObservationRenderer,
                 spec: EnvironmentSpec, sampling: SamplingSpec, max_model_len: int) -> None:
        """`sampling`: the actor's (its n is the group size G); each turn samples one completion."""
        if not workers:
            raise ValueError("multi-turn episodes need at least one reward worker")
        self.actor_id, self.workers = actor_id, list(workers)
        self.renderer, self.spec, self.max_model_len = renderer, spec, max_model_len
        self.group_size = sampling.n
        self.turn_sampling = replace(sampling, n=1)
        self.counts = EpisodeCounts()
        self._groups: dict[str, _Group] = {}
        self._keys: dict[str, _Key] = {}  # engine key -> its trajectory
        self._calls: list[tuple[str, str, ray.ObjectRef]] = []  # (engine key, "reset" | "step", ref)

    @property
    def group_ids(self) -> set[str]:
        """The leases whose groups are being sampled."""
        return set(self._groups)

    def owns(self, key: str) -> bool:
        return key in self._keys

    def start(self, lease: Prompt) -> None:
        """Reset G episodes for `lease`; their first turns are submitted once the resets are in, with the
        version then served."""
        worker = self.workers[zlib.crc32(lease.group_id.encode()) % len(self.workers)]
        group = _Group(lease, worker, [], time.time(), time.perf_counter())
        user = [{"role": "user", "content": lease.text}]
        for index in range(self.group_size):
            key = f"{lease.group_id}/{index}"
            self._keys[key] = _Key(lease.group_id, index)
            group.trajectories.append(Trajectory(list(lease.prompt_ids), [dict(m) for m in user]))
            self._calls.append((key, "reset", worker.reset_episode.remote(key, dict(lease.metadata))))
        self._groups[lease.group_id] = group

    def on_turn(self, key: str, sample: Sample) -> None:
        """The engine finished a turn of `key`'s trajectory: step its environment on the reply."""
        state = self._keys[key]
        group = self._groups[state.group_id]
        trajectory = group.trajectories[state.index]
        trajectory.add_turn(sample, state.version)
        self.counts.turns += 1
        if trajectory.unscorable_reason is not None:  # its reset failed: the turn is sampled, not stepped
            trajectory.end("unscorable", trajectory.unscorable_reason)
            self._ended(key)
            return
        self._calls.append((key, "step", group.worker.step_episode.remote(key, sample.text)))

    def resubmit(self, keys: Sequence[str], version: int, submit: Submit) -> None:
        """After an abort (a weight load): sample the aborted turns again, with `version`."""
        for key in keys:
            self._submit(key, version, submit)

    def advance(self, version: int, submit: Submit, wait_s: float) -> list[pb.ScoredGroup]:
        """Apply the environment answers that are in (waiting up to `wait_s` for the first), submit the
        next turns with `version`, and return the groups whose trajectories have all ended."""
        if not self._calls:
            return []
        refs = [ref for _, _, ref in self._calls]
        done, _ = ray.wait(refs, num_returns=1, timeout=wait_s)
        if done:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready = set(done)
        finished: list[pb.ScoredGroup] = []
        calls, self._calls = self._calls, []
        for key, kind, ref in calls:
            if ref not in ready:
                self._calls.append((key, kind, ref))
                continue
            try:
                answer = ray.get(ref)
            except ray.exceptions.RayError as error:  # the worker died: its episodes are gone
                answer = f"environment:worker_failed:{type(error).__name__}"
            if kind == "reset":
                if answer is not None:
                    self._trajectory(key).unscorable_reason = answer
                self._submit(key, version, submit)
            else:
                self._stepped(key, answer, version, submit)
            group_id = self._keys[key].group_id
            if all(t.ended for t in self._groups[group_id].trajectories):
                finished.append(self._finish(group_id))
        return finished

    def _scored_group(self, group: _Group) -> pb.ScoredGroup:
        """The group on the wire: its trajectories as completions; its version is its oldest turn's."""
        versions = [turn.policy_version for t in group.trajectories for turn in t.turns]
        return group_message(
            group_id=group.lease.group_id, actor_id=self.actor_id, policy_version=min(versions),
            prompt_ids=group.lease.prompt_ids, metadata=group.lease.metadata,
            completions=[t.completion() for t in group.trajectories],
            timings=pb.Timings(sample_seconds=group.sample_s, sampled_at=group.sampled_at))

    # ------------------------------------------------------------------ internals

    def _trajectory(self, key: str) -> Trajectory:
        state = self._keys[key]
        return self._groups[state.group_id].trajectories[state.index]

    def _submit(self, key: str, version: int, submit: Submit) -> None:
        trajectory = self._trajectory(key)
        self._keys[key].version = version
        budget = trajectory.turn_budget(self.turn_sampling.max_tokens, self.spec, self.max_model_len)
        submit(key, trajectory.context, replace(self.turn_sampling, max_tokens=budget))

    def _stepped(self, key: str, answer: Step | str, version: int, submit: Submit) -> None:
        trajectory = self._trajectory(key)
        if trajectory.apply_step(answer, self.renderer, self.spec, self.max_model_len):
            self._submit(key, version, submit)
        else:
            self._ended(key)

    def _ended(self, key: str) -> None:
        """Count how `key`'s trajectory ended; an episode the environment did not end is closed there."""
        trajectory = self._trajectory(key)
        self.counts.ended[trajectory.ended] += 1
        if trajectory.left_open:
            state = self._keys[key]
            self._groups[state.group_id].worker.close_episode.remote(key)

    def _finish(self, group_id: str) -> pb.ScoredGroup:
        group = self._groups.pop(group_id)
        for index in range(len(group.trajectories)):
            del self._keys[f"{group_id}/{index}"]
        group.sample_s = time.perf_counter() - group.started
        self.counts.trajectories += len(group.trajectories)
        self.counts.tool_calls += sum(t.tool_calls for t in group.trajectories)
        self.counts.tool_errors += sum(t.tool_errors for t in group.trajectories)
        self.counts.samples_split += sum(t.splits for t in group.trajectories)
        return self._scored_group(group)
