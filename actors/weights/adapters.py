"""The adapter versions a vLLM engine serves: how an ADAPTER version is loaded (actors/weights/apply.py),
named, handed to new requests and unloaded.

Each version is written as a PEFT dir (adapter_config.json + adapter_model.safetensors, what
`peft.PeftModel.from_pretrained` and vLLM read) under this process's own dir in /dev/shm, and registered
with vLLM as `LoRARequest("policy-v<n>", <id>, <dir>)`. A name per version, never one fixed name: vLLM
keys its prefix cache by the adapter's name and path, so a fixed name would reuse prompts' KV computed
under an older adapter (TRL #7017). New requests take the newest; a request keeps the adapter it started
with to its end. The newest `kept` versions stay loaded (the run's max_staleness + 1: the versions whose
groups the learner still takes); an older one is unloaded, and its dir removed, once no request in flight
uses it. vLLM may evict a registered adapter from its own cache and load it again from its dir, so a dir
lives exactly as long as its registration. Dirs a killed actor left are removed by the next one.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.peft import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from tandem_wire.weights.shared_memory import SHM_DIR, remove_orphans

ADAPTER_DIR_PREFIX = "tandem-adapters-"  # + "<actor pid>-<random>"
ADAPTER_DIR = re.compile(re.escape(ADAPTER_DIR_PREFIX) + r"(\d+)-[0-9a-f]+")


def adapter_name(version: int) -> str:
    """The name vLLM knows version `version`'s adapter by (and keys its prefix cache with)."""
    return f"policy-v{version}"


def write_peft_dir(directory: Path, config: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> Path:
    """A PEFT adapter dir: `config` as adapter_config.json, `tensors` (PEFT names) as adapter_model.safetensors."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True)
    (directory / ADAPTER_CONFIG).write_text(json.dumps(dict(config), indent=2))
    save_file(dict(tensors), str(directory / ADAPTER_WEIGHTS))
    return directory


@dataclass(frozen=True)
class _Loaded:
    request: Any  # vllm.lora.request.LoRARequest
    directory: Path


class LoadedAdapters:
    """The adapter versions registered with one vLLM engine, oldest first. Not thread-safe: the engine's
    caller holds its lock."""

    def __init__(self, engine: Any, kept: int) -> None:
        """`engine`: the vLLM LLMEngine (add_lora, remove_lora); `kept`: how many of the newest versions
        stay loaded."""
        if kept < 1:
            raise ValueError(f"kept must be >= 1, got {kept}")
        self._engine = engine
        self._kept = kept
        parent = SHM_DIR if SHM_DIR.is_dir() else Path(tempfile.gettempdir())
        remove_orphans(parent, ADAPTER_DIR)
        self.root = parent / f"{ADAPTER_DIR_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        self.root.mkdir(mode=0o700)
        self._ids = itertools.count(1)  # vLLM's adapter ids: positive and never reused
        self._loaded: dict[int, _Loaded] = {}  # id -> adapter, in load order

    @property
    def current(self) -> Any:
        """The newest adapter's LoRARequest, which new requests take; None before the first load."""
        return next(reversed(self._loaded.values())).request if self._loaded else None

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the adapters loaded, oldest first."""
        return tuple(loaded.request.lora_name for loaded in self._loaded.values())

    def load(self, version: int, config: Mapping[str, Any], tensors: Mapping[str, np.ndarray],
             in_use: Collection[int]) -> None:
        """Write `version`'s PEFT dir, register it (vLLM reads it now, so a dir it refuses fails here) and
        make it the current one; then unload the ones no longer kept that `in_use` allows (`unload`)."""
        from vllm.lora.request import LoRARequest

        adapter_id = next(self._ids)
        directory = write_peft_dir(self.root / f"{adapter_id}-{adapter_name(version)}", config, tensors)
        request = LoRARequest(adapter_name(version), adapter_id, str(directory))
        try:
            self._engine.add_lora(request)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self._loaded[adapter_id] = _Loaded(request, directory)
        self.unload(in_use)

    def unload(self, in_use: Collection[int]) -> None:
        """Unload the adapters older than the newest `kept` that no request in flight uses (`in_use`: the
        ids requests in flight were submitted with), and remove their dirs."""
        newest = list(self._loaded)[-self._kept:]
        for adapter_id in [i for i in self._loaded if i not in newest and i not in in_use]:
            loaded = self._loaded.pop(adapter_id)
            self._engine.remove_lora(adapter_id)
            shutil.rmtree(loaded.directory, ignore_errors=True)

    def close(self) -> None:
        """Remove every dir (the engine is shutting down: nothing will read them again)."""
        self._loaded.clear()
        shutil.rmtree(self.root, ignore_errors=True)
