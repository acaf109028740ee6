"""The decoder layers stored stacked, as MaxText stores them under `scan_layers`: one variable per weight
kind holding every layer along a leading axis, so a train step's optimizer update, casts and gradient run
once per weight kind, not once per layer, and compile time stays flat as layers grow.

The learner trains a copy of the model whose `layers` (a list of decoder layers, tunix's tree) is replaced
by a `StackedLayers` (`stacked_model`); the scanned forward (models.tunix_families) runs its layer body over
the stacked variables directly. Everything outside the learner's step sees tunix's per-layer tree:
`per_layer` turns a stacked state back into it (`layers.<i>.…`) for HF export, weight pushes and LoRA's
PEFT export. Sharding annotations gain a leading unsharded axis (the layer axis is never split).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

LAYERS, STACKED = "layers", "stacked"  # the model's attribute holding its layers; StackedLayers' variables


def _stack(values: Sequence[jax.Array]) -> jax.Array:
    """The layers' arrays of one weight kind along a new leading axis, laid out as they are plus that unsharded
    axis (the layout the train state puts them on, so it takes them without a copy)."""
    sharding = None if isinstance(values[0], jax.core.Tracer) else values[0].sharding  # traced: XLA lays it out
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return jnp.stack(values)
    stacked = sharding.update(spec=jax.sharding.PartitionSpec(None, *sharding.spec))
    return jax.jit(lambda *xs: jnp.stack(xs), out_shardings=stacked)(*values)


def _with_layer_axis(variable: nnx.Variable, value: jax.Array) -> nnx.Variable:
    """`variable` holding `value` (the layers stacked), its sharding names with a leading unsharded axis."""
    names = variable.get_metadata().get("out_sharding")
    return variable.replace(value, **({"out_sharding": (None, *names)} if names is not None else {}))


def _without_layer_axis(variable: nnx.Variable, value: jax.Array) -> nnx.Variable:
    """The inverse of _with_layer_axis for one layer's `value`."""
    names = variable.get_metadata().get("out_sharding")
    return variable.replace(value, **({"out_sharding": tuple(names[1:])} if names is not None else {}))


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


class StackedLayers(nnx.Module):
    """Decoder layers of one structure as one module: `layer_graphdef` (the first layer's graph definition;
    static) and `stacked` (every layer's variables stacked along a leading axis, their types kept: Param,
    LoRAParam, ...)."""

    def __init__(self, layers: Sequence[nnx.Module]):
        # The layers share one structure; their static attributes may differ (qwix tags each module with its
        # own path, and the first layer's tags match the same LoRA rule as every other's).
        graphdef, first = nnx.split(layers[0])
        states = [first, *(nnx.split(layer)[1] for layer in layers[1:])]
        self.layer_graphdef = graphdef
        self.stacked = nnx.data(jax.tree.map(
            lambda *variables: _with_layer_axis(variables[0], _stack([v.get_value() for v in variables])),
            *states, is_leaf=_is_variable))

    def graphdef_and_state(self) -> tuple[nnx.GraphDef, nnx.State]:
        """What a scan over the layers takes: one layer's graph definition and the stacked state."""
        return self.layer_graphdef, nnx.state(self)[STACKED]


def stacked_model(model: nnx.Module) -> nnx.Module:
    """A copy of `model` (sharing its non-layer arrays) whose layers are one StackedLayers. The layer weights
    move: `model`'s per-layer arrays are freed once stacked, so the device holds one copy of them, not two
    (≈2 GB at Qwen2.5-0.5B in float32). `model` keeps the per-layer tree for `per_layer` states to refill."""
    layer_arrays = jax.tree.leaves(nnx.state(getattr(model, LAYERS)))
    if any(x.is_deleted() for x in layer_arrays):
        raise ValueError("the model's layer weights were moved into a stacked model already (one Trainer per "
                         "loaded model): load it again")
    copy = nnx.clone(model)
    setattr(copy, LAYERS, StackedLayers(getattr(copy, LAYERS)))
    for x in layer_arrays:
        x.delete()
    return copy


def per_layer(state: nnx.State, num_layers: int) -> nnx.State:
    """A state of the stacked model (any part of it: params, adapters, a frozen base) in tunix's per-layer
    tree, `layers.<i>.…` (device slices of the stacked arrays: a copy, on the same devices)."""
    flat = []
    for path, variable in nnx.to_flat_state(state):
        if path[:2] != (LAYERS, STACKED):
            flat.append((path, variable))
            continue
        flat.extend(((LAYERS, i, *path[2:]), _without_layer_axis(variable, variable.get_value()[i]))
                    for i in range(num_layers))
    return nnx.from_flat_state(flat)
