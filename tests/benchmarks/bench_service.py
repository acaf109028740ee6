"""The learner service's admission throughput, this tree against the code before issue 15's checks.

"Before" is the baseline commit's learner/ and tandem_wire/, exported with `git archive` into a
temporary directory; "after" is this working tree. Each round starts one learner server process per
variant (the same Python environment, only the source root differs) and drives it from this process
with one raw client, identical for both (groups serialised once up front, so the client's own cost is
small and equal):

    groups/s admitted   N valid groups on one StreamGroups call, until the N-th QUEUED ack
    acks/s              the same N groups again on a new call, until the N-th DUPLICATE ack

each both per second of wall time and per second of the server process's CPU time (user + system,
all its threads): on a loaded machine the wall time mostly measures the scheduler, the CPU time
what the service itself costs. Variants alternate round by round, and the median round of each is
reported (on a shared machine single rounds swing both ways by a third), so the ratios after /
before come from one invocation. The client registers and sends the credential Register returns; the baseline
returns none and needs none.

    .venv/bin/python tests/benchmarks/bench_service.py [--groups 2000] [--rounds 5] [--baseline REV]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tandem_wire import WIRE_VERSION, grpc_options, pb, rpc  # noqa: E402
from tandem_wire.limits import CREDENTIAL_METADATA_KEY  # noqa: E402

# The last commit before issue 15 changed the service (its parent, 5624c60, has the same service code
# as 2541ce9, the commit the weaknesses were found on).
BASELINE = "5624c606dccf5db2171d5961aebc3fd96897dbfd"
EXPORTED = ("learner", "tandem_wire")
VOCAB, PROMPT_TOKENS, COMPLETION_TOKENS, GROUP_SIZE = 64, 16, 16, 8
CAPABILITIES = dict(engine="bench", model_family="qwen2", max_model_len=128, group_size=GROUP_SIZE,
                    host="localhost")
SERVER = """
import dataclasses, json, sys
config = json.loads(sys.argv[1])
sys.path.insert(0, config.pop("root"))
from learner.service.server import LearnerService, ServiceConfig  # both trees have the name here
from learner.service import prompt_source
from learner.service.prompt_source import PromptSource
prompt_tokens, queue_capacity = config.pop("prompt_tokens"), config["queue_capacity"]
if "server" in ServiceConfig.__dataclass_fields__:  # this tree: the server and admission sections
    from learner.schema import AdmissionSettings, ServerConfig
    for name, section in (("server", ServerConfig), ("admission", AdmissionSettings)):
        config[name] = section(**{k: config.pop(k) for k in list(config) if k in section.model_fields})
rows = [{"prompt_ids": [5 + (i + j) % 50 for j in range(prompt_tokens)], "text": str(i),
         "metadata": {"answer": str(i)}} for i in range(queue_capacity)]
if hasattr(prompt_source, "Prompt"):  # this tree's PromptSource takes Prompts, the baseline's dicts
    rows = [prompt_source.Prompt(**row) for row in rows]
known = {field.name for field in dataclasses.fields(ServiceConfig)}  # the baseline's has fewer
service = LearnerService(PromptSource(rows, epochs=None), ServiceConfig(**{k: v for k, v in config.items()
                                                                          if k in known}))
print(service.start("127.0.0.1:0"), flush=True)
sys.stdin.read()
"""


def export_baseline(rev: str, dest: Path) -> Path:
    """The baseline's learner/ and tandem_wire/ under `dest` (via `git archive`)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, *EXPORTED],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


@contextlib.contextmanager
def server(root: Path, groups: int) -> Iterator[tuple[str, psutil.Process]]:
    """A learner server whose code comes from `root`, with room to queue every group: (address, process)."""
    # every field the current ServiceConfig requires, with the values the baseline's defaults had; no
    # lease budget (prompts_per_step=0, a field the baseline lacks): every group is leased up front
    config = dict(root=str(root), prompt_tokens=PROMPT_TOKENS, queue_capacity=groups, group_size=GROUP_SIZE,
                  vocab_size=VOCAB, max_staleness=1, prompts_per_step=0, lease_seconds=60.0, max_prompt_tokens=0,
                  max_sequence_tokens=0,
                  auth_token=None, heartbeat_interval_s=5.0, actor_timeout_s=30.0, tls_cert_path=None,
                  tls_key_path=None, open_enrollment=True)
    process = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(config)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        address = process.stdout.readline().strip()
        if not address:
            raise RuntimeError(f"the learner server from {root} did not start")
        yield address, psutil.Process(process.pid)
    finally:
        process.kill()
        process.wait()


def _groups(leases: list[pb.Prompt], actor_id: str, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for lease in leases:
        group = pb.ScoredGroup(wire_version=WIRE_VERSION, group_id=lease.group_id, actor_id=actor_id,
                               prompt_token_ids=lease.token_ids, metadata=lease.metadata,
                               timings=pb.Timings(sample_seconds=0.1, score_seconds=0.01, sampled_at=time.time()))
        for i in range(GROUP_SIZE):
            group.completions.add(token_ids=rng.integers(0, VOCAB, COMPLETION_TOKENS).tolist(),
                                  logprobs=(-rng.random(COMPLETION_TOKENS)).astype(np.float32).tolist(),
                                  finish_reason=pb.FINISH_REASON_STOP, reward=float(i % 2), text="x" * 8,
                                  token_versions=[0] * COMPLETION_TOKENS)
        out.append(group.SerializeToString())
    return out


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _timed_stream(channel: grpc.Channel, metadata: tuple, messages: list[bytes], status: int,
                  process: psutil.Process) -> tuple[float, float]:
    """(wall seconds, server CPU seconds) from opening a StreamGroups call with `messages` until each
    got an ack of `status`."""
    call = channel.stream_stream("/tandem.v1.Learner/StreamGroups", request_serializer=lambda b: b,
                                 response_deserializer=pb.GroupAck.FromString)
    start, cpu = time.perf_counter(), _cpu_seconds(process)
    acks = list(call(iter(messages), metadata=metadata, timeout=600))
    seconds, cpu = time.perf_counter() - start, _cpu_seconds(process) - cpu
    wrong = [a for a in acks if a.status != status]
    if len(acks) != len(messages) or wrong:
        raise RuntimeError(f"{len(acks)} acks for {len(messages)} groups; unexpected: {wrong[:3]}")
    return seconds, cpu


def measure_variant(address: str, process: psutil.Process, groups: int) -> dict[str, float]:
    """groups/s admitted and acks/s (duplicates), per wall and per server CPU second, against the
    server at `address` (running as `process`)."""
    channel = grpc.insecure_channel(address, options=grpc_options())
    stub = rpc.LearnerStub(channel)
    try:
        actor_id = "bench-actor"
        reply = stub.Register(pb.RegisterRequest(wire_version=WIRE_VERSION, actor_id=actor_id,
                                                 capabilities=pb.ActorCapabilities(**CAPABILITIES)), timeout=30)
        metadata = ((CREDENTIAL_METADATA_KEY, reply.credential),) if reply.credential else ()
        leases: list[pb.Prompt] = []
        while len(leases) < groups:
            leases += stub.LeasePrompts(pb.LeasePromptsRequest(
                wire_version=WIRE_VERSION, actor_id=actor_id, max_prompts=min(1024, groups - len(leases))),
                metadata=metadata, timeout=30).prompts
        messages = _groups(leases, actor_id)
        admitted, admitted_cpu = _timed_stream(channel, metadata, messages, pb.ACK_STATUS_QUEUED, process)
        duplicates, duplicates_cpu = _timed_stream(channel, metadata, messages, pb.ACK_STATUS_DUPLICATE, process)
        return {"groups_per_s": groups / admitted, "acks_per_s": groups / duplicates,
                "groups_per_cpu_s": groups / admitted_cpu, "acks_per_cpu_s": groups / duplicates_cpu}
    finally:
        channel.close()


def measure(groups: int = 2000, rounds: int = 5, baseline: str = BASELINE) -> dict:
    """Both variants, alternating for `rounds` rounds; the median of each figure and every round."""
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"before": export_baseline(baseline, Path(tmp)), "after": ROOT}
        for _ in range(rounds):
            for variant, root in roots.items():
                with server(root, groups) as (address, process):
                    runs[variant].append(measure_variant(address, process, groups))
    median = {variant: {key: statistics.median(r[key] for r in results) for key in results[0]}
              for variant, results in runs.items()}
    return {"groups": groups, "rounds": rounds, "baseline": baseline, "median": median, "runs": runs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline", default=BASELINE)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.groups, args.rounds, args.baseline), indent=2))


if __name__ == "__main__":
    main()
