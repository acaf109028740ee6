"""The learner's prompt service: it owns the dataset and leases prompts to actors.

Each prompt of each epoch has a stable key, f"{epoch}:{index}", which is also the group id of the
group sampled from it. A prompt is issued in a seeded shuffled order, leased to one actor for
`lease_seconds`, re-issued to any actor when the lease expires or the group was dropped as stale,
and retired for good when its group is consumed (or the actor rejected it as too long). Because
a re-issued prompt keeps its key, a late copy of its group is recognised as a duplicate.

How many prompts may be in use at once is the lease budget's (learner/service/lease_budget.py): each
outstanding prompt holds one slot unless its group was dropped (then the re-issue takes a new one),
a consumed prompt keeps its slot, a rejected or untrained one gives it back. An expired lease keeps
its slot until it is re-issued, so re-issuing it needs no allowance and a dead actor's prompts are
never stuck behind a spent budget.

Checkpointed state is compact: the cursor (epoch, position), the number of fully retired epochs
and the retired indices of the others, the budget's counts and the outstanding prompts that hold no
slot. Everything issued but not retired is outstanding, so a restored source re-creates those leases
(with a fresh expiry, giving the actors that hold them time to send their groups again) and neither
loses nor repeats a prompt; the slots in use are what they were when the state was taken (queued
groups the restore forgets keep theirs: their prompts are outstanding again), so a restored learner
neither issues more than the bound nor waits for slots nobody holds.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import threading
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from learner.service.lease_budget import LeaseBudget

STATE_FORMAT = 2
MAX_EARLIER_HOLDERS = 8  # per outstanding prompt; a late copy from an older holder is refused


class PromptState(enum.Enum):
    UNKNOWN = "unknown"  # not a key of this dataset
    # a key the cursor has not reached: what a learner restored from an earlier checkpoint sees for
    # groups its crashed run leased after that checkpoint
    UNISSUED = "unissued"
    OUTSTANDING = "outstanding"  # leased, or waiting to be re-issued
    HELD = "held"  # its group is queued at the learner: the lease does not expire
    RETIRED = "retired"  # consumed or rejected: never leased again


@dataclass(frozen=True)
class Prompt:
    """One prompt of the dataset, and once leased the same prompt under its key: the learner's side
    of the wire message pb.Prompt (actors.learner_client.Prompt is the actor's)."""

    prompt_ids: list[int]
    """the tokens the actors sample a group from"""
    text: str = ""
    """the prompt as text, for the reward functions"""
    metadata: dict[str, str] = field(default_factory=dict)
    """what the reward functions need besides, e.g. the reference answer"""
    group_id: str = ""
    """the key it was leased under, f"{epoch}:{index}"; "" in the dataset"""


@dataclass(frozen=True)
class LeaseInfo:
    """Who may answer an outstanding prompt: its holder ("" = restored from a checkpoint, holder
    unknown) and the earlier holders, whose leases expired before it was re-issued."""

    holder: str
    earlier: tuple[str, ...]


@dataclass
class _Lease:
    actor_id: str
    expires_at: float
    held: bool = False
    earlier: tuple[str, ...] = ()  # earlier holders, oldest first (at most MAX_EARLIER_HOLDERS)
    slot: bool = True  # holds a slot of the lease budget (False once its group was dropped)
    step: int | None = None  # the budget step it was granted at (None: restored from a checkpoint)


class PromptSource:
    """Leases the prompts of a dataset to actors with expiry, re-issue and exactly-once retirement.

    `prompts` is the dataset (launch/ builds it); `epochs=None` cycles forever. Leases are unbounded
    until limit_leases() bounds them. Thread-safe.
    """

    def __init__(
        self,
        prompts: Sequence[Prompt],
        *,
        epochs: int | None = 1,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if len(prompts) == 0:
            raise ValueError("PromptSource needs at least one prompt")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be >= 1 or None, got {epochs}")
        self._prompts = prompts
        self._num = len(prompts)
        self._epochs = epochs
        self._seed = seed
        self._clock = clock
        self._lock = threading.RLock()
        self._epoch = 0  # cursor: next prompt to issue is order(epoch)[pos]
        self._pos = 0
        self._complete_epochs = 0  # every prompt of the epochs below is retired
        self._retired: dict[int, set[int]] = {}  # epoch -> retired indices (epochs >= complete)
        self._leases: dict[str, _Lease] = {}  # the outstanding prompts
        self._counts = {"prompts_leased": 0, "prompts_reissued": 0, "prompts_retired": 0}
        self._orders: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._budget = LeaseBudget()

    # ------------------------------------------------------------------ leasing

    def limit_leases(self, prompts_per_step: int, max_staleness: int) -> None:
        """Bound the slots in use to (max_staleness + step + 1)·prompts_per_step from now on
        (learner/service/lease_budget.py); the learner service calls it with its config."""
        with self._lock:
            self._budget = replace(self._budget, prompts_per_step=prompts_per_step, max_staleness=max_staleness)

    def allowance(self, step: int) -> int | None:
        """Slots the budget still allows after `step` learner steps (None: unbounded)."""
        with self._lock:
            return self._budget.allowance(step)

    def lease(self, actor_id: str, max_prompts: int, lease_seconds: float, step: int = 0) -> list[Prompt]:
        """Up to `max_prompts` prompts for `actor_id`: expired or released ones first, then new ones.
        Only the re-issue of an expired lease (which keeps its slot) is free; the others take a slot,
        as many as the budget allows after `step` learner steps."""
        with self._lock:
            now = self._clock()
            allowance = self._budget.allowance(step)
            room = max_prompts if allowance is None else allowance
            keys: list[str] = []
            expired = sorted(
                (lease.expires_at, key)
                for key, lease in self._leases.items()
                if not lease.held and lease.expires_at <= now
            )
            for _, key in expired:
                if len(keys) == max_prompts:
                    break
                old = self._leases[key]
                if old.slot:
                    self._budget.give_back()  # the expired lease's slot goes to its re-issue
                elif room:
                    room -= 1
                else:
                    continue
                self._budget.take()
                earlier = old.earlier if old.actor_id in ("", *old.earlier) else (*old.earlier, old.actor_id)
                self._leases[key] = _Lease(actor_id, now + lease_seconds, earlier=earlier[-MAX_EARLIER_HOLDERS:],
                                           step=step)
                self._counts["prompts_reissued"] += 1
                keys.append(key)
            while len(keys) < max_prompts and room and not self._cursor_at_end():
                room -= 1
                self._budget.take()
                order, _ = self._order(self._epoch)
                key = f"{self._epoch}:{int(order[self._pos])}"
                self._pos += 1
                if self._pos == self._num:
                    self._epoch, self._pos = self._epoch + 1, 0
                self._leases[key] = _Lease(actor_id, now + lease_seconds, step=step)
                keys.append(key)
            self._counts["prompts_leased"] += len(keys)
            return [self.prompt(key) for key in keys]

    def late_leases(self, through_step: int, moved_on: Container[str] = ()) -> tuple[int, float]:
        """The leases granted at budget step `through_step` or earlier whose groups have not come back
        and which have not expired, except those of the holders in `moved_on` (they have loaded newer
        weights since: what they had not finished is sampled again with those): how many, and the
        seconds until the first of them expires (inf when there are none). The learner waits for them
        before a step that would make them stale."""
        with self._lock:
            now = self._clock()
            expiries = [lease.expires_at for lease in self._leases.values()
                        if not lease.held and lease.step is not None and lease.step <= through_step
                        and lease.expires_at > now and lease.actor_id not in moved_on]
            return len(expiries), min(expiries, default=math.inf) - now

    def exhausted(self) -> bool:
        """True when every epoch has been issued and no prompt is outstanding."""
        with self._lock:
            return self._cursor_at_end() and not self._leases

    def state(self, group_id: str) -> PromptState:
        with self._lock:
            key = self._parse_key(group_id)
            if key is None:
                return PromptState.UNKNOWN
            if not self._issued(*key):
                return PromptState.UNISSUED
            if self._is_retired(*key):
                return PromptState.RETIRED
            lease = self._leases.get(group_id)
            if lease is None:
                return PromptState.UNKNOWN
            return PromptState.HELD if lease.held else PromptState.OUTSTANDING

    def lease_info(self, group_id: str) -> LeaseInfo | None:
        """The lease of an outstanding prompt (None if it is not outstanding)."""
        with self._lock:
            lease = self._leases.get(group_id)
            if lease is None:
                return None
            return LeaseInfo(lease.actor_id, lease.earlier)

    def prompt(self, group_id: str) -> Prompt:
        """The prompt of a key this source issued, carrying that key."""
        parsed = self._parse(group_id)
        if parsed is None:
            raise KeyError(group_id)
        return dataclasses.replace(self._prompts[parsed[1]], group_id=group_id)

    def hold(self, group_id: str) -> None:
        """The prompt's group is queued: its lease no longer expires (and it holds a slot again if a
        drop had given it back: the late copy of an earlier holder)."""
        with self._lock:
            lease = self._outstanding(group_id)
            if not lease.slot:
                self._budget.take()
            lease.held, lease.slot = True, True

    def release(self, group_id: str, holder: str | None = None) -> None:
        """The prompt's group was dropped as stale: give its slot back and re-issue it at the next
        lease. With `holder`, only if that actor holds the lease (a late copy from an earlier lease
        changes nothing)."""
        with self._lock:
            lease = self._outstanding(group_id)
            if holder is None or lease.actor_id == holder:
                self._give_back(lease)
                lease.held, lease.expires_at = False, -math.inf

    def retire(self, group_id: str, *, trained: bool = True) -> None:
        """The prompt's group was consumed (or the prompt rejected): never lease it again. A group
        not `trained` on (rejected, or retired for lack of signal) gives its slot back."""
        with self._lock:
            lease = self._outstanding(group_id)
            if not trained:
                self._give_back(lease)
            epoch, index = self._parse(group_id)
            del self._leases[group_id]
            self._retired.setdefault(epoch, set()).add(index)
            self._counts["prompts_retired"] += 1
            while len(self._retired.get(self._complete_epochs, ())) == self._num:
                del self._retired[self._complete_epochs]
                self._complete_epochs += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {**self._counts, "prompts_outstanding": len(self._leases),
                    "lease_slots_in_use": self._budget.in_use}

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: cursor, retired prompts, counters and the budget's counts with the
        outstanding prompts that hold no slot (leases are re-derived)."""
        with self._lock:
            return {
                "format": STATE_FORMAT,
                "num_prompts": self._num,
                "epochs": self._epochs,
                "seed": self._seed,
                "cursor": [self._epoch, self._pos],
                "complete_epochs": self._complete_epochs,
                "retired": {str(epoch): sorted(indices) for epoch, indices in self._retired.items()},
                "counts": {name: self._counts[name] for name in sorted(self._counts)},
                "budget": self._budget.state_dict(),
                "without_slot": sorted(key for key, lease in self._leases.items() if not lease.slot),
            }

    def load_state_dict(self, state: Mapping[str, Any], *, lease_seconds: float) -> None:
        """Restore a state_dict() of a source over the same dataset, epochs and seed.

        Prompts issued but not retired become outstanding again, leased to nobody for
        `lease_seconds` (their actors may still send the groups), then re-issued; those whose group
        had been dropped are re-issued at the next lease. Each holds the slot it held when the state
        was taken, so the budget's slots in use are unchanged.
        """
        expected = {
            "format": STATE_FORMAT,
            "num_prompts": self._num,
            "epochs": self._epochs,
            "seed": self._seed,
        }
        found = {name: state.get(name) for name in expected}
        if found != expected:
            raise ValueError(f"prompt state does not match this source: saved {found}, here {expected}")
        with self._lock:
            self._epoch, self._pos = (int(v) for v in state["cursor"])
            self._complete_epochs = int(state["complete_epochs"])
            self._retired = {int(epoch): set(indices) for epoch, indices in state["retired"].items()}
            self._counts = {name: int(state["counts"][name]) for name in self._counts}
            self._budget.load_state_dict(state["budget"])
            without_slot = set(state["without_slot"])
            expires_at = self._clock() + lease_seconds
            self._leases = {}
            for epoch in range(self._complete_epochs, self._epoch + 1):
                order, _ = self._order(epoch)
                issued = order if epoch < self._epoch else order[: self._pos]
                retired = self._retired.get(epoch, set())
                for index in issued.tolist():
                    if index not in retired:
                        key = f"{epoch}:{index}"
                        if key in without_slot:  # dropped, waiting for re-issue: nobody will answer it
                            self._leases[key] = _Lease("", -math.inf, slot=False)
                        else:
                            self._leases[key] = _Lease("", expires_at)

    # ------------------------------------------------------------------ internals

    def _give_back(self, lease: _Lease) -> None:
        if lease.slot:
            self._budget.give_back()
            lease.slot = False

    def _cursor_at_end(self) -> bool:
        return self._epochs is not None and self._epoch >= self._epochs

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(order, position of each index in it) of an epoch; a few epochs are cached."""
        if epoch not in self._orders:
            order = np.random.default_rng([self._seed, epoch]).permutation(self._num)
            position = np.empty_like(order)
            position[order] = np.arange(self._num)
            if len(self._orders) >= 4:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = (order, position)
        return self._orders[epoch]

    def _parse(self, group_id: str) -> tuple[int, int] | None:
        """(epoch, index) of a key this source issued, else None."""
        with self._lock:
            key = self._parse_key(group_id)
            return key if key is not None and self._issued(*key) else None

    def _issued(self, epoch: int, index: int) -> bool:
        """Whether the cursor has passed this prompt of this epoch."""
        return epoch < self._epoch or (epoch == self._epoch and self._order(epoch)[1][index] < self._pos)

    def _parse_key(self, group_id: str) -> tuple[int, int] | None:
        """(epoch, index) of a well-formed key of this dataset, up to the epoch after the cursor's."""
        epoch_text, sep, index_text = group_id.partition(":")
        if not (
            sep
            and epoch_text.isascii()
            and epoch_text.isdigit()
            and index_text.isascii()
            and index_text.isdigit()
        ):
            return None
        epoch, index = int(epoch_text), int(index_text)
        if group_id != f"{epoch}:{index}" or index >= self._num or epoch > self._epoch + 1:
            return None
        if self._epochs is not None and epoch >= self._epochs:
            return None
        return epoch, index

    def _is_retired(self, epoch: int, index: int) -> bool:
        return epoch < self._complete_epochs or index in self._retired.get(epoch, ())

    def _outstanding(self, group_id: str) -> _Lease:
        lease = self._leases.get(group_id)
        if lease is None:
            raise KeyError(f"prompt {group_id!r} is not outstanding")
        return lease
