"""StagingPool: power-of-two buckets, reuse, the cap (buffers plus a per-message overhead),
and its statistics."""

from __future__ import annotations

import dataclasses

import pytest

from asynccomm._buffers import PoolStatistics, StagingPool
from asynccomm._core.wire import MESSAGE_OVERHEAD as O
from asynccomm._core.wire import charge


def acquired(pool: StagingPool, nbytes: int) -> bytearray:
    buf = pool.acquire(nbytes)
    assert buf is not None
    return buf


@pytest.mark.parametrize(
    ("nbytes", "size"),
    [(1, 64), (63, 64), (64, 64), (65, 128), (128, 128), (129, 256), (1000, 1024),
     (1024, 1024), (65_536, 65_536), (65_537, 131_072), (0, 0)],
)
def test_bucket_is_the_smallest_power_of_two_that_fits(nbytes: int, size: int) -> None:
    pool = StagingPool(1 << 20)
    buf = acquired(pool, nbytes)
    assert len(buf) == size
    assert len(buf) >= nbytes
    assert type(buf) is bytearray  # writable, and no object for the collector to walk
    assert pool.statistics().in_use_bytes == size + O == charge(nbytes)


def test_buffers_are_writable_and_distinct() -> None:
    pool = StagingPool(4096)
    a, b = acquired(pool, 10), acquired(pool, 10)
    a[:3] = b"abc"
    b[:3] = b"xyz"
    assert bytes(a[:3]) == b"abc"


def test_release_then_acquire_reuses_from_the_free_list() -> None:
    pool = StagingPool(4096)
    buf = acquired(pool, 100)
    pool.release(buf)
    assert pool.statistics().cached_bytes == 128
    again = acquired(pool, 120)  # same 128-byte bucket
    assert again is buf
    assert pool.statistics().reused == 1
    assert pool.statistics().cached_bytes == 0
    fresh = acquired(pool, 100)  # free list now empty: a new buffer
    assert fresh is not buf
    assert pool.statistics().reused == 1


def test_reuse_is_per_bucket() -> None:
    pool = StagingPool(4096)
    big = acquired(pool, 200)  # 256
    pool.release(big)
    small = acquired(pool, 10)  # 64: not served from the 256 bucket
    assert small is not big and len(small) == 64
    assert pool.statistics().reused == 0
    assert pool.statistics().cached_bytes == 256
    assert acquired(pool, 256) is big


def test_free_list_is_last_in_first_out() -> None:
    pool = StagingPool(4096)
    a, b = acquired(pool, 64), acquired(pool, 64)
    pool.release(a)
    pool.release(b)
    assert acquired(pool, 64) is b
    assert acquired(pool, 64) is a


def test_cap_refuses_and_counts() -> None:
    pool = StagingPool(2 * (128 + O))
    a = acquired(pool, 100)  # 128
    acquired(pool, 100)  # 128: in use 2 * (128 + O), the cap
    assert pool.acquire(1) is None
    assert pool.acquire(0) is None  # even an empty message costs its overhead
    stats = pool.statistics()
    assert (stats.in_use_bytes, stats.refused, stats.acquired) == (2 * (128 + O), 2, 2)
    pool.release(a)  # gives capacity back
    assert pool.statistics().in_use_bytes == 128 + O
    assert len(acquired(pool, 1)) == 64
    assert pool.statistics().refused == 2


def test_cap_is_inclusive() -> None:
    pool = StagingPool(256 + O)
    assert len(acquired(pool, 256)) == 256
    assert pool.acquire(0) is None


def test_message_larger_than_the_cap_is_always_refused() -> None:
    pool = StagingPool(256 + O)
    assert pool.acquire(257) is None  # its bucket (512) passes the cap on its own
    assert pool.statistics().refused == 1
    assert pool.statistics().in_use_bytes == 0


def test_bucket_rounding_counts_against_the_cap() -> None:
    pool = StagingPool(200 + O)
    assert pool.acquire(129) is None  # needs a 256 bucket
    assert len(acquired(pool, 128)) == 128


def test_empty_messages_take_no_buffer_but_count_their_overhead() -> None:
    pool = StagingPool(3 * O)
    bufs = [acquired(pool, 0) for _ in range(3)]
    assert all(len(b) == 0 for b in bufs)
    assert pool.acquire(0) is None  # a flood of empty messages is bounded
    assert pool.statistics().in_use_bytes == 3 * O
    for buf in bufs:
        pool.release(buf)
    stats = pool.statistics()
    assert (stats.in_use_bytes, stats.cached_bytes) == (0, 0)


def test_peak() -> None:
    pool = StagingPool(1 << 16)
    a = acquired(pool, 64)
    b = acquired(pool, 512)
    pool.release(a)
    pool.release(b)
    c = acquired(pool, 64)
    stats = pool.statistics()
    assert stats.peak_bytes == 576 + 2 * O
    assert stats.in_use_bytes == 64 + O
    d = acquired(pool, 1024)
    assert pool.statistics().peak_bytes == 1088 + 2 * O
    pool.release(c)
    pool.release(d)
    assert pool.statistics().peak_bytes == 1088 + 2 * O
    assert pool.statistics().in_use_bytes == 0


def test_refused_acquire_does_not_move_peak_or_counts() -> None:
    pool = StagingPool(128 + O)
    acquired(pool, 128)
    assert pool.acquire(64) is None
    stats = pool.statistics()
    assert (stats.peak_bytes, stats.acquired, stats.reused) == (128 + O, 1, 0)


def test_cache_is_capped() -> None:
    """Free buffers are kept up to capacity_bytes (of buffer bytes) in all; the rest are
    dropped."""
    pool = StagingPool(1024 + O)
    pool.release(acquired(pool, 1024))
    pool.release(acquired(pool, 512))  # a new buffer (the 1024 bucket cannot serve it)
    cached = pool.statistics().cached_bytes
    assert cached == 1536 if 1536 <= 1024 + O else cached == 1024
    small = acquired(pool, 64)
    pool.release(small)  # the cache is full: dropped
    assert pool.statistics().cached_bytes == cached
    assert acquired(pool, 64) is not small
    assert pool.statistics().reused == 0


def test_statistics_fields() -> None:
    pool = StagingPool(2048)
    assert pool.statistics() == PoolStatistics(
        capacity_bytes=2048, in_use_bytes=0, peak_bytes=0, cached_bytes=0,
        acquired=0, reused=0, refused=0)
    a = acquired(pool, 20)  # 64
    b = acquired(pool, 500)  # 512
    pool.release(a)
    acquired(pool, 30)  # 64, reused
    assert pool.acquire(1000) is None  # 1024 + O would pass the cap
    pool.release(b)
    assert pool.statistics() == PoolStatistics(
        capacity_bytes=2048, in_use_bytes=64 + O, peak_bytes=576 + 2 * O, cached_bytes=512,
        acquired=3, reused=1, refused=1)


def test_statistics_is_a_frozen_snapshot() -> None:
    pool = StagingPool(1024)
    stats = pool.statistics()
    acquired(pool, 1)
    assert stats.in_use_bytes == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.refused = 1  # type: ignore[misc]


def test_many_cycles_keep_the_books_balanced() -> None:
    pool = StagingPool(16384)
    sizes = [1, 64, 65, 200, 1000, 4000, 3, 128, 0]
    for _ in range(50):
        bufs = [acquired(pool, n) for n in sizes]
        for buf in reversed(bufs):
            pool.release(buf)
    stats = pool.statistics()
    assert stats.in_use_bytes == 0
    assert stats.acquired == 50 * len(sizes)
    assert stats.reused == 49 * (len(sizes) - 1)  # every non-empty one after the first round
    buffers = (64, 64, 128, 256, 1024, 4096, 64, 128)
    assert stats.cached_bytes == sum(buffers)
    assert stats.peak_bytes == sum(buffers) + len(sizes) * O

