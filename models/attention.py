"""Causal self-attention over packed rows, the implementation chosen by config (`train.attention`).

    out = attention(q, k, v, segment_ids, impl="auto")  # q [B, T, Hq, D]; k, v [B, T, Hkv, D]; Hq % Hkv == 0

`segment_ids` [B, T] (int): 0 marks padding; each contiguous run of one non-zero id is one sequence (a
packed row holds several, a padded row one). Query t attends to key s iff s ≤ t and both lie in the
same run:
    out_t = Σ_{s ≤ t, run(s) = run(t)} softmax_s(q_t · k_s / √D) v_s,   out_t = 0 where segment_ids_t = 0
so padding positions output zeros and receive zero gradients, and an id reused later in a row starts a
new sequence (`canonical_segments` renumbers runs 1, 2, ... before any implementation sees them).

Implementations (MaxText's pattern: one attention op, the kernel picked by config):
  xla         the reference: tunix's own numerics (scores in the inputs' dtype, float32 softmax). It
              materialises B × Hq × T × T scores, so its memory grows with T².
  blockwise   FlashAttention-2 in plain JAX with a recomputing backward (models.blockwise_attention):
              forward and backward memory linear in T, on every backend.
  pallas_gpu  JAX's Pallas (Triton) flash attention for GPUs, `jax.experimental.pallas.ops.gpu.attention.
              mha`, causal with segment ids (K/V heads repeated for GQA).
  splash      JAX's Pallas splash attention for TPUs (what MaxText runs): causal mask, segment ids, GQA.
  auto        gpu → pallas_gpu, anything else → blockwise. On a TPU v5e (bf16, Qwen2.5-0.5B's heads, four
              packed sequences a row) blockwise took 1.55 / 5.6 ms forward + backward at 3,000 / 16,384
              tokens against splash's 1.77 / 25.9 ms with 512-token blocks (5.2 / 196 ms with the kernel's
              default blocks): blockwise skips the blocks between packed sequences, splash's causal mask
              does not (docs/benchmarks.md), so TPUs get blockwise too.
A kernel that refuses a shape while tracing falls back to blockwise with a warning. The Pallas kernels
take `interpret=True`, which runs them on CPU (slowly): the tests check them there.

Not offered: cuDNN's fused attention through `jax.nn.dot_product_attention(implementation="cudnn")`. It
masks by per-row lengths (one right-padded sequence per row), not segment ids, so it cannot keep the
sequences of a packed row apart.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import jax
import jax.numpy as jnp

from models.blockwise_attention import blockwise_attention

log = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "xla", "blockwise", "pallas_gpu", "splash")
BY_BACKEND = {"gpu": "pallas_gpu", "cuda": "pallas_gpu", "rocm": "pallas_gpu"}
K_MASK = -2.3819763e38  # tunix's masked score (a finite float32 minimum: masked rows stay finite)
KERNEL_BLOCK = 128  # the Pallas kernels' default block: sequences are padded to a multiple of it


def resolve(impl: str, backend: str | None = None) -> str:
    """The implementation `impl` names on `backend` (default: JAX's default backend)."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"attention must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if impl != "auto":
        return impl
    return BY_BACKEND.get(backend or jax.default_backend(), "blockwise")


def canonical_segments(segment_ids: jax.Array) -> jax.Array:
    """Runs of equal non-zero ids numbered 1, 2, ... along each row; padding stays 0."""
    seg = segment_ids.astype(jnp.int32)
    prev = jnp.pad(seg[:, :-1], ((0, 0), (1, 0)))
    starts = (seg != prev) & (seg > 0)
    return jnp.where(seg > 0, jnp.cumsum(starts, axis=1, dtype=jnp.int32), 0)


def segment_mask(segment_ids: jax.Array) -> jax.Array:
    """The dense [B, T, T] mask of `attention`: causal, same run, query not padding (for references)."""
    seg = canonical_segments(segment_ids)
    t = seg.shape[1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    return causal[None] & (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)


def xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """The reference, with tunix's numerics (its Attention.block): einsum scores × 1/√D in the inputs'
    dtype, masked with K_MASK, float32 softmax cast back, einsum with v."""
    b, t, heads, dim = q.shape
    kv_heads = k.shape[2]
    mask = segment_mask(segment_ids)
    scores = jnp.einsum("BTHGD,BSHD->BHGTS", q.reshape(b, t, kv_heads, heads // kv_heads, dim), k) * dim**-0.5
    scores = jnp.where(mask[:, None, None], scores, K_MASK)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(k.dtype)
    out = jnp.einsum("BHGTS,BSHD->BTHGD", probs, v).reshape(b, t, heads, dim)
    return jnp.where(mask.any(-1)[:, :, None, None], out, 0).astype(q.dtype)


def _pad_to_kernel_block(fn: Callable) -> Callable:
    """Runs a kernel on inputs padded along T to a multiple of KERNEL_BLOCK (padding: segment 0), then
    zeroes the padding queries' outputs (so their gradients are zero too)."""

    @functools.wraps(fn)
    def padded(q, k, v, seg, **kwargs):
        t = q.shape[1]
        extra = -(-t // KERNEL_BLOCK) * KERNEL_BLOCK - t
        pad = lambda x: jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2))  # noqa: E731
        out = fn(pad(q), pad(k), pad(v), pad(seg), **kwargs)[:, :t]
        return jnp.where((seg > 0)[:, :, None, None], out, 0).astype(q.dtype)

    return padded


@_pad_to_kernel_block
def pallas_gpu_attention(q, k, v, seg, *, interpret: bool = False) -> jax.Array:
    """Pallas's Triton flash attention (causal, segment ids); its kernel needs as many K/V heads as
    query heads, so GQA repeats them (memory linear in T)."""
    from jax.experimental.pallas.ops.gpu import attention as gpu_attention

    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    return gpu_attention.mha(q, k, v, seg, sm_scale=q.shape[-1] ** -0.5, causal=True, interpret=interpret)


@_pad_to_kernel_block
def splash_attention(q, k, v, seg, *, interpret: bool = False) -> jax.Array:
    """Pallas splash attention (TPU) with a causal mask and segment ids, one kernel call per row; it
    takes [heads, T, D] and unscaled scores, so q is scaled by 1/√D first (as MaxText does)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    heads, t = q.shape[2], q.shape[1]
    mask = masks.MultiHeadMask([masks.CausalMask((t, t)) for _ in range(heads)])
    # the kernel's default blocks (128) ran 7.6x slower at 16,384 tokens on a TPU v5e than 512-token ones
    block = next(b for b in (512, 256, KERNEL_BLOCK) if t % b == 0)
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    kernel = splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes, interpret=interpret)

    def row(q, k, v, s):
        return kernel(q, k, v, segment_ids=splash.SegmentIds(q=s, kv=s))

    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [B, T, H, D] <-> [B, H, T, D]
    scaled = q * jnp.asarray(q.shape[-1] ** -0.5, q.dtype)
    return heads_first(jax.vmap(row)(heads_first(scaled), heads_first(k), heads_first(v), seg))


KERNELS = {"pallas_gpu": pallas_gpu_attention, "splash": splash_attention}


def _sharded(kernel: Callable, q: jax.Array, k: jax.Array) -> Callable:
    """The kernel under shard_map over the ambient mesh: rows over "fsdp", K/V heads over "tp" where
    they divide (Pallas calls are opaque to XLA's partitioner, which would gather them whole)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return kernel
    P = jax.sharding.PartitionSpec
    rows = "fsdp" if "fsdp" in mesh.axis_names and q.shape[0] % mesh.shape["fsdp"] == 0 else None
    heads = "tp" if "tp" in mesh.axis_names and k.shape[2] % mesh.shape["tp"] == 0 else None
    spec = P(rows, None, heads, None)
    return jax.shard_map(kernel, mesh=mesh, in_specs=(spec, spec, spec, P(rows, None)), out_specs=spec,
                         check_vma=False)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, *, impl: str = "auto",
              block: int = 512, interpret: bool = False) -> jax.Array:
    """Causal attention within the segments of `segment_ids` (module docstring), by `impl`.

    block: the blockwise implementation's block of positions (its scores are B × Hq × block² float32).
    interpret: run a Pallas kernel in interpret mode (on CPU, for tests).
    """
    name = resolve(impl)
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of key/value heads ({k.shape[2]})")
    seg = canonical_segments(segment_ids)
    if name == "xla":
        return xla_attention(q, k, v, seg)
    if name in KERNELS:
        kernel = functools.partial(KERNELS[name], interpret=interpret)
        try:
            return _sharded(kernel, q, k)(q, k, v, seg)
        except (ValueError, NotImplementedError, TypeError) as error:
            _warn_fallback(name, q.shape, k.shape, str(error))
    return blockwise_attention(q, k, v, seg, block=block)


@functools.cache
def _warn_fallback(name: str, q_shape: tuple, k_shape: tuple, error: str) -> None:
    log.warning("attention %s refused q %s, k/v %s (%s): using blockwise", name, q_shape, k_shape,
                error.splitlines()[0] if error else "no reason given")


def describe(impl: str) -> str:
    """One line for the log: what `impl` resolves to here, and why."""
    backend = jax.default_backend()
    name = resolve(impl, backend)
    how = "by backend" if impl == "auto" else "as configured"
    return f"attention: {name} ({how}; train.attention={impl}, backend {backend})"

