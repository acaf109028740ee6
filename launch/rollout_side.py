"""The rollout side of an RL run: the reward workers and the named fleet of rollout actors.

Both are detached Ray actors, so a driver (launch/rl.py) that dies (SIGKILL, out of memory, its node
lost) does not take them along. A restarted driver of the same run finds the fleet by
``rollout.fleet_name``, checks that it serves this run (``run_key``: run dir plus the actor and reward
settings), re-attaches to it (its actors move to the new learner address, re-register and re-send
their unacknowledged groups) and adopts its reward workers. A fleet another run left behind is
closed first when no driver has touched it lately; one with a live driver is an error (two runs on
one cluster need their own fleet names). A fleet whose driver never comes back shuts itself down
after ``rollout.orphan_timeout_s``.

Enrollment (tandem_wire/enrollment.py): a fresh fleet gets a fresh key from the driver, which gives
the same key to its learner. A restarted driver asks this run's fleet for its key first
(``fleet_enrollment_key``) and builds its learner with it, so the fleet's actors re-register with the
tokens they hold.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from actors.config import ActorConfig
from actors.fleet import close_named_fleet, find_named_fleet, start_named_fleet
from actors.stats import FleetInfo
from launch.config import ConfigError
from launch.run import Run
from rewards.pool import RewardPool
from rewards.types import RewardStats

log = logging.getLogger(__name__)

# A fleet touched this recently has a live driver (its supervisor touches it every second).
LIVE_DRIVER_S = 15.0
DETACHED = {"lifetime": "detached"}


@dataclass
class RolloutSide:
    pool: RewardPool
    fleet: ray.actor.ActorHandle
    attached: bool  # re-attached to the fleet an earlier driver of this run started
    reward_stats: RewardStats | None = None  # the reward pool's, once closed

    def close(self) -> None:
        """Stop the actors, retire the reward workers (keeping their stats) and end the fleet."""
        try:
            ray.get(self.fleet.shutdown.remote())
            self.reward_stats = self.pool.stats()
        finally:
            self.pool.shutdown()
            ray.kill(self.fleet, no_restart=True)


def run_key(run: Run, actor_config: ActorConfig) -> str:
    """Identifies the rollout side a run needs: its dir, what each actor runs, how rewards are scored."""
    rewards = run.config.rewards
    settings = {"actor": actor_config.model_dump(), "rewards": rewards.spec().model_dump(),
                "reward_workers": rewards.num_workers}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{run.run_dir.resolve()}#{digest}"


def fleet_enrollment_key(run: Run) -> bytes | None:
    """The enrollment key of the fleet an earlier driver of this run left, if any: the learner a
    restarted driver builds must accept the tokens that fleet's actors hold."""
    fleet = find_named_fleet(run.config.rollout.fleet_name)
    info = _describe(fleet) if fleet is not None else None
    if info is None or info.run_key != run_key(run, run.config.actor_config(run.model_dir)):
        return None
    return ray.get(fleet.enrollment_key.remote(), timeout=60)


def _same_key(fleet: ray.actor.ActorHandle, enrollment_key: bytes) -> bool:
    try:
        return hmac.compare_digest(ray.get(fleet.enrollment_key.remote(), timeout=60), enrollment_key)
    except (ray.exceptions.RayError, TimeoutError):
        return False


def open_rollout_side(run: Run, learner_address: str, enrollment_key: bytes) -> RolloutSide:
    """Re-attach to this run's fleet if an earlier driver left one, else start reward workers and a fleet
    enrolling its actors under ``enrollment_key`` (the learner's)."""
    config, rollout = run.config, run.config.rollout
    actor_config = config.actor_config(run.model_dir)
    key = run_key(run, actor_config)
    spec, num_workers = config.rewards.spec(), config.rewards.num_workers
    fleet = find_named_fleet(rollout.fleet_name)
    if fleet is not None:
        info = _describe(fleet)
        ours = info is not None and info.run_key == key
        if ours and _same_key(fleet, enrollment_key):
            pool = RewardPool(spec, num_workers, actor_options=DETACHED, workers=info.reward_handles)
            moved = ray.get(fleet.attach.remote(learner_address))
            ray.get(fleet.scale.remote(rollout.num_actors))
            log.warning("re-attached to fleet %r left by an earlier driver of this run: actors %s now serve %s",
                        rollout.fleet_name, moved, learner_address)
            return RolloutSide(pool, fleet, attached=True)
        if ours:  # the learner was built without this fleet's key (it did not answer in time): its actors
            # would be refused, so the fleet is replaced; the restored learner re-leases their prompts
            log.warning("fleet %r holds another enrollment key than this learner: replacing it", rollout.fleet_name)
        elif info is not None and info.idle_s < LIVE_DRIVER_S:
            raise ConfigError(f"rollout.fleet_name {rollout.fleet_name!r} is in use by a running run "
                              f"({info.run_key.split('#')[0]}); give this run another rollout.fleet_name")
        else:
            log.warning("closing fleet %r left by another run or other settings (%s)", rollout.fleet_name,
                        info.run_key if info else "not answering")
        close_named_fleet(rollout.fleet_name)
    pool = RewardPool(spec, num_workers, actor_options=DETACHED)
    try:
        fleet = start_named_fleet(actor_config, learner_address, pool.handles(), rollout.num_actors,
                                  name=rollout.fleet_name, run_key=key, orphan_timeout_s=rollout.orphan_timeout_s,
                                  restart=rollout.restart, enrollment_key=enrollment_key)
    except BaseException:
        pool.shutdown()
        raise
    return RolloutSide(pool, fleet, attached=False)


def _describe(fleet: ray.actor.ActorHandle) -> FleetInfo | None:
    try:
        return ray.get(fleet.describe.remote(), timeout=60)
    except (RayActorError, GetTimeoutError):
        return None
