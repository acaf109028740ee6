"""FleetSupervisor: during an RL run, find dead or hung rollout actors and replace them.

An actor is replaced when
  - Ray reports it dead (process killed, node lost, or its ``run()`` raised): ``fleet.dead()``;
  - the learner has not heard from it for ``actor_timeout_s`` (``LearnerService.actors_status()``
    marks it stale: process frozen, network cut);
  - its engine has been inside one call (a streaming step, or a sync-mode ``generate``) for longer
    than ``generate_timeout_s`` (the heartbeat thread still beats, but the engine stopped
    answering), or it has not answered ``stats()`` for as long. One unanswered call is not enough: on
    a loaded machine (a restarted driver compiling its learner beside the actors) a live actor can
    miss the call's timeout, and CI saw such an actor replaced in the middle of a run.

A replacement is a new RolloutActor with a new id; it fetches the learner's current weights before
it samples. Replacements follow the fleet's RestartPolicy (back-off for actors that die right after
they start, then giving the slot up); when every slot is given up, ``on_fatal`` is called with the
reason (the RL run stops with it instead of waiting for groups that will never come). Each round
also touches the fleet, which tells a detached fleet that its driver is alive, and retires at the
learner every id the fleet replaced or removed (``fleet.retired()``, so a restarted driver's learner
learns them in its first round): a superseded actor, or whoever holds its enrollment token, is refused.

The prompts the old actor had leased but not delivered come back when their leases
expire (``lease_seconds``), so nothing is lost, and the learner's de-duplication by group id means
nothing is consumed twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from actors.stats import GivenUp, NoAnswer
from learner.service.server import LearnerService
from tandem_wire.background import BackgroundLoop

log = logging.getLogger(__name__)

# One generate call of a big batch of long completions can take minutes on slow hardware; only a call
# stuck for longer than this counts as a hung engine (tests pass a short value).
DEFAULT_GENERATE_TIMEOUT_S = 600.0


@dataclass
class Replacement:
    """One replaced actor: why, and the id of the actor that took its place ("" while it waits out a
    back-off, or when its slot was given up; a "backoff" entry is such a delayed start)."""

    actor_id: str
    reason: str  # "dead" | "silent" | "hung" | "backoff"
    replacement_id: str
    at: float  # time.time() of the replacement


@dataclass
class SupervisorReport:
    replacements: list[Replacement] = field(default_factory=list)
    checks: int = 0
    given_up: tuple[GivenUp, ...] = ()  # the fleet's health().given_up
    fatal: str = ""  # why the run cannot go on (every slot given up)

    def as_dict(self) -> dict:
        return {"checks": self.checks, "replaced": sum(r.reason != "backoff" for r in self.replacements),
                "replacements": [vars(r) for r in self.replacements],
                "given_up": [asdict(g) for g in self.given_up],
                "fatal": self.fatal}


class FleetSupervisor(BackgroundLoop):
    """A daemon thread that checks the fleet every ``interval_s`` (``start()`` / ``stop()``, or ``with``)."""

    def __init__(self, service: LearnerService, fleet: ray.actor.ActorHandle, *,
                 generate_timeout_s: float = DEFAULT_GENERATE_TIMEOUT_S, interval_s: float = 1.0,
                 call_timeout_s: float = 10.0, on_fatal: Callable[[str], None] | None = None):
        """Silence is judged by the service (its ``actor_timeout_s``); ``generate_timeout_s`` is the
        longest plausible single generate call."""
        super().__init__("tandem-fleet-supervisor", join_timeout_s=call_timeout_s * 3)
        self.service, self.fleet = service, fleet
        self.generate_timeout_s, self.interval_s, self.call_timeout_s = generate_timeout_s, interval_s, call_timeout_s
        self.on_fatal = on_fatal
        self.report = SupervisorReport()
        self._unanswered_since: dict[str, float] = {}  # actor id -> monotonic time of its first unanswered call

    def stop(self) -> dict:
        """Stop checking; returns the report (replacements made, checks run)."""
        super().stop()
        return self.report.as_dict()

    def check(self) -> list[Replacement]:
        """One round: replace the dead, the silent and the hung; returns what was replaced."""
        self.fleet.touch.remote()
        self._start_restarts()
        done = self._replace(None, "dead")
        live = set(self._call(self.fleet.actors.remote()))
        registered = {a.actor_id: a for a in self.service.actors_status() if a.actor_id in live}
        done += self._replace(sorted(a for a, view in registered.items() if view.stale), "silent")
        # only registered actors: one still starting its engine cannot answer yet
        answering = sorted(a for a, view in registered.items() if not view.stale)
        stats = self._call(self.fleet.stats.remote(self.call_timeout_s, answering)) if answering else {}
        unanswered = {actor_id: s for actor_id, s in stats.items() if isinstance(s, NoAnswer)}
        dead = sorted(actor_id for actor_id, s in unanswered.items() if s.dead)
        done += self._replace(dead, "dead")
        # an actor that did not answer may have gone silent meanwhile (frozen process): say so
        stale_now = {a.actor_id for a in self.service.actors_status() if a.stale}
        done += self._replace(sorted((set(unanswered) - set(dead)) & stale_now), "silent")
        silent_for = self._note_unanswered(stats)
        hung = sorted(actor_id for actor_id, s in stats.items() if actor_id not in stale_now | set(dead)
                      and (silent_for.get(actor_id, 0.0) > self.generate_timeout_s
                           or not isinstance(s, NoAnswer) and s.engine_busy_s > self.generate_timeout_s))
        for actor_id in hung:
            s = stats[actor_id]
            log.warning("rollout actor %s looks hung: %s", actor_id,
                        f"no answer for {silent_for[actor_id]:.0f} s: {s.error}" if isinstance(s, NoAnswer)
                        else f"one engine call busy for {s.engine_busy_s:.1f} s")
        done += self._replace(hung, "hung")
        self.service.retire(self._call(self.fleet.retired.remote()))
        self.report.checks += 1
        self._check_given_up()
        return done

    def _note_unanswered(self, stats: dict) -> dict[str, float]:
        """How long each actor that did not answer this round has gone without answering."""
        now = time.monotonic()
        self._unanswered_since = {actor_id: self._unanswered_since.get(actor_id, now)
                                  for actor_id, s in stats.items() if isinstance(s, NoAnswer)}
        return {actor_id: now - since for actor_id, since in self._unanswered_since.items()}

    def _start_restarts(self) -> None:
        """Start the replacements whose back-off is over."""
        for new in self._call(self.fleet.reconcile.remote()):
            log.warning("rollout actor %s started after a back-off", new)
            self.report.replacements.append(Replacement("", "backoff", new, time.time()))

    def _check_given_up(self) -> None:
        """Report slots given up; with none left running or waiting, the fleet is finished: on_fatal."""
        health = self._call(self.fleet.health.remote())
        self.report.given_up = health.given_up
        if health.given_up and not health.actors and not health.pending and not self.report.fatal:
            last = health.given_up[-1]
            self.report.fatal = (f"every rollout actor slot was given up after repeated crashes; last: actor "
                                 f"{last.actor_id}: {last.reason}")
            log.error("%s", self.report.fatal)
            if self.on_fatal is not None:
                self.on_fatal(self.report.fatal)

    def _replace(self, actor_ids: list[str] | None, reason: str) -> list[Replacement]:
        """Replace ``actor_ids`` (None: those Ray reports dead)."""
        targets = actor_ids if actor_ids is not None else self._call(self.fleet.dead.remote())
        if not targets:
            return []
        replaced = self._call(self.fleet.replace.remote(targets))
        done = [Replacement(old, reason, new, time.time()) for old, new in replaced.items()]
        for r in done:
            log.warning("rollout actor %s was %s: replaced by %s", r.actor_id, reason,
                        r.replacement_id or "nothing yet (back-off or given up)")
        self.report.replacements += done
        return done

    def _call(self, ref: ray.ObjectRef):
        return ray.get(ref, timeout=self.call_timeout_s * 3)

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            try:
                self.check()
            except (RayActorError, GetTimeoutError) as error:  # the fleet itself is busy or gone
                log.warning("fleet check failed: %r", error)
            except Exception:  # keep supervising (and touching the fleet, which otherwise shuts down)
                log.exception("fleet check failed")
