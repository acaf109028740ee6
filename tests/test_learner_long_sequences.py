"""Reasoning lengths on CPU (issue 38): the SFT and RL steps' memory grows linearly with the sequence.

XLA's memory analysis (temporaries of the compiled step, not run) at Qwen2.5-0.5B's widths, heads and
151,936-token vocabulary, 2 of its 24 layers, mixed precision and the learner's defaults (attention
`auto`: blockwise on CPU; train.logits_chunk_tokens as TrainConfig sets it; remat save_matmuls, one policy at
every length, as these figures were measured), one row of
8,192 and of 16,384 tokens. With tunix's einsum attention the same step grew 3.76× (28.9 → 108.6 GiB);
measured here: SFT 6.82 → 8.59 GiB (1.26×), RL 6.31 → 8.08 GiB (1.28×). A 1 × 32,768-token RL step
compiles (11.6 GiB of temporaries). About 90 s on the 2-core machine: 13 s for the checkpoint, 10-15 s
per compile.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "benchmarks"))

from bench_real_shape import compiled_memory, sft_batch  # noqa: E402

from learner.algo.optim import OptimizerConfig  # noqa: E402
from learner.algo.rl_batch import empty_rl_batch  # noqa: E402
from learner.algo.train_step import Trainer  # noqa: E402
from learner.schema import TrainConfig  # noqa: E402
from models.jax_model import load_model, make_mesh  # noqa: E402
from models.tiny import QWEN2_5_0_5B, make_chatml_model  # noqa: E402

pytestmark = pytest.mark.slow  # a 151,936-vocabulary model compiled at 8k, 16k and 32k tokens
GROWTH_BOUND = 2.3  # memory at 16,384 tokens / at 8,192: linear gives < 2 (plus constant parts)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    model_dir = make_chatml_model(tmp_path_factory.mktemp("long") / "qwen-2", num_layers=2, dtype="bfloat16")
    mesh = make_mesh(1, 1)
    defaults = TrainConfig()
    return Trainer(load_model(model_dir, mesh=mesh, dtype="float32"), mesh,
                   OptimizerConfig(learning_rate=1e-6, schedule="constant"), compute_dtype="bfloat16",
                   chunk_tokens=defaults.logits_chunk_tokens, remat="save_matmuls", attention=defaults.attention)


def batch(kind: str, length: int) -> dict:
    if kind == "rl":
        return empty_rl_batch(1, length)._asdict()
    return sft_batch(1, length, QWEN2_5_0_5B["vocab_size"])._asdict()


@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_step_memory_grows_linearly_from_8k_to_16k_tokens(trainer, kind):
    short, long = (compiled_memory(trainer, kind, batch(kind, n)).temp_size_in_bytes for n in (8192, 16384))
    print(f"\n{kind}: temporaries {short / 2**30:.2f} GiB at 8,192 tokens, {long / 2**30:.2f} GiB at 16,384 "
          f"({long / short:.2f}x)")
    assert long / short <= GROWTH_BOUND


def test_a_32k_token_rl_step_compiles(trainer):
    analysis = compiled_memory(trainer, "rl", batch("rl", 32768))
    print(f"\nrl: temporaries {analysis.temp_size_in_bytes / 2**30:.2f} GiB at 32,768 tokens")
    assert analysis.temp_size_in_bytes < 24 * 2**30  # what the einsum needed at 8,192 alone (28.9 GiB)
