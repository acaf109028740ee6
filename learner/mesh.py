"""The learner's device mesh (fsdp × tp) and how batches are placed on it.

Parameters are sharded by the model's own fsdp/tp annotations (models.jax_model.load_model does
that given the mesh); batches are sharded over their leading (row) axis on "fsdp" and replicated
over "tp".

Multi-host (e.g. a TPU pod slice): run one learner process per host, all with the same config, and
call `init_distributed` first in each, before anything touches a device:

    # in the learner process on every host i of N, first thing:
    init_distributed("host0:8476", num_processes=N, process_id=i)   # Cloud TPU: init_distributed()
    mesh = make_learner_mesh(MeshConfig(tp=2))                         # spans all N hosts' devices

`jax.distributed.initialize` makes `jax.devices()` list every host's devices, so the mesh built by
`make_learner_mesh` spans all of them; every process builds the same global batch and each device
receives its own rows (`shard_rows`); orbax writes every process's shards of a checkpoint into the
same directory, which must be shared storage (e.g. a GCS bucket).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from learner.schema import MeshConfig  # the schema is light (no JAX); see learner.schema
from models.jax_model import make_mesh

BATCH_AXIS = "fsdp"


def init_distributed(coordinator: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None) -> None:
    """Join the multi-host JAX runtime: call once per process, before any device is used.

    Call it only for multi-host runs. With no arguments jax finds its peers where the platform
    tells it (Cloud TPU, SLURM); elsewhere pass all three.
    """
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)


def make_learner_mesh(config: MeshConfig) -> Mesh:
    """The ("fsdp", "tp") mesh over all (global) devices described by `config`."""
    devices = jax.devices()
    fsdp = config.fsdp if config.fsdp is not None else len(devices) // config.tp
    return make_mesh(fsdp=fsdp, tp=config.tp, devices=devices)


def row_sharding(mesh: Mesh) -> NamedSharding:
    """Leading axis split over "fsdp", everything else replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXIS))


def shard_rows(mesh: Mesh, arrays: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    """Place host arrays of the *global* batch on the mesh, rows split over "fsdp".

    Every process passes the same global batch (its data pipeline is deterministic from the data
    position) and each device receives only its own rows.
    """
    sharding = row_sharding(mesh)
    fsdp = mesh.shape[BATCH_AXIS]
    out = {}
    for name, array in arrays.items():
        array = np.asarray(array)
        if array.shape[0] % fsdp:
            raise ValueError(f"{name}: {array.shape[0]} rows do not split over fsdp={fsdp}")
        out[name] = jax.make_array_from_callback(array.shape, sharding, lambda index, a=array: a[index])
    return out
