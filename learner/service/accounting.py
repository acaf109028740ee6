"""Exactly-once accounting of prompts and scored groups: counters that must balance.

Every scored group the learner's server receives ends in exactly one of the outcomes below, and
every group it queued is in exactly one place. So at any instant (and after a restart that
restored the counters from a checkpoint):

    groups_received = groups_queued + groups_duplicate + groups_stale_on_arrival
                      + groups_invalid + groups_retry + prompts_too_long
    groups_queued   = groups_consumed + groups_in_queue + groups_in_batch
                      + groups_stale_at_dequeue + groups_forgotten_on_restart

where groups_stale = groups_stale_on_arrival + groups_stale_at_dequeue (the wire reports the sum),
groups_in_batch are groups handed to the trainer by next_batch and not yet marked consumed, and
groups_forgotten_on_restart are groups that sat in the queue when the checkpoint was taken (their
actors still hold them unacknowledged and send them again).

Prompts (one prompt = one group id) balance too:

    prompts_leased - prompts_reissued = prompts_retired + prompts_outstanding
    prompts_retired = groups_consumed + prompts_too_long

(a lease of a prompt that had been leased before is a re-issue; outstanding prompts are leased,
waiting for re-issue, or held by a queued group).

Completion tokens balance the same way, so waste is measured where it happens (tokens_X counts
the completion tokens of the groups groups_X counts; a prompt_too_long rejection has none):

    tokens_received = tokens_queued + tokens_duplicate + tokens_stale_on_arrival
                      + tokens_invalid + tokens_retry
    tokens_queued   = tokens_trained + tokens_no_signal + tokens_in_queue + tokens_in_batch
                      + tokens_stale_at_dequeue + tokens_forgotten_on_restart

where tokens_trained are the tokens of groups a training step used and tokens_no_signal those of
groups retired without one (dynamic sampling's zero-signal groups). Tokens the actors threw away
before sending (groups aborted by a weight load and sampled again) are the actors' tokens_aborted.

Besides the balance, the server counts what it refused or lost outside the group outcomes
(SERVICE_COUNTERS): internal errors, groups from an actor that does not hold the prompt's lease (a
part of groups_invalid), calls refused for bad input, a bad credential or a full limit, weight
reports naming an unpublished version, streams closed as idle, and registrations that superseded
another one of the same actor id; and its outbound weight bytes (streamed as chunks, or written once
per version into shared memory).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

# Counters kept by the server; the prompt-side ones come from the PromptSource.
GROUP_COUNTERS = (
    "groups_received",
    "groups_queued",
    "groups_consumed",
    "groups_duplicate",
    "groups_stale_on_arrival",
    "groups_stale_at_dequeue",
    "groups_invalid",
    "groups_retry",
    "groups_forgotten_on_restart",
    "completions_unscorable",
    "prompts_too_long",
)
# Completion tokens of the groups counted by the group counter of the same suffix (groups_X ->
# tokens_X), plus the split of consumed groups into trained and retired without signal.
TOKEN_COUNTERS = (
    "tokens_received",
    "tokens_queued",
    "tokens_duplicate",
    "tokens_stale_on_arrival",
    "tokens_invalid",
    "tokens_retry",
    "tokens_trained",
    "tokens_no_signal",
    "tokens_stale_at_dequeue",
    "tokens_forgotten_on_restart",
)
SERVICE_COUNTERS = (
    "internal_errors",
    "lease_violations",
    "requests_invalid",
    "credentials_refused",
    "weight_reports_refused",
    "calls_refused_busy",
    "streams_idle_closed",
    "actors_superseded",
    "weight_bytes_streamed",
    "weight_bytes_shared",
    "weight_fetches_relayed",
)
COUNTERS = GROUP_COUNTERS + TOKEN_COUNTERS + SERVICE_COUNTERS


def with_tokens(counters: Mapping[str, int], tokens: int) -> dict[str, int]:
    """`counters` of one group, plus its `tokens` under each tokens_X whose groups_X it adds to."""
    added = {f"tokens_{name.removeprefix('groups_')}": tokens for name in counters
             if name.startswith("groups_") and f"tokens_{name.removeprefix('groups_')}" in TOKEN_COUNTERS}
    return {**counters, **added}


class Accounting:
    """Thread-safe monotone counters of the group outcomes and refusals (names in COUNTERS)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)

    def add(self, name: str, amount: int = 1) -> None:
        self.add_all({name: amount})

    def add_all(self, amounts: Mapping[str, int]) -> None:
        """Add several counters at once (one admission decision's), all or none."""
        if not amounts.keys() <= self._counts.keys():
            raise KeyError(f"unknown counters {sorted(amounts.keys() - self._counts.keys())}")
        with self._lock:
            for name, amount in amounts.items():
                self._counts[name] += amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def load(self, counts: Mapping[str, int]) -> None:
        """Restore counters saved by snapshot(); unknown names are an error, missing ones are 0."""
        unknown = set(counts) - set(COUNTERS)
        if unknown:
            raise KeyError(f"unknown counters {sorted(unknown)}")
        with self._lock:
            self._counts = {name: int(counts.get(name, 0)) for name in COUNTERS}


def balance_violations(counts: Mapping[str, int]) -> list[str]:
    """The invariants of this module's docstring that `counts` breaks (empty list = balanced).

    `counts` is LearnerService.accounting(): the group counters plus groups_in_queue,
    groups_in_batch and the prompt counters (prompts_leased, prompts_reissued, prompts_retired,
    prompts_outstanding).
    """
    c = counts
    checks = {
        "received = queued + duplicate + stale_on_arrival + invalid + retry + too_long": (
            c["groups_received"],
            c["groups_queued"]
            + c["groups_duplicate"]
            + c["groups_stale_on_arrival"]
            + c["groups_invalid"]
            + c["groups_retry"]
            + c["prompts_too_long"],
        ),
        "queued = consumed + in_queue + in_batch + stale_at_dequeue + forgotten_on_restart": (
            c["groups_queued"],
            c["groups_consumed"]
            + c["groups_in_queue"]
            + c["groups_in_batch"]
            + c["groups_stale_at_dequeue"]
            + c["groups_forgotten_on_restart"],
        ),
        "stale = stale_on_arrival + stale_at_dequeue": (
            c["groups_stale"],
            c["groups_stale_on_arrival"] + c["groups_stale_at_dequeue"],
        ),
        "tokens: received = queued + duplicate + stale_on_arrival + invalid + retry": (
            c["tokens_received"],
            c["tokens_queued"] + c["tokens_duplicate"] + c["tokens_stale_on_arrival"] + c["tokens_invalid"]
            + c["tokens_retry"],
        ),
        "tokens: queued = trained + no_signal + in_queue + in_batch + stale_at_dequeue + forgotten": (
            c["tokens_queued"],
            c["tokens_trained"] + c["tokens_no_signal"] + c["tokens_in_queue"] + c["tokens_in_batch"]
            + c["tokens_stale_at_dequeue"] + c["tokens_forgotten_on_restart"],
        ),
        "leased - reissued = retired + outstanding": (
            c["prompts_leased"] - c["prompts_reissued"],
            c["prompts_retired"] + c["prompts_outstanding"],
        ),
        "retired = consumed + too_long": (
            c["prompts_retired"],
            c["groups_consumed"] + c["prompts_too_long"],
        ),
    }
    return [f"{name}: {left} != {right}" for name, (left, right) in checks.items() if left != right]
