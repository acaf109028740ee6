"""Role configs for tests, built the way launch builds them (launch.config.TandemConfig), so that
their defaults live in one place. Keyword arguments replace single fields."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from actors.config import ActorConfig
from launch.config import load_config
from learner.schema import AdmissionSettings, ServerConfig


def service_config(**fields):
    """The learner server's config of a default run, but with no token (whatever the environment says),
    open enrollment (tests about identity close it and enroll their actors), no vocab check, any group
    size, prompt length and completion length unless ``fields`` set them; ``fields`` named after a `server` key
    (auth_token, open_enrollment, tls_cert_path, ...) go to its server section, those named after an
admission key (queue_capacity, max_staleness, lease_seconds, ...) to its admission section."""
    base = load_config(None).service_config(vocab_size=None)
    server = {name: fields.pop(name) for name in list(fields) if name in ServerConfig.model_fields}
    admission = {name: fields.pop(name) for name in list(fields) if name in AdmissionSettings.model_fields}
    server = {"auth_token": None, "open_enrollment": True, **server}
    return dataclasses.replace(base, **{"server": base.server.model_copy(update=server),
                                        "admission": base.admission.model_copy(update=admission),
                                        "group_size": 0, "max_prompt_tokens": 0,
                                        "max_sequence_tokens": 0, **fields})


def loop_config(overrides: list[str] = (), **fields):
    """The RL loop's config of a default run with config ``overrides`` (dotted keys), then ``fields``."""
    return dataclasses.replace(load_config(None, list(overrides)).loop_config(), **fields)


def actor_config(hf_dir: str | Path, **fields) -> ActorConfig:
    """An actor's config of a default run over ``hf_dir`` (no token unless given), then ``fields``."""
    base = load_config(None).actor_config(hf_dir).model_dump()
    return ActorConfig(**{**base, "auth_token": None, **fields})
