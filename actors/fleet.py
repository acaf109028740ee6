"""ActorFleet: a resizable set of RolloutActor Ray actors serving one learner.

Scaling down stops an actor and kills it; the prompts it had leased but not delivered are re-issued
by the learner when their leases expire, so nothing is lost. A dead actor (crash, node loss, or an
id the learner reports as silent) is replaced by a fresh one with a new id.

For runtime control from outside the run, ``start_named_fleet`` wraps the fleet in a named Ray actor
and ``set_actor_count(n)`` (or ``python -m actors.fleet N``) resizes it.
"""

from __future__ import annotations

import argparse
import logging
import threading

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from actors.config import ActorConfig
from actors.rollout_actor import RolloutActor

log = logging.getLogger(__name__)

FLEET_NAME = "tandem-fleet"
FLEET_NAMESPACE = "tandem"
# run() occupies one thread of the actor; stats(), stop() and greedy() need others.
ACTOR_CONCURRENCY = 4
# The engine must live in the actor's own process (fast start, weight arrays passed without copies);
# Ray merges these with the job's env_vars (e.g. VLLM_CPU_KVCACHE_SPACE).
ACTOR_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}


class ActorFleet:
    """Creates, resizes and replaces RolloutActors; each runs its ``run()`` loop as soon as it exists."""

    def __init__(self, config: ActorConfig, learner_address: str, reward_handles: list,
                 *, id_prefix: str = "actor"):
        self.config = config
        self.learner_address = learner_address
        self.reward_handles = list(reward_handles)
        self.id_prefix = id_prefix
        self._remote_cls = ray.remote(RolloutActor)
        self._handles: dict[str, ray.actor.ActorHandle] = {}
        self._runs: dict[str, ray.ObjectRef] = {}
        self._next_index = 0
        # the named fleet answers several calls at once (stats while a scale is stopping an actor)
        self._lock = threading.RLock()

    def actors(self) -> dict[str, ray.actor.ActorHandle]:
        """Live actors by id, oldest first."""
        with self._lock:
            return dict(self._handles)

    def scale(self, n: int) -> list[str]:
        """Add or remove actors (newest removed first) until ``n`` run; returns the ids now running."""
        if n < 0:
            raise ValueError(f"actor count must be >= 0, got {n}")
        with self._lock:
            while len(self._handles) < n:
                self._spawn()
            for actor_id in list(self._handles)[n:][::-1]:
                self._remove(actor_id, graceful=True)
            return list(self._handles)

    def replace_dead(self, actor_ids: list[str] | None = None) -> list[str]:
        """Replace dead actors with fresh ones; returns the ids of the replacements.

        With ``actor_ids`` (e.g. those the learner reports as silent) those actors are killed and
        replaced; without, the fleet asks Ray which actors died.
        """
        return list(self.replace(actor_ids if actor_ids is not None else self.dead()).values())

    def replace(self, actor_ids: list[str]) -> dict[str, str]:
        """Kill the given actors (those still in the fleet) and start a fresh one for each;
        returns {old id: new id}."""
        with self._lock:
            replaced = {}
            for actor_id in [a for a in actor_ids if a in self._handles]:
                log.warning("replacing rollout actor %s", actor_id)
                self._remove(actor_id, graceful=False)
                replaced[actor_id] = self._spawn()
            return replaced

    def dead(self) -> list[str]:
        """Actors whose process died or whose ``run()`` raised (Ray's view)."""
        with self._lock:
            runs = dict(self._runs)
        if not runs:
            return []
        finished, _ = ray.wait(list(runs.values()), num_returns=len(runs), timeout=0)
        finished_set = set(finished)
        dead = []
        for actor_id, ref in runs.items():
            if ref not in finished_set:
                continue
            try:
                ray.get(ref)
            except (RayActorError, RayTaskError) as error:  # the process died, or run() failed
                log.warning("rollout actor %s is dead: %s", actor_id, str(error)[-2000:])
                dead.append(actor_id)
        return dead

    def stats(self, timeout_s: float = 10.0, actor_ids: list[str] | None = None) -> dict[str, dict]:
        """Each live actor's (or each of ``actor_ids``') ``stats()``; an actor that does not answer in
        time maps to {"error": ...} (plus "dead": True when its process is gone). An actor still starting
        its engine answers only once started."""
        refs = {actor_id: h.stats.remote() for actor_id, h in self.actors().items()
                if actor_ids is None or actor_id in actor_ids}
        out: dict[str, dict] = {}
        for actor_id, ref in refs.items():
            try:
                out[actor_id] = ray.get(ref, timeout=timeout_s)
            except RayActorError as error:
                out[actor_id] = {"error": repr(error), "dead": True}
            except GetTimeoutError as error:
                out[actor_id] = {"error": repr(error)}
        return out

    def wait(self, timeout_s: float | None = None) -> dict[str, dict]:
        """Block until every actor's ``run()`` has returned (dataset exhausted); returns their stats."""
        with self._lock:
            runs = dict(self._runs)
        return dict(zip(runs, ray.get(list(runs.values()), timeout=timeout_s), strict=True))

    def shutdown(self) -> None:
        """Stop and remove every actor."""
        self.scale(0)

    # ------------------------------------------------------------------ internals

    def _spawn(self) -> str:
        actor_id = f"{self.id_prefix}-{self._next_index}"
        self._next_index += 1
        handle = self._remote_cls.options(
            resources={"rollout": 1}, num_cpus=self.config.num_cpus,
            max_concurrency=ACTOR_CONCURRENCY, max_restarts=0, runtime_env={"env_vars": ACTOR_ENV},
        ).remote(actor_id, self.config, self.learner_address, self.reward_handles)
        self._handles[actor_id] = handle
        self._runs[actor_id] = handle.run.remote()
        return actor_id

    def _remove(self, actor_id: str, *, graceful: bool) -> None:
        handle = self._handles.pop(actor_id)
        self._runs.pop(actor_id, None)
        if graceful:
            try:
                ray.get(handle.stop.remote(), timeout=60)
            except (RayActorError, GetTimeoutError) as error:
                log.warning("rollout actor %s did not stop cleanly: %s", actor_id, error)
        ray.kill(handle, no_restart=True)


# ---------------------------------------------------------------------- runtime control


def start_named_fleet(config: ActorConfig, learner_address: str, reward_handles: list,
                      initial_actors: int) -> ray.actor.ActorHandle:
    """Create the fleet inside a named Ray actor (owned by the caller) and start ``initial_actors``."""
    holder = ray.remote(ActorFleet).options(name=FLEET_NAME, namespace=FLEET_NAMESPACE, num_cpus=0,
                                            max_concurrency=4)
    handle = holder.remote(config, learner_address, reward_handles)
    ray.get(handle.scale.remote(initial_actors))
    return handle


def set_actor_count(n: int) -> list[str]:
    """Resize the running fleet (from any process connected to the same Ray cluster)."""
    fleet = ray.get_actor(FLEET_NAME, namespace=FLEET_NAMESPACE)
    return ray.get(fleet.scale.remote(n))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Set the number of rollout actors of a running tandem run.")
    parser.add_argument("actors", type=int, help="new actor count")
    parser.add_argument("--address", default="auto", help="Ray cluster address")
    args = parser.parse_args(argv)
    ray.init(address=args.address, namespace=FLEET_NAMESPACE, log_to_driver=False)
    print(" ".join(set_actor_count(args.actors)))


if __name__ == "__main__":
    main()
