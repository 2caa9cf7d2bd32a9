"""Random object programs: rank 0 sends objects (``send_obj``) that are cancelled and time
out at random points, rank 1 receives them with its own cycle of cancellations, timeouts
and array recvs that must refuse them, and in some programs rank 1 fails mid-way.

The invariant: every object is received exactly once and intact, or its send and its
recv both raise typed errors (withdrawn: ``CancelledError`` or ``CommTimeoutError``
before its header went; abandoned: ``CommTimeoutError`` on both sides; a peer that
failed: ``CommBrokenError``); ``cancel()`` returns True exactly when the op is then
reported cancelled; ``recv_new`` never takes an object; nothing hangs and nothing stays
pending; the communicator works after.  Programs synchronise with messages only, so a
plan runs in-process (``test_objects_programs.py``), on the virtual clock and under
``mpiexec`` (``mpi_objects_runner.py``; there without a failing rank, whose error ends
the job).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

import asynccomm as ac

from .objects_cases import Boom, check, nothing_pending, still_works

#: Bytes of the array inside an object: none at all (the header is the whole object), one
#: small eager buffer, one just above the eager limit, and 1 MiB.
SIZES = (-1, 64, ac.EAGER_LIMIT + 8, 1 << 20)
SEND_MODES = ("send", "isend", "req_cancel", "task_cancel", "timeout0", "timeout_tiny")
RECV_MODES = ("recv", "req_cancel", "task_cancel", "timeout0", "timeout_tiny", "recv_new")
TINY = 1e-4
DATA, MANIFEST, DONE = 1, 2, 3


@dataclass(frozen=True)
class Plan:
    """Rank 0's sends (size index, mode, loop turns before cancelling), rank 1's recv
    attempts (mode, turns), used in a cycle, and after how many attempts rank 1 fails
    (None: it does not)."""

    sends: tuple[tuple[int, str, int], ...]
    recvs: tuple[tuple[str, int], ...]
    fail_after: int | None = None


def plans(*, failures: bool = True) -> st.SearchStrategy[Plan]:
    send = st.tuples(st.integers(0, len(SIZES) - 1), st.sampled_from(SEND_MODES),
                     st.integers(0, 3))
    recv = st.tuples(st.sampled_from(RECV_MODES), st.integers(0, 3))
    return st.builds(
        Plan,
        sends=st.lists(send, min_size=1, max_size=8).map(tuple),
        # A plain recv ends every cycle, so rendezvous buffers always find a taker.
        recvs=st.lists(recv, min_size=0, max_size=5).map(lambda r: (*r, ("recv", 0))),
        fail_after=st.none() | st.integers(0, 8) if failures else st.none(),
    )


def make(ident: int, size: int) -> dict[str, Any]:
    obj: dict[str, Any] = {"id": ident}
    if size >= 0:
        obj["data"] = ((np.arange(size) * 7 + ident) % 251).astype(np.uint8)
    return obj


def intact(obj: Any, size: int) -> bool:
    if not isinstance(obj, dict) or ("data" in obj) != (size >= 0):
        return False
    return size < 0 or bool(np.array_equal(obj["data"], make(obj["id"], size)["data"]))


async def turns(k: int) -> None:
    for _ in range(k):
        await asyncio.sleep(0)


def _typed(exc: BaseException, broken_ok: bool) -> str:
    """What a failed op's error says happened to its object."""
    if isinstance(exc, asyncio.CancelledError):
        return "withdrawn"
    if isinstance(exc, ac.CommTimeoutError):
        return "abandoned" if "abandoned" in str(exc) else "withdrawn"
    if broken_ok and isinstance(exc, ac.CommBrokenError | ac.CommClosedError):
        return "broken"
    raise exc


async def _outcome(op: Any, broken_ok: bool, cancelled: bool | None = None) -> Any:
    """The result of ``op``, or what its error says; ``cancelled``: what its ``cancel()``
    returned, which the outcome must agree with."""
    try:
        result = await op
    except BaseException as exc:  # typed below, or raised again
        task = asyncio.current_task()
        if (isinstance(exc, asyncio.CancelledError) and task is not None
                and task.cancelling()):  # this rank's own task, cancelled by the run
            raise
        how = _typed(exc, broken_ok)
        check(cancelled is None or cancelled == (how == "withdrawn"
                                                 and isinstance(exc, asyncio.CancelledError)),
              f"cancel() returned {cancelled} but the op ended: {exc!r}")
        return how
    check(not cancelled, "cancel() returned True but the op completed")
    return result


# -- rank 0 ------------------------------------------------------------------------------------


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Mark ``task``'s outcome as seen: a rank the run cancels (a peer failed) while it waits
    its turns never awaits its task, whose error would be logged as never retrieved."""
    if not task.cancelled():
        task.exception()


async def _send_one(comm: ac.Communicator, obj: Any, mode: str, k: int,
                    broken_ok: bool) -> Any:
    if mode in ("isend", "req_cancel"):
        req = comm.isend_obj(obj, 1, DATA)
        if mode == "isend":
            return req
        await turns(k)
        return await _outcome(req, broken_ok, req.cancel())
    if mode == "task_cancel":
        task = asyncio.ensure_future(comm.send_obj(obj, 1, DATA))
        task.add_done_callback(_retrieved)  # this rank may be cancelled before it awaits it
        await turns(k)
        task.cancel()
        return await _outcome(task, broken_ok)
    timeout = {"send": None, "timeout0": 0.0, "timeout_tiny": TINY}[mode]
    return await _outcome(comm.send_obj(obj, 1, DATA, timeout=timeout), broken_ok)


async def sender(comm: ac.Communicator, plan: Plan) -> list[int]:
    broken_ok = plan.fail_after is not None
    outcomes = [await _send_one(comm, make(i, SIZES[size]), mode, k, broken_ok)
                for i, (size, mode, k) in enumerate(plan.sends)]
    for i, outcome in enumerate(outcomes):
        if not isinstance(outcome, str | None):  # a request: settle it
            outcomes[i] = await _outcome(outcome, broken_ok)
    sent = [i for i, outcome in enumerate(outcomes) if outcome is None]
    await comm.send(np.array([len(sent), *sent], np.int64), 1, MANIFEST)
    await comm.recv(np.zeros(1), 1, DONE)  # rank 1 has checked (or failed)
    await still_works(comm)
    return sent


# -- rank 1 ------------------------------------------------------------------------------------


class _Receiver:
    def __init__(self, comm: ac.Communicator, plan: Plan) -> None:
        self.comm, self.plan = comm, plan
        self.got: list[int] = []

    def took(self, result: Any) -> None:
        if isinstance(result, str):  # withdrawn or abandoned: nothing was received
            return
        obj, status = result
        check(status.source == 0 and status.tag == DATA, f"status {status}")
        ident = obj["id"]
        check(intact(obj, SIZES[self.plan.sends[ident][0]]), f"object {ident} corrupted")
        check(ident not in self.got, f"object {ident} received twice")
        self.got.append(ident)

    async def one(self, mode: str, k: int, manifest: ac.Request) -> None:
        comm = self.comm
        if mode in ("recv", "req_cancel"):
            req = comm.irecv_obj(0, DATA)
            if mode == "req_cancel":
                await turns(k)
            else:
                await _outcome(ac.wait_any([req, manifest]), False)
            cancelled = req.cancel() if not req.done() else None
            self.took(await _outcome(req, False, cancelled))
        elif mode == "task_cancel":
            task = asyncio.ensure_future(comm.recv_obj(0, DATA))
            await turns(k)
            task.cancel()
            self.took(await _outcome(task, False))
        elif mode == "recv_new":
            try:
                arr, _ = await comm.recv_new(0, DATA, timeout=TINY)
            except (ac.DTypeMismatchError, ac.CommTimeoutError):
                pass
            else:
                raise AssertionError(f"recv_new took an object's header: {arr!r}")
        else:
            self.took(await _outcome(comm.recv_obj(
                0, DATA, timeout=0.0 if mode == "timeout0" else TINY), False))


async def receiver(comm: ac.Communicator, plan: Plan) -> list[int]:
    me = _Receiver(comm, plan)
    box = np.zeros(len(plan.sends) + 1, np.int64)
    manifest = comm.irecv(box, 0, MANIFEST)
    attempts = 0
    while not manifest.done():
        if attempts == plan.fail_after:
            raise Boom(f"rank 1 fails after {attempts} recvs")
        mode, k = plan.recvs[attempts % len(plan.recvs)]
        attempts += 1
        await me.one(mode, k, manifest)
    if plan.fail_after is not None:
        raise Boom("rank 1 fails once every object was sent")
    sent = [int(x) for x in box[1:1 + int(box[0])]]
    while len(me.got) < len(sent) or comm.iprobe(0, DATA) is not None:
        # Every object that went was announced before the manifest: what is not here now
        # was lost.  Abandoned ones are drained too: each recv_obj fails.
        check(comm.iprobe(0, DATA) is not None, f"lost: got {me.got}, sent {sent}")
        me.took(await _outcome(comm.recv_obj(0, DATA), False))
    check(me.got == sent, f"received {me.got}, but the sends that succeeded were {sent}")
    nothing_pending(comm)
    await comm.send(np.zeros(1), 0, DONE)
    await still_works(comm)
    return me.got


def program(plan: Plan) -> Callable[[ac.Communicator], Awaitable[Any]]:
    """The SPMD program of ``plan`` (ranks above 1 take no part)."""
    async def objects(comm: ac.Communicator) -> Any:
        if comm.size < 2 or comm.rank > 1:
            return None
        return await (sender if comm.rank == 0 else receiver)(comm, plan)

    return objects
