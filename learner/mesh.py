"""The learner's device mesh (fsdp × tp) and how batches are placed on it.

Parameters are sharded by the model's own fsdp/tp annotations (models.jax_model.load_model does
that given the mesh); batches are sharded over their leading (row) axis on "fsdp" and replicated
over "tp".

Multi-host (e.g. a TPU pod slice): run one learner process per host, all with the same config, and
call `init_distributed` first in each, before anything touches a device:

    # in the learner process on every host i of N, first thing:
    init_distributed(DistributedConfig(coordinator_address="host0:8476", num_processes=N, process_id=i))
    # (or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID; Cloud TPU: auto=True)
    mesh = make_learner_mesh(MeshConfig(tp=2))                         # spans all N hosts' devices

`jax.distributed.initialize` makes `jax.devices()` list every host's devices, so the mesh built by
`make_learner_mesh` spans all of them. Every process holds the same global batch (sft/pretrain build
it from the data position; rl receives process 0's, learner.multihost) and each device receives its
own rows (`shard_rows`); orbax writes every process's shards of a checkpoint into the
same directory, which must be shared storage (e.g. a GCS bucket).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from learner.schema import DistributedConfig, MeshConfig  # the schema is light (no JAX); see learner.schema
from models.jax_model import make_mesh

BATCH_AXIS = "fsdp"


ENV = {"coordinator_address": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES",
       "process_id": "JAX_PROCESS_ID"}


def init_distributed(config: DistributedConfig) -> bool:
    """Join the multi-process JAX runtime if `config` (or the environment) asks for it; True if joined.

    Call once per process, before anything touches a device. Fields left unset are read from the
    environment (see DistributedConfig); `auto` lets JAX detect its peers (Cloud TPU). CPU devices
    talk over gloo, which JAX leaves off by default.
    """
    settings = {k: getattr(config, k) if getattr(config, k) is not None else os.environ.get(env)
                for k, env in ENV.items()}
    if not config.auto and all(v is None for v in settings.values()):
        return False
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if config.auto:
        settings = {}
    elif any(v is None for v in settings.values()):
        missing = [ENV[k] for k, v in settings.items() if v is None]
        raise ValueError(f"distributed: set all of coordinator_address, num_processes, process_id "
                         f"(or {', '.join(missing)}), or distributed.auto=true")
    else:
        settings.update(num_processes=int(settings["num_processes"]), process_id=int(settings["process_id"]))
    jax.distributed.initialize(**settings, initialization_timeout=config.initialization_timeout_s,
                               heartbeat_timeout_seconds=config.heartbeat_timeout_s)
    return True


def is_leader() -> bool:
    """Whether this is process 0: the one that serves gRPC, talks to actors, publishes and writes files."""
    return jax.process_index() == 0


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
