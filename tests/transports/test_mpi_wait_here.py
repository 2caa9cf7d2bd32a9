"""``Progress.wait_here``: a task about to wait for its op on the MPI link polls for it itself
first (``Link.before_wait``), so that a wait the next poll ends costs no wake-up.

The progress runs here on the fake communicator of ``test_mpi_path`` (no MPI); the clock
the budget is read from is frozen (or steps a microsecond a reading), so the deadlines each
poll burst is given are exact.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from asynccomm._core import wire as w
from asynccomm._core.states import DONE, QUEUED
from asynccomm.transports import _mpi_progress
from asynccomm.transports._mpi_lib import sched_yield
from asynccomm.transports._mpi_progress import WAIT_DATA, WAIT_SPIN, Progress
from asynccomm.transports.hybrid import HybridTransport

from .test_mpi_path import Comm, Endpoint, fake_mpi, world  # noqa: F401  (a fixture)

NOW = 100.0


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock ``wait_here`` reads stands still at ``NOW``."""
    monkeypatch.setattr(_mpi_progress, "time", types.SimpleNamespace(perf_counter=lambda: NOW))


class Op:
    """What ``wait_here`` reads of the op it waits for: its state."""

    def __init__(self) -> None:
        self._state = QUEUED


def progress_with(bursts: list[bool], op: Op | None = None, *,
                  done_at: int = -1) -> tuple[Progress, list[tuple[float, Any]]]:
    """A progress whose poll bursts (``_spin``) answer ``bursts`` in turn (False once they
    run out), recording the deadline and the ``share`` each was given; the burst numbered
    ``done_at`` finishes ``op``."""
    progress = Progress(Comm(completes=True, fails=""), on_control=lambda slot: None,  # type: ignore[arg-type]
                        finished=lambda: False, failed=lambda exc: None)
    calls: list[tuple[float, Any]] = []

    def spin(until: float, share: Any) -> bool:
        calls.append((until, share))
        if len(calls) - 1 == done_at and op is not None:
            op._state = DONE
        return bursts.pop(0) if bursts else False

    progress._spin = spin  # type: ignore[method-assign]
    return progress, calls


@pytest.mark.usefixtures("frozen")
async def test_a_wait_polls_until_its_op_is_done_and_counts_as_activity() -> None:
    """Bursts that took something not the op's (a ``CTS``, another task's message) are
    followed by more; the one that finishes the op ends the wait, which counts as activity
    (the progress task spins on) and wakes a parked progress task."""
    op = Op()
    progress, calls = progress_with([True, True, True, True], op, done_at=2)
    progress._parked = asyncio.get_running_loop().create_future()
    progress.wait_here(op)
    assert len(calls) == 3 and op._state is DONE
    assert progress.sent and progress._woke and progress._parked.done()


@pytest.mark.usefixtures("frozen")
async def test_a_wait_that_finds_nothing_gives_up_after_one_burst_and_wakes_nobody() -> None:
    progress, calls = progress_with([])
    progress._parked = asyncio.get_running_loop().create_future()
    op = Op()
    progress.wait_here(op)
    assert len(calls) == 1 and op._state is QUEUED
    assert not progress.sent and not progress._parked.done()


@pytest.mark.usefixtures("frozen")
def test_a_burst_that_woke_another_task_ends_the_wait() -> None:
    """The count of woken tasks (``woken``, the engine's) moved in the second burst: a task
    is ready, and the wait gives way to it, its own op not done."""
    op = Op()
    progress, calls = progress_with([True, True, True, True], op)
    progress.woken = lambda: 7 if len(calls) >= 2 else 6
    progress.wait_here(op)
    assert len(calls) == 2 and op._state is QUEUED and progress.sent


@pytest.mark.usefixtures("frozen")
def test_the_budget_is_short_while_only_control_messages_fly_and_a_turn_while_data_moves(
        ) -> None:
    """The deadline is ``WAIT_SPIN`` from the start while no data request is in flight, and
    ``WAIT_DATA`` from the start (never more) once one is: a burst that posts a data recv
    (an ``RTS`` matched) lengthens the wait; one that ends the last shortens it again."""
    op = Op()
    progress, calls = progress_with([True, True, True], op)
    moving: list[list[object]] = [[], [object()], [], [], []]  # after burst 1, 2, ...

    def spin(until: float, share: Any) -> bool:
        calls.append((until, share))
        progress._reqs = moving[len(calls)]  # what the burst left in flight
        return len(calls) < 4

    progress._spin = spin  # type: ignore[method-assign]
    progress.wait_here(op)
    assert [u for u, _ in calls] == [NOW + WAIT_SPIN, NOW + WAIT_DATA, NOW + WAIT_SPIN,
                                     NOW + WAIT_SPIN]
    assert WAIT_SPIN < WAIT_DATA


@pytest.mark.parametrize("moving", [False, True])
def test_a_wait_ends_at_its_budget_while_messages_for_others_keep_landing(
        monkeypatch: pytest.MonkeyPatch, moving: bool) -> None:
    """Every burst takes something (messages for no waiting task, staged), never the op:
    the wait still ends once the clock passes its budget."""
    ticks = iter(range(10_000))
    monkeypatch.setattr(_mpi_progress, "time", types.SimpleNamespace(
        perf_counter=lambda: NOW + next(ticks) * 1e-6))  # a microsecond a reading
    op = Op()
    progress, calls = progress_with([True] * 1000, op)
    progress._reqs = [object()] if moving else []
    progress.wait_here(op)
    budget = WAIT_DATA if moving else WAIT_SPIN
    assert op._state is QUEUED and progress.sent
    assert len(calls) == pytest.approx(budget * 1e6, abs=2)
    assert all(until == pytest.approx(NOW + budget) for until, _ in calls)


@pytest.mark.usefixtures("frozen")
@pytest.mark.parametrize("crowded", [False, True])
def test_a_crowded_rank_gives_its_core_away_between_polls(crowded: bool) -> None:
    progress, calls = progress_with([])
    progress.crowded = crowded
    progress.wait_here(Op())
    assert calls == [(NOW + WAIT_SPIN, sched_yield if crowded else None)]


@pytest.mark.parametrize("why", ["stopped", "dispatching"])
def test_no_poll_where_mpi_failed_or_a_control_message_is_being_handed_on(why: str) -> None:
    progress, calls = progress_with([True])
    setattr(progress, "stopped" if why == "stopped" else "_dispatching", True)
    progress.wait_here(Op())
    assert calls == [] and not progress.sent


def test_an_mpi_error_while_polling_fails_the_link_and_is_not_raised() -> None:
    """As in the task: the error goes to ``failed`` (the link breaks, failing every pending
    op, the one waited for too), not to the task that happened to poll."""
    failures: list[Exception] = []
    progress = Progress(Comm(completes=True, fails=""), on_control=lambda slot: None,  # type: ignore[arg-type]
                        finished=lambda: False, failed=failures.append)
    error = RuntimeError("MPI_Test failed")

    def spin(until: float, share: Any) -> bool:
        raise error

    progress._spin = spin  # type: ignore[method-assign]
    progress.wait_here(Op())
    assert failures == [error] and not progress.sent


class Taking(Endpoint):
    """An engine whose fast lane takes every eager message into a posted recv: ``op``."""

    op = Op()

    def offer_bytes(self, source: int, tag: int, view: memoryview, nbytes: int, count: int,
                    dtype: str) -> bool:
        Taking.op._state = DONE
        return super().offer_bytes(source, tag, view, nbytes, count, dtype)


@pytest.mark.parametrize("native", [pytest.param(True, marks=pytest.mark.native), False])
async def test_a_message_that_lands_meanwhile_ends_the_wait_on_either_lane(
        native: bool) -> None:
    """On the link's own poll bursts (the Python ``_spin``, or the C lane's): an eager
    message landed in the head control recv is handed to the engine during the wait, which
    ends there, the recv taken."""
    state = {"completes": True, "fails": "", "credit": 1 << 15, "closed": False,
             "broken": False, "bell": None, "ctrl": 0, "parked": None, "landed": [w.EAGER],
             "nbytes": 8, "dtype": "<f8"}
    link = world(state, native, asyncio.get_running_loop())
    link.endpoint = Taking()  # type: ignore[assignment]
    link.offer_bytes = Taking.offer_bytes
    Taking.op = op = Op()
    link.before_wait(op)
    assert op._state is DONE and link.endpoint.offered  # type: ignore[attr-defined]
    assert link.progress.sent


@pytest.mark.parametrize(("peer", "side"), [(1, "mpi"), (3, "mpi"), (0, "rings"), (2, "rings"),
                                            (-1, "rings"), (None, "rings")])
def test_a_world_on_several_hosts_polls_mpi_for_an_op_with_a_peer_elsewhere(
        peer: int | None, side: str) -> None:
    """The link of a world on several hosts (ranks 0 and 2 on this one): a task about to wait
    for an op with a peer on another host has the MPI side poll for it; for one with a
    peer on this host, from any source (-1), or for no op (``wait_all``), the node looks
    at the rings."""
    calls: list[tuple[str, Any]] = []
    link = object.__new__(HybridTransport)
    link.progress = types.SimpleNamespace(  # type: ignore[assignment]
        mpi=types.SimpleNamespace(wait_here=lambda op: calls.append(("mpi", op))))
    link.ring_peers = frozenset({0, 2})
    link.node = types.SimpleNamespace(  # type: ignore[assignment]
        before_wait=lambda op=None: calls.append(("rings", op)))
    op = None if peer is None else types.SimpleNamespace(peer=peer)
    link.before_wait(op)
    assert calls == [(side, op)]
