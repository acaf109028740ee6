"""The learner's train state: one pytree for every mode (rl, sft, pretrain), checkpointed as a whole.

The model is split the Flax NNX way into a static graph definition (kept by the trainer) and its
parameters (an `nnx.State`, a pytree of arrays); steps `nnx.merge` them inside `jax.jit`. The
optimizer state is optax's, placed with the same shardings as the parameters it mirrors (taken
from the parameters' fsdp/tp annotations, so `tx.init` does not leave moments on one device).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class TrainState(NamedTuple):
    """Everything a step changes. `step` counts optimizer updates applied; `rng` is raw key data."""

    params: nnx.State
    opt_state: optax.OptState
    step: jax.Array  # int32 scalar
    rng: jax.Array  # uint32 key data (jax.random.key_data), reproducible across restarts


def init_train_state(params: nnx.State, tx: optax.GradientTransformation, *, mesh: jax.sharding.Mesh,
                     seed: int = 0) -> TrainState:
    """A fresh state: optimizer moments sharded like the parameters, step 0, rng from `seed`."""
    opt_shardings = nnx.get_named_sharding(jax.eval_shape(tx.init, params), mesh)
    opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return TrainState(
        params=params,
        opt_state=opt_state,
        step=jax.device_put(jnp.zeros((), jnp.int32), replicated),
        rng=jax.device_put(jax.random.key_data(jax.random.key(seed)), replicated),
    )


def abstract_like(tree: Any) -> Any:
    """Shape, dtype and sharding of every array in `tree` (a restore target for orbax)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)

