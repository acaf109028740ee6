"""tandem rewards: reward functions, their registry, and the isolated Ray worker pool.

Light on import (standard library only); the Ray pool lives in :mod:`rewards.pool`.
"""

from rewards.registry import resolve, reward
from rewards.shaping import soft_overlong_penalty
from rewards.types import ScoreResult

__all__ = ["ScoreResult", "resolve", "reward", "soft_overlong_penalty"]
