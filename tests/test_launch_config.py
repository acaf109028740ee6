"""Typed config: YAML + key=value overrides; unknown keys and bad values fail naming the key."""

import json
from pathlib import Path

import pytest

from launch.arithmetic import make_arithmetic_data
from launch.config import ConfigError, load_config
from launch.run import prepare


def test_yaml_and_overrides_are_applied(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\ntrain:\n  steps: 7\nrollout:\n  group_size: 4\n")
    config = load_config(path, ["train.steps=9", "algo.beta=0.04", "rewards.functions=[{ref: math_answer}]"])
    assert config.seed == 3
    assert config.train.steps == 9
    assert config.rollout.group_size == 4
    assert config.algo.beta == pytest.approx(0.04)
    assert [f.ref for f in config.rewards.functions] == ["math_answer"]


def test_words_that_yaml_1_1_reads_as_booleans_stay_words(tmp_path):
    config = load_config(None, ["algo.dynamic_sampling=off", "train.skip_no_signal=false"])
    assert config.algo.dynamic_sampling == "off" and config.train.skip_no_signal is False
    assert load_config(None, ["algo.dynamic_sampling=fill"]).algo.dynamic_sampling == "fill"
    path = tmp_path / "c.yaml"
    path.write_text("algo:\n  dynamic_sampling: off\ntrain:\n  skip_no_signal: no\n")
    config = load_config(path)
    assert config.algo.dynamic_sampling == "off" and config.train.skip_no_signal is False  # a bool field: pydantic


def test_remat_is_a_policy_and_the_former_booleans_still_load(tmp_path):
    for value, policy in (("true", "full"), ("false", "none"), ("save_matmuls", "save_matmuls"), ("none", "none")):
        assert load_config(None, [f"train.remat={value}"]).train.remat == policy
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  remat: yes\n  attention: splash\n  float32_logits: true\n")
    train = load_config(path).train
    assert (train.remat, train.attention, train.float32_logits) == ("full", "splash", True)
    with pytest.raises(ConfigError, match="'none', 'full' or 'save_matmuls'"):
        load_config(None, ["train.remat=everything"])
    with pytest.raises(ConfigError, match="'train.attention'"):
        load_config(None, ["train.attention=cudnn"])


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"unknown key 'train.stepz'"):
        load_config(None, ["train.stepz=3"])


def test_bad_choice_names_key_and_allowed_values():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["algo.algorithm=ppo"])
    message = str(error.value)
    assert "'algo.algorithm'" in message
    assert "'grpo'" in message and "'gspo-token'" in message


def test_bad_number_is_rejected():
    with pytest.raises(ConfigError, match=r"'train.steps'"):
        load_config(None, ["train.steps=0"])


def test_an_advantage_rule_is_resolved_at_load():
    with pytest.raises(ConfigError, match="unknown advantage 'per_turn'"):
        load_config(None, ["algo.advantage=per_turn"])
    with pytest.raises(ConfigError, match="sequence ratio takes one per sequence"):
        load_config(None, ["algo.algorithm=gspo", "algo.advantage=reward_to_go"])
    assert load_config(None, ["algo.advantage=reward_to_go"]).algo.advantage == "reward_to_go"


def test_override_must_be_assignment():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["train.steps"])


def test_auth_token_comes_from_environment(monkeypatch):
    monkeypatch.setenv("TANDEM_AUTH_TOKEN", "s3cret")
    assert load_config(None).server.auth_token == "s3cret"


def test_arithmetic_heldout_is_excluded_from_every_stage(tmp_path):
    paths = make_arithmetic_data(tmp_path, pretrain_lines=3000, sft_examples=2000, rl_prompts=2000, heldout=100)
    rows = {split: [json.loads(line) for line in path.read_text().splitlines()] for split, path in paths.items()}

    def pair(question: str) -> frozenset[int]:
        return frozenset(int(x) for x in question.replace("=", "").replace("+", "-").split("-"))

    held = {pair(r["prompt"]) for split in ("heldout", "heldout_addition", "heldout_raw") for r in rows[split]}
    assert len({pair(r["prompt"]) for r in rows["heldout"]}) == 100
    assert len({pair(r["prompt"]) for r in rows["heldout_addition"]}) == 100
    sft_chats = [r for r in rows["sft"] if "messages" in r]
    sft_replayed = [r for r in rows["sft"] if "text" in r]
    assert len(sft_chats) + len(sft_replayed) == 2000 and 0.4 < len(sft_replayed) / 2000 < 0.6
    trained = ({pair(r["text"].split("=")[0]) for r in rows["pretrain"] + sft_replayed}
               | {pair(r["messages"][0]["content"]) for r in sft_chats} | {pair(r["prompt"]) for r in rows["rl"]})
    assert not held & trained  # neither operation of a held-out pair is ever trained on
    # the RL task and its held-out set are chat-format differences; SFT's chats show sums only, its
    # replayed plain-text lines both operations, as pretraining's do
    for r in rows["rl"][:50] + rows["heldout"][:50]:
        a, b = r["prompt"].split("-")
        assert int(a) >= int(b) and int(r["answer"]) == int(a) - int(b)
    assert all("+" in r["messages"][0]["content"] for r in sft_chats)
    assert 0.3 < sum("-" in r["text"] for r in sft_replayed) / len(sft_replayed) < 0.7
    assert [r["prompt"] + "=" for r in rows["heldout"]] == [r["prompt"] for r in rows["heldout_raw"]]
    assert 0.4 < sum("-" in r["text"] for r in rows["pretrain"]) / len(rows["pretrain"]) < 0.6


def test_sync_rollout_requires_matching_batch_and_no_staleness():
    with pytest.raises(ConfigError, match="rollout.sync needs"):
        load_config(None, ["rollout.sync=true"])
    config = load_config(None, ["rollout.sync=true", "rollout.max_staleness=0", "rollout.num_actors=2",
                                "rollout.prompts_per_batch=8", "train.prompts_per_step=16"])
    assert config.rollout.sync


def test_schedule_spans_the_run_unless_set():
    assert load_config(None, ["train.steps=40"]).optim.total_steps == 40
    assert load_config(None, ["train.steps=40", "optim.total_steps=100"]).optim.total_steps == 100


def test_actors_get_the_run_token_and_the_learner_ca():
    config = load_config(None, ["server.auth_token=t0k", "server.tls_ca_path=/etc/tandem/ca.pem"])
    actor = config.actor_config("/models/x")
    assert (actor.hf_dir, actor.auth_token, actor.tls_ca_path) == ("/models/x", "t0k", "/etc/tandem/ca.pem")


def test_data_columns_system_prompt_and_template_are_read_and_listed_in_help(tmp_path):
    from launch.config import config_help

    path = tmp_path / "c.yaml"
    path.write_text('data:\n  prompt_field: question\n  answer_field: final\n  completion_field: solution\n'
                    '  system_prompt: "Be exact."\n  prompt_template: "{prompt}\\nAnswer after ####."\n')
    data = load_config(path).data
    assert (data.prompt_field, data.answer_field, data.completion_field) == ("question", "final", "solution")
    assert (data.system_prompt, data.prompt_template) == ("Be exact.", "{prompt}\nAnswer after ####.")
    assert data.prompt_messages("1+1?") == [{"role": "system", "content": "Be exact."},
                                            {"role": "user", "content": "1+1?\nAnswer after ####."}]
    assert load_config(None).data.prompt_messages("q") == [{"role": "user", "content": "q"}]
    lines = {line.split()[0]: line for line in config_help().splitlines()}
    for key, default in [("data.prompt_field", "(prompt)"), ("data.answer_field", "(answer)"),
                         ("data.completion_field", "(completion)"), ("data.system_prompt", "(null)"),
                         ("data.prompt_template", "('{prompt}')")]:
        assert default in lines[key], lines[key]


@pytest.mark.parametrize(("template", "why"), [
    ("Q: {question}", r"it has other fields \['\{question\}'\]"),
    ("Answer after ####.", "it has no {prompt}"),
    ("{prompt} and {}", r"it has other fields \['\{\}'\]"),
    ("{prompt.upper}", r"it has other fields \['\{prompt.upper\}'\]"),
    ("{prompt} {", "not a valid format string"),
    ("{prompt:{width}}", "not a valid format string"),
])
def test_a_bad_prompt_template_fails_naming_the_key(template, why):
    with pytest.raises(ConfigError, match=r"'data\.prompt_template': .*" + why):
        load_config(None, [f"data.prompt_template={json.dumps(template)}"])
    load_config(None, [f"data.prompt_template={json.dumps('{{literal}} {prompt!s:>3}')}"])  # braces escaped


def test_a_handoff_rule_needs_evaluations_and_holds_on_both_bounds():
    with pytest.raises(ConfigError, match="set train.eval_every too"):
        load_config(None, ["train.handoff={max_greedy: 0.3, min_pass_at_k: 0.1}"])
    config = load_config(None, ["train.eval_every=10", "train.handoff={max_greedy: 0.3, min_pass_at_k: 0.1}"])
    rule = config.train.handoff
    assert rule.holds({"pass@1_greedy": 0.30, "pass@8": 0.10}, k=8)
    assert not rule.holds({"pass@1_greedy": 0.31, "pass@8": 0.50}, k=8)  # no room left for RL
    assert not rule.holds({"pass@1_greedy": 0.05, "pass@8": 0.09}, k=8)  # nothing for RL to find
    demo = load_config(Path(__file__).resolve().parents[1] / "launch" / "configs" / "demo_sft.yaml")
    assert demo.train.handoff is not None and demo.train.eval_every > 0


def test_a_stop_target_needs_evaluations_reads_its_metric_and_is_for_rl_only(tmp_path):
    with pytest.raises(ConfigError, match="set train.eval_every too"):
        load_config(None, ["train.stop_at={at_least: 0.5}"])
    with pytest.raises(ConfigError, match="train.stop_at.metric"):
        load_config(None, ["train.eval_every=10", "train.stop_at={metric: pass@1, at_least: 0.5}"])
    greedy = load_config(None, ["train.eval_every=10", "train.stop_at={at_least: 0.5}"]).train.stop_at
    assert greedy.met({"pass@1_greedy": 0.5, "pass@4": 0.0}, k=4)
    assert not greedy.met({"pass@1_greedy": 0.49, "pass@4": 1.0}, k=4)
    at_k = load_config(None, ["train.eval_every=10", "train.stop_at={metric: pass@k, at_least: 0.5}"]).train.stop_at
    assert at_k.met({"pass@1_greedy": 0.0, "pass@4": 0.5}, k=4)
    assert not at_k.met({"pass@1_greedy": 1.0, "pass@4": 0.4}, k=4)
    config = load_config(None, [f"run_dir={tmp_path}", "train.eval_every=10", "train.stop_at={at_least: 0.5}"])
    with pytest.raises(ConfigError, match="'train.stop_at' ends rl runs early; sft runs train.steps"):
        prepare(config, "sft")


def test_a_plateau_ends_an_rl_run_on_its_stop_metric_and_is_for_rl_only(tmp_path):
    from launch.rl_mode import early_stop

    with pytest.raises(ConfigError, match="counts evaluations: set train.eval_every too"):
        load_config(None, ["train.stop_at_plateau=3"])
    train = load_config(None, ["train.eval_every=10", "train.stop_at_plateau=2"]).train

    def evals(greedy: list[float], at_k: list[float] | None = None) -> dict[int, dict[str, float]]:
        at_k = at_k or [0.0] * len(greedy)
        pairs = enumerate(zip(greedy, at_k, strict=True))
        return {10 * (i + 1): {"pass@1_greedy": g, "pass@8": p} for i, (g, p) in pairs}

    assert early_stop(train, evals([0.2, 0.5, 0.4])) is None
    assert "has not passed its best, 0.500, in 2 evaluations" in early_stop(train, evals([0.2, 0.5, 0.4, 0.5]))
    # with a target, the plateau is on the target's metric (pass@k here), and the target comes first
    both = train.model_copy(update={"stop_at": load_config(None, [
        "train.eval_every=10", "train.stop_at={metric: pass@k, at_least: 0.9}"]).train.stop_at})
    assert early_stop(both, evals([0.2, 0.5, 0.4, 0.5], [0.3, 0.4, 0.5, 0.6])) is None
    assert "reached 0.9" in early_stop(both, evals([0.2, 0.1, 0.1], [0.3, 0.9, 0.9]))
    config = load_config(None, [f"run_dir={tmp_path}", "train.eval_every=10", "train.stop_at_plateau=2"])
    with pytest.raises(ConfigError, match="'train.stop_at_plateau' ends rl runs early"):
        prepare(config, "sft")
