"""vLLM worker extension: in-place weight reload from HF-named numpy arrays.

vLLM mixes this class into its worker (``LLM(worker_extension_cls=...)``), so the method runs next to
the model whether the engine core is in-process or in a worker process. Plain ``model.load_weights``
fails on CPU (layers are repacked at load); ``model_runner.reload_weights`` re-runs the loader's
post-processing and works on both CPU and GPU.
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


class WeightLoaderExtension:
    """Methods added to vLLM's worker; called through ``LLM.collective_rpc``."""

    def tandem_reload_weights(self, named_arrays: Iterable[tuple[str, np.ndarray]]) -> int:
        """Load HF-named arrays into the running model in place; returns how many were given."""
        weights = [(name, numpy_to_torch(np.asarray(array))) for name, array in named_arrays]
        self.model_runner.reload_weights(weights_iterator=weights)  # type: ignore[attr-defined]
        return len(weights)
