"""Per-token log-probabilities and entropies without materialising the full [B, T, V] fp32 logits.

The vocabulary projection dominates memory at real shapes (B·T·V floats, e.g. 64·256·152k fp32 =
10 GB per copy, and a backward pass holds several copies). We run the transformer once to its final
hidden states, then unembed and log-softmax over chunks of at most `chunk_tokens` tokens (rows ×
time steps) with `jax.lax.map`, each chunk under `jax.checkpoint`: the forward pass keeps one
chunk's logits alive at a time, and the backward pass recomputes a chunk's logits instead of saving
all of them as residuals (which a plain scan would do). Peak logits memory is therefore a few
copies of chunk_tokens × V fp32, whatever the batch's rows and length.

Chunks are blocks of rows × time steps. A block takes rows r, r + n, r + 2n, ... (interleaved, as
the train step's micro-batches do), so a batch sharded over its rows stays evenly sharded inside
every chunk.
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


def chunk_layout(rows: int, length: int, chunk_tokens: int) -> tuple[int, int]:
    """(rows, time steps) of one chunk of at most `chunk_tokens` tokens: all rows and as many time
    steps as fit, or, when the rows alone exceed the budget, one time step of an even share of rows."""
    if rows * length <= chunk_tokens:
        return rows, length
    if rows <= chunk_tokens:
        return rows, chunk_tokens // rows
    row_blocks = -(-rows // chunk_tokens)
    return -(-rows // row_blocks), 1


def logprobs_from_hidden(
    model,
    hidden: jax.Array,
    targets: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_tokens: int | None = 2048,
) -> tuple[jax.Array, jax.Array]:
    """log p(targets) and entropy from final hidden states [B, T, D], both [B, T] fp32.

    Unembeds at most `chunk_tokens` tokens at a time (see the module docstring); logits are divided
    by `temperature` first. chunk_tokens=None computes all positions at once.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_tokens is not None and chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive or None, got {chunk_tokens}")

    def chunk(h: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = unembed(model, h).astype(jnp.float32) / temperature
        return token_logprobs_and_entropy(logits, t)

    batch, length, dim = hidden.shape
    if chunk_tokens is None or batch * length <= chunk_tokens:
        return chunk(hidden, targets)

    rows, steps = chunk_layout(batch, length, chunk_tokens)
    row_blocks, time_blocks = -(-batch // rows), -(-length // steps)
    pad_rows, pad_steps = row_blocks * rows - batch, time_blocks * steps - length
    hidden = jnp.pad(hidden, ((0, pad_rows), (0, pad_steps), (0, 0)))
    targets = jnp.pad(targets, ((0, pad_rows), (0, pad_steps)))

    def to_chunks(x: jax.Array) -> jax.Array:
        # [rows·row_blocks, steps·time_blocks, ...] -> [row_blocks·time_blocks, rows, steps, ...];
        # row i of block j is padded row i·row_blocks + j (interleaved: rows stay spread over shards).
        x = x.reshape(rows, row_blocks, time_blocks, steps, *x.shape[2:])
        x = jnp.moveaxis(x, (1, 2), (0, 1))
        return x.reshape(row_blocks * time_blocks, rows, steps, *x.shape[4:])

    def from_chunks(x: jax.Array) -> jax.Array:
        x = x.reshape(row_blocks, time_blocks, rows, steps)
        x = jnp.moveaxis(x, (0, 1), (1, 2)).reshape(rows * row_blocks, time_blocks * steps)
        return x[:batch, :length]

    logps, entropy = jax.lax.map(jax.checkpoint(lambda xs: chunk(*xs)), (to_chunks(hidden), to_chunks(targets)))
    return from_chunks(logps), from_chunks(entropy)


def per_token_logprobs(
    model,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_tokens: int | None = 2048,
    float32_head=None,
) -> tuple[jax.Array, jax.Array]:
    """Log-probability of token t+1 given tokens ≤ t, and the entropy at t, both [B, T−1] fp32.

    Logits are divided by `temperature` before the log-softmax, so the values match vLLM's
    processed logprobs (log_softmax(logits / T)) that the actors sampled with. Entries at padding
    positions are meaningless; mask them. chunk_tokens=None computes all positions at once.
    float32_head: a float32 copy of the model whose `unembed` makes the logits from the hidden states
    cast to float32 (train.float32_logits); None: the model's own head, in its dtype.
    """
    hidden = forward_hidden(model, input_ids, attention_mask)[:, :-1]  # [B, T-1, D]
    head, hidden = head_and_hidden(model, hidden, float32_head)
    targets = input_ids[:, 1:]
    return logprobs_from_hidden(head, hidden, targets, temperature=temperature, chunk_tokens=chunk_tokens)


def head_and_hidden(model, hidden: jax.Array, float32_head) -> tuple:
    """(the module that unembeds, the hidden states it takes): `model` and `hidden` as they are, or the
    float32 head and the hidden states cast to float32."""
    if float32_head is None:
        return model, hidden
    return float32_head, hidden.astype(jnp.float32)
