"""The parameter server trains for real: every mode and every compressor reaches the stated
held-out accuracy, the loss falls, and the consistency models hold what they promise."""

from __future__ import annotations

from dataclasses import replace

import pytest
from ps import TARGET_ACCURACY, Config, Report, own_processes, train

# Small enough for about a second per run: two workers, 8,000 samples.
SMALL = Config(workers=2, epochs=2, train_samples=8_000)


def check_learned(report: Report) -> None:
    losses = [row.loss for row in report.rows]
    assert losses == sorted(losses, reverse=True), f"loss did not fall every epoch: {losses}"
    assert losses[-1] < 0.5 * losses[0]
    assert report.test_accuracy >= TARGET_ACCURACY, report.rows
    for row in report.rows:
        assert 0 <= row.comm_share < 1 and row.samples_per_s > 0


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("mode", ["sync", "async", "ssp"])
def test_every_mode_reaches_the_target(mode: str, loop: str) -> None:
    report = train(replace(SMALL, mode=mode), loop=loop)
    check_learned(report)
    assert report.retries == 0
    if mode != "async":
        assert report.max_gap <= report.config.bound  # type: ignore[operator]


@pytest.mark.parametrize("compression", ["fp16", "int8", "onebit", "topk"])
def test_every_compressor_reaches_the_target(compression: str) -> None:
    report = train(replace(SMALL, compression=compression, epochs=3), loop="uvloop")
    check_learned(report)


def test_sync_training_is_reproducible_and_overlap_changes_only_timing() -> None:
    overlapped = train(SMALL, loop="uvloop")
    serial = train(replace(SMALL, overlap=False), loop="uvloop")
    for a, b in zip(overlapped.rows, serial.rows, strict=True):
        assert (a.loss, a.test_accuracy) == (b.loss, b.test_accuracy)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_computing_on_the_loop_changes_only_timing(loop: str) -> None:
    """Workers computing on their loop's thread (``inline``, the default where each rank
    has a process of its own) train the same model, to the bit, as with a compute thread."""
    threaded = train(SMALL, inline=False, loop=loop)
    inline = train(SMALL, inline=True, loop=loop)
    check_learned(inline)
    for a, b in zip(threaded.rows, inline.rows, strict=True):
        assert (a.loss, a.test_accuracy) == (b.loss, b.test_accuracy)


def test_ranks_have_processes_of_their_own_on_processes_and_mpi() -> None:
    assert own_processes({"backend": "processes"}) and own_processes({"processes": True})
    assert own_processes({"backend": "mpi"})
    assert not own_processes({"backend": "local"}) and not own_processes({"loop": "uvloop"})


def test_ssp_with_bound_zero_keeps_workers_in_lockstep() -> None:
    report = train(replace(SMALL, mode="ssp", staleness=0, workers=3, epochs=1), loop="uvloop")
    assert report.max_gap == 0


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        Config(mode="hogwild")
    with pytest.raises(ValueError, match="compression must be one of"):
        Config(compression="zip")
    with pytest.raises(ValueError, match="at least one batch"):
        Config(workers=8, train_samples=100)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_the_compute_ceiling_computes_and_exchanges_nothing(loop: str) -> None:
    """``exchange=False``: every step's kernels run (a loss per step, from the batches) but
    no gradient reaches the server: the parameters stay as initialised, so every epoch's
    accuracy is the untrained model's, and next to no time goes to communication."""
    cfg = replace(SMALL, exchange=False)
    report = train(cfg, loop=loop)
    assert len(report.rows) == cfg.epochs
    assert len({row.test_accuracy for row in report.rows}) == 1
    assert report.test_accuracy < 0.5  # the untrained model's (the trained one's: >= 0.95)
    losses = [row.loss for row in report.rows]
    assert min(losses) > 0.9 * max(losses)  # nothing learned from one epoch to the next
    for row in report.rows:
        assert row.comm_share < 0.01 and row.samples_per_s > 0
    assert report.samples_per_s > 0
