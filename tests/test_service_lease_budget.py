"""The lease budget through a real learner server over loopback gRPC: an actor that asks for more than
(η + s + 1)·B gets fewer or none and a retry hint; a rejection or an untrained group gives slots back,
and after the learner's step advances the actor gets more."""

from __future__ import annotations

import threading

import numpy as np
from wire_helpers import connected_client, make_group, make_prompts, running_service, wait_until

from learner.service.accounting import balance_violations
from learner.service.lease_budget import RETRY_MAX_S, RETRY_MIN_S
from learner.service.prompt_source import PromptSource
from tandem_wire import WIRE_VERSION, pb

B, ETA = 4, 1


def test_an_actor_asking_past_the_budget_gets_fewer_then_a_hint_then_more_after_a_step():
    with running_service(PromptSource(make_prompts(64)), prompts_per_step=B, max_staleness=ETA) as (service, address):
        client = connected_client(address)
        first = client.lease_prompts(20)
        assert len(first.prompts) == (ETA + 0 + 1) * B and not first.exhausted
        assert RETRY_MIN_S <= first.retry_after_s <= RETRY_MAX_S  # fewer than asked: told when to ask again
        refused = client.lease_prompts(5)
        assert refused.prompts == [] and not refused.exhausted and refused.retry_after_s >= RETRY_MIN_S

        # a prompt_too_long rejection retires its prompt and gives its slot back
        lease = first.prompts[0]
        client.send_group(pb.ScoredGroup(wire_version=WIRE_VERSION, group_id=lease.group_id,
                                         actor_id=client.actor_id, prompt_token_ids=lease.prompt_ids,
                                         rejected_reason="prompt_too_long"))
        assert client.drain(10)
        assert len(client.lease_prompts(5).prompts) == 1

        service.set_step(1)  # the learner completed a step: B more
        assert len(client.lease_prompts(20).prompts) == B

        # groups the learner retires without training on them (no signal) give their slots back too
        for i, leased in enumerate(first.prompts[1:5]):
            client.send_group(make_group(leased, client.actor_id, seed=i))
        batch = service.next_batch(4, timeout=10)
        assert len(batch) == 4
        service.mark_consumed([r.group_id for r in batch], trained=False)
        assert len(client.lease_prompts(20).prompts) == 4
        assert client.status().accounting.lease_slots_in_use == (ETA + 1 + 1) * B
        client.close()


def test_no_hint_when_the_budget_is_not_what_held_prompts_back():
    source = PromptSource(make_prompts(2), epochs=1)
    with running_service(source, prompts_per_step=B, max_staleness=ETA) as (_, address):
        client = connected_client(address)
        reply = client.lease_prompts(5)  # the dataset has only 2: asking again sooner would not help
        assert len(reply.prompts) == 2 and reply.retry_after_s == 0.0
        client.close()


def test_an_actor_still_serving_older_weights_gets_the_budget_of_its_own_version():
    """The bound counts from the step the asking actor's version was published at, not the learner's
    step: a lagging actor cannot lease prompts it would sample more than η versions behind."""
    weights = [("w", np.zeros(4, np.float32))]
    with running_service(PromptSource(make_prompts(64)), prompts_per_step=B, max_staleness=ETA) as (service, address):
        service.publish_weights(0, weights)
        client = connected_client(address)
        assert len(client.lease_prompts(20).prompts) == (ETA + 0 + 1) * B
        service.set_step(1)
        service.publish_weights(1, weights)
        lagging = client.lease_prompts(20)  # it still serves version 0, published at step 0
        # none, but it learns of version 1 from the reply and is told to ask again as soon as it loaded it
        assert lagging.prompts == [] and lagging.retry_after_s == RETRY_MIN_S and client.latest_version == 1
        # an actor that cannot load the newest version: what a waiting learner logs says so
        assert client.report_weights(1, applied=False, detail="transfer failed: sha256 mismatch")
        report = service.waiting_report().splitlines()
        assert report[0].startswith("learner step 1, newest version 1, lease slots in use 8")
        assert report[1] == (f"  {client.actor_id}: serves v0, may lease 0, alive, "
                             "last weight report: v1 NOT applied transfer failed: sha256 mismatch")
        assert client.report_weights(1, applied=True)
        assert len(client.lease_prompts(20).prompts) == B  # serving version 1 (step 1): B more
        client.close()


def test_a_new_version_is_announced_on_every_open_group_stream():
    """An actor waiting for budget learns of new weights without asking: the publish is announced on
    its group stream (an ack with no group id), which leaves its outbox as it was."""
    weights = [("w", np.zeros(4, np.float32))]
    with running_service(PromptSource(make_prompts(8)), prompts_per_step=B, max_staleness=ETA) as (service, address):
        service.publish_weights(0, weights)
        client = connected_client(address)
        [lease] = client.lease_prompts(1).prompts
        client.send_group(make_group(lease, client.actor_id))  # opens the stream
        wait_until(lambda: client.counts().get("queued") == 1, what="the QUEUED ack")
        service.publish_weights(1, weights)
        wait_until(lambda: client.latest_version == 1, timeout=5, what="the announced version")
        assert client.counts()["unacked"] == 1 and client.is_unacked(lease.group_id)
        client.close()


def test_slots_given_back_and_steps_are_announced_so_a_waiting_actor_asks_again_at_once():
    """A refused actor sleeps until its retry hint (up to RETRY_MAX_S) unless told the budget grew:
    groups retired without signal, and a learner step, are announced on its group stream."""
    announced = threading.Event()
    with running_service(PromptSource(make_prompts(64)), prompts_per_step=B, max_staleness=0) as (service, address):
        client = connected_client(address, on_announcement=announced.set)
        leases = client.lease_prompts(B).prompts
        assert len(leases) == B and client.lease_prompts(1).prompts == []  # η = 0: one batch, then refused
        for i, lease in enumerate(leases):
            client.send_group(make_group(lease, client.actor_id, seed=i))
        batch = service.next_batch(B, timeout=10)
        announced.clear()
        service.mark_consumed([r.group_id for r in batch[:2]], trained=False)  # no signal: 2 slots back
        assert announced.wait(5), "slots given back were not announced"
        assert len(client.lease_prompts(B).prompts) == 2
        announced.clear()
        service.mark_consumed([r.group_id for r in batch[2:]])
        assert not announced.wait(0.5)  # trained on: the slots stay taken until the step completes
        service.set_step(1)
        assert announced.wait(5), "the step was not announced"
        assert len(client.lease_prompts(2 * B).prompts) == B  # (η + 1 + 1)·B = 2B: 2 trained, 2 re-leased, B new
        client.close()


def test_the_token_ledger_counts_every_received_token_in_one_place_and_balances():
    """Completion tokens follow the groups: trained, retired without signal, duplicate, stale (on
    arrival), waiting in the queue; each counter holds the tokens of its groups and the ledger balances."""
    weights = [("w", np.zeros(4, np.float32))]
    with running_service(PromptSource(make_prompts(16)), max_staleness=0) as (service, address):
        service.publish_weights(0, weights)
        client = connected_client(address)
        leases = client.lease_prompts(5).prompts
        for i, (lease, tokens) in enumerate(zip(leases[:4], (3, 5, 7, 11), strict=True)):
            client.send_group(make_group(lease, client.actor_id, tokens=tokens, seed=i))
        wait_until(lambda: service.accounting()["groups_received"] == 4, what="4 groups received")
        first, second = service.next_batch(1, timeout=10), service.next_batch(1, timeout=10)
        service.mark_consumed([r.group_id for r in first])  # 4 completions x 3 tokens trained
        service.mark_consumed([r.group_id for r in second], trained=False)  # 4 x 5 retired, no signal
        wait_until(lambda: not client.is_unacked(leases[0].group_id), what="the CONSUMED ack")
        client.send_group(make_group(leases[0], client.actor_id, tokens=2, seed=9))  # a duplicate: 4 x 2
        service.set_step(1)
        service.publish_weights(1, weights)
        client.send_group(make_group(leases[4], client.actor_id, tokens=13, seed=4))  # stale on arrival: 4 x 13
        wait_until(lambda: service.accounting()["groups_received"] == 6, what="6 groups received")
        c = service.accounting()
        assert (c["tokens_trained"], c["tokens_no_signal"], c["tokens_duplicate"], c["tokens_stale_on_arrival"],
                c["tokens_in_queue"], c["tokens_stale_at_dequeue"]) == (12, 20, 8, 52, 72, 0)
        assert c["tokens_received"] == 4 * (3 + 5 + 7 + 11 + 2 + 13)
        # the two groups of 7 and 11 tokens were queued but sampled with version 0 (now stale at dequeue)
        assert service.next_batch(2, timeout=0.5) == []
        c = service.accounting()
        assert c["tokens_stale_at_dequeue"] == 4 * (7 + 11) and c["tokens_queued"] == 4 * (3 + 5 + 7 + 11)
        assert balance_violations(c) == []
        client.close()


def _serve_version(service, client, version: int) -> None:
    service.publish_weights(version, [("w", np.zeros(4, np.float32))])
    assert client.report_weights(version, applied=True)


def test_the_step_that_would_make_a_leased_group_stale_waits_for_it_and_trains_it_first():
    """An actor a version behind its peer: the learner holds the batch back until the group leased
    η versions ago arrives, and trains it first (oldest version first), instead of publishing the
    version that would drop it; without the group, the wait ends at rollout.late_group_wait_s."""
    b, eta = 2, 1
    with running_service(PromptSource(make_prompts(64)), prompts_per_step=b, max_staleness=eta,
                         late_group_wait_s=30.0) as (service, address):
        slow, fast = connected_client(address, "slow"), connected_client(address, "fast")
        _serve_version(service, slow, 0)
        assert fast.report_weights(0, applied=True)
        late = slow.lease_prompts(b).prompts  # leased at step 0
        first = fast.lease_prompts(b).prompts
        for i, lease in enumerate(first):
            fast.send_group(make_group(lease, "fast", policy_version=0, seed=i))
        step_1 = service.next_batch(b, timeout=10)  # step 0 -> 1: nothing leased at step -1 to wait for
        assert sorted(r.group_id for r in step_1) == sorted(p.group_id for p in first)
        service.mark_consumed([r.group_id for r in step_1])
        service.set_step(1)
        _serve_version(service, fast, 1)
        newer = fast.lease_prompts(b).prompts  # leased at step 1
        for i, lease in enumerate(newer):
            fast.send_group(make_group(lease, "fast", policy_version=1, seed=10 + i))
        wait_until(lambda: service.queue_depth() == b, what="the fast actor's groups queued")

        batches: list[list] = []
        taker = threading.Thread(target=lambda: batches.append(service.next_batch(b, timeout=60)))
        taker.start()
        taker.join(1.0)
        assert taker.is_alive(), "publishing step 2 now would leave the slow actor's groups stale"
        for i, lease in enumerate(late):
            slow.send_group(make_group(lease, "slow", policy_version=0, seed=20 + i))
        taker.join(10)
        [step_2] = batches
        assert sorted(r.group_id for r in step_2) == sorted(p.group_id for p in late)  # oldest first
        assert service.stale_report()["late_group_wait"]["steps_waited"] == 1

        # the newer groups go into step 3, after them: nothing was dropped
        service.mark_consumed([r.group_id for r in step_2])
        service.set_step(2)
        step_3 = service.next_batch(b, timeout=10)
        assert sorted(r.group_id for r in step_3) == sorted(p.group_id for p in newer)
        assert service.accounting()["groups_stale"] == 0
        slow.close()
        fast.close()


def test_the_wait_for_late_groups_ends_at_its_bound_and_is_reported():
    b, eta = 2, 0
    with running_service(PromptSource(make_prompts(64)), prompts_per_step=b, max_staleness=eta,
                         late_group_wait_s=0.5) as (service, address):
        client = connected_client(address)
        leases = client.lease_prompts(b).prompts
        client.send_group(make_group(leases[0], client.actor_id, seed=0))
        # the other lease never comes back (its lease is 60 s): the step waits 0.5 s for it, then
        # takes what the queue has
        batch = service.next_batch(1, timeout=10)
        assert [r.group_id for r in batch] == [leases[0].group_id]
        report = service.stale_report()["late_group_wait"]
        assert report["steps_waited"] == 1 and report["steps_given_up"] == 1
        assert 0.45 <= report["seconds_waited"] < 5, report
        client.close()


def test_an_actor_eta_versions_behind_gets_no_lease_until_it_loads_a_newer_version():
    """Asynchronous: what it sampled would be stale on arrival, whatever the budget says; it is told
    to ask again at once (it loads the newer version it learns of from the reply first)."""
    eta = 2
    with running_service(PromptSource(make_prompts(64)), prompts_per_step=B, max_staleness=eta) as (service, address):
        client = connected_client(address)
        _serve_version(service, client, 0)
        for version in (1, 2):  # two learner steps, each published; the actor loads neither
            service.set_step(version)
            service.publish_weights(version, [("w", np.zeros(4, np.float32))])
        reply = client.lease_prompts(4)  # serves v0 (step 0), the learner is at step 2: 0 <= 2 - η
        assert reply.prompts == [] and reply.retry_after_s == RETRY_MIN_S and client.latest_version == 2
        assert client.report_weights(1, applied=True)  # one version newer is enough: 1 > 2 - η
        assert len(client.lease_prompts(4).prompts) == 4
        client.close()


def test_an_actor_at_the_bound_that_refused_the_newest_version_still_leases_within_its_budget():
    """One version no actor can load must not stall the run: told to load newer weights first, the actor
    would wait for a version that needs its groups to be trained (a clean clone's run of
    test_reliability_weights hung so until the batch timeout). Refusing the newest version, it may lease
    at the bound, within its own version's budget; once a newer version is out it must try that one."""
    with running_service(PromptSource(make_prompts(64)), prompts_per_step=B, max_staleness=ETA) as (service, address):
        client = connected_client(address)
        _serve_version(service, client, 0)
        assert len(client.lease_prompts(B).prompts) == B  # step 1's batch; (η + 0 + 1)·B = 8 allowed
        service.set_step(1)
        service.publish_weights(1, [("w", np.zeros(4, np.float32))])
        refused = client.lease_prompts(B)  # serves v0 (step 0), the learner at step 1: 0 <= 1 - η
        assert refused.prompts == [] and refused.retry_after_s == RETRY_MIN_S
        assert client.report_weights(1, applied=False, detail="weight stream truncated: no commit")
        leased = client.lease_prompts(2 * B)  # its version's budget: 8 - 4 in use
        assert len(leased.prompts) == B and leased.retry_after_s > 0
        service.set_step(2)
        service.publish_weights(2, [("w", np.zeros(4, np.float32))])
        assert client.lease_prompts(B).prompts == []  # v1 is no longer the newest: try v2 first
        client.close()
