"""Objects (``send_obj``/``recv_obj``) at their edges, as SPMD programs of two ranks that
run the same in-process (``test_objects_failures.py``) and under ``mpiexec -n 2``:

    python -m tests.engine.objects_cases [--env asyncio|uvloop|virtual] [CASE ...]

Each case checks itself and returns None; a failing check raises.  The cases in
``FAILING`` make a rank raise: ``ac.run`` must then raise that rank's error alone, at
once (never hang), and the peer's object must finish or fail with ``CommBrokenError``.
Run alone, the module prints one ``ok NAME`` line per case that passed (rank 0) and, for a
failing case, what the run raised and what the peer's send reported.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import asynccomm as ac
from asynccomm._comm.groups import OBJECT_TAGS
from asynccomm.testing import posted

#: An array above the eager limit (256 KiB): its buffer goes by rendezvous.
BIG = 32768
GO = 90  # the tag of "go on" signals


def check(cond: object, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def big(ident: float) -> dict[str, Any]:
    return {"id": ident, "w": np.full(BIG, ident)}


def intact(obj: Any, ident: float) -> bool:
    return bool(obj["id"] == ident and obj["w"].shape == (BIG,) and (obj["w"] == ident).all())


async def signal(comm: ac.Communicator, dst: int) -> None:
    await comm.send(np.zeros(1), dst, GO)


async def wait_signal(comm: ac.Communicator, src: int) -> None:
    await comm.recv(np.zeros(1), src, GO)


def nothing_pending(comm: ac.Communicator) -> None:
    private = comm._private()
    check(comm.statistics().pending_ops == 0, f"rank {comm.rank}: ops left pending")
    check(private.statistics().pending_ops == 0,
          f"rank {comm.rank}: object buffers left pending")
    check(private.statistics().matcher.unexpected_messages == 0,
          f"rank {comm.rank}: a stray message of an object's is left behind")


async def still_works(comm: ac.Communicator) -> None:
    """Nothing is left pending on this rank (checked before the peer goes on), and the
    communicator works after: one object each way, intact."""
    peer = 1 - comm.rank
    nothing_pending(comm)
    await signal(comm, peer)
    await wait_signal(comm, peer)
    got = asyncio.ensure_future(comm.recv_obj(peer, 77))
    await comm.send_obj(big(10 + comm.rank), peer, 77)
    obj, status = await got
    check(intact(obj, 10 + peer) and status.source == peer, f"got {obj!r}")
    nothing_pending(comm)


# -- the cases ------------------------------------------------------------------------------


async def timeout_abandons(comm: ac.Communicator) -> None:
    """``send_obj``'s timeout bounds the whole call: its header staged, its buffer waiting
    for a receiver that is busy, it raises CommTimeoutError; the receiver's recv_obj of
    that object then fails with CommTimeoutError too, and nothing is left pending."""
    if comm.rank == 0:
        try:
            await comm.send_obj(big(1), 1, 1, timeout=0.2)
        except ac.CommTimeoutError as exc:
            check("abandoned" in str(exc), str(exc))
        else:
            raise AssertionError("send_obj returned after its timeout")
        await signal(comm, 1)
    else:
        await wait_signal(comm, 0)
        try:
            obj = await comm.recv_obj(0, 1)
        except ac.CommTimeoutError as exc:
            check("abandoned" in str(exc), str(exc))
        else:
            raise AssertionError(f"received an abandoned object: {obj!r}")
    await still_works(comm)


async def timeout_spares_a_delivered_object(comm: ac.Communicator) -> None:
    """A timeout that does not expire delivers the object (and a receiver waiting with a
    timeout gets it)."""
    if comm.rank == 0:
        await comm.send_obj(big(2), 1, 2, timeout=30)
    else:
        obj, _ = await comm.recv_obj(0, 2, timeout=30)
        check(intact(obj, 2), f"got {obj!r}")
    await still_works(comm)


async def cancel_after_match_is_refused(comm: ac.Communicator) -> None:
    """``cancel()`` of an object whose header matched returns False, and the object
    arrives whole; on both sides."""
    if comm.rank == 0:
        req = comm.isend_obj(big(3), 1, 3)
        await req._first  # the header is staged or taken
        check(not req.cancel(), "send_obj's cancel() returned True after its header went")
        await req
        check(not req.cancelled(), "a delivered object's send reports cancelled")
    else:
        req = comm.irecv_obj(0, 3)
        await req._first  # the header matched
        check(not req.cancel(), "recv_obj's cancel() returned True after its header matched")
        obj, _ = await req
        check(not req.cancelled() and intact(obj, 3), f"got {obj!r}")
    await still_works(comm)


async def cancel_before_match_withdraws(comm: ac.Communicator) -> None:
    """``cancel()`` before the header matched withdraws the recv (True, cancelled); the
    object then goes to the next recv_obj."""
    if comm.rank == 1:
        req = comm.irecv_obj(0, 4)
        check(req.cancel() and req.cancelled() and req.done(), "cancel() refused")
        try:
            await req
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("a withdrawn recv_obj returned")
        await signal(comm, 0)
        obj, _ = await comm.recv_obj(0, 4)
        check(intact(obj, 4), f"got {obj!r}")
    else:
        await wait_signal(comm, 1)
        await comm.send_obj(big(4), 1, 4)
    await still_works(comm)


async def recv_new_never_takes_an_object(comm: ac.Communicator) -> None:
    """``recv_new`` (exact or wildcard, waiting first or coming after a probe) refuses an
    object with DTypeMismatchError and the object waits for its recv_obj; and recv_obj
    refuses an array, which waits for recv_new."""
    if comm.rank == 0:
        await comm.send_obj({"a": np.arange(5)}, 1, 5)
        await wait_signal(comm, 1)  # its recv_new waits first
        await comm.send_obj(big(6), 1, 6)
        await comm.send(np.arange(7.0), 1, 7)
    else:
        status = await comm.probe(0, 5)
        check(status.tag == 5, f"probed {status}")
        for src, tag in ((0, 5), (ac.ANY_SOURCE, ac.ANY_TAG)):
            try:
                await comm.recv_new(src, tag)
            except ac.DTypeMismatchError as exc:
                check("recv_obj" in str(exc), str(exc))
            else:
                raise AssertionError("recv_new took an object")
        obj, _ = await comm.recv_obj(0, 5)
        check(obj["a"].tolist() == list(range(5)), f"got {obj!r}")
        waiting = await posted(comm.recv_new(0, 6))
        await signal(comm, 0)
        try:
            await waiting
        except ac.DTypeMismatchError:
            pass
        else:
            raise AssertionError("a waiting recv_new took an object")
        obj, _ = await comm.recv_obj(0, 6)
        check(intact(obj, 6), f"got {obj!r}")
        await comm.probe(0, 7)
        try:
            await comm.recv_obj(0, 7)
        except ac.DTypeMismatchError:
            pass
        else:
            raise AssertionError("recv_obj took an array")
        arr, _ = await comm.recv_new(0, 7)
        check(arr.tolist() == list(np.arange(7.0)), f"got {arr!r}")
    await still_works(comm)


async def flight_record_shows_object_buffers(comm: ac.Communicator) -> None:
    """The buffers of an object in flight are pending ops of the flight record."""
    if comm.rank == 0:
        req = comm.isend_obj(big(8), 1, 8)
        await req._first
        for _ in range(8):  # a few turns of the loop: its task posts the buffer
            pending = [d for d in comm.flight_record()
                       if d["state"] in ("queued", "posted", "matched")]
            if any(d["op"] == "send" and d["peer"] == 1 and d["tag"] >= OBJECT_TAGS
                   and d["nbytes"] == BIG * 8 for d in pending):
                break
            await asyncio.sleep(0)
        else:
            raise AssertionError(f"no pending object buffer in {pending}")
        await signal(comm, 1)
        await req
    else:
        await wait_signal(comm, 0)
        obj, _ = await comm.recv_obj(0, 8)
        check(intact(obj, 8), f"got {obj!r}")
    await still_works(comm)


async def close_after_the_header(comm: ac.Communicator) -> None:
    """A rank that closes its communicator once its recv_obj took a header: the object
    finishes (on MPI the close waits for its peers, and the buffers move meanwhile) or
    fails, CommClosedError for the recv_obj, CommBrokenError for the send; nothing is
    left posted on the closed communicator, where no peer could complete it."""
    if comm.rank == 0:
        try:
            await comm.send_obj(big(11), 1, 11)
        except ac.CommBrokenError:
            pass
        return
    req = comm.irecv_obj(0, 11)
    await req._first
    await comm.aclose()
    try:
        obj, _ = await req
    except ac.CommClosedError:
        pass
    else:
        check(intact(obj, 11), f"got {obj!r}")
    private = comm._private_comm
    check(private is None or private.statistics().pending_ops == 0,
          "an object buffer left posted")


CASES: dict[str, Callable[[ac.Communicator], Awaitable[None]]] = {
    f.__name__: f for f in (timeout_abandons, timeout_spares_a_delivered_object,
                            cancel_after_match_is_refused, cancel_before_match_withdraws,
                            recv_new_never_takes_an_object,
                            flight_record_shows_object_buffers, close_after_the_header)
}


# -- a rank fails while its peer's object is in flight -------------------------------------


class Boom(RuntimeError):
    """The failure of the rank that fails."""


def failing(when: str, timeout: float | None) -> Callable[[ac.Communicator], Awaitable[Any]]:
    """Rank 0 sends an object with a buffer above the eager limit; rank 1 fails
    ``when``: "before" taking its header, or "after" (its recv_obj had taken it).  Rank 0
    returns what its send reported."""
    async def program(comm: ac.Communicator) -> str:
        if comm.rank == 0:
            try:
                await comm.send_obj(big(9), 1, 9, timeout=timeout)
            except ac.CommBrokenError:
                return "CommBrokenError"
            return "sent"
        if when == "after":
            req = comm.irecv_obj(0, 9)
            await req._first
        raise Boom(f"rank 1 fails {when} the header")

    return program


FAILING = {f"fail_{when}_{name}": failing(when, timeout)
           for when in ("before", "after")
           for name, timeout in (("no_timeout", None), ("long_timeout", 600.0))}


def run_failing(name: str, **env: Any) -> str:
    """Run the failing case ``name``; what ``ac.run`` raised and rank 0 reported."""
    outcome: list[str] = []
    program = FAILING[name]

    async def recorded(comm: ac.Communicator) -> Any:
        result = await program(comm)
        outcome.append(result)
        return result

    try:
        ac.run(recorded, world_size=None if ac.launched_by_mpi() else 2, **env)
    except Boom as exc:
        raised = f"Boom: {exc}"
    except BaseException as exc:  # reported, whatever it is
        raised = f"{type(exc).__name__}: {exc}"
    else:
        raised = "nothing"
    return f"raised {raised}; rank 0 {outcome[0] if outcome else 'none'}"


async def deadlock(comm: ac.Communicator) -> None:
    """Rank 0's object waits for rank 1, which waits for a message rank 0 never sends."""
    if comm.rank == 0:
        await comm.send_obj(big(12), 1, 12)
    else:
        await comm.recv(np.zeros(1), 0, 50)


ENVS: dict[str, dict[str, Any]] = {"asyncio": {"loop": "asyncio"},
                                   "uvloop": {"loop": "uvloop"},
                                   "virtual": {"clock": "virtual"}}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="asyncio", choices=list(ENVS))
    parser.add_argument("cases", nargs="*")
    args = parser.parse_args()
    env = {} if ac.launched_by_mpi() else ENVS[args.env]
    failed = 0
    for name in args.cases or list(CASES):
        if name == "deadlock":
            try:
                ac.run(deadlock, world_size=2, **env)
            except Exception as exc:  # reported
                sys.stdout.write(f"deadlock: raised {type(exc).__name__}: {exc}\n")
            continue
        if name in FAILING:
            sys.stdout.write(f"{name}: {run_failing(name, **env)}\n")
            continue
        try:
            ac.run(CASES[name], world_size=None if ac.launched_by_mpi() else 2, **env)
        except Exception as exc:  # reported
            failed += 1
            sys.stdout.write(f"FAILED {name}: {type(exc).__name__}: {exc}\n")
        else:
            if not ac.launched_by_mpi() or ac.mpi_world_size() is None or _rank() == 0:
                sys.stdout.write(f"ok {name}\n")
    sys.stdout.flush()
    return 1 if failed else 0


def _rank() -> int:
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.Get_rank())


if __name__ == "__main__":
    sys.exit(main())
