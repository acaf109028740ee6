"""Reinforcement learning (GRPO, GSPO, GSPO-token, CISPO, decoupled PPO; Dr.GRPO and DAPO through `algo.*`):
learner + vLLM rollout actors + reward pool on Ray.

    ray job submit --working-dir . -- python launch/rl.py launch/configs/demo_rl.yaml [key=value ...]
    python launch/rl.py launch/configs/demo_rl.yaml        # starts a local Ray when none is running
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from any directory

from launch.stages import main_for  # noqa: E402

if __name__ == "__main__":
    sys.exit(main_for("rl"))
