"""Candidate data paths for a weight version, side by side in one invocation (issue 16, "measure first").

For each size: a raw loopback TCP copy (one stream, and four parallel streams), today's gRPC stream
through the real learner service and client (staged and verified, with sha256 and with blake3), the
gRPC transport alone (messages received and dropped: no staging, no digest), a shared-memory file in
/dev/shm (the learner writes it once; the reader copies it into a private buffer and verifies it,
because a mapping the writer can still change is not a verified version), and Ray's object store
(`ray.put` once in the driver, `ray.get` plus verify in another process of the same node; `--ray`).
Then where the time of one path goes: the digests alone (sha256, blake3 on every core, xxh3_128 when
installed) and a plain memory copy, each over the same bytes.

    .venv/bin/python tests/benchmarks/bench_weight_paths.py [--mb 16 256 1024] [--ray]

Rates are bytes of the version per second of the receiving side (best of --repeats), MiB/s.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_weights import tcp_loopback_bytes_per_s  # noqa: E402

MIB = 2**20


def best_rate(nbytes: int, repeats: int, run: Callable[[], float]) -> float:
    """Best bytes/s over `repeats` calls of `run`, which returns the seconds it measured."""
    return max(nbytes / run() for _ in range(repeats))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def parallel_tcp_seconds(nbytes: int, streams: int) -> float:
    """Seconds to send `nbytes` over `streams` loopback connections at once, each its own slice."""
    payload = memoryview(bytes(nbytes))
    bounds = [nbytes * i // streams for i in range(streams + 1)]
    with socket.create_server(("127.0.0.1", 0), backlog=streams) as server:
        address = server.getsockname()

        def receive() -> None:
            conn, _ = server.accept()
            with conn:
                size = int.from_bytes(conn.recv(8, socket.MSG_WAITALL), "little")
                buffer = memoryview(bytearray(size))
                got = 0
                while got < size:
                    n = conn.recv_into(buffer[got:], size - got)
                    if not n:
                        raise ConnectionError("sender closed early")
                    got += n

        def send(i: int) -> None:
            with socket.create_connection(address) as conn:
                part = payload[bounds[i]:bounds[i + 1]]
                conn.sendall(len(part).to_bytes(8, "little"))
                conn.sendall(part)

        receivers = [threading.Thread(target=receive) for _ in range(streams)]
        senders = [threading.Thread(target=send, args=(i,)) for i in range(streams)]
        start = time.perf_counter()
        for t in receivers + senders:
            t.start()
        for t in receivers + senders:
            t.join()
        return time.perf_counter() - start


def grpc_rates(nbytes: int, repeats: int) -> dict[str, float]:
    """Today's FetchWeights stream through the real service and client, per digest kind, and the
    transport alone (the stream's messages read and dropped)."""
    from wire_helpers import connected_client, running_service

    from tandem_wire import WIRE_VERSION, pb

    tensor = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8).view(np.float32)
    rates = {}
    for kind in ("sha256", "blake3"):
        with running_service(weight_digest=kind) as (service, address):
            service.publish_weights(1, [("w", tensor)])
            client = connected_client(address)
            rates[f"grpc stream, staged + {kind}"] = best_rate(
                nbytes, repeats, lambda c=client: timed(c.fetch_weights))
            if kind == "blake3":
                request = pb.FetchWeightsRequest(wire_version=WIRE_VERSION, actor_id=client.actor_id)

                def transport(c=client, r=request) -> float:
                    return timed(lambda: sum(1 for _ in c._stub.FetchWeights(r, metadata=c._metadata(
                        c._current_credential()))))

                rates["grpc transport only (no staging, no digest)"] = best_rate(nbytes, repeats, transport)
            client.close()
    return rates


def shm_seconds(path: str, nbytes: int, kind: str) -> float:
    """Reader side of a shared-memory file: copy it into a private buffer, then verify the copy."""
    from tandem_wire.digest import hexdigest

    start = time.perf_counter()
    buffer = bytearray(nbytes)
    with open(path, "rb", buffering=0) as f:
        f.readinto(buffer)
    hexdigest(kind, buffer)
    return time.perf_counter() - start


def shm_rates(nbytes: int, repeats: int) -> dict[str, float]:
    blob = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="tandem-bench-") as f:
        write_s = timed(lambda: (f.write(memoryview(blob)), f.flush()))
        return {"shm write once (learner side)": nbytes / write_s,
                **{f"shm copy + {kind}": best_rate(nbytes, repeats, lambda k=kind: shm_seconds(f.name, nbytes, k))
                   for kind in ("sha256", "blake3")}}


def ray_rates(nbytes: int, repeats: int) -> dict[str, float]:
    """ray.put once in this process; ray.get + blake3 in a Ray worker of the same node."""
    import ray

    @ray.remote(num_cpus=0)
    def receive(refs: list) -> float:
        from tandem_wire.digest import hexdigest

        start = time.perf_counter()
        array = ray.get(refs[0])  # zero-copy view of the node's shared object store
        hexdigest("blake3", memoryview(array))
        return time.perf_counter() - start

    blob = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    start = time.perf_counter()
    ref = ray.put(blob)
    put_s = time.perf_counter() - start
    ray.get(receive.remote([ref]))  # a warm worker
    rate = best_rate(nbytes, repeats, lambda r=ref: ray.get(receive.remote([r])))
    return {"ray.put once (learner side)": nbytes / put_s, "ray object store get + blake3 (zero-copy)": rate}


def profile_rates(nbytes: int, repeats: int) -> dict[str, float]:
    """The parts a path is made of, alone: digests and a memory copy of the same bytes."""
    from tandem_wire.digest import hexdigest

    blob = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    rates = {f"digest {kind} alone": best_rate(nbytes, repeats, lambda k=kind: timed(lambda: hexdigest(k, blob)))
             for kind in ("sha256", "blake3")}
    try:
        import xxhash

        rates["digest xxh3_128 alone"] = best_rate(
            nbytes, repeats, lambda: timed(lambda: xxhash.xxh3_128_hexdigest(blob)))
    except ImportError:
        pass
    out = np.empty_like(blob)
    rates["memory copy (numpy)"] = best_rate(nbytes, repeats, lambda: timed(lambda: np.copyto(out, blob)))
    return rates


def measure(sizes_mib: list[float], repeats: int, with_ray: bool) -> dict[str, dict[str, float]]:
    """{size label: {path: bytes/s}}"""
    if with_ray:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    results = {}
    try:
        for mib in sizes_mib:
            nbytes = int(mib * MIB)
            rates = {"raw loopback TCP, 1 stream": tcp_loopback_bytes_per_s(nbytes, repeats),
                     "raw loopback TCP, 4 streams": best_rate(nbytes, repeats,
                                                              lambda n=nbytes: parallel_tcp_seconds(n, 4))}
            rates |= grpc_rates(nbytes, repeats)
            rates |= shm_rates(nbytes, repeats)
            if with_ray:
                rates |= ray_rates(nbytes, repeats)
            rates |= profile_rates(nbytes, repeats)
            results[f"{mib:g} MiB"] = rates
    finally:
        if with_ray:
            import ray

            ray.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[16, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ray", action="store_true", help="also Ray's object store (starts a local Ray)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; MiB/s of the receiving side, best of {args.repeats}; "
          "ratio = path / raw loopback TCP (1 stream)")
    for size, rates in measure(args.mb, args.repeats, args.ray).items():
        tcp = rates["raw loopback TCP, 1 stream"]
        print(f"\n{size}")
        for name, rate in rates.items():
            print(f"  {name:<48} {rate / MIB:>8.0f}  {rate / tcp:>5.2f}x")


if __name__ == "__main__":
    main()
