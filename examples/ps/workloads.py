"""Real models' sizes and costs, for a parameter server on the cluster model.

A ``Workload`` is a model's layers, in forward order, each with its trained parameters
and its forward cost per sample, computed from the published architecture:

- ``resnet50``: ResNet-50 (He et al., 2016; torchvision's v1.5, stride on the 3x3 conv),
  224x224 images: 53 convolutions with their batch norms and the 1000-way classifier,
  25,557,032 parameters and 4.09 G multiply-adds forward, the "4.1 GFLOPs" usually quoted.
  That figure counts multiply-adds; a device's FLOP/s rating counts a multiply-add as two
  operations, so the forward pass is 8.2 GFLOP at the device's rate, and backward twice
  that (the gradients of the inputs and of the weights).
- ``dlrm``: the DLRM recommender of the MLPerf training benchmark (Criteo Terabyte,
  ``--max-ind-range=40000000``): 26 embedding tables of 128-wide rows (187.8 M rows,
  24.0 G parameters, 96 GB in fp32), bottom MLP 13-512-256-128, dot interactions of
  the 27 vectors, top MLP 479-1024-1024-512-256-1.  One id per table per sample; a step
  touches only the rows its batch looks up, and only those travel: the expected number of
  distinct rows of ``batch`` uniform draws from each table (real ids are skewed and repeat
  more, so this is an upper bound on the traffic).

Gradients are grouped into buckets of at most 25 MiB in backward order (the default of
PyTorch's DistributedDataParallel); the embedding rows are a bucket of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUCKET_BYTES", "WORKLOADS", "Bucket", "Layer", "Workload", "dlrm", "resnet50"]

BUCKET_BYTES = 25 << 20
"""Gradient bucket cap: layers are grouped, in backward order, up to this many bytes."""


@dataclass(frozen=True)
class Layer:
    """One layer: ``params`` trained dense parameters and ``macs`` multiply-adds per
    sample forward; an embedding table has ``rows`` rows of ``dim`` values, one looked up
    per sample, and no dense parameters."""

    name: str
    params: int = 0
    macs: int = 0
    rows: int = 0
    dim: int = 0

    @property
    def sparse(self) -> bool:
        return self.rows > 0

    def touched(self, batch: int) -> float:
        """Expected distinct rows of ``batch`` uniform lookups (0 for a dense layer)."""
        if not self.sparse:
            return 0.0
        return self.rows * -expm1_log1p(batch, self.rows)


def expm1_log1p(batch: int, rows: int) -> float:
    """(1 - 1/rows) ** batch - 1, accurate for large ``rows``."""
    import math

    return math.expm1(batch * math.log1p(-1 / rows)) if rows > 1 else -1.0


@dataclass(frozen=True)
class Bucket:
    """Gradients pushed together: dense ``params``, or (sparse) ``rows`` touched rows of
    ``dim`` values; forward and backward FLOPs per step of the layers it holds."""

    layers: tuple[str, ...]
    params: int
    rows: int
    dim: int
    forward_flops: float
    backward_flops: float
    lookup_bytes: int
    """Bytes of embedding rows gathered forward (and scattered backward) per step."""

    @property
    def sparse(self) -> bool:
        return self.rows > 0

    @property
    def values(self) -> int:
        """Numbers in the bucket's gradient: dense parameters or touched rows x dim."""
        return self.rows * self.dim if self.sparse else self.params


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    layers: tuple[Layer, ...]
    batch: int
    """Samples per worker per step."""
    source: str

    @property
    def parameters(self) -> int:
        return sum(layer.params + layer.rows * layer.dim for layer in self.layers)

    @property
    def macs(self) -> int:
        """Multiply-adds per sample, forward."""
        return sum(layer.macs for layer in self.layers)

    def buckets(self, cap: int = BUCKET_BYTES) -> list[Bucket]:
        """Gradient buckets in backward order (the order backward produces them)."""
        out: list[Bucket] = []
        group: list[Layer] = []
        for layer in reversed(self.layers):
            if layer.sparse:
                continue
            if group and 4 * sum(x.params for x in group) + 4 * layer.params > cap:
                out.append(self._bucket(group))
                group = []
            group.append(layer)
        if group:
            out.append(self._bucket(group))
        tables = [layer for layer in self.layers if layer.sparse]
        if tables:
            out.append(self._bucket(tables))
        return out

    def _bucket(self, layers: list[Layer]) -> Bucket:
        # 2 FLOPs a multiply-add; backward computes two products for each forward one
        fwd = 2.0 * self.batch * sum(x.macs for x in layers)
        rows = round(sum(x.touched(self.batch) for x in layers))
        dim = max((x.dim for x in layers), default=0)
        lookups = 4 * self.batch * sum(x.dim for x in layers)
        return Bucket(tuple(x.name for x in layers), sum(x.params for x in layers), rows,
                      dim, fwd, 2 * fwd, lookups)


def _conv(name: str, cin: int, cout: int, k: int, out_hw: int) -> Layer:
    """A bias-free convolution and its batch norm (scale and shift per channel)."""
    return Layer(name, params=k * k * cin * cout + 2 * cout, macs=k * k * cin * cout * out_hw ** 2)


def resnet50() -> Workload:
    """ResNet-50 on 224x224 images, batch 256 per worker."""
    layers = [_conv("conv1", 3, 64, 7, 112)]
    cin, hw = 64, 56  # after the 3x3 max pool
    for stage, (width, blocks, stride) in enumerate(
            ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), start=1):
        cout = 4 * width
        for b in range(blocks):
            s = stride if b == 0 else 1
            out = hw // s
            name = f"layer{stage}.{b}"
            layers += [_conv(f"{name}.conv1", cin, width, 1, hw),
                       _conv(f"{name}.conv2", width, width, 3, out),
                       _conv(f"{name}.conv3", width, cout, 1, out)]
            if b == 0:
                layers.append(_conv(f"{name}.downsample", cin, cout, 1, out))
            cin, hw = cout, out
    layers.append(Layer("fc", params=2048 * 1000 + 1000, macs=2048 * 1000))
    return Workload("resnet50", "ResNet-50", tuple(layers), batch=256,
                    source="He et al. 2016 (v1.5 as in torchvision): 25.6 M parameters, "
                           "4.09 G multiply-adds per 224x224 image")


#: MLPerf DLRM (Criteo Terabyte, ids capped at 40 M): rows of each of the 26 tables.
CRITEO_TERABYTE_ROWS = (39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951,
                        2953546, 403346, 10, 2208, 11938, 155, 4, 976, 14, 39979771,
                        25641295, 39664984, 585935, 12972, 108, 36)


def _mlp(prefix: str, sizes: tuple[int, ...]) -> list[Layer]:
    return [Layer(f"{prefix}.{i}", params=a * b + b, macs=a * b)
            for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False))]


def dlrm() -> Workload:
    """MLPerf's DLRM, batch 2048 per worker."""
    dim = 128
    tables = [Layer(f"emb{i}", rows=rows, dim=dim)
              for i, rows in enumerate(CRITEO_TERABYTE_ROWS)]
    vectors = len(tables) + 1
    pairs = vectors * (vectors - 1) // 2
    layers = [*tables, *_mlp("bottom", (13, 512, 256, dim)),
              Layer("interaction", macs=pairs * dim),
              *_mlp("top", (pairs + dim, 1024, 1024, 512, 256, 1))]
    return Workload("dlrm", "DLRM (MLPerf, Criteo Terabyte)", tuple(layers), batch=2048,
                    source="MLPerf training DLRM: 26 tables x 128, bottom 13-512-256-128, "
                           "top 479-1024-1024-512-256-1")


WORKLOADS = {"resnet50": resnet50, "dlrm": dlrm}
