"""What the learner's server answers to each group it is sent, over real gRPC: INVALID with a
specific detail, DUPLICATE, STALE, RETRY, the prompt_too_long rejection; lease expiry and re-issue;
and exactly-once across a learner restart."""

from __future__ import annotations

import dataclasses
import json
import math
import threading

import numpy as np
import pytest
from config_helpers import service_config
from wire_helpers import (
    VOCAB,
    connected_client,
    make_group,
    make_prompts,
    raw_actor,
    running_service,
    wait_until,
)

from learner.service.accounting import balance_violations
from learner.service.prompt_source import PromptSource
from learner.service.server import LearnerService
from tandem_wire import WIRE_VERSION, pb

MAX_PROMPT_TOKENS = 8


def _completion(group: pb.ScoredGroup, i: int = 1) -> pb.Completion:
    return group.completions[i]


def _turns(group: pb.ScoredGroup, parts: list[tuple[int, int, int, float | None]],
           observed_logprob: float = 0.0, contexts: dict[int, list[int]] | None = None, i: int = 1) -> None:
    """Give completion i turns (sampled, observation tokens, version, reward), turn k the context ids
    `contexts[k]` (it starts a new training sample), its observation tokens `observed_logprob`, each turn's
    tokens its version, and the sum of the turns' rewards as its reward."""
    completion = _completion(group, i)
    position = 0
    for k, (sampled, observed, version, reward) in enumerate(parts):
        turn = completion.turns.add(sampled_tokens=sampled, observation_tokens=observed, policy_version=version,
                                    context_token_ids=(contexts or {}).get(k, []))
        if reward is not None:
            turn.reward = reward
        for i in range(position + sampled, min(position + sampled + observed, len(completion.logprobs))):
            completion.logprobs[i] = observed_logprob
        for i in range(position, min(position + sampled + observed, len(completion.token_versions))):
            completion.token_versions[i] = version
        position += sampled + observed
    completion.reward = sum(r for *_, r in parts if r is not None and math.isfinite(r))


INVALID_CASES = {
    "missing wire version": (lambda g: g.ClearField("wire_version"), "unsupported wire_version 0"),
    "future wire version": (lambda g: setattr(g, "wire_version", 3), "unsupported wire_version 3"),
    "old actor's wire version": (lambda g: setattr(g, "wire_version", 1),
                                 "wire_version 1 is older than this learner's 2: update the actor"),
    "token versions count != token count": (
        lambda g: _completion(g).token_versions.append(0),
        "completion 1: 7 token_versions for 6 tokens",
    ),
    "no token versions": (lambda g: _completion(g).ClearField("token_versions"), "0 token_versions for 6 tokens"),
    "token version from the future": (
        lambda g: _completion(g).token_versions.__setitem__(5, 1),
        "completion 1: token versions 0..1 are outside the group's 0 .. the latest published 0",
    ),
    "empty group id": (lambda g: setattr(g, "group_id", ""), "empty group_id"),
    "empty actor id": (lambda g: setattr(g, "actor_id", ""), "empty actor_id"),
    "group id never leased": (lambda g: setattr(g, "group_id", "7:3"), "never leased"),
    "group id not a key": (lambda g: setattr(g, "group_id", "'; DROP TABLE"), "never leased"),
    "wrong group size": (lambda g: g.completions.pop(), "3 completions, expected group_size 4"),
    "no completions": (lambda g: g.ClearField("completions"), "no completions"),
    "logprob count != token count": (
        lambda g: _completion(g).logprobs.append(-1.0),
        "7 logprobs for 6 tokens",
    ),
    "nan logprob": (lambda g: _completion(g).logprobs.__setitem__(2, math.nan), "non-finite logprob"),
    "infinite logprob": (lambda g: _completion(g).logprobs.__setitem__(0, -math.inf), "non-finite logprob"),
    "positive logprob": (lambda g: _completion(g).logprobs.__setitem__(0, 0.5), "positive logprob"),
    "token id >= vocab": (lambda g: _completion(g).token_ids.__setitem__(0, VOCAB), f">= vocab_size {VOCAB}"),
    "negative token id": (lambda g: _completion(g).token_ids.__setitem__(3, -2), "negative token id -2"),
    "negative prompt token": (lambda g: g.prompt_token_ids.__setitem__(0, -1), "prompt_token_ids: negative"),
    "empty completion": (
        lambda g: (_completion(g).ClearField("token_ids"), _completion(g).ClearField("logprobs")),
        "completion 1: empty token_ids",
    ),
    "prompt too long": (lambda g: g.prompt_token_ids.extend([7] * 4), "9 tokens > max_prompt_tokens 8"),
    "prompt differs from lease": (
        lambda g: g.prompt_token_ids.__setitem__(0, g.prompt_token_ids[0] + 1),
        "differ from the leased prompt",
    ),
    "empty prompt": (lambda g: g.ClearField("prompt_token_ids"), "empty prompt_token_ids"),
    "policy version from the future": (lambda g: setattr(g, "policy_version", 5), "newer than the latest"),
    "negative policy version": (lambda g: setattr(g, "policy_version", -1), "negative policy_version"),
    "neither reward nor reason": (
        lambda g: _completion(g).ClearField("reward"),
        "neither reward nor unscorable",
    ),
    "nan reward": (lambda g: setattr(_completion(g), "reward", math.nan), "non-finite reward"),
    "infinite reward": (lambda g: setattr(_completion(g), "reward", math.inf), "non-finite reward"),
    "empty unscorable reason": (
        lambda g: setattr(_completion(g), "unscorable_reason", ""),
        "empty unscorable",
    ),
    "finish reason unset": (lambda g: _completion(g).ClearField("finish_reason"), "finish_reason 0"),
    "finish reason unknown": (lambda g: setattr(_completion(g), "finish_reason", 77), "finish_reason 77"),
    "unknown rejected reason": (lambda g: setattr(g, "rejected_reason", "bored"), "unknown rejected_reason"),
    "rejected with completions": (
        lambda g: setattr(g, "rejected_reason", "prompt_too_long"),
        "must carry no completions",
    ),
    "completion past the longest row": (
        lambda g: (_completion(g).token_ids.extend([1, 2]), _completion(g).logprobs.extend([-1.0, -1.0]),
                   _completion(g).token_versions.extend([0, 0])),
        "completion 1: a sample of 8 tokens after its prompt's 5 exceeds max_sequence_tokens 12",
    ),
    "turns short of the tokens": (lambda g: _turns(g, [(2, 3, 0, None), (2, 0, 0, 1.0)]), "cover 7 tokens of 6"),
    "turn with no sampled token": (lambda g: _turns(g, [(0, 3, 0, None), (3, 0, 0, 1.0)]), "need >= 1"),
    "trailing observation": (lambda g: _turns(g, [(3, 3, 0, 1.0)]), "ends with 3 observation tokens"),
    "turn from the future": (lambda g: _turns(g, [(2, 3, 0, None), (1, 0, 5, 1.0)]), "outside the group's"),
    "observation with a logprob": (
        lambda g: _turns(g, [(2, 3, 0, None), (1, 0, 0, 1.0)], observed_logprob=-0.5),
        "an observation token has logprob -0.5",
    ),
    "turn reward not finite": (lambda g: _turns(g, [(2, 3, 0, math.nan), (1, 0, 0, 1.0)]), "non-finite reward"),
    "reward not the turns' sum": (
        lambda g: (_turns(g, [(2, 3, 0, 0.5), (1, 0, 0, 1.0)]), setattr(_completion(g), "reward", 1.0)),
        "is not the sum of its turns' rewards 1.5",
    ),
    "too many turns": (lambda g: _turns(g, [(1, 0, 0, None)] * 1025), "1025 turns > 1024"),
    "first turn with a context": (
        lambda g: _turns(g, [(2, 3, 0, None), (1, 0, 0, 1.0)], contexts={0: [1, 2]}),
        "turn 0 has context_token_ids",
    ),
    "new sample after an observation": (
        lambda g: _turns(g, [(2, 3, 0, None), (1, 0, 0, 1.0)], contexts={1: [1, 2]}),
        "turn 1 starts a new sample but turn 0 has 3 observation tokens",
    ),
    "context token >= vocab": (
        lambda g: _turns(g, [(2, 0, 0, None), (4, 0, 0, 1.0)], contexts={1: [1, VOCAB]}),
        f"turn 1 context_token_ids: token id {VOCAB} >= vocab_size",
    ),
    "split sample past the longest row": (
        lambda g: _turns(g, [(2, 0, 0, None), (4, 0, 0, 1.0)], contexts={1: [1] * 9}),
        "a sample of 4 tokens after its prompt's 9 exceeds max_sequence_tokens 12",
    ),
}


def test_each_invalid_group_gets_invalid_with_a_specific_detail_and_loses_nothing():
    with running_service(max_prompt_tokens=MAX_PROMPT_TOKENS, max_sequence_tokens=12) as (service, address):
        actor = raw_actor(address)
        (lease,), _ = actor.lease(1)
        broken = []
        for mutate, _ in INVALID_CASES.values():
            group = make_group(lease, actor.actor_id)
            mutate(group)
            broken.append(group)
        acks = actor.exchange(broken)
        assert len(acks) == len(INVALID_CASES)
        for (case, (_, detail)), ack in zip(INVALID_CASES.items(), acks, strict=True):
            assert ack.status == pb.ACK_STATUS_INVALID, (case, ack)
            assert detail in ack.detail, (case, ack.detail)
        # Nothing was consumed or lost: a valid group of the same prompt (multi-turn) is still accepted.
        valid = make_group(lease, actor.actor_id)
        _turns(valid, [(2, 3, 0, 0.25), (1, 0, 0, 1.0)])
        _turns(valid, [(2, 0, 0, 0.5), (4, 0, 0, None)], contexts={1: [1, 2, 3]}, i=2)  # split by a template
        (ack,) = actor.exchange([valid])
        assert ack.status == pb.ACK_STATUS_QUEUED
        [record] = service.next_batch(1, timeout=10)
        assert record.completions[1].loss_mask.tolist() == [1, 1, 0, 0, 0, 1]
        assert record.completions[1].reward == 1.25
        prompt = list(valid.prompt_token_ids)
        assert record.completions[2].samples(prompt) == [(prompt, 0, 2), ([1, 2, 3], 2, 6)]
        assert record.completions[1].samples(prompt) == [(prompt, 0, 6)]
        counts = service.accounting()
        assert counts["groups_invalid"] == len(INVALID_CASES) and counts["groups_queued"] == 1
        assert balance_violations(counts) == []
        actor.close()


def test_duplicates_are_rejected_whether_queued_or_consumed():
    with running_service() as (service, address):
        actor = raw_actor(address)
        (lease,), _ = actor.lease(1)
        group = make_group(lease, actor.actor_id)
        acks = actor.exchange([group, group])
        assert [(a.status, a.detail) for a in acks] == [
            (pb.ACK_STATUS_QUEUED, ""),
            (pb.ACK_STATUS_DUPLICATE, "already queued"),
        ]
        (record,) = service.next_batch(1, timeout=5)
        assert [(a.status, a.detail) for a in actor.exchange([group])] == [
            (pb.ACK_STATUS_DUPLICATE, "already queued")
        ]  # handed out counts as queued
        service.mark_consumed([record.group_id])
        assert [(a.status, a.detail) for a in actor.exchange([group])] == [
            (pb.ACK_STATUS_DUPLICATE, "already consumed")
        ]
        counts = service.accounting()
        assert counts["groups_duplicate"] == 3 and counts["groups_consumed"] == 1
        assert balance_violations(counts) == []
        actor.close()


def _tiny_weights():
    return [("w", np.zeros(4, np.float32))]


def test_a_multi_turn_group_is_at_its_oldest_turns_version_over_all_its_trajectories():
    """A weight load can abort one trajectory's first turn (sampled again on the new version) while another
    trajectory's first turn is done: the group is at the oldest turn's version of all its trajectories,
    and no trajectory needs a turn of it. A group whose version no turn has is refused."""
    with running_service(max_staleness=4) as (service, address):
        actor = raw_actor(address)
        (spanning, ahead), _ = actor.lease(2)
        service.publish_weights(1, _tiny_weights())
        service.publish_weights(2, _tiny_weights())
        valid = make_group(spanning, actor.actor_id, policy_version=0)
        _turns(valid, [(2, 3, 0, 0.25), (1, 0, 1, 1.0)])
        _turns(valid, [(2, 3, 1, None), (1, 0, 2, 0.5)], i=2)  # its first turn sampled again on version 1
        behind = make_group(ahead, actor.actor_id, policy_version=0)
        _turns(behind, [(2, 3, 1, 0.25), (1, 0, 1, 1.0)])
        _turns(behind, [(6, 0, 2, 1.0)], i=2)
        for single_turn in (behind.completions[0], behind.completions[3]):
            single_turn.token_versions[:] = [1] * len(single_turn.token_ids)
        acks = actor.exchange([valid, behind])
        assert [a.status for a in acks] == [pb.ACK_STATUS_QUEUED, pb.ACK_STATUS_INVALID], acks
        assert "the group's policy_version 0 is not its oldest token's 1" in acks[1].detail
        [record] = service.next_batch(1, timeout=10)
        assert record.policy_version == 0
        assert [[t.policy_version for t in c.turns] for c in record.completions[1:3]] == [[0, 1], [1, 2]]
        actor.close()


def _with(group: pb.ScoredGroup, **fields) -> pb.ScoredGroup:
    for name, value in fields.items():
        setattr(group, name, value)
    return group


def test_the_staleness_bound_counts_a_groups_oldest_token():
    """A completion continued across weight loads (rollout.weight_update=keep) carries each token's version:
    the group is as old as its oldest token, so one spanning more than max_staleness + 1 versions is dropped
    as stale (counted, its prompt re-leased) though its newest tokens are fresh. Versions that decrease
    along a completion, or a group version that is not its oldest token's, are refused."""
    with running_service(max_staleness=1) as (service, address):
        actor = raw_actor(address)
        leases, _ = actor.lease(4)
        for version in (1, 2, 3):
            service.publish_weights(version, _tiny_weights())

        def spanning(lease, versions: list[int]) -> pb.ScoredGroup:
            """Completion 2 sampled with `versions`, the others all with the latest (3)."""
            group = make_group(lease, actor.actor_id, policy_version=min(versions))
            for completion in group.completions:
                completion.token_versions[:] = [3] * len(completion.token_ids)
            group.completions[2].token_versions[:] = versions
            return group

        acks = actor.exchange([
            spanning(leases[0], [1, 2, 2, 3, 3, 3]),  # 3 versions > max_staleness + 1: stale
            spanning(leases[1], [2, 2, 3, 3, 3, 3]),  # 2 versions: fresh
            spanning(leases[2], [3, 3, 2, 3, 3, 3]),
            _with(spanning(leases[3], [2, 2, 3, 3, 3, 3]), policy_version=1),  # claims older than it is
        ])
        assert [a.status for a in acks] == [pb.ACK_STATUS_STALE, pb.ACK_STATUS_QUEUED, pb.ACK_STATUS_INVALID,
                                            pb.ACK_STATUS_INVALID], acks
        assert "policy_version 1 is more than 1 behind 3" in acks[0].detail
        assert "completion 2: token versions decrease" in acks[2].detail
        assert "the group's policy_version 1 is not its oldest token's 2" in acks[3].detail
        [record] = service.next_batch(1, timeout=10)
        assert record.policy_version == 2
        assert [c.versions for c in record.completions] == [[3] * 6, [3] * 6, [2, 2, 3, 3, 3, 3], [3] * 6]
        counts = service.accounting()
        assert counts["groups_stale_on_arrival"] == 1 and counts["tokens_stale_on_arrival"] == 24
        assert counts["groups_invalid"] == 2 and balance_violations(counts) == []
        actor.close()


def test_stale_groups_are_dropped_on_arrival_and_at_dequeue_and_their_prompts_re_leased():
    with running_service(max_staleness=1) as (service, address):
        actor = raw_actor(address)
        leases, _ = actor.lease(2)
        service.publish_weights(1, _tiny_weights())
        service.publish_weights(2, _tiny_weights())
        acks = actor.exchange(
            [
                make_group(leases[0], actor.actor_id, policy_version=0),
                make_group(leases[1], actor.actor_id, policy_version=1),
            ],
        )
        assert [a.status for a in acks] == [pb.ACK_STATUS_STALE, pb.ACK_STATUS_QUEUED]
        assert "more than 1 behind 2" in acks[0].detail and acks[0].latest_version == 2
        # The stale group's prompt goes straight back out, to any actor.
        other = connected_client(address, "actor-1")
        assert [p.group_id for p in other.lease_prompts(1).prompts] == [leases[0].group_id]
        # A queued group that goes stale before the trainer takes it is dropped at dequeue; its
        # actor hears STALE on its stream.
        (lease,) = other.lease_prompts(1).prompts
        other.send_group(make_group(lease, "actor-1", policy_version=2))
        wait_until(lambda: service.queue_depth() == 2, what="second group queued")
        service.publish_weights(4, _tiny_weights())
        assert service.next_batch(2, timeout=0.5) == []
        wait_until(lambda: other.counts().get("stale") == 1, what="STALE ack at dequeue")
        assert other.rejections[-1][:2] == (lease.group_id, "stale") and other.unacked_count() == 0
        counts = service.accounting()
        assert counts["groups_stale_on_arrival"] == 1 and counts["groups_stale_at_dequeue"] == 2
        assert counts["groups_stale"] == 3 and counts["groups_queued"] == 2
        assert balance_violations(counts) == []
        reissued = [p.group_id for p in actor.lease(5)[0]][:2]  # both re-issued first
        assert sorted(reissued) == sorted([leases[1].group_id, lease.group_id])
        actor.close()
        other.close()


def test_full_queue_answers_retry_and_accepts_the_group_later():
    with running_service(queue_capacity=2) as (service, address):
        actor = raw_actor(address)
        leases, _ = actor.lease(3)
        groups = [make_group(lease, actor.actor_id) for lease in leases]
        acks = actor.exchange(groups)
        assert [a.status for a in acks] == [pb.ACK_STATUS_QUEUED, pb.ACK_STATUS_QUEUED, pb.ACK_STATUS_RETRY]
        assert [a.credits for a in acks] == [1, 0, 0] and acks[2].detail == "queue full"
        service.mark_consumed([r.group_id for r in service.next_batch(1, timeout=5)])
        (ack,) = actor.exchange([groups[2]])
        assert ack.status == pb.ACK_STATUS_QUEUED
        counts = service.accounting()
        assert counts["groups_retry"] == 1 and counts["groups_received"] == 4
        assert balance_violations(counts) == []
        actor.close()


def test_a_prompt_rejected_as_too_long_is_retired_and_counted():
    """A prompt longer than the run's max_prompt_tokens, rejected by its holder, is retired (CONSUMED);
    the same rejection for a prompt within the limit is refused."""
    rows = make_prompts(3)
    rows[1] = dataclasses.replace(rows[1], prompt_ids=rows[1].prompt_ids * 2)  # 10 tokens > MAX_PROMPT_TOKENS
    with running_service(PromptSource(rows, epochs=1), max_prompt_tokens=MAX_PROMPT_TOKENS) as (service, address):
        actor = raw_actor(address)
        leases, _ = actor.lease(3)
        (long,) = [lease for lease in leases if len(lease.prompt_ids) > MAX_PROMPT_TOKENS]
        short = [lease for lease in leases if lease is not long]

        def rejection(lease):
            return pb.ScoredGroup(wire_version=WIRE_VERSION, group_id=lease.group_id, actor_id=actor.actor_id,
                                  prompt_token_ids=lease.prompt_ids, rejected_reason="prompt_too_long")

        acks = actor.exchange([rejection(long), rejection(long), rejection(short[0])])
        assert [(a.status, a.detail) for a in acks] == [
            (pb.ACK_STATUS_CONSUMED, "prompt retired: prompt_too_long"),
            (pb.ACK_STATUS_DUPLICATE, "already consumed"),
            (pb.ACK_STATUS_INVALID, "prompt_too_long refused: the prompt has 5 tokens, within the limit 8"),
        ]
        acks = actor.exchange([make_group(lease, actor.actor_id) for lease in short])
        assert [a.status for a in acks] == [pb.ACK_STATUS_QUEUED] * 2
        service.mark_consumed([r.group_id for r in service.next_batch(2, timeout=10)])
        assert actor.lease(3) == ([], True)
        counts = service.accounting()
        assert counts["prompts_too_long"] == 1 and counts["prompts_retired"] == 3
        assert counts["groups_invalid"] == 1 and counts["lease_violations"] == 0
        assert balance_violations(counts) == []
        actor.close()


@pytest.mark.parametrize("late_copy_first", [False, True])
def test_an_expired_lease_is_reissued_and_exactly_one_copy_is_consumed(late_copy_first):
    with running_service(PromptSource(make_prompts(4)), lease_seconds=0.3) as (service, address):
        slow, fast = connected_client(address, "slow"), connected_client(address, "fast")
        (lease,) = slow.lease_prompts(1).prompts
        threading.Event().wait(0.4)  # the slow actor misses its lease
        (reissued,) = fast.lease_prompts(1).prompts
        assert reissued.group_id == lease.group_id
        first, second = (slow, fast) if late_copy_first else (fast, slow)
        first.send_group(make_group(lease, first.actor_id, seed=1))
        wait_until(lambda: service.queue_depth() == 1, what="first copy queued")
        second.send_group(make_group(lease, second.actor_id, seed=2))
        wait_until(lambda: second.counts().get("duplicate") == 1, what="second copy rejected")
        (record,) = service.next_batch(4, timeout=0.5)
        assert record.actor_id == first.actor_id
        service.mark_consumed([record.group_id])
        assert first.drain(10) and second.drain(10)
        counts = service.accounting()
        assert counts["prompts_reissued"] == 1 and counts["groups_consumed"] == 1
        assert balance_violations(counts) == []
        slow.close()
        fast.close()


def test_learner_restart_resends_unacked_rejects_duplicates_and_consumes_exactly_once():
    data = make_prompts(30)
    config = service_config(group_size=4, vocab_size=VOCAB, lease_seconds=60)
    old = LearnerService(PromptSource(data, seed=5), config)
    address = old.start("127.0.0.1:0")
    client = connected_client(address)
    leases = client.lease_prompts(12).prompts
    for i, lease in enumerate(leases):
        client.send_group(make_group(lease, client.actor_id, seed=i))
    wait_until(lambda: client.counts().get("queued") == 12, what="12 groups queued")
    consumed = [r.group_id for r in old.next_batch(4, timeout=5)]
    old.mark_consumed(consumed)
    wait_until(lambda: client.counts().get("consumed") == 4, what="4 CONSUMED acks")
    in_last_step = [r.group_id for r in old.next_batch(3, timeout=5)]
    old.stop(grace=0)  # the learner dies ...
    old.mark_consumed(in_last_step)  # ... after a step whose CONSUMED acks never reached the actor
    consumed += in_last_step
    state = json.loads(json.dumps(old.state_dict()))  # what the checkpoint holds

    new = LearnerService(PromptSource(data, seed=5), config)
    new.load_state_dict(state)
    assert new.start(address) == address
    try:
        wait_until(lambda: client.counts().get("duplicate") == 3, timeout=20, what="re-sent consumed groups")
        wait_until(lambda: new.queue_depth() == 5, what="re-sent queued groups")
        rest = new.next_batch(5, timeout=5)
        new.mark_consumed([r.group_id for r in rest])
        consumed += [r.group_id for r in rest]
        assert client.drain(10)
        assert sorted(consumed) == sorted(lease.group_id for lease in leases)  # each exactly once
        counts = client.counts()
        assert counts["reconnects"] >= 1 and counts["resent"] == 8 and counts["unacked"] == 0
        more = client.lease_prompts(30).prompts
        assert len(more) == 18 and not {p.group_id for p in more} & set(consumed)  # nothing repeated
        accounting = new.accounting()
        assert accounting["groups_forgotten_on_restart"] == 5 and accounting["groups_consumed"] == 12
        assert balance_violations(accounting) == []
    finally:
        client.close()
        new.stop(grace=0)
