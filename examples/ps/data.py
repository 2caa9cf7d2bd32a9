"""The data set: a synthetic multi-class task that needs a non-linear model.

Each of ``classes`` classes is a mixture of ``clusters`` Gaussian blobs whose centres are
drawn at random in ``features`` dimensions, so the classes interleave: softmax regression
stays near 70% held-out accuracy on the defaults, a 32-256-256-10 MLP reaches ~98.5%.
Everything is drawn from one seed, so every rank builds the same data set on its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["Dataset", "Shard", "make_blobs"]


@dataclass(frozen=True)
class Shard:
    """Samples and labels: a worker's share of the training set, or the test split."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def batches(self, batch_size: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Endless mini-batches, reshuffled every pass; a partial last batch is dropped so
        every pass has ``len(self) // batch_size`` steps."""
        rng = np.random.default_rng(seed)
        steps = len(self) // batch_size
        while True:
            order = rng.permutation(len(self))
            for i in range(steps):
                idx = order[i * batch_size:(i + 1) * batch_size]
                yield self.x[idx], self.y[idx]


@dataclass(frozen=True)
class Dataset:
    train: Shard
    test: Shard
    classes: int

    @property
    def features(self) -> int:
        return int(self.train.x.shape[1])

    def shard(self, index: int, count: int) -> Shard:
        """Worker ``index`` of ``count``: an equal, disjoint slice of the training set."""
        if not 0 <= index < count:
            raise ValueError(f"shard index {index} out of range for {count} shards")
        size = len(self.train) // count
        part = slice(index * size, (index + 1) * size)
        return Shard(self.train.x[part], self.train.y[part])


def make_blobs(seed: int = 0, *, train: int = 24_000, test: int = 4_000, features: int = 32,
               classes: int = 10, clusters: int = 4, noise: float = 1.0) -> Dataset:
    """A mixture-of-Gaussians classification task (see module docs), float32 features.

    Raises:
        ValueError: if a size is not positive.
    """
    if min(train, test, features, classes, clusters) < 1:
        raise ValueError("every size must be at least 1")
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes * clusters, features), dtype=np.float32)
    which = rng.integers(0, classes * clusters, size=train + test)
    x = centres[which] + noise * rng.standard_normal((train + test, features), dtype=np.float32)
    y = (which % classes).astype(np.int64)
    return Dataset(Shard(x[:train], y[:train]), Shard(x[train:], y[train:]), classes)
