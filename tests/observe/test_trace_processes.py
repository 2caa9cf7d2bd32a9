"""Traces of a world of processes (``ac.run(main, n, processes=True, trace=...)``): each rank
traces into its own file and the parent merges them into the file named, a failed run's
too; under mpiexec a traced world keeps the shared-memory link."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import asynccomm as ac
from asynccomm._comm import process_runner
from asynccomm._engine.tracing import rank_path
from asynccomm.trace import load, merge
from asynccomm.transports import shm

from .test_trace import MPIEXEC, _traced_on_mpi, check_trace
from .trace_cases import groups, one_killed, one_raises

pytestmark = pytest.mark.skipif(shm.missing() is not None, reason=str(shm.missing()))


def _flows(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each flow's start and end (``check_trace`` checked that every start has one end)."""
    events = doc["traceEvents"]
    starts = [e for e in events if e["ph"] == "s"]
    assert len({e["id"] for e in starts}) == len(starts), "a flow id used twice"
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    return [(s, ends[s["id"]]) for s in starts]


def check_groups(doc: dict[str, Any], size: int) -> None:
    """``trace_cases.groups``' merged trace on ``size`` ranks."""
    ops = check_trace(doc)
    ranks = list(range(size))
    assert doc["otherData"]["ranks"] == ranks
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {r: f"rank {r}" for r in ranks}
    assert {e["pid"] for e in ops} == set(ranks)
    threads = {e["args"]["name"] for e in doc["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    for name in ("stream 0", "collectives: stream 0", "split1.0: stream 0",
                 "split1.0/collectives: stream 0"):
        assert any(t.startswith(name) for t in threads), (name, threads)
    flows = _flows(doc)
    assert all(s["pid"] != f["pid"] for s, f in flows), "a flow joins two ranks"
    ring = [(s["pid"], f["pid"]) for s, f in flows if isinstance(s["id"], int)]
    assert sorted(ring) == sorted((r, (r + 1) % size) for r in ranks for _ in range(2))
    labels = {s["id"].split(":")[0] for s, _ in flows if isinstance(s["id"], str)}
    assert {"collectives", "split1.0", "split1.0/collectives"} <= labels


@pytest.mark.parametrize(("size", "loop"), [(2, "asyncio"), (3, "uvloop")])
def test_each_rank_traces_and_the_parent_merges_the_file_named(tmp_path: Path, size: int,
                                                              loop: str) -> None:
    path = tmp_path / "run.json"
    rank_path(path, 0).write_text("stale")  # an earlier run's: not merged
    assert ac.run(groups, size, processes=True, loop=loop, trace=path) == (
        ["ShmTransport"] * size)
    check_groups(load(path), size)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # the ranks' removed


def test_a_run_where_a_rank_raises_still_leaves_the_merged_trace(tmp_path: Path) -> None:
    path = tmp_path / "failed.json"
    with pytest.raises(ValueError, match="boom on purpose") as info:
        ac.run(one_raises, 2, processes=True, trace=str(path))
    assert "(raised on rank 1)" in info.value.__notes__
    doc = load(path)
    ops = check_trace(doc)
    assert {e["pid"] for e in ops} == {0, 1}
    outcomes = {(e["pid"], e["cat"], e["args"]["tag"]): e["args"]["outcome"] for e in ops}
    assert outcomes[(1, "send", 1)] == outcomes[(0, "recv", 1)] == "done"
    assert outcomes[(0, "recv", 2)] == "failed"  # what rank 0 was waiting for
    ((send, recv),) = [(s, f) for s, f in _flows(doc) if isinstance(s["id"], int)]
    assert (send["pid"], recv["pid"]) == (1, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failed.json"]


def test_a_killed_rank_is_named_in_the_merged_trace(tmp_path: Path) -> None:
    """A process killed writes no trace: the others' are merged, and its row says why
    it is empty."""
    path = tmp_path / "killed.json"
    with pytest.raises(RuntimeError, match="killed by signal 9") as info:
        ac.run(one_killed, 2, processes=True, trace=path)
    assert "(raised on rank 1)" in info.value.__notes__
    doc = load(path)
    ops = check_trace(doc)
    assert {e["pid"] for e in ops} == {0}
    outcomes = {(e["cat"], e["args"]["tag"]): e["args"]["outcome"] for e in ops}
    assert outcomes == {("recv", 1): "done", ("recv", 2): "failed"}
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1 (no trace: its process died first)"}
    assert doc["otherData"]["ranks"] == [0] and doc["otherData"]["missing"] == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["killed.json"]


def test_the_environment_variable_asks_for_a_trace_with_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ASYNCCOMM_TRACE", "env.json")  # (the parent's directory)
    ac.run(groups, 2, processes=True)
    check_groups(load(tmp_path / "env.json"), 2)


def test_a_bad_trace_is_refused_before_any_process_starts() -> None:
    with pytest.raises(TypeError, match="trace must be a file path"):
        ac.run(groups, 2, processes=True, trace=3)


def test_ranks_files_that_do_not_merge_are_kept_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    rank_path(path, 1).write_text("not json")
    with pytest.warns(RuntimeWarning, match=r"could not be merged into .*run\.json"):
        process_runner._merge_trace(path, 2)
    assert not path.exists() and rank_path(path, 1).exists()
    process_runner._merge_trace(tmp_path / "none.json", 2)  # no rank wrote: nothing
    assert not (tmp_path / "none.json").exists()


@pytest.mark.skipif(not MPIEXEC.exists() or shutil.which("true") is None,
                    reason="needs mpiexec")
def test_under_mpiexec_a_traced_world_keeps_the_shared_memory_link(tmp_path: Path) -> None:
    files = _traced_on_mpi(tmp_path, "groups_on_shm", "tests.observe.trace_cases", "shm")
    assert [f.name for f in files] == ["mpi.rank0.json", "mpi.rank1.json"]
    check_groups(load(merge(files, tmp_path / "merged.json")), 2)


@pytest.mark.skipif(not MPIEXEC.exists() or shutil.which("true") is None,
                    reason="needs mpiexec")
def test_on_two_hosts_each_message_is_joined_whichever_link_carried_it(
        tmp_path: Path) -> None:
    """Ranks 0, 1 on one host and 2, 3 on another: the ring's 0->1 and 2->3 go over shared
    memory, 1->2 and 3->0 over MPI, and every send is joined to its recv."""
    files = _traced_on_mpi(tmp_path, "groups_on_hybrid", "tests.observe.trace_cases", "",
                           size=4, hosts="a,a,b,b")
    assert len(files) == 4
    check_groups(load(merge(files, tmp_path / "merged.json")), 4)
