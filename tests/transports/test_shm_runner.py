"""``ac.run(main, n, backend="processes")``: results, failures, bad arguments, and what
happens when a rank or the parent is killed, or Ctrl-C is pressed (nothing is left
behind: no process, no shared-memory file)."""

from __future__ import annotations

import os
import platform
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import asynccomm as ac
from asynccomm._comm.process_runner import RemoteTraceback, launch
from asynccomm.transports import shm

from .shm_cases import a_broken_link, a_killed_rank, fresh_array_faults, one_fails, who

pytestmark = pytest.mark.skipif(shm.missing() is not None, reason=str(shm.missing()))

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a test waits for a process to say something or to end.
LIMIT = 30.0


def _shm_files() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("asynccomm")}


def test_each_rank_runs_in_a_process_of_its_own_and_results_come_in_rank_order() -> None:
    before = _shm_files()
    got = ac.run(who, 3, backend="processes")
    assert [g[:2] for g in got] == [(0, 3), (1, 1), (2, 2)]
    assert {g[2] for g in got} == {"uvloop"}
    assert _shm_files() <= before


def test_processes_true_is_the_same_backend_and_loop_is_honoured() -> None:
    got = ac.run(who, 2, processes=True, loop="asyncio")
    assert got == [(0, 2, "asyncio.unix_events"), (1, 1, "asyncio.unix_events")]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")
def test_a_rank_s_allocator_is_settled_before_main_runs() -> None:
    # A new process, handed its arguments, would map and fault in each large temporary
    # afresh (a parameter-server worker: 400 page faults a step).
    assert all(faults < 8 for faults in ac.run(fresh_array_faults, 2, backend="processes"))


def test_a_failing_rank_is_raised_with_its_rank_and_its_peers_hear_why() -> None:
    with pytest.raises(ExceptionGroup) as info:
        ac.run(one_fails, 2, backend="processes")
    errors = {type(e): e for e in info.value.exceptions}
    assert "(raised on rank 1)" in errors[ValueError].__notes__
    assert str(errors[ValueError]) == "boom on purpose"
    cause = errors[ValueError].__cause__  # where it was raised, in its process
    assert isinstance(cause, RemoteTraceback) and "in one_fails" in str(cause)
    assert "rank 1 failed with ValueError: boom on purpose" in str(errors[RuntimeError])
    assert "(raised on rank 0)" in errors[RuntimeError].__notes__


def test_a_killed_rank_breaks_its_peers_pending_ops() -> None:
    outcomes = launch(a_killed_rank, 2, ("uvloop",))
    kind, said = outcomes[0]
    assert kind == "ok" and said.startswith("CommBrokenError: rank 1 died"), outcomes
    kind, error = outcomes[1]
    assert kind == "err" and "killed by signal 9" in str(error), outcomes


def test_a_link_that_fails_fails_its_pending_ops_and_tells_its_peers() -> None:
    outcomes = launch(a_broken_link, 2, ("asyncio",))
    failed = ("rank 1: the shared-memory transport failed: "
              "RuntimeError('a message it cannot handle')")
    assert outcomes == [("ok", f"CommBrokenError: rank 1 failed ({failed})"),
                        ("ok", f"TransportError: {failed}")]


def test_a_main_that_cannot_travel_to_another_process_is_refused_before_any_starts() -> None:
    async def local(comm: ac.Communicator) -> None:
        pass

    with pytest.raises(TypeError, match="picklable"):
        ac.run(local, 2, backend="processes")


def test_a_main_typed_at_python_c_is_refused_with_what_to_do() -> None:
    code = ("import asynccomm as ac\n"
            "async def main(comm):\n    return comm.rank\n"
            "ac.run(main, 2, backend='processes')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=LIMIT, check=False)
    assert proc.returncode != 0
    assert "TypeError: 'main' must be importable" in proc.stderr, proc.stderr
    assert "python -c" in proc.stderr


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"cluster": ac.Cluster.preset("roce100g")}, ValueError, "in-process only"),
    ({"clock": "virtual"}, ValueError, "clock"),
    ({"loop": "virtual"}, ValueError, "loop"),
    ({"trace": 3}, TypeError, "trace must be a file path"),
    ({"fault_plan": None}, TypeError, "fault_plan"),
    ({"processes": True, "backend": "mpi"}, ValueError, "processes=True"),
])
def test_bad_arguments_are_refused_before_any_process_starts(kwargs: dict[str, object],
                                                             error: type[Exception],
                                                             match: str) -> None:
    with pytest.raises(error, match=match):
        ac.run(who, 2, **{"backend": "processes", **kwargs})  # type: ignore[arg-type]


def test_bad_world_size_is_refused() -> None:
    with pytest.raises(ValueError, match="world_size"):
        ac.run(who, 0, backend="processes")


async def test_run_async_says_processes_start_from_run() -> None:
    with pytest.raises(ValueError, match="from ac.run"):
        await ac.run_async(who, 2, backend="processes")


def test_elsewhere_than_linux_the_error_says_what_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm.sys, "platform", "darwin")
    with pytest.raises(RuntimeError, match="needs Linux"):
        ac.run(who, 2, backend="processes")


def _start(n: int) -> tuple[subprocess.Popen[str], list[int]]:
    """``waits`` on ``n`` processes under a parent of its own; the ranks' pids."""
    parent = subprocess.Popen([sys.executable, "-m", "tests.transports.shm_cases", "wait",
                               str(n)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    fd = parent.stdout.fileno()  # read unbuffered: select() sees only what is unread
    out = b""
    try:
        while out.count(b"\n") < n:
            ready, _, _ = select.select([fd], [], [], LIMIT)
            assert ready, f"the ranks did not start: {out!r}"
            chunk = os.read(fd, 4096)
            assert chunk, f"the parent ended: {out!r}"
            out += chunk
    except BaseException:
        with parent:  # its ranks die with it
            parent.kill()
        raise
    lines = out.decode().splitlines()
    assert all(line.startswith("ready") for line in lines), lines
    return parent, [int(line.split()[2]) for line in lines]


def _ended(pids: list[int]) -> None:
    """Wait until every process of ``pids`` has ended (each one's pidfd becomes readable)."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            assert select.select([fd], [], [], LIMIT)[0], f"process {pid} is still running"
        finally:
            os.close(fd)


def test_killing_the_parent_ends_every_rank_and_leaves_nothing_behind() -> None:
    before = _shm_files()
    parent, pids = _start(2)
    with parent:
        parent.kill()
    _ended(pids)
    assert _shm_files() <= before


def test_ctrl_c_in_the_parent_stops_every_rank() -> None:
    before = _shm_files()
    parent, pids = _start(2)
    with parent:
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=LIMIT)
    assert parent.returncode != 0
    assert "KeyboardInterrupt" in err
    _ended(pids)
    assert _shm_files() <= before
