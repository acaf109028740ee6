"""How a data row's prompt becomes chat messages: the prompt column through a template, after an
optional system prompt. One helper for the RL/eval prompts (launch.prompts) and SFT prompt/completion
rows (learner.data); the run config's `data` section extends `ChatFormat`, so each setting is declared
and documented once. Light to import (pydantic only), as launch.config needs it.
"""

from __future__ import annotations

import string

from pydantic import Field, field_validator

from learner.schema import Section


def check_prompt_template(template: str) -> str:
    """``template`` if it is a format string whose only field is ``{prompt}`` (used at least once)."""
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as error:
        raise ValueError(f"data.prompt_template {template!r} is not a valid format string ({error}); "
                         "write literal braces as {{ and }}") from None
    others = sorted(set(fields) - {"prompt"})
    if others or "prompt" not in fields:
        found = (f"has other fields {['{' + f + '}' for f in others]} (write literal braces as {{{{ and }}}})"
                 if others else "has no {prompt}")
        raise ValueError(f"data.prompt_template {template!r} must contain the {{prompt}} placeholder and no "
                         f"other field; it {found}")
    try:
        template.format(prompt="")  # a field inside a format spec, a bad conversion, ...
    except (ValueError, KeyError, IndexError) as error:
        raise ValueError(f"data.prompt_template {template!r} is not a valid format string ({error!r})") from None
    return template


class ChatFormat(Section):
    """The columns of a data row and how its prompt is put to the model as a chat."""

    prompt_field: str = Field("prompt", min_length=1, description="column holding the user text (rl and eval "
                                                                  "rows, sft prompt/completion rows)")
    completion_field: str = Field("completion", min_length=1, description="sft: column holding the assistant "
                                                                          "reply of prompt/completion rows "
                                                                          "(used when the rows have no "
                                                                          "`messages`)")
    system_prompt: str | None = Field(None, description="a system message before the user turn (rl, eval, sft "
                                                        "prompt/completion rows); the model's chat template "
                                                        "must accept a system role")
    prompt_template: str = Field("{prompt}", description="Python format string making the user message from "
                                                         "the prompt column, e.g. '{prompt}\\nGive the final "
                                                         "answer after ####.'; {prompt} is its only field")

    @field_validator("prompt_template")
    @classmethod
    def _valid_template(cls, template: str) -> str:
        return check_prompt_template(template)

    def prompt_messages(self, prompt: str) -> list[dict[str, str]]:
        """``[system?, user(template(prompt))]``: what the model sees before its answer."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        return [*system, {"role": "user", "content": self.prompt_template.format(prompt=prompt)}]
