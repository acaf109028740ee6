"""The sampler of an actor's mode: sync batches, async single-turn streaming, or multi-turn episodes."""

from __future__ import annotations

from collections.abc import Sequence

import ray

from actors.config import ActorConfig
from actors.episodes import EpisodeRunner
from actors.samplers.base import Sampler, SamplerRig
from actors.samplers.batch import BatchSampler
from actors.samplers.episodes import EpisodeSampler
from actors.samplers.streaming import StreamingSampler
from actors.samplers.updates import POLICIES
from actors.trajectory import ObservationRenderer


def sampler_for(config: ActorConfig, rig: SamplerRig, reward_handles: Sequence[ray.actor.ActorHandle]) -> Sampler:
    """`config.sync`: whole batches; else, with an environment, episodes turn by turn; else streaming groups.
    The async modes meet a new weight version as `config.weight_update` says."""
    if config.sync:
        return BatchSampler(rig)
    updates = POLICIES[config.weight_update]()
    if config.environment is None:
        return StreamingSampler(rig, updates)
    renderer = ObservationRenderer(rig.engine.llm.get_tokenizer(), config.environment.tools)
    episodes = EpisodeRunner(rig.actor_id, reward_handles, renderer, config.environment, rig.sampling,
                             rig.engine.max_model_len)
    return EpisodeSampler(rig, updates, episodes)
