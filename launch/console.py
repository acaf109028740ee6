"""What a run prints: a progress bar and a sparse line of the step's key metrics."""

from __future__ import annotations

import sys

from tqdm import tqdm

CONSOLE_KEYS = ("loss", "reward_mean", "pass_rate", "kl", "entropy", "clip_frac_high", "grad_norm", "update_norm",
                "learning_rate", "tokens_per_s", "staleness_mean", "weight_version", "groups_consumed",
                "groups_stale", "groups_duplicate", "groups_invalid", "completions_unscorable", "updates_skipped",
                "groups_zero_signal_dropped", "guard_jumps")
CONSOLE_LINES = 40  # a run prints about this many step lines (plus the first and the last step)


def console_line(mode: str, step: int, metrics: dict[str, float]) -> str:
    shown = [f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics]
    return f"[{mode}] step {step} " + " ".join(shown)


class Progress:
    """A tqdm bar plus a console line every total/CONSOLE_LINES steps (tqdm.write keeps the bar
    intact). Counters (stale, skipped, ...) are cumulative, so the sparse lines lose nothing; every
    step's values are in metrics.jsonl. A StepCallback; a context manager that closes the bar."""

    def __init__(self, mode: str, total: int, initial: int = 0):
        self.mode, self.total = mode, total
        self.every = max(1, total // CONSOLE_LINES)
        self.bar = tqdm(total=total, initial=initial, desc=mode, dynamic_ncols=True, mininterval=1.0,
                        disable=not sys.stderr.isatty())

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        self.bar.update(step - self.bar.n)
        if step == 1 or step % self.every == 0 or step == self.total:
            tqdm.write(console_line(self.mode, step, metrics))

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()
