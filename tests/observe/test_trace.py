"""Trace files: Chrome trace-event JSON with valid slices, flows from every send to its
recv, and model time on cluster worlds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm.sim import Cluster, ClusterModel
from asynccomm.trace import load, merge
from asynccomm.transports import shm

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).with_name("mpiexec")


def check_trace(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The checks every trace passes; returns its op slices."""
    events = doc["traceEvents"]
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0
            by_thread[(e["pid"], e["tid"])].append(e)
    for slices in by_thread.values():
        times = [e["ts"] for e in slices]
        assert times == sorted(times), "timestamps go back on one thread"
        stack: list[float] = []
        for e in slices:
            while stack and stack[-1] <= e["ts"] + 1e-6:
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1] + 1e-3, "a child outlives its parent"
            stack.append(end)
    starts = [e for e in events if e["ph"] == "s"]
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(ends) == len([e for e in events if e["ph"] == "f"]), "one flow end per id"
    for s in starts:
        assert s["id"] in ends and ends[s["id"]]["bp"] == "e"
    ops = [e for e in events if e["ph"] == "X" and e["cat"] in ("send", "recv", "compute")]
    sends = [e for e in ops if e["cat"] == "send" and e["args"]["outcome"] == "done"]
    assert len(starts) == len(sends), "every send has a flow to its recv"
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert all(key in names for key in by_thread)
    return ops


async def _traffic(comm: ac.Communicator) -> None:
    peer = 1 - comm.rank
    s = comm.stream()
    comm.irecv(np.zeros(1), peer, tag=99).cancel()
    for i in range(3):
        if comm.rank == 0:
            await comm.send(np.zeros(10), peer, tag=i)
            await comm.send(np.zeros(100_000), peer, tag=i, stream=s)
        else:
            await comm.recv(np.zeros(10), peer, tag=i)
            await comm.recv(np.zeros(100_000), ac.ANY_SOURCE, tag=i)
    reqs = [comm.isend(np.full(4, float(i)), peer, tag=9) for i in range(4)]
    reqs += [comm.irecv(np.zeros(4), peer, tag=9) for _ in range(4)]
    await ac.wait_all(reqs)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_trace_file_of_an_in_process_run(tmp_path: Path, loop: str) -> None:
    path = tmp_path / "run.json"
    ac.run(_traffic, 2, loop=loop, trace=str(path))
    doc = json.loads(path.read_text())
    ops = check_trace(doc)
    assert {e["pid"] for e in ops} == {0, 1}
    assert sum(e["cat"] == "send" for e in ops) == 14
    cancelled = [e for e in ops if e["args"]["outcome"] == "cancelled"]
    assert len(cancelled) == 2 and all(e["args"]["tag"] == 99 for e in cancelled)
    big = [e for e in ops if e["cat"] == "recv" and e["args"]["nbytes"] == 800_000]
    assert len(big) == 3 and all(e["args"]["peer"] == 0 for e in big)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    threads = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {"stream 0 (default)", "stream 1"} <= threads
    phases = [e for e in doc["traceEvents"] if e.get("cat") == "phase"]
    assert {"wait", "copy"} <= {e["name"] for e in phases}


async def _fast_lane_traffic(comm: ac.Communicator) -> None:
    """Every way the fast lane finishes an op, with messages taken out of order."""
    assert comm._engine.traced  # the traced fast lane is open
    peer = 1 - comm.rank
    if comm.rank == 0:
        for tag in (1, 2, 3, 4):  # staged at rank 1
            await comm.send(np.full(2, float(tag)), peer, tag)
        await comm.recv(np.zeros(1), peer, 9)  # rank 1 has posted its recvs of 5 and 6
        await comm.send(np.full(2, 6.0), peer, 6)  # into a posted recv
        await comm.isend(np.full(2, 5.0), peer, 5)  # likewise, with a request
        await comm.send(np.full(2, 7.0), peer, 7)  # staged: taken by an irecv
        return
    got = np.zeros(2)
    for tag in (3, 1):  # out of order: each takes its own staged message
        await comm.recv(got, peer, tag)
        assert got[0] == tag
    await comm.irecv(got, peer, 4)
    await comm.irecv(got, peer, 2)
    five, six = comm.irecv(np.zeros(2), peer, 5), comm.irecv(np.zeros(2), peer, 6)
    await comm.send(np.zeros(1), peer, 9)
    await ac.wait_all([five, six])
    await comm.recv(got, peer, 7)


def _traced_on_mpi(tmp_path: Path, program: str, module: str = "tests.observe.test_trace",
                   transport: str = "mpi", size: int = 2,
                   hosts: str | None = None) -> list[Path]:
    """Run ``module``'s ``program`` on ``size`` MPI processes, traced, on ``transport``
    (``ASYNCCOMM_TRANSPORT``: ``mpi``, or ``shm``, the shared-memory link; with ``hosts``,
    ``ASYNCCOMM_TEST_HOSTS``: each rank's host); each rank's file."""
    script = tmp_path / "prog.py"
    script.write_text(
        "import sys\nimport asynccomm as ac\n"
        f"from {module} import {program}\n"
        f"ac.run({program}, trace=sys.argv[1])\n")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "ASYNCCOMM_TRANSPORT": transport}
    if hosts is not None:
        env["ASYNCCOMM_TEST_HOSTS"] = hosts
    subprocess.run([str(MPIEXEC), "-n", str(size), sys.executable, str(script),
                    str(tmp_path / "mpi.json")], check=True, timeout=60, cwd=ROOT, env=env)
    return sorted(tmp_path.glob("mpi.rank*.json"))


def check_flows_by_tag(doc: dict[str, Any]) -> None:
    """``_fast_lane_traffic``'s trace: each send's flow ends at the recv of its own tag."""
    events = doc["traceEvents"]
    ops = check_trace(doc)

    def op_at(e: dict[str, Any]) -> dict[str, Any]:  # a flow's end is at its recv's match
        (op,) = [o for o in ops if (o["pid"], o["tid"]) == (e["pid"], e["tid"])
                 and o["ts"] <= e["ts"] <= o["ts"] + o["dur"] + 1e-3
                 and o["cat"] == ("send" if e["ph"] == "s" else "recv")]
        return op

    flows: dict[Any, dict[str, dict[str, Any]]] = defaultdict(dict)
    for e in events:
        if e["ph"] in ("s", "f"):
            flows[e["id"]][e["ph"]] = op_at(e)
    tags = sorted((f["s"]["args"]["tag"], f["f"]["args"]["tag"]) for f in flows.values())
    assert tags == [(t, t) for t in (1, 2, 3, 4, 5, 6, 7, 9)]  # each send to its own recv
    assert all(f["s"]["pid"] != f["f"]["pid"] for f in flows.values())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_fast_lane_traces_each_message_to_its_own_recv(tmp_path: Path, loop: str) -> None:
    path = tmp_path / "fast.json"
    ac.run(_fast_lane_traffic, 2, loop=loop, trace=str(path))
    check_flows_by_tag(json.loads(path.read_text()))


@pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec is not installed in the venv")
@pytest.mark.parametrize("transport", ["mpi", "shm"])
def test_the_fast_lane_traces_each_message_to_its_own_recv_on_mpi(tmp_path: Path,
                                                                  transport: str) -> None:
    """Across processes the receiver numbers what arrives, whichever way it is taken, on
    MPI and on the shared-memory link (whose steps in C leave a traced engine's to
    Python)."""
    if transport == "shm" and shm.missing() is not None:
        pytest.skip(str(shm.missing()))
    files = _traced_on_mpi(tmp_path, "_fast_lane_traffic", transport=transport)
    check_flows_by_tag(load(merge(files, tmp_path / "merged.json")))


def test_the_environment_variable_asks_for_a_trace(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCOMM_TRACE", str(tmp_path / "env.json"))
    ac.run(_traffic, 2)
    check_trace(load(tmp_path / "env.json"))


def test_the_model_time_trace_of_a_transfer_matches_the_closed_form(tmp_path: Path) -> None:
    nbytes = 16 << 20

    async def main(comm: ac.Communicator) -> None:
        if comm.rank == 1:
            await comm.recv(np.zeros(nbytes, np.uint8), 0)
        else:
            await comm.compute(seconds=1.0)  # the recv is posted long before the send
            await comm.send(np.zeros(nbytes, np.uint8), 1)

    path = tmp_path / "model.json"
    ac.run(main, 2, cluster=Cluster.preset("roce100g"), trace=path)
    ops = check_trace(load(path))
    model = ClusterModel(Cluster.preset("roce100g").fit(2), 2)
    cts = model.control(1, 0, now=model.control(0, 1, now=0))
    plan = model.transfer(0, 1, nbytes, now=cts)
    (send,) = [e for e in ops if e["cat"] == "send"]
    (recv,) = [e for e in ops if e["cat"] == "recv"]
    (compute,) = [e for e in ops if e["cat"] == "compute"]
    assert compute["ts"] == 0 and compute["dur"] == pytest.approx(1e6)
    assert send["ts"] == pytest.approx(1e6) and recv["ts"] == 0
    assert send["dur"] == pytest.approx(plan.end * 1e-3, abs=1e-3)  # ns -> us
    assert recv["ts"] + recv["dur"] == pytest.approx(1e6 + plan.end * 1e-3, abs=1e-3)
    links = [e for e in load(path)["traceEvents"] if e.get("cat") == "link"]
    assert len(links) == 1 and links[0]["args"]["chunks"] == plan.chunks


@pytest.mark.skipif(not MPIEXEC.exists() or shutil.which("true") is None,
                    reason="needs mpiexec")
def test_each_mpi_rank_writes_its_file_and_merge_joins_them(tmp_path: Path) -> None:
    files = _traced_on_mpi(tmp_path, "_traffic")
    assert [f.name for f in files] == ["mpi.rank0.json", "mpi.rank1.json"]
    out = merge(files, tmp_path / "merged.json")
    ops = check_trace(load(out))
    assert {e["pid"] for e in ops} == {0, 1}
    assert sum(e["cat"] == "send" for e in ops) == 14
    subprocess.run([sys.executable, "-m", "asynccomm.trace", "merge", *map(str, files),
                    "-o", str(tmp_path / "cli.json")], check=True, timeout=60, cwd=ROOT)
    assert load(tmp_path / "cli.json")["traceEvents"]


def test_sub_communicators_and_collectives_are_traced_under_their_labels(
        tmp_path: Path) -> None:
    """A split's ops and a collective's (on the private contexts) are in the trace, on
    threads named after their communicator, with every send's flow paired to its recv."""
    path = tmp_path / "groups.json"

    async def main(comm: ac.Communicator) -> None:
        x = np.ones(1000)
        await comm.allreduce(x)
        sub = await comm.split(comm.rank % 2)
        assert sub is not None
        await sub.sendrecv(np.ones(4), (sub.rank + 1) % sub.size, np.zeros(4),
                           (sub.rank - 1) % sub.size)
        await sub.allreduce(x)

    ac.run(main, 4, trace=path)
    doc = json.loads(path.read_text())
    ops = check_trace(doc)
    threads = {e["args"]["name"] for e in doc["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(t.startswith("collectives: stream 0") for t in threads), threads
    assert any(t.startswith("split1.0: stream 0") for t in threads), threads
    assert any(t.startswith("split1.1/collectives: stream 0") for t in threads), threads
    assert {e["pid"] for e in ops} == {0, 1, 2, 3}
    string_flows = [e for e in doc["traceEvents"] if e["ph"] == "s" and isinstance(e["id"], str)]
    assert string_flows and all(":" in e["id"] for e in string_flows)


def test_a_deadlock_inside_a_sub_communicator_names_world_ranks() -> None:
    async def main(comm: ac.Communicator) -> None:
        sub = await comm.split(0 if comm.rank >= 1 else None)
        if sub is not None:
            await sub.recv(np.zeros(1), (sub.rank + 1) % sub.size, tag=5)

    with pytest.raises(ac.DeadlockError) as info:
        ac.run(main, 3)
    text = str(info.value)
    assert set(info.value.pending) == {1, 2}
    assert "on a sub-communicator" in text
    assert "rank 1 waits for 2 on tag 5 (recv), rank 2 waits for 1 on tag 5 (recv)" in text
