"""Supervised fine-tuning: the learner alone, loss on assistant tokens of `messages` rows.

    python launch/sft.py launch/configs/demo_sft.yaml [key=value ...]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from any directory

from launch.stages import main_for  # noqa: E402

if __name__ == "__main__":
    sys.exit(main_for("sft"))
