"""The chained bucket all-reduce of examples/training_loop.py sums what numpy sums, gives
every rank the same bits, and keeps data-parallel replicas identical while they learn."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from training_loop import TARGET_ACCURACY, Config, allreduce_after, train

import asynccomm as ac


def _vector(rank: int, size: int, bucket: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + bucket)
    return rng.standard_normal(size).astype(np.float32)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize(("ranks", "size"), [(1, 5), (2, 1), (3, 2), (3, 100_001), (5, 17)])
def test_bucket_allreduce_sums_every_bucket(loop: str, ranks: int, size: int) -> None:
    async def program(comm: ac.Communicator) -> list[np.ndarray]:
        bufs = [_vector(comm.rank, size + b, b) for b in range(3)]
        last = None
        for buf in bufs:  # chained, as the training loop does
            last = asyncio.ensure_future(allreduce_after(comm, buf, last))
        await last
        return bufs

    results = ac.run(program, world_size=ranks, loop=loop)
    for b in range(3):
        expected = sum(_vector(r, size + b, b).astype(np.float64) for r in range(ranks))
        np.testing.assert_allclose(results[0][b], expected, rtol=1e-5, atol=1e-5)
        for other in results[1:]:
            np.testing.assert_array_equal(other[b], results[0][b])


@pytest.mark.parametrize("overlap", [True, False])
def test_replicas_stay_identical_and_learn(overlap: bool) -> None:
    result = train(Config(ranks=3, epochs=2, train_samples=9_000, overlap=overlap),
                   loop="uvloop")
    assert result.replicas_identical
    losses = [row[1] for row in result.rows]
    assert losses[-1] < 0.5 * losses[0]
    assert result.test_accuracy >= TARGET_ACCURACY, result.rows
