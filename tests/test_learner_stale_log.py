"""learner/service/stale_log.py: each stale drop gets its cause, and the run summary's report counts them."""

from learner.service.stale_log import EXAMPLES, StaleLog


def test_each_cause_is_told_apart_and_counted():
    log = StaleLog()
    common = dict(actor_id="actor-0", latest_version=1_000_005, first_published=1_000_000)
    assert log.record(in_queue=False, group_id="0:1", policy_version=7, **common) == "before_restore"
    assert log.record(in_queue=True, group_id="0:2", policy_version=9, **common) == "before_restore"
    assert log.record(in_queue=False, group_id="0:3", policy_version=1_000_002, **common) == "behind_on_arrival"
    assert log.record(in_queue=True, group_id="0:4", policy_version=1_000_003, **common) == "behind_in_queue"
    report = log.report()
    assert report["causes"] == {"before_restore": 2, "behind_on_arrival": 1, "behind_in_queue": 1}
    assert report["latest"][2] == {"cause": "behind_on_arrival", "group_id": "0:3", "actor_id": "actor-0",
                                   "policy_version": 1_000_002, "latest_version": 1_000_005}


def test_before_any_publish_nothing_counts_as_before_a_restore_and_examples_are_bounded():
    log = StaleLog()
    for i in range(EXAMPLES + 5):
        log.record(in_queue=False, group_id=f"0:{i}" + "x" * 500, actor_id="a" * 500, policy_version=0,
                   latest_version=3, first_published=None)
    report = log.report()
    assert report["causes"] == {"behind_on_arrival": EXAMPLES + 5}
    assert len(report["latest"]) == EXAMPLES and report["latest"][-1]["group_id"].startswith(f"0:{EXAMPLES + 4}")
    assert max(len(d["group_id"]) for d in report["latest"]) == 64 and len(report["latest"][0]["actor_id"]) == 64
