"""vLLM (in-process, CPU, fp32) loads an exported dir and agrees with the JAX model token for token."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.jax_model import forward_logits, load_model, save_hf_dir
from models.tiny import make_tiny_model
from models.tokenizer import ASST_ID, BOS_ID, USER_ID

pytestmark = pytest.mark.slow  # a real vLLM engine

MAX_TOKENS = 8
PROMPTS = [[BOS_ID, USER_ID, 6, 7, 15, 8, 9, ASST_ID], [BOS_ID, USER_ID, 13, 19, ASST_ID],
           [BOS_ID, USER_ID, 22, 23, 24, 21, 5, ASST_ID]]


@pytest.fixture(scope="module", params=[("qwen2", False), ("qwen3", True), ("llama3", True)],
            ids=lambda p: f"{p[0]}-{'tied' if p[1] else 'untied'}")
def engines(request, tmp_path_factory):
    """(JAX model, vLLM engine on the dir exported from it); one engine at a time, freed afterwards."""
    from vllm import LLM

    family, tied = request.param
    root = tmp_path_factory.mktemp(family)
    src = make_tiny_model(root / "src", family=family, tie_word_embeddings=tied, seed=3)
    loaded = load_model(src)
    exported = save_hf_dir(loaded, root / "exported", tokenizer_dir=src)
    llm = LLM(model=str(exported), dtype="float32", enforce_eager=True, max_model_len=64, seed=0,
              logprobs_mode="processed_logprobs", gpu_memory_utilization=0.5)
    yield loaded.model, llm
    del llm
    gc.collect()


def padded(rows: list[list[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids and a mask from the row lengths (a random model does sample <pad> itself)."""
    ids = np.zeros((len(rows), length), np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def jax_greedy(model, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], list[list[float]]]:
    """Greedy tokens and the top-1 minus top-2 logit gap at each step (full forward per step)."""
    logits_fn = nnx.jit(forward_logits)
    rows = [list(p) for p in prompts]
    gaps: list[list[float]] = [[] for _ in prompts]
    for _ in range(steps):
        ids, mask = padded(rows, max(map(len, prompts)) + steps)
        logits = np.asarray(logits_fn(model, jnp.asarray(ids), jnp.asarray(mask)))
        for i, row in enumerate(rows):
            last = np.sort(logits[i, len(row) - 1])
            gaps[i].append(float(last[-1] - last[-2]))
            row.append(int(np.argmax(logits[i, len(row) - 1])))
    return [row[len(p):] for row, p in zip(rows, prompts, strict=True)], gaps


def test_greedy_decode_equals_jax(engines):
    from vllm import SamplingParams

    model, llm = engines
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                           SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    ours, gaps = jax_greedy(model, PROMPTS, MAX_TOKENS)
    compared = 0
    for out, mine, gap in zip(outputs, ours, gaps, strict=True):
        theirs = list(out.outputs[0].token_ids)
        assert len(theirs) == MAX_TOKENS
        for step, (a, b) in enumerate(zip(theirs, mine, strict=True)):
            if a != b:  # only a numerical near-tie may flip the argmax; the rows diverge from here
                assert gap[step] < 1e-4, (theirs, mine, step)
                break
            compared += 1
    assert compared >= 2 * MAX_TOKENS


def test_sampled_logprobs_match_jax_recomputation(engines):
    from vllm import SamplingParams

    model, llm = engines
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                           SamplingParams(temperature=1.0, n=4, max_tokens=MAX_TOKENS, logprobs=0,
                                          ignore_eos=True))
    rows, spans, reported = [], [], []
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        assert len(out.outputs) == 4
        for completion in out.outputs:
            tokens = list(completion.token_ids)
            rows.append(prompt + tokens)
            spans.append((len(prompt), len(tokens)))
            steps = zip(tokens, completion.logprobs, strict=True)
            reported.extend(step[token].logprob for token, step in steps)
    ids, mask = padded(rows, max(map(len, rows)))
    logprobs = np.asarray(jax.nn.log_softmax(forward_logits(model, ids, mask), axis=-1))
    ours = [logprobs[i, start - 1 + t, ids[i, start + t]]
            for i, (start, n) in enumerate(spans) for t in range(n)]
    diff = np.abs(np.asarray(ours) - np.asarray(reported))
    assert len(ours) == 3 * 4 * MAX_TOKENS
    assert diff.mean() < 1e-3 and diff.max() < 1e-3
    assert len({tuple(r) for r in rows}) > 3  # sampling really produced different completions


def test_direct_cpu_reload_equals_vllms_reload_weights(engines):
    """actors/weights/vllm_worker_ext.reload_repacked_layers (the CPU fast path of every weight load) serves
    what vLLM's own reload_weights serves, token for token and logprob for logprob, for each family
    (tied and untied), and either path can follow the other."""
    from safetensors.numpy import load_file
    from vllm import SamplingParams

    from actors.weights.vllm_worker_ext import numpy_to_torch, reload_repacked_layers

    _, llm = engines
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    exported = load_file(f"{llm.llm_engine.model_config.model}/model.safetensors")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)

    def served() -> tuple[list[list[int]], np.ndarray]:
        outs = [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]
        logprobs = [step[t].logprob for o in outs for t, step in zip(o.token_ids, o.logprobs, strict=True)]
        return [list(o.token_ids) for o in outs], np.asarray(logprobs)

    def as_torch(tensors: dict[str, np.ndarray]) -> list:
        return [(name, numpy_to_torch(array)) for name, array in tensors.items()]

    original = served()
    rolled = {name: np.roll(array, 1, axis=0) for name, array in exported.items()}  # other weights, same specs
    assert reload_repacked_layers(runner.get_model(), as_torch(rolled))
    llm.reset_prefix_cache()
    direct = served()
    assert direct[0] != original[0] or np.abs(direct[1] - original[1]).max() > 1e-2  # the new weights serve
    runner.reload_weights(weights_iterator=as_torch(rolled))
    llm.reset_prefix_cache()
    by_vllm = served()
    assert by_vllm[0] == direct[0]
    assert np.abs(by_vllm[1] - direct[1]).max() < 1e-5
    assert reload_repacked_layers(runner.get_model(), as_torch(exported))  # after reload_weights too
    llm.reset_prefix_cache()
    back = served()
    assert back[0] == original[0] and np.abs(back[1] - original[1]).max() < 1e-5
