"""vLLM worker extension: in-place weight reload from HF-named numpy arrays.

vLLM mixes this class into its worker (``LLM(worker_extension_cls=...)``), so the method runs next to
the model whether the engine core is in-process or in a worker process. Plain ``model.load_weights``
fails on CPU: the CPU backend repacks each linear layer's weight into a oneDNN handle at load and
drops the weight. ``model_runner.reload_weights`` handles that generally (quantized layers, online
processing): it puts every layer back on the meta device, wraps every weight loader, runs each loader
twice (once on meta tensors to count the elements it loads, once for real) and copies the processed
tensors back. For an unquantized model on CPU, ``reload_repacked_layers`` does only what is needed:
give the repacked layers their weights back, run the model's own loaders once, repack. It halves the
demo model's reload (median 32 -> 20 ms here; the stall an actor pays per version). Any other case
(GPU, a quantized model, a vLLM without the helpers) goes through ``reload_weights``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch


def numpy_to_torch(array: np.ndarray) -> torch.Tensor:
    """Zero-copy view of a numpy array as a torch tensor; bfloat16 (ml_dtypes) goes through uint16."""
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(array).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def reload_repacked_layers(model: torch.nn.Module, weights: list[tuple[str, torch.Tensor]]) -> bool:
    """Load a full HF-named weight set into an unquantized model on vLLM's CPU backend, in place: each
    layer the backend repacked (its ``cpu_linear``) gets a fresh weight tensor from the metadata vLLM
    recorded at load, the model's loaders fill every parameter once, and the layers are repacked.
    Returns False, touching nothing, where this does not apply (not on CPU, a quantized layer, or a
    vLLM without the reload helpers); raises if a repacked layer's weight was not in `weights`."""
    try:
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
        from vllm.model_executor.model_loader.reload.layerwise import _get_original_loader, get_layerwise_info
        from vllm.model_executor.model_loader.reload.meta import materialize_layer, restore_layer_on_meta
        from vllm.model_executor.model_loader.reload.utils import get_layer_tensors
        from vllm.platforms import current_platform
    except ImportError:
        return False
    if not current_platform.is_cpu():
        return False
    unquantized = (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)
    with_methods = {name: m for name, m in model.named_modules() if getattr(m, "quant_method", None) is not None}
    if not all(isinstance(m.quant_method, unquantized) for m in with_methods.values()):
        return False
    repacked = {name: m for name, m in with_methods.items() if hasattr(m, "cpu_linear")}
    restored = set()
    for name, layer in repacked.items():
        if layer.weight.numel() == 0:  # dropped after repacking: back from the recorded metadata
            info = get_layerwise_info(layer)
            restore_layer_on_meta(layer, info)
            materialize_layer(layer, info)
            for tensor in get_layer_tensors(layer).values():  # a reload_weights may have left its wrappers
                tensor.weight_loader = _get_original_loader(tensor)
            restored.add(f"{name}.weight")
    missing = restored - set(model.load_weights(weights))
    if missing:
        raise RuntimeError(f"weights of repacked layers not loaded: {sorted(missing)}")
    for layer in repacked.values():
        layer.quant_method.process_weights_after_loading(layer)
    return True


class WeightLoaderExtension:
    """Methods added to vLLM's worker; called through ``LLM.collective_rpc``."""

    def tandem_reload_weights(self, named_arrays: Iterable[tuple[str, np.ndarray]]) -> int:
        """Load HF-named arrays into the running model in place; returns how many were given.
        tandem serves text models without LoRA, so no encoder, multimodal or LoRA state derives
        from the weights (``reload_weights`` resets those)."""
        weights = [(name, numpy_to_torch(np.asarray(array))) for name, array in named_arrays]
        model_runner = self.model_runner  # type: ignore[attr-defined]
        if not reload_repacked_layers(model_runner.get_model(), weights):
            model_runner.reload_weights(weights_iterator=weights)
        return len(weights)
