"""The matcher: MPI's matching rules as a synchronous state machine, one per receiving rank.

How it works
------------
A matcher holds two queues for one destination rank: *posted recvs* that have no message
yet, and *unexpected messages* (envelopes) that have no recv yet.  Every posted recv,
arriving envelope and blocking probe gets a sequence number (its posting order).

Rule 1 (a message takes the earliest posted recv that fits it).  When an envelope
arrives, it matches the posted recv with the smallest sequence number whose source and tag
are equal to the envelope's or wildcards (``ANY_SOURCE``, ``ANY_TAG``).  Descriptors never
carry wildcards.

Rule 2 (a recv takes the earliest arrived message that fits it).  When a recv is posted,
it matches the unexpected message with the smallest sequence number that fits it.

Rule 3 (non-overtaking).  Messages from one source with one tag are matched in the order
they arrived, because a bucket per exact (source, tag) is FIFO.  Transports deliver one
sender's envelopes in posting order, which makes this MPI's non-overtaking guarantee.

Rule 4 (a match that cannot complete loses nothing).  When a recv matches a message by
envelope but its dtype differs or its buffer is too small, the *recv* fails
(``RecvRejected``) and the message stays where it was: first in line for the next recv that
fits.  A recv of any dtype (``recv_new``) takes every array but no object: an object's
header (dtype ``OBJECT_DTYPE``) is for ``recv_obj`` alone.  An arriving envelope whose
earliest recv rejects it tries the next posted recv, and is queued as unexpected if none is
left.  The sender is never failed by a rejection.

Rule 5 (withdrawal is atomic, and a match is final).  ``cancel`` removes a posted recv or
probe, ``withdraw`` removes an unexpected message; each returns False when the item has
already matched, so the caller knows whether a late match can still touch the buffer.  A
match is never undone: transports whose sender may withdraw after the receiver matched
let the receiver decide (see ``wire.py``).

Cost: exact (source, tag) matching is O(1) (one bucket lookup).  A wildcard recv looks at
four bucket heads for an arriving envelope and at one index head for unexpected messages;
the per-source, per-tag and global indexes of unexpected messages are only built (once) when
the first wildcard recv or probe is posted, so programs without wildcards never pay for
them.  Nothing scans the queues except blocking probes, which are rare.

Buckets are deques: a match always takes a bucket's head (the earliest recv posted for an
envelope, the earliest message of a (source, tag), whatever the wildcard), and a withdrawal
in the middle leaves a tombstone that is dropped when it reaches the head.  A descriptor's
``seq`` is positive exactly while it waits in a queue (``IDLE`` before and after,
``TOMBSTONE`` once withdrawn), which is how ``cancel`` and ``withdraw`` know it is still
there.

Events (``RecvRejected``, ``ProbeMatched``) are queued and drained with ``next_event()``,
as in h11 and aioquic; successful matches are returned directly because they are the hot
path.  ``on_wait`` hears each source the first time a recv or probe waits for it (a set
lookup per queued recv): the ranks whose close may concern this one.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

from .._types import ANY_SOURCE, ANY_TAG
from .descriptors import Descriptor

__all__ = [
    "MatchEvent",
    "Matcher",
    "MatcherStatistics",
    "ProbeMatched",
    "RecvRejected",
    "OBJECT_DTYPE",
    "misfit",
]

Reason = Literal["dtype", "truncated"]

#: The dtype of objects' headers (numpy's one-byte void): only a recv of exactly this
#: dtype takes one, never a recv of any dtype (``recv_new``).
OBJECT_DTYPE: Final = "|V1"


class RecvRejected(NamedTuple):
    """A recv matched ``envelope`` by (source, tag) but cannot take it; the recv is removed,
    the message is kept (Rule 4)."""

    recv: Descriptor
    envelope: Descriptor
    reason: Reason


class ProbeMatched(NamedTuple):
    """A blocking probe found a message; the probe is removed, the message is kept."""

    probe: Descriptor
    envelope: Descriptor


MatchEvent = RecvRejected | ProbeMatched


@dataclass(frozen=True, slots=True)
class MatcherStatistics:
    """A snapshot of a matcher's queues."""

    posted_recvs: int
    """Recvs posted and not yet matched."""
    unexpected_messages: int
    """Messages arrived (or announced) with no recv yet."""
    unexpected_bytes: int
    """Total size of the unexpected messages."""
    probes: int
    """Blocking probes still waiting."""
    matched: int
    """Successful matches so far."""


def misfit(recv: Descriptor, env: Descriptor) -> Reason | None:
    """Why ``recv`` cannot take ``env`` although their envelopes match, or None if it can
    (a recv's dtype None takes any dtype but an object's, its nbytes -1 any size)."""
    rd = recv.dtype
    if rd != env.dtype and (rd is not None or env.dtype == OBJECT_DTYPE):
        return "dtype"
    if recv.nbytes >= 0 and env.nbytes > recv.nbytes:
        return "truncated"
    return None


def _fits(source: int, tag: int, env: Descriptor) -> bool:
    return (source == ANY_SOURCE or source == env.source) and (tag == ANY_TAG or tag == env.tag)


def _first(index: OrderedDict[int, Descriptor] | None) -> Descriptor | None:
    return next(iter(index.values())) if index else None


_Queue = OrderedDict[int, Descriptor]
_Bucket = deque[Descriptor]

#: ``seq`` of a descriptor that waits in no queue (not yet, or no longer).
IDLE: Final = -1
#: ``seq`` of a descriptor withdrawn from the middle of its bucket.
TOMBSTONE: Final = -2
#: Tombstones beyond this (and beyond the live items) make the matcher sweep its buckets.
_SWEEP_AT = 4096


def _head(buckets: dict[tuple[int, int], _Bucket], key: tuple[int, int]) -> Descriptor | None:
    """The live head of a bucket, dropping tombstones (and the bucket once empty)."""
    bucket = buckets.get(key)
    if bucket is None:
        return None
    while bucket:
        item = bucket[0]
        if item.seq > 0:
            return item
        bucket.popleft()
    del buckets[key]
    return None


class Matcher:
    """Posted recvs and unexpected messages of one destination rank (see module docs)."""

    # Slots: the fast lane reads these once per message (the C lane, ``_lane.c``, at their
    # offsets).
    __slots__ = ("_all", "_by_source", "_by_tag", "_matched", "_n_posted", "_n_unexp",
                 "_n_wild_posted", "_on_wait", "_posted", "_probes", "_seq", "_tombstones",
                 "_unexp", "_unexp_bytes", "_waited", "events")

    def __init__(self, on_wait: Callable[[int], None] | None = None) -> None:
        self._seq = 0
        #: Told each source (``ANY_SOURCE`` included) the first time a recv or a probe
        #: naming it waits here: who may be left waiting when that rank closes.
        self._on_wait = on_wait
        self._waited: set[int] = set()
        #: Queued events; drain them with ``next_event()`` (a cheap truthiness test first).
        self.events: deque[MatchEvent] = deque()
        self._matched = 0
        # Posted recvs, one FIFO bucket per (source, tag) as posted (wildcards included).
        self._posted: dict[tuple[int, int], _Bucket] = {}
        self._n_posted = 0
        self._n_wild_posted = 0
        # Unexpected messages, one FIFO bucket per exact (source, tag).
        self._unexp: dict[tuple[int, int], _Bucket] = {}
        self._n_unexp = 0
        self._unexp_bytes = 0
        self._tombstones = 0
        # Wildcard indexes over the same messages; None until a wildcard first asks.
        self._by_source: dict[int, _Queue] | None = None
        self._by_tag: dict[int, _Queue] = {}
        self._all: _Queue = OrderedDict()
        self._probes: OrderedDict[int, Descriptor] = OrderedDict()

    # -- inputs ---------------------------------------------------------------------------

    def deliver(self, env: Descriptor) -> Descriptor | None:
        """An envelope arrived: return the posted recv it matched, or None if it was queued
        as unexpected.  Recvs that rejected it on the way are reported as events."""
        if self._n_posted and not self._n_wild_posted:
            # The hot path, inlined: exact recvs only, so one bucket holds every candidate.
            recv = _head(self._posted, (env.source, env.tag))
            if recv is not None:
                self._pop_posted(recv)
                reason = misfit(recv, env)
                if reason is None:
                    self._matched += 1
                    return recv
                self.events.append(RecvRejected(recv, env, reason))
        while self._n_posted:
            candidate = self._earliest_posted(env.source, env.tag)
            if candidate is None:
                break
            self._pop_posted(candidate)
            reason = misfit(candidate, env)
            if reason is None:
                self._matched += 1
                return candidate
            self.events.append(RecvRejected(candidate, env, reason))
        self.enqueue(env)
        return None

    def post_recv(self, recv: Descriptor) -> Descriptor | None:
        """Post a recv: return the unexpected message it matched (now removed), or None.
        None means the recv was queued, or rejected with a ``RecvRejected`` event."""
        source, tag = recv.source, recv.tag
        if source != ANY_SOURCE and tag != ANY_TAG:
            env = _head(self._unexp, (source, tag)) if self._n_unexp else None
        else:
            env = self._earliest_unexpected(source, tag)
        if env is not None:
            return self._take(recv, env)
        self._queue_recv(recv)
        return None

    def _take(self, recv: Descriptor, env: Descriptor) -> Descriptor | None:
        """``recv`` matched unexpected ``env`` by envelope: take it, or reject the recv and
        leave the message first in line (Rule 4)."""
        reason = misfit(recv, env)
        if reason is not None:
            self.events.append(RecvRejected(recv, env, reason))
            return None
        self._pop_unexpected(env)
        self._matched += 1
        return env

    def _queue_recv(self, recv: Descriptor) -> None:
        self._seq += 1
        recv.seq = self._seq
        source = recv.source
        key = (source, recv.tag)
        bucket = self._posted.get(key)
        if bucket is None:
            self._posted[key] = deque((recv,))
        else:
            bucket.append(recv)
        self._n_posted += 1
        if source == ANY_SOURCE or recv.tag == ANY_TAG:
            self._n_wild_posted += 1
        if source not in self._waited:
            self._first_wait(source)

    def _first_wait(self, source: int) -> None:
        self._waited.add(source)
        if self._on_wait is not None:
            self._on_wait(source)

    def probe(self, source: int, tag: int) -> Descriptor | None:
        """The earliest unexpected message that a recv (source, tag) would match, if any;
        nothing is removed."""
        return self._earliest_unexpected(source, tag)

    def post_probe(self, probe: Descriptor) -> Descriptor | None:
        """Post a blocking probe: return the message it finds now, or queue the probe and
        report a ``ProbeMatched`` event when a fitting message arrives."""
        env = self._earliest_unexpected(probe.source, probe.tag)
        if env is None:
            self._seq += 1
            probe.seq = self._seq
            self._probes[probe.seq] = probe
            if probe.source not in self._waited:
                self._first_wait(probe.source)
        return env

    def cancel(self, recv: Descriptor) -> bool:
        """Withdraw a posted recv; False if it already matched or was rejected."""
        if recv.seq <= 0:
            return False
        self._n_posted -= 1
        if recv.source == ANY_SOURCE or recv.tag == ANY_TAG:
            self._n_wild_posted -= 1
        self._bury(recv)
        return True

    def cancel_probe(self, probe: Descriptor) -> bool:
        """Withdraw a waiting probe; False if it already found its message."""
        if self._probes.pop(probe.seq, None) is None:
            return False
        probe.seq = IDLE
        return True

    def withdraw(self, env: Descriptor) -> bool:
        """Withdraw an unexpected message; False if a recv already took it."""
        if env.seq <= 0:
            return False
        self._n_unexp -= 1
        self._unexp_bytes -= env.nbytes
        self._unindex(env)
        self._bury(env)
        return True

    def _bury(self, item: Descriptor) -> None:
        """Leave a tombstone where ``item`` waited; sweep when they pile up."""
        item.seq = TOMBSTONE
        self._tombstones += 1
        if self._tombstones > _SWEEP_AT and self._tombstones > self._n_posted + self._n_unexp:
            for buckets in (self._posted, self._unexp):
                for key in list(buckets):
                    live = deque(d for d in buckets[key] if d.seq > 0)
                    if live:
                        buckets[key] = live
                    else:
                        del buckets[key]
            self._tombstones = 0

    # -- the fast lane: an arriving message with an exact envelope -------------------------

    def claim_posted(self, source: int, tag: int, nbytes: int,
                     dtype: str) -> Descriptor | Literal[False] | None:
        """What an arriving message (``source``, ``tag``, ``nbytes``, ``dtype``) would
        meet: the earliest recv posted that names it (wildcards included), removed, if it
        takes the message; None if no recv names it (it would wait unexpected).  False
        when the full rules are needed (the recv would reject the message): then
        ``deliver`` decides."""
        if not self._n_posted:
            return None
        if self._n_wild_posted:  # the earliest of four buckets, as ``deliver`` looks
            wild = self._earliest_posted(source, tag)
            if wild is None:
                return None
            rd = wild.dtype
            if (rd != dtype and (rd is not None or dtype == OBJECT_DTYPE)
                    or 0 <= wild.nbytes < nbytes):
                return False
            self._pop_posted(wild)
            self._matched += 1
            return wild
        key = (source, tag)
        bucket = self._posted.get(key)
        if not bucket:
            return None
        recv = bucket[0]
        if recv.seq < 0:  # a tombstone first: the long way
            recv = _head(self._posted, key)  # type: ignore[assignment]
            if recv is None:
                return None
        rd = recv.dtype
        if rd != dtype and (rd is not None or dtype == OBJECT_DTYPE) or 0 <= recv.nbytes < nbytes:
            return False  # it would reject the message: the full rules say what follows
        bucket.popleft()
        if not bucket:
            del self._posted[key]
        recv.seq = IDLE
        self._n_posted -= 1
        self._matched += 1
        return recv

    def waiting(self, source: int, tag: int) -> Descriptor | None:
        """The earliest unexpected message a recv (``source``, ``tag``; wildcards allowed)
        would meet, if any; nothing is removed.  The recv takes it unless it misfits
        (Rule 4)."""
        if not self._n_unexp:
            return None
        if source != ANY_SOURCE and tag != ANY_TAG:
            return _head(self._unexp, (source, tag))
        return self._earliest_unexpected(source, tag)

    def take(self, env: Descriptor) -> None:
        """A recv (never posted) takes the unexpected ``env`` that ``waiting`` showed it
        and that fits it: ``env`` is removed, as ``post_recv`` would have."""
        self._pop_unexpected(env)
        self._matched += 1

    def waits_for(self, source: int, *, wildcards: bool) -> bool:
        """Whether a posted recv or a probe names ``source`` (or, with ``wildcards``,
        ``ANY_SOURCE``): what a rank that closed could have left waiting."""
        for (src, _), bucket in self._posted.items():  # a few buckets: no generators
            if src == source or (wildcards and src == ANY_SOURCE):
                for d in bucket:
                    if d.seq > 0:
                        return True
        if not self._probes:
            return False
        return any(p.source == source or (wildcards and p.source == ANY_SOURCE)
                   for p in self._probes.values())

    # -- outputs --------------------------------------------------------------------------

    def next_event(self) -> MatchEvent | None:
        """The next queued event, or None."""
        return self.events.popleft() if self.events else None

    def statistics(self) -> MatcherStatistics:
        return MatcherStatistics(
            posted_recvs=self._n_posted,
            unexpected_messages=self._n_unexp,
            unexpected_bytes=self._unexp_bytes,
            probes=len(self._probes),
            matched=self._matched,
        )

    def posted_recvs(self) -> list[Descriptor]:
        """Every posted recv, in posting order."""
        out = [r for bucket in self._posted.values() for r in bucket if r.seq > 0]
        return sorted(out, key=lambda r: r.seq)

    def unexpected(self) -> list[Descriptor]:
        """Every unexpected message, in arrival order."""
        out = [e for bucket in self._unexp.values() for e in bucket if e.seq > 0]
        return sorted(out, key=lambda e: e.seq)

    def probes(self) -> list[Descriptor]:
        """Every waiting probe, in posting order."""
        return list(self._probes.values())

    # -- posted recvs ---------------------------------------------------------------------

    def _earliest_posted(self, source: int, tag: int) -> Descriptor | None:
        posted = self._posted
        if not self._n_wild_posted:
            return _head(posted, (source, tag))
        best: Descriptor | None = None
        for key in ((source, tag), (source, ANY_TAG), (ANY_SOURCE, tag), (ANY_SOURCE, ANY_TAG)):
            recv = _head(posted, key)
            if recv is not None and (best is None or recv.seq < best.seq):
                best = recv
        return best

    def _pop_posted(self, recv: Descriptor) -> None:
        """Remove ``recv``, the live head of its bucket (``_head`` found it)."""
        key = (recv.source, recv.tag)
        bucket = self._posted[key]
        bucket.popleft()
        if not bucket:
            del self._posted[key]
        recv.seq = IDLE
        self._n_posted -= 1
        if recv.source == ANY_SOURCE or recv.tag == ANY_TAG:
            self._n_wild_posted -= 1

    # -- unexpected messages --------------------------------------------------------------

    def enqueue(self, env: Descriptor) -> None:
        """Queue an arriving message as unexpected, when no posted recv can take it
        (``claim_posted`` said None): what ``deliver`` would do, without looking."""
        self._seq += 1
        env.seq = self._seq
        key = (env.source, env.tag)
        bucket = self._unexp.get(key)
        if bucket is None:
            self._unexp[key] = deque((env,))
        else:
            bucket.append(env)
        self._n_unexp += 1
        self._unexp_bytes += env.nbytes
        if self._by_source is not None:
            self._index_add(self._by_source, env)
        if self._probes:
            self._fire_probes(env)

    def _earliest_unexpected(self, source: int, tag: int) -> Descriptor | None:
        if source != ANY_SOURCE and tag != ANY_TAG:
            return _head(self._unexp, (source, tag)) if self._n_unexp else None
        by_source = self._wild_index()
        if source == ANY_SOURCE and tag == ANY_TAG:
            return _first(self._all)
        if source == ANY_SOURCE:
            return _first(self._by_tag.get(tag))
        return _first(by_source.get(source))

    def _pop_unexpected(self, env: Descriptor) -> None:
        """Remove ``env``: a match takes the head of its exact bucket, whichever index led
        to it (the earliest message of any wildcard is the earliest of its own bucket)."""
        key = (env.source, env.tag)
        bucket = self._unexp[key]
        while bucket[0] is not env:  # tombstones ahead of it
            if bucket.popleft().seq > 0:
                raise AssertionError("a match must take the head of its bucket")
        bucket.popleft()
        if not bucket:
            del self._unexp[key]
        self._n_unexp -= 1
        self._unexp_bytes -= env.nbytes
        self._unindex(env)
        env.seq = IDLE

    def _unindex(self, env: Descriptor) -> None:
        if self._by_source is not None:
            for index, k in ((self._by_source, env.source), (self._by_tag, env.tag)):
                queue = index[k]
                del queue[env.seq]
                if not queue:
                    del index[k]
            del self._all[env.seq]

    def _wild_index(self) -> dict[int, _Queue]:
        """Build the wildcard indexes on first use (in arrival order), then keep them."""
        if self._by_source is None:
            self._by_source = {}
            for env in self.unexpected():
                self._index_add(self._by_source, env)
        return self._by_source

    def _index_add(self, by_source: dict[int, _Queue], env: Descriptor) -> None:
        by_source.setdefault(env.source, OrderedDict())[env.seq] = env
        self._by_tag.setdefault(env.tag, OrderedDict())[env.seq] = env
        self._all[env.seq] = env

    def _fire_probes(self, env: Descriptor) -> None:
        for probe in [p for p in self._probes.values() if _fits(p.source, p.tag, env)]:
            del self._probes[probe.seq]
            probe.seq = IDLE
            self.events.append(ProbeMatched(probe, env))
