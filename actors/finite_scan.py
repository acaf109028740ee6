"""Which tensors of a weight version hold a NaN or an Inf, found while the version lands.

An actor refuses a version with a non-finite value (actors/engine.py). Scanning after the transfer
is one more pass over the whole version on the update's clock; FiniteScan instead scans each tensor
on a thread of its own as soon as its bytes have landed, beside the receive and the digest.
Measured on 2 cores, 1 GiB over shared memory: xxh3 and the scan together 0.145 s, one after the
other 0.22 s.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

SCAN_VALUES = 4 << 20  # values per slice: bounds the scan's temporary mask, whatever the tensor's size
BFLOAT16_EXPONENT = 0x7F80  # all exponent bits set: Inf or NaN


def has_nonfinite(array: np.ndarray) -> bool:
    """True if the float array holds a NaN or an Inf. Slice by slice (no mask the size of the
    tensor); bfloat16 by its exponent bits, since numpy has no bfloat16 loop of its own."""
    flat = array.reshape(-1)
    if flat.dtype.name == "bfloat16":
        bits = flat.view(np.uint16)
        return any(((bits[i : i + SCAN_VALUES] & BFLOAT16_EXPONENT) == BFLOAT16_EXPONENT).any()
                   for i in range(0, bits.size, SCAN_VALUES))
    return any(not np.isfinite(flat[i : i + SCAN_VALUES]).all() for i in range(0, flat.size, SCAN_VALUES))


class FiniteScan:
    """Scans the tensors of one blob in the order their bytes complete, on one worker thread (numpy
    releases the GIL while it scans). A context manager: leaving it cancels what was not scanned."""

    def __init__(self, specs: list[tuple[str, np.dtype, tuple[int, ...], int]]) -> None:
        """`specs`: (name, dtype, shape, byte offset) of each tensor of the blob."""
        self._pending = sorted(specs, key=lambda spec: spec[3] + int(np.prod(spec[2])) * spec[1].itemsize)
        self._next = 0
        self._scans: list[tuple[str, Future[bool]]] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tandem-scan")

    def __enter__(self) -> FiniteScan:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def landed(self, buffer: np.ndarray, end: int) -> None:
        """Bytes [0, end) of the blob are in `buffer`: queue every tensor that now lies within them."""
        while self._next < len(self._pending):
            name, dtype, shape, offset = self._pending[self._next]
            count = int(np.prod(shape))
            if offset + count * dtype.itemsize > end:
                return
            view = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset)
            self._scans.append((name, self._pool.submit(has_nonfinite, view)))
            self._next += 1

    def nonfinite(self) -> tuple[str, ...]:
        """Names of the tensors with a non-finite value, once every tensor has landed and been scanned."""
        if self._next < len(self._pending):
            raise RuntimeError(f"{len(self._pending) - self._next} tensor(s) have not landed")
        return tuple(name for name, scan in self._scans if scan.result())
