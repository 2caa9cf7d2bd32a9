"""Which link carries the ranks of one host under mpiexec: ``ASYNCCOMM_TRANSPORT`` and the
fake hosts of ``ASYNCCOMM_TEST_HOSTS``, decided before MPI is touched (``test_mpi.py``
runs the links themselves)."""

from __future__ import annotations

import pytest

from asynccomm._comm import mpi_runner
from asynccomm.transports import shm


@pytest.mark.parametrize(("value", "expected"), [("", True), ("shm", True), ("mpi", False)])
def test_shared_memory_is_the_default_and_mpi_turns_it_off(
        monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    if shm.missing() is not None:
        pytest.skip(f"no shared-memory link here: {shm.missing()}")
    monkeypatch.setenv("ASYNCCOMM_TRANSPORT", value)
    assert mpi_runner._shared_memory() is expected


@pytest.mark.parametrize("value", ["tcp", "SHM", "mpi,shm", " mpi"])
def test_a_bad_transport_is_a_value_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ASYNCCOMM_TRANSPORT", value)
    with pytest.raises(ValueError, match=r"ASYNCCOMM_TRANSPORT must be 'mpi' or 'shm' \(or "
                                         r"unset\), got"):
        mpi_runner._shared_memory()


def test_where_shared_memory_is_missing_mpi_carries_all_unless_shm_was_asked_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mpi_runner, "missing", lambda: "it needs Linux")
    monkeypatch.delenv("ASYNCCOMM_TRANSPORT", raising=False)
    assert mpi_runner._shared_memory() is False
    monkeypatch.setenv("ASYNCCOMM_TRANSPORT", "shm")
    with pytest.raises(RuntimeError, match="ASYNCCOMM_TRANSPORT=shm, but the shared-memory "
                                           "link is not available here: it needs Linux"):
        mpi_runner._shared_memory()


def test_fake_hosts_name_one_host_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNCCOMM_TEST_HOSTS", raising=False)
    assert mpi_runner._fake_hosts(4) is None
    monkeypatch.setenv("ASYNCCOMM_TEST_HOSTS", "a,a,b,b")
    assert mpi_runner._fake_hosts(4) == ["a", "a", "b", "b"]
    for bad in ("a,b,c", "a,,b,b", "a,b,c,d,e"):
        monkeypatch.setenv("ASYNCCOMM_TEST_HOSTS", bad)
        with pytest.raises(ValueError, match=r"must name one host per rank \(4\)"):
            mpi_runner._fake_hosts(4)
