"""Configuration of a reward: weighted functions and the per-call timeout."""

import pydantic


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


class RewardSpec(pydantic.BaseModel):
    """Reward = sum of weight * component; unscorable if any component is."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    functions: list[WeightedReward] = pydantic.Field(min_length=1)
    timeout_s: float = pydantic.Field(10.0, gt=0, description="limit of one reward call")
    imports: list[str] = pydantic.Field(
        default_factory=list, description="modules imported first, so that their @reward names resolve")

    @pydantic.model_validator(mode="after")
    def _names_are_unique(self) -> "RewardSpec":
        names = [function.component_name for function in self.functions]
        if len(set(names)) != len(names):
            raise ValueError(f"reward component names must be unique, got {names}; set 'name'")
        return self
