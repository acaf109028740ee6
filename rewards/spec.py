"""Configuration of a reward: weighted functions, an optional environment and the per-call timeout."""

import pydantic

from tandem_wire.limits import MAX_TURNS


class WeightedReward(pydantic.BaseModel):
    """One component of the combined reward."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    ref: str = pydantic.Field(description="registered name or 'package.module:function'")
    weight: float = 1.0
    name: str | None = pydantic.Field(None, description="name in reasons and stats; default from ref")
    kwargs: dict = pydantic.Field(default_factory=dict, description="extra keyword arguments of the function")

    @property
    def component_name(self) -> str:
        return self.name or self.ref.rpartition(":")[2]


class EnvironmentSpec(pydantic.BaseModel):
    """A multi-turn environment (rewards.environments): its class, settings and the episode's limits."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    ref: str = pydantic.Field(description="registered name (e.g. answer_retry) or 'package.module:Class'")
    kwargs: dict = pydantic.Field(default_factory=dict, description="keyword arguments of the class")
    max_turns: int = pydantic.Field(4, ge=1, le=MAX_TURNS, description="assistant turns per episode at most")
    max_total_tokens: int = pydantic.Field(256, ge=1, description="tokens after the prompt at most, sampled "
                                                                  "and observation; the learner's rows fit "
                                                                  "prompt + this")
    max_tool_errors: int | None = pydantic.Field(None, ge=0, description="end an episode once its tool errors "
                                                                         "exceed this (0: at the first); None: "
                                                                         "no limit")
    tools: list[dict] | None = pydantic.Field(
        None, description="tool schemas given to the chat template's tools= wherever a conversation is rendered "
                          "(the learner's prompts, the actors' turns, evaluation); None: the environment's own "
                          "(a ToolEnvironment's `tools`), []: none")


class RewardSpec(pydantic.BaseModel):
    """Reward = sum of weight * component; unscorable if any component is. With an environment, a
    trajectory's reward is the sum of its steps' rewards instead (the functions are not called)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    functions: list[WeightedReward] = pydantic.Field(min_length=1)
    timeout_s: float = pydantic.Field(10.0, gt=0, description="limit of one reward call")
    imports: list[str] = pydantic.Field(
        default_factory=list, description="modules imported first, so that their @reward and @environment "
                                          "names resolve")
    environment: EnvironmentSpec | None = pydantic.Field(
        None, description="multi-turn episodes: the environment answers each assistant turn and rewards it")

    @pydantic.model_validator(mode="after")
    def _names_are_unique(self) -> "RewardSpec":
        names = [function.component_name for function in self.functions]
        if len(set(names)) != len(names):
            raise ValueError(f"reward component names must be unique, got {names}; set 'name'")
        return self
