"""Built-in rewards and the registry, called directly (no Ray, no child process)."""

import sys
import textwrap
from fractions import Fraction

import pytest

from rewards import resolve, reward, soft_overlong_penalty
from rewards.answers import extract_answer, parse_number
from rewards.registry import info


def call(ref: str, completion: str, metadata: dict, ids: list[int] | None = None, **kwargs):
    return resolve(ref)("prompt", completion, completion_ids=ids or [], metadata=metadata, **kwargs)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", Fraction(72)),
        ("#### 1,234 dollars", Fraction(1234)),
        ("GSM8K marker wins over a later number: #### 5\nthen 7", Fraction(5)),
        (r"so the answer is $\boxed{42}$.", Fraction(42)),
        (r"\boxed{\frac{1}{2}} and later 9", Fraction(1, 2)),
        (r"first \boxed{3}, then \boxed{-2.5}", Fraction(-5, 2)),
        (r"\boxed{x = 4}", Fraction(4)),
        (r"\boxed{\$12.50}", Fraction(25, 2)),
        ("3 apples and 4 pears make 7.", Fraction(7)),
        ("The temperature dropped to -15 degrees", Fraction(-15)),
        ("(-3)", Fraction(-3)),
        ("5-2 = 3", Fraction(3)),
        ("pi is about 3.14", Fraction(314, 100)),
        ("it costs 0.50", Fraction(1, 2)),
        ("a total of 1,000,000 people", Fraction(1_000_000)),
        ("the numbers 1,2,3", Fraction(3)),
        ("no digits here", None),
        ("variable x2 is not a number", None),
        (r"\boxed{seven}", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_parse_number_reads_whole_answers_only():
    assert parse_number("3/4") == Fraction(3, 4)
    assert parse_number(r"\dfrac{6}{8}") == Fraction(3, 4)
    assert parse_number("$1,000") == 1000
    assert parse_number("−7") == -7  # unicode minus
    assert parse_number("1/0") is None
    assert parse_number("7 apples") is None


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("... #### 72", "Natalia sold ... 48+24 = 72\n#### 72", 1.0),  # GSM8K solution as reference
        # GSM8K's own answers, calculator annotations included: the number after #### is the reference
        ("48/2 = 24, 48+24 = 72\n#### 72", "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                                              "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72", 1.0),
        ("48/2 = 23, 48+23 = 71\n#### 71", "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                                              "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72", 0.0),
        (r"\boxed{0.5}", "1/2", 1.0),
        ("the answer is 3.50", 3.5, 1.0),
        ("the answer is 3", 3.5, 0.0),
        ("I have no idea", "4", 0.0),
        ("the answer is -4", 4, 0.0),
        ("the answer is 1,024", 1024, 1.0),
    ],
)
def test_math_answer(completion, answer, expected):
    assert call("math_answer", completion, {"answer": answer}) == expected


def test_math_answer_rejects_a_reference_without_a_number():
    with pytest.raises(ValueError, match="no number"):
        call("math_answer", "42", {"answer": "forty-two"})
    with pytest.raises(KeyError):
        call("math_answer", "42", {})


def test_exact_match_strips_whitespace():
    assert call("exact_match", "  579\n", {"answer": "579"}) == 1.0
    assert call("exact_match", "579", {"answer": 579}) == 1.0
    assert call("exact_match", "5790", {"answer": "579"}) == 0.0


def test_format_regex_pattern_from_settings_or_metadata():
    pattern = r"^<think>.*</think>\s*<answer>.*</answer>$"
    good, bad = "<think>a\nb</think> <answer>4</answer>", "<answer>4</answer>"
    assert call("format_regex", good, {}, pattern=pattern) == 1.0
    assert call("format_regex", bad, {}, pattern=pattern) == 0.0
    assert call("format_regex", "abc123", {"format_pattern": r"\d+$"}, pattern="never") == 1.0
    with pytest.raises(ValueError, match="pattern"):
        call("format_regex", good, {})


def dapo_reference(length: int, max_length: int, cache_length: int) -> float:
    """verl's DAPO implementation (responses never exceed max_length there)."""
    exceed = length - (max_length - cache_length)
    return min(-exceed / cache_length, 0.0)


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (15, 0.0), (16, 0.0), (17, -0.25), (18, -0.5), (19, -0.75), (20, -1.0), (21, -1.0),
     (400, -1.0)],
)
def test_soft_overlong_penalty_boundaries(length, expected):
    assert soft_overlong_penalty(length, max_length=20, cache_length=4) == expected
    if length <= 20:
        assert soft_overlong_penalty(length, 20, 4) == pytest.approx(dapo_reference(length, 20, 4))
    ids = [0] * length
    assert call("soft_overlong_penalty", "x", {}, ids=ids, max_length=20, cache_length=4) == expected
    per_prompt = {"max_length": "20", "cache_length": "4"}  # strings, as the wire's metadata carries them
    assert call("soft_overlong_penalty", "x", per_prompt, ids=ids, max_length=99, cache_length=1) == expected


def test_soft_overlong_penalty_rejects_bad_parameters():
    for cache_length in (0, 21):
        with pytest.raises(ValueError, match="cache_length"):
            soft_overlong_penalty(5, max_length=20, cache_length=cache_length)
    with pytest.raises(ValueError, match="max_length"):
        call("soft_overlong_penalty", "x", {}, ids=[1])


def test_length_penalty_follows_kimi_over_the_group():
    fn = resolve("length_penalty")
    assert info(fn, "length_penalty").batched
    completions = ["a", "b", "a", "b"]
    ids = [[0] * 2, [0] * 4, [0] * 6, [0] * 3]
    metadata = [{"answer": "a"}] * 4
    rewards = fn(["p"] * 4, completions, completion_ids=ids, metadata=metadata, correctness="exact_match")
    # lambda = 0.5 - (len - 2) / (6 - 2): 0.5, 0, -0.5, 0.25; wrong answers get min(0, lambda)
    assert rewards == [0.5, 0.0, -0.5, 0.0]
    same_length = fn(["p"] * 2, ["a", "b"], completion_ids=[[1], [2]], metadata=metadata[:2],
                     correctness="exact_match")
    assert same_length == [0.0, 0.0]


def test_registry_names_functions_and_module_references(tmp_path, monkeypatch):
    module = tmp_path / "my_rewards_module.py"
    module.write_text(textwrap.dedent("""
        from rewards import reward

        def plain(prompt, completion, *, completion_ids, metadata):
            return float(len(completion_ids))

        @reward("my_registered_batch", batched=True)
        async def batch(prompts, completions, *, completion_ids, metadata):
            return [1.0] * len(completions)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    plain = resolve("my_rewards_module:plain")
    assert plain("p", "c", completion_ids=[1, 2], metadata={}) == 2.0
    assert not info(plain, "plain").batched
    batch = resolve("my_rewards_module:batch")
    assert resolve("my_registered_batch") is batch
    assert info(batch, "x").batched and info(batch, "x").is_async
    with pytest.raises(ValueError, match="unknown reward 'no_such_reward'.*exact_match"):
        resolve("no_such_reward")
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        resolve("my_rewards_module:missing")
    with pytest.raises(ModuleNotFoundError):
        resolve("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="already registered"):
        reward("exact_match")(lambda *a, **k: 0.0)
    sys.modules.pop("my_rewards_module")
