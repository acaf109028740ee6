"""What a weight version is, as both ends read it.

A version is a WeightHeader (its number, its kind, each tensor's name, dtype, shape and offset in one
blob, the blob's size and the kind of its digest), the blob, and a WeightCommit carrying the blob's
digest. The kind (pb.WeightKind) says what the tensors are, and so how an actor applies them
(actors/weights/apply.py): the model's full weights (WEIGHT_KIND_FULL), or LoRA adapters
(WEIGHT_KIND_ADAPTER) over the same header, blob, digest and transports, whose header also carries their
adapter_config.json as JSON (`adapter_config_json` writes it, `adapter_config_of` reads it back, both
bounded). Every tensor starts at a multiple of ALIGNMENT in the blob, so the receiver views each one in
place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from tandem_wire import pb

ALIGNMENT = 64
FULL = pb.WEIGHT_KIND_FULL
ADAPTER = pb.WEIGHT_KIND_ADAPTER
# An adapter_config.json is ~400 bytes; the base model's path in it is the only part that may be long.
MAX_ADAPTER_CONFIG_BYTES = 16 * 1024
WIRE_DTYPES = {  # the dtypes a version's tensors may have, and how the wire names them
    np.dtype(np.float32): pb.DTYPE_FLOAT32,
    np.dtype(ml_dtypes.bfloat16): pb.DTYPE_BFLOAT16,
    np.dtype(np.float16): pb.DTYPE_FLOAT16,
}
NUMPY_DTYPES = {wire: dtype for dtype, wire in WIRE_DTYPES.items()}


def adapter_config_json(config: Mapping[str, Any]) -> str:
    """An ADAPTER header's adapter_config: `config` (models.peft.adapter_config) as compact JSON;
    ValueError unless it is a JSON object of at most MAX_ADAPTER_CONFIG_BYTES."""
    if not isinstance(config, Mapping):
        raise ValueError(f"an adapter config is a mapping, got {type(config).__name__}")
    text = json.dumps(dict(config), separators=(",", ":"), allow_nan=False)
    if len(text.encode()) > MAX_ADAPTER_CONFIG_BYTES:
        raise ValueError(f"adapter config of {len(text.encode())} bytes exceeds {MAX_ADAPTER_CONFIG_BYTES}")
    return text


def adapter_config_of(header: pb.WeightHeader) -> dict[str, Any] | None:
    """The adapter config an ADAPTER header carries (None for any other kind, which must carry none);
    ValueError when it is missing, larger than MAX_ADAPTER_CONFIG_BYTES, or not one JSON object."""
    text = header.adapter_config
    if header.kind != ADAPTER:
        if text:
            raise ValueError(f"a {pb.WeightKind.Name(header.kind)} version carries an adapter config")
        return None
    size = len(text.encode())
    if not 0 < size <= MAX_ADAPTER_CONFIG_BYTES:
        raise ValueError(f"adapter config of {size} bytes: an adapter version needs one of 1 to "
                         f"{MAX_ADAPTER_CONFIG_BYTES}")
    try:
        config = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:  # RecursionError: nesting deeper than Python's stack
        raise ValueError(f"adapter config is not JSON: {str(error)[:200]}") from None
    if not isinstance(config, dict):
        raise ValueError(f"adapter config is a JSON {type(config).__name__}, not an object")
    return config


def _no_constant(name: str) -> None:
    """json.loads takes NaN and Infinity, which are not JSON: refused."""
    raise ValueError(f"{name} is not a JSON value")
