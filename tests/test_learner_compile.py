"""The learner's compilations: one per step shape and none after it, layers under a scan equal to unrolled
ones, steps loaded from JAX's persistent cache by a second process, and remat / micro-batches chosen to fit
a stated memory budget (learner.algo.step_plan, learner.compile_log, learner.compile_ahead)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from learner_train_helpers import OPTIMIZER, host_leaves, max_abs_diff, random_rl_batch

from learner.algo.rl_batch import bucket_rows
from learner.algo.step_plan import GIB, StepTooLargeError
from learner.algo.train_step import Trainer
from learner.compile_ahead import CompileAhead, by_nearness, row_buckets
from learner.compile_log import CompileLog
from learner.data import TokenBatch
from learner.mesh import shard_rows
from models.jax_model import load_model, make_mesh
from models.lora import apply_lora
from models.peft import LoraConfig
from models.stacked_layers import per_layer

ROOT = Path(__file__).resolve().parents[1]


def sft_batch(rows: int = 8, length: int = 24) -> TokenBatch:
    rng = np.random.default_rng(3)
    ids = rng.integers(5, 40, (rows, length)).astype(np.int32)
    ones = np.ones((rows, length), np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy()
    loss = (np.arange(length)[None] >= length // 2).astype(np.float32).repeat(rows, 0)
    return TokenBatch(input_ids=ids, attention_mask=ones, segment_ids=ones.copy(), positions=positions,
                      loss_mask=loss)


@pytest.mark.parametrize("mesh_shape", [(1, 1), (8, 1)], ids=["one-device", "fsdp8"])
def test_no_step_compiles_after_the_first_in_rl_and_sft(hf_dir, mesh_shape):
    """After the ahead-of-time compile of the rl step, 4 rl steps compile nothing; the first sft step compiles
    its kind once and 3 more compile nothing. (A state left on another layout than the step returns it on
    compiled the update again on step 2: 89.5 s at 0.5B on a TPU v5e.)"""
    mesh = make_mesh(*mesh_shape)
    log = CompileLog.install()
    trainer = Trainer(load_model(hf_dir, mesh=mesh), mesh, OPTIMIZER, remat="auto", skip_no_signal=False)
    batch = random_rl_batch()
    trainer.compile_rl_step(*batch.input_ids.shape)
    mark = log.mark()
    for _ in range(4):
        assert not trainer.rl_step(batch).get("update_skipped")
    assert [r for r in log.since(mark) if r.is_step] == []
    sft = sft_batch()
    trainer.sft_step(sft)
    assert [r.function for r in log.since(mark) if r.is_step] == ["jit(train_step_ce)"]
    mark = log.mark()
    for _ in range(3):
        trainer.sft_step(sft)
    assert [r for r in log.since(mark) if r.is_step] == []
    assert int(trainer.state.step) == 8


def _rl_loss_and_grads(trainer: Trainer, batch) -> tuple[float, list[np.ndarray]]:
    with jax.set_mesh(trainer.mesh):
        arrays = shard_rows(trainer.mesh, batch._asdict())
        norm = trainer._normalizer(arrays, "rl")
        (loss, _), grads = jax.value_and_grad(trainer._rl_loss, has_aux=True)(
            trainer.state.params, arrays, norm, None, trainer._frozen, np.float32(0.0), given_old=False,
            remat="full")
    if trainer._num_layers:  # stored stacked: compared in tunix's per-layer tree
        grads = per_layer(grads, trainer._num_layers)
    return float(loss), host_leaves(grads)


@pytest.mark.parametrize(("mesh_shape", "lora"), [((1, 1), False), ((4, 2), False), ((1, 1), True)],
                         ids=["one-device", "fsdp4-tp2", "lora-bf16-base"])
def test_stacking_moves_the_layer_weights_so_the_device_holds_one_copy(hf_dir, mesh_shape, lora):
    """The stacked train state replaces the loaded per-layer arrays rather than sitting beside them (at 0.5B in
    float32 the second copy was 2 GB of a 16 GB chip; with LoRA, of the frozen base); exports refill the
    per-layer tree from the state, and a second Trainer on the moved model is refused with a clear error, not
    a crash on a deleted buffer."""
    mesh = make_mesh(*mesh_shape)
    loaded = load_model(hf_dir, mesh=mesh, dtype="bfloat16" if lora else "float32")
    if lora:
        with jax.set_mesh(mesh):
            loaded = apply_lora(loaded, LoraConfig(rank=4, alpha=8.0), seed=1)
    layer_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(loaded.model.layers)))
    before = sum(x.nbytes for x in jax.live_arrays())
    trainer = Trainer(loaded, mesh, OPTIMIZER, compute_dtype="bfloat16" if lora else None)
    assert all(x.is_deleted() for x in jax.tree.leaves(nnx.state(loaded.model.layers)))
    opt_bytes = sum(x.nbytes for x in jax.tree.leaves(trainer.state.opt_state))
    # what the Trainer added: the optimizer's moments (and a few scalars), not another copy of the layers
    grown = sum(x.nbytes for x in jax.live_arrays()) - before
    assert grown < opt_bytes + layer_bytes // 4, (grown, opt_bytes, layer_bytes)
    with pytest.raises(ValueError, match="load it again"):
        Trainer(loaded, mesh, OPTIMIZER)
    name = "model.layers.1.mlp.down_proj.weight"
    exported = dict(trainer.hf_tensors(dtype="float32"))[name]
    if lora:  # the merged weight W + (α/r)·B·A; B starts at zero, so W, the frozen base's slice
        stored = trainer._frozen[0]["layers"]["stacked"]["mlp"]["down_proj"]["kernel"]
    else:
        stored = trainer.state.params["layers"]["stacked"]["mlp"]["down_proj"]["kernel"]
    np.testing.assert_array_equal(exported, np.asarray(stored[...], np.float32)[1].T)


@pytest.mark.parametrize("lora", [False, True], ids=["full-weights", "lora"])
def test_scanned_layers_give_the_unrolled_loss_and_gradients(hf_dir, lora):
    """float32, under full remat: the scan over the layer weights stored stacked (models.stacked_layers) is the
    same function as the loop over tunix's per-layer tree, and gives the same gradients per layer."""
    mesh = make_mesh(1, 1)
    batch = random_rl_batch()
    results = {}
    for scan in (True, False):
        loaded = load_model(hf_dir, mesh=mesh)
        if lora:
            with jax.set_mesh(mesh):
                loaded = apply_lora(loaded, LoraConfig(rank=4, alpha=8.0), seed=1)
            # B starts at zero: move it so the adapters' gradients and outputs are not trivially zero
            for path, var in nnx.to_flat_state(nnx.state(loaded.model, nnx.LoRAParam)):
                if str(path[-1]).endswith("_lora_b"):
                    var.set_value(var.get_value() + 0.05)
        results[scan] = _rl_loss_and_grads(Trainer(loaded, mesh, OPTIMIZER, scan_layers=scan), batch)
    (loss_scan, grads_scan), (loss_loop, grads_loop) = results[True], results[False]
    assert abs(loss_scan - loss_loop) <= 1e-6 * max(1.0, abs(loss_loop))
    assert max_abs_diff(grads_scan, grads_loop) <= 1e-6
    assert max(float(np.abs(g).max()) for g in grads_loop) > 1e-3  # the comparison compares something


def test_remat_auto_takes_the_cheapest_policy_that_fits_and_splits_when_none_does(hf_dir):
    mesh = make_mesh(1, 1)
    batch = random_rl_batch()
    shape = batch.input_ids.shape

    def plan(remat: str, budget_gib: float | None = None, micro_batches: int = 1):
        trainer = Trainer(load_model(hf_dir, mesh=mesh), mesh, OPTIMIZER, remat=remat, micro_batches=micro_batches,
                          memory_budget_gib=budget_gib, skip_no_signal=False)
        return trainer, trainer.compile_rl_step(*shape)

    need = {remat: plan(remat)[1].device_bytes for remat in ("none", "save_matmuls", "full")}
    need_full_2 = plan("full", micro_batches=2)[1].device_bytes
    assert need["none"] > need["save_matmuls"] > need["full"] > need_full_2  # what the choice rests on

    roomy = plan("auto", 2 * need["none"] / GIB)[1]
    assert (roomy.remat, roomy.parts) == ("none", 1)
    between = plan("auto", (need["none"] + need["save_matmuls"]) / 2 / GIB)[1]
    assert (between.remat, between.parts) == ("save_matmuls", 1)
    split_trainer, split = plan("auto", (need["full"] + need_full_2) / 2 / GIB)
    assert (split.remat, split.parts) == ("full", 2) and split.device_bytes <= need["full"]

    # the split step makes the one-pass update (the loss keeps the global batch's normaliser)
    whole_trainer = plan("none")[0]
    for trainer in (split_trainer, whole_trainer):
        trainer.rl_step(batch)
    assert max_abs_diff(host_leaves(split_trainer.state.params), host_leaves(whole_trainer.state.params)) < 1e-6

    with pytest.raises(StepTooLargeError, match=r"rl step 8 x 24 does not fit in .* GiB per device.*full remat in "
                                                r"8 micro-batches needs"):
        plan("auto", need_full_2 / 8 / GIB)


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_compiling_the_update_traces_the_loss_once(hf_dir, micro_batches):
    """One trace of the loss (forward and backward) per compiled update, micro-batched or not: the loss is the
    bulk of the trace, which a warm start pays before every cache load (a second trace for the shapes of the
    accumulators cost 1.1 s of the first step at 0.5B on a TPU v5e)."""
    mesh = make_mesh(1, 1)
    trainer = Trainer(load_model(hf_dir, mesh=mesh), mesh, OPTIMIZER, remat="none", micro_batches=micro_batches,
                      skip_no_signal=False)
    traced, loss = [], trainer._rl_loss

    def counting_loss(*args, **kwargs):
        traced.append(1)
        return loss(*args, **kwargs)

    trainer._rl_loss = counting_loss
    trainer.compile_rl_step(*random_rl_batch().input_ids.shape)
    assert len(traced) == 1
    assert not trainer.rl_step(random_rl_batch()).get("update_skipped")
    assert len(traced) == 1  # the step runs what was compiled ahead


def test_rl_row_buckets_are_all_compiled_ahead_nearest_first():
    assert row_buckets(16, 2) == [2, 4, 6, 8, 12, 16]
    assert by_nearness([2, 4, 6, 8, 12, 16], 8) == [8, 6, 12, 16, 4, 2]  # 16 and 4 tie: larger first
    # every row count up to the most lands in a listed bucket
    assert {bucket_rows(rows, 2) for rows in range(1, 17)} <= set(row_buckets(16, 2))
    # a run's buckets (32 sequences of at most 64 tokens in 128-token rows: at most 16 rows; 8 at 32 tokens),
    # and train.compile_ahead=first's: the nearest alone
    kwargs = dict(sequences=32, row_tokens=128, max_sequence_len=64, expected_len=32, row_multiple=2, again=False)
    assert CompileAhead.for_run(None, **kwargs).rows == [8, 6, 12, 16, 4, 2]
    assert CompileAhead.for_run(None, **kwargs, first_only=True).rows == [8]


CHILD = """
import json, os, sys
sys.path[:0] = [{root!r}, {tests!r}]
from launch.run import use_compilation_cache
use_compilation_cache()
from learner.compile_log import CompileLog
log = CompileLog.install()
from learner.algo.train_step import Trainer
from learner_train_helpers import OPTIMIZER, random_rl_batch
from models.jax_model import load_model, make_mesh
mesh = make_mesh(1, 1)
trainer = Trainer(load_model({hf_dir!r}, mesh=mesh), mesh, OPTIMIZER, skip_no_signal=False)
trainer.rl_step(random_rl_batch())
print("RESULT", json.dumps([[r.function, r.is_step, r.cache_hit] for r in log.since()]))
"""


def test_a_second_process_loads_the_step_from_the_compilation_cache(hf_dir, tmp_path):
    """launch.run.use_compilation_cache: a restarted learner (a second process, same shapes) compiles no step,
    and, since every program is cached however quick its compile, nothing else either (model loading,
    stacking, the optimizer's set-up: seconds of a TPU learner's warm start)."""
    code = CHILD.format(root=str(ROOT), tests=str(ROOT / "tests"), hf_dir=str(hf_dir))
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.split("RESULT", 1)[1]))
    first, second = runs
    assert [f for f, is_step, hit in first if is_step] == ["jit(train_step_rl)"]  # compiled once, by the first
    assert not any(hit for _, is_step, hit in first if is_step)
    assert [(f, hit) for f, is_step, hit in second if is_step] == [("jit(train_step_rl)", True)]  # loaded
    assert len(second) == len(first) > 1
    assert [f for f, _, hit in second if not hit] == []  # no program compiled again
