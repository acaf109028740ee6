"""Gradient accumulation: k micro-batches (global-batch denominators, one optimizer update) equal one
full-batch step."""

from __future__ import annotations

import numpy as np
import pytest
from learner_train_helpers import (
    OPTIMIZER,
    TOL,
    addition_texts,
    host_leaves,
    max_abs_diff,
    random_rl_batch,
)
from transformers import AutoTokenizer

from launch.json_files import write_jsonl
from learner.algo.losses import LossConfig
from learner.algo.train_step import Trainer
from learner.data import DataConfig, make_batches
from models.jax_model import load_model, make_mesh

# seq-mean-token-mean weighs sequences, token-mean tokens: both need the global normaliser.
LOSS = LossConfig(aggregation="seq-mean-token-mean", beta=0.05)


@pytest.fixture(scope="module")
def pretrain_batch(hf_dir, tmp_path_factory):
    data = write_jsonl(tmp_path_factory.mktemp("d") / "texts.jsonl", addition_texts(60))
    config = DataConfig(kind="pretrain", source=str(data), seq_len=40, batch_size=8)
    batch = next(make_batches(config, AutoTokenizer.from_pretrained(hf_dir)))
    # uneven loss-token counts per row, so a per-micro-batch mean would differ from the global one
    loss_mask = batch.loss_mask.copy()
    loss_mask[:3, 10:] = 0
    return batch._replace(loss_mask=loss_mask)


def _step(hf_dir, mode, batch, micro_batches):
    mesh = make_mesh(2, 1)
    trainer = Trainer(load_model(hf_dir, mesh=mesh), mesh, OPTIMIZER, loss=LOSS, micro_batches=micro_batches)
    metrics = trainer.rl_step(batch) if mode == "rl" else trainer.pretrain_step(batch)
    return host_leaves(trainer.state.params), metrics


@pytest.mark.parametrize(("mode", "k"), [("rl", 4), ("pretrain", 2)])
def test_accumulated_micro_batches_equal_the_full_batch_step(hf_dir, pretrain_batch, mode, k):
    batch = random_rl_batch() if mode == "rl" else pretrain_batch
    full_params, full = _step(hf_dir, mode, batch, 1)
    accum_params, accum = _step(hf_dir, mode, batch, k)
    for name in full.keys() - {"step_time_s", "tokens_per_s"}:
        assert accum[name] == pytest.approx(full[name], rel=1e-5, abs=1e-7), name
    assert max_abs_diff(accum_params, full_params) < TOL


def test_rows_must_split_into_micro_batches_and_empty_batches_are_skipped(hf_dir):
    mesh = make_mesh(2, 1)
    trainer = Trainer(load_model(hf_dir, mesh=mesh), mesh, OPTIMIZER, micro_batches=3)
    with pytest.raises(ValueError, match="micro-batches"):
        trainer.rl_step(random_rl_batch())
    assert np.asarray(trainer.state.step) == 0
    whole = Trainer(load_model(hf_dir, mesh=mesh), mesh, OPTIMIZER)
    empty = random_rl_batch()._replace(completion_mask=np.zeros((8, 24), np.float32))
    assert whole.rl_step(empty) == {"update_skipped": 1.0}
    assert np.asarray(whole.state.step) == 0
