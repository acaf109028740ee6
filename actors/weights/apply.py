"""How an actor applies a weight version: its kind (pb.WeightKind, in the version's header) decides.

One row per kind: how the staged tensors are checked while the engine keeps sampling (`check`, raising
WeightSetError for a version this engine cannot take), how the checked version is loaded between two
engine steps with nothing in flight (`load`) and with groups in flight, which go on sampling
(`load_in_flight`), each returning the seconds sampling stalled, and whether `rollout.weight_update=abort`
takes the groups in flight out of the engine first (`drains`). Full weights are checked against the
engine's own tensors and reloaded in place (actors/weights/vllm_worker_ext.py): in flight, the groups
continue on them and their later tokens carry the new version (RolloutEngine.update_in_flight); under
abort, after the groups in flight drained (or were aborted), so no group mixes two versions. LoRA adapters
are checked against the run's adapter config and the model's adapter shapes (actors/weights/adapter_check.py)
and always loaded beside the groups in flight, which keep the adapter they started with
(actors/weights/adapters.py). A kind without a row is refused like a version that fails its check: the
actor keeps serving the one it has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from actors.weights.adapter_check import check_adapter
from actors.weights.checks import WeightEngine, WeightSetError
from actors.weights.staged import StagedWeights
from tandem_wire import pb
from tandem_wire.weights.manifest import ADAPTER, FULL

Checked = TypeVar("Checked")


@dataclass(frozen=True)
class Applier(Generic[Checked]):
    """How one kind of version is checked and loaded."""

    check: Callable[[WeightEngine, StagedWeights], Checked]
    load: Callable[[WeightEngine, Checked, int], float]  # (engine, checked, its version): nothing in flight
    load_in_flight: Callable[[WeightEngine, Checked, int], float]  # the groups in flight continue
    drains: bool  # under weight_update=abort: loaded only with no group in flight (drained, the rest aborted)


def _load_adapter(engine: WeightEngine, checked: Any, version: int) -> float:
    return engine.load_adapter(checked)


APPLIERS: dict[int, Applier[Any]] = {
    FULL: Applier(check=lambda engine, staged: engine.check_weights(staged.tensors, staged.nonfinite),
                  load=lambda engine, checked, version: engine.load_weights(checked, version),
                  load_in_flight=lambda engine, checked, version: engine.update_in_flight(checked, version).stall_s,
                  drains=True),
    ADAPTER: Applier(check=check_adapter, load=_load_adapter, load_in_flight=_load_adapter, drains=False),
}


def applier(kind: int) -> Applier[Any]:
    """The row of `kind`; WeightSetError when this actor cannot apply that kind."""
    row = APPLIERS.get(kind)
    if row is None:
        known = [pb.WeightKind.Name(k) for k in APPLIERS]
        raise WeightSetError(f"weight kind {kind} is not one this actor applies ({known})")
    return row
