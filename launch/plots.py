"""Pictures of runs: each stage's curves.png (plot_run) and the demo's one-figure summary (plot_demo).

Both read what every stage already writes: `<run_dir>/tb/metrics.jsonl` (one JSON object per logged
step; non-finite values as strings such as "nan") and `<run_dir>/summary.json`. Figures are drawn on
matplotlib's Agg canvas directly, without pyplot: no display is needed and no global figure state is
kept, so plotting is safe at the end of a run in any process.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import matplotlib as mpl
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

Series = tuple[list[int], list[float]]  # (steps, values), sorted by step
XOf = Callable[[int], float | None]  # a step's position on an x axis (None: not placeable)

# Held-out accuracy keys, in plotting order, with their labels; other pass@k / pass_rate_t<T> keys follow.
ACCURACY = {"pass@1_greedy": "greedy pass@1", "pass_rate_t1": "T=1 pass rate", "pass@8": "pass@8",
            "raw_difference_greedy": "plain-text a-b greedy", "chat_sum_greedy": "chat a+b greedy"}
OTHER_ACCURACY = re.compile(r"pass@\d+(_greedy)?|pass_rate_t[\d.]+")
STYLE = {"font.size": 8, "axes.titlesize": 9, "legend.fontsize": 7, "figure.titlesize": 11}
SIZE, DPI = (12.0, 6.0), 100


def read_metrics(path: Path) -> dict[str, Series]:
    """Each key of a metrics.jsonl as (steps, values), sorted by step.

    A resumed run logs the steps after its last checkpoint again: the last record of a step wins,
    whole (not merged with the earlier one). Non-finite values ("nan"), non-numbers and lines that do
    not parse (a run killed mid-write) are dropped, so every value can be plotted."""
    records: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            records[int(record["step"])] = record
        except (ValueError, KeyError, TypeError):
            continue
    series: dict[str, Series] = {}
    for step in sorted(records):
        for key, value in records[step].items():
            if key != "step" and _finite(value):
                steps, values = series.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    return series


def wall_clock(metrics: Mapping[str, Series]) -> dict[int, float]:
    """step → seconds of the run, from the logged `wall_s` (empty when not logged).

    `wall_s` counts from the start of the process, so a resumed run's clock starts again near 0:
    where it goes back, the new segment is continued from where the previous one ended."""
    clock: dict[int, float] = {}
    offset = previous_raw = previous = 0.0
    for step, raw in zip(*metrics.get("wall_s", ([], [])), strict=True):
        if raw < previous_raw:
            offset = previous
        previous_raw, previous = raw, raw + offset
        clock[step] = previous
    return clock


def accuracy_names(keys: Iterable[str]) -> list[str]:
    """The held-out accuracy keys among `keys`, in plotting order (other keys, e.g. `examples`, dropped)."""
    names = {k for k in keys if _is_accuracy(k)}
    order = list(ACCURACY)
    return sorted(names, key=lambda k: (order.index(k) if k in order else len(order), k))


def run_figure(run_dir: Path, title: str | None = None) -> Figure:
    """The figure plot_run saves: one column per panel with data; steps on top, wall time below."""
    run_dir = Path(run_dir)
    jsonl = run_dir / "tb" / "metrics.jsonl"
    metrics = read_metrics(jsonl) if jsonl.exists() else {}
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    final = {k: float(v) for k, v in (summary.get("eval") or {}).items() if _is_accuracy(k) and _finite(v)}
    clock = wall_clock(metrics)
    last_step = max((steps[-1] for steps, _ in metrics.values()), default=None)
    skipped = [s for s, v in zip(*metrics.get("update_skipped", ([], [])), strict=True) if v == 1]
    held_out = accuracy_names({k.removeprefix("eval/") for k in metrics if k.startswith("eval/")} | set(final))

    panels: list[tuple[str, Callable[[Axes, XOf], None]]] = []
    if "loss" in metrics or skipped:
        panels.append(("loss", lambda ax, x_of: _loss_panel(ax, metrics, skipped, x_of)))
    if "reward_mean" in metrics or "pass_rate" in metrics:
        panels.append(("reward on training samples", lambda ax, x_of: _curves(
            ax, metrics, x_of, {"reward_mean": "reward mean", "pass_rate": "pass rate"})))
    if held_out:
        panels.append(("held-out accuracy", lambda ax, x_of: _held_out_panel(
            ax, metrics, held_out, final, x_of, None if last_step is None else x_of(last_step))))
    if "entropy" in metrics:
        panels.append(("entropy", lambda ax, x_of: _curves(ax, metrics, x_of, {"entropy": "entropy"})))
    if "grad_norm" in metrics or "update_norm" in metrics:
        panels.append(("gradient / update norm", lambda ax, x_of: _curves(
            ax, metrics, x_of, {"grad_norm": "grad norm (before clipping)", "update_norm": "update norm"},
            log=True)))

    with mpl.rc_context(STYLE):
        figure = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
        figure.suptitle(title or run_dir.name)
        rows: list[tuple[str, XOf]] = [("step", lambda s: s)] + ([("wall time (s)", clock.get)] if clock else [])
        if not panels:
            figure.add_subplot().text(0.5, 0.5, "no metrics logged", ha="center", va="center")
            return figure
        grid = figure.subplots(len(rows), len(panels), sharex="row", squeeze=False)
        for row, (xlabel, x_of) in enumerate(rows):
            for column, (name, draw) in enumerate(panels):
                ax = grid[row][column]
                draw(ax, x_of)
                ax.set_xlabel(xlabel)
                ax.set_ylabel(name)
                ax.grid(alpha=0.3)
                if row == 0:
                    ax.set_title(name)
                    if ax.get_legend_handles_labels()[0]:
                        ax.legend(loc="best")
    return figure


def plot_run(run_dir: Path, title: str | None = None) -> Path:
    """Write `run_dir/curves.png` (loss, training reward, held-out accuracy, entropy, gradient and
    update norms against step, and against wall time when `wall_s` is logged); returns its path."""
    return _save(run_figure(run_dir, title), Path(run_dir) / "curves.png")


def demo_figure(stage_dirs: Mapping[str, Path], results: Mapping[str, Mapping[str, Any]]) -> Figure:
    """The figure plot_demo saves: the stages' losses on one time axis (left), accuracy bars (right)."""
    with mpl.rc_context(STYLE):
        figure = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
        figure.suptitle("tandem demo: " + " → ".join(stage_dirs))
        timeline, bars = figure.subplots(1, 2, width_ratios=[3, 2])
        _timeline_panel(timeline, stage_dirs, results)
        _accuracy_bars(bars, results)
    return figure


def plot_demo(stage_dirs: Mapping[str, Path], results: Mapping[str, Mapping[str, Any]], out: Path) -> Path:
    """Write the demo's summary figure to `out`: left, each stage's training loss against cumulative
    wall time (stages side by side, named; held-out greedy pass@1 and training reward on a twin axis
    where logged), right, held-out accuracy after each stage (`results[stage]`) as grouped bars."""
    return _save(demo_figure(stage_dirs, results), Path(out))


def _save(figure: Figure, out: Path) -> Path:
    """Render `figure` with the Agg canvas to the PNG `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    with mpl.rc_context(STYLE):
        figure.savefig(out, dpi=DPI)
    return out


def _finite(value: object) -> bool:
    """A plottable number: int or float (not bool, not a "nan" string), finite."""
    return type(value) in (int, float) and math.isfinite(value)


def _is_accuracy(key: str) -> bool:
    return key in ACCURACY or OTHER_ACCURACY.fullmatch(key) is not None


def _curve(ax: Axes, series: Series, x_of: XOf, label: str, **style: Any) -> None:
    """Plot one series at its steps' x positions (markers when there are few points to see)."""
    points = [(x, v) for s, v in zip(*series, strict=True) if (x := x_of(s)) is not None]
    if points:
        xs, ys = zip(*points, strict=True)
        style.setdefault("marker", "o" if len(xs) < 30 else None)
        ax.plot(xs, ys, label=label, markersize=3, linewidth=1, **style)


def _curves(ax: Axes, metrics: Mapping[str, Series], x_of: XOf, labels: Mapping[str, str], *,
            log: bool = False) -> None:
    """The logged ones of `labels`' keys (key → legend label); on a log scale only positive values."""
    for key, label in labels.items():
        if key in metrics:
            steps, values = metrics[key]
            kept = [(s, v) for s, v in zip(steps, values, strict=True) if v > 0 or not log]
            _curve(ax, ([s for s, _ in kept], [v for _, v in kept]), x_of, label)
    if log:
        ax.set_yscale("log")


def _loss_panel(ax: Axes, metrics: Mapping[str, Series], skipped: list[int], x_of: XOf) -> None:
    """Loss, with a short red tick at the bottom for each step whose update was skipped."""
    if "loss" in metrics:
        _curve(ax, metrics["loss"], x_of, "loss")
    xs = [x for s in skipped if (x := x_of(s)) is not None]
    if xs:
        ax.vlines(xs, 0, 0.08, transform=ax.get_xaxis_transform(), colors="tab:red", linewidth=0.8,
                  alpha=0.7, label=f"update skipped ({len(xs)})")


def _held_out_panel(ax: Axes, metrics: Mapping[str, Series], names: list[str], final: Mapping[str, float],
                    x_of: XOf, final_x: float | None) -> None:
    """Evaluations during training (eval/<name>) as curves; the summary's final evaluation as stars
    at the last step."""
    for index, name in enumerate(names):
        color, label, key = f"C{index}", ACCURACY.get(name, name), f"eval/{name}"
        if key in metrics:
            _curve(ax, metrics[key], x_of, label, color=color, marker="o")
        if name in final and final_x is not None:
            ax.plot([final_x], [final[name]], marker="*", markersize=9, linestyle="none", color=color,
                    label=None if key in metrics else label)
    if final and final_x is not None:
        ax.plot([], [], marker="*", markersize=9, linestyle="none", color="0.4", label="after training")
    ax.set_ylim(-0.02, 1.02)


def _timeline_panel(ax: Axes, stage_dirs: Mapping[str, Path], results: Mapping[str, Mapping[str, Any]]) -> None:
    """Each stage's loss against minutes since the demo started, stages one after another; a stage
    lasts its `results[stage]["minutes"]` (else its last `wall_s`). A stage without `wall_s` has its
    steps spread evenly over its minutes, and the axis label says so."""
    twin: Axes | None = None
    start, spread = 0.0, False
    previous: Mapping[str, Any] | None = None  # the results of the stage before
    for index, (stage, run_dir) in enumerate(stage_dirs.items()):
        jsonl = Path(run_dir) / "tb" / "metrics.jsonl"
        metrics = read_metrics(jsonl) if jsonl.exists() else {}
        clock = wall_clock(metrics)
        minutes = results.get(stage, {}).get("minutes")
        duration = max(60.0 * minutes if minutes is not None else 0.0, max(clock.values(), default=0.0))
        last_step = max((steps[-1] for steps, _ in metrics.values()), default=0)
        if not clock and last_step > 0:
            spread = True
            clock = {s: duration * s / last_step for steps, _ in metrics.values() for s in steps}

        def at(step: int, start: float = start, clock: dict[int, float] = clock) -> float | None:
            return None if step not in clock else (start + clock[step]) / 60

        if "loss" in metrics:
            _curve(ax, metrics["loss"], at, f"{stage} loss", color=f"C{index}", marker=None)
        if "eval/pass@1_greedy" in metrics and previous is not None and _finite(previous.get("pass@1_greedy")):
            # the stage starts where the previous one ended: its step 0 is the previous stage's result
            steps, values = metrics["eval/pass@1_greedy"]
            metrics["eval/pass@1_greedy"] = ([0, *steps], [float(previous["pass@1_greedy"]), *values])
            clock.setdefault(0, 0.0)
        for key, label, style in (("reward_mean", "reward (training samples)", {"color": "0.6", "alpha": 0.6}),
                                  ("eval/pass@1_greedy", "held-out greedy pass@1", {"color": "k", "marker": "o"})):
            if key in metrics:
                twin = twin or ax.twinx()
                _curve(twin, metrics[key], at, f"{stage} {label}", **style)
        ax.axvspan(start / 60, (start + duration) / 60, color="0.5", alpha=0.12 if index % 2 else 0.04, linewidth=0)
        ax.axvline(start / 60, color="0.4", linestyle=":", linewidth=1)
        ax.annotate(stage, (start / 60, 0.98 - 0.05 * (index % 2)), xycoords=ax.get_xaxis_transform(),
                    xytext=(3, 0), textcoords="offset points", ha="left", va="top", fontsize=10,
                    fontweight="bold")  # staggered, so that a short stage's name does not hit the next one
        start += duration
        previous = results.get(stage)
    ax.set_xlabel("minutes since the demo started" + (" (steps spread evenly over a stage)" if spread else ""))
    ax.set_ylabel("training loss")
    ax.set_title("training loss along the demo")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if twin is not None:
        twin.set_ylim(-0.02, 1.02)
        twin.set_ylabel("held-out accuracy / training reward")
        more = twin.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    if handles:  # below the axes: the curves fill the panel
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)


def _accuracy_bars(ax: Axes, results: Mapping[str, Mapping[str, Any]]) -> None:
    """Grouped bars: one group per stage, one bar per held-out accuracy key it has, value on top."""
    stages = list(results)
    names = accuracy_names({k for r in results.values() for k, v in r.items() if _finite(v)})
    width = 0.8 / max(len(names), 1)
    for index, name in enumerate(names):
        at = [(i, float(results[s][name])) for i, s in enumerate(stages) if _finite(results[s].get(name))]
        xs = [i + (index - (len(names) - 1) / 2) * width for i, _ in at]
        bars = ax.bar(xs, [v for _, v in at], width, label=ACCURACY.get(name, name), color=f"C{index}")
        ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
    ax.set_xticks(range(len(stages)), stages)
    ax.set_ylim(0, 1.25)  # room above 1 for the legend
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_xlabel("after stage")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("held-out accuracy after each stage")
    ax.grid(axis="y", alpha=0.3)
    if names:
        ax.legend(loc="upper center", ncol=3)
