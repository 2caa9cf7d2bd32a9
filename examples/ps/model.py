"""A multi-layer perceptron in numpy, with parameters kept as one flat array per layer.

One flat array per layer (the weight matrix, then the bias) is one message: a layer's
gradient can be pushed the moment its backward step is done, while the next layer's runs.
``backward`` is therefore a generator that yields one layer's gradient at a time, from the
output layer down.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MLP", "Params", "sgd_momentum", "softmax_cross_entropy"]

Params = list[np.ndarray]
"""One flat float32 array per layer: ``W.ravel()`` followed by ``b``."""


@dataclass(frozen=True)
class MLP:
    """ReLU hidden layers and a softmax output; ``sizes`` = (inputs, hidden..., classes)."""

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) < 2 or min(self.sizes) < 1:
            raise ValueError(f"an MLP needs at least two positive sizes, got {self.sizes}")

    @property
    def layers(self) -> int:
        return len(self.sizes) - 1

    def layer_size(self, layer: int) -> int:
        fan_in, fan_out = self.sizes[layer], self.sizes[layer + 1]
        return fan_in * fan_out + fan_out

    @property
    def parameters(self) -> int:
        return sum(self.layer_size(i) for i in range(self.layers))

    def forward_flops(self, batch: int) -> int:
        """FLOPs of ``forward`` on ``batch`` samples: 2*batch*in*out per layer (the
        matrix product; bias and ReLU are negligible)."""
        return sum(2 * batch * self.sizes[i] * self.sizes[i + 1] for i in range(self.layers))

    def backward_flops(self, layer: int, batch: int) -> int:
        """FLOPs of ``backward``'s step for ``layer`` on ``batch`` samples: the weight
        gradient (2*batch*in*out) and, above the first layer, the error passed down (as
        much again), so about 4*batch*in*out."""
        products = 2 if layer > 0 else 1
        return products * 2 * batch * self.sizes[layer] * self.sizes[layer + 1]

    def unpack(self, layer: int, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Views of a layer's weight matrix and bias inside its flat array."""
        fan_in, fan_out = self.sizes[layer], self.sizes[layer + 1]
        return flat[:fan_in * fan_out].reshape(fan_in, fan_out), flat[fan_in * fan_out:]

    def init(self, seed: int) -> Params:
        """He-initialised weights and zero biases."""
        rng = np.random.default_rng(seed)
        params = []
        for i in range(self.layers):
            flat = np.zeros(self.layer_size(i), dtype=np.float32)
            w, _ = self.unpack(i, flat)
            w[...] = rng.standard_normal(w.shape, dtype=np.float32) * np.sqrt(2 / w.shape[0])
            params.append(flat)
        return params

    def forward(self, params: Sequence[np.ndarray], x: np.ndarray) -> list[np.ndarray]:
        """Every layer's input, then the logits."""
        acts = [x]
        for i in range(self.layers):
            w, b = self.unpack(i, params[i])
            z = acts[-1] @ w
            z += b
            if i < self.layers - 1:
                np.maximum(z, 0, out=z)
            acts.append(z)
        return acts

    def backward(self, params: Sequence[np.ndarray], acts: list[np.ndarray],
                 dlogits: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(layer, flat gradient)`` from the output layer down; each step computes
        only that layer's gradient (and the error it passes down), so a caller can send a
        gradient before the next layer's is computed."""
        delta = dlogits
        for i in reversed(range(self.layers)):
            grad = np.empty(self.layer_size(i), dtype=np.float32)
            gw, gb = self.unpack(i, grad)
            np.matmul(acts[i].T, delta, out=gw)
            np.sum(delta, axis=0, out=gb)
            if i > 0:
                w, _ = self.unpack(i, params[i])
                delta = (delta @ w.T) * (acts[i] > 0)
            yield i, grad

    def start_step(self, params: Sequence[np.ndarray], x: np.ndarray,
                   y: np.ndarray) -> tuple[float, Iterator[tuple[int, np.ndarray]]]:
        """Forward a batch: its mean cross-entropy, and the backward pass ready to run
        layer by layer (see ``backward``)."""
        acts = self.forward(params, x)
        loss, dlogits = softmax_cross_entropy(acts[-1], y)
        return loss, self.backward(params, acts, dlogits)

    def evaluate(self, params: Sequence[np.ndarray], x: np.ndarray,
                 y: np.ndarray) -> tuple[float, float]:
        """Mean cross-entropy and accuracy on a data set."""
        logits = self.forward(params, x)[-1]
        loss, _ = softmax_cross_entropy(logits, y)
        return loss, float(np.mean(logits.argmax(axis=1) == y))


def softmax_cross_entropy(logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of integer labels ``y`` and its gradient w.r.t. the logits."""
    z = logits - logits.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(np.maximum(z[rows, y], 1e-12)).mean())
    z[rows, y] -= 1
    z /= len(y)
    return loss, z


def sgd_momentum(param: np.ndarray, velocity: np.ndarray, grad: np.ndarray, lr: float,
                 momentum: float) -> None:
    """In place: ``v = momentum * v + grad``; ``param -= lr * v``."""
    velocity *= momentum
    velocity += grad
    param -= lr * velocity
