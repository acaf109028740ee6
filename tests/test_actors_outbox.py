"""The actor's outbox (actors/outbox.py) without a network or threads: acks of every status, credits
and probes, re-sending after a reconnect, and the counts."""

from __future__ import annotations

import pytest

from actors.outbox import IDLE_WAIT_S, MIN_WAIT_S, PROBE_DELAY_S, Outbox, Send, Wait
from tandem_wire import pb

QUEUED, RETRY = pb.ACK_STATUS_QUEUED, pb.ACK_STATUS_RETRY
FINAL = [
    (pb.ACK_STATUS_CONSUMED, "consumed"),
    (pb.ACK_STATUS_DUPLICATE, "duplicate"),
    (pb.ACK_STATUS_STALE, "stale"),
    (pb.ACK_STATUS_INVALID, "invalid"),
]


def outbox_with(*group_ids: str, credits: int = 1) -> Outbox[str]:
    """An outbox on its first stream holding `group_ids` (each group's payload is its id upper-cased)."""
    outbox: Outbox[str] = Outbox()
    for group_id in group_ids:
        outbox.add(group_id, group_id.upper())
    outbox.set_credits(credits)
    assert outbox.open_stream() == 1
    return outbox


def send_all(outbox: Outbox[str], now: float = 0.0) -> list[str]:
    """The ids of the groups sent at `now` until the outbox says to wait."""
    sent = []
    while isinstance(step := outbox.next_send(now), Send):
        sent.append(step.group_id)
    return sent


def test_a_group_is_sent_once_with_its_payload_and_an_empty_outbox_waits():
    outbox = outbox_with("a")
    assert outbox.next_send(0.0) == Send("a", "A", probe=False)
    assert outbox.next_send(0.0) == Wait(IDLE_WAIT_S)  # the one credit awaits its ack
    assert outbox.record_ack("a", pb.ACK_STATUS_CONSUMED, credits=1) == "consumed"
    assert outbox.next_send(0.0) == Wait(IDLE_WAIT_S)  # nothing left to send
    assert Outbox().next_send(0.0) == Wait(IDLE_WAIT_S)


def test_a_group_id_is_added_once_while_unacked_and_again_after_its_final_ack():
    outbox = outbox_with("a")
    with pytest.raises(ValueError, match="'a' is already waiting for an ack"):
        outbox.add("a", "again")
    assert outbox.counts() == {"submitted": 1, "unacked": 1}
    send_all(outbox)
    outbox.record_ack("a", pb.ACK_STATUS_STALE, credits=1)
    outbox.add("a", "again")
    assert outbox.next_send(0.0) == Send("a", "again", probe=False)
    assert outbox.counts() == {"submitted": 2, "sent": 2, "stale": 1, "unacked": 1}  # not counted as resent


@pytest.mark.parametrize(("status", "name"), FINAL)
def test_a_final_ack_removes_the_group(status, name):
    outbox = outbox_with("a", "b", credits=2)
    assert send_all(outbox) == ["a", "b"]
    assert outbox.record_ack("a", status, credits=2) == name
    assert not outbox.is_unacked("a") and outbox.is_unacked("b") and outbox.unacked_count() == 1
    assert outbox.available_credits() == 1  # b still awaits its ack
    assert outbox.counts() == {"submitted": 2, "sent": 2, name: 1, "unacked": 1}
    outbox.open_stream()
    assert send_all(outbox) == ["b"]  # a is never sent again


def test_a_queued_ack_keeps_the_group_unsent_until_a_new_stream():
    outbox = outbox_with("a", "b", credits=5)
    assert send_all(outbox) == ["a", "b"]
    assert outbox.record_ack("a", QUEUED, credits=4) is None
    assert outbox.is_unacked("a") and outbox.unacked_count() == 2
    assert outbox.available_credits() == 3 and send_all(outbox) == []
    assert outbox.counts() == {"submitted": 2, "sent": 2, "queued": 1, "unacked": 2}


def test_a_retry_ack_sends_the_group_again_behind_the_waiting_ones():
    outbox = outbox_with("a", "b", "c", credits=1)
    assert send_all(outbox) == ["a"]
    assert outbox.record_ack("a", RETRY, credits=1) is None
    assert send_all(outbox) == ["b"]
    outbox.record_ack("b", QUEUED, credits=2)
    assert send_all(outbox) == ["c", "a"]
    assert outbox.counts() == {"submitted": 3, "sent": 4, "resent": 1, "retry": 1, "queued": 1, "unacked": 3}


def test_a_final_ack_of_a_group_waiting_to_be_sent_again_cancels_the_resend():
    outbox = outbox_with("a", "b", credits=1)
    send_all(outbox)
    outbox.record_ack("a", RETRY, credits=1)  # waiting list: b, a
    assert outbox.record_ack("a", pb.ACK_STATUS_DUPLICATE, credits=1) == "duplicate"
    assert send_all(outbox) == ["b"]
    outbox.record_ack("b", QUEUED, credits=1)
    assert send_all(outbox) == []


@pytest.mark.parametrize("status", [pb.ACK_STATUS_UNSPECIFIED, 99])
def test_an_ack_of_another_status_only_updates_the_credits(status):
    outbox = outbox_with("a", "b", credits=1)
    send_all(outbox)
    assert outbox.record_ack("a", status, credits=3) is None
    assert outbox.is_unacked("a") and outbox.available_credits() == 3
    assert send_all(outbox) == ["b"]  # a is not sent again on this stream
    assert outbox.counts() == {"submitted": 2, "sent": 2, "unacked": 2}


def test_an_ack_of_a_group_not_in_the_outbox_only_updates_the_credits():
    outbox = outbox_with("a", credits=0)
    assert outbox.record_ack("ghost", pb.ACK_STATUS_CONSUMED, credits=2) is None
    assert outbox.available_credits() == 2
    assert outbox.counts() == {"submitted": 1, "unacked": 1}
    assert outbox.next_send(0.0) == Send("a", "A", probe=False)


def test_sends_only_while_credits_exceed_the_groups_awaiting_an_ack():
    outbox = outbox_with("a", "b", "c", "d", credits=2)
    assert not outbox.backlog_fits()  # 4 waiting > 2 available
    assert send_all(outbox) == ["a", "b"]
    assert outbox.available_credits() == 0 and outbox.next_send(0.0) == Wait(IDLE_WAIT_S)
    outbox.record_ack("a", QUEUED, credits=2)
    assert outbox.available_credits() == 1 and not outbox.backlog_fits()  # 2 waiting > 1
    assert send_all(outbox) == ["c"]
    assert outbox.available_credits() == 0 and not outbox.backlog_fits()  # 1 waiting > 0
    outbox.record_ack("b", QUEUED, credits=2)
    assert outbox.available_credits() == 1 and outbox.backlog_fits()  # 1 waiting <= 1
    outbox.record_ack("ghost", QUEUED, credits=0)  # the learner filled up: c awaiting makes it -1
    assert outbox.available_credits() == -1 and not outbox.backlog_fits()
    assert outbox.next_send(100.0) == Wait(IDLE_WAIT_S)  # no probe while c awaits its ack
    outbox.record_ack("c", QUEUED, credits=0)
    assert outbox.next_send(100.0) == Send("d", "D", probe=True)
    assert send_all(outbox) == [] and outbox.backlog_fits()  # nothing waits: fits even without credits


def test_without_credits_probes_back_off_doubling_to_the_cap_and_a_queued_ack_resets_them():
    outbox = outbox_with("a", "b", credits=0)
    delays, now = [], 0.0
    for _ in range(8):
        step = outbox.next_send(now)
        assert isinstance(step, Send) and step.probe
        assert outbox.next_send(now) == Wait(IDLE_WAIT_S)  # the probe awaits its ack
        outbox.record_ack(step.group_id, RETRY, credits=0)
        wait = outbox.next_send(now)
        assert isinstance(wait, Wait)
        delays.append(wait.seconds)
        now += 10.0
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    assert (delays[0], delays[-1]) == pytest.approx(PROBE_DELAY_S)
    assert outbox.next_send(now) == Send("a", "A", probe=True)  # the probes took turns: a, b, a, ...
    outbox.record_ack("a", QUEUED, credits=0)
    now += 10.0
    assert outbox.next_send(now) == Send("b", "B", probe=True)
    outbox.record_ack("b", RETRY, credits=0)
    assert outbox.next_send(now) == Wait(pytest.approx(PROBE_DELAY_S[0]))  # back to the shortest delay
    assert outbox.counts() == {"submitted": 2, "sent": 10, "resent": 8, "retry": 9, "queued": 1, "unacked": 2}


def test_the_wait_before_a_probe_is_the_time_left_but_at_least_the_minimum():
    outbox = outbox_with("a", credits=0)
    assert outbox.next_send(1.0) == Send("a", "A", probe=True)  # next probe not before 1.05
    outbox.record_ack("a", RETRY, credits=0)
    assert outbox.next_send(1.02).seconds == pytest.approx(0.03)
    assert outbox.next_send(1.049) == Wait(MIN_WAIT_S)
    assert outbox.next_send(1.05) == Send("a", "A", probe=True)


def test_a_send_with_credits_is_no_probe_and_leaves_the_probe_time_alone():
    outbox = outbox_with("a", "b", "c", credits=0)
    assert outbox.next_send(0.0) == Send("a", "A", probe=True)  # the next probe not before 0.05
    outbox.record_ack("a", QUEUED, credits=1)  # resets the delay to 0.05
    assert outbox.next_send(0.01) == Send("b", "B", probe=False)
    outbox.record_ack("b", QUEUED, credits=0)
    assert outbox.next_send(0.04) == Wait(pytest.approx(0.01))  # still the first probe's time
    assert outbox.next_send(0.05) == Send("c", "C", probe=True)
    outbox.record_ack("c", RETRY, credits=0)
    assert outbox.next_send(0.05) == Wait(pytest.approx(0.05))


def test_a_new_stream_resends_every_unacked_group_in_the_order_added():
    outbox = outbox_with("a", "b", "c", "d", "e", credits=3)
    assert send_all(outbox) == ["a", "b", "c"]
    outbox.record_ack("c", RETRY, credits=3)  # waiting: d, e, c
    outbox.record_ack("b", pb.ACK_STATUS_CONSUMED, credits=3)
    outbox.record_ack("a", QUEUED, credits=3)
    assert send_all(outbox) == ["d", "e", "c"]  # d and e were never sent
    outbox.end_stream()
    assert not outbox.is_current(1) and outbox.next_send(0.0) == Wait(IDLE_WAIT_S)
    outbox.add("f", "F")  # added while disconnected
    assert outbox.open_stream() == 3 and outbox.is_current(3) and not outbox.is_current(2)
    assert outbox.available_credits() == 3  # nothing awaits an ack on the new stream
    assert not outbox.backlog_fits()  # 5 waiting > 3
    assert send_all(outbox) == ["a", "c", "d"]
    for group_id in ("a", "c", "d"):
        outbox.record_ack(group_id, QUEUED, credits=3)
    assert send_all(outbox) == ["e", "f"]
    assert outbox.counts() == {
        "submitted": 6, "sent": 11, "resent": 5, "retry": 1, "consumed": 1, "queued": 4, "reconnects": 1,
        "unacked": 5,
    }


def test_counts_report_every_counter():
    outbox = outbox_with("a", "b", "c", "d", "e", "f", credits=6)
    assert send_all(outbox) == ["a", "b", "c", "d", "e", "f"]
    outbox.record_ack("a", pb.ACK_STATUS_CONSUMED, credits=6)
    outbox.record_ack("b", pb.ACK_STATUS_DUPLICATE, credits=6)
    outbox.record_ack("c", pb.ACK_STATUS_STALE, credits=6)
    outbox.record_ack("d", pb.ACK_STATUS_INVALID, credits=6)
    outbox.record_ack("e", QUEUED, credits=6)
    outbox.record_ack("f", RETRY, credits=6)
    assert send_all(outbox) == ["f"]
    outbox.end_stream()
    outbox.end_stream()
    outbox.open_stream()
    assert send_all(outbox) == ["e", "f"]
    assert outbox.counts() == {
        "submitted": 6, "sent": 9, "resent": 3, "consumed": 1, "duplicate": 1, "stale": 1, "invalid": 1,
        "queued": 1, "retry": 1, "reconnects": 2, "unacked": 2,
    }
    assert Outbox().counts() == {"unacked": 0}
