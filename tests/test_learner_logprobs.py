"""Chunked per-token logprobs equal the unchunked log-softmax, tunix's, and use less memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_learner_tiny_model import EOS_ID, PAD_ID, make_batch, tiny_qwen2
from tunix.rl import common as tunix_common

from learner.algo.logprobs import per_token_logprobs
from models.jax_model import forward_logits


@pytest.fixture(scope="module")
def model():
    return tiny_qwen2(vocab_size=48)


@pytest.fixture(scope="module")
def batch():
    return make_batch(3, 6, 9, 48, seed=1)


def reference_logprobs(model, ids, mask, temperature):
    """Oracle: full [B, T, V] logits / T, log-softmax, gather the next token; entropy of the same."""
    logits = forward_logits(model, ids, mask)[:, :-1].astype(jnp.float32) / temperature
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logps = jnp.take_along_axis(logp_all, ids[:, 1:, None], axis=-1)[..., 0]
    return logps, -(jnp.exp(logp_all) * logp_all).sum(-1)


# 3 rows × 14 steps: chunks of one row-step, of two rows (a padded row), of all rows × 1 or 3 steps
# (padded steps), and one chunk for the whole batch.
@pytest.mark.parametrize(
    "chunk_tokens, temperature",
    [(None, 1.0), (None, 0.7), (1, 1.0), (2, 0.7), (4, 0.7), (5, 1.0), (10, 1.0), (64, 0.7)],
)
def test_chunked_equals_full_log_softmax(model, batch, chunk_tokens, temperature):
    ids, mask = jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask)
    logps, entropy = per_token_logprobs(model, ids, mask, temperature=temperature, chunk_tokens=chunk_tokens)
    ref_logps, ref_entropy = reference_logprobs(model, ids, mask, temperature)
    assert logps.shape == entropy.shape == (3, 14) and logps.dtype == jnp.float32
    np.testing.assert_allclose(logps, ref_logps, atol=1e-6, rtol=0)
    np.testing.assert_allclose(entropy, ref_entropy, atol=1e-6, rtol=0)
    # Sanity of the oracle itself: logprobs are ≤ 0 and entropy lies in [0, log V].
    assert float(logps.max()) <= 0.0 and 0.0 <= float(entropy.min()) and float(entropy.max()) <= np.log(48)


def test_chunked_gradient_equals_unchunked(model, batch):
    ids, mask = jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask)
    weights = jnp.asarray(np.random.default_rng(0).normal(size=(3, 14)), jnp.float32)

    def objective(m, chunk_tokens):
        logps, entropy = per_token_logprobs(m, ids, mask, chunk_tokens=chunk_tokens)
        return (weights * logps).sum() + 0.1 * entropy.sum()

    g_full = nnx.grad(lambda m: objective(m, None))(model)
    g_chunk = nnx.grad(lambda m: objective(m, 10))(model)
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_chunk), strict=True):
        # Same math, different fp32 summation order: allow a few ulps on O(1) entries.
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
    assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(g_full)) > 1e-3


def test_equals_tunix_compute_per_token_logps(model, batch):
    logps, _ = per_token_logprobs(
        model, jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask), chunk_tokens=4
    )
    completion = logps[:, batch.prompt_ids.shape[1] - 1:]
    tunix_logps = tunix_common.compute_per_token_logps(
        model, jnp.asarray(batch.prompt_ids), jnp.asarray(batch.completion_ids), pad_id=PAD_ID, eos_id=EOS_ID
    )
    m = batch.completion_mask.astype(bool)
    np.testing.assert_allclose(np.asarray(completion)[m], np.asarray(tunix_logps)[m], atol=1e-6, rtol=0)


def test_tied_embedding_model(batch):
    tied = tiny_qwen2(vocab_size=48, tied=True, seed=4)
    ids, mask = jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask)
    logps, _ = per_token_logprobs(tied, ids, mask, chunk_tokens=3)
    np.testing.assert_allclose(logps, reference_logprobs(tied, ids, mask, 1.0)[0], atol=1e-6, rtol=0)


def _temp_bytes(model, ids, mask, chunk_tokens):
    graphdef, state = nnx.split(model)

    def loss(state):
        logps, _ = per_token_logprobs(nnx.merge(graphdef, state), ids, mask, chunk_tokens=chunk_tokens)
        return logps.sum()

    compiled = jax.jit(jax.grad(loss)).lower(state).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_chunking_bounds_logits_memory_in_forward_and_backward():
    """Loss+grad temp memory: unchunked keeps several [B, T, V] fp32 arrays (logits, log-softmax and
    their cotangents); chunked keeps one [chunk_tokens, V] at a time, so it saves at least two of them."""
    vocab = 8192
    model = tiny_qwen2(vocab_size=vocab, seed=2)
    ids = jnp.ones((2, 257), jnp.int32)
    mask = jnp.ones_like(ids)
    full_logits_bytes = 2 * 256 * vocab * 4
    full = _temp_bytes(model, ids, mask, None)
    chunked = _temp_bytes(model, ids, mask, 64)
    assert full - chunked >= 2 * full_logits_bytes, (full, chunked)


@pytest.mark.slow  # compiles the step at several batch sizes to read XLA's memory plan
def test_logits_memory_is_bounded_by_tokens_not_by_the_batch():
    """Vocabulary 8k -> 16k on a 32 × 257 batch: the step's temp memory grows by a few [chunk_tokens, ΔV]
    fp32 copies (measured: about one at 64 tokens, four at 512), never by a [B, T, ΔV] copy (268 MB),
    which chunking over time steps alone would hold (each chunk spanned every row)."""
    ids = jnp.ones((32, 257), jnp.int32)
    full_copy = 32 * 256 * 8192 * 4
    for chunk in (64, 512):
        small, large = (_temp_bytes(tiny_qwen2(vocab_size=v, seed=2), ids, jnp.ones_like(ids), chunk)
                        for v in (8192, 16384))
        chunk_copy = chunk * 8192 * 4
        assert large - small <= 6 * chunk_copy < full_copy / 2, (chunk, large - small)


def test_bad_arguments(model, batch):
    ids, mask = jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask)
    with pytest.raises(ValueError, match="temperature"):
        per_token_logprobs(model, ids, mask, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        per_token_logprobs(model, ids, mask, chunk_tokens=0)


def test_float32_head_unembeds_the_bf16_bodys_hidden_states_in_float32(model, batch):
    """train.float32_logits: the bf16 model's hidden states, cast to float32, through the float32 head;
    oracle: float64 numpy log-softmax of those hidden states times the float32 head."""
    from models.jax_model import forward_hidden

    ids, mask = jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def run(params):
        bf16 = nnx.merge(graphdef, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params), rest)
        head = nnx.merge(graphdef, params, rest)
        with_head = per_token_logprobs(bf16, ids, mask, chunk_tokens=4, float32_head=head)[0]
        plain = per_token_logprobs(bf16, ids, mask, chunk_tokens=4)[0]
        return with_head, plain, forward_hidden(bf16, ids, mask)[:, :-1].astype(jnp.float32)

    logps, plain, hidden = run(params)
    logits = np.asarray(hidden, np.float64) @ np.asarray(model.lm_head.w[...], np.float64)
    top = logits.max(-1, keepdims=True)
    logp_all = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    want = np.take_along_axis(logp_all, np.asarray(ids)[:, 1:, None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.asarray(logps), want, atol=1e-5)
    # the bf16 head uses the bf16-rounded weights (these float32 weights are not bf16-exact)
    assert float(jnp.abs(plain - logps).max()) > 1e-4
