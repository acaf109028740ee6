"""The countdown-chain task (launch/chains.py): right answers, held-out pairs never trained on, short chats
in SFT only, and the long-tailed lengths it exists for."""

import json

import numpy as np
import pytest

from launch.chains import chain, chain_tokens, make_chain_data
from launch.config import load_config
from launch.tasks import task_files


def test_a_chain_subtracts_until_what_is_left_is_below_b():
    assert chain(87, 9) == ("87-9", "78 69 60 51 42 33 24 15 6")
    assert chain(12, 4) == ("12-4", "8 4 0")
    assert chain(10, 1)[1].split() == [str(x) for x in range(9, -1, -1)]
    with pytest.raises(ValueError, match="a >= b >= 1"):
        chain(3, 5)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_chain_data_holds_out_pairs_shows_sft_short_chats_and_has_a_long_tail(tmp_path):
    paths = make_chain_data(tmp_path, max_terms=64, heldout=100, pretrain_lines=3000,
                            sft_examples=2000, rl_prompts=3000)
    rows = {split: _rows(path) for split, path in paths.items()}

    def pair(question: str) -> tuple[int, int]:
        a, b = question.rstrip("=").split("-")
        return int(a), int(b)

    held = {pair(r["prompt"]) for r in rows["heldout"]}
    assert len(held) == 100 and [r["prompt"] + "=" for r in rows["heldout"]] == [r["prompt"] for r in
                                                                                  rows["heldout_raw"]]
    chats = [r for r in rows["sft"] if "messages" in r]
    replayed = [r for r in rows["sft"] if "text" in r]
    assert 0.4 < len(replayed) / len(rows["sft"]) < 0.6
    trained = ({pair(r["text"].split("=")[0]) for r in rows["pretrain"] + replayed}
               | {pair(r["messages"][0]["content"]) for r in chats} | {pair(r["prompt"]) for r in rows["rl"]})
    assert not held & trained
    for r in rows["rl"] + rows["heldout"]:  # every reference is the chain of its question
        assert (r["prompt"], r["answer"]) == chain(*pair(r["prompt"]))
    assert max(len(r["messages"][1]["content"].split()) for r in chats) <= 8  # SFT: short chats only
    lengths = np.array([chain_tokens(r["answer"]) for r in rows["rl"]])
    # log-uniform terms: most answers short, a tail ~30x the median's length
    assert np.percentile(lengths, 10) < 10 and 20 < np.median(lengths) < 80 and lengths.max() > 200
    assert max(len(r["answer"].split()) for r in rows["rl"]) <= 64


def test_the_chain_task_is_a_data_task(tmp_path):
    config = load_config(None, ["data.task=chain", "data.max_terms=16", f"data.dir={tmp_path}"])
    files = task_files(config.data, tmp_path / "run", seed=3)
    assert set(files) == {"pretrain", "sft", "rl", "heldout", "heldout_raw"}
    assert max(len(r["answer"].split()) for r in _rows(files["rl"])) <= 16
    written = files["rl"].stat().st_mtime_ns
    assert task_files(config.data, tmp_path / "run", seed=3) == files  # generated once per dir
    assert files["rl"].stat().st_mtime_ns == written
