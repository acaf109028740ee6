"""End to end, the way users run it: a real Ray head on loopback, `ray job submit ... launch/rl.py`.

Checks that the job succeeds, groups were consumed exactly once and balanced, the weight version
advanced every step, and a checkpoint and an HF export exist. Ray is started and stopped here.
"""

import json
import subprocess

from ray_head_helpers import ROOT, submit_command

STEPS, PROMPTS, GROUP = 3, 4, 4


def test_rl_job_submitted_to_a_running_cluster_trains_and_exports(ray_head, tmp_path):
    run_dir = tmp_path / "rl"
    job = subprocess.run(
        submit_command(ray_head, "python", "launch/rl.py", "launch/configs/demo_rl.yaml", f"run_dir={run_dir}",
                       f"data.dir={tmp_path / 'data'}", f"train.steps={STEPS}", f"train.prompts_per_step={PROMPTS}",
                       f"rollout.group_size={GROUP}", "rollout.prompts_per_batch=4", "rollout.queue_capacity=8",
                       "optim.warmup_steps=0", "train.eval_every=0", "train.checkpoint_every=1",
                       "data.eval_examples=16"),
        env=ray_head.env, capture_output=True, text=True, timeout=900, cwd=ROOT,
    )
    assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-4000:]
    assert "succeeded" in job.stdout.lower()

    summary = json.loads((run_dir / "summary.json").read_text())
    accounting = summary["accounting"]
    assert summary["steps"] == STEPS and summary["weight_version"] == STEPS
    assert accounting["groups_consumed"] == STEPS * PROMPTS
    assert accounting["prompts_retired"] >= STEPS * PROMPTS
    assert accounting["groups_invalid"] == 0
    assert set(summary["eval"]) >= {"pass@1_greedy", "pass@8"}
    assert (run_dir / "checkpoints" / str(STEPS)).is_dir()
    assert (run_dir / "hf_final" / "config.json").exists()
    assert list((run_dir / "hf_final").glob("*.safetensors"))
    assert (run_dir / "tb" / "metrics.jsonl").read_text().count("\n") == STEPS
