"""Large copies on the process's copy threads (``asynccomm._engine.copies``): cut in pieces
side by side, every byte in place, ``on_done`` once after the last piece, a piece's error
passed on, a pool of the process's own after a fork."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from typing import Any

import numpy as np
import pytest

import asynccomm as ac
from asynccomm._engine import copies
from asynccomm._engine.fast import THREAD_COPY_MIN

LOOPS = ["asyncio", "uvloop"]
MiB = 1 << 20


def test_pieces_cut_a_copy_past_two_pieces_and_under_the_split_limit() -> None:
    assert copies.pieces(THREAD_COPY_MIN, 2) == 1
    assert copies.pieces(2 * copies.PIECE_MIN - 1, 4) == 1
    assert copies.pieces(2 * copies.PIECE_MIN, 4) == 2
    assert copies.pieces(16 * MiB, 2) == 2
    assert copies.pieces(16 * MiB, 4) == 4
    assert copies.pieces(16 * MiB, 1) == 1
    assert copies.pieces(copies.SPLIT_MAX - 1, 4) == 4
    assert copies.pieces(copies.SPLIT_MAX, 4) == 1
    assert 1 <= copies.threads() <= copies.MAX_THREADS


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
@pytest.mark.parametrize("nbytes", [8 * MiB, 8 * MiB + 3, 13 * MiB + 7])
def test_every_byte_lands_and_on_done_runs_once_after_the_last_piece(
        monkeypatch: pytest.MonkeyPatch, workers: int, nbytes: int) -> None:
    monkeypatch.setattr(copies, "threads", lambda: workers)
    monkeypatch.setattr(copies, "_pool", None)
    src = np.random.default_rng(nbytes).integers(0, 256, nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    ends: list[BaseException | None] = []

    async def main() -> None:
        done = asyncio.get_running_loop().create_future()

        def on_done(exc: BaseException | None) -> None:
            ends.append(exc)
            assert np.array_equal(dst, src)  # every piece is in by now
            done.set_result(None)

        copies.copy(asyncio.get_running_loop(), dst, src, on_done)
        await asyncio.wait_for(done, 30)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert ends == [None]
    assert copies._pool_threads == workers


def test_a_piece_that_fails_is_passed_on_once_the_others_are_done(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copies, "threads", lambda: 2)
    monkeypatch.setattr(copies, "_pool", None)
    nbytes = 16 * MiB
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    real = np.copyto
    boom = RuntimeError("piece failed")

    def copyto(d: Any, s: Any) -> None:
        if d.ctypes.data != dst.ctypes.data:  # the second half
            raise boom
        real(d, s)

    monkeypatch.setattr(copies.np, "copyto", copyto)
    ends: list[BaseException | None] = []

    async def main() -> None:
        done = asyncio.get_running_loop().create_future()
        copies.copy(asyncio.get_running_loop(), dst, src,
                    lambda exc: (ends.append(exc), done.set_result(None)))
        await asyncio.wait_for(done, 30)

    asyncio.run(main())
    assert ends == [boom]
    assert dst[: nbytes // 2].all() and not dst[nbytes // 2:].any()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_forked_process_copies_on_a_pool_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copies, "threads", lambda: 2)
    monkeypatch.setattr(copies, "_pool", None)
    nbytes = 16 * MiB

    def one_copy() -> bool:
        src, dst = np.full(nbytes, 7, np.uint8), np.zeros(nbytes, np.uint8)

        async def main() -> None:
            done = asyncio.get_running_loop().create_future()
            copies.copy(asyncio.get_running_loop(), dst, src,
                        lambda exc: done.set_result(exc))
            assert await asyncio.wait_for(done, 20) is None

        asyncio.run(main())
        return bool(np.array_equal(src, dst))

    assert one_copy()  # the parent's pool has started its threads
    parent_pool = copies._pool

    def child() -> None:  # its threads did not survive the fork
        os._exit(0 if one_copy() and copies._pool is not parent_pool else 1)

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join(60)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        pytest.fail("the forked process did not finish its copy within 60 s")
    assert proc.exitcode == 0
    assert copies._pool is parent_pool


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("nbytes", [THREAD_COPY_MIN, 9 * MiB + 5, 24 * MiB + 1])
def test_a_large_transfer_arrives_intact_in_pieces(loop: str, nbytes: int) -> None:
    async def main(comm: ac.Communicator) -> bool:
        if comm.rank == 0:
            data = np.random.default_rng(nbytes).integers(0, 256, nbytes, np.uint8)
            await asyncio.wait_for(comm.send(data, 1, 3), 60)
            return True
        got = np.zeros(nbytes, np.uint8)
        await asyncio.wait_for(comm.recv(got, 0, 3), 60)
        want = np.random.default_rng(nbytes).integers(0, 256, nbytes, np.uint8)
        return bool(np.array_equal(got, want))

    assert ac.run(main, 2, loop=loop) == [True, True]
