"""ActorFleet: a resizable set of RolloutActor Ray actors serving one learner.

Scaling down stops an actor and kills it; the prompts it had leased but not delivered are re-issued
by the learner when their leases expire, so nothing is lost. A dead actor (crash, node loss, or an
id the learner reports as silent) is replaced by a fresh one with a new id, following the fleet's
RestartPolicy: an actor that keeps dying right after it starts is restarted with growing back-off
and finally given up (``health()`` says which and why).

Identity: the fleet holds the run's enrollment key (tandem_wire/enrollment.py) and hands each actor it
spawns the token of its id, nothing more, so only ids this fleet started can register with the learner.
An id the fleet replaced or removed is *retired* (``retired()``): ids are never reused, and the
driver's supervisor tells the learner to refuse those ids from then on.

For an RL run, ``start_named_fleet`` wraps the fleet in a detached, named Ray actor (NamedFleet):
it and its actors outlive the driver that started them, a restarted driver of the same run
re-attaches (``attach``, which also moves every actor to the learner's new address), and a fleet
no driver has touched for ``orphan_timeout_s`` shuts itself down. ``set_actor_count(n)`` (or
``python -m actors.fleet N``) resizes it from any process on the cluster.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from dataclasses import dataclass

import ray
from ray.exceptions import AuthenticationError, GetTimeoutError, RayActorError, RayTaskError

from actors.config import ENGINE_ENV, FLEET_NAME, FLEET_NAMESPACE, ActorConfig, RestartPolicy
from actors.rollout_actor import RolloutActor
from actors.stats import ActorStats, FleetHealth, FleetInfo, GivenUp, NoAnswer
from tandem_wire import enrollment

log = logging.getLogger(__name__)

# run() occupies one thread of the actor; stats(), stop() and greedy() need others.
ACTOR_CONCURRENCY = 4


@dataclass
class _Member:
    """One live actor of the fleet."""

    handle: ray.actor.ActorHandle
    run: ray.ObjectRef  # its run() loop: finishes when the actor dies or the dataset is exhausted
    started_at: float  # time.monotonic() of its spawn
    quick_failures: int  # quick deaths in a row of its slot before it


@dataclass
class PendingRestart:
    """A replacement waiting out its back-off."""

    replaces: str  # the dead actor's id
    failures: int  # quick deaths in a row of this slot so far
    due: float  # time.monotonic() when it may start


class ActorFleet:
    """Creates, resizes and replaces RolloutActors; each runs its ``run()`` loop as soon as it exists.

    ``detached`` actors outlive the process that created the fleet (used by NamedFleet).
    ``enrollment_key``: the run's, which its learner holds too (None: a fresh one, for a learner with
    server.open_enrollment or one that asks ``enrollment_key()``)."""

    def __init__(self, config: ActorConfig, learner_address: str, reward_handles: list,
                 *, id_prefix: str = "actor", restart: RestartPolicy | None = None, detached: bool = False,
                 enrollment_key: bytes | None = None):
        self.config = config
        self.learner_address = learner_address
        self.reward_handles = list(reward_handles)
        self.id_prefix = id_prefix
        self.restart = restart or RestartPolicy()
        self._remote_cls = ray.remote(RolloutActor)
        self._lifetime = {"lifetime": "detached"} if detached else {}
        self._members: dict[str, _Member] = {}  # by actor id, oldest first
        self._pending: list[PendingRestart] = []
        self._given_up: list[GivenUp] = []
        self._retired: list[str] = []  # ids replaced or removed, oldest first
        self._enrollment_key = enrollment_key or enrollment.new_key()
        self._next_index = 0
        # the named fleet answers several calls at once (stats while a scale is stopping an actor)
        self._lock = threading.RLock()

    def enrollment_key(self) -> bytes:
        """The run's enrollment key, for a restarted driver's learner (over Ray only: never to an actor)."""
        return self._enrollment_key

    def retired(self) -> list[str]:
        """The ids of every actor this fleet replaced or removed: the learner refuses them."""
        with self._lock:
            return list(self._retired)

    def actors(self) -> dict[str, ray.actor.ActorHandle]:
        """Live actors by id, oldest first."""
        with self._lock:
            return {actor_id: m.handle for actor_id, m in self._members.items()}

    def scale(self, n: int) -> list[str]:
        """Add or remove actors until ``n`` run or wait to restart (removing waiting restarts first,
        then the newest actors); returns the ids now running."""
        if n < 0:
            raise ValueError(f"actor count must be >= 0, got {n}")
        with self._lock:
            while len(self._members) + len(self._pending) < n:
                self._spawn()
            while len(self._members) + len(self._pending) > n:
                if self._pending:
                    self._pending.pop()
                else:
                    self._remove(next(reversed(self._members)), graceful=True)
            return list(self._members)

    def replace_dead(self, actor_ids: list[str] | None = None) -> list[str]:
        """Replace dead actors; returns the ids of the replacements started now (others may wait
        out a back-off: see ``reconcile``).

        With ``actor_ids`` (e.g. those the learner reports as silent) those actors are killed and
        replaced; without, the fleet asks Ray which actors died.
        """
        replaced = self.replace(actor_ids if actor_ids is not None else self.dead())
        return [new for new in replaced.values() if new]

    def replace(self, actor_ids: list[str]) -> dict[str, str]:
        """Kill the given actors (those still in the fleet) and replace each per the RestartPolicy;
        returns {old id: new id, or "" when the replacement waits out a back-off or was given up}."""
        with self._lock:
            now = time.monotonic()
            replaced = {}
            for actor_id in [a for a in actor_ids if a in self._members]:
                member = self._members[actor_id]
                lived = now - member.started_at
                failures = member.quick_failures + 1 if lived < self.restart.stable_after_s else 1
                self._remove(actor_id, graceful=False)
                delay = self.restart.delay_s(failures)
                if delay is None:
                    reason = (f"{failures} actors of this slot died within {self.restart.stable_after_s:.0f} s "
                              f"of starting; the last lived {lived:.1f} s")
                    log.error("rollout actor %s: giving its slot up: %s", actor_id, reason)
                    self._given_up.append(GivenUp(actor_id, failures, reason))
                    replaced[actor_id] = ""
                elif delay > 0:
                    log.warning("rollout actor %s died %.1f s after it started (%d in a row): restarting in "
                                "%.1f s", actor_id, lived, failures, delay)
                    self._pending.append(PendingRestart(actor_id, failures, now + delay))
                    replaced[actor_id] = ""
                else:
                    log.warning("replacing rollout actor %s", actor_id)
                    replaced[actor_id] = self._spawn(failures)
            return replaced

    def reconcile(self) -> list[str]:
        """Start the replacements whose back-off is over; returns their ids."""
        with self._lock:
            now = time.monotonic()
            due = [p for p in self._pending if p.due <= now]
            self._pending = [p for p in self._pending if p.due > now]
            return [self._spawn(p.failures) for p in due]

    def health(self) -> FleetHealth:
        """Live actor ids, restarts waiting out a back-off, and slots given up (with the reason)."""
        with self._lock:
            now = time.monotonic()
            return FleetHealth(actors=tuple(self._members),
                               pending={p.replaces: max(0.0, p.due - now) for p in self._pending},
                               given_up=tuple(self._given_up))

    def dead(self) -> list[str]:
        """Actors whose process died or whose ``run()`` raised (Ray's view)."""
        with self._lock:
            runs = {actor_id: m.run for actor_id, m in self._members.items()}
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

    def stats(self, timeout_s: float = 10.0, actor_ids: list[str] | None = None
              ) -> dict[str, ActorStats | NoAnswer]:
        """Each live actor's (or each of ``actor_ids``') ``stats()``; an actor that does not answer in
        time maps to a NoAnswer. An actor still starting its engine answers only once started."""
        refs = {actor_id: h.stats.remote() for actor_id, h in self.actors().items()
                if actor_ids is None or actor_id in actor_ids}
        out: dict[str, ActorStats | NoAnswer] = {}
        for actor_id, ref in refs.items():
            try:
                out[actor_id] = ray.get(ref, timeout=timeout_s)
            except RayActorError as error:
                out[actor_id] = NoAnswer(repr(error), dead=True)
            except GetTimeoutError as error:
                out[actor_id] = NoAnswer(repr(error), dead=False)
        return out

    def retarget(self, learner_address: str) -> list[str]:
        """Point every actor (and every future one) at the learner's new address; returns the ids told."""
        with self._lock:
            self.learner_address = learner_address
            handles = self.actors()
        refs = {actor_id: h.retarget.remote(learner_address) for actor_id, h in handles.items()}
        told = []
        for actor_id, ref in refs.items():
            try:
                ray.get(ref, timeout=60)
                told.append(actor_id)
            except (RayActorError, GetTimeoutError) as error:  # the supervisor replaces it
                log.warning("rollout actor %s did not take the new learner address: %r", actor_id, error)
        return told

    def wait(self, timeout_s: float | None = None) -> dict[str, ActorStats]:
        """Block until every actor's ``run()`` has returned (dataset exhausted); returns their stats."""
        with self._lock:
            runs = {actor_id: m.run for actor_id, m in self._members.items()}
        return dict(zip(runs, ray.get(list(runs.values()), timeout=timeout_s), strict=True))

    def shutdown(self) -> None:
        """Stop and remove every actor."""
        self.scale(0)

    # ------------------------------------------------------------------ internals

    def _spawn(self, quick_failures: int = 0) -> str:
        actor_id = f"{self.id_prefix}-{self._next_index}"
        self._next_index += 1
        handle = self._remote_cls.options(
            resources={"rollout": 1}, num_cpus=self.config.num_cpus, max_concurrency=ACTOR_CONCURRENCY,
            max_restarts=0, runtime_env={"env_vars": ENGINE_ENV}, **self._lifetime,
        ).remote(actor_id, self.config, self.learner_address, self.reward_handles,
                 enrollment.token(self._enrollment_key, actor_id))
        self._members[actor_id] = _Member(handle, handle.run.remote(), time.monotonic(), quick_failures)
        return actor_id

    def _remove(self, actor_id: str, *, graceful: bool) -> None:
        handle = self._members.pop(actor_id).handle
        self._retired.append(actor_id)
        if graceful:
            try:
                ray.get(handle.stop.remote(), timeout=60)
            except (RayActorError, GetTimeoutError) as error:
                log.warning("rollout actor %s did not stop cleanly: %s", actor_id, error)
        ray.kill(handle, no_restart=True)


class NamedFleet(ActorFleet):
    """The fleet of one RL run as a detached, named Ray actor that outlives its driver.

    ``run_key`` says which run (and which actor and reward settings) it serves, so that only a
    restarted driver of the same run re-attaches. It owns the reward workers it was handed: when no
    driver has called ``touch``/``attach`` for ``orphan_timeout_s`` (0: never) it stops its actors,
    kills the reward workers and exits, so a crashed run that is never restarted leaks nothing.
    """

    def __init__(self, config: ActorConfig, learner_address: str, reward_handles: list, *, run_key: str = "",
                 orphan_timeout_s: float = 0.0, restart: RestartPolicy | None = None,
                 enrollment_key: bytes | None = None):
        super().__init__(config, learner_address, reward_handles, restart=restart, detached=True,
                         enrollment_key=enrollment_key)
        self.run_key = run_key
        self.orphan_timeout_s = orphan_timeout_s
        self._touched = time.monotonic()
        if orphan_timeout_s > 0:
            threading.Thread(target=self._watch_for_orphaning, name="tandem-fleet-orphan-watch", daemon=True).start()

    def touch(self) -> None:
        """A driver is alive and using this fleet."""
        self._touched = time.monotonic()

    def describe(self) -> FleetInfo:
        """Which run this fleet serves, how long since a driver touched it, its actors and reward workers."""
        return FleetInfo(run_key=self.run_key, idle_s=time.monotonic() - self._touched,
                         learner_address=self.learner_address, actors=tuple(self.actors()),
                         reward_handles=tuple(self.reward_handles))

    def attach(self, learner_address: str) -> list[str]:
        """A (restarted) driver takes the fleet over: its actors move to ``learner_address``."""
        self.touch()
        return self.retarget(learner_address)

    def close(self) -> None:
        """Stop every actor and kill the reward workers (the caller then kills this actor)."""
        self.shutdown()
        for worker in self.reward_handles:
            ray.kill(worker, no_restart=True)

    def _watch_for_orphaning(self) -> None:
        while (idle := time.monotonic() - self._touched) < self.orphan_timeout_s:
            time.sleep(min(5.0, self.orphan_timeout_s - idle + 0.1))
        log.error("no driver touched fleet of run %s for %.0f s: shutting it down", self.run_key, idle)
        try:
            self.close()
        finally:
            os._exit(0)  # a detached actor with no restarts: its process exiting ends it


# ---------------------------------------------------------------------- runtime control


def start_named_fleet(config: ActorConfig, learner_address: str, reward_handles: list, initial_actors: int,
                      *, name: str = FLEET_NAME, run_key: str = "", orphan_timeout_s: float = 0.0,
                      restart: RestartPolicy | None = None,
                      enrollment_key: bytes | None = None) -> ray.actor.ActorHandle:
    """Create a detached NamedFleet called ``name`` and start ``initial_actors``, enrolled under
    ``enrollment_key`` (the learner's). Whoever ends the run calls ``close`` on it and kills it (or
    leaves that to ``orphan_timeout_s``)."""
    holder = ray.remote(NamedFleet).options(name=name, namespace=FLEET_NAMESPACE, num_cpus=0, max_concurrency=4,
                                            lifetime="detached", max_restarts=0)
    handle = holder.remote(config, learner_address, reward_handles, run_key=run_key,
                           orphan_timeout_s=orphan_timeout_s, restart=restart, enrollment_key=enrollment_key)
    ray.get(handle.scale.remote(initial_actors))
    return handle


def find_named_fleet(name: str = FLEET_NAME) -> ray.actor.ActorHandle | None:
    """The live fleet called ``name`` on this cluster, if any."""
    try:
        return ray.get_actor(name, namespace=FLEET_NAMESPACE)
    except ValueError:
        return None


def close_named_fleet(name: str = FLEET_NAME, timeout_s: float = 60.0) -> bool:
    """Stop the fleet called ``name`` (its actors and reward workers), kill it and wait until the name
    is free again; False when there was none."""
    fleet = find_named_fleet(name)
    if fleet is None:
        return False
    try:
        ray.get(fleet.close.remote(), timeout=timeout_s)
    except (RayActorError, GetTimeoutError) as error:
        log.warning("fleet %r did not close cleanly: %r", name, error)
    ray.kill(fleet, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while find_named_fleet(name) is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fleet {name!r} still exists {timeout_s:.0f} s after it was killed")
        time.sleep(0.2)
    return True


def set_actor_count(n: int, name: str = FLEET_NAME) -> list[str]:
    """Resize the running fleet (from any process connected to the same Ray cluster)."""
    fleet = find_named_fleet(name)
    if fleet is None:
        raise LookupError(f"no tandem fleet named {name!r} runs on this cluster")
    return ray.get(fleet.scale.remote(n))


class ClusterUnreachable(ConnectionError):
    """ray.init could not join a running cluster; the message says why and how to fix it."""


def join_cluster(address: str, **init_options) -> None:
    """``ray.init(address=...)`` for a process joining a running cluster. Failing, it raises
    ClusterUnreachable naming the likely fix: a head started with Ray's token auth admits only clients
    with RAY_AUTH_MODE=token and its token; otherwise Ray gives a bare AuthenticationError or, after
    ~20 s of retries, "Failed to connect"."""
    try:
        ray.init(address=address, **init_options)
    except (ConnectionError, AuthenticationError) as error:
        where = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
        reason = (error.message if isinstance(error, AuthenticationError) else str(error)).rstrip(".")
        message = f"cannot join the Ray cluster at {where or 'auto'!r}: {reason}"
        if where or isinstance(error, AuthenticationError):  # else no cluster was found at all
            message += f". {_token_auth_fix()}"
        raise ClusterUnreachable(message) from None


def _token_auth_fix() -> str:
    mode = os.environ.get("RAY_AUTH_MODE")  # read after the attempt: ray.init("auto") may have set it
    if mode != "token":
        return (f"RAY_AUTH_MODE is {mode or 'unset'} here. If the cluster uses token auth (`ray start` turns it "
                "on when RAY_AUTH_MODE=token or ~/.ray/auth_token exists), `export RAY_AUTH_MODE=token` and run "
                "again (README.md, 'Running it yourself')")
    return ("RAY_AUTH_MODE=token here: this process must read the token the cluster was started with (from "
            "RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token; `ray get-auth-token` "
            "on the head prints it)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Set the number of rollout actors of a running tandem run, or close the fleet a stopped "
                    "run left behind (its actors and reward workers wait rollout.orphan_timeout_s for a "
                    "restarted driver). Against a cluster with Ray's token auth, run it with "
                    "RAY_AUTH_MODE=token, like every other Ray client.")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("actors", type=int, nargs="?", help="new actor count")
    target.add_argument("--close", action="store_true", help="stop and remove the fleet, its actors and "
                                                             "reward workers")
    parser.add_argument("--address", default="auto", help="Ray cluster address")
    parser.add_argument("--name", default=FLEET_NAME, help="the run's rollout.fleet_name")
    args = parser.parse_args(argv)
    try:
        join_cluster(args.address, namespace=FLEET_NAMESPACE, log_to_driver=False)
        if args.close:
            print(f"closed {args.name}" if close_named_fleet(args.name) else f"no fleet named {args.name!r}")
        else:
            print(" ".join(set_actor_count(args.actors, args.name)))
    except (ClusterUnreachable, LookupError) as error:  # one line that says what to do, not a traceback
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
