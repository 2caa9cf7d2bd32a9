"""Compressors: bytes on the wire, exact wire round trips, and error feedback's invariant."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ps.compression import COMPRESSORS, ErrorFeedback, from_wire, make_compressor, to_wire

LOSSY = ("fp16", "int8", "onebit", "topk")
EPS32 = float(np.finfo(np.float32).eps)


@pytest.mark.parametrize(("name", "ratio"), [
    ("none", 1.0), ("fp16", 0.5), ("int8", 0.25), ("onebit", 1 / 32), ("topk", 0.02)])
def test_traffic_ratio(name: str, ratio: float) -> None:
    comp = make_compressor(name)
    grad = np.random.default_rng(0).standard_normal(1_000_003).astype(np.float32)
    wire = to_wire(comp.compress(grad))
    assert wire.dtype == np.uint8
    assert wire.nbytes == comp.wire_bytes(grad.size)
    assert wire.nbytes / grad.nbytes == pytest.approx(ratio, rel=1e-3)


def test_the_advertised_savings() -> None:
    n = 1 << 20
    saved = {name: 1 - make_compressor(name).wire_bytes(n) / (4 * n) for name in COMPRESSORS}
    assert saved["int8"] >= 0.7499
    assert saved["onebit"] >= 0.968


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000])
def test_wire_round_trip_is_exact(name: str, n: int) -> None:
    comp = make_compressor(name)
    grad = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    payload = comp.compress(grad)
    assert [(p.dtype, p.size) for p in payload] == list(comp.layout(n))
    received = np.frombuffer(to_wire(payload).tobytes(), np.uint8)  # as a recv would fill it
    again = comp.decompress(from_wire(comp, received, n), n)
    assert again.dtype == np.float32 and again.shape == (n,)
    np.testing.assert_array_equal(again, comp.decompress(payload, n))


@pytest.mark.parametrize("n", [10, 5000, 65_792])
def test_topk_keeps_exactly_the_largest(n: int) -> None:
    comp = make_compressor("topk")
    grad = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    values, idx = comp.compress(grad)
    k = comp.k(n)  # type: ignore[attr-defined]
    assert len(set(idx.tolist())) == k
    np.testing.assert_array_equal(np.sort(np.abs(values)), np.sort(np.abs(grad))[-k:])


def test_fp16_keeps_small_gradients() -> None:
    grad = np.full(100, 3e-8, np.float32)  # below fp16's smallest subnormal
    comp = make_compressor("fp16")
    np.testing.assert_allclose(comp.decompress(comp.compress(grad), 100), grad, rtol=1e-3)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(LOSSY), n=st.integers(1, 400), steps=st.integers(1, 12),
       seed=st.integers(0, 2**32 - 1), exponent=st.integers(-8, 4))
def test_error_feedback_sends_everything_but_the_residual(name: str, n: int, steps: int,
                                                          seed: int, exponent: int) -> None:
    comp = make_compressor(name)
    grads = (np.random.default_rng(seed).standard_normal((steps, n)) * 10.0**exponent)
    grads = grads.astype(np.float32)
    feedback = ErrorFeedback(comp, [n])
    sent = np.zeros(n)
    for grad in grads:
        wire = to_wire(feedback.compress(0, grad))
        sent += comp.decompress(from_wire(comp, wire, n), n)
    # sum(sent) == sum(true) - residual, up to float32 rounding of each step's arithmetic
    tolerance = 8 * EPS32 * steps * float(np.abs(grads).sum(axis=0).max())
    np.testing.assert_allclose(sent + feedback.residual[0], grads.astype(np.float64).sum(0),
                               rtol=0, atol=tolerance)


def test_unknown_compressor() -> None:
    with pytest.raises(ValueError, match="unknown compressor 'gzip'"):
        make_compressor("gzip")
