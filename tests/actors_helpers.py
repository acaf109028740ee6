"""Shared by the actors tests: tiny HF model dirs, addition prompts and their exact_match reward pool,
`transformers` as the independent oracle, polling, a RolloutActor in this process.

vLLM's CPU attention needs head_dim >= 32, so the tiny model uses 2 heads x 32.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

if TYPE_CHECKING:
    from actors.rollout_actor import RolloutActor
    from learner.service.prompt_source import Prompt
    from rewards.pool import RewardPool

TINY_MODEL = dict(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1,
                  head_dim=32, max_position_embeddings=256)


def make_base_model(out_dir: Path, seed: int = 0) -> Path:
    """A tiny random Qwen2 HF dir (config, safetensors, tokenizer) from models.tiny."""
    from models.tiny import make_tiny_model

    return make_tiny_model(out_dir, family="qwen2", seed=seed, **TINY_MODEL)


def chat_prompt(text: str) -> list[int]:
    """Token ids of ``<bos><user>{text}<asst>`` for models.tokenizer's character vocabulary."""
    from models.tokenizer import ASST_ID, BOS_ID, DEFAULT_ALPHABET, SPECIAL_TOKENS, USER_ID

    char_id = {c: len(SPECIAL_TOKENS) + i for i, c in enumerate(DEFAULT_ALPHABET)}
    return [BOS_ID, USER_ID, *(char_id[c] for c in text), ASST_ID]


def addition_prompts(pairs: Iterable[tuple[int, int]]) -> list[Prompt]:
    """The learner's prompt "a+b" for each pair (a, b), as chat tokens, with its sum as the reference answer
    that the exact_match reward checks."""
    from learner.service.prompt_source import Prompt

    return [Prompt(chat_prompt(f"{a}+{b}"), f"{a}+{b}", {"answer": str(a + b)}) for a, b in pairs]


def exact_match_pool() -> RewardPool:
    """A reward pool of one worker scoring completions with the exact_match reward alone."""
    from rewards.pool import RewardPool, RewardSpec, WeightedReward

    return RewardPool(RewardSpec(functions=[WeightedReward(ref="exact_match")]), num_workers=1)


def load_tensors(hf_dir: Path) -> dict[str, np.ndarray]:
    """All tensors of an HF dir's safetensors files."""
    tensors: dict[str, np.ndarray] = {}
    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def random_weights(like: dict[str, np.ndarray], seed: int, std: float = 0.3) -> dict[str, np.ndarray]:
    """Same names/shapes/dtypes as ``like``; matrices N(0, std^2), vectors (norms, biases) 1 + N(0, 0.1^2).

    A large std makes the next-token distribution sharp, so greedy outputs are free of near-ties.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, arr in like.items():
        if arr.ndim > 1:
            new = rng.normal(0.0, std, arr.shape)
        else:
            new = (1.0 if "norm" in name else 0.0) + rng.normal(0.0, 0.1, arr.shape)
        out[name] = new.astype(arr.dtype)
    return out


def random_adapter(hf_dir: Path, lora, seed: int, std: float = 0.3) -> dict[str, np.ndarray]:
    """Float32 LoRA adapters (PEFT names and shapes, models.peft.adapter_shapes) for the model in `hf_dir`,
    A and B both N(0, std^2): B nonzero, so the adapter changes the model (unlike LoRA's initial B = 0)."""
    from models.peft import adapter_shapes

    rng = np.random.default_rng(seed)
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    return {name: rng.normal(0.0, std, shape).astype(np.float32)
            for name, shape in adapter_shapes(config, lora).items()}


def merged_weights(base: dict[str, np.ndarray], adapter: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    """The full weights an adapter stands for, merged by hand: W + scale · B A on every adapted layer."""
    merged = dict(base)
    for name, a in adapter.items():
        if name.endswith(".lora_A.weight"):
            module = name.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b = adapter[name.replace(".lora_A.", ".lora_B.")]
            weight = base[f"{module}.weight"]
            merged[f"{module}.weight"] = (weight.astype(np.float64) + scale * (b.astype(np.float64) @ a)).astype(
                weight.dtype)
    return merged


def write_weights_dir(base_dir: Path, out_dir: Path, tensors: dict[str, np.ndarray]) -> Path:
    """Copy of ``base_dir`` (config, tokenizer) with its weights replaced by ``tensors``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in Path(base_dir).iterdir():
        if path.is_file() and not path.name.startswith("model.safetensors"):
            shutil.copy(path, out_dir / path.name)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(out_dir / "model.safetensors"))
    return out_dir


def hf_model(hf_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()


@torch.no_grad()
def sampled_token_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> np.ndarray:
    """log_softmax(logits / T) of each completion token given everything before it."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(completion)[:, None])[:, 0].numpy()


@torch.no_grad()
def greedy_tokens(model, prompt: list[int], max_tokens: int, eos_token_id: int) -> list[int]:
    """Argmax decoding until EOS (included) or ``max_tokens``."""
    ids = list(prompt)
    out: list[int] = []
    for _ in range(max_tokens):
        nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        out.append(nxt)
        ids.append(nxt)
        if nxt == eos_token_id:
            break
    return out


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy (returned) or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@contextlib.contextmanager
def in_process_actor(config, service, pool) -> Iterator[RolloutActor]:
    """A RolloutActor ("actor-0") in this process, registered with `service` (started here) and scored
    by `pool`; on exit its client and engine, the service and the pool are shut down, in that order."""
    from actors.rollout_actor import RolloutActor

    actor = RolloutActor("actor-0", config, service.start(), pool.handles())
    try:
        actor.client.register(actor.capabilities(), actor.version)
        yield actor
    finally:
        actor.client.close()
        actor.engine.shutdown()
        service.stop()
        pool.shutdown()
