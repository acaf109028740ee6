"""train.handoff chooses the RL start on held-out numbers, whatever SFT's curve on this machine: a strong SFT
(greedy past the ceiling early) hands off an earlier checkpoint, and one that never meets the rule hands off
nothing (the demo then starts from the final export and says so).

A fast test of the wiring (periodic_evals -> handoff_exports -> handoff_summary) with scripted evaluations
and a stand-in trainer whose export writes the step it exported; tests/test_demo_rl_learns.py runs the rule
on the demo's real SFT."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from launch.config import load_config
from launch.evaluation import periodic_evals
from launch.supervised_mode import handoff_exports, handoff_summary

CONFIGS = Path(__file__).resolve().parents[1] / "launch" / "configs"


class ExportingTrainer:
    """Exports a dir holding the step it was exported at (what Trainer.export_hf writes is tested elsewhere)."""

    def __init__(self) -> None:
        self.step = 0

    def export_hf(self, out_dir: Path, tokenizer_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "exported_at").write_text(str(self.step))


class ScriptedEvaluator:
    def __init__(self, curve: dict[int, tuple[float, float]]) -> None:
        self.curve, self.step = curve, 0

    def evaluate(self, tensors) -> dict[str, float]:
        greedy, pass_at_8 = self.curve[self.step]
        return {"pass@1_greedy": greedy, "pass@8": pass_at_8}


def _sft(tmp_path: Path, curve: dict[int, tuple[float, float]]) -> tuple[dict, ExportingTrainer]:
    """Run the demo SFT config's evaluations and handoff over `curve` (step -> greedy, pass@8)."""
    config = load_config(CONFIGS / "demo_sft.yaml", [f"run_dir={tmp_path}"])
    run = SimpleNamespace(config=config, run_dir=tmp_path, model_dir=tmp_path / "base")
    trainer, evaluator, evals = ExportingTrainer(), ScriptedEvaluator(curve), {}
    on_step = periodic_evals(run, "sft", evaluator, lambda: iter(()), evals, handoff_exports(run, trainer))
    for step in range(1, config.train.steps + 1):
        trainer.step = evaluator.step = step
        on_step(step, {})
    return handoff_summary(run, evals), trainer


# held-out (greedy, pass@8) every 10 steps of the demo's 60: measured SFT starts ranged 0.10-0.65 at step 60
WEAK = {10: (0.01, 0.03), 20: (0.03, 0.08), 30: (0.05, 0.12), 40: (0.08, 0.15), 50: (0.10, 0.17), 60: (0.11, 0.18)}
STRONG = {10: (0.02, 0.06), 20: (0.12, 0.31), 30: (0.27, 0.52), 40: (0.41, 0.70), 50: (0.55, 0.81), 60: (0.65, 0.86)}
TOO_STRONG_AT_ONCE = {step: (0.34 + step / 1000, 0.60) for step in range(10, 61, 10)}


@pytest.mark.parametrize("curve, chosen", [(WEAK, 60), (STRONG, 30), (TOO_STRONG_AT_ONCE, None)],
                         ids=["weak-start-takes-the-last-step", "strong-start-takes-an-earlier-step",
                              "never-met-hands-off-nothing"])
def test_the_handoff_takes_the_last_evaluated_step_meeting_the_rule(tmp_path, curve, chosen):
    summary, trainer = _sft(tmp_path, curve)
    assert summary["rule"] == {"max_greedy": 0.30, "min_pass_at_k": 0.10}  # the demo's rule
    assert summary["step"] == chosen
    if chosen is None:
        assert summary["hf_selected"] is None and not (tmp_path / "hf_selected").exists()
        return
    # the dir holds the chosen step's weights: later steps that broke the rule did not overwrite it
    assert summary["eval"] == {"pass@1_greedy": curve[chosen][0], "pass@8": curve[chosen][1]}
    assert (Path(summary["hf_selected"]) / "exported_at").read_text() == str(chosen)
    assert trainer.step == 60  # SFT ran on past the chosen step
