"""The environment of docs/environments.md, taken from the page as written, for tests that run it."""

from __future__ import annotations

import re
from pathlib import Path

from rewards.spec import EnvironmentSpec, RewardSpec, WeightedReward

PAGE = Path(__file__).resolve().parents[1] / "docs" / "environments.md"


def page_calculator_spec(tmp_path: Path, monkeypatch) -> RewardSpec:
    """The page's first code block written as the importable module `page_envs`, and a RewardSpec that
    imports it and plays its `calculator`."""
    code = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL).group(1)
    (tmp_path / "page_envs.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    return RewardSpec(functions=[WeightedReward(ref="exact_match")], imports=["page_envs"],
                      environment=EnvironmentSpec(ref="calculator"))
