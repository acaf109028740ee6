"""A pool of Ray reward workers, scaled independently of the rollout actors.

Each worker is a Ray actor asking for the custom resource ``"reward"`` (one unit, no CPU by
default) and owning one isolated child process (:mod:`rewards.isolation`), and a second one for the
episodes of an environment when the spec has one (:mod:`rewards.environment_host`). Rollout actors
call :meth:`RewardPool.handles` directly: ``handle.score_group.remote(prompt, completions, metadata)``,
and ``reset_episode`` / ``step_episode`` / ``close_episode`` (every call of one episode on one worker).
"""

import threading
from collections.abc import Sequence

import ray

from rewards.environment_host import IsolatedEnvironment
from rewards.environments import Step
from rewards.isolation import IsolatedScorer, RewardChildError
from rewards.spec import RewardSpec, WeightedReward
from rewards.types import RewardStats, ScoreResult

__all__ = ["RewardChildError", "RewardPool", "RewardSpec", "RewardWorker", "WeightedReward"]

DEFAULT_ACTOR_OPTIONS = {"num_cpus": 0, "resources": {"reward": 1}, "max_restarts": -1, "max_task_retries": 2}


@ray.remote
class RewardWorker:
    """Ray actor scoring groups in its isolated child process."""

    def __init__(self, spec: RewardSpec) -> None:
        # A failure here is kept for ready(): raising from __init__ would make Ray restart the
        # actor forever (max_restarts=-1) instead of telling the caller.
        self._scorer: IsolatedScorer | None = None
        self._environment: IsolatedEnvironment | None = None
        self._error: str | None = None
        try:
            self._scorer = IsolatedScorer(spec)
            if spec.environment is not None:
                self._environment = IsolatedEnvironment(spec)
        except RewardChildError as error:
            self._error = str(error)

    def ready(self) -> None:
        """Raises :class:`RewardChildError` if the reward functions could not be loaded."""
        if self._error is not None:
            raise RewardChildError(self._error)

    def score_group(self, prompt: str, completions: Sequence[tuple[str, list[int]]], metadata: dict
                    ) -> list[ScoreResult]:
        self.ready()
        return self._scorer.score(prompt, completions, metadata)

    def reset_episode(self, key: str, row: dict[str, str]) -> str | None:
        """Start episode `key` of the environment; None, or why it failed (the trajectory is unscorable)."""
        return self._episodes().reset(key, row)

    def step_episode(self, key: str, reply: str) -> Step | str:
        """The environment's answer to the assistant's `reply` in episode `key`, or why it has none."""
        return self._episodes().step(key, reply)

    def close_episode(self, key: str) -> None:
        self._episodes().close(key)

    def stats(self) -> RewardStats:
        """What its children did so far: completions scored, and episodes and steps of its environment
        (nothing when they did not load)."""
        stats = self._scorer.stats() if self._scorer is not None else RewardStats()
        return stats + self._environment.stats() if self._environment is not None else stats

    def close(self) -> None:
        if self._scorer is not None:
            self._scorer.close()
        if self._environment is not None:
            self._environment.shutdown()

    def _episodes(self) -> IsolatedEnvironment:
        self.ready()
        if self._environment is None:
            raise RuntimeError("this reward worker's spec has no environment")
        return self._environment


class RewardPool:
    """Scores groups on ``num_workers`` reward workers, each call going to the least busy one.

    ``actor_options`` update :data:`DEFAULT_ACTOR_OPTIONS` (for example a ``runtime_env`` whose
    ``PYTHONPATH`` holds the modules of user reward functions, or ``lifetime="detached"`` for workers
    that outlive the driver). ``workers`` adopts workers started earlier for the same ``spec`` (by a
    driver that crashed); the pool then starts or retires workers to reach ``num_workers``.
    """

    def __init__(self, spec: RewardSpec, num_workers: int = 1, *, actor_options: dict | None = None,
                 workers: Sequence[ray.actor.ActorHandle] = ()) -> None:
        self._spec = spec
        self._options = DEFAULT_ACTOR_OPTIONS | (actor_options or {})
        ray.get([worker.ready.remote() for worker in workers])  # dead or broken workers fail here
        self._workers: list[ray.actor.ActorHandle] = list(workers)
        self._in_flight: dict[ray.actor.ActorHandle, list[ray.ObjectRef]] = {worker: [] for worker in workers}
        self._retired_stats = RewardStats()  # of the workers this pool retired
        self._lock = threading.Lock()
        self.scale(num_workers)

    def score_group(self, prompt: str, completions: Sequence[tuple[str, list[int]]], metadata: dict
                    ) -> list[ScoreResult]:
        """One :class:`ScoreResult` per ``(text, token_ids)`` completion, in order."""
        return ray.get(self.score_group_async(prompt, completions, metadata))

    def score_group_async(self, prompt: str, completions: Sequence[tuple[str, list[int]]], metadata: dict
                          ) -> ray.ObjectRef:
        """Like :meth:`score_group`; the reference resolves to the list of results."""
        with self._lock:
            if not self._workers:
                raise RuntimeError("reward pool has no workers (shut down?)")
            for worker, refs in self._in_flight.items():
                if refs:
                    _, self._in_flight[worker] = ray.wait(refs, num_returns=len(refs), timeout=0)
            worker = min(self._workers, key=lambda w: len(self._in_flight[w]))
            ref = worker.score_group.remote(prompt, list(completions), metadata)
            self._in_flight[worker].append(ref)
            return ref

    def stats(self) -> RewardStats:
        """Summed over all workers, past ones included."""
        return sum(ray.get([worker.stats.remote() for worker in self.handles()]), self._retired_stats)

    def scale(self, num_workers: int) -> None:
        """Start or retire workers until there are ``num_workers``; a retired worker first
        finishes the calls this pool sent it (handles given out earlier may stop working)."""
        if num_workers < 1:
            raise ValueError(f"a reward pool needs at least one worker, got {num_workers}")
        with self._lock:
            started = [RewardWorker.options(**self._options).remote(self._spec)
                       for _ in range(num_workers - len(self._workers))]
            try:
                ray.get([worker.ready.remote() for worker in started])
            except BaseException:
                for worker in started:
                    ray.kill(worker)
                raise
            for worker in started:
                self._workers.append(worker)
                self._in_flight[worker] = []
            retiring = self._workers[num_workers:]
            del self._workers[num_workers:]
        self._retire(retiring)

    def handles(self) -> list[ray.actor.ActorHandle]:
        with self._lock:
            return list(self._workers)

    def shutdown(self) -> None:
        """Retire every worker (their stats stay in :meth:`stats`)."""
        with self._lock:
            retiring, self._workers = self._workers, []
        self._retire(retiring)

    def _retire(self, workers: list[ray.actor.ActorHandle]) -> None:
        if not workers:
            return
        # Queued behind this pool's earlier calls to each worker, so those finish first.
        self._retired_stats = sum(ray.get([worker.stats.remote() for worker in workers]), self._retired_stats)
        ray.get([worker.close.remote() for worker in workers])
        for worker in workers:
            ray.kill(worker)
            self._in_flight.pop(worker, None)
