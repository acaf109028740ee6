"""What one rollout actor needs to know; launch/ fills it from the run config (actors never import launch)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ActorConfig(BaseModel):
    """Engine, sampling and pacing settings shared by every actor of a fleet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hf_dir: str = Field(description="HF model dir the engine starts from (weight version 0)")
    group_size: int = Field(8, ge=1, description="completions per prompt (G)")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(16, ge=1)
    stop: list[str] = []
    stop_token_ids: list[int] = []
    max_prompt_tokens: int = Field(48, ge=1, description="longer prompts are rejected, not sampled")
    max_model_len: int = Field(128, ge=2)
    kv_cache_gib: float = Field(1.0, gt=0)
    dtype: str = "float32"
    seed: int = 0
    prompts_per_batch: int = Field(4, ge=1, description="prompts leased and sampled per engine call")
    idle_poll_s: float = Field(0.2, gt=0, description="wait when the learner has no prompt to lease")
    weight_retry_s: float = Field(5.0, ge=0, description="wait before re-fetching a failed transfer")
    auth_token: str | None = None
    num_cpus: float = Field(1.0, ge=0, description="Ray CPUs per actor (plus one 'rollout' resource)")
    sync: bool = Field(False, description="synchronous RL: sample one batch per weight version, then "
                                          "wait for the next (use with max_staleness=0; see "
                                          "actors/rollout_actor.py)")
