"""What one rollout actor needs to know; launch/ fills it from the run config (actors never import launch)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from models.peft import LoraConfig
from rewards.spec import EnvironmentSpec

FLEET_NAME = "tandem-fleet"  # the Ray name of a run's detached fleet (rollout.fleet_name)
FLEET_NAMESPACE = "tandem"

# Environment of every process that runs a vLLM engine (rollout actors, the evaluator, Ray workers a
# job starts): the engine lives in the process itself (fast start, weight arrays passed without
# copies), tokenizers use no thread pool, and vLLM's CPU worker, which repeats the same warnings on
# every engine start and weight update, shows errors only (VLLM_LOGGING_LEVEL=WARNING brings them
# back). Ray merges it with the job's env_vars (e.g. VLLM_CPU_KVCACHE_SPACE).
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "ERROR",
}


class EngineSettings(BaseModel):
    """The actors' engine, sampling and pacing settings: the run config's `rollout.*` keys that the
    actors read, declared here once (launch.config.RolloutConfig extends this class with the learner's
    and the fleet's keys). A new actor option is one field here plus its use in actors/."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group_size: int = Field(8, ge=1, description="completions per prompt (G)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (also the learner's logits)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    max_tokens: int = Field(16, ge=1, description="completion tokens at most")
    stop: list[str] = Field([], description="stop strings")
    stop_token_ids: list[int] = Field([], description="stop token ids")
    max_prompt_tokens: int = Field(48, ge=1, description="longer prompts are rejected, not sampled")
    max_model_len: int = Field(128, ge=2, description="the engines' context length")
    kv_cache_gib: float = Field(1.0, gt=0, description="KV cache of each actor's vLLM engine")
    prompts_per_batch: int = Field(4, ge=1, description="groups an actor samples at once (async: kept in flight, "
                                                       "freed room leased again; sync: one batch per version)")
    idle_poll_s: float = Field(0.2, gt=0, description="wait when the learner has no prompt to lease and sends "
                                                     "no retry hint")
    weight_retry_s: float = Field(5.0, ge=0, description="wait before re-fetching a failed transfer")
    weight_update: Literal["keep", "abort"] = Field(
        "abort", description="async, full weights: how a new version meets the groups in flight. keep: they "
                             "continue on it (vLLM's pause in keep mode; their KV recomputed; each token carries "
                             "the version that sampled it); abort: they drain for weight_drain_steps engine "
                             "steps, then the rest is aborted and sampled again on it (docs/design.md)")
    weight_drain_steps: int = Field(64, ge=0, description="async, weight_update=abort: engine steps a new weight "
                                                         "version waits for the groups in flight to finish before "
                                                         "it aborts the rest (sampled again on the new weights)")
    weight_relay: bool = Field(True, description="relay the weight versions this actor streams to the actors the "
                                                 "learner sends to it, so the learner sends each version once "
                                                 "(server.weight_relay_fanout; off for a TLS learner)")
    num_cpus: float = Field(1.0, ge=0, description="Ray CPUs per actor (plus one 'rollout' resource)")
    sync: bool = Field(False, description="synchronous RL: sample one batch per weight version, then wait for "
                                          "the next (needs max_staleness=0; see actors/rollout_actor.py)")


class ActorConfig(EngineSettings):
    """What one rollout actor runs: the run's engine settings plus what only the run knows, all
    derived by launch.config.TandemConfig.actor_config."""

    hf_dir: str = Field(description="HF model dir the engine starts from (weight version 0)")
    dtype: str = Field(description="engine dtype (model.dtype)")
    seed: int = Field(description="sampling seed (the run's seed)")
    auth_token: str | None = Field(description="the run's shared token (server.auth_token)")
    tls_ca_path: str | None = Field(description="CA certificate of a TLS learner (server.tls_ca_path; None: "
                                                "plaintext)")
    environment: EnvironmentSpec | None = Field(description="multi-turn episodes (rewards.environment; "
                                                                  "None: one completion per sample)")
    lora: LoraConfig | None = Field(description="the run's LoRA (model.lora): its weight versions are adapters, "
                                                "served over hf_dir's base (None: full weights)")
    lora_versions_kept: int = Field(ge=1, description="adapter versions an actor keeps loaded: rollout.max_staleness "
                                                      "+ 1, the versions whose groups the learner still takes")


class RestartPolicy(BaseModel):
    """How a fleet replaces actors that keep failing: the first death of an actor is replaced at once;
    each further death of its replacements within ``stable_after_s`` of their start (a crash loop: bad
    node, bad weights, out of memory at start) waits ``backoff_s`` doubling up to ``backoff_max_s``;
    after ``max_quick_failures`` such deaths in a row the fleet gives that slot up and says why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backoff_s: float = Field(2.0, ge=0, description="wait before the second quick restart; doubles after")
    backoff_max_s: float = Field(60.0, ge=0, description="longest wait before a quick restart")
    stable_after_s: float = Field(300.0, ge=0, description="an actor that lived this long resets the count")
    max_quick_failures: int = Field(5, ge=1, description="quick deaths in a row before a slot is given up")

    def delay_s(self, failures: int) -> float | None:
        """Wait before replacing the ``failures``-th quick death in a row; None: give the slot up."""
        if failures > self.max_quick_failures:
            return None
        return 0.0 if failures <= 1 else min(self.backoff_max_s, self.backoff_s * 2 ** (failures - 2))
