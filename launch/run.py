"""A run's identity and preparation, shared by every entrypoint and every mode: its config (from the
command line), its directory, the model it starts from and its data files. A leaf of launch/: it
knows no mode's wiring.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.config import ENGINE_ENV
from launch.config import ConfigError, TandemConfig, config_help, load_config
from launch.tasks import HELDOUT_SPLIT, task_files
from models.tiny import make_tiny_model

COMPILATION_CACHE_DIR = Path.home() / ".cache" / "tandem" / "jax"
Mode = str  # "pretrain" | "sft" | "rl" | "eval"
MODES = ("pretrain", "sft", "rl")  # the training modes, in the order the demo runs them
DESCRIPTIONS = {
    "pretrain": "train the learner alone on all tokens of a text dataset (rows with `text`).",
    "sft": "train the learner alone on assistant tokens of chat data (rows with `messages`).",
    "rl": "GRPO, GSPO, GSPO-token, CISPO or decoupled PPO (algo.algorithm) with vLLM rollout actors and a "
          "reward pool on Ray (rows with `prompt`, `answer`). "
          "Running the same command again resumes from the last checkpoint and, if the previous "
          "driver died, re-attaches to its actors (rollout.fleet_name).",
    "eval": "score model.path (default run_dir/hf_final) on data.eval: greedy pass@1, pass rate, pass@k.",
}


@dataclass
class Run:
    """A prepared run: its directory, the model it starts from, and its data files."""

    config: TandemConfig
    run_dir: Path
    model_dir: Path
    train_data: str | None
    eval_data: str | None

    def write_summary(self, summary: dict[str, Any], name: str = "summary.json") -> None:
        (self.run_dir / name).write_text(json.dumps(summary, indent=2, sort_keys=True))


def parse_config(mode: Mode, argv: list[str] | None) -> TandemConfig:
    """The run config of `launch/<mode>.py CONFIG key=value ...`; --help lists every key."""
    parser = argparse.ArgumentParser(
        prog=f"launch/{mode}.py",
        description=textwrap.fill(f"tandem {mode}: " + DESCRIPTIONS[mode]),
        epilog=textwrap.fill("Overrides use dotted keys, e.g. train.steps=20 algo.algorithm=gspo "
                             "rollout.num_actors=2; launch/configs/ has examples. Every key, its default "
                             "and what it does (launch/config.py declares them):") + "\n\n" + config_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", nargs="?", help="YAML config (default: built-in defaults)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.config and "=" in args.config and not args.config.endswith((".yaml", ".yml")):
        overrides.insert(0, args.config)  # no config file given, only overrides
        args.config = None
    return load_config(args.config, overrides)


def prepare(config: TandemConfig, mode: Mode) -> Run:
    """Create run_dir, the data task's files (data.task) and the initial model when none is given."""
    for key in ("stop_at", "stop_at_plateau"):
        if getattr(config.train, key) is not None and mode != "rl":
            raise ConfigError(f"'train.{key}' ends rl runs early; {mode} runs train.steps (train.handoff picks a "
                              f"step)")
    run_dir = Path(config.run_dir).absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    log_debug_to(run_dir)
    files = task_files(config.data, run_dir, config.seed)
    train = config.data.train or (str(files[mode]) if mode in files else None)
    evaluation = config.data.eval or (str(files[HELDOUT_SPLIT]) if HELDOUT_SPLIT in files else None)
    if train is None and mode != "eval":
        raise ConfigError(f"'data.train' is required for {mode} (or a data.task)")
    if evaluation is None and mode == "eval":
        raise ConfigError("'data.eval' is required for eval (or a data.task)")
    if config.model.path:
        model_dir = Path(config.model.path)
        if not (model_dir / "config.json").exists():
            raise ConfigError(f"'model.path': {model_dir} is not an HF model dir (no config.json)")
    else:
        model_dir = run_dir / "init_model"
        if not (model_dir / "config.json").exists():
            make_tiny_model(model_dir, seed=config.seed, **config.model.tiny.model_dump())
    return Run(config, run_dir, model_dir, train, evaluation)


def log_debug_to(run_dir: Path) -> None:
    """tandem's DEBUG records (each refused group and why, each weight update) go to run_dir/debug.log;
    the console keeps INFO and above, where such events show as counters in the progress lines."""
    close_debug_log()  # the previous stage's file
    root = logging.getLogger()
    for handler in root.handlers:
        if type(handler) is logging.StreamHandler and handler.level == logging.NOTSET:  # the console
            handler.setLevel(logging.INFO)
    handler = logging.FileHandler(run_dir / "debug.log")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.tandem_debug_log = True
    root.addHandler(handler)
    for package in ("learner", "actors", "launch", "rewards", "tandem"):
        logging.getLogger(package).setLevel(logging.DEBUG)


def close_debug_log() -> None:
    """Stop writing run_dir/debug.log (log_debug_to's handler): a process that runs several stages, or
    whose run dir is removed, must not keep a handler that would reopen the file on the next record."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "tandem_debug_log", False)]:
        root.removeHandler(handler)
        handler.close()


def setup_process() -> None:
    """Logging, JAX's compilation cache, and the environment a vLLM engine in this process (the
    evaluator) needs."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    use_compilation_cache()
    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)
    if not sys.stderr.isatty():  # progress bars written to a log file are thousands of \r-joined updates
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def use_compilation_cache() -> None:
    """JAX's persistent compilation cache, in COMPILATION_CACHE_DIR unless JAX_COMPILATION_CACHE_DIR
    names another (JAX_ENABLE_COMPILATION_CACHE=false turns it off): a resumed, restarted or repeated
    run loads the steps it compiled before instead of compiling them again (MaxText's jax_cache_dir).
    Call it before the process compiles anything: JAX decides at its first compilation.

    Every program is cached, however quick its compile (JAX's default keeps only those over 1 s): a model's
    eager initialisation, the layer stacking and the optimizer's set-up are dozens of small programs that
    cost a TPU learner 4.3 s of its warm start uncached (26.9 → 22.6 s at 0.5B on a v5e; docs/benchmarks.md).
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS / _MIN_ENTRY_SIZE_BYTES in the environment still win."""
    import jax

    if not jax.config.jax_compilation_cache_dir:  # JAX reads JAX_COMPILATION_CACHE_DIR at import
        jax.config.update("jax_compilation_cache_dir", str(COMPILATION_CACHE_DIR))
    for option, every in (("jax_persistent_cache_min_compile_time_secs", 0.0),
                          ("jax_persistent_cache_min_entry_size_bytes", -1)):
        if option.upper() not in os.environ:
            jax.config.update(option, every)
