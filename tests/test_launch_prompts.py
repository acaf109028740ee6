"""RL/eval prompts from data as it comes: GSM8K's `question`/`answer` columns, a system prompt and an
instruction template, through a real ChatML tokenizer, scored by the real math_answer reward."""

import json

import pytest
from transformers import AutoTokenizer

from launch.config import ConfigError, DataConfig, load_config
from launch.prompts import chat_prompt_rows
from models.tokenizer import IM_END_ID, IM_START_ID, build_char_tokenizer, build_chatml_tokenizer
from rewards import resolve

GSM8K = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
               "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"},
    {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
                 "How much did she earn?",
     "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
               "Working 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"},
]
SYSTEM = "You are a careful math tutor."
TEMPLATE = "{prompt}\nGive the final answer after ####."
GSM8K_DATA = ["data.prompt_field=question", f"data.system_prompt={SYSTEM}",
              f"data.prompt_template={json.dumps(TEMPLATE)}"]


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    out = tmp_path_factory.mktemp("chatml")
    build_chatml_tokenizer(out)
    return AutoTokenizer.from_pretrained(out)


@pytest.fixture()
def gsm8k_file(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in GSM8K))
    return str(path)


def test_gsm8k_rows_as_they_come_become_chatml_prompts_with_system_and_template(chatml, gsm8k_file):
    data = load_config(None, GSM8K_DATA).data
    assert (data.prompt_field, data.answer_field, data.system_prompt, data.prompt_template) == (
        "question", "answer", SYSTEM, TEMPLATE)
    prompts = chat_prompt_rows(gsm8k_file, chatml, data)
    assert len(prompts) == 2
    for prompt, row in zip(prompts, GSM8K, strict=True):
        user = row["question"] + "\nGive the final answer after ####."
        assert prompt.text == user
        rendered = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                    "<|im_start|>assistant\n")
        assert chatml.decode(prompt.prompt_ids) == rendered
        assert prompt.prompt_ids == chatml.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
            add_generation_prompt=True, return_dict=False)
        # byte-level: one token per UTF-8 byte of the text, one per special (3 <|im_start|>, 2 <|im_end|>)
        specials = 3 * len("<|im_start|>") + 2 * len("<|im_end|>")
        assert len(prompt.prompt_ids) == len(rendered.encode()) - specials + 5
        assert prompt.prompt_ids.count(IM_START_ID) == 3 and prompt.prompt_ids.count(IM_END_ID) == 2
        assert prompt.metadata == {"answer": row["answer"]}  # the question is the prompt, not metadata


def test_the_gsm8k_answer_reaches_math_answer_and_scores_the_final_number(chatml, gsm8k_file):
    first, second = chat_prompt_rows(gsm8k_file, chatml, load_config(None, GSM8K_DATA).data)
    math_answer = resolve("math_answer")

    def score(prompt, completion):
        return math_answer(prompt.text, completion, completion_ids=chatml.encode(completion),
                           metadata=prompt.metadata)

    assert score(first, "She sold 24 in May, so 48 + 24 = 72 in all.\n#### 72") == 1.0
    assert score(first, "She sold 23 in May, so 48 + 23 = 71 in all.\n#### 71") == 0.0
    assert score(first, "48 + 24 = 72 clips") == 1.0  # no marker: the last number
    assert score(second, "0.2 x 50 = 10\n#### $10.00") == 1.0
    assert score(second, "#### 0.2") == 0.0


def test_the_answer_column_is_metadata_answer_whatever_it_is_called(chatml, tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text(json.dumps({"problem": "1+1", "solution": "\\boxed{2}", "level": 1, "answer": "ignored"}) + "\n")
    data = DataConfig(prompt_field="problem", answer_field="solution")
    (prompt,) = chat_prompt_rows(str(path), chatml, data)
    assert prompt.metadata == {"solution": "\\boxed{2}", "level": "1", "answer": "\\boxed{2}"}
    assert prompt.text == "1+1"  # the default template is the column itself, and no system message
    assert chatml.decode(prompt.prompt_ids) == "<|im_start|>user\n1+1<|im_end|>\n<|im_start|>assistant\n"
    assert resolve("math_answer")("1+1", "#### 2", completion_ids=[], metadata=prompt.metadata) == 1.0


def test_missing_columns_fail_naming_the_key_and_the_columns(chatml, gsm8k_file):
    with pytest.raises(ConfigError, match=r"data\.prompt_field='prompt'.*\['question', 'answer'\]"):
        chat_prompt_rows(gsm8k_file, chatml)  # GSM8K without prompt_field: question
    with pytest.raises(ConfigError, match=r"data\.answer_field='final'.*\['question', 'answer'\]"):
        chat_prompt_rows(gsm8k_file, chatml, DataConfig(prompt_field="question", answer_field="final"))


def test_a_system_prompt_on_a_template_without_a_system_role_fails_clearly(tmp_path, gsm8k_file):
    build_char_tokenizer(tmp_path / "char", alphabet="abcdefghijklmnopqrstuvwxyz0123456789 ")
    char = AutoTokenizer.from_pretrained(tmp_path / "char")
    with pytest.raises(ConfigError, match=r"cannot render roles \['system', 'user'\].*system_prompt needs a chat "
                                          r"template with a system role"):
        chat_prompt_rows(gsm8k_file, char, DataConfig(prompt_field="question", system_prompt="be brief"))


def test_raw_prompts_are_the_column_as_a_document_begins_without_template_or_system(tmp_path):
    build_char_tokenizer(tmp_path / "char")
    char = AutoTokenizer.from_pretrained(tmp_path / "char")
    path = tmp_path / "raw.jsonl"
    path.write_text(json.dumps({"prompt": "579-123=", "answer": "456"}) + "\n")
    data = DataConfig(system_prompt="ignored", prompt_template="q: {prompt}")
    for config in (None, data):
        (prompt,) = chat_prompt_rows(str(path), char, config, prompt_format="raw")
        assert char.decode(prompt.prompt_ids) == "<bos>579-123="
        assert (prompt.text, prompt.metadata) == ("579-123=", {"answer": "456"})
    (chat,) = chat_prompt_rows(str(path), char)  # the demo's chat prompts are unchanged by default
    assert char.decode(chat.prompt_ids) == "<bos><user>579-123=<asst>" and chat.text == "579-123="
