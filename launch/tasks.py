"""Data tasks: named generators of a run's data files (`data.task`), so that a synthetic task such as
the demo's arithmetic plugs into every entrypoint the same way instead of being a case in the wiring.

A task writes its splits under a directory and returns {split name: file}. `launch.run.prepare` then
takes the split named after the run's mode (pretrain, sft, rl) as data.train and "heldout" as
data.eval, unless the config names those files itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from launch import arithmetic, chains
from launch.config import DataConfig

# (data dir, the run's data config, the run's seed) -> {split: file}; a task reuses files already there
DataTask = Callable[[Path, DataConfig, int], dict[str, Path]]
HELDOUT_SPLIT = "heldout"


def arithmetic_task(data_dir: Path, data: DataConfig, seed: int) -> dict[str, Path]:
    """The demo's task (launch/arithmetic.py): n-digit sums and differences; generated once per dir."""
    return _existing(data_dir, arithmetic.SPLITS) or arithmetic.make_arithmetic_data(data_dir, seed=seed,
                                                                                     digits=data.digits)


def chain_task(data_dir: Path, data: DataConfig, seed: int) -> dict[str, Path]:
    """Countdown chains (launch/chains.py): answers of long-tailed lengths, for the RL loop's benchmarks."""
    return _existing(data_dir, chains.SPLITS) or chains.make_chain_data(data_dir, seed=seed, max_terms=data.max_terms)


def _existing(data_dir: Path, splits: tuple[str, ...]) -> dict[str, Path] | None:
    """The split files when all are already there (a task generates its data once per dir), else None."""
    files = {split: data_dir / f"{split}.jsonl" for split in splits}
    return files if all(f.exists() for f in files.values()) else None


# data.task -> its generator; "none" means the config names its data files itself.
DATA_TASKS: dict[str, DataTask] = {"arithmetic": arithmetic_task, "chain": chain_task}


def task_files(data: DataConfig, run_dir: Path, seed: int) -> dict[str, Path]:
    """The files of the run's data task under data.dir (default run_dir/data); {} for task=none."""
    if data.task == "none":
        return {}
    data_dir = Path(data.dir).absolute() if data.dir else run_dir / "data"
    return DATA_TASKS[data.task](data_dir, data, seed)
