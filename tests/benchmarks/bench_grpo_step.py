"""GRPO step (loss + gradient w.r.t. all parameters): tandem's chunked logprobs + policy_loss vs tunix.

Variants, on the same model (qwen2 family loaded from a random HF dir by models.jax_model), batch,
behaviour/reference logprobs and advantages:
  tunix            tunix.rl.grpo.grpo_learner.grpo_loss_fn (full [B, T, V] logits)
  tandem           learner.algo.logprobs.per_token_logprobs (chunk_tokens) + learner.algo.losses.rl_loss
  tandem-unchunked the same with chunk_tokens=None
Memory: each variant runs once in its own subprocess, so its peak is its own: XLA's compiled temp
buffer size (memory_analysis) and the measured peak, the device's peak_bytes_in_use where the
backend reports it (GPU/TPU), else the process's max RSS (CPU). Throughput: tokens/s (B × T tokens
through forward + backward), best of --repeats after a warm-up call, the variants timed round-robin
in one process so that load from other processes hits them alike. Then the ratios tandem / tunix.

    .venv/bin/python tests/benchmarks/bench_grpo_step.py   # defaults below; --help for the sizes

``measure(parse_args([...]))`` returns the numbers (launch/bench.py calls it).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VARIANTS = ("tunix", "tandem", "tandem-unchunked")
MODEL = dict(num_layers=3, hidden_size=128, intermediate_size=384, num_heads=4, num_kv_heads=2, head_dim=32)
LOSS = dict(epsilon_low=0.2, epsilon_high=0.28, beta=0.04)


def write_model(out_dir: Path, vocab: int, seq_len: int) -> Path:
    """A random qwen2 HF dir (config.json + model.safetensors) with a benchmark-sized vocabulary."""
    from safetensors.numpy import save_file

    from models.tiny import random_weights, tiny_hf_config

    config = tiny_hf_config(family="qwen2", vocab_size=vocab, tie_word_embeddings=False,
                            max_position_embeddings=seq_len, **MODEL)
    save_file(random_weights(config, seed=0), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config))
    return out_dir


def make_batch(args: argparse.Namespace):
    """Left-padded prompts, completions ending in EOS then PAD, noisy behaviour/ref logprobs, advantages."""
    import numpy as np

    from models.tokenizer import EOS_ID, PAD_ID

    rng = np.random.default_rng(0)
    b, p, c = args.batch, args.prompt, args.completion
    prompt_lens = rng.integers(p // 2, p + 1, b)
    completion_lens = rng.integers(c // 2, c + 1, b)
    prompt_mask = np.arange(p)[None] >= p - prompt_lens[:, None]
    completion_mask = np.arange(c)[None] < completion_lens[:, None]
    prompt_ids = np.where(prompt_mask, rng.integers(5, args.vocab, (b, p)), PAD_ID)
    completion_ids = rng.integers(5, args.vocab, (b, c))
    completion_ids[np.arange(b), completion_lens - 1] = EOS_ID
    completion_ids = np.where(completion_mask, completion_ids, PAD_ID)
    base = -np.log(args.vocab)
    return dict(
        prompt_ids=prompt_ids.astype(np.int32), prompt_mask=prompt_mask.astype(np.int32),
        completion_ids=completion_ids.astype(np.int32), completion_mask=completion_mask.astype(np.int32),
        old=(base + rng.normal(0, 0.2, (b, c))).astype(np.float32),
        ref=(base + rng.normal(0, 0.2, (b, c))).astype(np.float32),
        advantages=rng.normal(0, 1, b).astype(np.float32),
    )


def step_function(variant: str, model, data: dict, chunk_tokens: int):
    """(jitted value_and_grad over the parameter state, the state)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from models.tokenizer import EOS_ID, PAD_ID

    graphdef, state = nnx.split(model)
    d = {k: jnp.asarray(v) for k, v in data.items()}
    if variant == "tunix":
        from tunix.rl.grpo import dapo_learner, grpo_learner

        config = dapo_learner.DAPOConfig(loss_algo="grpo", loss_agg_mode="token-mean", beta=LOSS["beta"],
                                         epsilon=LOSS["epsilon_low"], epsilon_high=LOSS["epsilon_high"])
        example = grpo_learner.TrainExample(
            prompt_ids=d["prompt_ids"], prompt_mask=d["prompt_mask"], completion_ids=d["completion_ids"],
            completion_mask=d["completion_mask"], advantages=d["advantages"], ref_per_token_logps=d["ref"],
            old_per_token_logps=d["old"])

        def loss(s):
            return grpo_learner.grpo_loss_fn(nnx.merge(graphdef, s), example, config, PAD_ID, EOS_ID)[0]
    else:
        from learner.algo.logprobs import per_token_logprobs
        from learner.algo.losses import LossConfig, normalizer_for, rl_loss
        from learner.algo.policy_losses import resolve_policy_loss
        from learner.algo.sequences import Sequences

        config = LossConfig(algorithm="grpo", aggregation="token-mean", **LOSS)
        ids = jnp.concatenate([d["prompt_ids"], d["completion_ids"]], 1)
        mask = jnp.concatenate([d["prompt_mask"], d["completion_mask"]], 1)
        completion_mask = d["completion_mask"].astype(jnp.float32)
        start = d["prompt_ids"].shape[1] - 1
        chunk = None if variant == "tandem-unchunked" else chunk_tokens

        def loss(s):
            logps, _ = per_token_logprobs(nnx.merge(graphdef, s), ids, mask, chunk_tokens=chunk)
            seqs = Sequences.of(jnp.ones(completion_mask.shape, jnp.int32))
            return rl_loss(logps[:, start:], d["old"], d["advantages"], completion_mask, seqs, config,
                           normalizer_for(completion_mask, seqs), resolve_policy_loss(config), ref_logps=d["ref"])[0]

    return jax.jit(jax.value_and_grad(loss)), state


def build_steps(args: argparse.Namespace, variants: tuple[str, ...]) -> dict:
    """{variant: (jitted step, state)} on one freshly loaded model and batch."""
    from models.jax_model import load_model

    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_model(write_model(Path(tmp), args.vocab, args.prompt + args.completion))
    data = make_batch(args)
    return {v: step_function(v, loaded.model, data, args.chunk_tokens) for v in variants}


def measure_memory(args: argparse.Namespace) -> None:
    """Child process: compile and run one variant once; print its memory as one JSON line."""
    import jax

    step, state = build_steps(args, (args.variant,))[args.variant]
    temp = step.lower(state).compile().memory_analysis().temp_size_in_bytes
    loss, grads = step(state)
    jax.block_until_ready(grads)
    stats = jax.devices()[0].memory_stats() or {}
    print(json.dumps({
        "loss": float(loss), "temp_mb": temp / 2**20,
        "device_peak_mb": stats["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in stats else None,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "device": jax.devices()[0].platform,
    }))


def measure_throughput(args: argparse.Namespace) -> dict[str, float]:
    """Best step time of each variant, timed round-robin in one process so load noise hits all alike."""
    import jax

    steps = build_steps(args, VARIANTS)
    for step, state in steps.values():
        jax.block_until_ready(step(state))  # compile + warm up
    best = dict.fromkeys(VARIANTS, float("inf"))
    for _ in range(args.repeats):
        for name, (step, state) in steps.items():
            start = time.perf_counter()
            jax.block_until_ready(step(state))
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--completion", type=int, default=224)
    parser.add_argument("--chunk-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # child process
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    """{variant: {tokens_per_s, step_s, temp_mb, peak_mb, loss}} plus the device and which peak was read."""
    sizes = ["--vocab", args.vocab, "--batch", args.batch, "--prompt", args.prompt,
             "--completion", args.completion, "--chunk-tokens", args.chunk_tokens, "--repeats", args.repeats]
    memory = {}
    for variant in VARIANTS:
        out = subprocess.run([sys.executable, __file__, *map(str, sizes), "--variant", variant],
                             check=True, capture_output=True, text=True).stdout
        memory[variant] = json.loads(out.strip().splitlines()[-1])
    step_s = measure_throughput(args)
    peak_key = "device_peak_mb" if memory["tunix"]["device_peak_mb"] is not None else "max_rss_mb"
    tokens = args.batch * (args.prompt + args.completion)
    variants = {name: {"tokens_per_s": tokens / step_s[name], "step_s": step_s[name], "temp_mb": m["temp_mb"],
                       "peak_mb": m[peak_key], "loss": m["loss"]} for name, m in memory.items()}
    return {"variants": variants, "device": memory["tunix"]["device"], "peak": peak_key, "tokens": tokens}


def main() -> None:
    args = parse_args()
    if args.variant:
        measure_memory(args)
        return

    params = (args.vocab * MODEL["hidden_size"] * 2
              + MODEL["num_layers"] * (4 * MODEL["hidden_size"] ** 2 + 3 * MODEL["hidden_size"]
                                       * MODEL["intermediate_size"]))
    print(f"GRPO step (loss+grad), qwen2 {MODEL['num_layers']}L d={MODEL['hidden_size']} V={args.vocab} "
          f"(~{params / 1e6:.1f}M params), batch {args.batch} x {args.prompt}+{args.completion} tokens, "
          f"chunk {args.chunk_tokens}, fp32")
    result = measure(args)
    variants = result["variants"]
    print(f"device: {result['device']}; peak = {result['peak']} (own process per variant); "
          f"time = best of {args.repeats}, round-robin")
    columns = ("tokens/s", "step s", "XLA temp MB", "peak MB", "loss")
    print(f"{'variant':18s}" + "".join(f"{c:>12s}" for c in columns))
    for name, m in variants.items():
        print(f"{name:18s}{m['tokens_per_s']:12.0f}{m['step_s']:12.3f}{m['temp_mb']:12.1f}"
              f"{m['peak_mb']:12.1f}{m['loss']:12.6f}")
    t = variants["tunix"]
    for name in ("tandem", "tandem-unchunked"):
        m = variants[name]
        print(f"{name} / tunix: throughput x{m['tokens_per_s'] / t['tokens_per_s']:.2f}, "
              f"XLA temp x{m['temp_mb'] / t['temp_mb']:.2f}, peak x{m['peak_mb'] / t['peak_mb']:.2f}, "
              f"|loss diff| {abs(m['loss'] - t['loss']):.1e}")


if __name__ == "__main__":
    main()
