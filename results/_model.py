"""Helpers on the cluster model's public API: one timed transfer, a path's stage profile,
and byte-scaled clusters.

Byte scaling.  The model's times are linear in bytes / bandwidth: a chunk of c bytes holds
a stage for latency + c / B.  Divide every bandwidth and every size threshold (eager limit,
staging pool, chunk bounds) by k and send buffers k times smaller, and every stage takes the
same time as before, the adaptive chunk cuts a transfer into the same number of chunks, and
every transfer starts and ends when it did, to about 1e-4 (chunk sizes round to whole
bytes of the smaller buffer; the tests check it).  Simulating 1024 ranks that each move
100 MB then costs 1/k of the memory copies, and the model times are those of the real
sizes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm.sim import Cluster, DefaultStrategy, DeviceSpec, LinkSpec, Strategy

#: The in-process defaults that size-based decisions depend on.
EAGER_LIMIT = ac.EAGER_LIMIT
POOL_BYTES: int = inspect.signature(ac.open_world).parameters["pool_bytes"].default
MIN_CHUNK = 65536  # Pipelined's and DefaultStrategy's default smallest chunk
PIPELINE_MIN = 1 << 20  # DefaultStrategy's default: pipelined from 1 MiB


@dataclass(frozen=True)
class Path:
    """A transfer's three stages: copy-out, link, copy-in."""

    link: LinkSpec
    device: DeviceSpec

    @classmethod
    def of(cls, cluster: Cluster, world: int, src: int, dst: int) -> Path:
        return cls(cluster.fit(world).link(src, dst), cluster.fit(world).device)

    @property
    def rates(self) -> tuple[float, float, float]:
        d = self.device
        return d.copy_bandwidth, self.link.effective_bandwidth, d.copy_bandwidth

    @property
    def bottleneck(self) -> float:
        """Bytes/s of the slowest stage."""
        return min(self.rates)

    @property
    def alpha(self) -> float:
        """The per-chunk latency the chunk rule uses: the largest stage latency."""
        return max(self.link.latency, self.device.copy_latency)

    @property
    def stages(self) -> float:
        """k: each stage counted as its time per byte over the bottleneck's."""
        return sum(self.bottleneck / r for r in self.rates)

    def store_and_forward(self, nbytes: int) -> float:
        """Seconds of one chunk through the three stages in series: the sum of the stages."""
        d, link = self.device, self.link
        return (2 * (d.copy_latency + nbytes / d.copy_bandwidth)
                + link.latency + nbytes / link.effective_bandwidth)

    def handshake(self) -> float:
        """Seconds of a rendezvous's request-to-send and clear-to-send: two latencies."""
        return 2 * self.link.latency


def byte_scaled(cluster: Cluster, k: int) -> Cluster:
    """``cluster`` with every bandwidth divided by ``k`` (see the module docs).

    Raises:
        ValueError: ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"byte scale must be >= 1, got {k}")
    if k == 1:
        return cluster

    def slow(link: LinkSpec | None) -> LinkSpec | None:
        return None if link is None else dataclasses.replace(link, bandwidth=link.bandwidth / k)

    d = cluster.device
    intra = slow(cluster.intra)
    assert intra is not None
    return Cluster(nodes=cluster.nodes if cluster.fixed else None,
                   devices_per_node=cluster.devices_per_node, intra=intra,
                   inter=slow(cluster.inter),
                   device=DeviceSpec(d.name, d.flops, d.memory, d.copy_bandwidth / k,
                                     d.copy_latency),
                   groups_per_node=cluster.groups_per_node,
                   cross_group=slow(cluster.cross_group),
                   ranks_per_node=cluster.ranks_per_node,
                   switched_intra=cluster.switched_intra, name=cluster.name)


def scaled_world(cluster: Cluster, k: int) -> dict[str, Any]:
    """``ac.run`` keywords for a world whose bytes are scaled down by ``k``: the scaled
    cluster, and the eager limit, staging pool and strategy thresholds divided by ``k``.

    Raises:
        ValueError: ``k`` < 1 or not a power of two (the thresholds must divide exactly).
    """
    if k < 1 or k & (k - 1):
        raise ValueError(f"byte scale must be a power of two >= 1, got {k}")
    return {"cluster": byte_scaled(cluster, k), "eager_limit": EAGER_LIMIT // k,
            "pool_bytes": POOL_BYTES // k,
            "strategy": DefaultStrategy(async_max=EAGER_LIMIT // k,
                                        pipeline_min=PIPELINE_MIN // k,
                                        min_chunk=MIN_CHUNK // k)}


def scaled_bytes(nbytes: int, k: int) -> int:
    """A size in bytes scaled down by ``k``, rounded up."""
    return -(-nbytes // k)


def one_transfer(cluster: Cluster, nbytes: int, strategy: Strategy | None = None, *,
                 world: int = 2, src: int = 0, dst: int = 1,
                 buffers: tuple[np.ndarray, np.ndarray] | None = None,
                 **options: Any) -> float:
    """Model seconds from posting a send of ``nbytes`` (its recv posted first) until the
    data is in the receiver's buffer, as a program on the virtual clock sees it.

    ``buffers`` (a send and a recv buffer of at least ``nbytes``) saves allocating them;
    ``options`` go to ``ac.run`` (``eager_limit``, ``pool_bytes``).
    """
    send, recv = buffers if buffers is not None else (np.zeros(nbytes, np.uint8),
                                                       np.empty(nbytes, np.uint8))

    async def main(comm: ac.Communicator) -> float:
        if comm.rank == dst:
            await comm.recv(recv[:nbytes], src)
        elif comm.rank == src:
            await comm.send(send[:nbytes], dst)
        return asyncio.get_running_loop().time()

    options.setdefault("strategy", strategy)
    return float(ac.run(main, world, cluster=cluster, **options)[dst])


def geometric(lo: float, hi: float, points: int) -> list[float]:
    """``points`` values from ``lo`` to ``hi``, evenly spaced on a log scale."""
    if points == 1:
        return [lo]
    step = math.log(hi / lo) / (points - 1)
    return [lo * math.exp(i * step) for i in range(points)]
