"""docs/config.md is the generator's output, and it says where each key is declared.

The page is generated from the config classes (launch/config_doc.py); CI regenerates it with
`make config-doc-check`. This test catches the same drift without git: a field added, renamed or
redocumented without rerunning `python -m launch.config_doc` fails here.
"""

import re

from launch.config import documented_keys
from launch.config_doc import OUTPUT, render, tables


def test_committed_page_is_the_generators_output():
    assert OUTPUT.read_text() == render(), "docs/config.md is stale: run `python -m launch.config_doc`"


def rows() -> dict[str, tuple[str, str, str, str]]:
    """key -> (type, default, description, declared in), parsed back from the page."""
    out = {}
    for line in OUTPUT.read_text().splitlines():
        match = re.match(r"^\| `([^`]+)` \| (.*?) \| `(.*?)` \| (.*?) \| `([^`]+)` \|$", line)
        if match:
            key, type_, default, description, declared = match.groups()
            out[key] = (type_, default, description, declared)
    return out


def test_known_keys_name_their_declaring_class():
    page = rows()
    # The rollout section is one class assembled from three packages' classes.
    assert page["rollout.max_staleness"][3] == "learner.schema:AdmissionSettings"
    assert page["rollout.group_size"][3] == "actors.config:EngineSettings"
    assert page["rollout.num_actors"][3] == "launch.config:RolloutConfig"
    assert page["rollout.restart.backoff_s"][3] == "actors.config:RestartPolicy"
    assert page["data.prompt_field"][3] == "learner.chat_format:ChatFormat"
    assert page["data.answer_field"][3] == "launch.config:DataConfig"
    assert page["train.guard.action"][3] == "learner.guard:GuardConfig"
    assert page["rewards.timeout_s"][3] == "rewards.spec:RewardSpec"
    assert page["rewards.functions"][3] == "launch.config:RewardsConfig"  # redeclared with a default
    assert page["algo.dynamic_sampling"][3] == "learner.schema:LossConfig"  # a dataclass: docstring text
    assert "DAPO" in page["algo.dynamic_sampling"][2]
    assert page["train.prompts_per_step"][:2] == ("int", "16")
    assert page["model.dtype"][0] == '"float32" \\| "bfloat16"'


def test_every_settable_key_is_on_the_page_and_nothing_else():
    page = rows()
    settable = {doc.key for doc in documented_keys()}
    assert settable <= set(page)
    assert {key for key in page if "[]" not in key} == settable


def test_missing_descriptions_stay_empty():
    """No text is made up: a field without a description gets an empty cell."""
    page = rows()
    assert page["rewards.functions[].weight"][2] == ""
    assert all(table.rows for table in tables())
