"""Held-out evaluation of a model: greedy accuracy (pass@1), mean sampled reward and pass@k.

A completion "passes" when its reward is > 0.5 (the built-in answer rewards give 1 or 0).
The model runs in a vLLM `RolloutEngine` in this process; weights can be swapped in between
evaluations (`evaluate(tensors=...)`) so an RL run evaluates its newest weights without
writing a directory. Rewards are scored by a `Scorer` (the run's reward functions in an isolated
child process, as the reward workers run them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from actors.engine import RolloutEngine, SamplingSpec
from actors.learner_client import Prompt
from rewards.types import ScoreResult


class Scorer(Protocol):
    """Scores one group (rewards.isolation.IsolatedScorer is one)."""

    def score(self, prompt: str, completions: Sequence[tuple[str, list[int]]], metadata: dict
              ) -> list[ScoreResult]: ...

    def close(self) -> None: ...


PASS_THRESHOLD = 0.5


def _passes(results: Sequence[ScoreResult]) -> list[bool]:
    return [r.reward is not None and r.reward > PASS_THRESHOLD for r in results]


def _mean_reward(results: Sequence[ScoreResult]) -> float:
    rewards = [r.reward for r in results if r.reward is not None]
    return float(np.mean(rewards)) if rewards else 0.0


class Evaluator:
    """Scores one model on a fixed list of examples; reuse it across evaluations of one run."""

    def __init__(self, hf_dir: Path, examples: Sequence[Prompt], scorer: Scorer, *, k: int, max_tokens: int,
                 temperature: float, max_model_len: int, kv_cache_gib: float, dtype: str, seed: int):
        """The keyword arguments come from the run config (launch.config.TandemConfig.eval_settings)."""
        if not examples:
            raise ValueError("evaluation needs at least one example")
        self.examples, self.scorer = list(examples), scorer
        self.k, self.max_tokens, self.temperature = k, max_tokens, temperature
        self.engine = RolloutEngine(hf_dir, max_model_len=max_model_len, kv_cache_gib=kv_cache_gib, seed=seed,
                                     dtype=dtype)

    def evaluate(self, tensors: Iterable[tuple[str, np.ndarray]] | None = None) -> dict[str, float]:
        """pass@1 (greedy), mean reward and pass@k at `temperature`, over all examples."""
        if tensors is not None:
            self.engine.load_weights(tensors)
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

    def close(self) -> None:
        self.engine.shutdown()
        self.scorer.close()
