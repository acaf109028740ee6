"""HF tensor name <-> tunix parameter path, and the layout change between them (no jax import).

The forward direction is tunix's own loader mapping (a regex table per family); every rule there is
either "copy" or "transpose (1, 0) then reshape". Its inverse therefore needs only the HF shape:
reshape to the transposed HF shape, transpose back. Deriving the inverse from tunix's table (rather
than writing a second table) keeps export in step with whatever the loader does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from models.families import hf_param_shapes


@dataclass(frozen=True)
class TensorRule:
    """Where one HF tensor lives in the tunix model and how to lay it out for HF."""

    hf_name: str
    tunix_path: str
    hf_shape: tuple[int, ...]
    transposed: bool  # tunix stores it transposed (and possibly split into heads)



def to_hf_layout(value: Any, hf_shape: tuple[int, ...], transposed: bool) -> Any:
    """A tunix-layout array (numpy or jax) in HF layout: reshape and transpose only, so bit-exact."""
    if transposed:
        return value.reshape(hf_shape[::-1]).T
    return value.reshape(hf_shape)


def tensor_rules(hf_config: dict[str, Any], tunix_config: Any,
                 key_mapping: Callable[[Any], dict]) -> list[TensorRule]:
    """One rule per HF tensor of the config (in `hf_param_shapes` order), from tunix's key mapping."""
    table = key_mapping(tunix_config)
    rules = []
    for hf_name, hf_shape in hf_param_shapes(hf_config).items():
        matches = [(pattern, target) for pattern, target in table.items() if re.fullmatch(pattern, hf_name)]
        if len(matches) != 1:
            raise ValueError(f"tunix key mapping has {len(matches)} rules for {hf_name!r}")
        pattern, (path_template, transform) = matches[0]
        if transform is not None and tuple(transform[0]) != (1, 0):
            raise ValueError(f"unexpected tunix transform {transform} for {hf_name!r}")
        rules.append(TensorRule(hf_name=hf_name, tunix_path=re.sub(pattern, path_template, hf_name),
                                hf_shape=tuple(hf_shape), transposed=transform is not None))
    return rules
