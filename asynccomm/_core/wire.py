"""The wire protocol between ranks in separate processes, as a sans-IO state machine.

How it works
------------
Each rank runs one ``Wire``.  Control messages travel on FIFO channels, one per ordered
pair of ranks (on MPI: one tag of a communicator private to the world); a message is a
fixed ``HEADER``, optionally followed by a payload.  The shell sends the bytes ``Wire``
returns, feeds it every control message that arrives (``receive``), and acts on the event
it gets back; the data of large messages moves outside the control channel, on the data
tag that ``CTS`` names.

Rule 1 (eager, within credit).  A message of at most ``inline_max`` bytes travels whole
with its header (``EAGER``) if the sender holds credit for it at the destination; its send
completes at once.  Credit bounds what a receiver stages: each receiver grants each rank a
``window`` of bytes (its staging cap shared among the ranks), each eager message costs
``charge(nbytes)`` (its staging bucket plus a per-message overhead), and the receiver
returns the charge (``CREDIT``, batched) once the message has left staging.  Without
credit the message goes rendezvous, so a receiver never stages more than its cap.
Rule 2 (rendezvous).  A larger message is announced (``RTS``, with the sender's message
id).  When a recv matches the announcement the receiver commits: it posts its data recvs
into the recv buffer on a fresh data tag and answers ``CTS``; the sender sends the data.
An announcement may instead name its own data tag (``early``: the sender's data send is
posted right behind the ``RTS``, on a tag of the sender's half of the tag space, and the
transport's own rendezvous holds the data until a recv for it is posted): the receiver
then posts its data recvs on that tag and answers ``CTS`` all the same (the sender learns
of the match from it, and its send completes once the ``CTS`` came and its data is out).
Such data must never be left unreceived: whoever drops an early announcement (a granted
withdrawal, a closing rank) drains its data (``Drain``; ``drop_early``).
Rule 3 (withdrawal: the receiver decides).  A sender that wants an announced message back
sends ``WITHDRAW`` and waits for the answer.  If the announcement is still unmatched the
receiver drops it (and drains its early data) and answers ``WITHDRAWN``; if it has
already answered ``CTS`` it ignores the ``WITHDRAW``: the ``CTS`` was the answer and the
send completes normally.  A match is
never undone, so the receiver's matching order (MPI's non-overtaking rule) always holds, as
with ``MPI_Cancel``, which cannot cancel a matched send.
Rule 4 (closing, barrier-free).  A rank that closes drops the announcements it has not
matched and sends ``CLOSE`` (payload: why) to every rank, itself included; afterwards it
starts nothing new and only answers.  Once it has sent ``CLOSE`` to a rank and received
that rank's ``CLOSE``, neither side can need an answer from the other, so it sends ``FIN``,
its last message to that rank.  The channels are idle when ``FIN`` went to and came from
every rank (``finished``).
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

__all__ = [
    "ASKED",
    "CLOSE",
    "DUMP",
    "DUMP_ASK",
    "CREDIT",
    "CTS",
    "EAGER",
    "FIN",
    "FT",
    "GONE",
    "HEADER",
    "INLINE_MAX",
    "KIND_NAMES",
    "MESSAGE_OVERHEAD",
    "RTS",
    "TOO_LATE",
    "WITHDRAW",
    "WITHDRAWN",
    "Announced",
    "ClearToSend",
    "Eager",
    "DumpAsked",
    "Drain",
    "Dumped",
    "PeerClosed",
    "PeerFinished",
    "Wire",
    "WithdrawAnswered",
    "WithdrawRequested",
    "charge",
    "data_tag_of",
    "decode_dtype",
    "encode_dtype",
    "split_shape",
    "with_shape",
]

#: The largest payload that travels inside a control message; larger ones use rendezvous.
INLINE_MAX: Final = 65_536
#: Bytes of bookkeeping counted against the staging cap for every staged message, on top
#: of its buffer (an envelope, a buffer object, a queue entry), so that a flood of empty or
#: one-byte messages is bounded too.
MESSAGE_OVERHEAD: Final = 512
#: The smallest staging buffer (buffers are powers of two from here).
MIN_BUCKET: Final = 64

EAGER: Final = 1
RTS: Final = 2
CTS: Final = 3
WITHDRAW: Final = 4
WITHDRAWN: Final = 5
CREDIT: Final = 6
CLOSE: Final = 7
FIN: Final = 8
#: A hang report's best-effort exchange: "what are you waiting for?" and its answer
#: (payload: the rank's pending and last ops, as text).  Neither touches any other state.
DUMP_ASK: Final = 9
DUMP: Final = 10
#: Fault tolerance (revoke, agreement: ``_comm/agreement.py``): the payload is the
#: protocol's, opaque to ``Wire``; the shell hands it to the link's ``ft`` hook.  (Kinds
#: 11 to 15 and 17 are the shared-memory link's data records.)
FT: Final = 16
#: The message kinds by name, for logs and tests.
KIND_NAMES: Final = {EAGER: "EAGER", RTS: "RTS", CTS: "CTS", WITHDRAW: "WITHDRAW",
                     WITHDRAWN: "WITHDRAWN", CREDIT: "CREDIT", CLOSE: "CLOSE", FIN: "FIN",
                     DUMP_ASK: "DUMP_ASK", DUMP: "DUMP", FT: "FT"}

#: Verdicts of ``Wire.withdraw``.
TOO_LATE: Final = 0
GONE: Final = 1
ASKED: Final = 2

#: kind, dtype name length, source rank, tag (the data tag in CTS), nbytes (the credit in
#: CREDIT, the reason's length in CLOSE), count, message id, dtype name (and the sender's
#: shape, if not 1-D: ``"<f8;3x4"``, see ``encode_dtype``); padded to 88 bytes so that
#: payloads start 8-byte aligned.
HEADER: Final = struct.Struct("<BBxxiiqqq48s4x")
_DTYPE_MAX = 48
#: An early ``RTS`` names its data tag in the header's last 4 bytes (padding in every
#: other message, and 0 in an ``RTS`` whose data waits for the ``CTS``), little-endian.
DATA_TAG_AT: Final = HEADER.size - 4


def data_tag_of(header: bytes | bytearray | memoryview) -> int:
    """The data tag an ``RTS`` names (0: its data waits for the ``CTS``)."""
    return int.from_bytes(header[DATA_TAG_AT:DATA_TAG_AT + 4], "little")

#: Caches of both directions (a program sends few dtypes); hot paths look here first.
DTYPE_FIELDS: dict[str, bytes] = {}
DTYPE_NAMES: dict[bytes, str] = {}


def encode_dtype(name: str) -> bytes:
    """The header field for a dtype name (``numpy.dtype.str``).

    Raises:
        ValueError: if the name does not fit the header.
    """
    raw = DTYPE_FIELDS.get(name)
    if raw is None:
        raw = name.encode("ascii")
        if len(raw) > _DTYPE_MAX:
            raise ValueError(f"dtype name {name!r} is longer than {_DTYPE_MAX} bytes")
        DTYPE_FIELDS[name] = raw
    return raw


def with_shape(name: str, shape: tuple[int, ...] | None) -> str:
    """The dtype field's text for a message of ``shape`` (None: 1-D): the name, then
    ``;`` and the dimensions joined by ``x`` (``;`` alone for a 0-d array).  A shape too
    long for the header travels as 1-D (the receiver sees ``(count,)``)."""
    if shape is None:
        return name
    text = f"{name};{'x'.join(map(str, shape))}"
    return text if len(text) <= _DTYPE_MAX else name


def split_shape(text: str) -> tuple[str, tuple[int, ...] | None]:
    """The dtype name and shape of a dtype field's text (``with_shape`` reversed)."""
    name, _, dims = text.partition(";")
    return name, tuple(int(d) for d in dims.split("x")) if dims else ()


def decode_dtype(field: bytes, length: int) -> str:
    """The dtype name of a header's (padded) field."""
    name = DTYPE_NAMES.get(field)
    if name is None:
        name = DTYPE_NAMES[field] = field[:length].decode("ascii")
    return name


def bucket(nbytes: int) -> int:
    """The staging buffer size for a message of ``nbytes`` (0 for an empty message)."""
    return max(MIN_BUCKET, 1 << (nbytes - 1).bit_length()) if nbytes else 0


def charge(nbytes: int) -> int:
    """What staging one message of ``nbytes`` counts against a cap."""
    return bucket(nbytes) + MESSAGE_OVERHEAD


#: ``charge(n)`` for every ``n`` with ``(n - 1).bit_length() == b``, at index ``b`` (the
#: same bucket): the hot paths look it up (``_CHARGES[(n - 1).bit_length()] if n else
#: MESSAGE_OVERHEAD``) instead of calling ``charge`` twice a message.
_CHARGES: Final = tuple(charge(1 << b) for b in range(64))


# -- events ---------------------------------------------------------------------------------


class Eager(NamedTuple):
    """A whole message arrived; its payload follows the header in the received buffer."""

    source: int
    tag: int
    nbytes: int
    count: int  # type: ignore[assignment]  # the MPI name; shadows tuple.count
    dtype: str


class Announced(NamedTuple):
    """A large message was announced; ``clear_to_send`` once a recv has matched it."""

    source: int
    tag: int
    nbytes: int
    count: int  # type: ignore[assignment]  # the MPI name; shadows tuple.count
    dtype: str
    ident: int


class ClearToSend(NamedTuple):
    """The receiver matched this rank's message ``ident``: send its data on ``data_tag``.
    The send can no longer be withdrawn (a pending withdrawal lost)."""

    dest: int
    ident: int
    data_tag: int


class WithdrawRequested(NamedTuple):
    """The sender of an announced, still unmatched message took it back: remove the
    announcement from the matcher (``WITHDRAWN`` has been queued already).  An early one
    (``data_tag`` not 0): drain its ``nbytes`` of data from ``source`` on ``data_tag``."""

    source: int
    ident: int
    data_tag: int = 0
    nbytes: int = 0


class Drain(NamedTuple):
    """An early announcement was dropped as it landed (this rank has closed): receive its
    ``nbytes`` of data from ``source`` on ``data_tag`` and throw them away."""

    source: int
    data_tag: int
    nbytes: int


class WithdrawAnswered(NamedTuple):
    """This rank's withdrawal of message ``ident`` won: the message is gone."""

    dest: int
    ident: int


class PeerClosed(NamedTuple):
    """``source`` closed.  ``announced`` are this rank's messages to it that it never
    matched (they fail), ``withdrawing`` those whose withdrawal is thereby complete."""

    source: int
    reason: str
    announced: tuple[int, ...]
    withdrawing: tuple[int, ...]


class DumpAsked(NamedTuple):
    """``source`` asks for this rank's pending ops (its hang watchdog fired)."""

    source: int


class Dumped(NamedTuple):
    """``source``'s answer to a ``DUMP_ASK``: its pending and last ops, as text."""

    source: int
    text: str


class PeerFinished(NamedTuple):
    """``source`` sent its last message to this rank."""

    source: int


Event = Eager | Announced | ClearToSend | WithdrawRequested | WithdrawAnswered | PeerClosed \
    | PeerFinished | DumpAsked | Dumped | Drain | None


class Wire:
    """One rank's side of the protocol (see module docs).

    Args:
        rank, size: this rank and the number of ranks.
        inline_max: the largest message this rank sends eagerly (at most ``INLINE_MAX``).
        credits: ``credits[r]`` is the window rank ``r`` grants this rank (from its cap).
        grant: the window this rank grants each rank.

    Outgoing messages are returned as ``(dest, bytes)`` pairs; the shell sends them in the
    order given, on the control channel.
    """

    def __init__(self, rank: int, size: int, *, inline_max: int, credits: list[int],
                 grant: int) -> None:
        self.rank = rank
        self.size = size
        self.inline_max = min(inline_max, INLINE_MAX)
        self.credit = list(credits)
        self.grant = grant
        self._return_at = max(1, grant // 4)
        self._owed = [0] * size
        self._next_ident = 0
        self._next_data_tag = 0
        self.data_tag_ub = 32767
        # Sender side: announced messages with no answer yet, and those being withdrawn;
        # the data tags of the early ones among them, by id, and those tags.
        self.announced: dict[int, int] = {}
        self.withdrawing: dict[int, int] = {}
        self.early: dict[int, int] = {}
        self.early_tags: set[int] = set()
        self._next_early_tag = 0
        # Receiver side: announcements not matched yet; the early ones' data tags and sizes.
        self.unmatched: set[tuple[int, int]] = set()
        self.early_in: dict[tuple[int, int], tuple[int, int]] = {}
        self.closed_by: dict[int, str] = {}
        self.close_sent = False
        self.fin_sent: set[int] = set()
        self.fin_from: set[int] = set()

    # -- sending --------------------------------------------------------------------------

    def eager_header(self, dest: int, tag: int, nbytes: int, count: int,
                     dtype: bytes) -> bytes | None:
        """Whether a message of ``nbytes`` to ``dest`` goes eagerly: if so its credit is
        taken and its header returned (the shell sends it, then the payload); None
        (nothing taken) when it does not.  Once per small send: the charge is looked up."""
        if nbytes > self.inline_max:
            return None
        cost = _CHARGES[(nbytes - 1).bit_length()] if nbytes else MESSAGE_OVERHEAD
        credit = self.credit
        if credit[dest] < cost:
            return None
        credit[dest] -= cost
        return HEADER.pack(EAGER, len(dtype), self.rank, tag, nbytes, count, 0, dtype)

    def refund(self, dest: int, nbytes: int) -> None:
        """An eager message ``eager_header`` allowed could not be sent after all: its
        credit returns."""
        self.credit[dest] += charge(nbytes)

    def announce(self, dest: int, tag: int, nbytes: int, count: int,
                 dtype: bytes, *, early: bool = False) -> tuple[int, bytes]:
        """Announce a rendezvous message: its id and the ``RTS`` to send to ``dest``.
        ``early``: its data is sent at once, on the data tag ``early[ident]`` names (the
        ``RTS`` names it too), if a tag is free; else (every early tag held by an
        unanswered message) it is announced as any other, its data sent on the ``CTS``.
        """
        data_tag = self.next_early_tag() if early else 0
        early = data_tag != 0
        self._next_ident += 1
        ident = self._next_ident
        self.announced[ident] = dest
        rts = HEADER.pack(RTS, len(dtype), self.rank, tag, nbytes, count, ident, dtype)
        if early:
            self.early[ident] = data_tag
            self.early_tags.add(data_tag)
            rts = rts[:DATA_TAG_AT] + data_tag.to_bytes(4, "little")
        return ident, rts

    def next_early_tag(self) -> int:
        """A data tag of the sender's half of the tag space (above ``data_tag_ub // 2``),
        in rotation, none that an early message still unanswered holds (its data send may
        not be matched yet: a second send on its tag could take its place); 0 if every
        one is held."""
        low = self.data_tag_ub // 2
        span = self.data_tag_ub - low
        tag = self._next_early_tag
        for _ in range(span):
            tag = tag % span + 1
            if low + tag not in self.early_tags:
                self._next_early_tag = tag
                return low + tag
        return 0

    def _settled(self, ident: int) -> None:
        """Message ``ident`` was answered (or dropped): its early data tag is free again
        (the receiver posted its data recvs, or drains, before it answered)."""
        tag = self.early.pop(ident, None)
        if tag is not None:
            self.early_tags.discard(tag)

    def unsent(self, ident: int) -> None:
        """The ``RTS`` of message ``ident`` could not be sent: forget it."""
        self.announced.pop(ident, None)
        self._settled(ident)

    def withdraw(self, ident: int, *, ask: bool = True) -> tuple[int, bytes | None]:
        """Take an announced message back.  Returns ``(verdict, message)``:

        - ``GONE``: withdrawn at once (its receiver has closed and dropped it);
        - ``ASKED``: send the ``WITHDRAW`` returned to its receiver and wait for
          ``WithdrawAnswered`` (won) or ``ClearToSend`` (lost); with ``ask=False`` nothing
          is sent and the verdict is ``TOO_LATE`` instead;
        - ``TOO_LATE``: its receiver has matched it already (or it is being withdrawn)."""
        dest = self.announced.get(ident)
        if dest is None:
            return TOO_LATE, None
        if dest in self.closed_by:
            del self.announced[ident]
            self._settled(ident)
            return GONE, None
        if not ask:
            return TOO_LATE, None
        del self.announced[ident]
        self.withdrawing[ident] = dest
        return ASKED, HEADER.pack(WITHDRAW, 0, self.rank, 0, 0, 0, ident, b"")

    def state_of(self, ident: int) -> str:
        """``"announced"``, ``"withdrawing"`` or ``"settled"`` (answered, or never sent)."""
        if ident in self.announced:
            return "announced"
        if ident in self.withdrawing:
            return "withdrawing"
        return "settled"

    # -- receiving ------------------------------------------------------------------------

    def clear_to_send(self, source: int, ident: int) -> tuple[int, bytes]:
        """A recv matched the announcement ``(source, ident)``: commit to it.  Returns the
        data tag to post the data recvs on, and the ``CTS`` to send to ``source`` (the data
        comes only once it has landed there: the recvs may be posted as it travels).
        An early announcement's data tag is the one it named."""
        key = (source, ident)
        self.unmatched.discard(key)
        early = self.early_in.pop(key, None)
        tag = self.next_data_tag() if early is None else early[0]
        return tag, HEADER.pack(CTS, 0, self.rank, tag, 0, 0, ident, b"")

    def next_data_tag(self) -> int:
        """A data tag in 1..``data_tag_ub // 2`` (0 is the control tag; the upper half is
        the senders' early tags), in rotation."""
        self._next_data_tag = self._next_data_tag % (self.data_tag_ub // 2) + 1
        return self._next_data_tag

    def drop_early(self) -> list[tuple[int, int, int]]:
        """Forget every unmatched early announcement (this rank closes): their data, as
        ``(source, data_tag, nbytes)``, for the shell to drain."""
        drains = [(source, tag, nbytes) for (source, _), (tag, nbytes) in self.early_in.items()]
        for key in self.early_in:
            self.unmatched.discard(key)
        self.early_in.clear()
        return drains

    def consumed(self, source: int, nbytes: int) -> bytes | None:
        """An eager message of ``nbytes`` from ``source`` left staging (or never needed
        it): its charge is owed back.  Returns a ``CREDIT`` to send once enough is owed."""
        owed = self._owed[source] + (_CHARGES[(nbytes - 1).bit_length()] if nbytes
                                     else MESSAGE_OVERHEAD)
        if owed < self._return_at or source in self.closed_by:
            self._owed[source] = owed
            return None
        self._owed[source] = 0
        return HEADER.pack(CREDIT, 0, self.rank, 0, owed, 0, 0, b"")

    def receive(self, kind: int, source: int, tag: int, nbytes: int, count: int, ident: int,
                dtype: str, payload: bytes,
                data_tag: int = 0) -> tuple[Event, list[tuple[int, bytes]]]:
        """A control message arrived (its header fields unpacked by the shell; ``dtype``
        decoded for ``EAGER``/``RTS``; ``payload`` only for ``CLOSE`` and ``DUMP``;
        ``data_tag`` an ``RTS``'s, ``data_tag_of``).  Returns the event for the shell and
        the messages to send in answer."""
        if kind == EAGER:
            return Eager(source, tag, nbytes, count, dtype), []
        if kind == RTS:
            if self.close_sent:  # dropped: the sender learns of it from our CLOSE
                return (Drain(source, data_tag, nbytes) if data_tag else None), []
            self.unmatched.add((source, ident))
            if data_tag:
                self.early_in[(source, ident)] = (data_tag, nbytes)
            return Announced(source, tag, nbytes, count, dtype, ident), []
        if kind == CTS:
            dest = self.announced.pop(ident, None)
            if dest is None:
                dest = self.withdrawing.pop(ident, None)  # the withdrawal lost the race
            self._settled(ident)
            return (None if dest is None else ClearToSend(dest, ident, tag)), []
        if kind == WITHDRAW:
            return self._on_withdraw(source, ident)
        if kind == WITHDRAWN:
            dest = self.withdrawing.pop(ident, None)
            self._settled(ident)
            return (None if dest is None else WithdrawAnswered(dest, ident)), []
        if kind == CREDIT:
            self.credit[source] += nbytes
            return None, []
        if kind == CLOSE:
            return self._on_close(source, payload.decode("utf-8", "replace"))
        if kind == FIN:
            self.fin_from.add(source)
            return PeerFinished(source), []
        if kind == DUMP_ASK:
            return DumpAsked(source), []
        if kind == DUMP:
            return Dumped(source, payload.decode("utf-8", "replace")), []
        raise ValueError(f"unknown control message kind {kind} from rank {source}")

    def _on_withdraw(self, source: int, ident: int) -> tuple[Event, list[tuple[int, bytes]]]:
        key = (source, ident)
        answer = [(source, HEADER.pack(WITHDRAWN, 0, self.rank, 0, 0, 0, ident, b""))]
        if key in self.unmatched:
            self.unmatched.discard(key)
            data_tag, nbytes = self.early_in.pop(key, (0, 0))
            return WithdrawRequested(source, ident, data_tag, nbytes), answer
        if self.close_sent:  # dropped when this rank closed
            return None, answer
        return None, []  # CTS went first: it is the answer

    def _on_close(self, source: int, reason: str) -> tuple[Event, list[tuple[int, bytes]]]:
        self.closed_by[source] = reason
        out: list[tuple[int, bytes]] = []
        if self.close_sent:
            out.append(self._fin(source))
        if source == self.rank:
            return None, out
        announced = tuple(i for i, d in self.announced.items() if d == source)
        for ident in announced:
            del self.announced[ident]
            self._settled(ident)  # (the closing rank drains its data)
        withdrawing = tuple(i for i, d in self.withdrawing.items() if d == source)
        for ident in withdrawing:
            del self.withdrawing[ident]
            self._settled(ident)
        return PeerClosed(source, reason, announced, withdrawing), out

    # -- hang reports ---------------------------------------------------------------------

    def ask_dump(self) -> bytes:
        """A ``DUMP_ASK`` to send to a rank this one waits for."""
        return HEADER.pack(DUMP_ASK, 0, self.rank, 0, 0, 0, 0, b"")

    def dump(self, text: str) -> bytes:
        """The answer to a ``DUMP_ASK``: ``text``, cut to what travels inline."""
        raw = text.encode("utf-8", "replace")[:INLINE_MAX]
        return HEADER.pack(DUMP, 0, self.rank, 0, len(raw), 0, 0, b"") + raw

    # -- closing --------------------------------------------------------------------------

    def close(self, reason: str) -> list[tuple[int, bytes]]:
        """This rank closes: drop unmatched announcements (the early ones' data to drain:
        ``drop_early`` first); ``CLOSE`` to every rank, and ``FIN`` to those that have
        closed already."""
        self.close_sent = True
        self.unmatched.clear()
        self.early_in.clear()
        raw = reason.encode("utf-8", "replace")[:INLINE_MAX]
        head = HEADER.pack(CLOSE, 0, self.rank, 0, len(raw), 0, 0, b"")
        out = []
        for dest in range(self.size):
            out.append((dest, head + raw))
            if dest in self.closed_by:
                out.append(self._fin(dest))
        return out

    def _fin(self, dest: int) -> tuple[int, bytes]:
        self.fin_sent.add(dest)
        return dest, HEADER.pack(FIN, 0, self.rank, 0, 0, 0, 0, b"")

    @property
    def finished(self) -> bool:
        """True once ``FIN`` went to and came from every rank: nothing more will move."""
        return (self.close_sent and len(self.fin_from) == self.size
                and len(self.fin_sent) == self.size)
