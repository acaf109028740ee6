"""Weight pushes that break inside a real tiny RL run: one version's stream carries a corrupted chunk
(checksum mismatch), a later one is cut before its commit. The actor rejects each, keeps sampling
with its previous complete version, applies the next good one, and the run completes with every
group consumed once and the accounting balanced."""

from __future__ import annotations

import dataclasses
import time

from reliability_helpers import StepLog, build_learner, check_run, final_history, start_fleet, stop_fleet, tiny_run

import learner.service as service_module

STEPS = 7
CORRUPTED, CUT = 3, 5  # weight versions whose push breaks


def broken_pack(real_pack):
    def pack(version, tensors, chunk_bytes):
        blob = real_pack(version, tensors, chunk_bytes)
        if version == CORRUPTED:  # flip a byte inside the first chunk's data
            chunk = bytearray(blob.messages[1])
            chunk[len(chunk) // 2] ^= 0xFF
            return dataclasses.replace(blob, messages=(blob.messages[0], bytes(chunk), *blob.messages[2:]))
        if version == CUT:  # the stream ends before its commit (connection dropped mid-push)
            return dataclasses.replace(blob, messages=blob.messages[:-1])
        return blob
    return pack


def test_broken_weight_pushes_leave_the_actor_on_its_last_complete_version(ray_session, tmp_path, monkeypatch):
    monkeypatch.setattr(service_module, "pack_weights", broken_pack(service_module.pack_weights))
    run = tiny_run(tmp_path / "run", steps=STEPS, checkpoint_every=STEPS)
    loop = build_learner(run)
    address = loop.start()
    pool, fleet = start_fleet(run, address, num_actors=1)
    seen: dict[int, dict] = {}

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

    steps = StepLog(loop, hooks={CORRUPTED: await_rejection(CORRUPTED), CUT: await_rejection(CUT)})
    try:
        accounting = loop.run(on_step=steps)
    finally:
        (stats,) = stop_fleet(pool, fleet).values()
        loop.service.stop()
        loop.checkpointer.close()

    history = final_history(steps.entries)
    check_run(accounting, history, STEPS)
    for version in (CORRUPTED, CUT):
        assert seen[version]["serving"] == version - 1, seen  # still on the previous complete version
        assert version not in stats["versions_applied"], stats["versions_applied"]
        assert version + 1 in stats["versions_applied"], stats["versions_applied"]  # the next good one
    assert stats["weight_rejections"] >= 2
    assert not {g[2] for entry in history.values() for g in entry["groups"]} & {CORRUPTED, CUT}
    print(f"\nweight faults: 2 injected (corrupt chunk, cut stream), 2 rejected: "
          f"{[seen[v]['detail'][:60] for v in (CORRUPTED, CUT)]}; versions applied {stats['versions_applied']}; "
          f"consumed {accounting['groups_consumed']}, lost 0, stale {accounting['groups_stale']}")
