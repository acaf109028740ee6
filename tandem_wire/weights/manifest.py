"""What a weight version is, as both ends read it.

A version is a WeightHeader (its number, its kind, each tensor's name, dtype, shape and offset in one
blob, the blob's size and the kind of its digest), the blob, and a WeightCommit carrying the blob's
digest. The kind (pb.WeightKind) says what the tensors are, and so how an actor applies them
(actors/weights/apply.py): the model's full weights today (WEIGHT_KIND_FULL); LoRA adapters would be a
second kind over the same header, blob, digest and transports. Every tensor starts
at a multiple of ALIGNMENT in the blob, so the receiver views each one in place.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tandem_wire import pb

ALIGNMENT = 64
FULL = pb.WEIGHT_KIND_FULL
WIRE_DTYPES = {  # the dtypes a version's tensors may have, and how the wire names them
    np.dtype(np.float32): pb.DTYPE_FLOAT32,
    np.dtype(ml_dtypes.bfloat16): pb.DTYPE_BFLOAT16,
    np.dtype(np.float16): pb.DTYPE_FLOAT16,
}
NUMPY_DTYPES = {wire: dtype for dtype, wire in WIRE_DTYPES.items()}
