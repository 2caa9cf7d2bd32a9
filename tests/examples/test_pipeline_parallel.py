"""examples/pipeline_parallel.py: the schedules hold what they promise, the measured bubble
on the virtual clock is the closed form's, the data-parallel all-reduce leaves every replica
the same bits and the pipelined gradient is the one-process gradient, and the command line
works in-process and one rank per process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pipeline_parallel import (
    SCHEDULES,
    Config,
    Stage,
    closed_form,
    config,
    parse_args,
    peak_in_flight,
    schedule,
    train,
    train_rank,
)
from ps.data import make_blobs
from ps.model import softmax_cross_entropy

import asynccomm as ac
from tests.test_examples import result_line, run_example

from ..transports.environments import mpi_env

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"
ASCEND = ac.Cluster.preset("ascend910b")


@pytest.mark.parametrize("kind", SCHEDULES)
@pytest.mark.parametrize(("p", "m"), [(1, 3), (2, 1), (2, 8), (4, 4), (4, 8), (5, 3)])
def test_every_stage_runs_each_pass_once_forward_first(kind: str, p: int, m: int) -> None:
    for stage in range(p):
        ops = schedule(kind, stage, p, m)
        assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        assert all(ops.index(("F", i)) < ops.index(("B", i)) for i in range(m))
        # forwards and backwards each in micro-batch order (what the tags rely on)
        assert [mb for k, mb in ops if k == "F"] == [mb for k, mb in ops if k == "B"]
        expected = m if kind == "gpipe" else min(p - stage, m)
        assert peak_in_flight(ops) == expected


def test_closed_form() -> None:
    assert closed_form(4, 8) == pytest.approx(3 / 11)
    assert closed_form(1, 5) == 0


@pytest.mark.parametrize("kind", SCHEDULES)
@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 4), (2, 8)])
def test_measured_bubble_is_the_closed_form_on_the_virtual_clock(kind: str, p: int,
                                                                 m: int) -> None:
    report = train(Config(schedule=kind, stages=p, replicas=2, microbatches=m, steps=1),
                   cluster=ASCEND)
    assert report is not None
    assert report.bubble == pytest.approx(closed_form(p, m), rel=0.02)
    # every stage of every replica idles the same (up to the transfers' microseconds)
    assert np.ptp(report.bubbles) < 1e-3
    assert report.peak_in_flight == [m if kind == "gpipe" else min(p - s, m)
                                     for s in range(p)]
    assert report.replicas_identical


def _reference_gradient(cfg: Config) -> np.ndarray:
    """The whole model in one process: every replica's first batch, forward and backward
    micro-batch by micro-batch, the gradient averaged over replicas."""
    data = make_blobs(cfg.seed, train=cfg.train_samples)
    sizes = cfg.sizes(data.features, data.classes)
    model = Stage(sizes, 0, len(sizes) - 1, cfg.seed)
    for replica in range(cfg.replicas):
        batches = data.shard(replica, cfg.replicas).batches(
            cfg.microbatches * cfg.micro_batch, cfg.seed + replica)
        x, y = next(batches)
        for xm, ym in zip(np.split(x, cfg.microbatches), np.split(y, cfg.microbatches),
                          strict=True):
            acts = model.forward(xm)
            _, dlogits = softmax_cross_entropy(acts[-1], ym)
            model.backward(acts, dlogits / cfg.microbatches)
    return model.flat_grad / cfg.replicas


@pytest.mark.parametrize("kind", SCHEDULES)
def test_replicas_get_the_same_bits_and_the_one_process_gradient(kind: str) -> None:
    cfg = Config(schedule=kind, stages=4, replicas=3, microbatches=4, steps=1)

    async def program(comm: ac.Communicator) -> np.ndarray:
        return (await train_rank(comm, cfg, wall=False))[1]

    grads = ac.run(program, world_size=cfg.ranks, cluster=ASCEND)
    by_stage = [grads[s::cfg.stages] for s in range(cfg.stages)]
    for replicas in by_stage:
        for other in replicas[1:]:
            assert np.array_equal(other, replicas[0])  # bitwise
    pipelined = np.concatenate([replicas[0] for replicas in by_stage])
    np.testing.assert_allclose(pipelined, _reference_gradient(cfg), rtol=1e-4, atol=1e-6)


@pytest.mark.timeout(60)
def test_wall_clock_numpy_learns_and_computes_what_the_model_run_computes() -> None:
    cfg = Config(stages=2, replicas=2, microbatches=4, steps=8)
    wall = train(cfg, wall=True, loop="uvloop", timeout=20)
    modelled = train(cfg, cluster=ASCEND)
    assert wall is not None and modelled is not None
    assert wall.clock == "wall" and wall.replicas_identical
    assert wall.losses[-1] < wall.losses[0]
    assert wall.losses == modelled.losses  # the same numbers, whatever the clock
    assert 0 <= wall.bubble < 1


def test_cluster_flags_are_refused_under_an_mpi_launcher(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ac, "mpi_world_size", lambda: 4)
    with pytest.raises(SystemExit, match="in-process only"):
        config(parse_args(["--stages", "2", "--cluster", "ascend910b"]))
    with pytest.raises(SystemExit, match="--stages 3 --replicas 2 does not fit the 4 "):
        config(parse_args(["--stages", "3", "--replicas", "2"]))
    assert config(parse_args(["--stages", "2", "--wall"])).replicas == 2


@pytest.mark.parametrize(("processes", "flags", "grid"), [
    (2, [], (2, 1)), (3, [], (3, 1)), (4, [], (4, 1)), (6, [], (3, 2)), (8, [], (4, 2)),
    (4, ["--replicas", "2"], (2, 2)), (6, ["--stages", "2"], (2, 3))])
def test_the_grid_fits_the_launcher_by_default(monkeypatch: pytest.MonkeyPatch, processes: int,
                                               flags: list[str], grid: tuple[int, int]) -> None:
    monkeypatch.setattr(ac, "mpi_world_size", lambda: processes)
    cfg = config(parse_args(flags))
    assert (cfg.stages, cfg.replicas) == grid


def test_in_one_process_the_grid_is_four_by_two() -> None:
    cfg = config(parse_args([]))
    assert (cfg.stages, cfg.replicas) == (4, 2)


def _mpiexec(n: int, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(MPIEXEC), "-n", str(n), sys.executable, "examples/pipeline_parallel.py", *flags]
    env = mpi_env()
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec is not installed in the venv")
@pytest.mark.skipif(ac.launched_by_mpi(), reason="this test starts mpiexec itself")
def test_two_processes_run_with_no_flags_and_a_misfit_is_said_once() -> None:
    proc = _mpiexec(2, "--steps", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = result_line(proc.stdout)
    assert (result["stages"], result["replicas"]) == ("2", "1")
    proc = _mpiexec(2, "--stages", "4", "--steps", "2")
    assert proc.returncode != 0
    assert proc.stderr.count("--stages 4 does not fit the 2 processes mpiexec started: "
                             "pass --stages P and --replicas R with P x R = 2") == 1, proc.stderr
    assert "replicas need" not in proc.stderr  # no rank goes on to fail on its own


def test_script_prints_the_result_line() -> None:
    result = result_line(run_example("pipeline_parallel.py", "--schedule", "gpipe",
                                     "--stages", "4", "--replicas", "2",
                                     "--microbatches", "8", "--steps", "2"))
    assert (result["schedule"], result["stages"], result["microbatches"]) == ("gpipe", "4",
                                                                              "8")
    assert result["clock"] == "virtual" and result["peak_in_flight"] == "8"
    assert float(result["bubble"]) == pytest.approx(float(result["closed_form"]), rel=0.02)
    assert float(result["closed_form"]) == pytest.approx(3 / 11, abs=1e-4)
    assert result["replicas_identical"] == "yes"


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec is not installed in the venv")
@pytest.mark.skipif(ac.launched_by_mpi(), reason="this test starts mpiexec itself")
def test_one_rank_per_process_on_mpi() -> None:
    cmd = [str(MPIEXEC), "-n", "4", sys.executable, "examples/pipeline_parallel.py",
           "--stages", "2", "--steps", "3"]
    env = mpi_env()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = result_line(proc.stdout)  # world rank 0 alone prints it
    assert (result["stages"], result["replicas"], result["clock"]) == ("2", "2", "wall")
    assert result["peak_in_flight"] == "2" and result["replicas_identical"] == "yes"
    assert float(result["loss_last"]) < float(result["loss_first"])
