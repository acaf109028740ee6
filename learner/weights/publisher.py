"""Versioned weights: serialised once per version, checksummed, streamed in chunks (the stream
transport's learner half, tandem_wire/weights/transports.py), and held while they are read.

A version (tandem_wire/weights/manifest.py) is one contiguous byte blob (each tensor 64-byte aligned, so
the receiver can view every tensor in place) described by a WeightHeader of TensorSpecs and the version's
kind (full weights, or LoRA adapters with their adapter config), with the digest of the blob (its kind,
tandem_wire.weights.digest, named in the header: blake3 unless the server's config says sha256).
The whole FetchWeights stream of a version (header, chunks, commit) is serialised once, at
publish time, so serving it to each actor copies nothing in Python; the blob itself is not kept in
the process: what another transport needs of the bytes it keeps while they are there (`keep`, e.g. the
shared-memory transport writes them once into /dev/shm, learner/weights/shared_memory.py), under its name
in `extra`. The newest version is kept, and an older one only while a stream still reads it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tandem_wire import pb
from tandem_wire.weights.chunks import WEIGHT_CHUNK_BYTES, encode_chunk
from tandem_wire.weights.digest import DEFAULT_DIGEST, hexdigest
from tandem_wire.weights.manifest import ADAPTER, ALIGNMENT, FULL, WIRE_DTYPES, adapter_config_json


@dataclass(frozen=True)
class WeightBlob:
    version: int
    header: pb.WeightHeader
    checksum: str  # hex digest of the blob, of the kind header.checksum_algorithm names
    messages: tuple[bytes, ...]  # the serialised stream: WeightMessage header, chunks, commit
    extra: Mapping[str, tuple[bytes, ...]] = field(default_factory=dict)
    """another transport's own stream of this version, by its name (tandem_wire/weights/transports.py)"""


def pack_weights(
    version: int, tensors: Iterable[tuple[str, np.ndarray]], chunk_bytes: int = WEIGHT_CHUNK_BYTES,
    digest: str = DEFAULT_DIGEST, keep: Iterable[Callable[[WeightBlob, memoryview], WeightBlob]] = (),
    adapter: Mapping[str, Any] | None = None,
) -> WeightBlob:
    """Serialise named tensors (float32, bfloat16 or float16) into one aligned blob with its `digest`
    (a tandem_wire.weights.digest kind), cut into the serialised messages of its stream; each of `keep`
    (a transport's LearnerHalf.packed) then sees the packed version and its blob, and returns it with what
    it keeps of the bytes. `adapter`: the tensors are LoRA adapters and this their adapter_config.json
    (models.peft.adapter_config), carried in the header (an ADAPTER version); None: full weights."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    adapter_config = "" if adapter is None else adapter_config_json(adapter)
    arrays: list[tuple[str, np.ndarray]] = []
    seen: set[str] = set()
    for name, tensor in tensors:
        array = np.asarray(tensor)
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
            array = array.copy(order="C")
        if not name or name in seen:
            raise ValueError(f"tensor names must be unique and non-empty, got {name!r} twice or empty")
        if array.dtype not in WIRE_DTYPES:
            raise ValueError(
                f"tensor {name!r} has dtype {array.dtype}; the wire carries {[str(d) for d in WIRE_DTYPES]}"
            )
        seen.add(name)
        arrays.append((name, array))
    header = pb.WeightHeader(version=version, checksum_algorithm=digest, kind=FULL if adapter is None else ADAPTER,
                             adapter_config=adapter_config)
    offset = 0
    for name, array in arrays:
        header.tensors.add(
            name=name, dtype=WIRE_DTYPES[array.dtype], shape=array.shape, offset=offset, nbytes=array.nbytes
        )
        offset += -(-array.nbytes // ALIGNMENT) * ALIGNMENT
    header.total_bytes = offset
    blob = np.zeros(offset, dtype=np.uint8)  # calloc'd: zero padding without bytearray's 1 GiB/s memset
    view = memoryview(blob)
    for spec, (_, array) in zip(header.tensors, arrays, strict=True):
        view[spec.offset : spec.offset + spec.nbytes] = array.reshape(-1).view(np.uint8)
    checksum = hexdigest(digest, blob)
    head = pb.WeightMessage(header=header).SerializeToString()
    commit = pb.WeightMessage(
        commit=pb.WeightCommit(version=version, checksum=checksum, total_bytes=len(blob))
    ).SerializeToString()
    chunks = [encode_chunk(version, start, view[start : start + chunk_bytes])
              for start in range(0, len(blob), chunk_bytes)]
    weights = WeightBlob(version, header, checksum, (head, *chunks, commit))
    for packed in keep:
        weights = packed(weights, view)
    return weights


class WeightPublisher:
    """Holds the newest published version (and older ones still being streamed). Thread-safe."""

    def __init__(self, on_drop: Callable[[WeightBlob], None] = lambda weights: None) -> None:
        """`on_drop(weights)` runs (under the lock) when a version is no longer held, e.g. to remove
        its shared-memory file."""
        self._on_drop = on_drop
        self._lock = threading.Lock()
        self._versions: dict[int, WeightBlob] = {}
        self._readers: dict[int, int] = {}
        self._latest: WeightBlob | None = None

    @property
    def latest_version(self) -> int | None:
        """Version of the newest blob held, None before the first publish."""
        with self._lock:
            return None if self._latest is None else self._latest.version

    def publish(self, weights: WeightBlob) -> None:
        """Make `weights` the newest version; its version must exceed every earlier one."""
        with self._lock:
            if self._latest is not None and weights.version <= self._latest.version:
                raise ValueError(f"version {weights.version} is not newer than {self._latest.version}")
            self._latest = weights
            self._versions[weights.version] = weights
            self._prune()

    def acquire(self, version: int = 0) -> WeightBlob:
        """Pin a version (0 = the newest) while a stream reads it; KeyError if it is not held.
        Every acquire must be paired with release()."""
        with self._lock:
            weights = self._latest if version == 0 else self._versions.get(version)
            if weights is None:
                raise KeyError(
                    "no weights published yet" if version == 0 else f"version {version} is not held"
                )
            self._readers[weights.version] = self._readers.get(weights.version, 0) + 1
            return weights

    def release(self, weights: WeightBlob) -> None:
        with self._lock:
            self._readers[weights.version] -= 1
            self._prune()

    def _prune(self) -> None:
        for version in list(self._versions):
            if version != self._latest.version and not self._readers.get(version):
                self._on_drop(self._versions.pop(version))
                self._readers.pop(version, None)
