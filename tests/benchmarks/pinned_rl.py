"""launch/rl.py with the rollout side on one half of this machine's cores and the learner on the other.

    .venv/bin/python tests/benchmarks/pinned_rl.py launch/configs/demo_rl.yaml [key=value ...]

Deployed, actors and learner run on separate accelerators, so neither slows the other. On one small
CPU machine they would otherwise share every core, and a synchronous run, whose sampling and training
take turns, would get the whole machine for each phase. Pinning gives each side its own cores in both
modes, as bench_loop.py does: this process pins itself to the actor cores before it starts the local
Ray (whose workers, hence the rollout actors and reward workers, inherit them), then re-pins all its
threads to the learner cores before JAX starts. On one core it runs unpinned.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from bench_loop import core_split, pin_threads  # noqa: E402


def main() -> int:
    split = core_split()
    if split:
        pin_threads(split[0])
    from launch import ray_cluster
    from launch.run import setup_process

    setup_process()
    ray_cluster.connect(None)  # the run's own connect() then finds Ray initialised
    if split:
        pin_threads(split[1])
    from launch.stages import main_for

    return main_for("rl", sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
