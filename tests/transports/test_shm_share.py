"""A large offer's copy shared by its two processes (``shm.SHARE_MIN``, ``lane.share``).

The receiver sets its board (the next piece to claim, the pieces copied, a piece given
back: each word tagged with the copy's generation), tells the sender (``DATA_SHARE``), and
both claim pieces and copy them; the receiver completes the recv only once every piece is
in.  Here: every interleaving of a model of those steps (the receiver, the sender, one of
them failing, a sender still busy with an older copy of the same board) keeps the rule
"complete only once every piece is written, and nothing written after"; the C function
itself, in one process; and two links in this process copying messages of several reads
with the sender's help, its help failing, and its help refused.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import mmap
import os
import threading
from typing import Any

import numpy as np
import pytest

from asynccomm._comm import native as _native
from asynccomm._engine.lane import LANE
from asynccomm.transports import _shm_ring, shm
from asynccomm.transports.shm import READ_CHUNK, SHARE_MIN, missing, share_piece

from .test_shm_path import _opened, _run

pytestmark = [pytest.mark.native,
              pytest.mark.skipif(LANE is None or _native.CONFIGURED is None
                                 or not _shm_ring.NATIVE or missing() is not None,
                                 reason="the C lane is not built here (or switched off)")]

# -- every interleaving of a model of the protocol ----------------------------------------
#
# A state: the board's three words (each a (generation, value) pair), each actor's program
# counter and locals, the pieces (generation, index) the sender is copying and those
# copied, the generations complete, and those the receiver started (``DATA_SHARE`` sent:
# their sender may act from then on).  A step is one atomic access of a word, or a copy.

END: tuple[Any, ...] = ("end",)


class _State:
    """One state of the model (mutable while a step runs; ``key`` is its frozen form)."""

    def __init__(self, key: tuple[Any, ...]) -> None:
        board, self.pcs, writing, written, complete, started = key
        self.board = dict(board)
        self.writing, self.written = set(writing), set(written)
        self.complete, self.started = set(complete), set(started)

    def key(self, pcs: tuple[Any, ...]) -> tuple[Any, ...]:
        return (tuple(sorted(self.board.items())), pcs, frozenset(self.writing),
                frozenset(self.written), frozenset(self.complete), frozenset(self.started))

    def count(self, g: int) -> None:
        """``count_piece``: one compare-and-swap, only while the board is generation g's."""
        if self.board["done"][0] == g:
            self.board["done"] = (g, self.board["done"][1] + 1)

    def wrote(self, g: int, idx: int) -> None:
        assert g not in self.complete, f"generation {g}'s buffer written after it completed"
        self.written.add((g, idx))


CLOSED = 1 << 32  # (a closed board's claim: past every piece)


def _reader(g: int, pieces: int, pc: tuple[Any, ...], st: _State,
            fail: bool = False) -> tuple[Any, ...]:
    """The receiver's next step (``Channels._read_shared``, ``lane.share``'s reader); its
    first copy fails if ``fail`` (``Channels._settle``, then the recv fails: nothing may be
    written into its buffer after)."""
    b, at = st.board, pc[0]
    if at == "init back":
        b["back"] = (g, 0)
        return ("init done",)
    if at == "init done":
        b["done"] = (g, 0)
        return ("init claim",)
    if at == "init claim":
        b["claim"] = (g, 0)
        st.started.add(g)
        return ("look",)
    if at == "look":  # the next piece to claim
        c = b["claim"]
        return ("back?",) if c[0] != g or c[1] >= pieces else ("claim", c)
    if at == "claim":  # compare and swap
        if b["claim"] != pc[1]:
            return ("look",)
        b["claim"] = (g, pc[1][1] + 1)
        return ("copy", pc[1][1], "look")
    if at == "copy":  # a piece it claimed, or one given back
        if fail:
            return ("close",)
        st.wrote(g, pc[1])
        return ("count", pc[2])
    if at == "close":  # compare and swap (as a swap: the receiver alone closes it)
        c = b["claim"]
        b["claim"] = (g, CLOSED)
        return ("settled?", min(c[1], pieces) if c[0] == g else 0)
    if at == "settled?":  # every piece claimed counted, given back, or its own (lost)?
        done = b["done"][1] if b["done"][0] == g else 0
        back = 1 if b["back"][0] == g and b["back"][1] else 0
        if done + back + 1 < pc[1]:
            return pc  # (waits: looks again)
        assert not any(w[0] == g for w in st.writing), (
            f"generation {g} failed while a piece is written")
        st.complete.add(g)  # (the recv failed: its buffer is its user's again)
        return END
    if at == "count":
        st.count(g)
        return (pc[1],)
    if at == "back?":  # a piece given back?
        bk = b["back"]
        return ("take back", bk[1] - 1) if bk[0] == g and bk[1] else ("done?",)
    if at == "take back":
        b["back"] = (0, 0)
        return ("copy", pc[1], "done?")
    if at == "done?":
        if b["done"] != (g, pieces):
            return ("back?",)  # (waits: looks again)
        assert {(g, i) for i in range(pieces)} <= st.written, f"generation {g} incomplete"
        assert not any(w[0] == g for w in st.writing), (
            f"generation {g} completed while a piece is written")
        st.complete.add(g)
        return END
    raise AssertionError(pc)


def _writer(g: int, pieces: int, fail: bool, pc: tuple[Any, ...], st: _State) -> tuple[Any, ...]:
    """The sender's next step (``Channels._help``, ``lane.share``'s writer); its first copy
    fails if ``fail`` (the piece given back)."""
    b, at = st.board, pc[0]
    if at == "look":
        c = b["claim"]
        return END if c[0] != g or c[1] >= pieces else ("claim", c)
    if at == "claim":
        if b["claim"] != pc[1]:
            return ("look",)
        b["claim"] = (g, pc[1][1] + 1)
        return ("copy", pc[1][1])
    if at == "copy":
        if fail:
            b["back"] = (g, pc[1] + 1)
            return END
        assert g not in st.complete, f"generation {g}'s buffer written after it completed"
        st.writing.add((g, pc[1]))  # (a copy into the recv buffer takes a while)
        return ("copied", pc[1])
    if at == "copied":
        st.writing.discard((g, pc[1]))
        st.wrote(g, pc[1])
        return ("count",)
    if at == "count":
        st.count(g)
        return ("look",)
    raise AssertionError(pc)


def _explore(actors: list[tuple[Any, tuple[Any, ...], Any]]) -> int:
    """Every state reachable by interleaving the steps of ``actors`` (each: its step
    function, its first program counter, and when it may start); asserts the rule at
    every step, and that every state can still reach the end of every actor (none waits
    for ever).  The number of states."""
    zero = (("back", (0, 0)), ("claim", (0, 0)), ("done", (0, 0)))
    first = (zero, tuple(pc for _, pc, _ in actors), frozenset(), frozenset(), frozenset(),
             frozenset())
    edges: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    todo = [first]
    while todo:
        key = todo.pop()
        if key in edges:
            continue
        edges[key] = []
        for i, (step, _, may) in enumerate(actors):
            pcs = key[1]
            probe = _State(key)
            if pcs[i] == END or not may(probe):
                continue
            new = step(pcs[i], probe)
            nxt = probe.key(pcs[:i] + (new,) + pcs[i + 1:])
            edges[key].append(nxt)
            todo.append(nxt)
    ends = {k for k in edges if all(pc == END for pc in k[1])}
    assert ends, "no interleaving ends"
    able = set(ends)  # the states that can reach an end
    changed = True
    while changed:
        changed = False
        for k, outs in edges.items():
            if k not in able and any(o in able for o in outs):
                able.add(k)
                changed = True
    assert able == set(edges), "some interleaving waits for ever"
    return len(edges)


def _always(st: _State) -> bool:
    return True


def _once_started(g: int) -> Any:
    return lambda st: g in st.started


def _once_complete(g: int) -> Any:
    return lambda st: g in st.complete


def _r(g: int, pieces: int, fail: bool = False) -> Any:
    return lambda pc, st: _reader(g, pieces, pc, st, fail)


def _w(g: int, pieces: int, fail: bool = False) -> Any:
    return lambda pc, st: _writer(g, pieces, fail, pc, st)


@pytest.mark.parametrize("fail", [False, True])
@pytest.mark.parametrize("pieces", [1, 2, 3])
def test_every_interleaving_completes_only_once_every_piece_is_in(pieces: int,
                                                                  fail: bool) -> None:
    """The receiver and the sender of one copy (the sender's first copy failing if
    ``fail``): in every interleaving the recv completes, only once every piece is written,
    with no copy under way then or after."""
    n = _explore([(_r(1, pieces), ("init back",), _always),
                  (_w(1, pieces, fail), ("look",), _once_started(1))])
    assert n > 20


@pytest.mark.parametrize("pieces", [1, 2, 3])
def test_a_failing_receiver_gives_its_buffer_back_only_once_no_piece_is_written(
        pieces: int) -> None:
    """The receiver's copy fails: in every interleaving it closes the board and fails its
    recv only once the sender writes no piece into the buffer, and the sender writes none
    after."""
    n = _explore([(_r(1, pieces, fail=True), ("init back",), _always),
                  (_w(1, pieces), ("look",), _once_started(1))])
    assert n > 10


def test_the_model_finds_a_receiver_that_fails_at_once() -> None:
    """(The check can fail: a receiver that fails its recv as soon as its copy fails,
    while the sender may be copying a piece it claimed, fails early in some
    interleaving.)"""

    def hasty(pc: tuple[Any, ...], st: _State) -> tuple[Any, ...]:
        if pc[0] == "settled?":
            pc = ("settled?", 0)
        return _reader(1, 2, pc, st, fail=True)

    with pytest.raises(AssertionError, match="while a piece|after it completed"):
        _explore([(hasty, ("init back",), _always), (_w(1, 2), ("look",), _once_started(1))])


def test_a_sender_busy_with_an_older_copy_touches_nothing_of_the_next() -> None:
    """The board reused: generation 2 starts once generation 1 completed, while generation
    1's sender may still be about to claim or count (it looked at the board before): it
    claims, copies and counts nothing of generation 2, in every interleaving."""
    n = _explore([(_r(1, 2), ("init back",), _always),
                  (_w(1, 2), ("look",), _once_started(1)),
                  (_r(2, 2), ("init back",), _once_complete(1)),
                  (_w(2, 2), ("look",), _once_started(2))])
    assert n > 100


def test_the_model_finds_a_broken_rule() -> None:
    """(The check can fail: a receiver that completes once no piece is left to claim,
    without waiting for the sender's copies, completes early in some interleaving.)"""

    def hasty(pc: tuple[Any, ...], st: _State) -> tuple[Any, ...]:
        if pc[0] == "back?":
            pc = ("done?",)
            st.board["done"] = (1, 2)  # (takes the count for done)
        return _reader(1, 2, pc, st)

    with pytest.raises(AssertionError, match="incomplete|while a piece"):
        _explore([(hasty, ("init back",), _always), (_w(1, 2), ("look",), _once_started(1))])


def test_the_links_records_are_no_kind_of_the_wire() -> None:
    """The shared-memory link's own records (rendezvous data, answers, a shared copy) share
    the rings with the wire's messages: their kinds are none of the wire's."""
    from asynccomm._core import wire

    own = {shm.DATA, shm.DATA_AT, shm.DATA_DONE, shm.DATA_REFUSED, shm.DATA_COPYING,
           shm.DATA_SHARE}
    assert len(own) == 6 and not own & set(wire.KIND_NAMES)


# -- the C function, in one process -----------------------------------------------------

def _board(gen: int) -> tuple[Any, Any]:
    mm = mmap.mmap(-1, 4096)
    words = _shm_ring._native_shm.Words(mm)
    words.store(16, 0)
    words.store(8, gen << 32)
    words.store(0, gen << 32)
    return mm, words


def _arrays(n: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    src = (np.arange(n, dtype=np.uint64) * 7 + 3).astype(np.uint8)
    return src, np.zeros(n, np.uint8)


def test_share_claims_up_to_its_budget_then_the_reader_takes_the_rest() -> None:
    """The writer claims and copies pieces up to its budget (not finished: pieces are left);
    the reader copies the rest and, every piece counted, says the copy is complete."""
    lane = _shm_ring._native_shm
    n, piece, gen = (1 << 20) + 3, 1 << 16, 7
    mm, words = _board(gen)
    src, dst = _arrays(n)
    a_src, a_dst, pid = lane.address(src), lane.address(dst), os.getpid()
    assert lane.share(words, 0, gen, pid, a_src, a_dst, n, piece, 3 * piece, 0, True) is False
    assert words.load(0) == (gen << 32) | 3 and words.load(8) == (gen << 32) | 3
    assert np.array_equal(dst[:3 * piece], src[:3 * piece]) and not dst[3 * piece:].any()
    assert lane.share(words, 0, gen, pid, a_dst, a_src, n, piece, 1 << 30, 0, False) is True
    assert np.array_equal(dst, src)
    pieces = -(-n // piece)
    assert words.load(0) == words.load(8) == (gen << 32) | pieces
    # nothing is left: the writer is finished at once, and copies nothing
    assert lane.share(words, 0, gen, pid, a_src, a_dst, n, piece, 1 << 30, 0, True) is True
    words.release()
    mm.close()


def test_a_piece_the_writer_cannot_copy_is_given_back_and_the_reader_copies_it() -> None:
    lane = _shm_ring._native_shm
    n, piece, gen = 300_000, 1 << 16, 3
    mm, words = _board(gen)
    src, dst = _arrays(n)
    a_src, a_dst = lane.address(src), lane.address(dst)
    with pytest.raises(OSError) as info:  # (no such process)
        lane.share(words, 0, gen, 2**22 + 12345, a_src, a_dst, n, piece, 1 << 30, 0, True)
    assert info.value.errno == errno.ESRCH
    assert words.load(16) == (gen << 32) | 1  # piece 0 given back
    assert lane.share(words, 0, gen, os.getpid(), a_dst, a_src, n, piece, 1 << 30, 0,
                      False) is True
    assert np.array_equal(dst, src) and words.load(16) == 0


def test_the_reader_waits_for_a_claimed_piece_then_gives_up_for_now() -> None:
    """A piece claimed but not counted (the writer copying it): the reader waits up to its
    bound, then says the copy is not complete (it looks again on a later turn)."""
    lane = _shm_ring._native_shm
    n, piece, gen = 200_000, 1 << 16, 9
    mm, words = _board(gen)
    src, dst = _arrays(n)
    words.store(0, (gen << 32) | 1)  # (piece 0 claimed by the writer, still copying)
    a_src, a_dst, pid = lane.address(src), lane.address(dst), os.getpid()
    assert lane.share(words, 0, gen, pid, a_dst, a_src, n, piece, 1 << 30, 10_000,
                      False) is False
    assert np.array_equal(dst[piece:], src[piece:])
    words.store(8, words.load(8) + 1)  # (the writer's piece counted)
    assert lane.share(words, 0, gen, pid, a_dst, a_src, n, piece, 1 << 30, 0, False) is True


def test_another_generation_on_the_board_is_left_alone() -> None:
    lane = _shm_ring._native_shm
    n, piece = 200_000, 1 << 16
    mm, words = _board(5)
    src, dst = _arrays(n)
    a_src, a_dst, pid = lane.address(src), lane.address(dst), os.getpid()
    assert lane.share(words, 0, 4, pid, a_src, a_dst, n, piece, 1 << 30, 0, True) is True
    assert not dst.any() and words.load(0) == 5 << 32 and words.load(8) == 5 << 32


@pytest.mark.parametrize("bad", [
    {"gen": 0}, {"gen": 1 << 32}, {"nbytes": 0}, {"piece": 0}, {"board": 4093},
    {"words": b"x" * 64}])
def test_share_refuses_bad_arguments(bad: dict[str, Any]) -> None:
    lane = _shm_ring._native_shm
    mm, words = _board(1)
    src, dst = _arrays(1000)
    args = {"words": words, "board": 0, "gen": 1, "pid": os.getpid(),
            "local": lane.address(src), "remote": lane.address(dst), "nbytes": 1000,
            "piece": 100, "budget": 1000, "wait_ns": 0, "write": True}
    args.update(bad)
    with pytest.raises((ValueError, TypeError, IndexError)):
        lane.share(*args.values())
    assert not dst.any()


# -- two links in this process ------------------------------------------------------------

class _Recording:
    """The single copy, with each ``share`` call's pieces claimed recorded (the board's
    claim word before and after: the links run in one thread, so no one else claims
    meanwhile); ``writer_pid`` replaces the writer's process (one that is gone: its
    copies fail, and its piece is given back), ``refuse`` fails its copies as where the
    kernel refuses them."""

    def __init__(self, real: Any, writer_pid: int | None = None, refuse: bool = False) -> None:
        self.real = real
        self.address = real.address
        self.readv = real.readv
        self.writer_pid = writer_pid
        self.refuse = refuse
        self.claimed = {True: 0, False: 0}
        self.calls = {True: 0, False: 0}

    def share(self, words: Any, board: int, gen: int, pid: int, *rest: Any) -> bool:
        write = bool(rest[-1])
        self.calls[write] += 1
        if write and self.refuse:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        if write and self.writer_pid is not None:
            pid = self.writer_pid
        before = words.load(board) & 0xFFFF_FFFF
        try:
            return bool(self.real.share(words, board, gen, pid, *rest))
        finally:
            self.claimed[write] += (words.load(board) & 0xFFFF_FFFF) - before


BIG = 2 * READ_CHUNK + 3


async def _shared(native: bool) -> tuple[list[bool], Any, Any]:
    """Rank 0 sends three messages of several reads and one of ``SHARE_MIN`` to rank 1,
    their recvs posted first: whether each arrived intact, what either rank keeps after
    them, and whether rank 0 still shares its copies."""
    async with _opened(native) as ((l0, c0), (l1, c1)):
        assert l0.channels.node.share_copies and l1.channels.node.share_copies
        sizes = (BIG, BIG, SHARE_MIN, BIG)
        payloads = [(np.arange(n) * 5 + i).astype(np.uint8) for i, n in enumerate(sizes)]
        bufs = [np.zeros(n, np.uint8) for n in sizes]
        for i, (buf, payload) in enumerate(zip(bufs, payloads, strict=True)):
            recv = c1.irecv(buf, 0, 20 + i)
            await asyncio.wait_for(asyncio.gather(recv, c0.send(payload, 1, 20 + i)), 30)
        intact = [bool(np.array_equal(b, p)) for b, p in zip(bufs, payloads, strict=True)]
        kept = (dict(l0.channels.copying), dict(l0.channels._helping),
                len(l1.channels._reading), dict(l1.channels._pulls), dict(l0._sends),
                c0.statistics().pending_ops, c1.statistics().pending_ops)
        sharing = l0.channels.node.share_copies
        await asyncio.wait_for(asyncio.gather(c0.aclose(), c1.aclose()), 30)
        return intact, kept, sharing


_CLEAN = ({}, {}, 0, {}, {}, 0, 0)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_sender_copies_pieces_of_its_offers(
        loop: str, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With its recv posted, each large offer is copied by both ranks: the receiver's first
    read claims one ``READ_CHUNK``, then the sender, told, claims pieces too; every
    message arrives intact, and nothing is kept after."""
    rec = _Recording(shm.single_copy)
    monkeypatch.setattr(shm, "single_copy", rec)
    intact, kept, sharing = _run(loop, _shared(native))
    assert intact == [True] * 4
    assert kept == _CLEAN and sharing
    assert rec.claimed[True] > 0 and rec.claimed[False] > 0
    # (every piece claimed once; the message of ``SHARE_MIN`` is shared only if its sender
    # was awake when its recv matched it: one read of its own where it slept)
    big = 3 * -(-BIG // share_piece(BIG))
    assert rec.claimed[True] + rec.claimed[False] in (big, big + -(-SHARE_MIN
                                                                   // share_piece(SHARE_MIN)))


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_piece_the_sender_could_not_copy_is_copied_by_the_receiver(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sender's copies fail (its receiver's process, as it sees it, is gone): each piece
    it claimed is given back and the receiver copies it; every message arrives intact, and
    the sender goes on sharing (only a refusal stops it)."""
    rec = _Recording(shm.single_copy, writer_pid=2**22 + 12345)
    monkeypatch.setattr(shm, "single_copy", rec)
    intact, kept, sharing = _run(loop, _shared(True))
    assert intact == [True] * 4 and kept == _CLEAN and sharing
    assert rec.claimed[True] > 0  # (given back, each: the receiver copied them)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_sender_refused_its_copies_stops_sharing(
        loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel refuses the sender's copy into its receiver, it claims nothing,
    copies no piece from then on, and every message arrives intact (the receiver copies
    them all)."""
    rec = _Recording(shm.single_copy, refuse=True)
    monkeypatch.setattr(shm, "single_copy", rec)
    intact, kept, sharing = _run(loop, _shared(True))
    assert intact == [True] * 4 and kept == _CLEAN and not sharing
    assert rec.calls[True] == 1 and rec.claimed[True] == 0


class _SlowWriter:
    """The single copy, where the receiver's copy fails (``error``) just after the sender
    claimed a piece (claimed here, for it) that it copies in a thread: only once the
    receiver has closed the board and waits for it (``sched_yield``, replaced by
    ``yield_``) does it write the piece into the recv buffer and count it.  For an
    ``OSError`` the receiver's own failing piece is claimed too (an ``OSError`` is a copy
    that failed; another error fails the link with the copy under way).  The sender's own
    calls copy nothing."""

    def __init__(self, real: Any, error: BaseException) -> None:
        self.real = real
        self.address = real.address
        self.readv = real.readv
        self.error = error
        self.thread: Any = None
        self.written: list[bool] = []
        self.waited = threading.Event()  # (the receiver waits, its board closed)
        self.board: tuple[Any, int] | None = None

    def yield_(self) -> None:
        if self.board is not None:
            words, board = self.board
            if words.load(board) & 0xFFFF_FFFF == 0xFFFF_FFFF:
                self.waited.set()
        os.sched_yield()

    def share(self, words: Any, board: int, gen: int, pid: int, local: int, remote: int,
              nbytes: int, piece: int, *rest: Any) -> bool:
        if rest[-1] or self.thread is not None:
            return True  # (the sender: nothing for it)
        c = words.load(board)
        first = c & 0xFFFF_FFFF
        words.store(board, c + (2 if isinstance(self.error, OSError) else 1))
        self.board = (words, board)

        def copy() -> None:
            if not self.waited.wait(10):
                return  # (nobody waits for it: the sender would claim on; not copied here)
            ctypes.memset(local + first * piece, 0xEE, min(piece, nbytes - first * piece))
            words.store(board + shm.COPIED, words.load(board + shm.COPIED) + 1)
            self.written.append(True)

        self.thread = threading.Thread(target=copy, daemon=True)
        self.thread.start()
        raise self.error


@pytest.mark.parametrize("error", ["copy failed", "link failed"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_recv_fails_only_once_its_sender_writes_no_more_into_its_buffer(
        loop: str, error: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver's shared copy stops unfinished (its read fails, or the link fails):
    its recv fails only after the piece its sender was copying is in, so that nothing is
    written into the buffer once it is its user's again."""
    from asynccomm._exceptions import TransportError

    exc = OSError(errno.EFAULT, "Bad address") if error == "copy failed" else RuntimeError("x")
    fake = _SlowWriter(shm.single_copy, exc)
    monkeypatch.setattr(shm, "single_copy", fake)
    monkeypatch.setattr(shm, "sched_yield", fake.yield_)

    async def main() -> tuple[bool, list[bool]]:
        async with _opened(True) as ((l0, c0), (l1, c1)):
            buf = np.zeros(BIG, np.uint8)
            recv = c1.irecv(buf, 0, 5)
            c0.isend(np.ones(BIG, np.uint8), 1, 5)
            with pytest.raises(TransportError):
                await asyncio.wait_for(recv, 30)
            written = list(fake.written)  # (as the recv failed)
            fake.thread.join(30)
            return bool((buf == 0xEE).any()), written

    touched, written_first = _run(loop, main())
    assert touched and written_first == [True]
