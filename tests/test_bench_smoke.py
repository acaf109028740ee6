"""Smoke test of launch/bench.py's pieces at tiny sizes: each runs and yields the keys the table reads.

No timing assertions (performance is what the runner prints); the behaviour checked is that the
pieces work end to end, and that synchronous mode (rollout.sync) trains without a stale group.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from launch import bench  # noqa: E402

pytestmark = pytest.mark.slow  # the benchmarks' real engines

TINY_MODEL = dict(num_layers=1, hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1,
                  head_dim=32)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("bench") / "model", **TINY_MODEL)


def test_pieces_fill_every_row_of_the_table(model_dir):
    import bench_grpo_step
    from bench_loop import measure_mode
    from bench_rollout import measure_backend

    rollout = {b: measure_backend(b, model_dir, num_prompts=2, group_size=2, max_tokens=4, repeats=1,
                                  max_model_len=64) for b in ("vllm", "transformers")}
    for backend in rollout.values():
        assert backend["natural"]["tokens"] > 0 and backend["fixed"]["tokens"] == 2 * 2 * 4  # EOS ignored
    grpo = bench_grpo_step.measure(bench_grpo_step.parse_args(
        ["--vocab", "64", "--batch", "2", "--prompt", "8", "--completion", "8", "--repeats", "1",
         "--chunk-tokens", "8"]))
    losses = [v["loss"] for v in grpo["variants"].values()]
    assert max(losses) - min(losses) < 1e-4  # the same step three ways

    # 4 prompts x G=2 = 8 rows, which split over conftest's 8 simulated devices
    overrides = [f"model.path={model_dir}", "train.prompts_per_step=4", "rollout.prompts_per_batch=4",
                 "rollout.group_size=2", "rollout.max_tokens=4", "rollout.queue_capacity=4"]
    sync = measure_mode("sync", steps=3, warmup=1, overrides=overrides, standalone=True)
    assert sync["groups_stale"] == 0 and sync["groups_consumed"] == 3 * 4  # sample, train, push: never stale
    assert sync["actor_idle_parts"]["prompt_wait_seconds"] > 0  # refused by the budget until each new version
    assert 0 <= sync["learner_idle"] <= 1 and 0 <= sync["actor_idle"] <= 1

    assert 0 < sync["learner_busy"] <= 1 and 0 < sync["actor_busy"] <= 1  # the learner trains every step

    loop = {"demo": {"async": sync, "sync": sync}, "long": {"async": sync, "sync": sync}}
    rows = bench.table({"rollout": rollout, "grpo": grpo, "loop": loop})
    assert len(rows) == 10 + 2 * 6  # rollout, weight and GRPO rows, and 6 end-to-end rows per config
    for name, ours, *_ in rows:
        assert ours is not None and ours >= 0, name
    text = bench.format_table(rows)
    assert "end to end (long): RL steps/min, async vs sync" in text and "1.00x" in text


def test_weights_section_fills_its_rows_and_shared_memory_and_relays_keep_egress_at_one_version(model_dir):
    import bench_weight_paths

    weights = bench_weight_paths.section([1], 1, model_dir, (2, 2, 4))
    for n, ratio in weights["egress"]["shared"].items():
        assert 1.0 <= ratio <= 1.5, (n, ratio)  # the version once in shared memory, plus control messages
        assert 1.0 <= weights["egress"]["relay"][n] <= 1.5, n  # once to the first actor, which relays it
        assert weights["egress"]["stream"][n] >= n  # every streaming actor pulls the whole version
    rows = bench.table({"weights": weights})
    assert len(rows) == 2 + 3 + 3 + 1 + 1 + 4
    for name, ours, base, _ in rows:
        assert ours is not None and ours >= 0 and base is not None and base >= 0, name


def test_applied_rows_put_vllms_load_alone_beside_the_whole_update():
    """The applied-in-vLLM rows (versions of 256 MiB and more, too slow for this smoke test) are read
    from the section's parts: the whole update over TCP, and the load alone, which bounds it."""
    mib = 2**20
    part = {"version_bytes": 1024 * mib, "fetch_s": 0.2, "check_s": 0.0, "load_s": 0.8, "seconds": 1.0,
            "bytes_per_s": 1024 * mib / 1.0}
    weights = {"tcp": {1024: 2048 * mib}, "fetch": {1024: {"shared memory, staged + xxh3_128": 5120 * mib,
                                                           "grpc stream, staged + blake3": 512 * mib}},
               "applied": {1024: {"shared memory": part}},
               "egress": {"shared": {}, "relay": {1: 1.0}, "stream": {1: 1.0}, "relay_s": {1: 0.1},
                          "stream_s": {1: 0.1}}, "egress_mib": 16}
    rows = {name: (ours, base) for name, ours, base, _ in bench.table({"weights": weights})}
    assert rows["weights: 1024 MiB published -> applied in vLLM (shared memory) vs raw loopback TCP"] == (1024, 2048)
    assert rows["weights: 1024 MiB vLLM load alone (reload + prefix-cache reset) vs raw loopback TCP"] == (1280, 2048)


def test_real_shape_rows_put_each_precisions_step_memory_beside_its_floor():
    """The real-shape section (minutes of compiling a 24-layer model, too slow here) is read from its
    parts: XLA's bytes of each precision's step beside its analytic floor, and mixed vs float32 speed."""
    import bench_real_shape

    gib = 2**30
    floor = bench_real_shape.floor_bytes(1000, "mixed", layers=2, tokens=10, hidden=4, vocab=50, chunk_tokens=8)
    assert floor == 4 * 1000 * 4 + 1000 * 2 + 2 * 10 * 4 * 2 + 8 * 50 * 4  # master+grads+m+v, copy, acts, chunk
    real = {"sizes": {"layers": 24, "rows": 8, "seq": 256, "speed_layers": 2},
            "memory": {"mixed, remat full": {"step_bytes": 9 * gib, "floor_bytes": 6 * gib}},
            "speed": {"mixed": {"tokens_per_s": 90.0}, "float32": {"tokens_per_s": 60.0}}}
    rows = {name: (ours, base) for name, ours, base, _ in bench.table({"real": real})}
    assert rows["learner: step memory at Qwen2.5-0.5B shape (24 layers, 8x256), mixed, remat full vs floor"] == (9, 6)
    assert rows["learner: SFT step tok/s at real widths (2 layers), mixed vs float32"] == (90.0, 60.0)


def test_learner_section_runs_both_sides_and_fills_its_rows():
    """launch/bench.py --only learner at a smoke size: the Trainer's SFT and RL steps and the transformers
    step, each in a child process, at Qwen2.5-0.5B's widths with 1 layer; every row is filled."""
    import bench_learner

    results = bench_learner.measure(bench_learner.parse_args(
        ["--shapes", "0.5b", "--layers", "1", "--rows", "2", "--seq", "32", "--steps", "1"]))
    jax_side, torch_side = results["shapes"]["0.5b"]["jax"], results["shapes"]["0.5b"]["torch"]
    assert "error" not in jax_side and "error" not in torch_side, (jax_side, torch_side)
    # train.remat auto: at this size both steps fit the CPU's budget without remat
    assert set(jax_side["kinds"]) == {"sft", "rl"} and jax_side["remat"] == ["none"]
    assert jax_side["attention"] == "auto" and jax_side["matmul_tflops"] > 0
    for row in jax_side["kinds"].values():
        assert row["tokens_per_s"] > 0 and row["xla_bytes"] > row["floor_bytes"] > 0
        assert all(abs(loss) < 100 for loss in row["loss"])  # finite
    rows = bench.table({"learner": results})
    assert len(rows) == 2 * 4 + 1
    by_name = {name: (ours, base) for name, ours, base, _ in rows}
    sft = by_name["learner: Qwen2.5-0.5B shape, 2x32, sft: tok/s, tandem vs transformers"]
    assert sft == (jax_side["kinds"]["sft"]["tokens_per_s"], torch_side["tokens_per_s"])
    ours, theirs = by_name["learner: Qwen2.5-0.5B shape, 2x32, sft: MFU against the measured matmul ceiling, "
                           "tandem vs transformers"]
    assert ours / theirs == pytest.approx(sft[0] / sft[1])  # the same FLOPs count on both sides
