"""Async multi-turn mode: each leased prompt's group is G episodes of an environment, sampled turn by turn.

The episodes themselves (resets, steps, trajectories, the group on the wire) are actors/episodes.py's
EpisodeRunner; this sampler feeds it the engine: each turn is one engine request, stepped with the other
turns in flight, and a group is sent once its episodes have all ended. A weight version meets the turns
in flight as ``rollout.weight_update`` says (actors/samplers/updates.py); an aborted turn is sampled again
on the new version, the finished turns keep the version that sampled them.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.episodes import EpisodeRunner
from actors.learner_client import Prompt
from actors.samplers.base import Sampler, SamplerRig
from actors.samplers.updates import WeightUpdatePolicy

ANSWER_POLL_S = 0.05  # with no turn in the engine, how long collect() waits at most for an environment's answer


class EpisodeSampler(Sampler):
    def __init__(self, rig: SamplerRig, updates: WeightUpdatePolicy, episodes: EpisodeRunner) -> None:
        super().__init__(rig, updates)
        self.episodes = episodes

    def held(self) -> set[str]:
        return self.episodes.group_ids

    def submit(self, leases: Sequence[Prompt]) -> None:
        """Start each lease's episodes (their first turns reach the engine once the resets are in)."""
        for lease in leases:
            with self.rig.engine_lock:
                self.episodes.start(lease)

    @property
    def sampling_count(self) -> int:
        return len(self.episodes.group_ids)

    def step(self) -> None:
        """One engine step; step the environment of every turn it finished."""
        with self.rig.engine_lock:
            with self.generating():
                finished = self.engine.poll()
            for key, [sample] in finished:
                self.rig.counters.tokens_generated += len(sample.token_ids)
                self.episodes.on_turn(key, sample)

    def collect(self, wait_s: float | None = None) -> None:
        """Apply the environments' answers that are in, submit the next turns, send the groups whose episodes
        have all ended; waits up to `wait_s` for the first answer (by default not at all while turns are in
        the engine, else ANSWER_POLL_S)."""
        if wait_s is None:
            wait_s = 0.0 if self.engine.in_flight else ANSWER_POLL_S
        with self.rig.engine_lock:
            finished = self.episodes.advance(self.rig.version(), self.engine.submit, wait_s)
        for group in finished:
            self.rig.send(group)
            self.rig.counters.groups_sent += 1

    def resubmit(self, keys: Sequence[str]) -> None:
        self.episodes.resubmit(keys, self.rig.version(), self.engine.submit)

    def episode_counts(self) -> dict[str, int]:
        counts = self.episodes.counts
        return {"trajectories": counts.trajectories, "turns": counts.turns, "tool_calls": counts.tool_calls,
                "tool_errors": counts.tool_errors, "samples_split": counts.samples_split,
                **{f"ended/{why}": n for why, n in counts.ended.items()}}
