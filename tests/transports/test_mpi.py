"""The transport contract and the failure cases on MPI, through ``mpiexec`` subprocesses.

Run by plain pytest (not under an MPI launcher): each test starts ``mpiexec -n N`` on this
host (MPICH uses shared memory between local processes) and checks how the job ended.
Every subprocess has a timeout well below pytest's, so a hang fails the test instead of
stalling the suite.

Under mpiexec the ranks of one host talk over shared memory unless
``ASYNCCOMM_TRANSPORT=mpi``: the contract and the failure cases run on the default, a
subset on MPI itself (``MPI``), and on two fake hosts of two ranks each (``TWO_HOSTS``:
shared memory within each, MPI between them); the cases about MPI itself run on MPI.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import asynccomm as ac

from ..mpi_sections import section
from .environments import mpi_env

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"
#: Seconds a whole mpiexec job may take (the contract at 4 ranks takes a few seconds).
JOB_LIMIT = 90

pytestmark = [
    pytest.mark.skipif(not MPIEXEC.exists(), reason="mpiexec is not installed in the venv "
                       "(pip install -e '.[mpi]')"),
    pytest.mark.skipif(ac.launched_by_mpi(), reason="these tests start mpiexec themselves"),
]


_env = mpi_env
#: The environment of a job on MPI alone, and of one on two fake hosts: ranks 0 and 2 on
#: one, 1 and 3 on the other (each failure case then has a peer on each side).
MPI = {"ASYNCCOMM_TRANSPORT": "mpi"}
TWO_HOSTS = {"ASYNCCOMM_TEST_HOSTS": "a,b,a,b"}
#: Two fake hosts whose ranks 0 and 1 share one: the programs of ranks 0 and 1 (the
#: conservation's) go on the hybrid link's rings.
HOST_PAIRS = {"ASYNCCOMM_TEST_HOSTS": "a,a,b,b"}
#: Where a failure case runs: the ranks, and the environment.
PLACES = {"shm": (2, {}), "mpi": (2, MPI), "hybrid": (4, TWO_HOSTS)}


def mpiexec(n: int, *args: str, limit: float = JOB_LIMIT,
            **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(MPIEXEC), "-n", str(n), sys.executable, *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=_env(**env), capture_output=True, text=True,
                              timeout=limit, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd[1:4])} ... hung for {limit} s:\n{exc.stdout!r}\n"
                    f"{exc.stderr!r}")


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def cases(*names: str) -> tuple[str, ...]:
    return tuple(f"tests.transports.mpi_cases {name}" for name in names)


CONTRACT = "tests.transports.mpi_contract_runner --loops uvloop,asyncio"
CONSERVATION = "tests.transports.mpi_conservation_runner"
#: The runs that end normally, in one job per place, one after another in the same
#: processes (``tests.mpi_sections``; each opens and closes its own worlds); the others
#: need a process of their own.  ``send-error`` comes first: its small send must find a
#: fast lane that has not sent yet (one that knows the dtype sends it without the failing
#: call).
TOGETHER = {"mpi": (2, MPI, (*cases("send-error", "lane", "direct", "answer-landed",
                                    "doorbell", "early-withdrawn", "unmatched-at-close"),
                              CONSERVATION)),
            "shm": (2, {}, (*cases("links", "size-mismatch", "run-rules", "two-worlds",
                                   "unmatched-at-close"), CONTRACT, CONSERVATION)),
            "hybrid": (4, TWO_HOSTS, (*cases("links", "hybrid-lane", "crowding",
                                             "unmatched-at-close"), CONSERVATION)),
            "hybrid-rings": (4, HOST_PAIRS, ("tests.transports.mpi_contract_runner "
                                             "--loops uvloop", CONSERVATION))}
#: A run's part of a job of several (``together``): ``(place, spec or case name)``.
Case = Callable[[str, str], subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def together() -> Case:
    """``case(place, name)``: that run's part of the job of ``TOGETHER[place]``, which
    starts the first time it is asked for (``mpi_sections.section``); ``name`` is a
    case of ``mpi_cases`` or a runner's spec."""
    jobs: dict[str, subprocess.CompletedProcess[str] | str] = {}

    def case(place: str, name: str) -> subprocess.CompletedProcess[str]:
        n, env, specs = TOGETHER[place]
        if place not in jobs:
            try:
                jobs[place] = mpiexec(n, "-m", "tests.mpi_sections", *specs, **env)
            except pytest.fail.Exception as exc:  # hung: every run of it fails so
                jobs[place] = str(exc)
        job = jobs[place]
        if isinstance(job, str):
            pytest.fail(job)
        spec = name if " " in name or "." in name else cases(name)[0]
        return section(job, spec, n)

    return case


#: Each link's contract on both loops; on two hosts, whose links are those two, on one.
@pytest.mark.parametrize(("n", "env", "loops"), [
    (2, {}, "uvloop,asyncio"), (3, MPI, "uvloop,asyncio"),
    (4, HOST_PAIRS, "uvloop")], ids=["shm", "mpi", "hybrid"])
def test_contract_on_mpi(n: int, env: dict[str, str], loops: str, together: Case) -> None:
    if n == 2:  # within a host, in the job of several runs
        proc = together("shm", CONTRACT)
    elif env is HOST_PAIRS:  # (in the job of the conservation on the hybrid link's rings)
        proc = together("hybrid-rings", TOGETHER["hybrid-rings"][2][0])
    else:
        proc = mpiexec(n, "-m", "tests.transports.mpi_contract_runner", "--loops", loops,
                       **env)
    assert proc.returncode == 0, _output(proc)
    assert f"contract on MPI, {n} ranks:" in proc.stdout and " 0 failed" in proc.stdout


def test_contract_on_mpi_with_the_python_steps() -> None:
    """Where the C lane is not built, MPI takes the Python steps: they keep the contract
    (on one loop: the steps are the same on both, and the C lane's run on both)."""
    proc = mpiexec(2, "-m", "tests.transports.mpi_contract_runner", "--loops", "asyncio",
                   ASYNCCOMM_PURE_PYTHON="1", **MPI)
    assert proc.returncode == 0, _output(proc)
    assert "contract on MPI, 2 ranks:" in proc.stdout and " 0 failed" in proc.stdout


def test_control_messages_call_mpi_directly(together: Case) -> None:
    """Where MPI's handles are C ints, the C lane's control sends and polls call MPI
    itself; sends MPI cannot finish at once (their receiver away) are kept with their
    buffers, and every message arrives intact."""
    assert _c_lane_lines(together, "direct") == [
        "rank 0: direct True (int handles: True); kept some",
        "rank 1: direct True (int handles: True); 400 of 400 intact"]


def test_small_messages_on_mpi_take_the_c_lane(together: Case) -> None:
    assert _c_lane_lines(together, "lane") == [
        "rank 0: 10/1/10 12/1/12; sent 4",
        "rank 1: 11/0/11 13/0/13 landed 7 owed +charge; sent 3"]


def test_messages_between_hosts_take_the_c_lane(together: Case) -> None:
    """On two hosts, a message to a peer on the other host, eager or rendezvous, runs the
    MPI side's steps in C, as on MPI alone, and a small one to a peer on this host the
    rings' steps in C, as on shared memory alone."""
    assert _c_lane_lines(together, "hybrid-lane", "hybrid") == [
        f"rank {r}: intact intact ring intact ring intact" for r in range(4)]


def test_fake_hosts_on_one_machine_are_crowded_as_the_machine_is(together: Case) -> None:
    """Two fake hosts of two ranks on one machine: each node (the rings) and each MPI side
    takes the cores for crowded as the machine's 4 processes crowd them, not as its own
    host's 2 would (a node that spun as if it had cores of its own made a ping-pong on
    the rings several times slower)."""
    proc = together("hybrid", "crowding")
    assert proc.returncode == 0, _output(proc)
    assert sorted(proc.stdout.strip().splitlines()) == [
        f"rank {r}: crowded as the machine True" for r in range(4)]


def _c_lane_lines(together: Case, name: str, place: str = "mpi") -> list[str]:
    """The lines the ranks of case ``name`` printed in ``place``, sorted (skipped where the
    C lane is not built)."""
    proc = together(place, name)
    assert proc.returncode == 0, _output(proc)
    if "no C lane" in proc.stdout:
        pytest.skip("the C lane is not built here")
    return sorted(proc.stdout.strip().splitlines())


@pytest.mark.parametrize("place", ["shm", "mpi", "hybrid", "hybrid-rings"])
def test_no_message_is_lost_or_duplicated_by_cancellations_on_mpi(
        place: str, together: Case) -> None:
    """Ranks 0 and 1 on shared memory, on MPI, and on the hybrid link across hosts and on
    its rings."""
    n = TOGETHER[place][0]
    proc = together(place, CONSERVATION)
    assert proc.returncode == 0, _output(proc)
    assert f"conservation on MPI, {n} ranks:" in proc.stdout and " 0 failed" in proc.stdout


@pytest.mark.parametrize("place", ["shm", "hybrid"])
def test_the_default_link_is_shared_memory_within_a_host(
        place: str, together: Case) -> None:
    """Every communicator (split, dup, private context) too; ``=mpi`` is checked by the
    cases about MPI itself, and the variable's values by ``test_transport_choice``."""
    n, _ = PLACES[place]
    link = "ShmTransport" if place == "shm" else "HybridTransport"
    proc = together(place, "links")
    assert proc.returncode == 0, _output(proc)
    for rank in range(n):
        assert f"rank {rank}: {link} {link} {link} {link}" in proc.stdout, _output(proc)
    assert proc.stdout.count(f"traced: {link}\n") == n, _output(proc)  # a trace keeps it


def test_a_bad_transport_variable_fails_every_rank_with_a_value_error() -> None:
    proc = mpiexec(2, "-m", "tests.transports.mpi_cases", "raise", limit=60,
                   ASYNCCOMM_TRANSPORT="tcp")
    assert proc.returncode != 0, _output(proc)
    assert proc.stderr.count("ValueError: ASYNCCOMM_TRANSPORT must be 'mpi' or 'shm' (or "
                             "unset), got 'tcp'") == 2, _output(proc)


@pytest.mark.parametrize("place", ["shm", "mpi", "hybrid"])
def test_an_exception_on_one_rank_breaks_its_peers_and_fails_the_job(place: str) -> None:
    n, env = PLACES[place]
    proc = mpiexec(n, "-m", "tests.transports.mpi_cases", "raise", **env)
    assert proc.returncode != 0, _output(proc)
    assert f"rank 1 of {n} failed: ValueError: boom on purpose" in proc.stderr, _output(proc)
    assert "rank 0 got CommBrokenError: rank 1 failed with ValueError" in proc.stdout, \
        _output(proc)


@pytest.mark.parametrize("place", ["shm", "hybrid"])
def test_ctrl_c_on_one_rank_tells_its_peers_it_was_interrupted(place: str) -> None:
    n, env = PLACES[place]
    proc = mpiexec(n, "-m", "tests.transports.mpi_cases", "sigint", limit=60, **env)
    assert proc.returncode != 0, _output(proc)
    assert f"rank 1 of {n} was interrupted: KeyboardInterrupt" in proc.stderr, _output(proc)
    assert ("rank 0 got CommBrokenError: rank 1 was interrupted (KeyboardInterrupt)"
            in proc.stdout), _output(proc)


def test_a_failed_rank_aborts_the_job_when_its_peers_do_not_close() -> None:
    proc = mpiexec(2, "-m", "tests.transports.mpi_cases", "raise-stuck", limit=60)
    assert proc.returncode != 0, _output(proc)
    assert "rank 1 of 2 failed: ValueError" in proc.stderr, _output(proc)
    assert "aborting the MPI job" in proc.stderr, _output(proc)


@pytest.mark.parametrize("place", ["shm", "hybrid"])
def test_a_killed_rank_ends_the_job_instead_of_hanging(place: str) -> None:
    n, env = PLACES[place]
    proc = mpiexec(n, "-m", "tests.transports.mpi_cases", "kill", limit=60, **env)
    assert proc.returncode != 0, _output(proc)


def test_an_mpi_error_in_a_send_is_a_transport_error_for_that_send(
        together: Case) -> None:
    proc = together("mpi", "send-error")
    assert proc.returncode == 0, _output(proc)
    assert "TransportError: rank 0: MPI send to rank 1 failed" in proc.stdout, _output(proc)
    assert "small send: TransportError, credit kept" in proc.stdout, _output(proc)
    assert f"received {1 << 20}" in proc.stdout, _output(proc)  # and the next send works


@pytest.mark.parametrize("place", ["shm", "mpi", "hybrid"])
def test_a_rendezvous_send_its_receiver_closed_on_fails_and_the_job_ends(
        place: str, together: Case) -> None:
    proc = together(place, "unmatched-at-close")
    assert proc.returncode == 0, _output(proc)
    assert ("unmatched send: CommBrokenError: rank 1 closed its communicator before receiving "
            "this message") in proc.stdout, _output(proc)


@pytest.mark.parametrize("steps", ["c", "python"])
def test_the_early_data_of_a_withdrawn_send_is_drained_by_its_receiver(
        steps: str, together: Case) -> None:
    """On MPI a rendezvous send of 1 MiB posts its data send with its announcement: when
    it is withdrawn unmatched (to a peer, and to its own rank), the receiver drains the
    data, so the world closes (it would hang on the data send) and the next message on
    that tag arrives whole.  On the C lane's steps and on the Python steps."""
    proc = (together("mpi", "early-withdrawn") if steps == "c"
            else mpiexec(2, "-m", "tests.transports.mpi_cases", "early-withdrawn", limit=60,
                         ASYNCCOMM_PURE_PYTHON="1", **MPI))
    assert proc.returncode == 0, _output(proc)
    assert "to the peer: timed out, to itself: timed out" in proc.stdout, _output(proc)
    assert f"got {1 << 20} B of [2]" in proc.stdout, _output(proc)


def test_a_rank_that_fails_with_an_early_send_waiting_on_it_fails_that_send() -> None:
    """A rank fails with another's rendezvous send (its data send posted) unmatched there:
    that send fails with the failure named, and the job ends instead of hanging."""
    proc = mpiexec(2, "-m", "tests.transports.mpi_cases", "early-peer-fails", limit=60, **MPI)
    assert proc.returncode != 0, _output(proc)
    assert "rank 1 of 2 failed: ValueError: boom with an early send waiting" in proc.stderr, \
        _output(proc)
    assert "rank 0: early send: CommBrokenError: rank 1 failed with ValueError" \
        in proc.stdout, _output(proc)


def test_an_mpi_error_in_progress_fails_pending_ops_and_aborts_the_job() -> None:
    proc = mpiexec(2, "-m", "tests.transports.mpi_cases", "progress-error", limit=60, **MPI)
    assert proc.returncode != 0, _output(proc)
    assert "rank 0 of 2 failed: TransportError: rank 0: MPI progress failed" in proc.stderr, \
        _output(proc)
    assert "aborting the MPI job" in proc.stderr, _output(proc)


def test_after_an_mpi_failure_new_ops_fail_at_once_and_landed_messages_arrive() -> None:
    proc = mpiexec(2, "-m", "tests.transports.mpi_cases", "after-failure", limit=60, **MPI)
    assert proc.returncode != 0, _output(proc)  # the ranks cannot close together: abort
    assert ("rank 0: send TransportError, landed 3, recv TransportError, recv-any "
            "TransportError, probe TransportError, send TransportError, irecv "
            "TransportError, iprobe TransportError") in proc.stdout, _output(proc)
    # main returned: the world cannot close with a broken link, so it aborts, not hangs
    assert "aborting the MPI job" in proc.stderr, _output(proc)


def test_a_sendrecv_whose_message_already_landed_completes_without_suspending(
        together: Case) -> None:
    proc = together("mpi", "answer-landed")
    assert proc.returncode == 0, _output(proc)
    assert "rank 0 got 7 at once" in proc.stdout, _output(proc)
    assert "rank 1 got 1" in proc.stdout, _output(proc)


def test_an_idle_rank_sleeps_until_a_peer_on_its_host_rings(together: Case) -> None:
    proc = together("mpi", "doorbell")
    assert proc.returncode == 0, _output(proc)
    assert "rank 1 sent" in proc.stdout, _output(proc)
    assert "rank 0 got 5 after 1 ring(s)" in proc.stdout, _output(proc)


def test_world_size_must_match_the_mpi_world(together: Case) -> None:
    proc = together("shm", "size-mismatch")
    assert proc.returncode == 0, _output(proc)
    assert proc.stdout.count("ValueError: world_size=99 but MPI started 2") == 2, _output(proc)


def test_the_run_rules_under_mpiexec(together: Case) -> None:
    proc = together("shm", "run-rules")
    assert proc.returncode == 0, _output(proc)
    lines = sorted(proc.stdout.strip().splitlines())
    for rank, line in enumerate(lines):
        assert f"plain='mpi {rank}/2' sized='mpi {rank}/2'" in line, _output(proc)
        assert "ValueError: world_size=3 but MPI started 2 processes" in line, _output(proc)
        assert "pass world_size=2 or None" in line and "backend='local'" in line, _output(proc)
        assert "local=['sim 0/3', 'sim 1/3', 'sim 2/3']" in line, _output(proc)


def test_worlds_open_at_once_do_not_see_each_others_messages(together: Case) -> None:
    proc = together("shm", "two-worlds")
    assert proc.returncode == 0, _output(proc)
    for rank in (0, 1):
        assert f"rank {rank}: world a got 1, world b got 2" in proc.stdout, _output(proc)


def test_the_ring_example_runs_unchanged_on_two_processes() -> None:
    proc = mpiexec(2, "examples/ring.py", limit=60)
    assert proc.returncode == 0, _output(proc)
    assert "token after one lap: 1 (expected 1)" in proc.stdout, _output(proc)


def test_the_manual_mpi_example_runs_on_two_processes(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "mpi.md").read_text(encoding="utf-8")
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "manual_mpi.py"
    script.write_text(code, encoding="utf-8")
    proc = mpiexec(2, str(script), limit=60)
    assert proc.returncode == 0, _output(proc)
    # Two processes print at once: their lines may interleave, so only the values count.
    assert sorted(re.findall(r"\d\.\d", proc.stdout)) == ["0.0", "1.0"], _output(proc)
    local = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=60, check=False)
    assert local.returncode == 0 and local.stdout.strip() == "[1.0, 0.0]", _output(local)


def test_the_mpi_benchmark_runs_and_writes_json(tmp_path: Path) -> None:
    """A smoke run of ``benchmarks.mpi_p2p``: numbers exist; nothing judges them here."""
    proc = mpiexec(2, "-m", "benchmarks.mpi_p2p", "--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, _output(proc)
    assert "One-way latency" in proc.stdout and "Bandwidth" in proc.stdout, _output(proc)
    doc = json.loads((tmp_path / "mpi_p2p.json").read_text(encoding="utf-8"))
    assert {row["kind"] for row in doc["rows"]} == {"latency", "bandwidth"}
    for row in doc["rows"]:
        assert row["nbytes"] > 0 and min(row["raw"] + row["asynccomm"]) > 0, row
    assert doc["checks"] and doc["responsiveness"]["max_gap_ms"] >= 0


def test_the_hybrid_benchmark_runs_on_two_fake_hosts_and_writes_json(tmp_path: Path) -> None:
    """A smoke run of ``benchmarks.hybrid``: the hybrid link measured both ways."""
    proc = mpiexec(4, "-m", "benchmarks.hybrid", "--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, _output(proc)
    doc = json.loads((tmp_path / "hybrid.json").read_text(encoding="utf-8"))
    assert doc["link"] == "HybridTransport"
    assert {(row["way"], row["nbytes"]) for row in doc["rows"]} == {
        (way, n) for way in ("same host", "across hosts") for n in (8, 1 << 20)}
    for row in doc["rows"]:
        assert min(row["raw"] + row["asynccomm"]) > 0, row


def test_the_mpi_ring_benchmark_reports_cpu_time_per_hop(tmp_path: Path) -> None:
    """A smoke run of ``benchmarks.mpi_ring``: beside the time per hop, the CPU time per hop
    of all the ranks together, for raw mpi4py, the asyncio floor and asynccomm (nothing
    judges them here)."""
    proc = mpiexec(2, "-m", "benchmarks.mpi_ring", "--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, _output(proc)
    for column in ("raw CPU", "floor CPU", "asynccomm CPU", "asynccomm/floor"):
        assert column in proc.stdout, _output(proc)
    doc = json.loads((tmp_path / "mpi_ring_n2.json").read_text(encoding="utf-8"))
    for row in doc["ring"]:
        assert len(row["raw_cpu"]) == len(row["raw"]) > 0
        assert len(row["asynccomm_cpu"]) == len(row["asynccomm"]) == len(row["raw"])
        assert len(row["floor_cpu"]) == len(row["floor"]) == len(row["raw"])
        times = row["raw"] + row["floor"] + row["asynccomm"]
        cpus = row["raw_cpu"] + row["floor_cpu"] + row["asynccomm_cpu"]
        assert all(t > 0 for t in times) and all(cpu > 0 for cpu in cpus), row


def test_backend_mpi_without_a_launcher_runs_one_rank() -> None:
    """MPI's singleton start: ``backend="mpi"`` outside mpiexec is a world of one."""
    code = ("import asynccomm as ac\n"
            "async def main(comm):\n"
            "    return (comm.rank, comm.size, comm.device.name)\n"
            "print(ac.run(main, backend='mpi'))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, _output(proc)
    assert proc.stdout.strip() == "(0, 1, 'mpi:0')", _output(proc)
