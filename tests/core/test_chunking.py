"""ChunkSender: coverage, the credit window, completion in any order, bad arguments."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynccomm._core.chunking import Chunk, ChunkSender


def take_all(sender: ChunkSender) -> list[Chunk]:
    """Every chunk, returning each one's credit at once (window never the limit)."""
    out: list[Chunk] = []
    while (chunk := sender.next_chunk()) is not None:
        out.append(chunk)
        sender.chunk_done(chunk)
    return out


@pytest.mark.parametrize(
    ("nbytes", "chunk_bytes", "expected"),
    [
        pytest.param(0, 10, [Chunk(0, 0, 0)], id="zero-bytes"),
        pytest.param(1, 10, [Chunk(0, 0, 1)], id="one-short-chunk"),
        pytest.param(10, 10, [Chunk(0, 0, 10)], id="exactly-one-chunk"),
        pytest.param(11, 10, [Chunk(0, 0, 10), Chunk(1, 10, 1)], id="one-byte-over"),
        pytest.param(25, 10, [Chunk(0, 0, 10), Chunk(1, 10, 10), Chunk(2, 20, 5)],
                     id="short-last"),
        pytest.param(30, 10, [Chunk(0, 0, 10), Chunk(1, 10, 10), Chunk(2, 20, 10)],
                     id="exact-multiple"),
        pytest.param(3, 1, [Chunk(0, 0, 1), Chunk(1, 1, 1), Chunk(2, 2, 1)], id="byte-chunks"),
        pytest.param(5, 1 << 30, [Chunk(0, 0, 5)], id="huge-chunk"),
    ],
)
def test_chunks_cover_the_transfer(nbytes: int, chunk_bytes: int,
                                   expected: list[Chunk]) -> None:
    sender = ChunkSender(nbytes, chunk_bytes=chunk_bytes, max_inflight=4)
    assert sender.total == len(expected)
    assert take_all(sender) == expected
    assert sender.done
    assert sender.next_chunk() is None


def test_zero_byte_transfer_has_one_empty_chunk() -> None:
    sender = ChunkSender(0, chunk_bytes=8, max_inflight=1)
    assert sender.total == 1
    assert not sender.done  # it completes through the same path as any transfer
    chunk = sender.next_chunk()
    assert chunk == Chunk(index=0, offset=0, nbytes=0)
    assert sender.next_chunk() is None
    assert sender.inflight == 1
    sender.chunk_done(chunk)
    assert sender.done and sender.inflight == 0


def test_window_limit() -> None:
    sender = ChunkSender(100, chunk_bytes=10, max_inflight=3)
    first = [sender.next_chunk() for _ in range(3)]
    assert [c.index for c in first if c is not None] == [0, 1, 2]
    assert sender.inflight == 3
    assert sender.next_chunk() is None  # window full
    assert sender.next_chunk() is None  # and stays full: nothing was skipped
    assert first[1] is not None
    sender.chunk_done(first[1])
    assert sender.inflight == 2
    assert sender.next_chunk() == Chunk(3, 30, 10)
    assert sender.next_chunk() is None


def test_window_of_one_is_store_and_forward() -> None:
    sender = ChunkSender(25, chunk_bytes=10, max_inflight=1)
    seen = []
    while not sender.done:
        chunk = sender.next_chunk()
        assert chunk is not None
        assert sender.next_chunk() is None
        seen.append(chunk)
        sender.chunk_done(chunk)
    assert [c.offset for c in seen] == [0, 10, 20]


def test_chunks_finish_out_of_order() -> None:
    sender = ChunkSender(50, chunk_bytes=10, max_inflight=3)
    c0, c1, c2 = (sender.next_chunk() for _ in range(3))
    assert c0 and c1 and c2
    sender.chunk_done(c2)
    sender.chunk_done(c0)
    assert sender.inflight == 1
    c3, c4 = sender.next_chunk(), sender.next_chunk()
    assert c3 == Chunk(3, 30, 10) and c4 == Chunk(4, 40, 10)
    assert sender.next_chunk() is None  # all handed out
    sender.chunk_done(c4)
    sender.chunk_done(c3)
    assert not sender.done  # c1 still moving
    sender.chunk_done(c1)
    assert sender.done
    assert sender.inflight == 0


def test_window_wider_than_the_transfer() -> None:
    sender = ChunkSender(20, chunk_bytes=10, max_inflight=100)
    chunks = [sender.next_chunk(), sender.next_chunk(), sender.next_chunk()]
    assert chunks == [Chunk(0, 0, 10), Chunk(1, 10, 10), None]
    assert sender.inflight == 2


def test_attributes() -> None:
    sender = ChunkSender(7, chunk_bytes=3, max_inflight=2)
    assert (sender.nbytes, sender.chunk_bytes, sender.max_inflight, sender.total) == (7, 3, 2, 3)
    assert sender.inflight == 0 and not sender.done


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nbytes": -1, "chunk_bytes": 1, "max_inflight": 1}, "nbytes must be >= 0, got -1"),
        ({"nbytes": 10, "chunk_bytes": 0, "max_inflight": 1}, "chunk_bytes must be >= 1, got 0"),
        ({"nbytes": 10, "chunk_bytes": -5, "max_inflight": 1},
         "chunk_bytes must be >= 1, got -5"),
        ({"nbytes": 10, "chunk_bytes": 1, "max_inflight": 0}, "max_inflight must be >= 1, got 0"),
    ],
)
def test_bad_arguments(kwargs: dict[str, int], message: str) -> None:
    nbytes = kwargs.pop("nbytes")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ChunkSender(nbytes, **kwargs)


def test_double_chunk_done() -> None:
    sender = ChunkSender(20, chunk_bytes=10, max_inflight=2)
    chunk = sender.next_chunk()
    assert chunk is not None
    sender.chunk_done(chunk)
    with pytest.raises(ValueError, match=r"^chunk 0 is not in flight$"):
        sender.chunk_done(chunk)
    # The failed call changed nothing.
    assert sender.inflight == 0 and not sender.done
    assert sender.next_chunk() == Chunk(1, 10, 10)


def test_chunk_done_for_a_chunk_never_handed_out() -> None:
    sender = ChunkSender(20, chunk_bytes=10, max_inflight=2)
    with pytest.raises(ValueError, match=r"^chunk 1 is not in flight$"):
        sender.chunk_done(Chunk(1, 10, 10))
    with pytest.raises(ValueError, match=r"^chunk 7 is not in flight$"):
        sender.chunk_done(Chunk(7, 70, 10))
    assert sender.inflight == 0
    assert take_all(sender) == [Chunk(0, 0, 10), Chunk(1, 10, 10)]


@settings(max_examples=200, deadline=None)
@given(
    chunk_bytes=st.integers(1, 4096),
    n_chunks=st.integers(0, 64),
    tail=st.integers(0, 4095),
    max_inflight=st.integers(1, 8),
    rnd=st.randoms(use_true_random=False),
)
def test_any_completion_order_covers_everything_once(
    chunk_bytes: int, n_chunks: int, tail: int, max_inflight: int, rnd: random.Random
) -> None:
    nbytes = n_chunks * chunk_bytes + tail % chunk_bytes
    sender = ChunkSender(nbytes, chunk_bytes=chunk_bytes, max_inflight=max_inflight)
    assert sender.total == max(1, -(-nbytes // chunk_bytes))
    handed: list[Chunk] = []
    moving: list[Chunk] = []
    while not sender.done:
        while (chunk := sender.next_chunk()) is not None:
            handed.append(chunk)
            moving.append(chunk)
            assert sender.inflight == len(moving) <= max_inflight
        assert moving, "no chunk moving and none handed out, yet not done"
        # Rule 2: the window is full, or everything was handed out.
        assert len(moving) == max_inflight or len(handed) == sender.total
        done = moving.pop(rnd.randrange(len(moving)))
        sender.chunk_done(done)
    assert sender.inflight == 0
    assert sender.next_chunk() is None
    assert [c.index for c in handed] == list(range(sender.total))
    # Rule 1: contiguous, in order, exactly [0, nbytes); all but the last are full.
    offset = 0
    for chunk in handed:
        assert chunk.offset == offset
        offset += chunk.nbytes
    assert offset == nbytes
    assert all(c.nbytes == chunk_bytes for c in handed[:-1])
    assert 0 <= handed[-1].nbytes <= chunk_bytes
    assert handed[-1].nbytes > 0 or nbytes == 0
