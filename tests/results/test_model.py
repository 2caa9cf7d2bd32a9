"""results._model: byte-scaled worlds give the model times of the real sizes."""

from __future__ import annotations

import pytest

import asynccomm as ac
from asynccomm.sim import DefaultStrategy, Pipelined, StoreAndForward
from results._common import examples_on_path
from results._model import byte_scaled, one_transfer, scaled_bytes, scaled_world

MiB = 1 << 20


@pytest.mark.parametrize("preset", ["roce100g", "ascend910"])
@pytest.mark.parametrize("nbytes", [40_000, 3 * MiB + 5, 24 * MiB])
def test_a_scaled_transfer_takes_the_real_time(preset: str, nbytes: int) -> None:
    cluster = ac.Cluster.preset(preset)
    k = 64
    world = scaled_world(cluster, k)
    small_world = {"eager_limit": world["eager_limit"], "pool_bytes": world["pool_bytes"]}
    for strategy, scaled in ((StoreAndForward(), StoreAndForward()),
                             (DefaultStrategy(), world["strategy"])):
        real = one_transfer(cluster, nbytes, strategy, world=16, dst=9)
        small = one_transfer(world["cluster"], scaled_bytes(nbytes, k), scaled, world=16, dst=9,
                             **small_world)
        # chunk sizes round to whole bytes of the smaller buffer
        assert small == pytest.approx(real, rel=2e-4, abs=10e-9)


def test_scaling_keeps_the_chunk_count() -> None:
    cluster = ac.Cluster.preset("roce100g")
    small = byte_scaled(cluster, 32)
    assert small.inter is not None and cluster.inter is not None
    assert small.inter.bandwidth == cluster.inter.bandwidth / 32
    assert small.device.copy_bandwidth == cluster.device.copy_bandwidth / 32
    assert small.device.flops == cluster.device.flops
    link, device = cluster.fit(2).link(0, 1), cluster.device
    for nbytes in (2 * MiB, 100 * MiB):
        real = Pipelined().choose(nbytes, link, device, 2).chunk_bytes
        scaled = Pipelined(min_chunk=65536 // 32).choose(
            nbytes // 32, small.fit(2).link(0, 1), small.device, 2).chunk_bytes
        assert -(-nbytes // real) == -(-(nbytes // 32) // scaled)
    assert byte_scaled(cluster, 1) is cluster
    with pytest.raises(ValueError, match="power of two"):
        scaled_world(cluster, 3)


def test_a_scaled_parameter_server_takes_the_real_time() -> None:
    examples_on_path()
    from ps.simulated import configs, simulate
    from ps.workloads import Layer, Workload

    two = Workload("two", "two", (Layer("a", params=4 << 20, macs=1 << 30),
                                  Layer("b", params=4 << 20, macs=1 << 30)), 64, "a test")
    cluster = ac.Cluster.preset("roce100g")
    sharded = configs(2)[-1]
    real = simulate(two, cluster, sharded, workers=3)
    small = simulate(two, cluster, sharded, workers=3, byte_scale=16, shared_buffers=True,
                     world=scaled_world(cluster, 16))
    assert small.step_s == pytest.approx(real.step_s, rel=1e-4)
