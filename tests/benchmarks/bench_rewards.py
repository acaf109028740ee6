"""Reward pool throughput: groups scored per second with 1 and with 2 workers, side by side.

    .venv/bin/python tests/benchmarks/bench_rewards.py [--groups 1000] [--group-size 8] [--rounds 3]

A cheap function (``exact_match``) shows the pool's own overhead: Ray calls, the pipe to the
isolated child, one message per call. Both pools run in the same Ray session and alternate
rounds, so machine noise hits both alike; the median round is reported.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray  # noqa: E402

from rewards.pool import RewardPool, RewardSpec, WeightedReward  # noqa: E402


def groups_per_second(pool: RewardPool, num_groups: int, group_size: int, max_in_flight: int = 64) -> float:
    completions = [(str(i % 3), [1] * 16) for i in range(group_size)]
    start = time.perf_counter()
    in_flight = []
    for _ in range(num_groups):
        if len(in_flight) >= max_in_flight:
            done, in_flight = ray.wait(in_flight, num_returns=1)
            ray.get(done)
        in_flight.append(pool.score_group_async("prompt", completions, {"answer": "1"}))
    ray.get(in_flight)
    return num_groups / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ray.init(num_cpus=4, resources={"reward": 4}, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    spec = RewardSpec(functions=[WeightedReward(ref="exact_match")], timeout_s=10.0)
    pools = {1: RewardPool(spec, num_workers=1), 2: RewardPool(spec, num_workers=2)}
    rates: dict[int, list[float]] = {1: [], 2: []}
    for pool in pools.values():
        groups_per_second(pool, 100, args.group_size)  # warm-up
    for _ in range(args.rounds):
        for workers, pool in pools.items():
            rates[workers].append(groups_per_second(pool, args.groups, args.group_size))
    one, two = (statistics.median(rates[w]) for w in (1, 2))
    print(f"cores: {os.cpu_count()}, groups: {args.groups} x {args.group_size} completions, "
          f"rounds: {args.rounds}")
    for workers in (1, 2):
        rounds = ", ".join(f"{rate:.0f}" for rate in rates[workers])
        print(f"{workers} worker(s): {statistics.median(rates[workers]):8.0f} groups/s   (rounds: {rounds})")
    print(f"ratio 2 workers / 1 worker: {two / one:.2f}x")
    for pool in pools.values():
        pool.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
