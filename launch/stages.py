"""What every entrypoint runs: parse the config, prepare the run, run its mode, print the summary.

    python launch/pretrain.py CONFIG [key=value ...]   learner alone, all tokens of `text` rows
    python launch/sft.py      CONFIG [key=value ...]   learner alone, completion-only loss on `messages`
    python launch/rl.py       CONFIG [key=value ...]   learner + actors + rewards (GRPO, GSPO, CISPO, ...)
    python launch/eval.py     CONFIG [key=value ...]   held-out pass@1 / pass@k of model.path

Each writes under `run_dir`: checkpoints/ (orbax; a rerun resumes), tb/ (TensorBoard + metrics.jsonl),
hf_final/ (an HF model dir vLLM and transformers load; rl also hf_best/, the best held-out greedy
pass@1 seen at an eval; with model.lora both hold the merged weights, and adapter_final/ the PEFT
adapter over model.path) and summary.json (final numbers). The modes live in launch/supervised_mode.py,
launch/rl_mode.py and launch/evaluation.py; launch/run.py prepares the run they share.
"""

from __future__ import annotations

import json
from typing import Any

from jax.experimental import multihost_utils

from launch.config import ConfigError, TandemConfig
from launch.evaluation import run_eval_mode
from launch.rl_mode import run_rl_mode
from launch.run import Mode, Run, parse_config, prepare, setup_process
from launch.supervised_mode import run_supervised_mode
from learner.mesh import init_distributed, is_leader

SHOWN = ("mode", "steps", "model", "hf_final", "adapter_final", "eval", "handoff", "accounting",
         "accounting_violations", "learner", "guard", "finished_early", "stale")


def run_mode(run: Run, mode: Mode) -> dict[str, Any]:
    """Run a prepared run in its mode (rl, eval, or supervised: sft, pretrain); returns its summary."""
    if mode == "rl":
        return run_rl_mode(run)
    if mode == "eval":
        return run_eval_mode(run)
    return run_supervised_mode(run, mode)


def prepare_everywhere(config: TandemConfig, mode: Mode) -> Run:
    """Join the learner's other processes (config.distributed), then prepare the run: process 0 first
    (it writes the generated data and initial model into run_dir, shared by all), then the others."""
    if mode == "eval" or not init_distributed(config.distributed):
        return prepare(config, mode)
    if config.train.eval_every:
        raise ConfigError("train.eval_every needs a single learner process for now (evaluate hf_final, or "
                          "run launch/eval.py on a checkpoint's export)")
    run = prepare(config, mode) if is_leader() else None
    multihost_utils.sync_global_devices("tandem: run prepared")
    return run or prepare(config, mode)


def main_for(mode: Mode, argv: list[str] | None = None) -> int:
    """Entry point body of launch/<mode>.py; returns the process exit code."""
    setup_process()
    try:  # some config errors show only once running (e.g. the fleet name is taken on the cluster)
        config = parse_config(mode, argv)
        summary = run_mode(prepare_everywhere(config, mode), mode)
    except ConfigError as error:
        print(f"error: {error}")
        return 2
    if not is_leader():  # process 0 reports the run
        return 0
    print(json.dumps({k: summary[k] for k in SHOWN if k in summary}, indent=2))
    return 0
