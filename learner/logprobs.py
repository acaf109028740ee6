"""Per-token log-probabilities and entropies without materialising the full [B, T, V] fp32 logits.

The vocabulary projection dominates memory at RL sequence lengths (B·T·V floats, e.g. 8·2048·152k
fp32 = 10 GB). We run the transformer once to its final hidden states, then unembed and
log-softmax over chunks of `chunk_size` time steps with `jax.lax.map`, each chunk under
`jax.checkpoint`: the forward pass keeps one chunk's logits alive at a time, and the backward pass
recomputes a chunk's logits instead of saving all of them as residuals (which a plain scan would do).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.jax_model import forward_hidden, unembed


def token_logprobs_and_entropy(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """log p(target) and entropy −Σ p log p of softmax(logits) over the last axis, in fp32."""
    logp_all = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    logps = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
    entropy = -(jnp.exp(logp_all) * logp_all).sum(-1)
    return logps, entropy


def logprobs_from_hidden(
    model,
    hidden: jax.Array,
    targets: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = 128,
) -> tuple[jax.Array, jax.Array]:
    """log p(targets) and entropy from final hidden states [B, T, D], both [B, T] fp32.

    Unembeds `chunk_size` time steps at a time (see the module docstring); logits are divided by
    `temperature` first. chunk_size=None computes all positions at once.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive or None, got {chunk_size}")

    def chunk(h: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = unembed(model, h).astype(jnp.float32) / temperature
        return token_logprobs_and_entropy(logits, t)

    batch, length, dim = hidden.shape
    if chunk_size is None or chunk_size >= length:
        return chunk(hidden, targets)

    num_chunks = -(-length // chunk_size)
    pad = num_chunks * chunk_size - length
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    # [num_chunks, B, chunk, ...]: lax.map iterates over the leading axis.
    h_chunks = hidden.reshape(batch, num_chunks, chunk_size, dim).swapaxes(0, 1)
    t_chunks = targets.reshape(batch, num_chunks, chunk_size).swapaxes(0, 1)
    logps, entropy = jax.lax.map(jax.checkpoint(lambda xs: chunk(*xs)), (h_chunks, t_chunks))

    def unchunk(x: jax.Array) -> jax.Array:
        return x.swapaxes(0, 1).reshape(batch, num_chunks * chunk_size)[:, :length]

    return unchunk(logps), unchunk(entropy)


def per_token_logprobs(
    model,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = 128,
) -> tuple[jax.Array, jax.Array]:
    """Log-probability of token t+1 given tokens ≤ t, and the entropy at t, both [B, T−1] fp32.

    Logits are divided by `temperature` before the log-softmax, so the values match vLLM's
    processed logprobs (log_softmax(logits / T)) that the actors sampled with. Entries at padding
    positions are meaningless; mask them. chunk_size=None computes all positions at once.
    """
    hidden = forward_hidden(model, input_ids, attention_mask)[:, :-1]  # [B, T-1, D]
    targets = input_ids[:, 1:]
    return logprobs_from_hidden(model, hidden, targets, temperature=temperature, chunk_size=chunk_size)
