"""Runs in a throwaway virtualenv that holds another JAX / flax / tunix set (tests/test_version_sets.py):
imports the learner and takes one RL and one SFT step of a tiny model, mixed precision, remat, the
backend's attention; prints one JSON line with the versions and the steps' losses.

    python tests/version_set_worker.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import numpy as np  # noqa: E402
from learner_train_helpers import OPTIMIZER, random_rl_batch, tiny_model_dir  # noqa: E402

from learner.algo.train_step import Trainer  # noqa: E402
from learner.data import TokenBatch  # noqa: E402
from models.jax_model import load_model, make_mesh  # noqa: E402


def main(out_dir: Path) -> dict:
    mesh = make_mesh(1, 1)
    trainer = Trainer(load_model(tiny_model_dir(out_dir / "model"), mesh=mesh), mesh, OPTIMIZER,
                      compute_dtype="bfloat16", remat="save_matmuls")
    rl = trainer.rl_step(random_rl_batch())
    ids = np.random.default_rng(0).integers(5, 40, (8, 24)).astype(np.int32)
    ones = np.ones_like(ids)
    positions = np.broadcast_to(np.arange(24, dtype=np.int32), ids.shape).copy()
    sft = trainer.sft_step(TokenBatch(ids, ones, ones.astype(np.float32), ones, positions))
    return {"versions": {p: version(p) for p in ("jax", "jaxlib", "flax", "google-tunix", "optax", "orbax-checkpoint")},
            "python": sys.version.split()[0], "rl_loss": rl["loss"], "rl_update_norm": rl["update_norm"],
            "sft_loss": sft["loss"], "sft_update_norm": sft["update_norm"]}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
