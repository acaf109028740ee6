"""RL wiring: the learner (trainer, prompt source, gRPC service, RL loop) in this process, rollout
actors and reward workers on Ray, a fleet supervisor, the metrics writer and the held-out evaluator.

One ExitStack owns everything the run starts, so all of it is stopped on every path (a finished run,
an exception, Ctrl-C), in reverse order of starting: evaluator, supervisor, rollout side, service,
checkpointer, and the local Ray cluster if this run started it. The metrics writer (and the experiment
trackers behind it) outlives them: it hands the trackers the final evaluation and curves.png last.

The actors and reward workers are detached (launch/rollout_side.py): if this driver dies without
running its exits (SIGKILL), a restarted one resumes from the last checkpoint and re-attaches to them.
"""

from __future__ import annotations

import logging
import socket
from contextlib import ExitStack, closing
from dataclasses import asdict
from typing import Any

import ray
from transformers import AutoTokenizer

from actors.stats import ActorStats
from launch import ray_cluster
from launch.console import Progress
from launch.evaluation import Evaluator, evaluate_dir, make_evaluator, periodic_evals
from launch.plots import plot_run
from launch.prompts import chat_prompt_rows
from launch.rollout_side import fleet_enrollment_key, open_rollout_side
from launch.run import Run
from launch.supervisor import FleetSupervisor
from launch.tracking import metrics_writer, report_end
from launch.trainer import build_trainer, export_final
from learner.checkpoint import Checkpointer
from learner.mesh import is_leader
from learner.metrics import MetricsWriter, StepCallback
from learner.rl_loop import RLLoop
from learner.schema import StopRule, TrainConfig, plateaued
from learner.service.accounting import balance_violations
from learner.service.prompt_source import PromptSource
from learner.service.server import LearnerService
from tandem_wire import enrollment

log = logging.getLogger("tandem")


def build_rl_learner(run: Run, tokenizer, writer: MetricsWriter | None = None,
                     enrollment_key: bytes | None = None) -> RLLoop:
    """The learner side of an RL run, not yet started: trainer, prompt source, gRPC service (admitting the
    actors enrolled under `enrollment_key`, tandem_wire/enrollment.py) and RL loop. Multi-host, only
    process 0 has the prompt source and the service."""
    config = run.config
    trainer = build_trainer(run, temperature=config.rollout.temperature)
    service = None
    if is_leader():
        rows = chat_prompt_rows(run.train_data, tokenizer, config.data, split=config.data.split,
                                tools=config.rewards.template_tools())
        service = LearnerService(PromptSource(rows, epochs=None, seed=config.seed), config.service_config(
            vocab_size=int(trainer.loaded.hf_config["vocab_size"])), enrollment_key=enrollment_key)
        # the longest prompt completed to max_tokens (an episode: to its token budget): what a batch holding
        # one truncated completion of it needs (RLLoop caps it at max_sequence_len and compiles the step
        # while the actors start)
        first_len = max(len(r.prompt_ids) for r in rows) + config.completion_tokens
    else:  # the same row buckets compile ahead on every process (they depend on the config alone)
        first_len = config.loop_config().max_sequence_len
    checkpointer = Checkpointer(run.run_dir / "checkpoints", max_to_keep=config.train.keep_checkpoints,
                                save_every=config.train.checkpoint_every)
    return RLLoop(trainer, service, checkpointer, writer, config.loop_config(), pad_id=tokenizer.pad_token_id,
                  compile_ahead_len=first_len)


def advertised_host(bind_host: str) -> str:
    """The address actors dial: the bind host, or this node's IP when binding every interface."""
    if bind_host not in ("0.0.0.0", "::", ""):
        return bind_host
    return ray.util.get_node_ip_address() if ray.is_initialized() else socket.gethostbyname(socket.gethostname())


def held_out_evals(run: Run, loop: RLLoop, evaluator: Evaluator | None,
                   evals: dict[int, dict[str, float]]) -> StepCallback:
    """Every train.eval_every steps: evaluate the newest weights into the step's metrics and `evals`,
    and export hf_best when greedy pass@1 is the best seen."""
    def export_best(step: int, scores: dict[str, float]) -> None:
        if scores["pass@1_greedy"] >= max(e["pass@1_greedy"] for e in evals.values()):
            loop.trainer.export_hf(run.run_dir / "hf_best", tokenizer_dir=run.model_dir)

    return periodic_evals(run, "rl", evaluator, loop.trainer.hf_tensors, evals, export_best)


def token_report(accounting: dict[str, int], actor_stats: dict[str, Any]) -> dict[str, Any]:
    """Where the completion tokens the actors sampled went: trained on, or wasted and why. `sampled`
    counts the actors answering at the end (a replaced actor's tokens are missing from it, so the
    fractions are upper bounds); asynchrony's own waste is `aborted` (groups in flight when a version
    loaded, sampled again) plus `stale`; `no_signal` is dynamic sampling's, by design."""
    stats = [s for s in actor_stats.values() if isinstance(s, ActorStats)]
    aborted = sum(s.tokens_aborted for s in stats)
    sampled = sum(s.tokens_generated for s in stats) + aborted
    wasted = {"aborted": aborted,
              "stale": accounting["tokens_stale_on_arrival"] + accounting["tokens_stale_at_dequeue"],
              "duplicate": accounting["tokens_duplicate"], "invalid": accounting["tokens_invalid"],
              "no_signal": accounting["tokens_no_signal"]}
    return {"sampled": sampled, "trained": accounting["tokens_trained"], "wasted": wasted,
            "async_waste_fraction": (aborted + wasted["stale"]) / sampled if sampled else 0.0}


def early_stop(train: TrainConfig, evals: dict[int, dict[str, float]]) -> str | None:
    """Why the run ends at its latest evaluation, or None: train.stop_at's target met, or train.stop_at_plateau
    evaluations in a row without a new best score (train.stop_at's metric, else greedy pass@1)."""
    latest = evals[max(evals)]
    if train.stop_at is not None and train.stop_at.met(latest, train.eval_k):
        return f"held-out {train.stop_at.metric} reached {train.stop_at.at_least} (train.stop_at)"
    rule = train.stop_at or StopRule(at_least=1.0)
    scores = [rule.score(evals[step], train.eval_k) for step in sorted(evals)]
    if train.stop_at_plateau is not None and plateaued(scores, train.stop_at_plateau):
        return (f"held-out {rule.metric} has not passed its best, {max(scores):.3f}, in {train.stop_at_plateau} "
                f"evaluations (train.stop_at_plateau)")
    return None


def run_rl_follower(run: Run, tokenizer) -> dict[str, Any]:
    """A learner process other than 0 (multi-host): the same steps, gathers and checkpoints as process 0,
    on the batches it sends; no service, actors, metrics or evaluation. Returns a one-line summary."""
    loop = build_rl_learner(run, tokenizer)
    with closing(loop.checkpointer):
        loop.start()
        loop.run()
    export_final(run, loop.trainer)
    return {"mode": "rl", "steps": loop.step, "weight_version": loop.version}


def run_rl_mode(run: Run) -> dict[str, Any]:
    """Train `train.steps` RL steps (fewer when train.stop_at is met) with the actors on Ray, export
    hf_final (and adapter_final with LoRA) and evaluate hf_final; returns the summary (accounting, evals,
    actor, reward and supervisor stats, guard events, where it finished early). Multi-host, process 0
    runs all of this and the other processes `run_rl_follower`."""
    tokenizer = AutoTokenizer.from_pretrained(run.model_dir)
    if not is_leader():
        return run_rl_follower(run, tokenizer)
    with metrics_writer(run) as writer:  # open until the trackers have the final evaluation and curves.png
        summary = run_rl_leader(run, tokenizer, writer)
        report_end(writer, summary["steps"], summary, plot_run(run.run_dir, title=f"rl: {run.run_dir.name}"))
    return summary


def run_rl_leader(run: Run, tokenizer, writer: MetricsWriter) -> dict[str, Any]:
    """run_rl_mode on process 0: train, export, evaluate hf_final, write summary.json; returns the summary."""
    config = run.config
    evals: dict[int, dict[str, float]] = {}
    with ExitStack() as stack:
        if ray_cluster.connect(config.ray_address):
            stack.callback(ray.shutdown)
        # a restarted driver's learner takes the key of the fleet it re-attaches to; else a fresh one
        enrollment_key = fleet_enrollment_key(run) or enrollment.new_key()
        loop = build_rl_learner(run, tokenizer, writer, enrollment_key)
        stack.callback(loop.checkpointer.close)
        bound = loop.start(f"{config.server.host}:{config.server.port}")
        stack.callback(loop.service.stop)
        address = f"{advertised_host(config.server.host)}:{bound.rsplit(':', 1)[1]}"
        log.info("learner serving on %s (version %d, step %d)", address, loop.version, loop.step)
        rollout_side = open_rollout_side(run, address, enrollment_key)
        stack.callback(rollout_side.close)
        supervisor = stack.enter_context(FleetSupervisor(
            loop.service, rollout_side.fleet, generate_timeout_s=config.rollout.generate_timeout_s,
            on_fatal=loop.abort))
        evaluator = make_evaluator(run, tokenizer, run.model_dir) if config.train.eval_every else None
        if evaluator is not None:
            stack.callback(evaluator.close)
        evaluate = held_out_evals(run, loop, evaluator, evals)
        progress = stack.enter_context(Progress("rl", config.train.steps, initial=loop.step))

        def on_step(step: int, metrics: dict[str, float]) -> None:
            evaluate(step, metrics)
            progress(step, metrics)
            if step in evals and (reason := early_stop(config.train, evals)):
                loop.finish_early(reason)

        accounting = loop.run(on_step=on_step)
        actor_stats = ray.get(rollout_side.fleet.stats.remote())
    exports = export_final(run, loop.trainer)
    hf_dir = exports["hf_final"]
    summary: dict[str, Any] = {
        "mode": "rl", "steps": loop.step, "weight_version": loop.version, **{k: str(v) for k, v in exports.items()},
        "accounting": accounting, "accounting_violations": balance_violations(accounting), "evals": evals,
        "reward_stats": asdict(rollout_side.reward_stats), "supervisor": supervisor.report.as_dict(),
        "actors": {actor_id: asdict(stats) for actor_id, stats in actor_stats.items()},
        "fleet": {"name": config.rollout.fleet_name, "reattached": rollout_side.attached},
        "learner": loop.counts, "guard": {"events": loop.guard_events, "stopped": loop.stopped_by_guard},
        "finished_early": loop.finished_early,
        "stale": loop.service.stale_report(),
        "tokens": token_report(accounting, actor_stats),
        "compiles": loop.compile_report(),
    }
    for violation in summary["accounting_violations"]:
        log.error("accounting does not balance: %s", violation)
    if (scores := evaluate_dir(run, tokenizer, hf_dir)) is not None:
        summary["eval"] = scores
    run.write_summary(summary)
    return summary

