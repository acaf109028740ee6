"""The demo's RL stage learns: GRPO with launch/configs/demo_rl.yaml (chat-format differences, reward =
exact match, one vLLM rollout actor on Ray, asynchronous) raises held-out greedy accuracy by far more
than runs differ from one another.

The checkpoint it starts from is built the demo's way, unshortened: the demo's data
(launch/arithmetic.py's defaults, 2 digits), pretraining (launch/configs/demo_pretrain.yaml, 3600
steps), SFT (demo_sft.yaml: 60 steps, half its rows plain-text lines replayed, evaluated every 10), then
the RL stage as configured (its step cap and entropy floor) from the SFT step the demo's handoff rule
chose: the last one whose held-out greedy is at most 0.30 while pass@8 is at least 0.10. The RL stage is evaluated
every 10 steps and ends early (train.stop_at) once held-out greedy is 0.22 above its start, just over the
bar the final evaluation of hf_final must clear (greedy, it scores what the evaluation in the loop scored
for the same weights: 0.369 both, measured): the demo's last ~150 steps, which dynamic sampling
makes the slowest (ever more groups drawn as accuracy rises), would only take it further (0.99 in the
demo); a start RL cannot lift runs to its plateau or its cap and fails. Where SFT's 60th step lands moves
with the machine's arithmetic (XLA's CPU kernels sum in another order; seed 0 built here gave 0.135 on
one machine and 0.377 on another), so the start is chosen on the numbers, not assumed. The bar is the
gain, not the demo's figures: a start elsewhere is another start. Beside it, an SFT forced strong (a chat
difference shown in every 10th row) shows the rule on a start past its ceiling: it hands off an earlier
step.

An earlier version of this test saved ~100 s with 3000 pretraining steps and a quarter of the data. That
gave the weakest start seen (greedy 0.059, pass@8 0.090), from which the outcome was bimodal: 2 runs
of 6 took off (0.945-0.98), 4 stalled at 0.25-0.27 with the policy's entropy collapsing, whatever
the number of fill batches (4 or 8). CI failed on it. The demo a user runs is what must learn.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from launch.arithmetic import make_arithmetic_data
from launch.config import load_config
from launch.run import close_debug_log, prepare
from launch.stages import run_mode
from learner.service.accounting import balance_violations

CONFIGS = Path(__file__).resolve().parents[1] / "launch" / "configs"
SEED = 0
HELDOUT = 512  # the demo's held-out pairs
MARGIN = 0.20  # greedy accuracy after RL minus before, at least (issue 13's bar for the demo)
STOP_ABOVE_START = MARGIN + 0.02  # RL ends at the evaluation this far above its start
SHOW_DIFFERENCE_EVERY = 10  # the forced strong start: SFT shows a chat difference in every 10th row
STRONG_STEPS = 40
PLATEAU_LOSS = 1.2  # mean pretraining loss over the last 100 steps is below this once past the transition
COMMON = [f"seed={SEED}", "mesh.fsdp=1", f"data.eval_examples={HELDOUT}"]

# Three stages in one module fixture, and pytest-timeout counts a module fixture in its first test: alone
# they take 5-9 min, but beside the other worker's engines and learners the RL stage alone ran past the
# suite's 900 s once (CI, e0e9d17). The bound is there to end a hang, not to time the demo.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def _stage(mode: str, run_dir: Path, overrides: list[str]):
    config = load_config(CONFIGS / f"demo_{mode}.yaml", [f"run_dir={run_dir}", *COMMON, *overrides])
    run = prepare(config, mode)
    started = time.monotonic()
    summary = run_mode(run, mode)
    return summary, time.monotonic() - started


def _showing_differences(data: Path, out: Path) -> Path:
    """The demo's SFT rows with every SHOW_DIFFERENCE_EVERY-th one replaced by a chat difference from the RL
    prompts (never a held-out pair): a start that SFT itself takes past the handoff rule's ceiling."""
    prompts = [json.loads(line) for line in (data / "rl.jsonl").read_text().splitlines()]
    rows = (data / "sft.jsonl").read_text().splitlines()
    for i in range(SHOW_DIFFERENCE_EVERY - 1, len(rows), SHOW_DIFFERENCE_EVERY):
        prompt = prompts[i // SHOW_DIFFERENCE_EVERY]
        rows[i] = json.dumps({"messages": [{"role": "user", "content": prompt["prompt"]},
                                           {"role": "assistant", "content": prompt["answer"]}]})
    out.write_text("\n".join(rows) + "\n")
    return out


def _steps_meeting(rule: dict[str, float], evals: dict[int, dict[str, float]]) -> list[int]:
    """The evaluated steps whose held-out scores meet the handoff rule, read from the numbers here."""
    return [step for step, e in evals.items()
            if e["pass@1_greedy"] <= rule["max_greedy"] and e["pass@8"] >= rule["min_pass_at_k"]]


def _losses(run_dir: Path) -> list[float]:
    rows = (run_dir / "tb" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(row)["loss"] for row in rows if row.strip()]


@pytest.fixture(scope="module")
def demo_rl(ray_session, tmp_path_factory):
    """Pretrain -> SFT (the checkpoint) -> the demo's RL stage, and beside it an SFT forced strong; each stage's
    summary and seconds."""
    root = tmp_path_factory.mktemp("demo_rl")
    data = root / "data"
    files = make_arithmetic_data(data, seed=SEED, digits=2)  # what the demo's data.task writes for seed 0
    results = {}
    try:
        # data.task=none: the same pretraining text without the end-of-stage evaluation, which would
        # score the RL task in a chat format this model has never seen (always 0)
        results["pretrain"] = _stage("pretrain", root / "pretrain", [
            "data.task=none", f"data.train={files['pretrain']}"])
        results["sft"] = _stage("sft", root / "sft", [
            f"data.dir={data}", f"model.path={results['pretrain'][0]['hf_final']}"])
        # the strong start, forced: 40 steps (0.56 greedy measured at step 40), evaluated every 5 steps, so
        # an early step still leaves RL room
        results["sft_strong"] = _stage("sft", root / "sft_strong", [
            f"data.dir={data}", f"data.train={_showing_differences(data, root / 'sft_strong.jsonl')}",
            f"model.path={results['pretrain'][0]['hf_final']}", f"train.steps={STRONG_STEPS}",
            f"train.checkpoint_every={STRONG_STEPS}", "train.eval_every=5"])
        handoff = results["sft"][0]["handoff"]
        target = min(1.0, handoff["eval"]["pass@1_greedy"] + STOP_ABOVE_START) if handoff["eval"] else 1.0
        results["rl"] = _stage("rl", root / "rl", [
            f"data.dir={data}", f"model.path={handoff['hf_selected']}", "train.eval_every=10",
            f"train.stop_at={{at_least: {target:.4f}}}", "rollout.fleet_name=test-demo-rl-learns"])
    finally:
        close_debug_log()  # prepare() logs each stage to its run dir
    print("\n" + json.dumps({stage: {"seconds": round(seconds), "steps": summary.get("steps"),
                                     "greedy_by_step": {k: e["pass@1_greedy"]
                                                        for k, e in summary.get("evals", {}).items()},
                                     "eval": summary.get("eval"), "handoff": summary.get("handoff")}
                             for stage, (summary, seconds) in results.items()}, indent=1))
    return {"root": root, **results}


def test_the_handoff_rule_finds_a_start_that_leaves_rl_something_to_find(demo_rl):
    """Pretraining got past its transition, and among SFT's evaluated steps the rule found one where
    chat-format differences are rarely right greedily but sometimes right among 8 samples: the last such."""
    tail = _losses(demo_rl["root"] / "pretrain")[-100:]
    assert sum(tail) / len(tail) < PLATEAU_LOSS, f"pretraining stopped on its plateau: {tail[-5:]}"
    sft = demo_rl["sft"][0]
    rule, evals = sft["handoff"]["rule"], sft["evals"]
    assert sorted(evals) == list(range(10, 61, 10))
    met = _steps_meeting(rule, evals)
    assert met, f"no SFT step met the rule {rule}: {evals}"
    assert sft["handoff"]["step"] == max(met) and sft["handoff"]["eval"] == evals[max(met)]
    assert rule["max_greedy"] <= 0.5 - MARGIN


def test_a_strong_sft_start_hands_off_an_earlier_step_that_meets_the_rule(demo_rl):
    """SFT forced strong (a chat difference in every 10th row: greedy 0.22 / 0.56 / 0.78 at steps 10 / 40 /
    60 when measured, past the strongest start a machine gave the demo's own SFT, 0.65, by step 60) ends past
    the ceiling, so the rule hands off an earlier step, the last one still meeting it (tests/
    test_launch_handoff.py checks that hf_selected/ keeps that step's weights)."""
    sft = demo_rl["sft_strong"][0]
    rule, evals, handoff = sft["handoff"]["rule"], sft["evals"], sft["handoff"]
    last = max(evals)
    assert sorted(evals) == list(range(5, STRONG_STEPS + 1, 5)) and last == STRONG_STEPS
    assert evals[last]["pass@1_greedy"] > rule["max_greedy"], f"SFT was not forced past the ceiling: {evals}"
    met = _steps_meeting(rule, evals)
    assert met and handoff["step"] == max(met) < last, (handoff, evals)


def test_the_demo_rl_stage_raises_held_out_accuracy(demo_rl):
    before, (summary, _) = demo_rl["sft"][0]["handoff"]["eval"], demo_rl["rl"]
    after = summary["eval"]
    steps = load_config(CONFIGS / "demo_rl.yaml").train.steps
    assert summary["steps"] == steps or summary["finished_early"].startswith(f"finished at step {summary['steps']}")
    assert summary["steps"] % 10 == 0 and sorted(summary["evals"]) == list(range(10, summary["steps"] + 1, 10))
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
