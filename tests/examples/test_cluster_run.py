"""The parameter server on a cluster model, on the virtual clock: every kernel also occupies
the modelled device for its FLOP count, the figures are model time, overlap pays off in
model time, and two runs agree to the last bit."""

from __future__ import annotations

from dataclasses import replace

import parameter_server
from ps import TARGET_ACCURACY, Config, Report, train

import asynccomm as ac

# Small: two workers, 8,000 samples; batches of 256 give compute a share to hide behind.
SMALL = Config(workers=2, epochs=2, train_samples=8_000, batch_size=256)


def run(cfg: Config) -> Report:
    report = train(cfg, cluster=ac.Cluster.preset("ascend910b"), clock="virtual")
    assert report is not None
    return report


def test_modelled_run_learns_overlap_hides_communication_and_is_deterministic() -> None:
    overlapped, again = run(SMALL), run(SMALL)
    serial = run(replace(SMALL, overlap=False))
    assert overlapped.test_accuracy >= TARGET_ACCURACY, overlapped.rows
    assert serial.test_accuracy == overlapped.test_accuracy
    for row in overlapped.rows:
        assert 0 < row.comm_share < 1 and row.samples_per_s > 0
    assert overlapped.comm_share < serial.comm_share
    assert overlapped.rows == again.rows  # model time: identical, run after run


def test_flop_counts_follow_the_layer_sizes() -> None:
    model = Config().model(Config().dataset())
    assert model.sizes == (32, 256, 256, 10)
    assert model.forward_flops(64) == 2 * 64 * (32 * 256 + 256 * 256 + 256 * 10)
    assert model.backward_flops(2, 64) == 4 * 64 * 256 * 10
    assert model.backward_flops(0, 64) == 2 * 64 * 32 * 256  # no error to pass down


def test_cluster_and_clock_flags_reach_the_world_options() -> None:
    args = parameter_server.parse_args(["--cluster", "roce100g"])
    options = parameter_server.world_options(args)
    assert isinstance(options["cluster"], ac.Cluster) and "loop" not in options
    assert parameter_server.world_options(parameter_server.parse_args([])) == {"loop": "uvloop"}
    wall = parameter_server.world_options(
        parameter_server.parse_args(["--cluster", "ascend910b", "--clock", "wall"]))
    assert wall["clock"] == "wall" and wall["loop"] == "uvloop"
