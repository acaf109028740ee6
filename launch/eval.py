"""Held-out evaluation of an HF model dir: greedy pass@1, sampled pass rate and pass@k.

    python launch/eval.py launch/configs/demo_rl.yaml model.path=runs/demo/rl/hf_final
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from any directory

from launch.stages import main_for  # noqa: E402

if __name__ == "__main__":
    sys.exit(main_for("eval"))
