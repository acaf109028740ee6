"""Held-out evaluation of a model: greedy accuracy (pass@1), mean sampled reward and pass@k; and the
eval mode (launch/eval.py), which scores a run's model on its held-out split.

A completion "passes" when its reward exceeds tandem_wire.conventions.PASS_THRESHOLD.
The model runs in a vLLM `RolloutEngine` in this process; weights can be swapped in between
evaluations (`evaluate(tensors=...)`) so an RL run evaluates its newest weights without
writing a directory. Rewards are scored by a `Scorer` (the run's reward functions in an isolated
child process, as the reward workers run them). With an environment (`rewards.environment`) each
sample is a whole episode instead, played turn by turn as the actors play them (actors/trajectory.py),
the environment in an isolated child process; an episode passes when its summed reward does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm
from transformers import AutoTokenizer

from actors.engine import RolloutEngine, SamplingSpec
from actors.learner_client import Prompt
from actors.trajectory import ObservationRenderer, Trajectory
from launch.config import ConfigError
from launch.prompts import chat_prompt_rows
from launch.run import Run
from rewards.environment_host import IsolatedEnvironment
from rewards.isolation import IsolatedScorer
from rewards.spec import EnvironmentSpec
from rewards.types import ScoreResult
from tandem_wire.conventions import PASS_THRESHOLD


class Scorer(Protocol):
    """Scores one group (rewards.isolation.IsolatedScorer is one)."""

    def score(self, prompt: str, completions: Sequence[tuple[str, list[int]]], metadata: dict
              ) -> list[ScoreResult]: ...

    def close(self) -> None: ...



def _passes(results: Sequence[ScoreResult]) -> list[bool]:
    return [r.reward is not None and r.reward > PASS_THRESHOLD for r in results]


def _mean_reward(results: Sequence[ScoreResult]) -> float:
    rewards = [r.reward for r in results if r.reward is not None]
    return float(np.mean(rewards)) if rewards else 0.0


class Episodes:
    """Plays an environment's episodes on an engine, every trajectory's turns batched in the engine;
    the environment runs in an isolated child (`rewards.environment_host`)."""

    def __init__(self, host: IsolatedEnvironment, spec: EnvironmentSpec, renderer: ObservationRenderer) -> None:
        self.host, self.spec, self.renderer = host, spec, renderer

    def play(self, engine: RolloutEngine, examples: Sequence[Prompt], n: int, temperature: float,
             max_tokens: int) -> list[list[Trajectory]]:
        """`n` episodes per example (temperature 0: greedy), [example][episode], each ended."""
        trajectories = {f"eval/{i}/{j}": Trajectory(list(e.prompt_ids), [{"role": "user", "content": e.text}])
                        for i, e in enumerate(examples) for j in range(n)}
        for key, trajectory in trajectories.items():
            trajectory.unscorable_reason = self.host.reset(key, examples[int(key.split("/")[1])].metadata)
        playing = dict(trajectories)
        while playing:
            for key, trajectory in playing.items():
                budget = trajectory.turn_budget(max_tokens, self.spec, engine.max_model_len)
                engine.submit(key, trajectory.context, SamplingSpec(n=1, temperature=temperature, max_tokens=budget))
            turns: dict[str, object] = {}
            while engine.in_flight:
                turns.update((key, samples[0]) for key, samples in engine.poll())
            for key, sample in turns.items():
                trajectory = playing[key]
                trajectory.add_turn(sample, 0)
                answer = trajectory.unscorable_reason or self.host.step(key, sample.text)
                if not trajectory.apply_step(answer, self.renderer, self.spec, engine.max_model_len):
                    del playing[key]
                    if trajectory.left_open:
                        self.host.close(key)
        return [[trajectories[f"eval/{i}/{j}"] for j in range(n)] for i in range(len(examples))]

    def close(self) -> None:
        self.host.shutdown()


def _episode_results(trajectories: Sequence[Trajectory]) -> list[ScoreResult]:
    return [ScoreResult(None, t.unscorable_reason) if t.unscorable_reason else ScoreResult(t.reward)
            for t in trajectories]


class Evaluator:
    """Scores one model on a fixed list of examples; reuse it across evaluations of one run."""

    def __init__(self, hf_dir: Path, examples: Sequence[Prompt], scorer: Scorer, *, k: int, max_tokens: int,
                 temperature: float, max_model_len: int, kv_cache_gib: float, dtype: str, seed: int,
                 episodes: Episodes | None = None):
        """The keyword arguments come from the run config (launch.config.TandemConfig.eval_settings);
        `episodes`: play each sample as an episode of this environment (the scorer is then unused)."""
        if not examples:
            raise ValueError("evaluation needs at least one example")
        self.examples, self.scorer, self.episodes = list(examples), scorer, episodes
        self.k, self.max_tokens, self.temperature = k, max_tokens, temperature
        self.engine = RolloutEngine(hf_dir, max_model_len=max_model_len, kv_cache_gib=kv_cache_gib, seed=seed,
                                     dtype=dtype)

    def evaluate(self, tensors: Iterable[tuple[str, np.ndarray]] | None = None) -> dict[str, float]:
        """pass@1 (greedy), mean reward and pass@k at `temperature`, over all examples."""
        if tensors is not None:
            self.engine.load_weights(tensors)
        if self.episodes is not None:
            return self._evaluate_episodes()
        prompts = [e.prompt_ids for e in self.examples]
        greedy = self.engine.greedy(prompts, self.max_tokens)
        sampled = self.engine.generate(prompts, SamplingSpec(n=self.k, temperature=self.temperature,
                                                             max_tokens=self.max_tokens))
        greedy_pass, sample_reward, pass_at_k, sample_pass = [], [], [], []
        for example, best, group in zip(self.examples, greedy, sampled, strict=True):
            greedy_pass += _passes(self.scorer.score(example.text, [(best.text, best.token_ids)], example.metadata))
            results = self.scorer.score(example.text, [(s.text, s.token_ids) for s in group], example.metadata)
            passes = _passes(results)
            sample_reward.append(_mean_reward(results))
            sample_pass.append(float(np.mean(passes)))
            pass_at_k.append(float(any(passes)))
        return {
            "pass@1_greedy": float(np.mean(greedy_pass)),
            f"pass_rate_t{self.temperature:g}": float(np.mean(sample_pass)),
            f"reward_mean_t{self.temperature:g}": float(np.mean(sample_reward)),
            f"pass@{self.k}": float(np.mean(pass_at_k)),
            "examples": float(len(self.examples)),
        }

    def _evaluate_episodes(self) -> dict[str, float]:
        """The same figures over whole episodes, plus assistant turns per sampled episode."""
        play = self.episodes.play
        greedy = play(self.engine, self.examples, 1, 0.0, self.max_tokens)
        sampled = play(self.engine, self.examples, self.k, self.temperature, self.max_tokens)
        greedy_pass = [p for [episode] in greedy for p in _passes(_episode_results([episode]))]
        results = [_episode_results(group) for group in sampled]
        return {
            "pass@1_greedy": float(np.mean(greedy_pass)),
            f"pass_rate_t{self.temperature:g}": float(np.mean([np.mean(_passes(r)) for r in results])),
            f"reward_mean_t{self.temperature:g}": float(np.mean([_mean_reward(r) for r in results])),
            f"pass@{self.k}": float(np.mean([any(_passes(r)) for r in results])),
            "turns_mean": float(np.mean([len(t.turns) for group in sampled for t in group])),
            "examples": float(len(self.examples)),
        }

    def close(self) -> None:
        self.engine.shutdown()
        self.scorer.close()
        if self.episodes is not None:
            self.episodes.close()


def make_evaluator(run: Run, tokenizer, hf_dir: Path, *, data: str | None = None, prompt_format: str = "chat",
                   k: int | None = None) -> Evaluator | None:
    """An Evaluator over `data` (default: the run's held-out split), scoring with the run's rewards in
    an isolated process, pass@k with k = train.eval_k unless given; None when there is nothing to
    evaluate on."""
    config = run.config
    data = data or run.eval_data
    if data is None:
        return None
    tools = config.rewards.template_tools()
    rows = chat_prompt_rows(data, tokenizer, config.data, limit=config.data.eval_examples,
                            prompt_format=prompt_format, tools=tools)
    examples = [Prompt(r.prompt_ids, r.text, r.metadata) for r in rows]  # the learner's → the engine's
    settings = config.eval_settings()
    if k is not None:
        settings["k"] = k
    spec = config.rewards.spec()
    episodes = None if spec.environment is None else Episodes(IsolatedEnvironment(spec), spec.environment,
                                                              ObservationRenderer(tokenizer, tools))
    return Evaluator(hf_dir, examples, IsolatedScorer(spec), **settings, episodes=episodes)


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


def periodic_evals(run: Run, mode: str, evaluator: Evaluator | None,
                   weights: Callable[[], Iterator[tuple[str, np.ndarray]]], evals: dict[int, dict[str, float]],
                   on_scores: Callable[[int, dict[str, float]], None]) -> Callable[[int, dict[str, float]], None]:
    """A step callback: every train.eval_every steps, evaluate `weights()` (the learner's current HF-named
    tensors) into the step's metrics and `evals`, then call `on_scores(step, scores)` (a mode's export)."""
    every = run.config.train.eval_every

    def on_step(step: int, metrics: dict[str, float]) -> None:
        if evaluator is None or not every or step % every:
            return
        started = time.perf_counter()
        evals[step] = evaluator.evaluate(tensors=weights())
        metrics.update({f"eval/{k}": v for k, v in evals[step].items()})
        metrics["eval_s"] = time.perf_counter() - started  # the learner's pause (time-to-accuracy subtracts it)
        tqdm.write(f"[{mode}] eval at step {step}: {evals[step]}")
        on_scores(step, evals[step])

    return on_step


def run_eval_mode(run: Run) -> dict[str, Any]:
    """Score model.path (default: run_dir/hf_final) on the held-out split: pass@1 greedy, pass@k."""
    hf_dir = Path(run.config.model.path) if run.config.model.path else run.run_dir / "hf_final"
    if not (hf_dir / "config.json").exists():
        raise ConfigError(f"no HF model dir to evaluate at {hf_dir}; set model.path")
    scores = evaluate_dir(run, AutoTokenizer.from_pretrained(hf_dir), hf_dir)
    summary = {"mode": "eval", "model": str(hf_dir), "eval_data": run.eval_data, "eval": scores}
    run.write_summary(summary, "eval.json")
    return summary
