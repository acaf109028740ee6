"""Per-sequence reductions over packed rows: a row holds several sequences (segments), so "the sequence's
mean" is a segment reduction, not a row reduction.

A token's sequence is (row, segment id), segment 0 being padding. `Sequences.of(segment_ids)` numbers
them within the (micro-)batch as row · (T + 1) + segment, so every reduction is one `segment_sum` of
static size B · (T + 1): linear in the tokens, and local to the rows, so micro-batches (which split rows)
reduce exactly what the whole batch would.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Sequences(NamedTuple):
    """Which sequence each token of a [B, T] batch belongs to."""

    index: jax.Array  # [B, T] int32: row · (T + 1) + segment id (a row's padding is its own segment 0)
    count: int  # B · (T + 1), the number of slots (static)

    @classmethod
    def of(cls, segment_ids: jax.Array) -> Sequences:
        rows, length = segment_ids.shape
        row = jnp.arange(rows, dtype=jnp.int32)[:, None] * (length + 1)
        return cls(row + segment_ids.astype(jnp.int32), rows * (length + 1))

    def total(self, x: jax.Array) -> jax.Array:
        """Each sequence's sum of x, at each of its tokens: [B, T] -> [B, T]."""
        sums = jax.ops.segment_sum(x.reshape(-1), self.index.reshape(-1), num_segments=self.count)
        return sums[self.index]

    def mean(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        """Each sequence's mean of x over its masked tokens, at each of its tokens (0 where it has none)."""
        return self.total(x * mask) / jnp.maximum(self.total(mask), 1.0)

    def per_sequence(self, x: jax.Array) -> jax.Array:
        """Sum of x over each sequence, [count] (slot i: the sequence numbered i; unused slots 0)."""
        return jax.ops.segment_sum(x.reshape(-1), self.index.reshape(-1), num_segments=self.count)
