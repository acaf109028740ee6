"""launch/plots.py: curves.png of a run and the demo's summary figure, from synthetic metrics.jsonl files
shaped like the stages' (pretrain, sft, rl with evals, skipped updates, a NaN, a resumed step)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from launch.plots import demo_figure, plot_demo, plot_run, read_metrics, run_figure, wall_clock

MAX_PNG_BYTES = 300_000


def write_run(run_dir: Path, records: list[dict], summary: dict | None = None, tail: str = "") -> Path:
    """A run dir as the stages leave it: tb/metrics.jsonl (non-finite values as strings) and summary.json."""
    (run_dir / "tb").mkdir(parents=True)
    lines = [json.dumps({k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in r.items()})
             for r in records]
    (run_dir / "tb" / "metrics.jsonl").write_text("\n".join(lines) + "\n" + tail)
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def supervised_records(steps: int, loss0: float, seconds_per_step: float) -> list[dict]:
    return [{"step": s, "loss": loss0 * math.exp(-s / (steps / 3)) + 0.3, "entropy": loss0 * 0.9 * math.exp(-s / steps),
             "grad_norm": 5.0 / math.sqrt(s), "update_norm": 0.01 / math.sqrt(s), "learning_rate": 1e-3,
             "wall_s": 3.0 + seconds_per_step * s} for s in range(1, steps + 1)]


def rl_records(steps: int = 60, eval_every: int = 20) -> list[dict]:
    """RL-like: reward rising, evals every `eval_every` steps, two skipped updates, a NaN loss, and a resume
    (the first process died after step 45; the second, its wall clock restarted, went on from step 41)."""
    rng = np.random.default_rng(0)
    records = []
    for s in range(1, steps + 1):
        reward = min(1.0, 0.1 + s / steps * 0.6 + rng.normal(0, 0.05))
        record = {"step": s, "loss": float(rng.normal(0, 0.02)), "reward_mean": reward, "pass_rate": reward,
                  "entropy": 1.5 - s / steps, "grad_norm": 0.5 + rng.random(), "update_norm": 1e-3 * (1 + rng.random()),
                  "kl": 0.001 * s, "wall_s": 10.0 + 2.0 * s}
        if s in (7, 8):
            record = {"step": s, "update_skipped": 1.0, "wall_s": 10.0 + 2.0 * s}
        if s == 30:
            record["loss"] = float("nan")
        if s % eval_every == 0:
            record.update({"eval/pass@1_greedy": s / steps * 0.3, "eval/pass_rate_t1": s / steps * 0.25,
                           "eval/pass@8": 0.4 + s / steps * 0.1, "eval/examples": 512.0, "eval/reward_mean_t1": 0.2})
        records.append(record)
    resumed = [{**r, "wall_s": r["wall_s"] - 85.0} for r in records[40:]]  # from step 40's checkpoint
    resumed[0]["loss"] = 0.5
    return records[:45] + resumed


def check_png(path: Path) -> None:
    assert path.exists() and path.stat().st_size < MAX_PNG_BYTES, path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(path).shape[:2] == (600, 1200)


def test_read_metrics_keeps_the_last_record_of_a_step_and_drops_non_finite(tmp_path):
    run = write_run(tmp_path / "run", [
        {"step": 1, "loss": 3.0, "wall_s": 1.0},
        {"step": 2, "loss": float("nan"), "grad_norm": 2.0, "wall_s": 2.0},
        {"step": 3, "loss": 2.0, "grad_norm": 1.0, "wall_s": 3.0},
        {"step": 2, "loss": 2.5, "wall_s": 0.5},  # resumed from step 1: step 2 logged again
        {"step": 3, "update_skipped": 1.0, "loss": float("inf"), "wall_s": 1.5},
        {"step": 4, "loss": 1.0, "note": "text", "flag": True, "wall_s": 2.5},
    ], tail='{"step": 5, "loss": 0.')  # killed mid-write
    metrics = read_metrics(run / "tb" / "metrics.jsonl")
    assert metrics == {
        "loss": ([1, 2, 4], [3.0, 2.5, 1.0]),
        "wall_s": ([1, 2, 3, 4], [1.0, 0.5, 1.5, 2.5]),
        "update_skipped": ([3], [1.0]),
    }
    # the clock restarted at step 2 (0.5 s into the resumed process): continued from step 1's 1.0 s
    assert wall_clock(metrics) == {1: 1.0, 2: 1.5, 3: 2.5, 4: 3.5}
    assert wall_clock({}) == {}


def test_rl_curves_show_what_was_logged(tmp_path):
    summary = {"mode": "rl", "eval": {"pass@1_greedy": 0.35, "pass_rate_t1": 0.3, "pass@8": 0.55, "examples": 512.0}}
    run = write_run(tmp_path / "rl", rl_records(), summary)
    figure = run_figure(run, title="rl")
    top = [ax for ax in figure.axes if ax.get_xlabel() == "step"]
    bottom = [ax for ax in figure.axes if ax.get_xlabel() == "wall time (s)"]
    assert [ax.get_title() for ax in top] == ["loss", "reward on training samples", "held-out accuracy", "entropy",
                                              "gradient / update norm"]
    assert len(bottom) == 5
    loss_steps, loss_values = top[0].lines[0].get_data()
    expected = read_metrics(run / "tb" / "metrics.jsonl")["loss"]
    assert list(loss_steps) == expected[0] and list(loss_values) == expected[1]
    assert 7 not in expected[0] and 30 not in expected[0] and expected[0].count(41) == 1
    assert loss_values[expected[0].index(41)] == 0.5  # the resumed run's record of step 41
    ticks = top[0].collections[0]
    assert sorted(float(seg[0][0]) for seg in ticks.get_segments()) == [7.0, 8.0]
    held_out = {line.get_label(): line.get_data() for line in top[2].lines}
    assert list(held_out["greedy pass@1"][0]) == [20, 40, 60]
    assert list(held_out["greedy pass@1"][1]) == pytest.approx([0.1, 0.2, 0.3])
    assert "examples" not in str(held_out) and top[3].get_yscale() == "linear" and top[4].get_yscale() == "log"
    finals = [line for line in top[2].lines if line.get_marker() == "*" and len(line.get_xdata())]
    assert sorted((float(f.get_xdata()[0]), float(f.get_ydata()[0])) for f in finals) == [
        (60.0, 0.3), (60.0, 0.35), (60.0, 0.55)]
    wall_x = bottom[0].lines[0].get_xdata()
    assert np.all(np.diff(wall_x) > 0)  # a resume does not send the wall-time axis back
    check_png(plot_run(run, title="rl"))


def test_supervised_curves(tmp_path):
    records = supervised_records(80, 3.9, 0.2)
    run = write_run(tmp_path / "pretrain", records, {"mode": "pretrain", "eval": {"pass@1_greedy": 0.1, "pass@8": 0.3}})
    titles = [ax.get_title() for ax in run_figure(run).axes if ax.get_title()]
    assert titles == ["loss", "held-out accuracy", "entropy", "gradient / update norm"]
    check_png(plot_run(run))


def test_curves_without_wall_time_summary_or_more_than_one_row(tmp_path):
    run = write_run(tmp_path / "one", [{"step": 1, "loss": 2.5, "grad_norm": 0.0, "entropy": float("nan")}])
    figure = run_figure(run)
    assert [(ax.get_title(), ax.get_xlabel()) for ax in figure.axes] == [  # no entropy; no wall-time row
        ("loss", "step"), ("gradient / update norm", "step")]
    assert figure.axes[0].lines[0].get_marker() == "o"  # a single point stays visible
    check_png(plot_run(run))
    empty = tmp_path / "empty"
    empty.mkdir()
    check_png(plot_run(empty))


def test_demo_figure(tmp_path):
    stage_dirs = {
        "pretrain": write_run(tmp_path / "pretrain", supervised_records(80, 3.9, 1.5)),
        "sft": write_run(tmp_path / "sft", [{k: v for k, v in r.items() if k != "wall_s"}
                                            for r in supervised_records(12, 1.2, 1.0)]),
        "rl": write_run(tmp_path / "rl", rl_records()),
    }
    results = {
        "pretrain": {"pass@1_greedy": 0.0, "pass_rate_t1": 0.0, "pass@8": 0.0, "raw_difference_greedy": 0.42,
                     "chat_sum_greedy": 0.0, "examples": 512.0, "minutes": 2.5},
        "sft": {"pass@1_greedy": 0.05, "pass_rate_t1": 0.03, "pass@8": 0.2, "raw_difference_greedy": 0.4,
                "chat_sum_greedy": 0.6, "minutes": 0.4},
        "rl": {"pass@1_greedy": 0.35, "pass_rate_t1": 0.3, "pass@8": 0.55, "minutes": 3.0},
    }
    figure = demo_figure(stage_dirs, results)
    timeline, twin, bars = figure.axes[0], figure.axes[2], figure.axes[1]
    assert [t.get_text() for t in timeline.texts] == ["pretrain", "sft", "rl"]
    loss = {line.get_label(): line.get_xdata() for line in timeline.lines}
    assert loss["pretrain loss"][-1] == pytest.approx((3.0 + 1.5 * 80) / 60)
    assert loss["sft loss"][-1] == pytest.approx(2.5 + 0.4)  # no wall_s: spread over its 0.4 minutes
    assert loss["rl loss"][0] == pytest.approx(2.9 + 12 / 60)
    assert {line.get_label() for line in twin.lines} == {"rl held-out greedy pass@1", "rl reward (training samples)"}
    held_out = next(line for line in twin.lines if line.get_label() == "rl held-out greedy pass@1")
    # RL's curve starts where SFT ended, at RL's start: SFT's result, then the evals every 20 steps
    assert list(held_out.get_ydata()) == pytest.approx([0.05, 0.1, 0.2, 0.3])
    assert held_out.get_xdata()[0] == pytest.approx(2.9)
    assert len(bars.containers) == 5  # 'examples' and 'minutes' are not accuracies
    assert [c.get_label() for c in bars.containers] == ["greedy pass@1", "T=1 pass rate", "pass@8",
                                                        "plain-text a-b greedy", "chat a+b greedy"]
    assert [p.get_height() for p in bars.containers[0].patches] == [0.0, 0.05, 0.35]
    assert [p.get_height() for p in bars.containers[3].patches] == [0.42, 0.4]  # rl has no such key
    out = plot_demo(stage_dirs, results, tmp_path / "demo" / "demo.png")
    check_png(out)
