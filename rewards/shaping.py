"""Shaping rewards: ``format_regex``, ``soft_overlong_penalty`` (DAPO) and ``length_penalty`` (Kimi k1.5)."""

import re

from rewards.registry import info, resolve, reward


@reward("format_regex")
def format_regex(
    prompt: str, completion: str, *, completion_ids: list[int], metadata: dict, pattern: str | None = None
) -> float:
    """1 if ``re.search(pattern, completion, re.DOTALL)`` matches, else 0.

    The pattern comes from ``metadata["format_pattern"]`` (per prompt) or else the ``pattern``
    setting; anchor it with ``^...$`` to demand a full match.
    """
    pattern = metadata.get("format_pattern", pattern)
    if pattern is None:
        raise ValueError("format_regex needs a pattern: metadata['format_pattern'] or the 'pattern' setting")
    return float(re.search(pattern, completion, re.DOTALL) is not None)


def soft_overlong_penalty(length: int, max_length: int, cache_length: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), with L_max = ``max_length`` and
    L_cache = ``cache_length``::

        R(y) = 0                                  if |y| <= L_max - L_cache
             = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
             = -1                                 if L_max < |y|
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(f"need 0 < cache_length <= max_length, got {cache_length=} {max_length=}")
    if length <= max_length - cache_length:
        return 0.0
    if length <= max_length:
        return ((max_length - cache_length) - length) / cache_length
    return -1.0


@reward("soft_overlong_penalty")
def soft_overlong_reward(
    prompt: str,
    completion: str,
    *,
    completion_ids: list[int],
    metadata: dict,
    max_length: int | None = None,
    cache_length: int | None = None,
) -> float:
    """:func:`soft_overlong_penalty` of the completion's token count; ``max_length`` and
    ``cache_length`` come from the metadata (per prompt; strings allowed, as the wire carries
    them) or else the settings."""
    max_length = metadata.get("max_length", max_length)
    cache_length = metadata.get("cache_length", cache_length)
    if max_length is None or cache_length is None:
        raise ValueError("soft_overlong_penalty needs max_length and cache_length (metadata or settings)")
    return soft_overlong_penalty(len(completion_ids), int(max_length), int(cache_length))


@reward("length_penalty", batched=True)
def length_penalty(
    prompts: list[str],
    completions: list[str],
    *,
    completion_ids: list[list[int]],
    metadata: list[dict],
    correctness: str = "math_answer",
) -> list[float]:
    """Kimi k1.5's length reward over a group (Kimi Team 2025, sec. 2.3.3)::

        lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len)
        reward_i = lambda_i if correct_i else min(0, lambda_i)

    with lengths in tokens over the group; 0 for all when every completion has the same length.
    ``correctness`` is a per-completion reward (registered name or ``module:function``) whose value
    1 marks a correct completion.
    """
    is_correct = resolve(correctness)
    how = info(is_correct, correctness)
    if how.batched or how.is_async:
        raise ValueError(f"length_penalty needs a plain per-completion correctness reward: {correctness!r}")
    lengths = [len(ids) for ids in completion_ids]
    shortest, longest = min(lengths), max(lengths)
    rewards = []
    for prompt, completion, ids, meta, length in zip(
            prompts, completions, completion_ids, metadata, lengths, strict=True):
        correct = is_correct(prompt, completion, completion_ids=ids, metadata=meta)
        if correct is None:
            raise ValueError(f"correctness reward {correctness!r} returned None")
        scale = 0.5 - (length - shortest) / (longest - shortest) if longest > shortest else 0.0
        rewards.append(scale if correct >= 1.0 else min(0.0, scale))
    return rewards
