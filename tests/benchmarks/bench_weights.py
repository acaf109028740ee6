"""The floor for a weight push: a raw loopback TCP copy of the same number of bytes.

tandem's push (learner packs and checksums; actor fetches over gRPC, verifies, loads into vLLM) is
compared against this in launch/bench.py. Sender and receiver are two threads of one process
(``sendall``/``recv_into`` release the GIL), so only the kernel's loopback copy is measured.

    .venv/bin/python tests/benchmarks/bench_weights.py [--mb 64]
"""

from __future__ import annotations

import argparse
import socket
import threading
import time

CHUNK = 1 << 20


def _receive(server: socket.socket, nbytes: int, done: list[float]) -> None:
    conn, _ = server.accept()
    with conn:
        buffer = memoryview(bytearray(CHUNK))
        received = 0
        while received < nbytes:
            got = conn.recv_into(buffer, min(CHUNK, nbytes - received))
            if not got:
                raise ConnectionError(f"sender closed after {received} of {nbytes} bytes")
            received += got
    done.append(time.perf_counter())


def tcp_loopback_bytes_per_s(nbytes: int, repeats: int = 3) -> float:
    """Best of ``repeats`` loopback copies of ``nbytes`` (connect + send + receive all of it)."""
    payload = bytes(nbytes)
    best = 0.0
    for _ in range(repeats):
        with socket.create_server(("127.0.0.1", 0)) as server:
            done: list[float] = []
            receiver = threading.Thread(target=_receive, args=(server, nbytes, done))
            receiver.start()
            start = time.perf_counter()
            with socket.create_connection(server.getsockname()) as sender:
                sender.sendall(payload)
            receiver.join()
        best = max(best, nbytes / (done[0] - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=64)
    args = parser.parse_args()
    rate = tcp_loopback_bytes_per_s(int(args.mb * 2**20))
    print(f"raw loopback TCP: {rate / 2**20:.0f} MiB/s for {args.mb:g} MiB")


if __name__ == "__main__":
    main()
