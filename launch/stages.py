"""What every entrypoint shares: reading the config, preparing a run, and the three run modes.

    python launch/pretrain.py CONFIG [key=value ...]   learner alone, all tokens of `text` rows
    python launch/sft.py      CONFIG [key=value ...]   learner alone, completion-only loss on `messages`
    python launch/rl.py       CONFIG [key=value ...]   learner + rollout actors + reward pool (GRPO/GSPO)
    python launch/eval.py     CONFIG [key=value ...]   held-out pass@1 / pass@k of model.path

Each writes under `run_dir`: checkpoints/ (orbax; a rerun resumes), tb/ (TensorBoard + metrics.jsonl),
hf_final/ (an HF model dir vLLM and transformers load; rl also hf_best/, the best held-out greedy
pass@1 seen at an eval) and summary.json (final numbers).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from launch.arithmetic import SPLITS, make_arithmetic_data
from launch.config import ConfigError, TandemConfig, config_help, load_config
from launch.plots import plot_run
from launch.ray_cluster import WORKER_ENV
from learner.prompt_source import Prompt

Mode = str  # "pretrain" | "sft" | "rl"
MODES = ("pretrain", "sft", "rl")
CONSOLE_KEYS = ("loss", "reward_mean", "pass_rate", "kl", "entropy", "clip_frac_high", "grad_norm", "update_norm",
                "learning_rate", "tokens_per_s", "staleness_mean", "weight_version", "groups_consumed",
                "groups_stale", "groups_duplicate", "groups_invalid", "completions_unscorable", "updates_skipped",
                "groups_zero_signal_dropped", "guard_jumps")
CONSOLE_LINES = 40  # a run prints about this many step lines (plus the first and the last step)

log = logging.getLogger("tandem")


@dataclass
class Run:
    """A prepared run: its directory, the model it starts from, and its data files."""

    config: TandemConfig
    run_dir: Path
    model_dir: Path
    train_data: str | None
    eval_data: str | None


def parse_config(mode: Mode, argv: list[str] | None) -> TandemConfig:
    parser = argparse.ArgumentParser(
        prog=f"launch/{mode}.py",
        description=textwrap.fill(f"tandem {mode}: " + {
            "pretrain": "train the learner alone on all tokens of a text dataset (rows with `text`).",
            "sft": "train the learner alone on assistant tokens of chat data (rows with `messages`).",
            "rl": "GRPO/GSPO with vLLM rollout actors and a reward pool on Ray (rows with `prompt`, `answer`). "
                  "Running the same command again resumes from the last checkpoint and, if the previous "
                  "driver died, re-attaches to its actors (rollout.fleet_name).",
            "eval": "score model.path (default run_dir/hf_final) on data.eval: greedy pass@1, pass rate, pass@k.",
        }[mode]),
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


def log_debug_to(run_dir: Path) -> None:
    """tandem's DEBUG records (each refused group and why, each weight update) go to run_dir/debug.log;
    the console keeps INFO and above, where such events show as counters in the progress lines."""
    root = logging.getLogger()
    for handler in root.handlers[:]:
        if getattr(handler, "tandem_debug_log", False):  # the previous stage's file
            root.removeHandler(handler)
            handler.close()
        elif type(handler) is logging.StreamHandler and handler.level == logging.NOTSET:  # the console
            handler.setLevel(logging.INFO)
    handler = logging.FileHandler(run_dir / "debug.log")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.tandem_debug_log = True
    root.addHandler(handler)
    for package in ("learner", "actors", "launch", "rewards", "tandem"):
        logging.getLogger(package).setLevel(logging.DEBUG)


def prepare(config: TandemConfig, mode: Mode) -> Run:
    """Create run_dir, the demo data (task=arithmetic) and the initial model when none is given."""
    from models.tiny import make_tiny_model

    run_dir = Path(config.run_dir).absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    log_debug_to(run_dir)
    train, evaluation = config.data.train, config.data.eval
    if config.data.task == "arithmetic":
        data_dir = Path(config.data.dir).absolute() if config.data.dir else run_dir / "data"
        files = {split: data_dir / f"{split}.jsonl" for split in SPLITS}
        if not all(f.exists() for f in files.values()):
            files = make_arithmetic_data(data_dir, seed=config.seed, digits=config.data.digits)
        train = train or (str(files[mode]) if mode in files else None)
        evaluation = evaluation or str(files["heldout"])
    if train is None and mode != "eval":
        raise ConfigError(f"'data.train' is required for {mode} (or data.task=arithmetic)")
    if evaluation is None and mode == "eval":
        raise ConfigError("'data.eval' is required for eval (or data.task=arithmetic)")
    if config.model.path:
        model_dir = Path(config.model.path)
        if not (model_dir / "config.json").exists():
            raise ConfigError(f"'model.path': {model_dir} is not an HF model dir (no config.json)")
    else:
        model_dir = run_dir / "init_model"
        if not (model_dir / "config.json").exists():
            make_tiny_model(model_dir, seed=config.seed, **config.model.tiny.model_dump())
    return Run(config, run_dir, model_dir, train, evaluation)


def build_trainer(run: Run, *, temperature: float = 1.0):
    """The learner's model on its mesh, optimizer and loss, ready for steps."""
    from learner.mesh import make_learner_mesh
    from learner.train_step import Trainer
    from models.jax_model import load_model

    config = run.config
    mesh = make_learner_mesh(config.mesh)
    loaded = load_model(run.model_dir, mesh=mesh, dtype=config.model.dtype)
    return Trainer(loaded, mesh, config.optim, loss=config.algo, micro_batches=config.train.micro_batches,
                   temperature=temperature, chunk_size=config.train.logprob_chunk, seed=config.seed,
                   skip_no_signal=config.train.skip_no_signal)


def chat_prompt_rows(path: str, tokenizer, *, split: str = "train", limit: int | None = None,
                     prompt_format: str = "chat") -> list[Prompt]:
    """RL/eval rows {prompt, answer, ...} → Prompts (the learner's). prompt_ids is the chat template
    with the generation prompt ('chat'), or the text as a pretraining document begins ('raw': bos + text)."""
    from learner.data import load_rows, pretrain_documents

    rows = load_rows(path, split)
    if "prompt" not in rows.column_names:
        raise ConfigError(f"{path}: rl/eval data needs a 'prompt' column, has {rows.column_names}")
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    out = []
    for row in rows:
        if prompt_format == "raw":
            ids = pretrain_documents(tokenizer, [row["prompt"]])[0][:-1]  # without the end-of-document
        else:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}], tokenize=True,
                                                add_generation_prompt=True, return_dict=False)
        metadata = {k: str(v) for k, v in row.items() if k != "prompt"}
        out.append(Prompt(list(ids), row["prompt"], metadata))
    return out


def make_evaluator(run: Run, tokenizer, hf_dir: Path, *, data: str | None = None, prompt_format: str = "chat",
                   k: int | None = None):
    """An Evaluator over `data` (default: the run's held-out split), scoring with the run's rewards in
    an isolated process, pass@k with k = train.eval_k unless given; None when there is nothing to
    evaluate on."""
    from actors import learner_client
    from launch.evaluation import Evaluator
    from rewards.isolation import IsolatedScorer

    config = run.config
    data = data or run.eval_data
    if data is None:
        return None
    rows = chat_prompt_rows(data, tokenizer, limit=config.data.eval_examples, prompt_format=prompt_format)
    examples = [learner_client.Prompt(r.prompt_ids, r.text, r.metadata) for r in rows]
    settings = config.eval_settings()
    if k is not None:
        settings["k"] = k
    return Evaluator(hf_dir, examples, IsolatedScorer(config.rewards.spec()), **settings)


def evaluate_dir(run: Run, tokenizer, hf_dir: Path, *, data: str | None = None, prompt_format: str = "chat",
                 k: int | None = None) -> dict[str, float] | None:
    """One held-out evaluation of an HF dir (None when there is no eval data); see make_evaluator."""
    evaluator = make_evaluator(run, tokenizer, hf_dir, data=data, prompt_format=prompt_format, k=k)
    if evaluator is None:
        return None
    try:
        return evaluator.evaluate()
    finally:
        evaluator.close()


def console_line(mode: Mode, step: int, metrics: dict[str, float]) -> str:
    shown = [f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics]
    return f"[{mode}] step {step} " + " ".join(shown)


class Progress:
    """A tqdm bar plus a console line every total/CONSOLE_LINES steps (tqdm.write keeps the bar
    intact). Counters (stale, skipped, ...) are cumulative, so the sparse lines lose nothing; every
    step's values are in metrics.jsonl."""

    def __init__(self, mode: Mode, total: int, initial: int = 0):
        self.mode, self.total = mode, total
        self.every = max(1, total // CONSOLE_LINES)
        self.bar = tqdm(total=total, initial=initial, desc=mode, dynamic_ncols=True, mininterval=1.0,
                        disable=not sys.stderr.isatty())

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        self.bar.update(step - self.bar.n)
        if step == 1 or step % self.every == 0 or step == self.total:
            tqdm.write(console_line(self.mode, step, metrics))

    def close(self) -> None:
        self.bar.close()


def write_summary(run: Run, summary: dict[str, Any]) -> None:
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))


def run_supervised_mode(run: Run, mode: Mode) -> dict[str, Any]:
    """pretrain / sft: no actors, no reward workers; returns the summary."""
    from transformers import AutoTokenizer

    from learner.checkpoint import Checkpointer
    from learner.data import DataConfig, make_batches
    from learner.metrics import MetricsWriter
    from learner.supervised_loop import run_supervised

    config = run.config
    tokenizer = AutoTokenizer.from_pretrained(run.model_dir)
    trainer = build_trainer(run)
    batches = make_batches(DataConfig(kind=mode, source=run.train_data, split=config.data.split,
                                      seq_len=config.data.seq_len, batch_size=config.train.batch_size,
                                      seed=config.seed), tokenizer)
    checkpointer = Checkpointer(run.run_dir / "checkpoints", max_to_keep=config.train.keep_checkpoints,
                                save_every=config.train.checkpoint_every)
    progress = Progress(mode, config.train.steps)
    with MetricsWriter(run.run_dir / "tb") as writer:
        run_supervised(trainer, batches, checkpointer, writer, steps=config.train.steps, on_step=progress)
    progress.close()
    checkpointer.close()
    hf_dir = trainer.export_hf(run.run_dir / "hf_final", tokenizer_dir=run.model_dir)
    summary: dict[str, Any] = {"mode": mode, "steps": config.train.steps, "hf_final": str(hf_dir)}
    if (scores := evaluate_dir(run, tokenizer, hf_dir)) is not None:
        summary["eval"] = scores
    write_summary(run, summary)
    plot_run(run.run_dir, title=f"{mode}: {run.run_dir.name}")
    return summary


def advertised_host(bind_host: str) -> str:
    """The address actors dial: the bind host, or this node's IP when binding every interface."""
    if bind_host not in ("0.0.0.0", "::", ""):
        return bind_host
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else socket.gethostbyname(socket.gethostname())


def build_rl_learner(run: Run, tokenizer):
    """The learner side of an RL run, not yet started: trainer, prompt source, gRPC service and RL loop."""
    from learner.checkpoint import Checkpointer
    from learner.prompt_source import PromptSource
    from learner.rl_loop import RLLoop
    from learner.service import LearnerService

    config = run.config
    trainer = build_trainer(run, temperature=config.rollout.temperature)
    prompts = PromptSource(chat_prompt_rows(run.train_data, tokenizer, split=config.data.split),
                           epochs=None, seed=config.seed)
    service = LearnerService(prompts, config.service_config(vocab_size=int(trainer.loaded.hf_config["vocab_size"])))
    checkpointer = Checkpointer(run.run_dir / "checkpoints", max_to_keep=config.train.keep_checkpoints,
                                save_every=config.train.checkpoint_every)
    return RLLoop(trainer, service, checkpointer, None, config.loop_config(), pad_id=tokenizer.pad_token_id)


def run_rl_mode(run: Run) -> dict[str, Any]:
    """The full loop: learner service + RL loop here, rollout actors and reward workers on Ray.

    The actors and reward workers are detached (launch/rollout_side.py): if this driver dies, a
    restarted one resumes from the last checkpoint and re-attaches to them."""
    import ray
    from transformers import AutoTokenizer

    from launch import ray_cluster
    from launch.rollout_side import open_rollout_side
    from launch.supervisor import FleetSupervisor
    from learner.accounting import balance_violations
    from learner.metrics import MetricsWriter

    config = run.config
    tokenizer = AutoTokenizer.from_pretrained(run.model_dir)
    started_ray = ray_cluster.connect(config.ray_address)
    loop = build_rl_learner(run, tokenizer)
    trainer, service, checkpointer = loop.trainer, loop.service, loop.checkpointer
    bound = loop.start(f"{config.server.host}:{config.server.port}")
    address = f"{advertised_host(config.server.host)}:{bound.rsplit(':', 1)[1]}"
    log.info("learner serving on %s (version %d, step %d)", address, loop.version, loop.step)
    try:
        rollout_side = open_rollout_side(run, address)
    except BaseException:
        service.stop()
        raise
    supervisor = FleetSupervisor(service, rollout_side.fleet, generate_timeout_s=config.rollout.generate_timeout_s,
                                 on_fatal=loop.abort).start()
    evaluator = make_evaluator(run, tokenizer, run.model_dir) if config.train.eval_every else None
    progress = Progress("rl", config.train.steps, initial=loop.step)
    writer = MetricsWriter(run.run_dir / "tb")
    evals: dict[int, dict[str, float]] = {}

    def on_step(step: int, metrics: dict[str, float]) -> None:
        if evaluator is not None and step % config.train.eval_every == 0:
            evals[step] = evaluator.evaluate(tensors=trainer.hf_tensors())
            metrics.update({f"eval/{k}": v for k, v in evals[step].items()})
            tqdm.write(f"[rl] eval at step {step}: {evals[step]}")
            if evals[step]["pass@1_greedy"] >= max(e["pass@1_greedy"] for e in evals.values()):
                trainer.export_hf(run.run_dir / "hf_best", tokenizer_dir=run.model_dir)
        writer.write(step, metrics)
        progress(step, metrics)

    try:
        accounting = loop.run(on_step=on_step)
        actor_stats = ray.get(rollout_side.fleet.stats.remote())
    finally:
        supervision = supervisor.stop()
        progress.close()
        writer.close()
        reward_stats = rollout_side.close()
        service.stop()
        checkpointer.close()
        if evaluator is not None:
            evaluator.close()
    hf_dir = trainer.export_hf(run.run_dir / "hf_final", tokenizer_dir=run.model_dir)
    summary: dict[str, Any] = {"mode": "rl", "steps": loop.step, "weight_version": loop.version,
                               "hf_final": str(hf_dir), "accounting": accounting,
                               "accounting_violations": balance_violations(accounting), "evals": evals,
                               "reward_stats": asdict(reward_stats), "supervisor": supervision,
                               "actors": {actor_id: asdict(stats) for actor_id, stats in actor_stats.items()},
                               "fleet": {"name": config.rollout.fleet_name, "reattached": rollout_side.attached},
                               "learner": loop.counts, "guard": {"events": loop.guard_events,
                                                                 "stopped": loop.stopped_by_guard}}
    for violation in summary["accounting_violations"]:
        log.error("accounting does not balance: %s", violation)
    if (scores := evaluate_dir(run, tokenizer, hf_dir)) is not None:
        summary["eval"] = scores
    write_summary(run, summary)
    plot_run(run.run_dir, title=f"rl: {run.run_dir.name}")
    if started_ray:
        ray.shutdown()
    return summary


def run_eval_mode(run: Run) -> dict[str, Any]:
    """Score model.path (default: run_dir/hf_final) on the held-out split: pass@1 greedy, pass@k."""
    from transformers import AutoTokenizer

    hf_dir = Path(run.config.model.path) if run.config.model.path else run.run_dir / "hf_final"
    if not (hf_dir / "config.json").exists():
        raise ConfigError(f"no HF model dir to evaluate at {hf_dir}; set model.path")
    scores = evaluate_dir(run, AutoTokenizer.from_pretrained(hf_dir), hf_dir)
    summary = {"mode": "eval", "model": str(hf_dir), "eval_data": run.eval_data, "eval": scores}
    (run.run_dir / "eval.json").write_text(json.dumps(summary, indent=2))
    return summary


def setup_process() -> None:
    """Logging, and the environment a vLLM engine in this process (evaluation) needs."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for name, value in WORKER_ENV.items():
        os.environ.setdefault(name, value)
    if not sys.stderr.isatty():  # progress bars written to a log file are thousands of \r-joined updates
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def run_mode(run: Run, mode: Mode) -> dict[str, Any]:
    """Run a prepared run in its mode (rl, eval, or supervised: sft, pretrain); returns its summary."""
    runner = {"rl": run_rl_mode, "eval": run_eval_mode}.get(mode)
    return runner(run) if runner else run_supervised_mode(run, mode)


def main_for(mode: Mode, argv: list[str] | None = None) -> int:
    """Entry point body of launch/<mode>.py; returns the process exit code."""
    setup_process()
    try:  # some config errors show only once running (e.g. the fleet name is taken on the cluster)
        summary = run_mode(prepare(parse_config(mode, argv), mode), mode)
    except ConfigError as error:
        print(f"error: {error}")
        return 2
    shown = ("mode", "steps", "model", "hf_final", "eval", "accounting", "accounting_violations", "learner",
             "guard")
    print(json.dumps({k: summary[k] for k in shown if k in summary}, indent=2))
    return 0
