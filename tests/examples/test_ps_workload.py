"""The parameter server's ``--workload`` mode: real models' sizes and FLOPs on the cluster
model, checked against the published figures and the model's closed forms."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ps.compression import make_compressor
from ps.simulated import Setup, configs, plan, simulate
from ps.workloads import BUCKET_BYTES, Layer, Workload, dlrm, resnet50

import asynccomm as ac
from asynccomm.sim import ClusterModel

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "parameter_server.py"
NO_OVERLAP, OVERLAP, ONEBIT, SHARDED = configs(2)


def test_resnet50_has_the_published_size_and_cost() -> None:
    w = resnet50()
    assert w.parameters == 25_557_032  # torchvision's resnet50
    assert w.macs == pytest.approx(4.09e9, rel=0.002)  # "4.1 GFLOPs" = multiply-adds
    assert sum(1 for layer in w.layers if "conv" in layer.name or "down" in layer.name) == 53
    buckets = w.buckets()
    assert sum(b.params for b in buckets) == w.parameters
    assert all(4 * b.params <= BUCKET_BYTES or len(b.layers) == 1 for b in buckets)
    assert buckets[0].layers[0] == "fc" and buckets[-1].layers[-1] == "conv1"  # backward
    total = sum(b.forward_flops for b in buckets)
    assert total == pytest.approx(2 * w.macs * w.batch)
    assert sum(b.backward_flops for b in buckets) == pytest.approx(2 * total)


def test_dlrm_moves_only_the_rows_a_batch_touches() -> None:
    w = dlrm()
    dense = 2_368_897  # bottom 13-512-256-128 and top 479-1024-1024-512-256-1, with biases
    assert w.parameters - dense == 128 * 187_767_399
    sparse = w.buckets()[-1]
    assert sparse.sparse and sparse.params == 0 and sparse.dim == 128
    tables = [layer for layer in w.layers if layer.sparse]
    assert len(tables) == 26
    # at most one row per lookup, and never more rows than a table has
    assert sparse.rows <= sum(min(t.rows, w.batch) for t in tables)
    assert sparse.rows >= sum(min(t.rows, w.batch) for t in tables) * 0.7
    assert Layer("t", rows=3, dim=4).touched(1000) == pytest.approx(3)


def test_pieces_split_each_bucket_among_the_servers() -> None:
    buckets = resnet50().buckets()
    onebit = make_compressor("onebit")
    for setup in (OVERLAP, SHARDED):
        pieces = plan(buckets, setup)
        for b, group in zip(buckets, pieces, strict=True):
            assert sum(p.values for p in group) == b.params
        counts = [sum(p.values for g in pieces for p in g if p.server == s)
                  for s in range(setup.servers)]
        assert max(counts) - min(counts) <= 1
    sharded = plan(buckets, SHARDED)
    assert all(p.push_bytes == onebit.wire_bytes(p.values) == p.pull_bytes
               for g in sharded for p in g)
    sparse = plan(dlrm().buckets(), SHARDED)[-1]
    assert [p.server for p in sparse] == [0, 1]
    assert all(p.pull_bytes == 4 * p.values for p in sparse)  # rows come back in fp32


TINY = Workload("tiny", "tiny", (Layer("a", params=1 << 20, macs=1 << 20),
                                 Layer("b", params=1 << 20, macs=1 << 20)),
                batch=64, source="a test")
# two 16 MiB buckets, each with about a millisecond of backward on an Ascend 910
TWO = Workload("two", "two", (Layer("a", params=4 << 20, macs=1 << 30),
                              Layer("b", params=4 << 20, macs=1 << 30)),
               batch=64, source="a test")


def test_one_worker_without_overlap_is_the_sum_of_its_parts() -> None:
    cluster = ac.Cluster.preset("roce100g")
    out = simulate(TINY, cluster, NO_OVERLAP, workers=1, steps=3)
    model = ClusterModel(cluster, 2)
    nbytes = 4 * TINY.parameters  # one bucket: both layers fit in 25 MiB
    transfer = model.transfer(1, 0, nbytes, now=0).duration * 1e-9
    handshake = 2 * cluster.inter.latency  # request-to-send, clear-to-send
    server = (nbytes + 8 * TINY.parameters + 20 * TINY.parameters) / 1.2e12  # HBM traffic
    expected = out.compute_s + 2 * (handshake + transfer) + server
    assert out.step_s == pytest.approx(expected, rel=1e-6)
    assert out.compute_s == pytest.approx(3 * 2 * 2 * 64 * (1 << 20) / cluster.device.flops)


def test_overlap_and_compression_lower_the_share_and_runs_repeat() -> None:
    cluster = ac.Cluster.preset("ascend910")
    assert len(TWO.buckets()) == 2
    outs = [simulate(TWO, cluster, setup, workers=4) for setup in (NO_OVERLAP, OVERLAP, ONEBIT)]
    shares = [o.comm_share for o in outs]
    assert 0 < shares[2] < shares[1] < shares[0] < 1
    assert outs[0].step_s > outs[1].step_s > outs[2].step_s >= outs[2].compute_s
    again = simulate(TWO, cluster, OVERLAP, workers=4)
    assert again == outs[1]


def test_setup_checks() -> None:
    with pytest.raises(ValueError, match="steps >= 2"):
        simulate(TINY, ac.Cluster.preset("roce100g"), Setup("x", "x", True, "none", 1), steps=1)


def test_the_script_prints_a_result_line_per_configuration() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--workload", "resnet50", "--cluster",
                           "roce100g", "--workers", "2", "--servers", "2", "--batch-size", "32"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [dict(f.split("=", 1) for f in line.removeprefix("result: ").split())
             for line in proc.stdout.splitlines() if line.startswith("result: ")]
    assert [r["config"] for r in lines] == [s.key for s in configs(2)]
    assert {r["workload"] for r in lines} == {"resnet50"} and lines[-1]["servers"] == "2"
    shares = [float(r["comm_share"]) for r in lines]
    assert shares[0] > shares[1] > shares[2] and all(0 <= s < 1 for s in shares)
    assert all(float(r["samples_per_s"]) > 0 for r in lines)
