"""What a weight update costs the groups in flight: rollout.weight_update=keep against abort, on one engine.

    .venv/bin/python tests/benchmarks/bench_inflight_update.py [--groups 48 --in-flight 8 --update-every 24]

The demo's model shape (random weights, EOS ignored so every completion runs its length) samples groups of
G completions whose lengths are long-tailed (max_tokens drawn log-uniform over 16..--max-len), keeping
--in-flight groups in the engine and refilling as groups finish, as the streaming actor does. Every
--update-every engine steps a new full version arrives (two weight sets, alternating). Each policy runs in
this process, one after the other, on the same groups and update steps:
  keep         loaded at once, the groups in flight continue on it (RolloutEngine.update_in_flight: KV
               recomputed on the new weights)
  abort        the actor's default: no new groups until drained, loaded once none is left or after
               --drain-steps steps, when the rest is aborted and sampled again
  abort_now    loaded at once, the groups in flight aborted and sampled again (weight_drain_steps=0)
Prints one JSON line per policy: wall and CPU seconds (on a shared CPU the process's CPU time is the steadier
of the two; engine steps do not depend on the machine at all), groups done (abort_now never finishes a completion longer
than --update-every: --max-steps ends it), groups/min, tokens sampled and kept, tokens discarded per
update, the stall of each update (pause + load + resume) and, for keep, the tokens recomputed per update and
the seconds of the engine steps until every frozen request decoded again (they hold everyone's decoding).
Measured numbers are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODEL = dict(num_layers=3, hidden_size=128, intermediate_size=384, num_heads=4, num_kv_heads=2, head_dim=32)
POLICIES = ("keep", "abort", "abort_now")


def workload(args) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens) per group: prompts of 8..24 tokens, lengths log-uniform over 16..max_len."""
    rng = np.random.default_rng(args.seed)
    lengths = np.exp(rng.uniform(np.log(16), np.log(args.max_len), args.groups)).astype(int)
    return [(rng.integers(10, 40, int(rng.integers(8, 25))).tolist(), int(n)) for n in lengths]


def run(engine, weights: list, policy: str, groups: list[tuple[list[int], int]], args) -> dict:
    """Sample every group under `policy`; the counters of the run."""
    from actors.engine import SamplingSpec

    def spec(max_tokens: int) -> SamplingSpec:
        return SamplingSpec(n=args.group_size, temperature=1.0, max_tokens=max_tokens, ignore_eos=True)

    todo, in_engine, done = list(range(len(groups))), set(), 0
    steps = version = 0
    pending = None  # abort: the version waiting, and the drain steps it has left
    stalls, recomputed, discarded, sampled = [], [], [], 0
    aborted_before, recomputed_s_before = engine.aborted_tokens, engine.recompute_s
    start, cpu_start = time.perf_counter(), time.process_time()
    while (todo or in_engine) and steps < args.max_steps:
        while todo and len(in_engine) < args.in_flight and pending is None:
            key = todo.pop(0)
            engine.submit(str(key), groups[key][0], spec(groups[key][1]))
            in_engine.add(key)
        for key, samples in engine.poll():
            in_engine.discard(int(key))
            done += 1
            sampled += sum(len(s.token_ids) for s in samples)
        steps += 1
        if steps % args.update_every == 0:
            version += 1
            pending = (version, args.drain_steps if policy == "abort" else 0)
        if pending is None:
            continue
        new, left = pending
        checked = weights[new % 2]
        if policy == "keep":
            update = engine.update_in_flight(checked, new)
            stalls.append(update.stall_s)
            recomputed.append(update.tokens_recomputed)
            pending = None
        elif not in_engine or left == 0:
            lost = engine.aborted_tokens
            aborted = engine.abort_all()
            stalls.append(engine.load_weights(checked, new))
            discarded.append(engine.aborted_tokens - lost)
            for key in aborted:
                engine.submit(key, groups[int(key)][0], spec(groups[int(key)][1]))
            pending = None
        else:
            pending = (new, left - 1)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    engine.abort_all()  # what the step limit left unfinished
    return {"policy": policy, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "groups_done": done,
            "groups_per_min": round(60 * done / wall, 1),
            "engine_steps": steps, "updates": len(stalls), "tokens_kept": sampled,
            "tokens_discarded": engine.aborted_tokens - aborted_before,
            "tokens_discarded_per_update": round(float(np.mean(discarded)), 1) if discarded else 0.0,
            "stall_ms_per_update": round(1e3 * float(np.mean(stalls)), 1) if stalls else 0.0,
            "tokens_recomputed_per_update": round(float(np.mean(recomputed)), 1) if recomputed else 0.0,
            "recompute_ms_per_update": round(1e3 * (engine.recompute_s - recomputed_s_before) / max(1, len(recomputed)),
                                             1) if recomputed else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=48)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=8, help="groups kept in the engine (prompts_per_batch)")
    parser.add_argument("--max-len", type=int, default=512, help="the longest completion of the long tail")
    parser.add_argument("--update-every", type=int, default=24, help="engine steps between two weight versions")
    parser.add_argument("--drain-steps", type=int, default=64, help="abort: rollout.weight_drain_steps")
    parser.add_argument("--max-steps", type=int, default=3000, help="a policy stops here (abort_now may never "
                        "finish a completion longer than --update-every)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from safetensors.numpy import load_file

    from actors.engine import RolloutEngine
    from models.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = make_tiny_model(Path(tmp) / "model", **MODEL, max_position_embeddings=1024)
        engine = RolloutEngine(hf_dir, max_model_len=args.max_len + 32, kv_cache_gib=1, seed=args.seed)
        tensors = load_file(str(hf_dir / "model.safetensors"))
        rng = np.random.default_rng(args.seed + 1)
        other = {name: (a + rng.normal(0, 0.02, a.shape)).astype(a.dtype) for name, a in tensors.items()}
        weights = [engine.check_weights(tensors.items()), engine.check_weights(other.items())]
        groups = workload(args)
        engine.greedy([[1, 2]], max_tokens=1)  # the first step's one-time setup, outside the runs
        for policy in args.policies.split(","):
            engine.load_weights(weights[0], 0)
            print(json.dumps(run(engine, weights, policy, groups, args)), flush=True)
        engine.shutdown()


if __name__ == "__main__":
    main()
