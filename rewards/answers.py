"""Answer-checking rewards: ``exact_match`` and ``math_answer`` (numeric answer extraction).

Numbers are compared exactly as fractions (``"3.50" == "7/2" == "\\frac{7}{2}"``), so no float
tolerance is needed for the decimal and fractional answers of GSM8K / MATH style datasets.
"""

import re
from fractions import Fraction

from rewards.registry import reward

# A number in running text: optional sign (not when it reads as a binary minus, as in "5-2"),
# thousands separators, optional decimals. The look-behinds keep "x2" and "1.5.2" from yielding
# spurious numbers.
_NUMBER = re.compile(r"(?:(?<![\w).])[-−])?(?<![\w.])(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
_GSM8K_MARKER = re.compile(r"####\s*([^\n]*)")
_FRACTION = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}|^([^/]+)/([^/]+)$")
# LaTeX and currency decorations that do not change a numeric answer.
_DECORATIONS = re.compile(r"\\[,!;: ]|\\%|%|\\\$|\$|\\text\{[^{}]*\}|\\mathrm\{[^{}]*\}|\{,\}|\s")


def _to_fraction(number: str) -> Fraction:
    return Fraction(number.replace("−", "-").replace(",", ""))


def numbers_in(text: str) -> list[Fraction]:
    """Every number in ``text``, in order."""
    return [_to_fraction(match) for match in _NUMBER.findall(text)]


def parse_number(text: str) -> Fraction | None:
    """``text`` read as one number (``"1,234"``, ``"-0.5"``, ``"$12"``, ``"3/4"``, ``"\\frac{3}{4}"``),
    else ``None``."""
    cleaned = _DECORATIONS.sub("", text).rstrip(".")
    fraction = _FRACTION.fullmatch(cleaned)
    if fraction:
        latex = fraction.group(1) is not None
        top, bottom = (parse_number(part) for part in fraction.group(*((1, 2) if latex else (3, 4))))
        return top / bottom if top is not None and bottom else None
    return _to_fraction(cleaned) if _NUMBER.fullmatch(cleaned) else None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces included."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    begin = text.index("{", start) + 1
    depth = 1
    for position in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth == 0:
            return text[begin:position]
    return None


def extract_answer(text: str) -> Fraction | None:
    """The numeric answer of a solution text, by priority: the GSM8K ``#### 42`` line, the last
    ``\\boxed{42}``, else the last number in the text; ``None`` when there is none."""
    for declared in (_last_gsm8k_answer(text), last_boxed(text)):
        if declared is not None:
            exact = parse_number(declared)
            if exact is not None:
                return exact
            found = numbers_in(declared)
            return found[-1] if found else None
    found = numbers_in(text)
    return found[-1] if found else None


def _last_gsm8k_answer(text: str) -> str | None:
    markers = _GSM8K_MARKER.findall(text)
    return markers[-1] if markers else None


def reference_number(answer: object) -> Fraction:
    """The reference answer as a fraction: a number, a number string, or a full GSM8K solution."""
    if isinstance(answer, bool) or not isinstance(answer, (int, float, str, Fraction)):
        raise TypeError(f"reference answer must be a number or a string, got {type(answer).__name__}")
    if isinstance(answer, str):
        number = parse_number(answer)
        number = number if number is not None else extract_answer(answer)
        if number is None:
            raise ValueError(f"reference answer has no number: {answer!r}")
        return number
    return Fraction(str(answer)) if isinstance(answer, float) else Fraction(answer)


@reward("exact_match")
def exact_match(prompt: str, completion: str, *, completion_ids: list[int], metadata: dict) -> float:
    """1 if the stripped completion equals ``metadata["answer"]`` (as a stripped string), else 0."""
    return float(completion.strip() == str(metadata["answer"]).strip())


@reward("math_answer")
def math_answer(prompt: str, completion: str, *, completion_ids: list[int], metadata: dict) -> float:
    """1 if the completion's extracted numeric answer equals ``metadata["answer"]`` exactly, else 0
    (also 0 when the completion contains no number)."""
    expected = reference_number(metadata["answer"])
    return float(extract_answer(completion) == expected)
