"""Causal, segment-masked attention in plain JAX whose memory is linear in sequence length.

FlashAttention-2's algorithm (Dao, 2023) written with `lax` loops instead of a kernel, so it runs on
every backend (the CPU learner, and any shape a fused kernel refuses). Rows are cut into blocks of `b`
positions; for query block i and key block j the scores S = Q_i K_jᵀ / √D ([b, b] per head) are the
only quadratic object, and one exists at a time.

Forward, per query block, over its key blocks with a running max m, normaliser l and output O:
    m' = max(m, rowmax S),  l' = e^(m − m') l + rowsum e^(S − m'),  O' = e^(m − m') O + e^(S − m') V_j
    out = O / l,  lse = m + log l
Backward (a custom VJP: nothing of the forward's loops is differentiated), per key block j over the
query blocks that see it, recomputing P = e^(S − lse) from the saved lse:
    dV_j += Pᵀ dO_i,  dP = dO_i V_jᵀ,  dS = P ∘ (dP − δ_i) / √D  with δ = rowsum(dO ∘ out),
    dK_j += dSᵀ Q_i,  dQ_i += dS K_j
Saved between the passes: q, k, v, out and lse, all linear in T.

Segments: `segment_ids` [B, T] hold canonical run ids (models.attention.canonical_segments: 0 for
padding, then 1, 2, ... increasing along the row). Query t sees key s iff s ≤ t and both share a
non-zero id. Skipped without computing: key blocks above the causal diagonal, and key blocks that end
before the earliest run start of the query block (over the batch's rows), i.e. other, earlier
sequences of a packed row. Padding queries output 0, and padding positions get zero gradients.

Matmuls take the inputs' dtype with float32 accumulation; softmax statistics and the dQ/dK/dV
accumulators are float32 (what the fused kernels do).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32


def _pad_time(x: jax.Array, padded: int) -> jax.Array:
    return jnp.pad(x, [(0, 0), (0, padded - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def _block_bounds(seg: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """Per query block i, the first key block it needs (min over rows of its queries' run starts; the
    block count when it holds only padding); per key block j, the last query block that needs it."""
    batch, padded = seg.shape
    blocks = padded // block
    pos = jnp.arange(padded, dtype=jnp.int32)
    prev = jnp.pad(seg[:, :-1], ((0, 0), (1, 0)))
    run_start = lax.cummax(jnp.where(seg != prev, pos, 0), axis=1)  # first position of each run
    start = jnp.where(seg > 0, run_start, padded).reshape(batch, blocks, block)
    first_kv = start.min(axis=(0, 2)) // block  # [blocks]
    needs = first_kv[None, :] <= jnp.arange(blocks)[:, None]  # [kv block j, q block i]
    last_q = jnp.max(jnp.where(needs, jnp.arange(blocks)[None, :], -1), axis=1)
    return first_kv.astype(jnp.int32), last_q.astype(jnp.int32)


def _scores_and_mask(q_i, k_j, seg_i, seg_j, i, j, block: int, scale: float):
    """S [B, Hkv, G, b, b] in float32 and its mask (same non-zero run, key not after query)."""
    s = jnp.einsum("bqhgd,bkhd->bhgqk", q_i, k_j, preferred_element_type=F32) * scale
    qpos = i * block + jnp.arange(block)
    kpos = j * block + jnp.arange(block)
    mask = (seg_i[:, :, None] == seg_j[:, None, :]) & (seg_i[:, :, None] > 0) & (kpos[None, :] <= qpos[:, None])
    return s, mask[:, None, None]


def _blocks(x: jax.Array, block: int) -> jax.Array:
    """[B, T, ...] -> [T/b, B, b, ...]: blocks along a leading axis, for dynamic indexing."""
    return jnp.moveaxis(x.reshape(x.shape[0], x.shape[1] // block, block, *x.shape[2:]), 1, 0)


def _unblocks(x: jax.Array) -> jax.Array:
    """[T/b, B, b, ...] -> [B, T, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _forward(q, k, v, seg, block: int):
    """out [B, Tp, Hkv, G, D] (q's dtype) and lse [B, Tp, Hkv, G] float32, on padded, grouped inputs."""
    scale = q.shape[-1] ** -0.5
    first_kv, _ = _block_bounds(seg, block)
    qb, kb, vb, sb = (_blocks(x, block) for x in (q, k, v, seg))

    def query_block(i):
        q_i, seg_i = qb[i], sb[i]

        def step(j, carry):
            m, norm, acc = carry
            s, mask = _scores_and_mask(q_i, kb[j], seg_i, sb[j], i, j, block, scale)
            s = jnp.where(mask, s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(-1))
            m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # rows with nothing seen yet
            p = jnp.exp(s - m_safe[..., None])
            correction = jnp.exp(m - m_safe)
            acc = acc * correction[..., None] + jnp.einsum("bhgqk,bkhd->bhgqd", p.astype(vb.dtype), vb[j],
                                                           preferred_element_type=F32)
            return m_new, norm * correction + p.sum(-1), acc

        batch, _, kv_heads, groups, dim = q_i.shape
        stats = (batch, kv_heads, groups, block)
        init = (jnp.full(stats, -jnp.inf, F32), jnp.zeros(stats, F32), jnp.zeros((*stats, dim), F32))
        m, norm, acc = lax.fori_loop(first_kv[i], i + 1, step, init)
        seen = norm > 0
        norm = jnp.where(seen, norm, 1.0)
        out = jnp.where(seen[..., None], acc / norm[..., None], 0.0)
        lse = jnp.where(seen, m + jnp.log(norm), 0.0)
        # [B, Hkv, G, b, ...] -> [B, b, Hkv, G, ...]
        return jnp.moveaxis(out, 3, 1).astype(q.dtype), jnp.moveaxis(lse, 3, 1)

    out, lse = lax.map(query_block, jnp.arange(qb.shape[0]))
    return _unblocks(out), _unblocks(lse)


def _backward(q, k, v, seg, out, lse, d_out, block: int):
    """dq, dk, dv (float32) on padded, grouped inputs; see the module docstring."""
    scale = q.shape[-1] ** -0.5
    _, last_q = _block_bounds(seg, block)
    delta = jnp.sum(d_out.astype(F32) * out.astype(F32), axis=-1)  # [B, Tp, Hkv, G]
    qb, kb, vb, sb, dob, lseb, deltab = (_blocks(x, block) for x in (q, k, v, seg, d_out, lse, delta))

    def key_block(dq, j):
        k_j, v_j, seg_j = kb[j], vb[j], sb[j]

        def step(i, carry):
            dq, dk_j, dv_j = carry
            q_i, do_i = qb[i], dob[i]
            s, mask = _scores_and_mask(q_i, k_j, sb[i], seg_j, i, j, block, scale)
            lse_i = jnp.moveaxis(lseb[i], 1, 3)[..., None]  # [B, Hkv, G, b, 1]
            p = jnp.where(mask, jnp.exp(s - lse_i), 0.0)
            dv_j += jnp.einsum("bhgqk,bqhgd->bkhd", p.astype(do_i.dtype), do_i, preferred_element_type=F32)
            dp = jnp.einsum("bqhgd,bkhd->bhgqk", do_i, v_j, preferred_element_type=F32)
            ds = p * (dp - jnp.moveaxis(deltab[i], 1, 3)[..., None]) * scale
            dk_j += jnp.einsum("bhgqk,bqhgd->bkhd", ds.astype(q_i.dtype), q_i, preferred_element_type=F32)
            dq_i = jnp.einsum("bhgqk,bkhd->bqhgd", ds.astype(k_j.dtype), k_j, preferred_element_type=F32)
            return dq.at[i].add(dq_i), dk_j, dv_j

        zeros = jnp.zeros(k_j.shape, F32)
        dq, dk_j, dv_j = lax.fori_loop(j, last_q[j] + 1, step, (dq, zeros, zeros))
        return dq, (dk_j, dv_j)

    dq, (dk, dv) = lax.scan(key_block, jnp.zeros(qb.shape, F32), jnp.arange(kb.shape[0]))
    return _unblocks(dq), _unblocks(dk), _unblocks(dv)


def _grouped(q, k, v, seg, block: int):
    """Pad T to a multiple of the block and split q's heads [Hq] into [Hkv, G]."""
    batch, length, heads, dim = q.shape
    padded = -(-length // block) * block
    q, k, v, seg = (_pad_time(x, padded) for x in (q, k, v, seg))
    return q.reshape(batch, padded, k.shape[2], heads // k.shape[2], dim), k, v, seg


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, seg, block):
    return _attention_fwd(q, k, v, seg, block)[0]


def _attention_fwd(q, k, v, seg, block):
    batch, length, heads, dim = q.shape
    qg, kp, vp, sp = _grouped(q, k, v, seg, block)
    out, lse = _forward(qg, kp, vp, sp, block)
    result = out.reshape(batch, -1, heads, dim)[:, :length]
    return result, (q, k, v, seg, out, lse)


def _attention_bwd(block, residuals, d_out):
    q, k, v, seg, out, lse = residuals
    batch, length, heads, dim = q.shape
    qg, kp, vp, sp = _grouped(q, k, v, seg, block)
    d_out = _pad_time(d_out, out.shape[1]).reshape(out.shape)
    dq, dk, dv = _backward(qg, kp, vp, sp, out, lse, d_out, block)
    return (dq.reshape(batch, -1, heads, dim)[:, :length].astype(q.dtype), dk[:, :length].astype(k.dtype),
            dv[:, :length].astype(v.dtype), None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, *,
                        block: int = 512) -> jax.Array:
    """Attention [B, T, Hq, D] of q [B, T, Hq, D] over k, v [B, T, Hkv, D] (Hq a multiple of Hkv), causal
    within the canonical runs of `segment_ids` [B, T]; blocks of min(block, T) positions."""
    return _attention(q, k, v, segment_ids.astype(jnp.int32), min(block, q.shape[1]))
