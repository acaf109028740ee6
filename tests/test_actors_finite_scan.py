"""The non-finite scan of a weight version as it lands (actors/weights/finite_scan.py): the verdict equals
numpy's isfinite on float32 (the oracle) for every wire dtype, wherever the bad value sits (first
value, across slice boundaries, last value), and a stream staged chunk by chunk reports exactly the
tensors that hold one, while the engine's check takes that verdict instead of scanning again."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import actors.weights.finite_scan as finite_scan
from actors.weights.checks import TensorSpec, WeightSetError, validate_weight_set
from actors.weights.finite_scan import FiniteScan, has_nonfinite
from actors.weights.staging import stage_weights
from learner.weights.publisher import pack_weights
from tandem_wire import pb

DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _oracle(array: np.ndarray) -> bool:
    return not np.isfinite(array.astype(np.float32)).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, None])
def test_the_verdict_equals_isfinite_wherever_the_value_sits(monkeypatch, dtype, bad):
    monkeypatch.setattr(finite_scan, "SCAN_VALUES", 7)  # many slices, and bad values on their edges
    rng = np.random.default_rng(0)
    largest = float(ml_dtypes.finfo(dtype).max)  # (numpy.finfo knows no bfloat16)
    for position in (0, 6, 7, 8, 99):
        array = (rng.standard_normal(100) * 3).astype(dtype)
        array[50] = largest  # finite, however large: never mistaken for Inf
        if bad is not None:
            array[position] = bad
        assert has_nonfinite(array) == _oracle(array) == (bad is not None), (dtype, bad, position)
        assert has_nonfinite(array.reshape(4, 25)) == _oracle(array)


def _tensors(nan_in: set[str]) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    tensors = [("a", rng.standard_normal((64, 33)).astype(np.float32)),
               ("b", rng.standard_normal(301).astype(ml_dtypes.bfloat16)),
               ("c", rng.standard_normal((5, 7)).astype(np.float16)),
               ("d", rng.standard_normal(1000).astype(np.float32))]
    for name, array in tensors:
        if name in nan_in:
            array.reshape(-1)[-1] = np.inf if name == "b" else np.nan
    return tensors


@pytest.mark.parametrize("nan_in", [set(), {"a"}, {"b", "d"}, {"a", "b", "c", "d"}])
def test_a_staged_stream_names_exactly_the_tensors_with_non_finite_values(nan_in):
    blob = pack_weights(1, _tensors(nan_in), chunk_bytes=100)  # tensors span many chunks
    staged = stage_weights(pb.WeightMessage.FromString(m) for m in blob.messages)
    assert set(staged.nonfinite) == nan_in
    assert set(staged.nonfinite) == {name for name, array in staged.tensors if _oracle(array)}


def test_the_engine_check_takes_the_scan_verdict_and_scans_itself_without_one():
    tensors = dict(_tensors({"c"}))
    expected = {name: TensorSpec(tuple(a.shape), a.dtype.name) for name, a in tensors.items()}
    with pytest.raises(WeightSetError, match="c: contains non-finite values"):
        validate_weight_set(expected, tensors)  # no verdict: scanned here
    with pytest.raises(WeightSetError, match="c: contains non-finite values"):
        validate_weight_set(expected, tensors, nonfinite=("c",))
    validate_weight_set(expected, dict(_tensors(set())), nonfinite=())


def test_the_verdict_waits_for_every_tensor_to_land():
    specs = [("x", np.dtype(np.float32), (4,), 0), ("y", np.dtype(np.float32), (4,), 64)]
    buffer = np.zeros(80, dtype=np.uint8)
    with FiniteScan(specs) as scan:
        scan.landed(buffer, 70)  # x is whole, y is not
        with pytest.raises(RuntimeError, match="1 tensor"):
            scan.nonfinite()
        buffer[64:80] = np.full(4, np.nan, dtype=np.float32).view(np.uint8)
        scan.landed(buffer, 80)
        assert scan.nonfinite() == ("y",)


def test_tensors_of_one_dtype_are_cleared_together_and_padding_is_no_tensors():
    """Consecutive tensors of one dtype are scanned as one span, padding included: NaN bits in the
    padding alone clear every tensor after a closer look, and a NaN inside names only its tensor."""
    specs = [(name, np.dtype(np.float32), (4,), offset) for name, offset in (("x", 0), ("y", 64), ("z", 128))]
    buffer = np.zeros(144, dtype=np.uint8)
    buffer[16:64] = 0xFF  # NaN bit patterns between x and y
    with FiniteScan(specs) as scan:
        scan.landed(buffer, 144)
        assert scan.nonfinite() == ()
    buffer[64 + 8 : 64 + 12] = np.array([np.inf], dtype=np.float32).view(np.uint8)
    with FiniteScan(specs) as scan:
        scan.landed(buffer, 144)
        assert scan.nonfinite() == ("y",)
