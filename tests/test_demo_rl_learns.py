"""The demo's RL stage learns: GRPO with launch/configs/demo_rl.yaml (chat-format differences, reward =
exact match, one vLLM rollout actor on Ray, asynchronous) raises held-out greedy accuracy by far more
than runs differ from one another, within a few dozen steps.

The checkpoint it starts from is built here the demo's way (launch/configs/demo_pretrain.yaml and
demo_sft.yaml: the demo's model pretrained from scratch on plain-text 2-digit sums and differences at
batch 8, then 30 SFT steps on chat-format sums only), with 3000 pretraining steps instead of the
demo's 3600 to save time. The loss's transition (plateau ~1.37, then a drop to a floor of ~1.09)
came at ~1100-1700 updates in the runs measured, and how well RL does depends on pretraining having
reached the floor: 1600 steps gave 95 % a-b= on one seed's data, but on another the run was still
mid-transition and RL gained 1 point in 40 steps (greedy 0.035 -> 0.047). After the short SFT,
chat-format differences are rarely right greedily but sometimes among 8 samples: RL's room.

Measured with this test's checkpoint on a 2-core CPU machine (256 held-out chat differences): after
SFT greedy 0.04-0.06, pass@8 0.07-0.09, the weakest starts seen. From there the demo's RL stage
without dynamic sampling stalled (0.145 after 30 steps). With it but with a 20-step learning-rate
warmup the rise came late and varied with the asynchronous timing: 0.66 after 50 steps in one run,
0.24 in a CI run. Without warmup (the demo's config now): 0.19-0.20 greedy after 10 steps and
0.81-0.83 after 50 (two runs from greedy 0.04), hence 50 steps here.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from launch.arithmetic import make_arithmetic_data
from launch.config import load_config
from launch.run import prepare
from launch.stages import run_mode
from learner.accounting import balance_violations

CONFIGS = Path(__file__).resolve().parents[1] / "launch" / "configs"
SEED = 0
HELDOUT = 256
PRETRAIN_STEPS = 3000
RL_STEPS = 50  # the demo's 40 and 10 more: from this weak a start the rise varies with the timing
# From this checkpoint (greedy 0.059, pass@8 0.090) the demo's 4 fill batches left 8-24 groups with
# signal per step, and the outcome was bimodal with the timing: one run took off (0.98 greedy after 50
# steps), three stalled at 0.25-0.26 with the policy's entropy collapsing (same checkpoint; code from
# before and after this change alike). With 8 fill batches (up to 256 groups taken per step), 20-32 groups
# with signal per step: 0.945 and 0.266 in two runs.
MAX_FILL_BATCHES = 8
MARGIN = 0.20  # greedy accuracy after RL minus before, at least (issue 13's bar for the demo)
PLATEAU_LOSS = 1.2  # mean pretraining loss over the last 100 steps is below this once past the transition
COMMON = [f"seed={SEED}", "mesh.fsdp=1", f"data.eval_examples={HELDOUT}"]

pytestmark = pytest.mark.slow


def _stage(mode: str, run_dir: Path, overrides: list[str]):
    config = load_config(CONFIGS / f"demo_{mode}.yaml", [f"run_dir={run_dir}", *COMMON, *overrides])
    run = prepare(config, mode)
    started = time.monotonic()
    summary = run_mode(run, mode)
    return summary, time.monotonic() - started


def _losses(run_dir: Path) -> list[float]:
    rows = (run_dir / "tb" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(row)["loss"] for row in rows if row.strip()]


@pytest.fixture(scope="module")
def demo_rl(ray_session, tmp_path_factory):
    """Pretrain -> SFT (the checkpoint) -> the demo's RL stage; each stage's summary and seconds."""
    root = tmp_path_factory.mktemp("demo_rl")
    data = root / "data"
    files = make_arithmetic_data(data, seed=SEED, digits=2, heldout=HELDOUT, pretrain_lines=100_000,
                                 sft_examples=5_000, rl_prompts=5_000)
    results = {}
    try:
        # data.task=none: the same pretraining text without the end-of-stage evaluation, which would
        # score the RL task in a chat format this model has never seen (always 0)
        results["pretrain"] = _stage("pretrain", root / "pretrain", [
            "data.task=none", f"data.train={files['pretrain']}", f"train.steps={PRETRAIN_STEPS}",
            f"train.checkpoint_every={PRETRAIN_STEPS}"])
        results["sft"] = _stage("sft", root / "sft", [
            f"data.dir={data}", f"model.path={results['pretrain'][0]['hf_final']}"])
        results["rl"] = _stage("rl", root / "rl", [
            f"data.dir={data}", f"model.path={results['sft'][0]['hf_final']}", f"train.steps={RL_STEPS}",
            "train.eval_every=0", f"train.checkpoint_every={RL_STEPS}", "rollout.fleet_name=test-demo-rl-learns",
            f"train.max_fill_batches={MAX_FILL_BATCHES}"])
    finally:
        for handler in logging.getLogger().handlers[:]:  # prepare() logs each stage to its run dir
            if getattr(handler, "tandem_debug_log", False):
                logging.getLogger().removeHandler(handler)
                handler.close()
    print("\n" + json.dumps({stage: {"seconds": round(seconds), "eval": summary.get("eval")}
                             for stage, (summary, seconds) in results.items()}, indent=1))
    return {"root": root, **results}


def test_the_checkpoint_leaves_rl_something_to_find(demo_rl):
    """Pretraining got past its transition, and after SFT chat-format differences are rarely right
    greedily but sometimes right among 8 samples."""
    tail = _losses(demo_rl["root"] / "pretrain")[-100:]
    assert sum(tail) / len(tail) < PLATEAU_LOSS, f"pretraining stopped on its plateau: {tail[-5:]}"
    before = demo_rl["sft"][0]["eval"]
    assert before["pass@1_greedy"] <= 0.5 - MARGIN, before
    assert before["pass@8"] >= 0.05, before


def test_the_demo_rl_stage_raises_held_out_accuracy(demo_rl):
    before, (summary, _) = demo_rl["sft"][0]["eval"], demo_rl["rl"]
    after = summary["eval"]
    assert summary["steps"] == RL_STEPS
    assert summary["accounting_violations"] == [] == balance_violations(summary["accounting"]), summary["accounting"]
    assert summary["accounting"]["internal_errors"] == 0, summary["accounting"]
    assert after["examples"] == before["examples"] == HELDOUT
    gain = after["pass@1_greedy"] - before["pass@1_greedy"]
    assert gain >= MARGIN, f"greedy {before['pass@1_greedy']:.3f} -> {after['pass@1_greedy']:.3f} after RL"
    assert after["pass@8"] >= before["pass@8"], (before, after)
    # every token the learner trained on or dropped was sampled by the actor, and asynchrony wasted little
    tokens = summary["tokens"]
    assert 0 < tokens["trained"] <= tokens["sampled"] - sum(tokens["wasted"].values()), tokens
    assert tokens["async_waste_fraction"] < 0.10, tokens
