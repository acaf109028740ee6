"""The jump detector: what counts as a jump of entropy or update norm, on exact numbers."""

from learner.guard import GuardConfig, JumpDetector


def test_a_value_past_factor_times_the_recent_median_is_a_jump():
    detector = JumpDetector(GuardConfig(entropy_factor=1.5, update_norm_factor=10, window=4, min_history=3))
    for step, entropy in enumerate([1.0, 1.2, 0.8], start=1):  # history too short to judge
        assert detector.observe(step, {"entropy": entropy, "update_norm": 0.1}) == []
    assert detector.observe(4, {"entropy": 1.49, "update_norm": 0.99}) == []  # median 1.0 and 0.1
    (jump,) = detector.observe(5, {"entropy": 1.9, "update_norm": 0.5})  # median of last 4 entropies: 1.1
    assert (jump.step, jump.metric, jump.value, round(jump.reference, 6)) == (5, "entropy", 1.9, 1.1)
    assert "1.7x its recent median" in jump.reason
    jumps = detector.observe(6, {"entropy": 9.0, "update_norm": 50.0})
    assert [j.metric for j in jumps] == ["entropy", "update_norm"]


def test_skipped_updates_are_ignored_and_reset_forgets_the_history():
    detector = JumpDetector(GuardConfig(min_history=2, window=3))
    detector.observe(1, {"entropy": 1.0})
    detector.observe(2, {"entropy": 1.0})
    assert detector.observe(3, {"entropy": 50.0, "update_skipped": 1.0}) == []
    assert len(detector.observe(4, {"entropy": 50.0})) == 1
    detector.reset()
    assert detector.observe(5, {"entropy": 500.0}) == []
