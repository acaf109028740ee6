"""A real model's shape end to end on CPU: Qwen2.5-0.5B's widths, heads and 151,936-token vocabulary
(2 of its 24 layers, random weights saved in bf16, an offline ChatML tokenizer spanning the vocabulary)
through SFT and then RL, both from launch/configs/qwen_gsm8k_gpu.yaml as shipped (bf16 compute with
float32 master weights, GSPO, GSM8K-style rows read as they come) with size overrides only.

What it proves, step 1 of each stage:
- the update is applied to float32 master weights, by the amount AdamW's first step gives: a
  parameter moves by lr·g/(|g| + ε) ≈ ±lr (the shipped lr warms up from 1e-7, 1/1000 of a bf16 ulp of
  a weight of 0.02, so bf16 master weights would not move at all). The checkpoint of step 1 is
  compared with the weights the stage started from;
- RL trains on what vLLM sampled: the learner's bf16 logprobs of the sampled tokens agree with vLLM's
  bf16 behaviour logprobs within BEHAVIOUR_GAP_BOUND (the gap is printed: it is the training–inference
  mismatch `algo.correction` corrects);
- the actor loaded each published bf16 version, and the exported bf16 dir loads in vLLM (the final
  evaluation) and in transformers, whose logits match the learner's.
RL's reward is a format check that a random model meets about half the time (`^<x1`: the first
sampled token is one of the vocabulary's filler ids beginning with 1), so groups carry signal; the
math_answer path on GSM8K-style rows is tested in tests/test_launch_prompts.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from launch.config import load_config
from launch.real_shape import CONFIG, RANDOM_MODEL_REWARD, rl_overrides, write_gsm8k_style_data
from launch.run import Run, close_debug_log, prepare
from launch.stages import run_mode
from launch.trainer import build_trainer
from learner.checkpoint import Checkpointer
from models.tiny import make_chatml_model

pytestmark = pytest.mark.slow  # a Qwen2.5-0.5B-shaped model through SFT and RL

LAYERS = 2
BEHAVIOUR_GAP_BOUND = 0.05  # token-mean |log π_learner − log π_vLLM| at bf16, nats
# Sizes only: what the shipped config trains with is kept (dtype, algorithm, learning rate, template).
SIZES = ["mesh.fsdp=1", "train.steps=2", "train.micro_batches=1", "train.checkpoint_every=1",
         "train.logits_chunk_tokens=1024",
         "data.eval_examples=2", "train.eval_k=2", "train.eval_kv_cache_gib=0.25", "rollout.max_tokens=8",
         "rollout.max_prompt_tokens=192", "rollout.max_model_len=256"]


def stage(mode: str, run_dir: Path, overrides: list[str]) -> dict:
    """Run one stage of the shipped config in this process: its summary, metrics rows and how its first
    update moved the master weights."""
    config = load_config(CONFIG, [f"run_dir={run_dir}", *SIZES, *overrides])
    try:
        run = prepare(config, mode)
        summary = run_mode(run, mode)
    finally:
        close_debug_log()  # prepare() logs each stage to its run dir
    rows = (run_dir / "tb" / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(row) for row in rows if row.strip()]
    moves = first_update_moves(run, metrics[0]["learning_rate"])
    shutil.rmtree(run_dir / "checkpoints")  # step 1 is read; each step saved is 1.6 GB (weights, Adam moments)
    return {"summary": summary, "metrics": metrics, "moves": moves}


def first_update_moves(run: Run, lr: float) -> dict[str, dict[str, float]]:
    """Per parameter of the step-1 checkpoint against the weights the stage started from: its dtype,
    the largest |Δ| beyond lr (in float32 ulps of the weight: ≤ 1 when every move is ≤ lr), and the
    fraction of its entries that moved by more than lr/2."""
    trainer = build_trainer(run)
    start = trainer.state.params
    after = Checkpointer(run.run_dir / "checkpoints").restore(trainer.state, step=1).state.params
    moves = {}
    for (path, a), (_, b) in zip(nnx.to_flat_state(start), nnx.to_flat_state(after), strict=True):
        a, b = np.asarray(a.get_value()), np.asarray(b.get_value())
        delta = np.abs(b.astype(np.float64) - a)
        excess = (delta - lr) / np.spacing(np.maximum(np.abs(a), np.abs(b)))
        moves[".".join(map(str, path))] = {"dtype": b.dtype.name, "max_excess_ulps": float(excess.max()),
                                           "moved": float((delta > lr / 2).mean()), "size": a.size}
    return moves


def assert_first_update_is_adams(result: dict, *, embedding_moved: float) -> None:
    """Float32 master weights, each entry moved by at most lr (plus float32 rounding), and nearly every
    entry of the decoder by more than lr/2; the embedding's rows of tokens absent from the batch get
    gradients within a few ε of 0 (softmax mass alone), so fewer of them move that far."""
    first = result["metrics"][0]
    assert first["update_skipped"] == 0 and np.isfinite(first["loss"])
    moves = result["moves"]
    assert {m["dtype"] for m in moves.values()} == {"float32"}
    assert max(m["max_excess_ulps"] for m in moves.values()) <= 1.0
    decoder = [m for name, m in moves.items() if name != "embedder.input_embedding"]
    assert sum(m["moved"] * m["size"] for m in decoder) / sum(m["size"] for m in decoder) >= 0.99
    assert min(m["moved"] for m in decoder) >= 0.9
    assert moves["embedder.input_embedding"]["moved"] >= embedding_moved


@pytest.fixture(scope="module")
def real_shape(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("real_shape")
    model_dir = make_chatml_model(root / "init", num_layers=LAYERS, dtype="bfloat16", seed=0)
    data = write_gsm8k_style_data(root / "data")
    sft = stage("sft", root / "sft", [f"model.path={model_dir}", f"data.train={data['sft']}",
                                      f"data.eval={data['eval']}", "data.seq_len=256", "train.batch_size=2"])
    rl = stage("rl", root / "rl", [
        f"model.path={sft['summary']['hf_final']}", f"data.train={data['train']}", f"data.eval={data['eval']}",
        "rollout.kv_cache_gib=0.25", RANDOM_MODEL_REWARD,
        *rl_overrides(prompts=2, group_size=4, fleet_name="test-real-shape")])
    return {"sft": sft, "rl": rl}


def test_sft_update_is_applied_in_float32_master_weights(real_shape):
    result = real_shape["sft"]
    assert [m["step"] for m in result["metrics"]] == [1, 2]
    assert result["metrics"][0]["loss_tokens"] > 0
    assert_first_update_is_adams(result, embedding_moved=0.85)  # measured 0.93
    assert set(result["summary"]["eval"]) >= {"pass@1_greedy"}  # the exported bf16 dir loaded in vLLM


def test_rl_update_is_applied_and_vllm_logprobs_agree_with_the_learner(real_shape):
    summary, metrics = real_shape["rl"]["summary"], real_shape["rl"]["metrics"]
    first = metrics[0]
    print(f"\nreal shape, bf16: behaviour_gap {first['behaviour_gap']:.4f} nats (token mean), "
          f"ratio_mean {first['ratio_mean']:.4f}, clip {first['clip_frac_low']:.3f}/{first['clip_frac_high']:.3f}")
    assert_first_update_is_adams(real_shape["rl"], embedding_moved=0.6)  # measured 0.80
    assert 0 < first["behaviour_gap"] <= BEHAVIOUR_GAP_BOUND
    assert summary["steps"] == 2 and not summary["accounting_violations"]
    (actor,) = summary["actors"].values()
    assert actor["weight_rejections"] == 0 and set(actor["versions_applied"]) >= {1}
    assert "pass@1_greedy" in summary["eval"]  # hf_final (bf16) loaded in vLLM


def test_exported_bf16_dir_loads_in_transformers_and_matches_the_learner(real_shape):
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.jax_model import forward_logits, load_model

    hf_dir = Path(real_shape["rl"]["summary"]["hf_final"])
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["vocab_size"] == 151_936
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 plus 30?"}],
                                        add_generation_prompt=True, tokenize=True, return_dict=False)
    hf_model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16)
    assert next(hf_model.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        hf_logits = hf_model(torch.tensor([ids])).logits.float().numpy()[0]
    ours = np.asarray(forward_logits(load_model(hf_dir, dtype="float32").model, jnp.asarray([ids]),
                                     jnp.ones((1, len(ids)), jnp.int32)), np.float32)[0]
    # bf16 weights, computed in bf16 (transformers) and float32 (the learner's check): the same model.
    assert np.abs(hf_logits - ours).max() < 0.05 * np.abs(ours).max()
    assert (hf_logits.argmax(-1) == ours.argmax(-1)).mean() >= 0.9


def test_the_device_checks_report_reads_the_run(real_shape):
    """launch/device_check.py's figures, computed from this run (the accelerator run prints the same)."""
    from launch.device_check import flops_per_token, report

    rl = real_shape["rl"]
    run_dir = Path(rl["summary"]["hf_final"]).parent
    hf_config = json.loads((run_dir / "hf_final" / "config.json").read_text())
    figures = report(run_dir, rl["summary"], hf_config, group_size=4, peak_tflops=1.0)
    second = rl["metrics"][1]
    assert figures["behaviour_gap_step1"] == rl["metrics"][0]["behaviour_gap"]
    assert figures["learner_step_s"] == second["learner_step_s"] and figures["tokens_per_s"] == second["tokens_per_s"]
    # 2 prompts x 4 completions of at most 192 prompt + 8 new tokens
    assert 100 < figures["mean_sequence"] <= 200
    assert figures["mfu"] == pytest.approx(flops_per_token(hf_config, figures["mean_sequence"])
                                           * second["tokens_per_s"] / 1e12)
    # 6 FLOPs per matmul parameter dominate: the tied 151,936 x 896 head alone is 136M of them
    assert flops_per_token(hf_config, 0) > 6 * 151_936 * 896
    assert figures["publish_s"] > 0 and figures["actor_stall_s"] > 0
