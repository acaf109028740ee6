"""Every role's config is derived from the one TandemConfig (launch/config.py), every key is documented
where it is declared and shown by --help, removed keys fail naming what replaced them, and the
config module stays light (no JAX, no tunix)."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from actors.config import EngineSettings
from launch.config import REMOVED_KEYS, ConfigError, RolloutConfig, TandemConfig, documented_keys, load_config
from learner.schema import AdmissionSettings

ROOT = Path(__file__).resolve().parents[1]
LIGHT = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}


def test_the_service_config_carries_the_run_config():
    config = load_config(None, ["rollout.queue_capacity=7", "rollout.max_staleness=0", "rollout.group_size=3",
                                "train.prompts_per_step=5",
                                "rollout.lease_seconds=9.5", "rollout.max_prompt_tokens=33",
                                "rollout.heartbeat_interval_s=0.25", "rollout.actor_timeout_s=2",
                                "server.auth_token=t0k", "server.tls_cert_path=/c.pem", "server.tls_key_path=/k.pem"])
    service = config.service_config(vocab_size=151)
    admission = service.admission
    assert admission is config.rollout  # the service reads the run's rollout section whole for admission
    assert (admission.queue_capacity, admission.max_staleness, admission.lease_seconds) == (7, 0, 9.5)
    assert (admission.heartbeat_interval_s, admission.actor_timeout_s) == (0.25, 2.0)
    assert (service.group_size, service.max_prompt_tokens) == (3, 33)
    assert service.server is config.server  # and the server section
    assert (service.server.auth_token, service.server.tls_cert_path, service.server.tls_key_path) == (
        "t0k", "/c.pem", "/k.pem")
    assert service.vocab_size == 151 and service.mode == "rl" and service.prompts_per_step == 5


def test_the_loop_config_carries_the_run_config():
    config = load_config(None, ["train.steps=12", "train.prompts_per_step=5", "rollout.group_size=6",
                                "rollout.max_prompt_tokens=20", "rollout.max_tokens=11", "rollout.publish_every=2",
                                "train.max_fill_batches=3", "train.guard.action=stop", "train.guard.window=7"])
    loop = config.loop_config()
    assert loop.train is config.train  # the loop reads the run's train section whole
    assert (loop.train.steps, loop.train.prompts_per_step, loop.group_size, loop.publish_every) == (12, 5, 6, 2)
    assert loop.max_sequence_len == 31 and loop.train.max_fill_batches == 3
    assert (loop.train.guard.action, loop.train.guard.window) == ("stop", 7)


def test_the_actor_config_carries_the_run_config():
    config = load_config(None, ["seed=17", "model.dtype=bfloat16", "rollout.group_size=5", "rollout.top_p=0.9",
                                "rollout.stop=[END]", "rollout.kv_cache_gib=0.5", "rollout.prompts_per_batch=3",
                                "rollout.num_cpus=0", "server.auth_token=abc", "server.tls_ca_path=/ca.pem"])
    actor = config.actor_config(Path("/models/m"))
    assert (actor.hf_dir, actor.seed, actor.dtype) == ("/models/m", 17, "bfloat16")
    assert (actor.group_size, actor.top_p, actor.stop, actor.kv_cache_gib) == (5, 0.9, ["END"], 0.5)
    assert (actor.prompts_per_batch, actor.num_cpus, actor.auth_token, actor.tls_ca_path) == (3, 0, "abc", "/ca.pem")
    assert (actor.lora, actor.lora_versions_kept) == (None, 2)  # full versions; max_staleness 1 by default
    lora = load_config(None, ["model.lora.rank=16", "rollout.max_staleness=3"]).actor_config("/m")
    assert (lora.lora.rank, lora.lora.alpha, lora.lora_versions_kept) == (16, 16.0, 4)  # the η + 1 newest


def test_the_eval_settings_carry_the_run_config():
    config = load_config(None, ["seed=4", "model.dtype=bfloat16", "train.eval_k=3", "train.eval_kv_cache_gib=0.5",
                                "rollout.max_tokens=9", "rollout.temperature=0.7", "rollout.max_model_len=99"])
    assert config.eval_settings() == {"k": 3, "max_tokens": 9, "temperature": 0.7, "max_model_len": 99,
                                      "kv_cache_gib": 0.5, "dtype": "bfloat16", "seed": 4}
    # train.eval_temperature, when set, replaces the sampling temperature for held-out samples only
    assert load_config(None, ["rollout.temperature=1.2", "train.eval_temperature=1.0"]).eval_settings()[
        "temperature"] == 1.0
    defaults = load_config(None).eval_settings()  # what the evaluator had hard-coded
    assert (defaults["kv_cache_gib"], defaults["dtype"]) == (0.25, "float32")


def test_role_configs_have_no_defaults_of_their_own_for_what_the_run_config_supplies():
    from actors.config import ActorConfig
    from learner.schema import RLLoopConfig, ServiceConfig

    config = load_config(None)
    service_fields = {f.name for f in dataclasses.fields(ServiceConfig) if f.default is dataclasses.MISSING}
    assert service_fields == set(dataclasses.asdict(config.service_config(vocab_size=1))) - {
        "max_group_bytes", "weight_chunk_bytes", "max_actors", "max_streams", "max_streams_per_actor",
        "max_weight_streams", "max_weight_streams_per_actor", "max_anonymous_weight_streams", "unary_workers",
        "unary_calls_per_actor", "unverified_unary_calls", "status_workers", "stream_idle_timeout_s", "mode"}
    loop_fields = {f.name for f in dataclasses.fields(RLLoopConfig) if f.default is dataclasses.MISSING}
    assert loop_fields == {"train", "group_size", "max_sequence_len", "publish_every", "loss"}
    own = set(ActorConfig.model_fields) - set(EngineSettings.model_fields)
    assert all(ActorConfig.model_fields[name].is_required() for name in own)


def test_each_rollout_key_is_declared_once_by_the_role_that_reads_it():
    """The run's `rollout` section is the actors' EngineSettings and the service's AdmissionSettings
    (plus the fleet's keys): a new option of either is one field in its class, with its one default."""
    assert issubclass(RolloutConfig, EngineSettings) and issubclass(RolloutConfig, AdmissionSettings)
    assert not set(EngineSettings.model_fields) & set(AdmissionSettings.model_fields)
    config = load_config(None, ["rollout.temperature=0.5", "rollout.lease_seconds=7"])
    assert config.actor_config("/m").temperature == 0.5
    assert config.service_config(vocab_size=None).admission.lease_seconds == 7


def _section_types(section: type = TandemConfig):
    yield section
    fields = (section.model_fields.items() if issubclass(section, BaseModel)
              else ((f.name, f) for f in dataclasses.fields(section)))
    for _, field in fields:
        annotation = getattr(field, "annotation", None) or getattr(field, "type", None)
        if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)):
            yield from _section_types(annotation)


def test_every_key_and_every_section_is_documented():
    keys = documented_keys()
    undocumented = [doc.key for doc in keys if not doc.description.strip()]
    assert not undocumented, undocumented
    assert len(keys) > 80 and len({doc.key for doc in keys}) == len(keys)
    sections = [s for s in _section_types() if issubclass(s, BaseModel)]
    for section in sections:
        missing = [name for name, field in section.model_fields.items() if not field.description]
        assert not missing, f"{section.__name__}: {missing}"
    assert {"algo.dynamic_sampling", "rollout.restart.backoff_s", "train.guard.action", "model.dtype",
            "rewards.functions"} <= {doc.key for doc in keys}


def test_help_lists_keys_with_their_defaults_and_descriptions():
    out = subprocess.run([sys.executable, "launch/rl.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=LIGHT)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("  ") and line.split()}
    for key, default, words in [("train.steps", "(100)", "optimizer steps"),
                                ("algo.algorithm", "(grpo)", "'gspo-token'"),
                                ("rollout.group_size", "(8)", "completions per prompt"),
                                ("train.eval_kv_cache_gib", "(0.25)", "evaluator"),
                                ("model.dtype", "(float32)", "rollout engines")]:
        assert key in lines, f"{key} missing from --help"
        assert default in lines[key] and words in lines[key], lines[key]
    assert "rollout.dtype" not in lines and "mode" not in lines


@pytest.mark.parametrize("key", sorted(REMOVED_KEYS))
def test_a_removed_key_fails_naming_it_and_its_replacement(key, tmp_path):
    with pytest.raises(ConfigError, match=rf"'{key}' was removed: ") as error:
        load_config(None, [f"{key}=x"])
    assert REMOVED_KEYS[key] in str(error.value)
    path = tmp_path / "old.yaml"  # the same from a YAML file
    section, _, last = key.rpartition(".")
    path.write_text(f"{section}:\n  {last}: x\n" if section else f"{last}: x\n")
    with pytest.raises(ConfigError, match=rf"'{key}' was removed"):
        load_config(path)


def test_the_example_configs_load():
    for path in sorted((ROOT / "launch" / "configs").glob("*.yaml")):
        load_config(path)


def test_importing_the_config_loads_neither_jax_nor_tunix():
    probe = ("import launch.config, sys; loaded = [m for m in sys.modules if m.split('.')[0] in ('jax', 'tunix')]; "
             "assert not loaded, loaded")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=LIGHT)
    assert out.returncode == 0, out.stderr[-2000:]
