"""The Ray reward pool with user reward functions, failure isolation, batching and scaling.

User functions live in a module written to a temporary directory and reach the workers through
their runtime_env PYTHONPATH, as a user's own reward module would.
"""

import collections
import textwrap
from pathlib import Path

import pytest
import ray
from misbehaviour_helpers import MISBEHAVE_ON

from rewards.pool import RewardChildError, RewardPool, RewardSpec, WeightedReward
from rewards.types import RewardStats

pytestmark = pytest.mark.slow  # Ray reward workers

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 1.0

USER_MODULE = MISBEHAVE_ON + '''
import asyncio, math
from rewards import reward

def misbehave(prompt, completion, *, completion_ids, metadata):
    """Does what the completion says."""
    misbehave_on(completion, ValueError)
    return {"nan": math.nan, "inf": -math.inf, "string": "1.0", "none": None}.get(completion, 1.0)

def token_count(prompt, completion, *, completion_ids, metadata, scale=1.0):
    return scale * len(completion_ids)

async def sleepy(prompt, completion, *, completion_ids, metadata):
    await asyncio.sleep(float(completion))
    return float(completion)

@reward("user_group_rank", batched=True)
def group_rank(prompts, completions, *, completion_ids, metadata):
    order = sorted(range(len(completions)), key=lambda i: len(completion_ids[i]))
    return [float(order.index(i)) for i in range(len(completions))]

@reward("user_short_batch", batched=True)
def short_batch(prompts, completions, *, completion_ids, metadata):
    return [1.0]
'''


@pytest.fixture(scope="module")
def user_env(tmp_path_factory):
    directory = tmp_path_factory.mktemp("user_rewards")
    (directory / "user_rewards.py").write_text(textwrap.dedent(USER_MODULE))
    return {"runtime_env": {"env_vars": {"PYTHONPATH": f"{directory}:{ROOT}"}}}


@pytest.fixture(scope="module")
def misbehaving_pool(ray_session, user_env):
    spec = RewardSpec(functions=[WeightedReward(ref="user_rewards:misbehave")], timeout_s=TIMEOUT_S)
    pool = RewardPool(spec, num_workers=2, actor_options=user_env)
    yield pool
    pool.shutdown()


def group(*texts: str) -> list[tuple[str, list[int]]]:
    return [(text, [1, 2, 3]) for text in texts]


def rewards_of(results) -> list:
    return [result.reward if result.scorable else result.unscorable_reason for result in results]


FAILURES = {
    "raise": ("misbehave:raised:ValueError", False),
    "hang": ("misbehave:timeout", True),
    "exit": ("misbehave:crashed", True),
    "segfault": ("misbehave:crashed", True),
    "nan": ("misbehave:non_finite", False),
    "inf": ("misbehave:non_finite", False),
    "string": ("misbehave:wrong_type:str", False),
    "none": ("misbehave:returned_none", False),
}


@pytest.mark.parametrize("mode", sorted(FAILURES))
def test_failure_is_unscorable_with_its_reason_and_the_pool_stays_healthy(misbehaving_pool, mode):
    reason, restarts_child = FAILURES[mode]
    before = misbehaving_pool.stats()
    bad = misbehaving_pool.score_group_async("p", group("ok", mode, "ok"), {})
    good = [misbehaving_pool.score_group_async("p", group("ok", "ok"), {}) for _ in range(4)]
    assert [rewards_of(results) for results in ray.get(good)] == [[1.0, 1.0]] * 4
    assert rewards_of(ray.get(bad)) == [1.0, reason, 1.0]
    assert rewards_of(misbehaving_pool.score_group("p", group("ok"), {})) == [1.0]
    after = misbehaving_pool.stats()
    assert (after.scored - before.scored, after.unscorable - before.unscorable,
            after.restarts - before.restarts) == (2 + 8 + 1, 1, int(restarts_child))
    failures = collections.Counter(after.failures)
    failures.subtract(before.failures)
    assert +failures == {reason: 1}


def test_every_failure_in_one_group_spoils_only_its_own_completion(misbehaving_pool):
    modes = ["ok", *sorted(FAILURES), "ok"]
    results = misbehaving_pool.score_group("p", group(*modes), {})
    assert rewards_of(results) == [1.0, *(FAILURES[mode][0] for mode in sorted(FAILURES)), 1.0]


def test_weighted_components_batched_and_async_functions(ray_session, user_env):
    spec = RewardSpec(
        functions=[
            WeightedReward(ref="exact_match", weight=0.5),
            WeightedReward(ref="user_rewards:token_count", weight=2.0, kwargs={"scale": 0.25}),
            WeightedReward(ref="user_group_rank", weight=-1.0),
            WeightedReward(ref="user_rewards:sleepy", weight=0.0),
        ],
        timeout_s=TIMEOUT_S,
        imports=["user_rewards"],  # registers "user_group_rank"
    )
    pool = RewardPool(spec, actor_options=user_env)
    try:
        completions = [("0.1", [7] * 4), ("0.3", [7] * 8), ("5", [7] * 2)]
        results = pool.score_group("p", completions, {"answer": "0.3"})
        # 0.5 * exact + 2 * 0.25 * len - rank(len); the async call of "5" s times out alone
        assert rewards_of(results) == [0.5 * 0 + 2.0 - 1.0, 0.5 * 1 + 4.0 - 2.0, "sleepy:timeout"]
        assert pool.stats() == RewardStats(scored=2, unscorable=1, failures={"sleepy:timeout": 1})
    finally:
        pool.shutdown()


def test_wrong_batch_length_makes_the_whole_group_unscorable(ray_session, user_env):
    spec = RewardSpec(functions=[WeightedReward(ref="user_rewards:short_batch")], timeout_s=TIMEOUT_S)
    pool = RewardPool(spec, actor_options=user_env)
    try:
        assert rewards_of(pool.score_group("p", group("a", "b"), {})) == ["short_batch:wrong_length"] * 2
        assert rewards_of(pool.score_group("p", group("a"), {})) == [1.0]
    finally:
        pool.shutdown()


@ray.remote(num_cpus=0)
def score_elsewhere(handle, prompt, completions, metadata):
    """A rollout actor's view: a pickled worker handle, called directly."""
    return ray.get(handle.score_group.remote(prompt, completions, metadata))


def test_scaling_handles_and_stats_survive_retired_workers(ray_session):
    pool = RewardPool(RewardSpec(functions=[WeightedReward(ref="math_answer")], timeout_s=TIMEOUT_S))
    try:
        pool.scale(2)
        handles = pool.handles()
        assert len(handles) == 2
        direct = ray.get([score_elsewhere.remote(handle, "p", group("#### 4", "5"), {"answer": 4})
                          for handle in handles])
        assert [rewards_of(results) for results in direct] == [[1.0, 0.0]] * 2
        refs = [pool.score_group_async("p", group("4"), {"answer": "4"}) for _ in range(10)]
        assert all(rewards_of(results) == [1.0] for results in ray.get(refs))
        pool.scale(1)
        assert len(pool.handles()) == 1
        assert pool.stats().scored == 4 + 10
        pool.score_group("p", group("4"), {"answer": "4"})
        assert pool.stats().scored == 15
        with pytest.raises(ValueError, match="at least one"):
            pool.scale(0)
    finally:
        pool.shutdown()
    assert pool.stats().scored == 15
    with pytest.raises(RuntimeError, match="no workers"):
        pool.score_group("p", group("4"), {"answer": "4"})


def test_code_execution_through_the_pool(ray_session):
    limits = {"timeout_s": 2.0, "cpu_s": 1, "memory_mb": 512, "max_processes": 16}
    spec = RewardSpec(functions=[WeightedReward(ref="code_execution", kwargs=limits)], timeout_s=5.0)
    pool = RewardPool(spec)
    try:
        completions = group("def sq(x):\n    return x * x", "def sq(x):\n    return x + x",
                            "while True:\n    pass", "import os\nwhile True:\n    os.fork()")
        results = pool.score_group("p", completions, {"tests": "assert sq(3) == 9"})
        assert rewards_of(results) == [1.0, 0.0, 0.0, 0.0]
    finally:
        pool.shutdown()


def test_bad_references_fail_at_pool_start_with_the_cause(ray_session):
    with pytest.raises(RewardChildError, match="unknown reward 'no_such_reward'"):
        RewardPool(RewardSpec(functions=[WeightedReward(ref="no_such_reward")]))
    with pytest.raises(RewardChildError, match="No module named 'no_such_module'"):
        RewardPool(RewardSpec(functions=[WeightedReward(ref="no_such_module:fn")]))


def test_spec_rejects_duplicate_component_names():
    with pytest.raises(ValueError, match="unique"):
        RewardSpec(functions=[WeightedReward(ref="exact_match"), WeightedReward(ref="exact_match")])
    RewardSpec(functions=[WeightedReward(ref="exact_match"), WeightedReward(ref="exact_match", name="again")])
