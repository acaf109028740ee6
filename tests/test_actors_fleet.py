"""ActorFleet resized while a run goes on (1 -> 2 -> 1 actors, through the named fleet and its CLI),
then a crashed actor replaced: every prompt's group is consumed exactly once at the learner. The
learner admits only the actors the fleet enrolled (the real fleet -> actor -> client chain), and the
ids the fleet removed are retired."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import ray
from actors_helpers import addition_prompts, exact_match_pool, make_base_model, wait_for
from config_helpers import actor_config, service_config

from actors.fleet import set_actor_count, start_named_fleet
from learner.service.prompt_source import PromptSource
from learner.service.server import LearnerService
from models.tokenizer import vocab_size_for
from tandem_wire import enrollment

pytestmark = pytest.mark.slow  # Ray and vLLM actors

ROOT = Path(__file__).resolve().parents[1]
NUM_PROMPTS = 40
G = 2


class Trainer:
    """Stands in for the learner's training loop: consumes groups one at a time while ``gate`` is open,
    each one a step (so the lease budget grows as the loop's would)."""

    def __init__(self, service: LearnerService, pace_s: float = 0.2):
        self.service = service
        self.pace_s = pace_s
        self.consumed: list[tuple[str, str]] = []  # (group_id, actor_id)
        self.gate = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def by_actor(self) -> Counter:
        return Counter(actor for _, actor in self.consumed)

    def close(self) -> None:
        self._done.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._done.is_set():
            if not self.gate.wait(0.1):
                continue
            batch = self.service.next_batch(1, timeout=0.5)
            if batch:
                self.service.mark_consumed([r.group_id for r in batch])
                self.consumed += [(r.group_id, r.actor_id) for r in batch]
                self.service.set_step(len(self.consumed))
                time.sleep(self.pace_s)


@pytest.fixture(scope="module")
def run(ray_session, tmp_path_factory):
    base = make_base_model(tmp_path_factory.mktemp("fleet") / "base")
    rows = addition_prompts((i, i) for i in range(NUM_PROMPTS))
    key = enrollment.new_key()
    service = LearnerService(PromptSource(rows, epochs=1, seed=0),
                             service_config(queue_capacity=4, group_size=G, lease_seconds=5.0,
                                            vocab_size=vocab_size_for(), heartbeat_interval_s=0.5,
                                            open_enrollment=False), enrollment_key=key)
    address = service.start()
    pool = exact_match_pool()
    config = actor_config(base, group_size=G, max_tokens=8, max_model_len=64, kv_cache_gib=0.125,
                          prompts_per_batch=2, num_cpus=0)
    fleet = start_named_fleet(config, address, pool.handles(), initial_actors=1, enrollment_key=key)
    trainer = Trainer(service)
    yield service, fleet, trainer
    trainer.close()
    ray.get(fleet.shutdown.remote())
    ray.kill(fleet)
    pool.shutdown()
    service.stop()


def test_scaling_and_replacing_actors_mid_run_loses_and_repeats_nothing(run):
    service, fleet, trainer = run
    trainer.gate.set()
    wait_for(lambda: len(trainer.consumed) >= 4, timeout=240, what="the first actor's groups")  # engine start, loaded

    # 1 -> 2 through the command line, from another Ray driver. The trainer pauses until the new
    # actor has sampled, so that both actors have groups in flight when it resumes.
    trainer.gate.clear()
    gcs = ray.get_runtime_context().gcs_address
    cli = subprocess.run([sys.executable, "-m", "actors.fleet", "2", "--address", gcs], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert cli.stdout.split() == ["actor-0", "actor-1"]
    wait_for(lambda: getattr(ray.get(fleet.stats.remote())["actor-1"], "tokens_generated", 0) > 0, timeout=90,
             what="actor-1 sampling")
    trainer.gate.set()
    wait_for(lambda: trainer.by_actor()["actor-1"] >= 2, timeout=60, what="groups from actor-1")

    # 2 -> 1: actor-1 is stopped and killed with leases in flight; they expire and are re-issued
    assert set_actor_count(1) == ["actor-0"]
    assert set(ray.get(fleet.actors.remote())) == {"actor-0"}

    # a crash: actor-0 dies without stopping; the fleet notices and starts a replacement
    before = trainer.by_actor()["actor-0"]
    wait_for(lambda: trainer.by_actor()["actor-0"] >= before + 2, what="more groups from actor-0")
    ray.kill(ray.get(fleet.actors.remote())["actor-0"], no_restart=True)
    replaced = wait_for(lambda: ray.get(fleet.replace_dead.remote()), what="the fleet noticing the crash")
    assert replaced == ["actor-2"]

    wait_for(lambda: len(trainer.consumed) >= NUM_PROMPTS, timeout=120, what="every prompt consumed")
    time.sleep(1.0)  # a duplicate would arrive now, if it were let through
    ids = [g for g, _ in trainer.consumed]
    assert len(ids) == len(set(ids)) == NUM_PROMPTS, Counter(ids).most_common(3)
    assert set(ids) == {f"0:{i}" for i in range(NUM_PROMPTS)}
    assert service.accounting()["groups_consumed"] == NUM_PROMPTS
    assert set(trainer.by_actor()) == {"actor-0", "actor-1", "actor-2"}
    stats = ray.get(fleet.stats.remote())
    assert set(stats) == {"actor-2"} and stats["actor-2"].groups_sent >= 1
    # done sampling (dataset exhausted) but alive: it keeps its heartbeat, so it is not reported stale
    views = {v.actor_id: v for v in service.actors_status()}
    assert views["actor-2"].seconds_since_heartbeat < 3 * 0.5 + 1
    # the scaled-down and the crashed actor are retired; told so, the learner forgets and refuses them
    assert ray.get(fleet.retired.remote()) == ["actor-1", "actor-0"]
    service.retire(ray.get(fleet.retired.remote()))
    assert {v.actor_id for v in service.actors_status()} == {"actor-2"}
