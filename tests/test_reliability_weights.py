"""Weight pushes that break inside a real tiny RL run: one version's stream carries a corrupted chunk
(checksum mismatch), a later one is cut before its commit. The actor rejects each, keeps sampling
with its previous complete version, applies the next good one, and the run completes with every
group consumed once and the accounting balanced. And a learner process SIGKILLed in the middle of
a push: the fetch fails, nothing half-received is returned."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time

import pytest
from reliability_helpers import (
    ROOT,
    StepLog,
    check_run,
    final_history,
    learner_with_fleet,
    tiny_run,
)
from weight_faults import cut_before_commit, damaging, flip_a_byte

import actors.weights.fetcher as fetcher_module
import learner.weights.desk as desk_module
from actors.learner_client import LearnerClient, WeightTransferError
from actors.weights.staging import stage_weights
from learner.weights.shared_memory import remove_stale_files
from tandem_wire.weights.digest import hexdigest
from tandem_wire.weights.shared_memory import SHARED_PREFIX, SHM_DIR

pytestmark = pytest.mark.slow  # Ray, vLLM and injected faults

STEPS = 7
CORRUPTED, CUT = 3, 5  # weight versions whose push breaks


def test_broken_weight_pushes_leave_the_actor_on_its_last_complete_version(ray_session, tmp_path, monkeypatch):
    monkeypatch.setattr(desk_module, "pack_weights",
                        damaging(desk_module.pack_weights, {CORRUPTED: flip_a_byte, CUT: cut_before_commit}))
    # without the shared-memory bulk path (as for actors on other hosts): the gRPC stream carries every
    # version, and the run completes on it
    run = tiny_run(tmp_path / "run", steps=STEPS, checkpoint_every=STEPS,
                   overrides=["server.weight_shared_memory=false"])
    seen: dict[int, dict] = {}
    with learner_with_fleet(run, num_actors=1) as rig:
        loop = rig.loop

        def await_rejection(version: int):
            def hook() -> None:  # hold the learner until the actor has tried (and refused) the version
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    (actor,) = loop.service.actors_status()
                    report = actor.last_weight_report or {}
                    if report.get("version") == version and not report["applied"]:
                        seen[version] = {"serving": actor.weight_version, "detail": report["detail"]}
                        return
                    time.sleep(0.05)
                raise AssertionError(f"the actor never reported version {version}")
            return hook

        def await_serving(version: int):
            def hook() -> None:  # the broken version must find the actor on the one before it
                deadline = time.monotonic() + 60
                while loop.service.actors_status()[0].weight_version != version:
                    assert time.monotonic() < deadline, f"the actor never applied version {version}"
                    time.sleep(0.05)
            return hook

        # The learner waits at the step before each broken version until the actor serves that step's
        # version: otherwise a fast learner publishes the broken one before the actor loaded the one
        # before, the actor (two versions behind, max_staleness 1) gets no lease, and nothing can
        # produce the next step's groups.
        steps = StepLog(loop, hooks={CORRUPTED - 1: await_serving(CORRUPTED - 1),
                                     CORRUPTED: await_rejection(CORRUPTED),
                                     CUT - 1: await_serving(CUT - 1), CUT: await_rejection(CUT)})
        accounting = loop.run(on_step=steps)
    (stats,) = rig.stats.values()

    history = final_history(steps.entries)
    check_run(accounting, history, STEPS)
    version_bytes = loop.service._desk.held().header.total_bytes
    assert accounting["weight_bytes_shared"] == 0
    assert accounting["weight_bytes_streamed"] > len(stats.versions_applied) * version_bytes  # all streamed
    for version in (CORRUPTED, CUT):
        assert seen[version]["serving"] == version - 1, seen  # still on the previous complete version
        assert version not in stats.versions_applied, stats.versions_applied
        assert version + 1 in stats.versions_applied, stats.versions_applied  # the next good one
    assert stats.weight_rejections >= 2
    assert not {g[2] for entry in history.values() for g in entry["groups"]} & {CORRUPTED, CUT}
    print(f"\nweight faults: 2 injected (corrupt chunk, cut stream), 2 rejected: "
          f"{[seen[v]['detail'][:60] for v in (CORRUPTED, CUT)]}; versions applied {stats.versions_applied}; "
          f"consumed {accounting['groups_consumed']}, lost 0, stale {accounting['groups_stale']}")


LEARNER_PROCESS = """
import sys
import time

import numpy as np
from config_helpers import service_config  # tests/ is on this child's path

from learner.service.prompt_source import Prompt, PromptSource
from learner.service.server import LearnerService

service = LearnerService(PromptSource([Prompt([1], "p")]),
                         service_config(weight_chunk_bytes=1 << 20))
print(service.start("127.0.0.1:0"), flush=True)
rng = np.random.default_rng(0)
for version, floats in ((1, 1 << 10), (2, 64 << 18)):  # 4 KiB, then 64 MiB in 1 MiB chunks
    sys.stdin.readline()
    service.publish_weights(version, [("w", rng.standard_normal(floats).astype(np.float32))])
    print("published", version, flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("shared_memory", [False, True], ids=["stream", "shared-memory"])
def test_a_learner_killed_in_the_middle_of_a_push_leaves_the_previous_version_intact(monkeypatch, shared_memory):
    """SIGKILL the learner process while a client is receiving a version (in the middle of the chunks,
    or after the shared file's path but before the commit): the fetch fails (no half-received version
    is ever returned) and the previously staged version is untouched. The dead learner's shared files
    are swept by the next learner (remove_stale_files), never read without a live learner's commit."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    learner = subprocess.Popen([sys.executable, "-c", LEARNER_PROCESS], cwd=ROOT, text=True, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path})
    try:
        address = learner.stdout.readline().strip()

        def publish(version: int) -> None:
            learner.stdin.write("\n")
            learner.stdin.flush()
            assert learner.stdout.readline().split() == ["published", str(version)]

        client = LearnerClient(address, "actor-0", shared_memory=shared_memory)
        publish(1)
        previous = client.fetch_weights()
        previous_bytes = previous.tensors[0][1].tobytes()
        publish(2)
        received: list[int] = []

        def kill_mid_push(messages, version, allow_shared=False, watcher=None):
            stream = iter(messages)
            if received:  # the client's retry over the stream, after the shared path failed
                return stage_weights(stream, version, allow_shared, watcher)
            head = list(itertools.islice(stream, 2 if allow_shared else 4))  # header + path | 3 of 64 chunks
            received.append([m.WhichOneof("part") for m in head])
            learner.send_signal(signal.SIGKILL)
            learner.wait(30)
            # what the dead learner had already sent may sit in the client's buffers, the commit too (the
            # shared stream is 3 small messages): a learner killed before its commit never sent one
            before_commit = itertools.takewhile(lambda m: m.WhichOneof("part") != "commit", stream)
            return stage_weights(itertools.chain(head, before_commit), version, allow_shared, watcher)

        monkeypatch.setattr(fetcher_module, "stage_weights", kill_mid_push)
        with pytest.raises(WeightTransferError, match="weight stream failed|truncated") as error:
            client.fetch_weights()
        client.close()
        print(f"\nlearner killed mid-push after {received[0]}: {error.value}")
    finally:
        if learner.poll() is None:
            learner.kill()
    assert received == [["header", "shared"] if shared_memory else ["header", "chunk", "chunk", "chunk"]]
    assert client.weight_fetches["shared_failed"] == int(shared_memory)
    dead = [p for p in remove_stale_files(SHM_DIR) if f"{SHARED_PREFIX}{learner.pid}-" in p.name]
    assert len(dead) == 1  # version 2's file, left by the dead learner (it shares either way), now gone
    assert previous.version == 1 and previous.tensors[0][1].tobytes() == previous_bytes
    assert hexdigest("blake3", previous_bytes) == previous.checksum
